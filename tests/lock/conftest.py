"""Fixtures for the lock torture tests (tests/lock/test_torture.py).

The server comes from tests/conftest.py. The worker
binary: $CHSTATE_LOCK_TORTURE, else bazel-bin/tools/lock_torture (built when
missing). Each test gets its own schema, dropped afterwards.
"""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest


def pytest_configure(config):
    config.addinivalue_line("markers", "requires_clickhouse: needs a ClickHouse server (started when missing)")


@pytest.fixture(scope="session")
def torture_bin(bazel_binary) -> Path:
    return bazel_binary("CHSTATE_LOCK_TORTURE", "tools/lock_torture", "//tools:lock_torture")


@pytest.fixture
def schema(clickhouse) -> str:
    name = f"lock_{uuid.uuid4().hex}"
    yield name
    clickhouse.sql(f"DROP DATABASE IF EXISTS `{name}`")
