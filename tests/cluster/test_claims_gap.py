"""The claims lock against a replica that lacks a confirmed claim.

On 18.16 `select_sequential_consistency=1` only makes sure the replica read has
the *last* quorum insert of the table: a replica that missed an earlier one (its
fetch failed or is still queued) answers without it. Reproduced here with
`SYSTEM STOP FETCHES` on r1:

1. a holder takes dev:job through r2 (host list r2, r3, r1): its claim is on r2
   and r3, confirmed, and r1 never fetches it;
2. a row of no claim is written through r1 with the quorum: the last quorum
   insert of the claims table is now one r1 has, so r1 answers sequentially
   consistent reads;
3. a contender asks for dev:job through r1 first (host list r1, r2, r3).

Read from r1 alone, the holder's claim is invisible and the contender would
take the lock while the holder has it. chstate reads the claims from enough
replicas that one of them has every confirmed claim (docs/cluster.md), so the
contender must find the lock held (exit 4). Through r1 alone (a one-host URI)
it must not take the lock either.

  python3 -m pytest tests/cluster/test_claims_gap.py
"""

from __future__ import annotations

import subprocess
import time

import pytest

pytestmark = pytest.mark.requires_clickhouse

EXIT_LOCK_HELD = 4


def lock_cmd(c, uri: str, state_id: str, *args: str) -> list[str]:
    return [str(c.chstate), "lock", state_id, "--uri", uri, *args]


def run(c, cmd: list[str], timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, env=c.env(), capture_output=True, timeout=timeout)


def claims_table(c, schema: str) -> str:
    tables = c.sql("r1", f"SELECT name FROM system.tables WHERE database = '{schema}' AND name LIKE '%\\\\_claims'")
    names = tables.split()
    assert len(names) == 1, tables
    return f"`{schema}`.`{names[0]}`"


def test_a_claim_missing_on_the_replica_read_still_keeps_the_lock(healthy, schema):
    c = healthy
    via_r2 = c.hosts_uri(schema, ("r2", "r3", "r1"))
    via_r1 = c.hosts_uri(schema, ("r1", "r2", "r3"))
    # The claims table exists everywhere before r1 stops fetching.
    warm = run(c, lock_cmd(c, via_r1, "dev:warm", "--", "true"))
    assert warm.returncode == 0, warm
    table = claims_table(c, schema)
    names = lambda replica: set(c.sql(replica, f"SELECT DISTINCT name FROM {table}").split())  # noqa: E731
    before = names("r1")
    c.sql("r1", f"SYSTEM STOP FETCHES {table}")
    holder = subprocess.Popen(lock_cmd(c, via_r2, "dev:job", "--", "sleep", "60"), env=c.env(),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        # Its claim shows through r2 (the claims' `name` is the id's lock name).
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not names("r2") - before:
            assert holder.poll() is None, holder.stderr.read().decode()
            time.sleep(0.2)
        job = names("r2") - before
        assert len(job) == 1, job
        job_name = job.pop()
        time.sleep(1)  # past its second read: it holds
        assert holder.poll() is None, holder.stderr.read().decode()
        missing = f"SELECT count() FROM {table} WHERE name = '{job_name}'"
        assert int(c.sql("r1", missing)) == 0, "r1 fetched the holder's claim: the gap this test needs is not there"
        # A quorum insert through r1 (an end row of no claim): the last one
        # is now a part r1 has, so r1 answers sequentially consistent reads
        # again, and it still lacks the holder's claim.
        c.sql("r1", f"INSERT INTO {table} (name, lock_id, seq, at, stale_s, over) "
                    "VALUES ('gap_test', 'none', 3, now(), 0, '')", insert_quorum=2, insert_quorum_timeout=10000)
        assert int(c.sql("r1", missing, select_sequential_consistency=1)) == 0

        contender = run(c, lock_cmd(c, via_r1, "dev:job", "--timeout", "2", "--", "true"))
        assert contender.returncode == EXIT_LOCK_HELD, contender
        # Through r1 alone (a one-host URI) it must not take the lock either
        # (r1 lags, or it cannot be shown that no replica has a claim).
        alone = run(c, lock_cmd(c, c.uri("r1", schema, alone=True), "dev:job", "--timeout", "2", "--", "true"))
        assert alone.returncode != 0, alone
        assert holder.poll() is None, holder.stderr.read().decode()
    finally:
        try:
            c.sql("r1", f"SYSTEM START FETCHES {table}")
        finally:
            if holder.poll() is None:
                holder.kill()
            holder.wait()
