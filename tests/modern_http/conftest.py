"""Fixtures for tests/modern_http: chstate's hosts, each through its own HTTP
transport, against a modern ClickHouse engine (chDB 2x.y) behind the
ClickHouse-HTTP front tools/chdb_http.py, run in this process (one per test
module) on a free loopback port and recording every request it answers.

Binaries: $CHSTATE_BIN (else bazel-bin/hosts/native/chstate),
$CHSTATE_LIBRARY (else bazel-bin/hosts/python/libchstate.so), $CHSTATE_LUA_SO
(else bazel-bin/hosts/lua/chstate.so), $CHSTATE_WASM (else built with
--config=wasi); each is built when missing.
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(REPO / "tools"))
sys.path.insert(0, str(HERE))

from chdb_http import ChdbHttpFront  # noqa: E402
from support import check_no_problems  # noqa: E402


@pytest.fixture(scope="module")
def front(tmp_path_factory) -> ChdbHttpFront:
    # Per module: chDB allows one data folder per process, so the front's
    # session must be gone before another suite (tests/modern) opens its own.
    import chdb  # noqa: F401 - a missing chDB is a failure here, not a skip
    with ChdbHttpFront(tmp_path_factory.mktemp("chdb-front") / "data", record=True) as f:
        yield f


@pytest.fixture
def fresh(front) -> ChdbHttpFront:
    """The front with its record emptied before the test, and checked for
    protocol problems (non-ASCII SQL, a password in a URL, ...) after it."""
    front.take()
    front.problems.clear()
    yield front
    check_no_problems(front)


@pytest.fixture
def schema(front) -> str:
    name = f"mh_{uuid.uuid4().hex[:12]}"
    yield name
    front.sql(f"DROP DATABASE IF EXISTS `{name}`")


def _built(env_var: str, relative: str, build: list[str]) -> Path:
    if os.environ.get(env_var):
        path = Path(os.environ[env_var])
        return path if path.is_absolute() else REPO / path
    path = REPO / "bazel-bin" / relative
    if not path.exists():
        proc = subprocess.run(["bazel", "build", *build], cwd=REPO, capture_output=True, text=True)
        assert proc.returncode == 0, f"bazel build {' '.join(build)} failed:\n{proc.stderr[-4000:]}"
    assert path.exists(), f"{path} is missing after the build"
    return path


@pytest.fixture(scope="session")
def chstate_bin() -> Path:
    return _built("CHSTATE_BIN", "hosts/native/chstate", ["//hosts/native:chstate"])


@pytest.fixture(scope="session")
def libchstate() -> Path:
    path = _built("CHSTATE_LIBRARY", "hosts/python/libchstate.so", ["//hosts/python:libchstate.so"])
    os.environ["CHSTATE_LIBRARY"] = str(path.resolve())
    return path


@pytest.fixture(scope="session")
def lua_so() -> Path:
    return _built("CHSTATE_LUA_SO", "hosts/lua/chstate.so", ["//hosts/lua:chstate.so"])


@pytest.fixture(scope="session")
def wasm_path() -> Path:
    if os.environ.get("CHSTATE_WASM"):
        return Path(os.environ["CHSTATE_WASM"]).resolve()
    # --symlink_prefix=/ keeps the bazel-bin link on the native builds.
    proc = subprocess.run(["bazel", "build", "--config=wasi", "--symlink_prefix=/", "//hosts/wasi:chstate.wasm"],
                          cwd=REPO, capture_output=True, text=True)
    assert proc.returncode == 0, f"the wasm build failed:\n{proc.stderr[-4000:]}"
    out = subprocess.run(["bazel", "info", "--config=wasi", "bazel-bin"], cwd=REPO, capture_output=True, text=True,
                         check=True)
    path = Path(out.stdout.strip()) / "hosts" / "wasi" / "chstate.wasm"
    assert path.exists(), f"{path} is missing after the build"
    return path
