"""The `chstate` CLI and Meltano share state and locks: what one writes the
other reads, and each waits for (or gives up on) the other's lock."""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import time

from meltano_harness import rows

A = "dev:tap-a-to-target-b"
S1 = {"singer_state": {"bookmarks": {"s1": {"since": "2026-01-01"}}}}
S2 = {"singer_state": {"bookmarks": {"s2": {"since": "2026-02-02"}}}}


def chstate(project, binary, *args: str, expect: int = 0, env=None) -> subprocess.CompletedProcess:
    """The CLI on the project's server and schema, configured the Meltano way
    (URI and MELTANO_STATE_BACKEND_CLICKHOUSE_* variables)."""
    env = dict(env or project.base_env)
    env["MELTANO_STATE_BACKEND_URI"] = project.server.uri()
    proc = subprocess.run([str(binary), *args], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == expect, f"chstate {args} exited {proc.returncode}: {proc.stdout}\n{proc.stderr}"
    for secret in project.secrets:
        assert secret not in proc.stdout + proc.stderr
    return proc


def hold_lock(project, binary, script: str) -> subprocess.Popen:
    """`chstate lock A -- sh -c SCRIPT`; the script prints "held" first thing,
    which it can only do while chstate holds the lock."""
    env = dict(project.base_env, MELTANO_STATE_BACKEND_URI=project.server.uri())
    return subprocess.Popen([str(binary), "lock", A, "--", "sh", "-c", "echo held; " + script], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def wait_for_line(proc: subprocess.Popen, expected: str, timeout: float = 60) -> None:
    """Reads proc's stdout until the line `expected` (the event), failing if it
    ends first or `timeout` seconds pass."""
    deadline = time.monotonic() + timeout
    while True:
        remaining = deadline - time.monotonic()
        assert remaining > 0, f"no {expected!r} from {proc.args} within {timeout} s"
        ready, _, _ = select.select([proc.stdout], [], [], remaining)
        if not ready:
            continue
        line = proc.stdout.readline()
        if not line:
            out, err = proc.communicate(timeout=60)
            raise AssertionError(f"{proc.args} ended (exit {proc.returncode}) before {expected!r}: {out}\n{err}")
        if line.strip() == expected:
            return


def test_chstate_writes_meltano_reads(project, chstate_bin):
    p = project
    chstate(p, chstate_bin, "set", A, json.dumps(S1))
    chstate(p, chstate_bin, "merge", A, json.dumps(S2))
    assert json.loads(p.run("state", "get", A).stdout) == {
        "singer_state": {"bookmarks": {**S1["singer_state"]["bookmarks"], **S2["singer_state"]["bookmarks"]}}}
    assert p.run("state", "list", "--pattern", "dev:*").stdout.splitlines() == [A]
    exported = json.loads(p.run("state", "export").stdout)
    assert exported == {A: {"completed": S1, "partial": S2}}


def test_meltano_writes_chstate_reads(project, chstate_bin):
    p = project
    p.run("state", "set", "--force", A, json.dumps(S1))
    p.run("state", "merge", A, json.dumps(S2))
    got = json.loads(chstate(p, chstate_bin, "get", A, "--json").stdout)
    assert got["completed"] == S1 and got["partial"] == S2
    assert chstate(p, chstate_bin, "list").stdout.splitlines() == [A]
    p.run("state", "clear", "--force", A)
    chstate(p, chstate_bin, "get", A, expect=3)
    assert rows(p.server, p.schema) == {}


def test_meltano_gives_up_on_a_lock_chstate_holds(project, chstate_bin, tmp_path):
    p = project
    p.run("state", "set", "--force", A, json.dumps(S1))
    release = tmp_path / "release"
    # Holds the lock until the test creates `release`.
    holder = hold_lock(p, chstate_bin, f"while [ ! -e '{release}' ]; do sleep 0.05; done")
    try:
        wait_for_line(holder, "held")
        started = time.monotonic()
        out = p.run("state", "merge", A, json.dumps(S2),
                    env=p.env(MELTANO_STATE_BACKEND_CLICKHOUSE_LOCK_WAIT_SECONDS="1"), expect=1)
        assert time.monotonic() - started < 30
        assert "is locked by another process" in out.stderr, out.stderr[-4000:]
        # The lock was held all the while Meltano tried.
        assert holder.poll() is None
        assert json.loads(p.run("state", "get", A).stdout) == S1  # nothing was merged
    finally:
        release.touch()
        holder.communicate(timeout=60)
    assert holder.returncode == 0
    # Released: the merge goes through now.
    p.run("state", "merge", A, json.dumps(S2))
    assert json.loads(chstate(p, chstate_bin, "get", A, "--json").stdout)["partial"] == S2


def test_a_killed_holder_blocks_meltano_for_the_lock_validity_and_no_longer(project, chstate_bin):
    """lock_timeout_seconds is the lock's validity, as Meltano defines it: a
    holder killed with SIGKILL (no release, no renewal) blocks the id until
    its lock is that old, never longer (the default wait covers it) and
    never less (a short wait gives up before)."""
    p = project
    p.run("state", "set", "--force", A, json.dumps(S1))
    env = dict(p.base_env, MELTANO_STATE_BACKEND_URI=p.server.uri())
    holder = subprocess.Popen([str(chstate_bin), "--stale-lock", "10", "lock", A, "--", "sh", "-c",
                               "echo held; sleep 120"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, start_new_session=True)
    try:
        wait_for_line(holder, "held")
        held = time.monotonic()
    finally:
        os.killpg(holder.pid, signal.SIGKILL)  # chstate and its command: nothing releases or renews
        holder.communicate(timeout=60)
    validity = p.env(MELTANO_STATE_BACKEND_LOCK_TIMEOUT_SECONDS="10")
    # Within the validity, a short wait gives up: the dead holder's lock still counts.
    short = dict(validity, MELTANO_STATE_BACKEND_CLICKHOUSE_LOCK_WAIT_SECONDS="1")
    out = p.run("state", "merge", A, json.dumps(S2), env=short, expect=1)
    assert "is locked by another process" in out.stderr, out.stderr[-4000:]
    assert time.monotonic() - held < 10, "too slow to show anything: the window had passed"
    # The default wait (twice the validity plus a retry) outlasts it: the merge
    # goes through once the lock is 10 s old, not before.
    p.run("state", "merge", A, json.dumps(S2), env=validity)
    elapsed = time.monotonic() - held
    assert 10 <= elapsed < 30, elapsed
    assert json.loads(p.run("state", "get", A).stdout) == {
        "singer_state": {"bookmarks": {**S1["singer_state"]["bookmarks"], **S2["singer_state"]["bookmarks"]}}}


def test_meltano_waits_for_a_short_chstate_lock(project, chstate_bin, tmp_path):
    p = project
    done = tmp_path / "holder-done"
    holder = hold_lock(p, chstate_bin, f"sleep 2; touch '{done}'")
    try:
        wait_for_line(holder, "held")
        # Default timeout 10 s, retry 1 s: the merge waits and then succeeds.
        p.run("state", "merge", A, json.dumps(S2))
        # It could only get the lock once the holder's command had finished.
        assert done.exists(), "the merge went through while chstate held the lock"
    finally:
        holder.communicate(timeout=60)
    assert holder.returncode == 0
    assert json.loads(p.run("state", "get", A).stdout) == S2


def test_chstate_gives_up_on_a_lock_the_adapter_holds(project, chstate_bin):
    p = project
    code = f"""
import subprocess, sys
from meltano.core.project import Project
from meltano.core.state_service import StateService
with StateService(project=Project.find()) as s:
    m = s.state_store_manager
    with m.acquire_lock({A!r}, retry_seconds=1):
        r = subprocess.run([{str(chstate_bin)!r}, "set", {A!r}, '{{"singer_state": {{}}}}', "--lock-timeout", "1"],
                           capture_output=True, text=True)
        print("inside", r.returncode, r.stderr.strip()[:300])
    r = subprocess.run([{str(chstate_bin)!r}, "set", {A!r}, '{{"singer_state": {{"x": 1}}}}'],
                       capture_output=True, text=True)
    print("after", r.returncode)
"""
    out = p.python(code, env=p.env(MELTANO_STATE_BACKEND_URI=p.server.uri()))
    lines = [line for line in out.stdout.splitlines() if line.startswith(("inside", "after"))]
    assert lines[0].startswith("inside 4"), out.stdout + out.stderr
    assert lines[1] == "after 0"
    assert json.loads(p.run("state", "get", A).stdout) == {"singer_state": {"x": 1}}
