"""Fixtures shared by every pytest suite under tests/.

`clickhouse`: a ClickHouse server for the whole session: the one
CHSTATE_TEST_HOST/PORT/USER/PASSWORD point at (tools/test sets them), or else a
throwaway one started with tools/clickhouse_server.py and removed at the end.
`bazel_binary`: a built binary's path ($ENV override, else bazel-bin/..., built
when missing).
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import tempfile
import urllib.request
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SERVER_TOOL = REPO / "tools" / "clickhouse_server.py"


@dataclasses.dataclass(frozen=True)
class Server:
    host: str
    port: int
    user: str
    password: str

    def env(self) -> dict[str, str]:
        """The environment a test binary gets: the connection and nothing else of ours."""
        env = {k: v for k, v in os.environ.items() if not k.startswith(("CLICKHOUSE_", "MELTANO_", "CHSTATE_"))}
        env.update(CHSTATE_TEST_HOST=self.host, CHSTATE_TEST_PORT=str(self.port), CHSTATE_TEST_USER=self.user,
                   CHSTATE_TEST_PASSWORD=self.password)
        return env

    def sql(self, sql: str) -> str:
        """Runs one statement directly (for set-up no tool has a command for).
        Credentials go in headers, as the tools send them."""
        request = urllib.request.Request(
            f"http://{self.host}:{self.port}/", data=sql.encode(),
            headers={"X-ClickHouse-User": self.user, "X-ClickHouse-Key": self.password})
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.read().decode()


@pytest.fixture(scope="session")
def clickhouse() -> Server:
    env = os.environ
    if all(env.get(k) for k in ("CHSTATE_TEST_HOST", "CHSTATE_TEST_PORT", "CHSTATE_TEST_USER")):
        yield Server(env["CHSTATE_TEST_HOST"], int(env["CHSTATE_TEST_PORT"]), env["CHSTATE_TEST_USER"],
                     env.get("CHSTATE_TEST_PASSWORD", ""))
        return
    folder = Path(tempfile.mkdtemp(prefix="chstate-test-"))
    started = subprocess.run([sys.executable, str(SERVER_TOOL), "start", str(folder)], capture_output=True, text=True)
    try:
        if started.returncode != 0:
            pytest.fail(f"could not start ClickHouse:\n{started.stdout}\n{started.stderr}")
        values = dict(line.split("=", 1) for line in started.stdout.splitlines() if "=" in line)
        yield Server(values["CHSTATE_TEST_HOST"], int(values["CHSTATE_TEST_PORT"]), values["CHSTATE_TEST_USER"],
                     values["CHSTATE_TEST_PASSWORD"])
    finally:
        subprocess.run([sys.executable, str(SERVER_TOOL), "stop", str(folder), "--remove"])


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
