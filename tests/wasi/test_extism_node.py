"""chstate_extism.wasm in Extism's JavaScript SDK: @extism/extism installed
from npm into a scratch project (as its users install it), driven by
tests/wasi/extism_node_runner.mjs: the shared vectors byte for byte, and the
JS binding over the plugin (hosts/wasi/chstate_extism.mjs) against the real ClickHouse server: every
verb's method, one-call open, a second plugin refused, a lock scope keeping its lock."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from vector_runner import vector_cases

HERE = Path(__file__).resolve().parent
SDK = "@extism/extism@1.0.3"
SERVER_CASES = ["one_call_open", "default_plugin_in_a_folder_with_a_space", "every_verb_has_a_method", "every_verb",
                "events_through_the_extism_logger", "lock_refuses_a_second_plugin", "scope_keeps_its_lock"]


@pytest.fixture(scope="session")
def sdk_dir(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("extism-node")
    (d / "package.json").write_text('{"name": "scratch", "private": true}')
    out = subprocess.run(["npm", "install", "--no-audit", "--no-fund", SDK], cwd=d, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    return d


_results: dict = {}


@pytest.fixture(scope="session")
def results(sdk_dir, extism_path):
    def run(mode: str, env=None) -> dict:
        if mode not in _results:
            out = subprocess.run(["node", str(HERE / "extism_node_runner.mjs"), mode, str(extism_path), str(sdk_dir)],
                                 capture_output=True, text=True, timeout=600, env=env)
            lines = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
            assert lines, f"the runner printed nothing: {out.stderr[-2000:]}"
            _results[mode] = {r["name"]: r for r in lines}
        return _results[mode]
    return run


@pytest.mark.parametrize("name", [c[0] for c in vector_cases()])
def test_node_extism_matches_vectors(results, name):
    r = results("vectors")
    assert name in r, f"the runner did not run {name}"
    assert r[name]["ok"], r[name]["detail"]


@pytest.mark.parametrize("name", SERVER_CASES)
def test_node_extism_against_the_server(results, clickhouse, chstate_cli, name):
    r = results("server", env={**clickhouse.env(), "CHSTATE_CONTENDER": str(chstate_cli)})
    assert name in r, f"the runner did not run {name}: {r}"
    assert r[name]["ok"], r[name]["detail"]
