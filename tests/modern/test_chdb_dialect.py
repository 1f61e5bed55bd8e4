"""The modern dialect, end to end: the real core state machine (//tools:pipe_host)
with every statement it generates executed by a real modern ClickHouse engine
(chDB, in process).

    python3 -m pytest tests/modern -q

The pipe host binary comes from $CHSTATE_PIPE_HOST, else bazel-bin/tools/pipe_host,
which is built with `bazel build //tools:pipe_host` if it does not exist yet.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from pipe_host import (  # noqa: E402
    DEFAULT_BINARY,
    REPO_ROOT,
    ChdbExecutor,
    PipeHost,
    escape_param,
)

chdb_session = pytest.importorskip("chdb.session")

SCHEMA = "chs_main"
TABLE = "state"

# Every purpose the core uses with the modern dialect (PendingMutations is
# 18.x-only). test_zz_every_modern_statement_ran checks all of them ran.
MODERN_PURPOSES = {
    "select_version",
    "list_tombstones",
    "drop_table",
    "create_database",
    "create_state_table",
    "create_lock_table",
    "create_history_table",
    "create_history_view",
    "expire_history",
    "get_state",
    "insert_state",
    "delete_state",
    "list_state_ids",
    "count_states",
    "truncate_states",
    "create_lock",
    "inspect_lock",
    "drop_lock",
    "entomb_lock",
    "renew_lock",
}
# Errors the core provokes on purpose: 57 (lock table exists: the lock's
# test-and-set), 60/81 (a missing table/database reads as absent).
EXPECTED_ERROR_CODES = {57, 60, 81}

_RAN: set = set()


# ---------------------------------------------------------------------------
# fixtures


@pytest.fixture(scope="module")
def pipe_host_binary() -> Path:
    env = os.environ.get("CHSTATE_PIPE_HOST")
    if env:
        return Path(env)
    if not DEFAULT_BINARY.exists():
        proc = subprocess.run(
            ["bazel", "build", "//tools:pipe_host"],
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            timeout=3600,
        )
        if proc.returncode != 0:
            pytest.fail(f"bazel build //tools:pipe_host failed:\n{proc.stderr[-4000:]}")
    assert DEFAULT_BINARY.exists()
    return DEFAULT_BINARY


@pytest.fixture(scope="module")
def session(tmp_path_factory):
    s = chdb_session.Session(str(tmp_path_factory.mktemp("chdb")))
    yield s
    s.close()


@pytest.fixture(scope="module")
def executor(session) -> ChdbExecutor:
    return ChdbExecutor(session)


@pytest.fixture(scope="module")
def make_host(pipe_host_binary, executor):
    hosts = []

    def make(schema: str = SCHEMA, table: str = TABLE, *extra: str, on_wait=None) -> PipeHost:
        h = PipeHost(
            executor,
            args=["--schema", schema, "--table", table, *extra],
            binary=pipe_host_binary,
            on_wait=on_wait,
        )
        hosts.append(h)
        # Connect first, so that later operations show only their own SQL.
        pong = h.ping()
        assert pong.ok and pong.dialect == "modern", pong.raw
        return h

    yield make
    for h in hosts:
        h.close()


@pytest.fixture(scope="module")
def host(make_host) -> PipeHost:
    h = make_host()
    out = h.init()
    assert out.ok, out.message
    return h


@pytest.fixture(autouse=True)
def _record(request):
    yield
    _RAN.add(request.node.name)


# ---------------------------------------------------------------------------
# helpers


def rows(session, sql: str, **params) -> list:
    """TabSeparated rows of a direct chDB query, as lists of str (ASCII data only)."""
    out = session.query(sql, "TabSeparated", params=params or None).bytes().decode()
    return [line.split("\t") for line in out.splitlines()]


def scalar(session, sql: str, **params) -> str:
    return rows(session, sql, **params)[0][0]


def tables(session, schema: str) -> dict:
    return {
        name: engine
        for name, engine in rows(
            session, "SELECT name, engine FROM system.tables WHERE database = {db:String}", db=schema
        )
    }


def lock_tables(session, schema: str = SCHEMA) -> list:
    """Live lock tables (not tombstones of taken-over locks)."""
    return sorted(n for n in tables(session, schema) if re.fullmatch(rf"{TABLE}_lock_[0-9a-f]{{16}}", n))


def tombstones(session, schema: str = SCHEMA) -> list:
    return sorted(n for n in tables(session, schema) if re.fullmatch(rf"{TABLE}_lock_[0-9a-f]{{16}}_dead_[0-9a-f]{{16}}", n))


def lock_table(state_id: str) -> str:
    """The lock table the core uses for `state_id` (Statements::LockTableName)."""
    h = 0xCBF29CE484222325
    for byte in state_id.encode():
        h = ((h ^ byte) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return f"{TABLE}_lock_{h:016x}"


def wait_on_engine_clock(session, sql: str, what: str, timeout: float = 10.0) -> None:
    """Time that must pass by design, waited for on the engine's own clock
    (the one the core's age tests read, in whole seconds): polls `sql`, a
    query answering 1 or 0, until it answers 1; fails after `timeout` s."""
    deadline = time.monotonic() + timeout
    while scalar(session, sql) != "1":
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def wait_lock_older_than(session, state_id: str, seconds: int) -> None:
    """Waits until the lock on `state_id` was last renewed more than `seconds` ago by the engine's clock."""
    wait_on_engine_clock(
        session,
        f"SELECT toInt64(now()) - toInt64(max(locked_at)) > {seconds} FROM `{SCHEMA}`.`{lock_table(state_id)}`",
        f"the lock on {state_id} to be older than {seconds} s",
    )


def executed(executor: ChdbExecutor, since: int, purpose: str) -> list:
    return [e for e in executor.log[since:] if e.purpose == purpose]


# ---------------------------------------------------------------------------
# connecting and creating


def test_ping_reports_modern_dialect_and_chdb_version(host, session):
    out = host.ping()
    assert out.ok, out.message
    assert out.dialect == "modern"
    assert out.server_version == scalar(session, "SELECT version()")
    assert out.purposes() == ["select_version"]


def test_init_creates_database_and_tables(host, session, executor):
    since = len(executor.log)
    out = host.init()  # again: IF NOT EXISTS makes it a no-op
    assert out.ok, out.message
    assert out.purposes() == ["create_database", "create_state_table", "create_lock_table", "create_history_table",
                              "create_history_view", "expire_history", "trim_history", "list_tombstones"]
    assert all(e.ok for e in executor.log[since:])

    assert scalar(session, "SELECT count() FROM system.databases WHERE name = {db:String}", db=SCHEMA) == "1"
    assert tables(session, SCHEMA) == {TABLE: "ReplacingMergeTree", f"{TABLE}_lock": "ReplacingMergeTree",
                                       f"{TABLE}_history": "MergeTree", f"{TABLE}_history_mv": "MaterializedView"}

    def columns(table):
        return rows(
            session,
            "SELECT name, type, default_expression FROM system.columns "
            "WHERE database = {db:String} AND table = {t:String} ORDER BY position",
            db=SCHEMA,
            t=table,
        )

    assert columns(TABLE) == [
        ["state_id", "String", ""],
        ["partial_state", "Nullable(String)", ""],
        ["completed_state", "Nullable(String)", ""],
        ["updated_at", "DateTime64(3)", "now64(3)"],
    ]
    assert columns(f"{TABLE}_lock") == [
        ["state_id", "String", ""],
        ["lock_id", "String", ""],
        ["locked_at", "DateTime", "now()"],
    ]
    info = {
        name: (engine_full, sorting_key)
        for name, engine_full, sorting_key in rows(
            session,
            "SELECT name, engine_full, sorting_key FROM system.tables WHERE database = {db:String}",
            db=SCHEMA,
        )
    }
    state_engine, state_key = info[TABLE]
    lock_engine, lock_key = info[f"{TABLE}_lock"]
    assert state_engine.startswith("ReplacingMergeTree(updated_at)") and state_key == "state_id"
    assert "TTL" not in state_engine
    assert lock_engine.startswith("ReplacingMergeTree(locked_at)") and lock_key == "state_id"
    assert "TTL locked_at + toIntervalSecond(300)" in lock_engine


def test_fresh_schema_reads_as_empty_and_first_write_creates_it(make_host, session):
    h = make_host("chs_fresh")
    assert "chs_fresh" not in [r[0] for r in rows(session, "SELECT name FROM system.databases")]
    got = h.get("nothing")
    assert got.ok and got.state is None  # code 81 reads as absent
    listed = h.list(None)
    assert listed.ok and listed.state_ids == []
    cleared = h.clear_all()
    assert cleared.ok and cleared.count == 0

    out = h.set("first", completed={"singer_state": {"a": 1}})
    assert out.ok, out.message
    # insert failed with 81, the core created the schema and wrote again
    assert out.purposes() == [
        "insert_state",
        "create_database",
        "create_state_table",
        "create_lock_table",
        "create_history_table",
        "create_history_view",
        "insert_state",
    ]
    assert h.get("first").state.completed == {"singer_state": {"a": 1}}

    # A lock on a missing database: CREATE TABLE fails with 81, init, retry.
    h2 = make_host("chs_fresh_lock")
    lock = h2.acquire_lock("x")
    assert lock.ok, lock.message
    assert lock.purposes()[0] == "create_lock" and lock.purposes()[-1] == "create_lock"
    assert "create_database" in lock.purposes()
    assert h2.release_lock("x", lock.lock_id).ok


# ---------------------------------------------------------------------------
# state operations


def test_set_get_round_trip(host):
    completed = {"singer_state": {"bookmarks": {"users": {"replication_key_value": "2024-01-01T00:00:00Z"}}}}
    partial = {"singer_state": {"partial": [1, 2.5, None, True, "ünïcødé ✓"]}}
    assert host.set("dev:tap-a-to-target-b", completed=completed, partial=partial).ok
    out = host.get("dev:tap-a-to-target-b")
    assert out.ok
    assert out.state.state_id == b"dev:tap-a-to-target-b"
    assert out.state.completed == completed
    assert out.state.partial == partial
    assert host.get("dev:absent").state is None

    # Overwrite: the newest write wins; empty sides come back as {}.
    assert host.set("dev:tap-a-to-target-b", completed={"singer_state": {"v": 2}}).ok
    out = host.get("dev:tap-a-to-target-b")
    assert (out.state.completed, out.state.partial) == ({"singer_state": {"v": 2}}, {})


def test_empty_sides_are_stored_as_null(host, session):
    assert host.set("nulls:1", completed={"singer_state": {}}).ok
    assert rows(
        session,
        f"SELECT isNull(partial_state), completed_state FROM `{SCHEMA}`.`{TABLE}` FINAL WHERE state_id = 'nulls:1'",
    ) == [["1", '{"singer_state":{}}']]


def test_update_merges_partial_and_keeps_completed(host, session):
    assert host.set(
        "upd:1",
        completed={"singer_state": {"c": 1}},
        partial={"singer_state": {"bookmarks": {"a": 1}}, "other": [1]},
    ).ok
    out = host.update("upd:1", partial={"singer_state": {"bookmarks": {"b": 2}}, "other": [2]})
    assert out.ok, out.message
    want_partial = {"singer_state": {"bookmarks": {"a": 1, "b": 2}}, "other": [2]}
    assert out.state.partial == want_partial
    assert out.state.completed == {"singer_state": {"c": 1}}
    got = host.get("upd:1").state
    assert (got.completed, got.partial) == ({"singer_state": {"c": 1}}, want_partial)
    assert out.purposes() == ["create_lock", "get_state", "insert_state", "inspect_lock", "drop_lock"]
    assert lock_tables(session) == []

    # A complete incoming state replaces everything.
    out = host.update("upd:1", completed={"singer_state": {"c": 9}})
    assert out.ok
    got = host.get("upd:1").state
    assert (got.completed, got.partial) == ({"singer_state": {"c": 9}}, {})

    # Update of an absent id writes the incoming state.
    out = host.update("upd:absent", partial={"p": 1})
    assert out.ok
    got = host.get("upd:absent").state
    assert (got.completed, got.partial) == ({}, {"p": 1})

    # set_locked: overwrite under the lock.
    out = host.set_locked("upd:1", completed={"x": 1}, partial={"y": 2})
    assert out.ok, out.message
    assert "create_lock" in out.purposes() and out.purposes()[-1] == "drop_lock"
    got = host.get("upd:1").state
    assert (got.completed, got.partial) == ({"x": 1}, {"y": 2})


def test_list_with_glob_patterns(host):
    ids = [b"glob:a_b1", b"glob:axb1", b"glob:a%c", b"glob:abc", b"glob:a\\b", b"glob:a_b2", b"glob:A_b1"]
    for i, sid in enumerate(ids):
        assert host.set(sid, completed={"i": i}).ok

    def listed(pattern):
        out = host.list(pattern)
        assert out.ok, out.message
        return out.state_ids

    assert listed(b"glob:a_b*") == [b"glob:a_b1", b"glob:a_b2"]  # `_` is literal: no axb1
    assert listed(b"glob:a%*") == [b"glob:a%c"]  # `%` is literal
    assert listed(b"glob:a?b1") == [b"glob:a_b1", b"glob:axb1"]  # `?` is one character
    assert listed(b"glob:a\\*") == [b"glob:a\\b"]  # backslash is literal
    assert listed(b"glob:abc") == [b"glob:abc"]
    assert listed(b"glob:zzz*") == []
    assert listed(b"glob:*") == sorted(ids)  # sorted by bytes, case-sensitive
    everything = listed(None)
    assert everything == sorted(everything)
    assert set(ids) <= set(everything)


def test_delete_runs_lightweight_delete(host, session, executor):
    assert host.set("del:1", completed={"a": 1}).ok
    assert host.set("del:2", completed={"a": 2}).ok
    since = len(executor.log)
    out = host.delete("del:1")
    assert out.ok, out.message
    (run,) = executed(executor, since, "delete_state")
    assert run.ok
    assert run.sql.startswith(f"DELETE FROM `{SCHEMA}`.`{TABLE}` WHERE state_id = {{state_id:String}}")
    assert run.settings == {"mutations_sync": "2"}
    assert run.params == {"state_id": "del:1"}
    assert host.get("del:1").state is None
    assert b"del:1" not in host.list("del:*").state_ids
    # Gone from every read, not only FINAL ones.
    assert scalar(session, f"SELECT count() FROM `{SCHEMA}`.`{TABLE}` WHERE state_id = 'del:1'") == "0"
    assert host.get("del:2").state.completed == {"a": 2}

    # Deleting an absent id succeeds.
    assert host.delete("del:absent").ok

    out = host.delete_locked("del:2")
    assert out.ok, out.message
    assert out.purposes() == ["create_lock", "delete_state", "inspect_lock", "drop_lock"]
    assert host.get("del:2").state is None


def test_clear_all_returns_count_and_empties_table(make_host, session):
    h = make_host("chs_clear")
    assert h.init().ok
    for sid in ["c:1", "c:2", "c:3"]:
        assert h.set(sid, completed={"id": sid}).ok
    assert h.set("c:2", completed={"id": "again"}).ok  # two rows, one state
    out = h.clear_all()
    assert out.ok, out.message
    assert out.count == 3
    assert out.purposes() == ["count_states", "truncate_states"]
    assert h.list(None).state_ids == []
    assert scalar(session, "SELECT count() FROM `chs_clear`.`state`") == "0"
    again = h.clear_all()
    assert again.ok and again.count == 0


def test_copy(host):
    assert host.set("copy:src", completed={"c": 1}, partial={"p": 1}).ok
    out = host.copy("copy:src", "copy:dst")
    assert out.ok, out.message
    dst = host.get("copy:dst").state
    src = host.get("copy:src").state
    assert (dst.state_id, dst.completed, dst.partial) == (b"copy:dst", {"c": 1}, {"p": 1})
    assert (src.completed, src.partial) == ({"c": 1}, {"p": 1})

    missing = host.copy("copy:absent", "copy:dst2")
    assert missing.code == "NOT_FOUND"
    assert host.get("copy:dst2").state is None


def test_move(host, session):
    assert host.set("move:src", completed={"c": 2}).ok
    out = host.move("move:src", "move:dst")
    assert out.ok, out.message
    assert host.get("move:src").state is None
    dst = host.get("move:dst").state
    assert (dst.completed, dst.partial) == ({"c": 2}, {})
    assert "delete_state" in out.purposes()
    assert lock_tables(session) == []

    assert host.move("move:dst", "move:dst").code == "INVALID_ARGUMENT"
    assert host.move("move:absent", "move:x").code == "NOT_FOUND"


def test_aba_writes_leave_the_last_one(host, executor):
    since = len(executor.log)
    for round_ in range(5):
        a = {"singer_state": {"v": "A", "round": round_}}
        b = {"singer_state": {"v": "B", "round": round_}}
        for state in (a, b, a):
            out = host.set("aba:1", completed=a if state is a else b)
            assert out.ok, out.message
        got = host.get("aba:1").state
        assert got.completed == a, f"round {round_}: {got.completed}"

    inserts = executed(executor, since, "insert_state")
    assert len(inserts) == 15
    assert all(e.settings.get("async_insert") == "0" for e in inserts)
    tokens = [e.settings.get("insert_deduplication_token") for e in inserts]
    assert all(tokens) and len(set(tokens)) == len(tokens)


HOSTILE_IDS = [
    b"it's",
    b'say "hi"',
    b"back\\slash",
    b"\\",
    b"\\N",
    b"nul\x00byte",
    b"\x00",
    b"new\nline",
    b"tab\tsep",
    b"cr\rlf\r\n",
    b"100%",
    b"under_score",
    b"star*id",
    b"q?mark",
    b"\xff\xfe",
    b"caf\xc3\xa9 \xf0\x9f\x98\x80",
    b"'); DROP TABLE x; --",
    b"{state_id:String}",
    b"`chs_main`.`state`",
    bytes(range(256)) * 400,  # 100 KiB, every byte value
]


def test_hostile_ids_are_byte_exact(host, session, executor):
    session.query("CREATE TABLE IF NOT EXISTS x (a UInt8) ENGINE = Memory")
    for i, sid in enumerate(HOSTILE_IDS):
        completed = {"singer_state": {"i": i, "text": "ünï\u0000\t\"'\\"}}
        partial = {"p": [i]}
        out = host.set(sid, completed=completed, partial=partial)
        assert out.ok, (sid[:40], out.message)
        got = host.get(sid)
        assert got.ok, (sid[:40], got.message)
        assert got.state is not None, sid[:40]
        assert got.state.state_id == sid
        assert (got.state.completed, got.state.partial) == (completed, partial), sid[:40]
        # The id as a glob matches itself (`*`/`?` may match more).
        assert sid in host.list(sid).state_ids, sid[:40]

    everything = host.list(None).state_ids
    for sid in HOSTILE_IDS:
        assert everything.count(sid) == 1, sid[:40]

    # Locked paths with hostile ids (their lock tables are named by hash).
    for sid in (b"'); DROP TABLE x; --", b"\xff\xfe", HOSTILE_IDS[-1]):
        out = host.update(sid, partial={"more": True})
        assert out.ok, out.message
        assert out.state.partial == {"p": [HOSTILE_IDS.index(sid)], "more": True}

    for sid in HOSTILE_IDS:
        assert host.delete(sid).ok, sid[:40]
        assert host.get(sid).state is None, sid[:40]
    assert "x" in tables(session, "default")
    assert lock_tables(session) == []
    assert not executor.problems, executor.problems


# ---------------------------------------------------------------------------
# the lock


def test_lock_acquire_contend_release(host, make_host, session):
    impatient = make_host(SCHEMA, TABLE, "--lock-timeout-ms", "0")
    held = host.acquire_lock("lock:x")
    assert held.ok, held.message
    assert re.fullmatch(r"[0-9a-f]{32}", held.lock_id)
    assert held.purposes() == ["create_lock"]
    assert len(lock_tables(session)) == 1

    busy = impatient.acquire_lock("lock:x")
    assert busy.code == "ABORTED", busy.raw
    assert "lock:x" in busy.message
    assert busy.purposes() == ["create_lock", "inspect_lock"]

    blocked = impatient.update("lock:x", partial={"p": 1})
    assert blocked.code == "ABORTED"
    assert host.get("lock:x").state is None

    wrong = host.release_lock("lock:x", "0" * 32)
    assert wrong.code == "FAILED_PRECONDITION", wrong.raw
    assert impatient.acquire_lock("lock:x").code == "ABORTED"  # still held

    assert host.release_lock("lock:x", held.lock_id).ok
    assert lock_tables(session) == []

    again = impatient.acquire_lock("lock:x")
    assert again.ok, again.message
    assert again.lock_id != held.lock_id
    assert impatient.release_lock("lock:x", again.lock_id).ok
    gone = impatient.release_lock("lock:x", again.lock_id)
    assert gone.code == "FAILED_PRECONDITION"


def test_lock_waits_until_released(host, make_host):
    held = host.acquire_lock("lock:wait")
    assert held.ok
    released = []

    def on_wait(ms):
        # The contender's first wait is the event: it found the lock held.
        if not released:
            released.append(host.release_lock("lock:wait", held.lock_id))
        time.sleep(ms / 1000.0)  # the wait the core asked for (this host's sleep hook)

    patient = make_host(SCHEMA, TABLE, "--lock-timeout-ms", "5000", "--lock-retry-ms", "100", on_wait=on_wait)
    out = patient.acquire_lock("lock:wait")
    assert out.ok, out.message
    assert released and released[0].ok
    assert out.waits and all(0 <= w <= 100 for w in out.waits)
    assert patient.release_lock("lock:wait", out.lock_id).ok


def test_stale_lock_is_taken_over(make_host, session):
    # A holder with a 1 s window that never releases (as if it crashed).
    dead = make_host(SCHEMA, TABLE, "--stale-lock-ms", "1000")
    held = dead.acquire_lock("lock:stale")
    assert held.ok
    taker = make_host(SCHEMA, TABLE, "--stale-lock-ms", "1000", "--lock-timeout-ms", "10000", "--lock-retry-ms", "200")
    out = taker.acquire_lock("lock:stale")
    assert out.ok, out.message
    p = out.purposes()
    assert p[-2:] == ["entomb_lock", "create_lock"], p
    assert out.waits  # it waited until the lock was over 1 s old by the server clock
    # The old holder learns it lost the lock and drops nothing.
    lost = dead.release_lock("lock:stale", held.lock_id)
    assert lost.code == "ABORTED", lost.raw
    assert taker.release_lock("lock:stale", out.lock_id).ok
    assert lock_tables(session) == []
    assert len(tombstones(session)) >= 1  # the tombstone of the dead holder's lock stays


def test_renewal_keeps_a_long_hold_from_going_stale(make_host, session):
    holder = make_host(SCHEMA, TABLE, "--stale-lock-ms", "2000")
    held = holder.acquire_lock("lock:renew")
    assert held.ok
    taker = make_host(SCHEMA, TABLE, "--stale-lock-ms", "2000", "--lock-timeout-ms", "0")
    # Time must pass (by design): 4 x 0.7 s is longer than the window; only the
    # renewals (every third of it) keep the taker out.
    for _ in range(4):
        time.sleep(0.7)
        renewed = holder.renew_lock("lock:renew")
        assert renewed.ok, renewed.raw
        assert renewed.purposes() == ["renew_lock", "inspect_lock"], renewed.purposes()
        assert taker.acquire_lock("lock:renew").code == "ABORTED"
    assert holder.release_lock("lock:renew", held.lock_id).ok


def test_init_removes_old_tombstones(make_host, session):
    dead = make_host(SCHEMA, TABLE, "--stale-lock-ms", "1000")
    assert dead.acquire_lock("lock:tomb").ok
    taker = make_host(SCHEMA, TABLE, "--stale-lock-ms", "1000", "--lock-timeout-ms", "10000", "--lock-retry-ms", "200")
    out = taker.acquire_lock("lock:tomb")
    assert out.ok and "entomb_lock" in out.purposes(), out.raw
    assert taker.release_lock("lock:tomb", out.lock_id).ok
    assert tombstones(session)
    # Time must pass (by design): init drops tombstones older than twice the
    # 1 s window; waited for with init's own test, on the engine's clock,
    # until every tombstone (earlier tests' too) passes it.
    wait_on_engine_clock(
        session,
        f"SELECT count() > 0 AND countIf(metadata_modification_time >= now() - 2) = 0 FROM system.tables "
        f"WHERE database = '{SCHEMA}' AND position(name, '_dead_') > 0",
        "every tombstone to be older than 2 s",
    )
    cleaned = make_host(SCHEMA, TABLE, "--stale-lock-ms", "1000").run({"op": "init"})
    assert cleaned.ok, cleaned.raw
    assert "drop_table" in cleaned.purposes()
    assert tombstones(session) == []


def test_taker_respects_the_holders_longer_window(host, make_host, session):
    held = host.acquire_lock("lock:long")  # default 300 s window, written into the lock
    assert held.ok
    # Time must pass (by design): the lock is stale for the impatient 1 s
    # window, not for the holder's own 300 s.
    wait_lock_older_than(session, "lock:long", 1)
    impatient = make_host(SCHEMA, TABLE, "--stale-lock-ms", "1000", "--lock-timeout-ms", "500", "--lock-retry-ms", "100")
    out = impatient.acquire_lock("lock:long")
    assert out.code == "ABORTED", out.raw
    assert "entomb_lock" not in out.purposes()
    assert host.release_lock("lock:long", held.lock_id).ok


def test_late_taker_cannot_entomb_a_newer_lock(make_host, executor, session):
    dead = make_host(SCHEMA, TABLE, "--stale-lock-ms", "1000")
    assert dead.acquire_lock("lock:race").ok
    wait_lock_older_than(session, "lock:race", 1)  # time must pass (by design): stale for a 1 s window
    first = make_host(SCHEMA, TABLE, "--stale-lock-ms", "1000", "--lock-timeout-ms", "5000")
    late = make_host(SCHEMA, TABLE, "--stale-lock-ms", "1000", "--lock-timeout-ms", "300", "--lock-retry-ms", "100")
    raced = {}

    def before(request):
        # The late taker judged the dead lock stale; before its RENAME lands,
        # the first taker entombs that lock and creates a fresh one.
        if request.get("purpose") == "entomb_lock" and not raced:
            raced["busy"] = True
            executor.before = None
            raced["first"] = first.acquire_lock("lock:race")
            executor.before = before

    executor.before = before
    try:
        out = late.acquire_lock("lock:race")
    finally:
        executor.before = None
    assert raced["first"].ok, raced["first"].raw
    p = out.purposes()
    assert p[:3] == ["create_lock", "inspect_lock", "entomb_lock"], p
    assert "inspect_lock" in p[3:], p  # its RENAME failed: the tombstone exists
    assert out.code == "ABORTED", out.raw  # the fresh lock is respected
    assert first.release_lock("lock:race", raced["first"].lock_id).ok


def test_lock_vanishing_before_inspection_is_retried(host, make_host, executor, session):
    """CREATE fails (57), then the holder releases before the contender inspects."""
    held = host.acquire_lock("lock:vanish")
    assert held.ok
    released = {}

    def before(request):
        if request.get("purpose") == "inspect_lock" and not released:
            released["busy"] = True  # the release below inspects too: no recursion
            released["out"] = host.release_lock("lock:vanish", held.lock_id)

    contender = make_host(SCHEMA, TABLE, "--lock-timeout-ms", "0")
    executor.before = before
    try:
        out = contender.acquire_lock("lock:vanish")
    finally:
        executor.before = None
    assert released["out"].ok
    assert out.ok, out.raw
    assert out.purposes() == ["create_lock", "inspect_lock", "create_lock"]
    assert contender.release_lock("lock:vanish", out.lock_id).ok
    assert lock_tables(session) == []


# ---------------------------------------------------------------------------
# interop with the Python ClickHouse backend (its SQL, emulated)


class PythonClickHouseBackend:
    """The SQL of the Python Meltano ClickHouse state backend, run in chDB."""

    def __init__(self, session, schema: str, table: str):
        self.s, self.schema, self.table = session, schema, table

    def create(self):
        self.s.query(f"CREATE DATABASE IF NOT EXISTS `{self.schema}`")
        self.s.query(
            f"CREATE TABLE IF NOT EXISTS `{self.schema}`.`{self.table}` (state_id String, "
            "partial_state Nullable(String), completed_state Nullable(String), "
            "updated_at DateTime64(3) DEFAULT now64(3)) ENGINE = ReplacingMergeTree(updated_at) ORDER BY state_id"
        )
        self.s.query(
            f"CREATE TABLE IF NOT EXISTS `{self.schema}`.`{self.table}_lock` (state_id String, lock_id String, "
            "locked_at DateTime DEFAULT now()) ENGINE = ReplacingMergeTree(locked_at) ORDER BY state_id "
            "TTL locked_at + INTERVAL 300 SECOND"
        )

    @staticmethod
    def _literal(value):
        return "NULL" if value is None else "'" + escape_param(value) + "'"

    def set(self, state_id: str, completed: dict, partial: dict):
        partial_state = json.dumps(partial) if partial else None
        completed_state = json.dumps(completed) if completed else None
        self.s.query(
            f"INSERT INTO `{self.schema}`.`{self.table}` (state_id, partial_state, completed_state) VALUES "
            f"({self._literal(state_id)}, {self._literal(partial_state)}, {self._literal(completed_state)})"
        )

    def get(self, state_id: str):
        out = self.s.query(
            f"SELECT partial_state, completed_state FROM `{self.schema}`.`{self.table}` FINAL "
            "WHERE state_id = {state_id:String} LIMIT 1",
            "JSONCompactEachRow",
            params={"state_id": escape_param(state_id)},
        ).bytes()
        lines = out.decode("utf-8").splitlines()
        if not lines:
            return None
        partial_state, completed_state = json.loads(lines[0])
        return {
            "completed": json.loads(completed_state) if completed_state else {},
            "partial": json.loads(partial_state) if partial_state else {},
        }

    def get_state_ids(self, pattern=None):
        sql = f"SELECT DISTINCT state_id FROM `{self.schema}`.`{self.table}` FINAL"
        params = None
        if pattern:
            sql += " WHERE state_id LIKE {pattern:String}"
            params = {"pattern": escape_param(pattern.replace("*", "%"))}
        out = self.s.query(sql, "JSONCompactEachRow", params=params).bytes()
        return sorted(json.loads(line)[0] for line in out.decode("utf-8").splitlines())


def test_interop_with_python_backend(make_host, session):
    py = PythonClickHouseBackend(session, "chs_py", "meltano_state")
    py.create()

    def ddl():
        return rows(
            session,
            "SELECT name, hex(create_table_query) FROM system.tables WHERE database = 'chs_py' ORDER BY name",
        )

    before = ddl()
    py.set("dev:tap-a-to-target-b", completed={"singer_state": {"bookmarks": {"s": {"v": "é ✓"}}}}, partial={})
    py.set("dev:tap-c-to-target-d", completed={}, partial={"singer_state": {"p": 1}})
    py.set("prod:tap-e-to-target-f", completed={"a": 1}, partial={"b": [1, 2]})

    h = make_host("chs_py", "meltano_state")
    init = h.init()
    assert init.ok, init.message
    # The Python backend's tables are left as they were; init adds the history beside them.
    assert [r for r in ddl() if r[0] in ("meltano_state", "meltano_state_lock")] == before
    assert [r[0] for r in before] == ["meltano_state", "meltano_state_lock"]
    assert [r[0] for r in ddl()] == ["meltano_state", "meltano_state_history", "meltano_state_history_mv",
                                     "meltano_state_lock"]

    # chstate reads what Python wrote.
    a = h.get("dev:tap-a-to-target-b").state
    assert (a.completed, a.partial) == ({"singer_state": {"bookmarks": {"s": {"v": "é ✓"}}}}, {})
    c = h.get("dev:tap-c-to-target-d").state
    assert (c.completed, c.partial) == ({}, {"singer_state": {"p": 1}})
    e = h.get("prod:tap-e-to-target-f").state
    assert (e.completed, e.partial) == ({"a": 1}, {"b": [1, 2]})
    assert h.list("dev:*").state_ids == [b"dev:tap-a-to-target-b", b"dev:tap-c-to-target-d"]
    assert len(h.list(None).state_ids) == 3

    # Python reads what chstate wrote.
    assert h.set("chs:1", completed={"singer_state": {"k": "ü"}}).ok
    assert py.get("chs:1") == {"completed": {"singer_state": {"k": "ü"}}, "partial": {}}
    up = h.update("dev:tap-c-to-target-d", partial={"singer_state": {"q": 2}})
    assert up.ok, up.message
    assert py.get("dev:tap-c-to-target-d") == {"completed": {}, "partial": {"singer_state": {"p": 1, "q": 2}}}
    assert rows(
        session,
        "SELECT isNull(completed_state) FROM chs_py.meltano_state FINAL WHERE state_id = 'dev:tap-c-to-target-d'",
    ) == [["1"]]
    assert py.get_state_ids("chs:*") == ["chs:1"]
    assert py.get_state_ids() == sorted(
        ["chs:1", "dev:tap-a-to-target-b", "dev:tap-c-to-target-d", "prod:tap-e-to-target-f"]
    )

    # A Python write after chstate's is the one both see.
    py.set("chs:1", completed={"v": "python"}, partial={})
    assert h.get("chs:1").state.completed == {"v": "python"}

    # chstate's delete hides the row from Python too.
    assert h.delete("prod:tap-e-to-target-f").ok
    assert py.get("prod:tap-e-to-target-f") is None
    assert [r for r in ddl() if "_lock_" in r[0]] == []  # no lock tables left behind
    # Python's writes are versions in the history too (the view sees every insert).
    assert json.loads([r[0] for r in rows(session, "SELECT completed_state FROM chs_py.meltano_state_history "
                                                   "WHERE state_id = 'chs:1' ORDER BY updated_at")][-1]) == {"v": "python"}



# ---------------------------------------------------------------------------
# the pipe protocol itself


def test_executor_applies_settings_per_query_and_passes_errors(executor, session):
    def run(sql, *url_params):
        resp = executor({"sql": sql, "url_params": [list(p) for p in url_params], "purpose": "t", "idempotent": True})
        return resp["http_status"], bytes.fromhex(resp["body_hex"])

    read = "SELECT getSetting('async_insert'), getSetting('mutations_sync'), getSetting('insert_deduplication_token') FORMAT TabSeparated"
    default = run(read)
    assert default[0] == 200
    applied = run(
        read,
        ("async_insert", "0"),
        ("mutations_sync", "2"),
        ("insert_deduplication_token", "tok'\\x"),
        ("wait_end_of_query", "1"),
    )
    assert applied == (200, b"false\t2\ttok\\'\\\\x\n")
    assert run(read) == default  # restored after the query
    # Query parameters in escaped form, byte-exact.
    assert run("SELECT hex({v:String}) FORMAT TabSeparated", ("param_v", "a\\x00\\xff\\'\\\\")) == (200, b"6100FF275C\n")
    # Errors: HTTP 500, the exception text with its code, like the server.
    status, body = run("SELECT * FROM system.no_such_table FORMAT TabSeparated")
    assert status == 500 and body.startswith(b"Code: 60. DB::Exception:"), body
    status, body = run("SELECT 1 FORMAT TabSeparated", ("no_such_setting", "1"))
    assert status == 500 and body.startswith(b"Code: 115.")
    assert run(read) == default
    executor.log[:] = [e for e in executor.log if e.purpose != "t"]


def test_pipe_protocol_rejects_bad_lines_and_continues(host):
    host.send("this is not json")
    assert host.receive()["failed"]["code"] == "INVALID_ARGUMENT"
    host.send({"op": "get", "state_id_hex": "zz"})
    assert host.receive()["failed"]["code"] == "INVALID_ARGUMENT"
    host.send({"op": "get", "state_id_hex": ""})
    assert host.receive()["failed"]["code"] == "INVALID_ARGUMENT"  # the core: empty id
    host.send({"op": "set", "state_id_hex": "61", "state": {"bogus": {}}})
    assert host.receive()["failed"]["code"] == "INVALID_ARGUMENT"
    host.send({"op": "frobnicate"})
    assert host.receive()["failed"]["code"] == "INVALID_ARGUMENT"
    # A bad answer mid-operation ends that operation only.
    host.send({"op": "get", "state_id_hex": "61"})
    assert "request" in host.receive()
    host.send({"response": {"http_status": 200, "body_hex": "x"}})
    assert host.receive()["failed"]["code"] == "INVALID_ARGUMENT"
    assert host.ping().ok


# ---------------------------------------------------------------------------
# coverage: keep last


def test_zz_every_modern_statement_ran(request, executor):
    module_tests = {n for n in vars(request.module) if n.startswith("test_") and n != request.node.name}
    if not module_tests <= _RAN:
        pytest.skip("runs only after the whole module")
    seen = {e.purpose for e in executor.log}
    assert MODERN_PURPOSES <= seen, f"never executed: {sorted(MODERN_PURPOSES - seen)}"
    unexpected = [
        (e.purpose, e.code, e.error[:300], e.sql[:300])
        for e in executor.log
        if not e.ok and e.code not in EXPECTED_ERROR_CODES
    ]
    assert not unexpected, unexpected
    assert not executor.problems, executor.problems
