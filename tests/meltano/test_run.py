"""`meltano run` with state in ClickHouse: the state lands there after every
STATE message and the next run starts from it."""

from __future__ import annotations

import json
import re
import subprocess
import time

import meltano_harness as harness
from meltano_harness import rows

JOB = "dev:tap-counter-to-target-echo"


def bookmark(project, state_id: str) -> int:
    return json.loads(project.run("state", "get", state_id).stdout)["singer_state"]["bookmarks"]["numbers"]["id"]


def lock_tables(project) -> list:
    # Per-id lock tables are <table>_lock_<hash>; the shared <table>_lock stays.
    return [t for t in project.server.sql(f"SHOW TABLES FROM `{project.schema}`").split()
            if t.startswith("state_lock_")]


def test_run_persists_state_and_the_next_run_starts_from_it(project):
    p = project
    first = p.run("run", "tap-counter", "target-echo")
    assert "tap-counter: starting after id 0" in first.stderr
    assert "No state was found, complete import." in first.stderr
    # One update per STATE message: one after each record.
    assert first.stderr.count("Incremental state has been updated") == 5
    assert [r["id"] for r in harness.output_lines(p.root / "output" / "echo.jsonl")] == [1, 2, 3, 4, 5]
    partial, completed = rows(p.server, p.schema)[JOB]
    assert partial is None
    assert json.loads(completed) == {"singer_state": {"bookmarks": {"numbers": {"id": 5}}}}
    assert bookmark(p, JOB) == 5
    assert lock_tables(p) == []  # every lock was released

    second = p.run("run", "tap-counter", "target-echo")
    assert "tap-counter: starting after id 5" in second.stderr
    assert "tap-counter: emitted 0 records" in second.stderr
    assert len(harness.output_lines(p.root / "output" / "echo.jsonl")) == 5

    # New source rows: only those are extracted.
    third = p.run("run", "tap-counter", "target-echo", env=p.env(TAP_COUNTER_TOTAL="8"))
    assert "tap-counter: starting after id 5" in third.stderr
    assert [r["id"] for r in harness.output_lines(p.root / "output" / "echo.jsonl")] == [1, 2, 3, 4, 5, 6, 7, 8]
    assert bookmark(p, JOB) == 8

    # --full-refresh ignores the state and then overwrites it.
    p.run("run", "--full-refresh", "tap-counter", "target-echo", env=p.env(TAP_COUNTER_TOTAL="3"))
    assert bookmark(p, JOB) == 3
    assert lock_tables(p) == []


def test_state_set_by_hand_steers_the_next_run(project):
    p = project
    p.run("state", "set", "--force", JOB, json.dumps({"singer_state": {"bookmarks": {"numbers": {"id": 3}}}}))
    run = p.run("run", "tap-counter", "target-echo")
    assert "tap-counter: starting after id 3" in run.stderr
    assert [r["id"] for r in harness.output_lines(p.root / "output" / "echo.jsonl")] == [4, 5]
    assert bookmark(p, JOB) == 5


def test_run_with_target_jsonl_from_pypi(tmp_path, venv, library, clickhouse, schema):
    env = {"MELTANO_STATE_BACKEND_CLICKHOUSE_SCHEMA": schema,
           "MELTANO_STATE_BACKEND_CLICKHOUSE_PASSWORD": clickhouse.password}
    p = harness.MeltanoProject(tmp_path / "project", venv, library, state_backend_uri=clickhouse.uri(), env=env,
                               with_target_jsonl=True)
    p.secrets = [clickhouse.password]
    p.run("install", "loader", "target-jsonl", timeout=600)
    job = "dev:tap-counter-to-target-jsonl"
    first = p.run("run", "tap-counter", "target-jsonl")
    assert "tap-counter: starting after id 0" in first.stderr
    written = harness.lines_of_all((p.root / "output" / "jsonl").glob("numbers-*.jsonl"))
    assert [r["id"] for r in written] == [1, 2, 3, 4, 5]
    partial, completed = rows(clickhouse, schema)[job]
    assert json.loads(completed) == {"singer_state": {"bookmarks": {"numbers": {"id": 5}}}}

    second = p.run("run", "tap-counter", "target-jsonl", env=p.env(TAP_COUNTER_TOTAL="7"))
    assert "tap-counter: starting after id 5" in second.stderr
    written = harness.lines_of_all((p.root / "output" / "jsonl").glob("numbers-*.jsonl"))
    assert sorted(r["id"] for r in written) == [1, 2, 3, 4, 5, 6, 7]
    assert json.loads(p.run("state", "get", job).stdout) == {
        "singer_state": {"bookmarks": {"numbers": {"id": 7}}}}


def test_a_run_waiting_for_a_lock_says_who_holds_it_in_meltanos_log(project, chstate_bin):
    """While `chstate lock` holds the pipeline's state id, `meltano run` (default log level) logs
    under chstate_meltano, at its first attempt, that it waits for the lock, whose it is and for how
    long it stays valid; the holder lets go only once that line is out."""
    p = project
    started, release = p.root / "started", p.root / "release"
    holder = subprocess.Popen([str(chstate_bin), "--uri", p.server.uri(), "lock", JOB, "--", "sh", "-c",
                               f"touch {started}; while [ ! -e {release} ]; do sleep 0.02; done"],
                              env=p.env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 30
        while not started.exists():
            assert time.monotonic() < deadline and holder.poll() is None, holder.communicate()
            time.sleep(0.02)
        locks = json.loads(subprocess.run([str(chstate_bin), "--uri", p.server.uri(), "locks", "--json"],
                                          env=p.env(), capture_output=True, text=True).stdout)
        (holder_id,) = [lock["holder"] for lock in locks]
        run = subprocess.Popen([str(p.meltano), "run", "tap-counter", "target-echo"], cwd=p.root, env=p.env(),
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        seen = []
        for line in run.stderr:
            seen.append(line)
            if "waiting for the lock" in line:
                break
        release.touch()
        rest = run.communicate(timeout=300)[1]
    finally:
        release.touch()
        holder.wait(timeout=60)
    stderr = "".join(seen) + rest
    assert run.returncode == 0, stderr[-3000:]
    assert p.server.password not in stderr
    wait = seen[-1]
    assert re.search(r"\[info +\] .*waiting for the lock on \"dev:tap-counter-to-target-echo\": another process "
                     rf"\(lock {holder_id}\) renewed it \d+ s ago and it stays valid up to \d+ s more; next try in "
                     r"1000 ms, giving up in \d+ ms", wait), wait
    assert re.search(r"\[info +\] .*acquired the lock on \"dev:tap-counter-to-target-echo\" after \d+ ms", rest), rest
    assert bookmark(p, JOB) == 5
