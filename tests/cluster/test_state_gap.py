"""State reads and updates against a replica that lacks a confirmed write.

On 18.16 `select_sequential_consistency=1` only makes sure the replica read has
the *last* quorum insert of the table: a replica that missed an earlier one (a
fetch still queued after a restart, as tests/cluster/test_histories_ha.py
found, or one that failed) answers without it. Reproduced here with
`SYSTEM STOP FETCHES` on r1's state table:

1. dev:a gets key k2 through r2 (host list r2, r3, r1): the write is confirmed
   on r2 and r3, and r1 never fetches it;
2. a row of another id is written through r1 with the quorum: the table's last
   quorum insert is now one r1 has, so r1 answers sequentially consistent
   reads again, without k2;
3. through r1 first (host list r1, r2, r3), `get dev:a` and `merge dev:a k4`.

Read from r1 alone, the get would miss k2 and the merge would write a state
without it: an acknowledged merge lost. chstate reads a state from enough
replicas that one has every confirmed write (docs/cluster.md), so the get shows
k2 and the merge keeps it.

  python3 -m pytest tests/cluster/test_state_gap.py
"""

from __future__ import annotations

import json
import subprocess

import pytest

pytestmark = pytest.mark.requires_clickhouse


def run(c, uri: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(c.chstate), *args, "--uri", uri], env=c.env(), capture_output=True, timeout=120)


def keys(r: subprocess.CompletedProcess) -> set[str]:
    assert r.returncode == 0, r
    return set(json.loads(r.stdout)["singer_state"])


def test_a_write_missing_on_the_replica_read_is_still_seen_and_kept(healthy, schema):
    c = healthy
    via_r1 = c.hosts_uri(schema, ("r1", "r2", "r3"))
    via_r2 = c.hosts_uri(schema, ("r2", "r3", "r1"))
    for state_id in ("dev:a", "dev:b"):
        r = run(c, via_r1, "merge", state_id, json.dumps({"singer_state": {"seed": 1}}))
        assert r.returncode == 0, r
    table = f"`{schema}`.`state`"
    has_k2 = f"SELECT count() FROM {table} WHERE state_id = 'dev:a' AND position(concat(ifNull(partial_state, ''), ifNull(completed_state, '')), 'k2') > 0"
    c.sql("r1", f"SYSTEM STOP FETCHES {table}")
    try:
        r = run(c, via_r2, "merge", "dev:a", json.dumps({"singer_state": {"k2": 1}}))
        assert r.returncode == 0, r
        assert int(c.sql("r2", has_k2)) == 1
        assert int(c.sql("r1", has_k2)) == 0, "r1 fetched the write: the gap this test needs is not there"
        # A quorum insert through r1: the last one is now a part r1 has, so r1
        # answers sequentially consistent reads again, still without k2.
        c.sql("r1", f"INSERT INTO {table} (state_id, completed_state) VALUES ('dev:other', '{{}}')",
              insert_quorum=2, insert_quorum_timeout=10000)
        assert int(c.sql("r1", has_k2, select_sequential_consistency=1)) == 0

        assert keys(run(c, via_r1, "get", "dev:a")) == {"seed", "k2"}
        r = run(c, via_r1, "merge", "dev:a", json.dumps({"singer_state": {"k4": 1}}))
        assert r.returncode == 0, r
        assert keys(run(c, via_r2, "get", "dev:a")) == {"seed", "k2", "k4"}, "the merge lost k2"
    finally:
        c.sql("r1", f"SYSTEM START FETCHES {table}")
