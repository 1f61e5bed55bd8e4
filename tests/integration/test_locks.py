"""`chstate locks` and `chstate unlock ID --force` against a real server: a
live holder is listed with its times, a dead one turns stale, and a forced
unlock removes the lock so that its holder finds it lost and stops."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time

from test_lock_command import held_until, wait_for

STATE = {"singer_state": {}}


def spawn(cli, *args) -> subprocess.Popen:
    argv = [str(cli.binary), "--uri", cli.uri, *args]
    return subprocess.Popen(argv, env=cli.env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            start_new_session=True)


def locks(cli, *args) -> list:
    return cli.run("locks", "--json", *args).json()


def test_no_locks_before_anything_and_when_free(cli):
    assert locks(cli) == []  # no schema yet
    cli.set("dev:a", STATE)
    assert locks(cli) == [] and cli.run("locks").out == ""
    r = cli.run("unlock", "dev:a", "--force", expect=3)
    assert "is not locked" in r.err


def test_a_live_holder_is_listed_and_a_forced_unlock_stops_it(cli, tmp_path):
    cli.set("dev:a", STATE)
    started, release = tmp_path / "started", tmp_path / "release"
    holder = spawn(cli, "lock", "dev:a", "--stale-lock", "3", "--", "sh", "-c", held_until(started, release))
    try:
        wait_for(started)
        [lock] = locks(cli)
        assert lock["state_id"] == "dev:a" and lock["validity_s"] == 3 and not lock["stale"]
        assert lock["holder"] and lock["held_s"] >= 0 and lock["renewed_s"] <= 3
        assert [(x["state_id"], x["holder"]) for x in locks(cli, "--pattern", "dev:*")] == [("dev:a", lock["holder"])]
        assert locks(cli, "--pattern", "prod:*") == []
        line = cli.run("locks").out.splitlines()
        assert len(line) == 1 and line[0].startswith("dev:a\t" + lock["holder"] + "\theld ") and line[0].endswith("live")
        r = cli.run("unlock", "dev:a", expect=2)
        assert "--force" in r.err and "chstate locks" in r.err
        assert holder.poll() is None
        r = cli.run("unlock", "dev:a", "--force")
        assert f"holder {lock['holder']}" in r.err and "(live)" in r.err
        # The holder learns at its next renewal (every second with a 3 s window) and stops its command.
        assert holder.wait(timeout=20) == 7
        assert "lost" in holder.stderr.read().decode()
        assert locks(cli) == []
        cli.run("lock", "dev:a", "--timeout", "2", "--", "true")  # free for the next one at once
    finally:
        release.touch()
        if holder.poll() is None:
            os.killpg(holder.pid, signal.SIGKILL)
            holder.wait()


def test_a_dead_holder_turns_stale(cli, tmp_path):
    started = tmp_path / "started"
    holder = spawn(cli, "lock", "dev:new", "--stale-lock", "2", "--", "sh", "-c", f"touch {started}; sleep 60")
    wait_for(started)
    os.killpg(holder.pid, signal.SIGKILL)  # no release, no renewal
    holder.wait()
    # dev:new has no state: listed by its table, and only without a pattern.
    [lock] = locks(cli)
    assert lock["state_id"] is None and lock["table"].startswith("state_lock_")
    assert locks(cli, "--pattern", "dev:*") == []
    deadline = time.monotonic() + 20
    while not lock["stale"] and time.monotonic() < deadline:
        time.sleep(0.2)
        [lock] = locks(cli)
    assert lock["stale"] and lock["renewed_s"] >= lock["validity_s"] == 2
    assert "(no state yet; table state_lock_" in cli.run("locks").out
    cli.run("unlock", "dev:new", "--force", "--json")
    assert locks(cli) == []
