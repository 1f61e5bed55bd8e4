"""Fixtures for the WebAssembly tests: the built module and its hosts.

`wasm_path`: hosts/wasi's chstate.wasm ($CHSTATE_WASM, else built with
`bazel build --config=wasi` into Bazel's wasm32 output folder; the build uses
--symlink_prefix=/ so that the bazel-bin link keeps pointing at native builds).
`node_results`: runs tests/wasi/node_runner.mjs once per mode and returns its
per-case results, which the parametrized Node tests then check one by one.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "hosts" / "wasi"))
NODE_RUNNER = Path(__file__).resolve().parent / "node_runner.mjs"


def build_wasm() -> Path:
    if os.environ.get("CHSTATE_WASM"):
        return Path(os.environ["CHSTATE_WASM"]).resolve()
    subprocess.run(["bazel", "build", "--config=wasi", "--symlink_prefix=/", "//hosts/wasi:chstate.wasm"], cwd=REPO,
                   check=True, capture_output=True)
    out = subprocess.run(["bazel", "info", "--config=wasi", "bazel-bin"], cwd=REPO, check=True, capture_output=True,
                         text=True)
    return Path(out.stdout.strip()) / "hosts" / "wasi" / "chstate.wasm"


@pytest.fixture(scope="session")
def wasm_path() -> Path:
    path = build_wasm()
    assert path.exists(), f"{path} is missing after the build"
    return path


@pytest.fixture(scope="session")
def extism_path() -> Path:
    """hosts/wasi's chstate_extism.wasm (the Extism plugin): $CHSTATE_EXTISM_WASM, else built like chstate.wasm."""
    if os.environ.get("CHSTATE_EXTISM_WASM"):
        return Path(os.environ["CHSTATE_EXTISM_WASM"]).resolve()
    subprocess.run(["bazel", "build", "--config=wasi", "--symlink_prefix=/", "//hosts/wasi:chstate_extism.wasm"],
                   cwd=REPO, check=True, capture_output=True)
    out = subprocess.run(["bazel", "info", "--config=wasi", "bazel-bin"], cwd=REPO, check=True, capture_output=True,
                         text=True)
    path = Path(out.stdout.strip()) / "hosts" / "wasi" / "chstate_extism.wasm"
    assert path.exists(), f"{path} is missing after the build"
    return path


@pytest.fixture(scope="session")
def compiled(wasm_path):
    import wasmtime
    engine = wasmtime.Engine()
    return engine, wasmtime.Module.from_file(engine, str(wasm_path))


@pytest.fixture()
def module(compiled):
    """A fresh instance of the module for each test."""
    from chstate_wasmtime import ChstateModule
    return ChstateModule(engine=compiled[0], module=compiled[1])


_node_cache: dict = {}


@pytest.fixture(scope="session")
def node_results(wasm_path):
    """node_results(mode, env=None) -> {case name: {"ok": bool, "detail": str}} (one Node run per mode)."""

    def run(mode: str, env: dict | None = None) -> dict:
        if mode not in _node_cache:
            proc = subprocess.run(["node", "--no-warnings", str(NODE_RUNNER), mode, str(wasm_path)], cwd=REPO,
                                  capture_output=True, text=True, timeout=600, env=env or dict(os.environ))
            results = {}
            for line in proc.stdout.splitlines():
                if line.startswith("{"):
                    r = json.loads(line)
                    results[r["name"]] = r
            _node_cache[mode] = (results, proc.returncode, proc.stderr[-4000:])
        results, code, stderr = _node_cache[mode]
        assert results, f"node_runner {mode} reported nothing (exit {code}):\n{stderr}"
        return results

    return run


@pytest.fixture(scope="session")
def chstate_cli(bazel_binary) -> Path:
    """The native chstate command: the other process that contends for a lock scope's id."""
    return bazel_binary("CHSTATE_BIN", "hosts/native/chstate", "//hosts/native:chstate")

