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
