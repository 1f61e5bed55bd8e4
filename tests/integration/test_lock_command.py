"""`chstate lock ID -- COMMAND` against a real ClickHouse: exit codes, contention,
signals, renewal of long holds."""

from __future__ import annotations

import signal
import subprocess
import time


def spawn(cli, *args) -> subprocess.Popen:
    argv = [str(cli.binary), "--uri", cli.uri, *args]
    return subprocess.Popen(argv, env=cli.env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def wait_for(path, timeout=20.0) -> None:
    """Waits for a marker file (an event), failing after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists():
            return
        time.sleep(0.02)
    raise AssertionError(f"{path} never appeared")


def held_until(started, release) -> str:
    """A command that marks it runs (so holds the lock), then holds it until
    the test creates `release`: no guessed duration to outlast the contender."""
    return f"touch {started}; while [ ! -e {release} ]; do sleep 0.02; done"


def test_exit_code_passes_through(cli):
    r = cli.run("lock", "job", "--", "sh", "-c", "echo inside; exit 42", expect=42)
    assert r.out.strip() == "inside"
    cli.run("lock", "job", "--timeout", "1", "--", "true")  # and the lock was released


def test_lock_timeout_is_the_wait_only(cli):
    # --timeout 0: try once (it used to set every request's timeout too, and
    # 0 is below a request's minimum: exit 2).
    r = cli.run("lock", "once", "--timeout", "0", "--", "sh", "-c", "echo ran")
    assert r.stdout.strip() == b"ran"


def test_busy_lock_exits_4_without_running_the_command(cli, tmp_path):
    started, release, marker = tmp_path / "started", tmp_path / "release", tmp_path / "ran"
    holder = spawn(cli, "lock", "busy", "--", "sh", "-c", held_until(started, release))
    try:
        wait_for(started)
        t0 = time.monotonic()
        r = cli.run("lock", "busy", "--timeout", "1", "--", "touch", str(marker), expect=4)
        assert time.monotonic() - t0 >= 0.9, "gave up without waiting for the lock"
        assert "locked by another process" in r.err
        assert not marker.exists()
        assert holder.poll() is None, "the holder ended before the contender gave up"
    finally:
        release.touch()
        assert holder.wait(timeout=30) == 0
    cli.run("lock", "busy", "--timeout", "1", "--", "true")


def test_json_error_for_a_busy_lock(cli, tmp_path):
    started, release = tmp_path / "started", tmp_path / "release"
    holder = spawn(cli, "lock", "busy-json", "--", "sh", "-c", held_until(started, release))
    try:
        wait_for(started)
        r = cli.run("--json", "lock", "busy-json", "--timeout", "0.5", "--", "true", expect=4)
        assert r.json()["error"]["code"] == "ABORTED"
        assert holder.poll() is None, "the holder ended before the contender gave up"
    finally:
        release.touch()
        assert holder.wait(timeout=30) == 0


def test_signals_reach_the_command_and_the_lock_is_released(cli, tmp_path):
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        started, got = tmp_path / f"started{sig}", tmp_path / f"got{sig}"
        script = f"trap 'touch {got}; exit 0' {int(sig)}; touch {started}; sleep 30 & wait"
        holder = spawn(cli, "lock", "sig", "--", "sh", "-c", script)
        wait_for(started)
        holder.send_signal(sig)
        code = holder.wait(timeout=30)
        assert got.exists(), f"the command did not get signal {sig}"
        assert code == 0, holder.stderr.read()
        t0 = time.monotonic()
        cli.run("lock", "sig", "--timeout", "1", "--", "true")
        assert time.monotonic() - t0 < 5


def test_signal_kills_a_command_that_does_not_trap_it(cli, tmp_path):
    started = tmp_path / "started"
    holder = spawn(cli, "lock", "sigkill", "--", "sh", "-c", f"touch {started}; exec sleep 30")
    wait_for(started)
    holder.send_signal(signal.SIGTERM)
    assert holder.wait(timeout=30) == 128 + signal.SIGTERM
    cli.run("lock", "sigkill", "--timeout", "1", "--", "true")


def test_unknown_command_is_a_usage_error_and_releases(cli):
    r = cli.run("lock", "nocmd", "--", "/nonexistent/definitely-not-here", expect=2)
    assert "could not run" in r.err
    cli.run("lock", "nocmd", "--timeout", "1", "--", "true")


def test_long_hold_is_renewed_not_taken_over(cli, tmp_path):
    # Time must pass (by design): stale window 2 s, command runs 5 s; without
    # renewal the lock would be taken over by the waiting contender at about
    # 2 s. The contender's command checks that the holder's ran to its end.
    started, done = tmp_path / "started", tmp_path / "done"
    holder = spawn(cli, "--stale-lock", "2", "lock", "long", "--", "sh", "-c", f"touch {started}; sleep 5; touch {done}")
    try:
        wait_for(started)
        t0 = time.monotonic()
        cli.run("--stale-lock", "2", "--lock-retry", "0.1", "lock", "long", "--timeout", "20", "--", "sh", "-c",
                f"test -e {done}")
        assert time.monotonic() - t0 >= 3.0
    finally:
        assert holder.wait(timeout=30) == 0, holder.stderr.read()


def test_lock_needs_a_command(cli):
    r = cli.run("lock", "x", expect=2)
    assert "lock" in r.err
