"""A state write the server runs after its lock stopped being the writer's writes nothing.

The table lock is a table named after the state id, and a release is a
`DROP TABLE IF EXISTS` of that name. A request held past the client's
timeout and run later (a server queue, a proxy that delivers late) can
therefore drop whoever holds the lock by then, and a late state INSERT can
land after the next holder's write. Both lost acknowledged merges in the
history suite (tests/faults/test_histories.py, `slow_before`). So a write
under a table lock is fenced: the server writes the row only if the lock
table holds the writer's lock when the INSERT runs (core/statements.h,
InsertState).

Here the late DROP is done by hand against the real ClickHouse 18.16, under
a holder that then writes: refused while another process holds the lock
(code 395), and refused when no lock is there at all (code 60 on the lock
table). The other holder's state is what stays.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "hosts" / "python"))

from chstate_meltano import _native, binding  # noqa: E402
from test_same_policy import artifacts, python_library  # noqa: E402,F401  (fixtures)

pytestmark = pytest.mark.requires_clickhouse

ID = "dev:fenced"


def open_store(clickhouse, schema: str) -> binding.Store:
    s = clickhouse
    return binding.Store(_native.NativeCore(), {"uri": f"clickhouse://{s.user}@{s.host}:{s.port}/default",
                                                "password": s.password, "schema": schema}, env={})


def lock_tables(clickhouse, schema: str) -> list[str]:
    out = clickhouse.sql(f"SELECT name FROM system.tables WHERE database = '{schema}' "
                         "AND match(name, '^state_lock_[0-9a-f]{16}$') FORMAT TabSeparated")
    return out.split()


def stored(clickhouse, schema: str) -> dict:
    out = clickhouse.sql(f"SELECT completed_state FROM `{schema}`.`state` FINAL WHERE state_id = '{ID}' "
                         "FORMAT TabSeparated")
    return json.loads(out.strip())


def test_a_write_whose_lock_was_dropped_under_it_writes_nothing(clickhouse, cli_factory, python_library):  # noqa: F811
    cli = cli_factory()
    assert cli.direct("init").returncode == 0
    a, b = open_store(clickhouse, cli.schema), open_store(clickhouse, cli.schema)
    try:
        with pytest.raises(binding.ChstateError) as lost:
            with a.lock(ID):
                a.set(ID, {"singer_state": {"a": 1}})  # its own lock: written
                assert stored(clickhouse, cli.schema) == {"singer_state": {"a": 1}}
                [table] = lock_tables(clickhouse, cli.schema)
                # What a release run late does: the lock table dropped under its holder.
                clickhouse.sql(f"DROP TABLE `{cli.schema}`.`{table}`")
                with b.lock(ID):
                    with pytest.raises(binding.ChstateError) as refused:
                        a.set(ID, {"singer_state": {"late": 1}})  # b holds the lock now
                    assert refused.value.code == "ABORTED", refused.value
                    assert "was not this process's any more" in str(refused.value)
                    assert "nothing was written" in str(refused.value)
                    b.set(ID, {"singer_state": {"b": 1}})
                b.close()  # its lock released, not kept lingering for its next write
                # No lock at all now: refused again, not taken for a missing schema.
                assert lock_tables(clickhouse, cli.schema) == []
                with pytest.raises(binding.ChstateError) as gone:
                    a.set(ID, {"singer_state": {"late": 2}})
                assert gone.value.code == "ABORTED" and "nothing was written" in str(gone.value)
        # Leaving a's scope reports that what it did was not exclusive, and drops no one's lock.
        assert lost.value.code == "ABORTED" and "lost" in str(lost.value)
        assert stored(clickhouse, cli.schema) == {"singer_state": {"b": 1}}
        # The id is free and writable again, by either store.
        a.set(ID, {"singer_state": {"a": 2}})
        assert stored(clickhouse, cli.schema) == {"singer_state": {"a": 2}}
        assert lock_tables(clickhouse, cli.schema) == []
    finally:
        a.close()
        b.close()


def test_a_fenced_write_of_a_state_above_the_parsers_bound_is_written(clickhouse, cli_factory, python_library):  # noqa: F811
    # The fenced row is a SELECT of literals, which max_query_size (256 KiB)
    # bounds unless the request raises it for itself.
    cli = cli_factory()
    assert cli.direct("init").returncode == 0
    a = open_store(clickhouse, cli.schema)
    big = {"singer_state": {"bookmarks": {f"stream_{i}": "x" * 100 for i in range(4000)}}}
    try:
        with a.lock(ID):
            a.set(ID, big)
        assert stored(clickhouse, cli.schema) == big
        assert len(json.dumps(big)) > 262144
    finally:
        a.close()


@pytest.mark.parametrize("ddl", ["DROP TABLE {lock}", "RENAME TABLE {lock} TO {moved}"])
def test_a_release_or_takeover_waits_for_a_fenced_insert_in_flight(clickhouse, cli_factory, ddl):
    """What makes the fence's check and its write one step on 18.16: the
    INSERT holds the lock table's structure lock until its part is written,
    and DROP and RENAME wait for it. The fenced statement's shape, slowed by
    a 2 s sleep in its read of the lock table; the DDL starts 0.5 s in."""
    cli = cli_factory()
    assert cli.direct("init").returncode == 0
    schema = cli.schema
    lock = f"`{schema}`.`state_lock_0000000000000001`"
    clickhouse.sql(f"CREATE TABLE {lock} ENGINE = Log AS SELECT 'mine' AS lock_id, toUInt8(0) AS seq, "
                   "now() AS locked_at, toUInt32(10) AS stale_s")
    ended = {}

    def insert():
        clickhouse.sql(f"INSERT INTO `{schema}`.`state` (state_id, partial_state, completed_state) "
                       f"SELECT '{ID}', NULL, '{{}}' FROM (SELECT countIf(seq = 0 AND lock_id = 'mine') AS ours, "
                       f"max(sleep(2)) AS slow FROM {lock}) WHERE throwIf(ours = 0) = 0 AND slow = 0")
        ended["insert"] = time.monotonic()

    t = threading.Thread(target=insert)
    t.start()
    time.sleep(0.5)
    clickhouse.sql(ddl.format(lock=lock, moved=f"`{schema}`.`state_lock_0000000000000001_dead`"))
    ended["ddl"] = time.monotonic()
    t.join(30)
    assert "insert" in ended, "the fenced INSERT did not finish"
    assert ended["ddl"] >= ended["insert"], "the DDL ran while the fenced INSERT was between its check and its write"
    assert clickhouse.sql(f"SELECT count() FROM `{schema}`.`state` WHERE state_id = '{ID}'").strip() == "1"
