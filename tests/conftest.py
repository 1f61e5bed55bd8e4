"""Fixtures shared by every pytest suite under tests/.

`clickhouse`: a ClickHouse server for the whole session: the one
CHSTATE_TEST_HOST/PORT/USER/PASSWORD point at (tools/test sets them), or else a
throwaway one started with tools/clickhouse_server.py and removed at the end.
`bazel_binary`: a built binary's path ($ENV override, else bazel-bin/..., built
when missing).
"""

from __future__ import annotations

import os
import subprocess
import tempfile
from pathlib import Path

import pytest

from chserver import REPO, Server, from_env, start_server, stop_server  # noqa: F401 (Server: for type hints)


@pytest.fixture(scope="session")
def clickhouse() -> Server:
    configured = from_env()
    if configured:
        yield configured
        return
    folder = Path(tempfile.mkdtemp(prefix="chstate-test-"))
    try:
        try:
            server = start_server(folder)
        except RuntimeError as e:
            pytest.fail(str(e))
        yield server
    finally:
        stop_server(folder, remove=True)


@pytest.fixture(scope="session")
def bazel_binary():
    def find(env_var: str, relative: str, target: str) -> Path:
        path = Path(os.environ.get(env_var) or REPO / "bazel-bin" / relative)
        if not path.is_absolute():
            path = REPO / path
        if not path.exists():
            subprocess.run(["bazel", "build", target], cwd=REPO, check=True)
        assert path.exists(), f"{path} is missing after the build"
        return path

    return find
