"""Fixtures for tests/oracles: the two real engines the vectors' SQL runs on.

`ch18`: the ClickHouse 18.16 server from tests/conftest.py (CHSTATE_TEST_* or a
throwaway one), for the clickhouse18 dialect. `modern`: chDB behind the
ClickHouse-HTTP front tools/chdb_http.py, in this process on a loopback port,
for the modern dialect. `schema`: a fresh schema name, dropped on both
engines afterwards. `core`: the core library (bazel-bin/hosts/python/
libchstate.so, built when missing) for the few tests that ask it for SQL the
vectors do not record.
"""

from __future__ import annotations

import sys
import uuid
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(REPO / "tools"))

from oracle_lib import Engine  # noqa: E402

_STARTED: list = []  # the engines this session started, for dropping test schemas


@pytest.fixture(scope="session")
def ch18(clickhouse) -> Engine:
    engine = Engine("clickhouse-18.16", clickhouse.host, clickhouse.port, clickhouse.user, clickhouse.password)
    version = engine.sql("SELECT version()").decode().strip()
    assert version.startswith("18.16."), f"the clickhouse18 oracle needs ClickHouse 18.16, the server is {version}"
    _STARTED.append(engine)
    return engine


@pytest.fixture(scope="session")
def modern(tmp_path_factory) -> Engine:
    import chdb  # noqa: F401 - a missing chDB is a failure, not a skip
    from chdb_http import ChdbHttpFront

    with ChdbHttpFront(tmp_path_factory.mktemp("oracle-chdb") / "data") as front:
        engine = Engine(f"chdb-{front.version}", front.host, front.port, front.user, front.password)
        _STARTED.append(engine)
        yield engine
        _STARTED.remove(engine)
        assert not front.problems, f"the chDB front saw protocol problems: {front.problems}"


@pytest.fixture
def schema() -> str:
    name = f"orc_{uuid.uuid4().hex[:12]}"
    yield name
    for engine in _STARTED:
        engine.post(f"DROP DATABASE IF EXISTS `{name}`")


@pytest.fixture(scope="session")
def core(bazel_binary):
    from core_lib import Core
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    import native_library
    path = bazel_binary("CHSTATE_LIBRARY", "hosts/python/libchstate.so", "//hosts/python:libchstate.so")
    with native_library.loaded(path) as lib:
        yield Core(lib)
