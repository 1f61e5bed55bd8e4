"""`chstate locks` and `chstate unlock --force` in cluster mode, where a lock is
a claim in `<table>_claims` (docs/cluster.md): a held lock is listed with
its holder through any replica, a forced unlock ends the claim so the next
process gets the lock at once, and the holder finds it lost at its renewal.

  python3 -m pytest tests/cluster/test_claims_cli.py
"""

from __future__ import annotations

import json
import subprocess
import time

import pytest

pytestmark = pytest.mark.requires_clickhouse


def lock(c, replica: str, schema: str, *args: str) -> subprocess.CompletedProcess:
    """`chstate lock dev:job ARGS` through one replica (the URI before the command's `--`)."""
    return subprocess.run([str(c.chstate), "lock", "dev:job", "--uri", c.uri(replica, schema), *args],
                          env=c.env(), capture_output=True, timeout=60)


def test_locks_lists_a_claim_and_unlock_force_ends_it(healthy, schema):
    c = healthy
    assert c.cli_hosts(schema, "set", "dev:job", json.dumps({"singer_state": {}})).code == 0
    # A holder through r1 that renews every second (validity 3 s) and would hold for 20 s.
    holder = subprocess.Popen(
        [str(c.chstate), "lock", "dev:job", "--stale-lock", "3", "--uri", c.uri("r1", schema), "--", "sleep", "20"],
        env=c.env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 30
        locks = []
        while time.monotonic() < deadline and not locks:
            r = c.cli("r2", schema, "locks", "--json")
            assert r.code == 0, r
            locks = json.loads(r.out)
            time.sleep(0.2)
        assert len(locks) == 1, locks
        assert locks[0]["state_id"] == "dev:job"
        holder_id = locks[0]["holder"]
        assert len(holder_id) == 32
        # Another process cannot have it while it is held...
        busy = lock(c, "r3", schema, "--timeout", "1", "--", "true")
        assert busy.returncode == 4, busy  # exit 4: the lock is held by another process
        # ...until it is forced open through another replica.
        r = c.cli("r3", schema, "unlock", "dev:job", "--force")
        assert r.code == 0, r
        assert holder_id in r.out + r.err
        r = c.cli("r2", schema, "locks", "--json")
        assert json.loads(r.out) == [], r
        took = lock(c, "r2", schema, "--timeout", "5", "--", "true")
        assert took.returncode == 0, took
        # The first holder finds its lock lost at its next renewal and stops (exit 7).
        assert holder.wait(timeout=30) == 7, holder.stderr.read().decode()
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait()
    r = c.cli("r1", schema, "unlock", "dev:job", "--force")
    assert r.code == 3, r  # nothing is locked now


def test_verbose_names_a_host_that_is_down_and_the_host_chosen_next(healthy, schema):
    """With the first host of the list down, `chstate -v` says which host it skipped, why, for how
    long, and where the request went instead; the write lands."""
    import socket

    c = healthy
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]
    r2, r3 = f"127.0.0.1:{c.port('r2')}", f"127.0.0.1:{c.port('r3')}"
    # r3 too: the write's lock reads its claims from two replicas.
    uri = f"clickhouse://chstate@127.0.0.1:{closed},{r2},{r3}/default?schema={schema}&cluster={c.name}"
    r = subprocess.run([str(c.chstate), "-v", "--uri", uri, "set", "dev:job", '{"singer_state": {"v": 1}}'],
                       env=c.env(), capture_output=True, timeout=120)
    err = r.stderr.decode()
    assert r.returncode == 0, err
    assert c.password not in err
    down = [line for line in err.splitlines() if line.startswith(f"chstate: info: host 127.0.0.1:{closed} marked down")]
    assert down, err
    assert "connection refused" in down[0] and f"goes to {r2} now" in down[0], down[0]
    assert json.loads(c.cli("r1", schema, "get", "dev:job").out) == {"singer_state": {"v": 1}}
