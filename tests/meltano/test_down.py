"""ClickHouse unreachable: Meltano fails with an error that names the
problem, and the state written before is intact once the server is back."""

from __future__ import annotations

import json
import subprocess
import time

import meltano_harness as harness
import pytest
from meltano_harness import kill_server, rows, start_server, stop_server

A = "dev:tap-a-to-target-b"
S1 = {"singer_state": {"bookmarks": {"s1": {"since": "2026-01-01"}}}}
S2 = {"singer_state": {"bookmarks": {"s2": {"since": "2026-02-02"}}}}
JOB = "dev:tap-counter-to-target-echo"


@pytest.fixture
def own_server(tmp_path):
    """A throwaway server this test may stop and start (new ports each start,
    same data and password)."""
    folder = tmp_path / "clickhouse"
    servers = [start_server(folder)]
    yield folder, servers
    stop_server(folder, remove=True)


def make_project(tmp_path, venv, library, server) -> harness.MeltanoProject:
    env = {"MELTANO_STATE_BACKEND_CLICKHOUSE_SCHEMA": "down",
           "MELTANO_STATE_BACKEND_CLICKHOUSE_PASSWORD": server.password}
    p = harness.MeltanoProject(tmp_path / "project", venv, library, state_backend_uri=server.uri(), env=env)
    p.secrets = [server.password]
    return p


def test_closed_port_is_a_clear_error(project):
    out = project.run("state", "get", A, env=project.env(MELTANO_STATE_BACKEND_CLICKHOUSE_PORT="1"), expect=1)
    assert "chstate state backend: reading state 'dev:tap-a-to-target-b' failed" in out.stderr
    assert "connection refused (127.0.0.1:1)" in out.stderr
    assert "[UNAVAILABLE]" in out.stderr
    assert "Check that ClickHouse is running" in out.stderr
    assert "Traceback" not in out.stderr


def test_server_down_then_back_loses_nothing(tmp_path, venv, library, own_server):
    folder, servers = own_server
    server = servers[0]
    p = make_project(tmp_path, venv, library, server)
    p.run("state", "set", "--force", A, json.dumps(S1))
    p.run("state", "merge", A, json.dumps(S2))
    before = json.loads(p.run("state", "get", A).stdout)

    stop_server(folder)
    out = p.run("state", "get", A, expect=1)
    assert f"connection refused (127.0.0.1:{server.port})" in out.stderr
    assert "[UNAVAILABLE]" in out.stderr
    # A write fails the same way and reports that it failed.
    out = p.run("state", "set", "--force", A, json.dumps({"singer_state": {}}), expect=1)
    assert "UNAVAILABLE" in out.stderr
    # A pipeline cannot start without its state: it fails before extracting.
    out = p.run("run", "tap-counter", "target-echo", expect=1)
    assert "connection refused" in out.stderr
    assert harness.output_lines(p.root / "output" / "echo.jsonl") == []

    back = start_server(folder)
    servers.append(back)
    env = p.env(MELTANO_STATE_BACKEND_CLICKHOUSE_PORT=str(back.port))  # the granular setting beats the URI
    assert json.loads(p.run("state", "get", A, env=env).stdout) == before
    partial, completed = rows(back, "down")[A]
    assert json.loads(completed) == S1 and json.loads(partial) == S2


def test_server_dies_mid_run_and_the_next_run_resumes(tmp_path, venv, library, own_server):
    folder, servers = own_server
    server = servers[0]
    p = make_project(tmp_path, venv, library, server)
    # A short lock wait: with the server gone, each update gives up after it.
    env = p.env(TAP_COUNTER_TOTAL="40", TAP_COUNTER_SLEEP_MS="250",
                MELTANO_STATE_BACKEND_CLICKHOUSE_LOCK_WAIT_SECONDS="2")
    proc = subprocess.Popen([str(p.meltano), "run", "tap-counter", "target-echo"], cwd=p.root, env=env,
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        persisted = 0
        while time.monotonic() < deadline and persisted < 3:
            time.sleep(0.2)
            try:
                stored = rows(server, "down").get(JOB)
            except Exception:  # noqa: BLE001 - the table appears with the first write
                continue
            if stored:
                persisted = json.loads(stored[1])["singer_state"]["bookmarks"]["numbers"]["id"]
        assert persisted >= 3, "the run did not persist state in time"
        kill_server(folder)
        _, stderr = proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode != 0, stderr[-6000:]
    assert "connection refused" in stderr or "UNAVAILABLE" in stderr, stderr[-5000:]
    # A dead server is reported as such, never as a state id another process holds.
    assert "locked by another process" not in stderr, stderr[-5000:]
    for secret in p.secrets:
        assert secret not in stderr

    back = start_server(folder)
    servers.append(back)
    env = p.env(MELTANO_STATE_BACKEND_CLICKHOUSE_PORT=str(back.port), TAP_COUNTER_TOTAL="40")
    saved = json.loads(p.run("state", "get", JOB, env=env).stdout)["singer_state"]["bookmarks"]["numbers"]["id"]
    # The last state that was acknowledged is there, whole; records up to it were written.
    assert saved >= persisted
    written = [r["id"] for r in harness.output_lines(p.root / "output" / "echo.jsonl")]
    assert written[:saved] == list(range(1, saved + 1))
    resumed = p.run("run", "tap-counter", "target-echo", env=env)
    assert f"tap-counter: starting after id {saved}" in resumed.stderr
    assert json.loads(p.run("state", "get", JOB, env=env).stdout)["singer_state"]["bookmarks"]["numbers"]["id"] == 40
