"""Deletes and `clear --all` under the smaller quorum (2 of 3 replicas) with one
replica down: they keep their tombstone semantics (docs/cluster.md).

With r3 stopped cleanly, states are deleted and cleared through the several-host
URI; the deletes are seen at once through both live replicas, a deleted id can
be set again, and once r3 is back it shows exactly what the others show (the
tombstones replicated to it, nothing resurrected).

  python3 -m pytest tests/cluster/test_tombstones_ha.py
"""

from __future__ import annotations

import json
import time

import pytest

pytestmark = pytest.mark.requires_clickhouse

EXIT_NOT_FOUND = 3


def state(value) -> str:
    return json.dumps({"singer_state": {"n": value}})


def listed(c, replica: str, schema: str) -> list[str]:
    r = c.cli(replica, schema, "list")
    assert r.code == 0, r
    return r.out.split()


def value(c, replica: str, schema: str, state_id: str):
    r = c.cli(replica, schema, "get", state_id)
    if r.code == EXIT_NOT_FOUND:
        return None
    assert r.code == 0, r
    return json.loads(r.out)["singer_state"]["n"]


def test_deletes_and_clear_all_with_one_replica_down(healthy, schema):
    c = healthy
    for i, sid in enumerate(("dev:a", "dev:b", "dev:c")):
        r = c.cli_hosts(schema, "set", sid, state(i))
        assert r.code == 0, r
    c.stop_replica("r3")
    try:
        # A delete reaches the quorum of the two live replicas: both see it at once.
        r = c.cli_hosts(schema, "clear", "dev:a", order=("r3", "r1", "r2"))  # the first host is down
        assert r.code == 0, r
        for replica in ("r1", "r2"):
            assert value(c, replica, schema, "dev:a") is None
            assert listed(c, replica, schema) == ["dev:b", "dev:c"]
        # A deleted id can be written again; its tombstone is superseded.
        assert c.cli_hosts(schema, "set", "dev:a", state(10)).code == 0
        assert value(c, "r2", schema, "dev:a") == 10
        # clear --all tombstones every live state, through one live replica.
        r = c.cli_hosts(schema, "clear", "--all", order=("r2", "r1", "r3"))
        assert r.code == 0, r
        for replica in ("r1", "r2"):
            assert listed(c, replica, schema) == []
        assert c.cli_hosts(schema, "set", "dev:d", state(4)).code == 0
    finally:
        c.restart_replica("r3")
    # r3 comes back and catches up: the same states as the others, no resurrection.
    deadline = time.monotonic() + 60
    while True:
        try:
            seen = listed(c, "r3", schema)
        except AssertionError:
            seen = None  # 289: still catching up with the last quorum write
        if seen == ["dev:d"] or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert seen == ["dev:d"], seen
    assert value(c, "r3", schema, "dev:a") is None
    assert value(c, "r3", schema, "dev:d") == 4
