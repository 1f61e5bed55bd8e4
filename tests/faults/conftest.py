"""Fixtures for the fault-injection tests: the real server (tests/conftest.py),
a fault proxy in front of it, and a runner for the `chstate` binary."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from fault_proxy import FaultProxy  # noqa: E402


REPO = Path(__file__).resolve().parents[2]


def fastbuild_binary(relative: str, target: str, env_var: str) -> Path:
    """$env_var, else the default (fastbuild) output: bazel-bin follows whichever
    configuration was built last (a shared Bazel server builds -c opt too)."""
    if os.environ.get(env_var):
        return Path(os.environ[env_var]).resolve()
    subprocess.run(["bazel", "build", target], cwd=REPO, check=True, capture_output=True)
    path = REPO / "bazel-out" / "k8-fastbuild" / "bin" / relative
    assert path.exists(), f"{path} is missing after the build"
    return path


@pytest.fixture(scope="session")
def chstate_bin() -> Path:
    return fastbuild_binary("hosts/native/chstate", "//hosts/native:chstate", "CHSTATE_BIN")


@pytest.fixture
def proxy(clickhouse):
    p = FaultProxy(clickhouse.host, clickhouse.port)
    yield p
    p.close()


class Cli:
    """Runs chstate against a port (the proxy's or the server's) in one schema."""

    def __init__(self, binary: Path, server, schema: str):
        self.binary, self.server, self.schema = binary, server, schema

    def env(self) -> dict:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("CLICKHOUSE_", "MELTANO_", "CHSTATE_"))}
        env["MELTANO_STATE_BACKEND_CLICKHOUSE_SCHEMA"] = self.schema
        env["MELTANO_STATE_BACKEND_CLICKHOUSE_PASSWORD"] = self.server.password
        return env

    def run(self, port: int, *args: str, timeout: float = 1.0, extra_env: dict | None = None,
            wait: float = 120) -> subprocess.CompletedProcess:
        argv = [str(self.binary), "--uri", f"clickhouse://{self.server.user}@{self.server.host}:{port}/default",
                "--timeout", str(timeout), "--connect-timeout", "1", *args]
        env = self.env()
        env.update(extra_env or {})
        proc = subprocess.run(argv, capture_output=True, env=env, timeout=wait)
        assert self.server.password.encode() not in proc.stdout + proc.stderr, "the password was printed"
        return proc

    def direct(self, *args: str, **kw) -> subprocess.CompletedProcess:
        return self.run(self.server.port, *args, **kw)

    def snapshot(self) -> dict:
        """Every state in the schema, read straight from the server: id -> {completed, partial}."""
        out = self.server.sql(
            f"SELECT state_id, partial_state, completed_state FROM `{self.schema}`.`state` FINAL "
            "FORMAT JSONEachRow")
        states = {}
        for line in out.splitlines():
            row = json.loads(line)
            states[row["state_id"]] = {"completed": json.loads(row["completed_state"] or "{}"),
                                       "partial": json.loads(row["partial_state"] or "{}")}
        return states


@pytest.fixture
def cli_factory(chstate_bin, clickhouse):
    made = []

    def make() -> Cli:
        c = Cli(chstate_bin, clickhouse, f"f_{uuid.uuid4().hex[:16]}")
        made.append(c)
        return c

    yield make
    for c in made:
        clickhouse.sql(f"DROP DATABASE IF EXISTS `{c.schema}`")
