"""The WebAssembly module under Node (hosts/wasi/chstate_wasi.mjs and its own
HTTP transport) against the modern engine behind the front, driven by
node_modern.mjs: get, set, merge, list, lock, delete, clear-all and a wrong
password."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from support import HOSTILE_ID, ODD_VALUE, REPO, check_modern, version_is_modern

RUNNER = Path(__file__).resolve().parent / "node_modern.mjs"


def test_node_http_transport_every_operation(wasm_path, fresh, schema):
    state = {"singer_state": {"bookmarks": {"t": {"v": ODD_VALUE}}}}
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CLICKHOUSE_", "MELTANO_", "CHSTATE_"))}
    env.update(fresh.env(), T_STATE=json.dumps(state))
    proc = subprocess.run(["node", "--no-warnings", str(RUNNER), str(wasm_path), schema, HOSTILE_ID], cwd=REPO,
                          capture_output=True, text=True, env=env, timeout=300)
    assert fresh.password not in proc.stdout + proc.stderr
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().split("\n")[-1])
    assert out["ping"]["dialect"] == "modern" and out["ping"]["server_version"] == fresh.version
    assert version_is_modern(out["ping"]["server_version"])
    assert out["get"] == {"completed": state, "partial": {}}
    assert out["merged"] == {"completed": state, "partial": {"singer_state": {"more": True}}}
    assert out["missing"] is None
    assert out["list"] == sorted([HOSTILE_ID, "dev:plain"], key=str.encode)
    assert out["list_pattern"] == ["dev:plain"]
    assert out["locked"] == "ABORTED"
    assert out["after_lock"] == {"completed": {"singer_state": {"in_lock": 1}}, "partial": {}}
    assert out["after_delete"] is None
    assert out["cleared"] == 1 and out["list_after"] == []
    assert out["wrong_password"] == "UNAUTHENTICATED"
    records = fresh.take()
    check_modern([r for r in records if r.status != 403], creates=True)
    assert any(r.status == 403 and r.code == 516 for r in records)
