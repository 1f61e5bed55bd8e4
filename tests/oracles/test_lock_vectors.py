"""Oracles for the lock statements of tests/vectors/lock.json and policy.json,
executed on the ClickHouse 18.16 server (every lock/policy case is of the
clickhouse18 dialect; the cluster lock, ON CLUSTER + ReplicatedMergeTree, is
out of scope: see test_sql_vectors.py).

* test_lock_table_lifecycle: the recorded create_lock succeeds once and then
  fails with code 57 (the lock's test-and-set); inspect_lock answers our
  holder row (lock id, seq 0, a locked_at within seconds of now, stale_s 30)
  plus the system.tables row ('' and 255), five TabSeparated fields per row
  like every scripted inspect answer (rows in any order: the server does not
  keep the UNION ALL order); renew_lock adds a seq 1 row; the
  recorded RENAME to the tombstone name works once and the second time fails
  with 57 (the race-lost answer lock.json scripts), and a RENAME of the gone
  table to another tombstone name fails with 60; the tombstone is what
  init's list_tombstones pattern matches (and LIKE-lookalike names are not);
  drop_lock (IF EXISTS) succeeds twice.
* test_scripted_answers_have_the_real_shape: every scripted inspect_lock /
  get_state / pending_mutations / select_version answer in lock.json and
  policy.json has the field count per row the real server gives that SQL.
* test_replay_*: acquire_free and acquire_stale_takeover run request by
  request against a real lock table (seeded with a stale holder for the
  takeover): each real answer has the scripted outcome (success or code),
  inspect rows agree on holder, seq and stale_s; every acquisition first
  looks at the Python backend's rows (foreign_lock_rows: none here).
* test_lock_case_sql_is_accepted: the writes that take the id's lock
  (delete_under_its_lock, merge_under_lock) run statement by statement, with
  the scripted answers where a real lock gives them, and leave no lock table.
"""

from __future__ import annotations

import pytest

from oracle_lib import exchanges, load, rewrite, tsv_rows

LOCK = {c["name"]: c for c in load("lock")["cases"]}
POLICY = {c["name"]: c for c in load("policy")["cases"]}
SQL = {c["name"]: c for c in load("sql")["cases"]}

OUR_LOCK = b"000102030405060708090a0b0c0d0e0f"


def one(case: dict, purpose: str, nth: int = 0) -> dict:
    return [ex for ex in exchanges(case) if ex.purpose == purpose][nth].request


def prepare(engine, schema: str) -> None:
    for ex in exchanges(SQL["clickhouse18_init"]):
        if ex.purpose in ("create_database", "create_state_table", "create_lock_table"):
            assert engine.execute(ex.request, "meltano", schema).ok


def check_inspect(rows, holders: list[tuple[bytes, bytes]]) -> None:
    """Holder rows (lock_id, seq) and the system.tables row (seq 255), in ANY
    order: 18.16 returns the UNION ALL branches in either order (every
    scripted answer has the 255 row last; the core looks rows up by seq)."""
    assert all(len(r) == 5 for r in rows), rows
    metas = [r for r in rows if r[1] == b"255"]
    assert len(metas) == 1, rows
    ours, meta = [r for r in rows if r[1] != b"255"], metas[0]
    assert sorted((r[0], r[1]) for r in ours) == sorted(holders), ours
    for r in ours:
        assert r[4] == b"30" and abs(int(r[3]) - int(r[2])) <= 5, r
    assert meta[0] == b"" and meta[1] == b"255" and meta[4] == b"0" and abs(int(meta[3]) - int(meta[2])) <= 60, meta


def test_lock_table_lifecycle(ch18, schema):
    prepare(ch18, schema)
    case = LOCK["acquire_stale_takeover"]
    create, inspect, entomb = one(case, "create_lock"), one(case, "inspect_lock"), one(case, "entomb_lock")
    renew = one(POLICY["idle_timer_before_due_sends_nothing_then_renews_when_due"], "renew_lock")
    drop = one(LOCK["delete_under_its_lock"], "drop_lock")
    run = lambda r: ch18.execute(r, "meltano", schema)  # noqa: E731

    first = run(create)
    assert first.ok and first.body == b""
    second = run(create)
    assert second.code == 57, (second.status, second.body)
    check_inspect(run(inspect).rows(), [(OUR_LOCK, b"0")])
    assert run(renew).ok
    check_inspect(run(inspect).rows(), [(OUR_LOCK, b"0"), (OUR_LOCK, b"1")])

    assert run(entomb).ok
    again = run(entomb)
    assert again.code == 57, (again.status, again.body)  # the tombstone name exists (checked first)
    other = dict(entomb, sql=entomb["sql"].replace("_dead_d52e607639b8c04f", "_dead_0000000000000000"))
    gone = run(other)
    assert gone.code == 60, (gone.status, gone.body)  # the lock table is gone
    assert run(inspect).code == 60

    # The tombstone is what list_tombstones' LIKE matches, lookalikes are not
    # (the age condition is moved to the future, as the tables are new).
    for name in ("stateXlock_d23ca78981bbb042_dead_1", "state_lockXd23ca78981bbb042_dead_1",
                 "state_lock_d23ca78981bbb042_deadX1", "state_lock_d23ca78981bbb042Xdead_1", "state_lock"
                 "_dead", "xstate_lock_a_dead_b"):
        ch18.sql(f"CREATE TABLE `{schema}`.`{name}` ENGINE = Log AS SELECT 1 AS x")
    tombstones = one(SQL["clickhouse18_init"], "list_tombstones")
    assert run(tombstones).rows() == []  # all younger than 60 s
    assert " < now() - 60 " in tombstones["sql"]
    aged = dict(tombstones, sql=tombstones["sql"].replace(" < now() - 60 ", " < now() + 60 "))
    assert run(aged).rows() == [[b"state_lock_d23ca78981bbb042_dead_d52e607639b8c04f", b"1"]]

    assert run(create).ok  # the takeover's create
    assert run(drop).ok and run(drop).ok
    assert run(inspect).code == 60


def all_exchanges():
    for source, cases in (("lock", LOCK), ("policy", POLICY)):
        for name, case in cases.items():
            for ex in exchanges(case):
                yield source, name, ex


def test_scripted_answers_have_the_real_shape(ch18, schema):
    prepare(ch18, schema)
    case = LOCK["acquire_free"]
    assert ch18.execute(one(case, "create_lock"), "meltano", schema).ok
    ch18.sql(f"INSERT INTO `{schema}`.`state` (state_id, partial_state, completed_state) VALUES "
             "('dev:tap-users', '{}', '{}')")
    real_counts = {}
    checked = 0
    for source, name, ex in all_exchanges():
        if ex.purpose not in ("inspect_lock", "get_state", "pending_mutations", "select_version"):
            continue
        if ex.scripted is None or ex.scripted_code() is not None or ex.scripted_transport_failure():
            continue
        scripted = tsv_rows(ex.scripted_body())
        if not scripted:
            continue
        key = (ex.request["sql"], str(ex.request["url_params"]))
        if key not in real_counts:
            answer = ch18.execute(ex.request, "meltano", schema)
            assert answer.ok, f"{source}:{name} {ex.purpose}: HTTP {answer.status}: {answer.body[:300]!r}"
            rows = answer.rows()
            real_counts[key] = {len(r) for r in rows}
            assert len(real_counts[key]) == 1, rows
        assert {len(r) for r in scripted} == real_counts[key], (
            f"{source}:{name} #{ex.index} {ex.purpose}: scripted rows {scripted!r} do not have the "
            f"{real_counts[key]} fields the server answers")
        if ex.purpose == "inspect_lock":
            assert scripted[-1][0] == b"" and scripted[-1][1] == b"255", f"{source}:{name}: {scripted!r}"
        checked += 1
    assert checked >= 20


def replay(engine, case: dict, schema: str) -> None:
    for ex in exchanges(case):
        if ex.scripted is None or ex.scripted_transport_failure():
            continue
        real = engine.execute(ex.request, "meltano", schema)
        where = f"{case['name']} #{ex.index} {ex.purpose}"
        if ex.scripted_code() is not None:
            assert real.code == ex.scripted_code(), f"{where}: {real.status} {real.body[:300]!r}"
            continue
        assert real.ok, f"{where}: HTTP {real.status}: {real.body[:300]!r}"
        if ex.purpose == "inspect_lock":
            scripted, rows = tsv_rows(ex.scripted_body()), real.rows()
            assert sorted((r[0], r[1], r[4]) for r in rows) == sorted((r[0], r[1], r[4]) for r in scripted), where
        elif ex.purpose != "select_version":
            assert real.body == ex.scripted_body(), where


def test_replay_acquire_free(ch18, schema):
    prepare(ch18, schema)
    assert [ex.purpose for ex in exchanges(LOCK["acquire_free"])][1:] == ["foreign_lock_rows", "create_lock"]
    replay(ch18, LOCK["acquire_free"], schema)
    assert ch18.rows(f"SELECT lock_id, seq FROM `{schema}`.`state_lock_d23ca78981bbb042`") == [[OUR_LOCK, b"0"]]


def test_replay_acquire_stale_takeover(ch18, schema):
    prepare(ch18, schema)
    # Another holder, 100 s stale (as scripted: locked_at 900000, now 1000000).
    ch18.sql(f"CREATE TABLE `{schema}`.`state_lock_d23ca78981bbb042` ENGINE = Log AS SELECT "
             f"'{'f' * 32}' AS lock_id, toUInt8(0) AS seq, toDateTime(now() - 100) AS locked_at, "
             "toUInt32(30) AS stale_s")
    replay(ch18, LOCK["acquire_stale_takeover"], schema)
    assert ch18.rows(f"SELECT lock_id, seq FROM `{schema}`.`state_lock_d23ca78981bbb042`") == [[OUR_LOCK, b"0"]]
    tomb = ch18.rows(f"SELECT lock_id FROM `{schema}`.`state_lock_d23ca78981bbb042_dead_d52e607639b8c04f`")
    assert tomb == [[b"f" * 32]]


@pytest.mark.parametrize("name", ["delete_under_its_lock", "merge_under_lock"])
def test_lock_case_sql_is_accepted(ch18, schema, name):
    """Every statement of these cases runs on the server in order (answers as scripted
    where a real lock can give them: success), under the id's lock, which is
    gone afterwards."""
    prepare(ch18, schema)
    purposes = [ex.purpose for ex in exchanges(LOCK[name])]
    assert purposes[1:3] == ["foreign_lock_rows", "create_lock"] and purposes[-2:] == ["inspect_lock", "drop_lock"]
    for ex in exchanges(LOCK[name]):
        if ex.scripted is None or ex.scripted_transport_failure() or ex.scripted_code() is not None:
            continue
        real = ch18.execute(ex.request, "meltano", schema)
        assert real.ok, f"{name} #{ex.index} {ex.purpose}: HTTP {real.status}: {real.body[:300]!r}"
        if ex.purpose in ("foreign_lock_rows", "create_lock", "drop_lock"):
            assert real.body == ex.scripted_body(), f"{name} #{ex.index} {ex.purpose}: {real.body[:300]!r}"
        elif ex.purpose == "inspect_lock":
            check_inspect(real.rows(), [(OUR_LOCK, b"0")])
    assert ch18.rows(f"SELECT name FROM system.tables WHERE database = '{schema}' "
                     "AND startsWith(name, 'state_lock_') FORMAT TabSeparated") == []
