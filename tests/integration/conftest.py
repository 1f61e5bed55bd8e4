"""Fixtures for the `chstate` integration tests.

The server comes from tests/conftest.py. The binary: $CHSTATE_BIN, else
bazel-bin/hosts/native/chstate (built when missing). Each test gets its own schema, so tests never see each
other's states, and a runner that checks no output ever holds the password.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import uuid
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def chstate_bin(bazel_binary) -> Path:
    return bazel_binary("CHSTATE_BIN", "hosts/native/chstate", "//hosts/native:chstate")


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

    def __init__(self, binary: Path, server, schema: str):
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
        return self.server.sql(sql)

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


@pytest.fixture
def cli(chstate_bin: Path, clickhouse) -> Chstate:
    runner = Chstate(chstate_bin, clickhouse, f"t_{uuid.uuid4().hex}")
    yield runner
    # Leaves a reused server as it was found.
    clickhouse.sql(f"DROP DATABASE IF EXISTS `{runner.schema}`")
