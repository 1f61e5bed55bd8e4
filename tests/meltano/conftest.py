"""Fixtures for the Meltano tests: a real Meltano (pinned, in a cached venv)
with the chstate adapter pip-installed, a ClickHouse 18.16 server, and Meltano
projects whose state backend is that server (or chDB).

The server: the one CHSTATE_TEST_HOST/PORT/USER/PASSWORD point at, or a
throwaway one (tools/clickhouse_server.py) removed at the end. Each test gets
its own state schema, so tests never see each other's states.
"""

from __future__ import annotations

import sys
import uuid
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import meltano_harness as harness  # noqa: E402
from chserver import Server  # noqa: E402

REPO = harness.REPO


@pytest.fixture(scope="session")
def library() -> Path:
    return harness.native_library()


@pytest.fixture(scope="session")
def venv() -> Path:
    venv = harness.ensure_venv()
    harness.install_adapter(venv)
    return venv


@pytest.fixture(scope="session")
def chstate_bin(bazel_binary) -> Path:
    return bazel_binary("CHSTATE_BIN", "hosts/native/chstate", "//hosts/native:chstate")


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
