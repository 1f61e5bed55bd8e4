"""The minimal Node host of docs/wasm.md (hosts/wasi/example.mjs) runs
against the real server, and the page shows exactly that file."""

from __future__ import annotations

import json
import os
import subprocess
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "hosts" / "wasi" / "example.mjs"


def test_the_page_shows_the_tested_example():
    page = (REPO / "docs" / "wasm.md").read_text()
    assert "```js\n" + EXAMPLE.read_text() + "```" in page


def test_example_runs_against_clickhouse(wasm_path, clickhouse):
    schema = f"wasi_example_{uuid.uuid4().hex[:8]}"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CLICKHOUSE_", "CHSTATE_"))}
    env["CLICKHOUSE_PASSWORD"] = clickhouse.password  # not in argv
    uri = f"clickhouse://{clickhouse.user}@{clickhouse.host}:{clickhouse.port}/default?schema={schema}"
    try:
        out = subprocess.run(["node", "--no-warnings", str(EXAMPLE), str(wasm_path), uri], env=env,
                             capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr
        lines = out.stdout.splitlines()
        assert json.loads(lines[0]) == {"completed": {"singer_state": {"bookmarks": {}}},
                                        "partial": {"singer_state": {"bookmarks": {"users": {"id": 42}}}},
                                        "merged": {"singer_state": {"bookmarks": {"users": {"id": 42}}}}}
        assert json.loads(lines[1]) == ["dev:tap-to-target"]
        assert clickhouse.password not in out.stdout + out.stderr
        assert clickhouse.sql(f"SELECT count() FROM {schema}.state FINAL").strip() == "0"  # deleted at the end
    finally:
        clickhouse.sql(f"DROP DATABASE IF EXISTS {schema}")
