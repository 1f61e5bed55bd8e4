"""Fixtures of the scenario suite: the server, and each host's driver with
what it needs built or installed (the CLI, the C library, the Lua module, both
Wasm modules, Meltano with the adapter, Extism's JS SDK)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(REPO / "tests" / "meltano"))
import meltano_harness as harness  # noqa: E402

EXTISM_SDK = "@extism/extism@1.0.3"


def bazel_bin(config: list) -> Path:
    out = subprocess.run(["bazel", "info", *config, "bazel-bin"], cwd=REPO, check=True, capture_output=True, text=True)
    return Path(out.stdout.strip())


@pytest.fixture(scope="session")
def clickhouse_env(clickhouse) -> dict:
    uri = f"clickhouse://{clickhouse.user}@{clickhouse.host}:{clickhouse.port}/default"
    return {"CHSTATE_API_URI": uri, "CHSTATE_API_PASSWORD": clickhouse.password or ""}


@pytest.fixture(scope="session")
def drivers(clickhouse_env, tmp_path_factory) -> dict:
    subprocess.run(["bazel", "build", "//hosts/native:chstate", "//hosts/python:libchstate.so", "//hosts/lua:chstate.so"],
                   cwd=REPO, check=True, capture_output=True)
    subprocess.run(["bazel", "build", "--config=wasi", "--symlink_prefix=/", "//hosts/wasi:chstate.wasm",
                    "//hosts/wasi:chstate_extism.wasm"], cwd=REPO, check=True, capture_output=True)
    native, wasi = bazel_bin([]), bazel_bin(["--config=wasi"])
    sdk = tmp_path_factory.mktemp("extism-sdk")
    (sdk / "package.json").write_text('{"name": "scratch", "private": true}')
    subprocess.run(["npm", "install", "--no-audit", "--no-fund", EXTISM_SDK], cwd=sdk, check=True, capture_output=True,
                   timeout=300)
    venv = harness.ensure_venv()
    harness.install_adapter(venv)
    # The adapter from the pure wheel (the core as chstate.wasm on wasmtime), in a venv with no
    # native library, run by the same driver as `meltano`.
    pure = harness.pure_venv(wasi / "hosts/wasi/chstate.wasm")
    env = dict(harness.clean_env(), **clickhouse_env,
               CHSTATE_CLI=str(native / "hosts/native/chstate"),
               CHSTATE_LIBRARY=str(native / "hosts/python/libchstate.so"),
               CHSTATE_WASM=str(wasi / "hosts/wasi/chstate.wasm"),
               CHSTATE_EXTISM_WASM=str(wasi / "hosts/wasi/chstate_extism.wasm"),
               CHSTATE_EXTISM_SDK=str(sdk),
               PYTHONPATH=str(REPO / "hosts" / "wasi"))
    lua = dict(env, LUA_CPATH_5_4=f"{native / 'hosts/lua'}/?.so;;", LUA_PATH_5_4=f"{HERE}/?.lua;;")
    luajit = dict(env, LUA_PATH=f"{REPO}/hosts/luajit/?.lua;{HERE}/?.lua;;")
    python = [sys.executable, str(HERE / "driver.py")]
    return {
        "cli": (python, env),
        "meltano": ([str(venv / "bin" / "python"), str(HERE / "driver.py")], env),
        "meltano-wasm": ([str(pure / "bin" / "python"), str(HERE / "driver.py")],
                         {k: v for k, v in env.items() if k != "CHSTATE_LIBRARY"}),
        "wasmtime": (python, env),
        "extism": (python, env),
        "node": (["node", "--no-warnings", str(HERE / "driver.mjs")], env),
        "extism-js": (["node", "--no-warnings", str(HERE / "driver.mjs")], env),
        "lua54": (["lua5.4", str(HERE / "driver.lua")], lua),
        "luajit": (["luajit", str(HERE / "driver.lua")], luajit),
    }
