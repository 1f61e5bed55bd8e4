"""Fixtures for the `chstate` integration tests.

A ClickHouse server for the whole session: the one CHSTATE_TEST_HOST/PORT/USER/
PASSWORD point at, or else a throwaway one started with tools/clickhouse_server.py
and removed at the end. The binary: $CHSTATE_BIN, else bazel-bin/hosts/native/chstate
(built when missing). Each test gets its own schema, so tests never see each
other's states, and a runner that checks no output ever holds the password.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import tempfile
import urllib.request
import uuid
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SERVER_TOOL = REPO / "tools" / "clickhouse_server.py"


@dataclasses.dataclass(frozen=True)
class Server:
    host: str
    port: int
    user: str
    password: str


@pytest.fixture(scope="session")
def clickhouse() -> Server:
    env = os.environ
    if all(env.get(k) for k in ("CHSTATE_TEST_HOST", "CHSTATE_TEST_PORT", "CHSTATE_TEST_USER")):
        yield Server(env["CHSTATE_TEST_HOST"], int(env["CHSTATE_TEST_PORT"]), env["CHSTATE_TEST_USER"],
                     env.get("CHSTATE_TEST_PASSWORD", ""))
        return
    folder = Path(tempfile.mkdtemp(prefix="chstate-cli-test-"))
    started = subprocess.run([sys.executable, str(SERVER_TOOL), "start", str(folder)],
                             capture_output=True, text=True)
    try:
        if started.returncode != 0:
            pytest.fail(f"could not start ClickHouse:\n{started.stdout}\n{started.stderr}")
        values = dict(line.split("=", 1) for line in started.stdout.splitlines() if "=" in line)
        yield Server(values["CHSTATE_TEST_HOST"], int(values["CHSTATE_TEST_PORT"]),
                     values["CHSTATE_TEST_USER"], values["CHSTATE_TEST_PASSWORD"])
    finally:
        subprocess.run([sys.executable, str(SERVER_TOOL), "stop", str(folder), "--remove"])


@pytest.fixture(scope="session")
def chstate_bin() -> Path:
    path = Path(os.environ.get("CHSTATE_BIN") or REPO / "bazel-bin" / "hosts" / "native" / "chstate")
    if not path.is_absolute():
        path = REPO / path
    if not path.exists():
        subprocess.run(["bazel", "build", "//hosts/native:chstate"], cwd=REPO, check=True)
    assert path.exists(), f"{path} is missing after the build"
    return path


@dataclasses.dataclass
class Run:
    args: list[bytes]
    returncode: int
    stdout: bytes
    stderr: bytes

    @property
    def out(self) -> str:
        return self.stdout.decode("utf-8", "surrogateescape")

    @property
    def err(self) -> str:
        return self.stderr.decode("utf-8", "surrogateescape")

    def json(self):
        return json.loads(self.stdout)


def _bytes(arg) -> bytes:
    return arg if isinstance(arg, bytes) else os.fsencode(str(arg))


class Chstate:
    """Runs the binary against one test's schema, credentials in the environment."""

    def __init__(self, binary: Path, server: Server, schema: str):
        self.binary = binary
        self.server = server
        self.schema = schema
        self.uri = f"clickhouse://{server.user}@{server.host}:{server.port}/default"
        # Strings that must never appear in any output.
        self.secrets = [s for s in (server.password,) if s]

    def env(self, **overrides: str | None) -> dict[str, str]:
        # Only what the tool should see: no stray CLICKHOUSE_* or MELTANO_*
        # settings from the developer's shell.
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("CLICKHOUSE_", "MELTANO_", "CHSTATE_"))}
        env["MELTANO_STATE_BACKEND_CLICKHOUSE_SCHEMA"] = self.schema
        if self.server.password:
            env["MELTANO_STATE_BACKEND_CLICKHOUSE_PASSWORD"] = self.server.password
        for key, value in overrides.items():
            if value is None:
                env.pop(key, None)
            else:
                env[key] = value
        return env

    def run(self, *args, expect: int | None = 0, input: bytes | str | None = None, env: dict | None = None,
            uri: str | None = "default", secrets: tuple[str, ...] = ()) -> Run:
        """Runs `chstate [--uri URI] ARGS`; checks the exit code (unless
        expect is None) and that no secret is in stdout or stderr."""
        argv = [_bytes(self.binary)]
        if uri is not None:
            argv += [b"--uri", _bytes(self.uri if uri == "default" else uri)]
        argv += [_bytes(a) for a in args]
        if isinstance(input, str):
            input = input.encode()
        proc = subprocess.run(argv, input=input if input is not None else b"", capture_output=True,
                              env=env if env is not None else self.env(), timeout=120)
        result = Run(argv, proc.returncode, proc.stdout, proc.stderr)
        for secret in [*self.secrets, *secrets]:
            assert secret.encode() not in proc.stdout, f"secret in stdout of {args!r}"
            assert secret.encode() not in proc.stderr, f"secret in stderr of {args!r}"
        if expect is not None:
            assert proc.returncode == expect, (
                f"chstate {args!r} exited {proc.returncode}, expected {expect}\n"
                f"stdout: {result.out[:2000]}\nstderr: {result.err[:2000]}")
        return result

    def sql(self, sql: str) -> str:
        return server_sql(self.server, sql)

    def set(self, state_id, state: dict, *extra) -> Run:
        return self.run("set", state_id, json.dumps(state), *extra)

    def get(self, state_id) -> dict:
        return self.run("get", state_id).json()

    def get_full(self, state_id) -> dict:
        return self.run("get", state_id, "--json").json()

    def list(self, *args) -> list[bytes]:
        out = self.run("list", "--null", *args).stdout
        assert out == b"" or out.endswith(b"\0")
        return out.split(b"\0")[:-1]


def server_sql(server: Server, sql: str) -> str:
    """Runs one statement directly (for setup the tool has no command for).
    Credentials go in headers, as the tool sends them."""
    request = urllib.request.Request(
        f"http://{server.host}:{server.port}/", data=sql.encode(),
        headers={"X-ClickHouse-User": server.user, "X-ClickHouse-Key": server.password})
    with urllib.request.urlopen(request, timeout=30) as response:
        return response.read().decode()


@pytest.fixture
def cli(chstate_bin: Path, clickhouse: Server) -> Chstate:
    runner = Chstate(chstate_bin, clickhouse, f"t_{uuid.uuid4().hex}")
    yield runner
    # Leaves a reused server as it was found.
    server_sql(clickhouse, f"DROP DATABASE IF EXISTS `{runner.schema}`")
