"""Fixtures for the Meltano tests: a real Meltano (pinned, in a cached venv)
with the chstate adapter pip-installed, a ClickHouse 18.16 server, and Meltano
projects whose state backend is that server (or chDB).

The server: the one CHSTATE_TEST_HOST/PORT/USER/PASSWORD point at, or a
throwaway one (tools/clickhouse_server.py) removed at the end. Each test gets
its own state schema, so tests never see each other's states.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import meltano_harness as harness  # noqa: E402
from meltano_harness import Server, start_server, stop_server  # noqa: E402

REPO = harness.REPO


@pytest.fixture(scope="session")
def clickhouse() -> Server:
    env = os.environ
    if all(env.get(k) for k in ("CHSTATE_TEST_HOST", "CHSTATE_TEST_PORT", "CHSTATE_TEST_USER")):
        yield Server(env["CHSTATE_TEST_HOST"], int(env["CHSTATE_TEST_PORT"]), env["CHSTATE_TEST_USER"],
                     env.get("CHSTATE_TEST_PASSWORD", ""))
        return
    folder = Path(tempfile.mkdtemp(prefix="chstate-meltano-test-"))
    try:
        yield start_server(folder)
    finally:
        stop_server(folder, remove=True)


@pytest.fixture(scope="session")
def library() -> Path:
    return harness.native_library()


@pytest.fixture(scope="session")
def venv() -> Path:
    venv = harness.ensure_venv()
    harness.install_adapter(venv)
    return venv


@pytest.fixture(scope="session")
def chstate_bin() -> Path:
    path = Path(os.environ.get("CHSTATE_BIN") or REPO / "bazel-bin" / "hosts" / "native" / "chstate")
    if not path.is_absolute():
        path = REPO / path
    if not path.exists():
        subprocess.run(["bazel", "build", "//hosts/native:chstate"], cwd=REPO, check=True)
    assert path.exists(), f"{path} is missing after the build"
    return path


@pytest.fixture
def schema(clickhouse: Server) -> str:
    name = f"t_{uuid.uuid4().hex}"
    yield name
    clickhouse.sql(f"DROP DATABASE IF EXISTS `{name}`")


@pytest.fixture
def project(tmp_path: Path, venv: Path, library: Path, clickhouse: Server, schema: str) -> harness.MeltanoProject:
    """A Meltano project on the test server: the URI in meltano.yml, the
    password in MELTANO_STATE_BACKEND_CLICKHOUSE_PASSWORD, the test's schema in
    MELTANO_STATE_BACKEND_CLICKHOUSE_SCHEMA."""
    env = {"MELTANO_STATE_BACKEND_CLICKHOUSE_SCHEMA": schema}
    if clickhouse.password:
        env["MELTANO_STATE_BACKEND_CLICKHOUSE_PASSWORD"] = clickhouse.password
    p = harness.MeltanoProject(tmp_path / "project", venv, library, state_backend_uri=clickhouse.uri(), env=env)
    p.server = clickhouse
    p.schema = schema
    p.secrets = [clickhouse.password] if clickhouse.password else []
    return p
