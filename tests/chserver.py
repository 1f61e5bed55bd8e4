"""Throwaway ClickHouse servers for tests and tools, through
tools/clickhouse_server.py.

    server = start_server(folder)   # a private 18.16 on a free loopback port
    server.sql("SELECT 1")          # credentials in headers, never in the URL
    server.uri("db")                # clickhouse://user@host:port/db (no password)
    kill_server(folder)             # SIGKILL, as a crash
    stop_server(folder, remove=True)
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

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

    def uri(self, database: str = "default") -> str:
        """A clickhouse:// URI without the password (pass that separately)."""
        return f"clickhouse://{self.user}@{self.host}:{self.port}/{database}"

    def sql(self, sql: str, timeout: float = 30) -> str:
        """Runs one statement directly (for set-up no tool has a command for).
        Credentials go in headers, as the tools send them."""
        request = urllib.request.Request(
            f"http://{self.host}:{self.port}/", data=sql.encode(),
            headers={"X-ClickHouse-User": self.user, "X-ClickHouse-Key": self.password})
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.read().decode()


def from_env(env=os.environ):
    """The server CHSTATE_TEST_HOST/PORT/USER/PASSWORD name, or None."""
    if all(env.get(k) for k in ("CHSTATE_TEST_HOST", "CHSTATE_TEST_PORT", "CHSTATE_TEST_USER")):
        return Server(env["CHSTATE_TEST_HOST"], int(env["CHSTATE_TEST_PORT"]), env["CHSTATE_TEST_USER"],
                      env.get("CHSTATE_TEST_PASSWORD", ""))
    return None


def start_server(folder: Path, *extra: str) -> Server:
    """Starts (or restarts, keeping its data and port) the server in `folder`."""
    started = subprocess.run([sys.executable, str(SERVER_TOOL), "start", str(folder), *extra], capture_output=True,
                             text=True)
    if started.returncode != 0:
        raise RuntimeError(f"could not start ClickHouse:\n{started.stdout}\n{started.stderr}")
    values = dict(line.split("=", 1) for line in started.stdout.splitlines() if "=" in line)
    return Server(values["CHSTATE_TEST_HOST"], int(values["CHSTATE_TEST_PORT"]), values["CHSTATE_TEST_USER"],
                  values["CHSTATE_TEST_PASSWORD"])


def stop_server(folder: Path, *, remove: bool = False) -> None:
    args = [sys.executable, str(SERVER_TOOL), "stop", str(folder)] + (["--remove"] if remove else [])
    subprocess.run(args, check=False)


def kill_server(folder: Path) -> None:
    """SIGKILLs the server recorded in `folder` (a crash, not a shutdown: a
    graceful stop keeps serving open keep-alive connections until they close).
    Only a process whose command line names this folder's config is touched."""
    inst = json.loads((folder / "instance.json").read_text())
    pid = inst["pid"]
    cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    assert inst["config"].encode() in cmdline, "the recorded pid is not this folder's server"
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            pass
        try:
            if Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] == "Z":
                break  # dead; whoever adopted it reaps it
        except OSError:
            break
        time.sleep(0.05)
