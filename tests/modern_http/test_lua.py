"""The Lua 5.4 module (hosts/lua: chstate.so with its native HTTP transport)
against the modern engine behind the front, driven by modern.lua: ping, set,
get, merge, list, with_lock against a second store, copy, export (a page of
two), history, import, move, delete, clear_all and a wrong password."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from support import HOSTILE_ID, ODD_VALUE, REPO, check_modern, version_is_modern

SCRIPT = Path(__file__).resolve().parent / "modern.lua"


def test_lua_module_every_operation(lua_so, fresh, schema, tmp_path):
    id_file = tmp_path / "id"
    id_file.write_bytes(HOSTILE_ID.encode())
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CLICKHOUSE_", "MELTANO_", "CHSTATE_"))}
    env.update(LUA_CPATH_5_4=f"{lua_so.resolve().parent}/?.so;;",
               MELTANO_STATE_BACKEND_URI=f"clickhouse://{fresh.user}@{fresh.host}:{fresh.port}/default",
               MELTANO_STATE_BACKEND_CLICKHOUSE_PASSWORD=fresh.password,
               MELTANO_STATE_BACKEND_CLICKHOUSE_SCHEMA=schema, T_VALUE=ODD_VALUE.replace("\u0000", ""))
    proc = subprocess.run(["lua5.4", str(SCRIPT), str(id_file)], cwd=REPO, capture_output=True, env=env, timeout=300)
    stdout, stderr = proc.stdout.decode(errors="replace"), proc.stderr.decode(errors="replace")
    assert fresh.password not in stdout + stderr
    assert proc.returncode == 0, stderr[-3000:]
    out = json.loads(stdout.strip().split("\n")[-1])  # (not splitlines: U+2028 is a line break to it)
    state = {"singer_state": {"bookmarks": {"t": {"v": ODD_VALUE.replace("\u0000", "")}}}}
    assert out["dialect"] == "modern" and out["server_version"] == fresh.version
    assert version_is_modern(out["server_version"])
    assert out["get"] == state
    assert out["merged"] == {"singer_state": {**state["singer_state"], "more": True}}
    assert out["list"] == sorted([HOSTILE_ID, "dev:plain"], key=str.encode)
    assert out["list_pattern"] == ["dev:plain"]
    assert out["in_lock"] == "ABORTED"
    assert out["after_lock"]["singer_state"]["locked_write"] == 1
    assert "intruder" not in out["after_lock"]["singer_state"]
    assert out["copy"] == out["after_lock"]
    ids = sorted([HOSTILE_ID, "dev:plain", "dev:copy"], key=str.encode)
    assert out["export_ids"] == ids[:2] and out["export_more"] is True
    assert out["history_count"] >= 3  # set, merge, the write under the lock
    assert out["imported"] == 1
    assert out["moved"] == {"singer_state": {"i": 1}} and out["after_move"] is True
    assert out["after_delete"] is True
    assert out["cleared"] == 3 and out["list_after"] == []  # dev:plain, dev:copy, dev:moved
    assert out["wrong_password"] == "UNAUTHENTICATED"
    records = fresh.take()
    check_modern([r for r in records if r.status != 403])
    assert any(r.status == 403 and r.code == 516 for r in records)
