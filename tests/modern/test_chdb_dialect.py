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
    settings_document,
)

chdb_session = pytest.importorskip("chdb.session")

SCHEMA = "chs_main"
TABLE = "state"

# Every purpose the core uses with the modern dialect (PendingMutations is
# 18.x-only). test_zz_every_modern_statement_ran checks all of them ran.
MODERN_PURPOSES = {
    "select_version",
    "foreign_lock_rows",
    "list_tombstones",
    "drop_table",
    "create_database",
    "create_state_table",
    "create_lock_table",
    "create_history_table",
    "create_history_buffer",
    "create_history_view",
    "drop_unbuffered_history_view",
    "flush_history",
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

    def make(schema: str = SCHEMA, table: str = TABLE, *, on_wait=None, **values) -> PipeHost:
        """A host whose store opens on one settings document: `schema`,
        `table` and `values` by the core's setting names (lock_wait_seconds,
        lock_retry_seconds, lock_timeout_seconds: the lock's validity)."""
        h = PipeHost(
            executor,
            settings=settings_document(schema=schema, table=table, **values),
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
                              "create_history_buffer", "create_history_view", "drop_unbuffered_history_view",
                              "expire_history", "trim_history", "list_tombstones"]
    assert all(e.ok for e in executor.log[since:])

    assert scalar(session, "SELECT count() FROM system.databases WHERE name = {db:String}", db=SCHEMA) == "1"
    assert tables(session, SCHEMA) == {TABLE: "ReplacingMergeTree", f"{TABLE}_lock": "ReplacingMergeTree",
                                       f"{TABLE}_history": "MergeTree", f"{TABLE}_history_buffer": "Buffer",
                                       f"{TABLE}_history_buffer_mv": "MaterializedView"}

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

    out = h.set("first", {"singer_state": {"a": 1}})
    assert out.ok, out.message
    # Under the id's lock: no Python backend's rows (81: no database), the
    # lock's CREATE failed with 81, the core created the database and took
    # the lock; the insert failed with 60, the core created the schema and
    # wrote again; then the lock was released.
    assert out.purposes() == [
        "foreign_lock_rows",
        "create_lock",
        "create_database",
        "create_lock",
        "insert_state",
        "create_database",
        "create_state_table",
        "create_lock_table",
        "create_history_table",
        "create_history_buffer",
        "create_history_view",
        "drop_unbuffered_history_view",
        "insert_state",
        "inspect_lock",
        "drop_lock",
    ]
    assert h.get("first").state.completed == {"singer_state": {"a": 1}}

    # A lock on a missing database: CREATE TABLE fails with 81, init, retry.
    h2 = make_host("chs_fresh_lock")
    lock = h2.acquire("x")
    assert lock.ok, lock.message
    # The Python backend's rows first (a missing table has none), then the lock.
    assert lock.purposes()[0] == "foreign_lock_rows" and lock.purposes()[-1] == "create_lock", lock.purposes()
    assert "create_database" in lock.purposes()
    assert h2.release("x", lock.lock_id).ok


# ---------------------------------------------------------------------------
# state operations


def test_set_get_round_trip(host):
    completed = {"singer_state": {"bookmarks": {"users": {"replication_key_value": "2024-01-01T00:00:00Z"}}}}
    partial = {"singer_state": {"partial": [1, 2.5, None, True, "ünïcødé ✓"]}}
    assert host.set("dev:tap-a-to-target-b", completed, partial=partial).ok
    out = host.get("dev:tap-a-to-target-b")
    assert out.ok
    assert out.state.state_id == b"dev:tap-a-to-target-b"
    assert out.state.completed == completed
    assert out.state.partial == partial
    assert host.get("dev:absent").state is None

    # Overwrite: the newest write wins; empty sides come back as {}.
    assert host.set("dev:tap-a-to-target-b", {"singer_state": {"v": 2}}).ok
    out = host.get("dev:tap-a-to-target-b")
    assert (out.state.completed, out.state.partial) == ({"singer_state": {"v": 2}}, {})


def test_empty_sides_are_stored_as_null(host, session):
    assert host.set("nulls:1", {"singer_state": {}}).ok
    assert rows(
        session,
        f"SELECT isNull(partial_state), completed_state FROM `{SCHEMA}`.`{TABLE}` FINAL WHERE state_id = 'nulls:1'",
    ) == [["1", '{"singer_state":{}}']]


def test_merge_merges_partial_and_keeps_completed(host, session):
    assert host.set(
        "upd:1",
        {"singer_state": {"c": 1}},
        partial={"singer_state": {"bookmarks": {"a": 1}}, "other": [1]},
    ).ok
    out = host.merge("upd:1", {"singer_state": {"bookmarks": {"b": 2}}, "other": [2]})
    assert out.ok, out.message
    want_partial = {"singer_state": {"bookmarks": {"a": 1, "b": 2}}, "other": [2]}
    assert out.state.partial == want_partial
    assert out.state.completed == {"singer_state": {"c": 1}}
    got = host.get("upd:1").state
    assert (got.completed, got.partial) == ({"singer_state": {"c": 1}}, want_partial)
    # Under the id's lock, the Python backend's rows looked at first.
    assert out.purposes() == ["foreign_lock_rows", "create_lock", "get_state", "insert_state", "inspect_lock",
                              "drop_lock"]
    assert lock_tables(session) == []

    # An empty partial merge is refused before anything is sent.
    empty = host.merge("upd:1", {})
    assert empty.code == "INVALID_ARGUMENT", empty.raw
    assert empty.requests == []
    got = host.get("upd:1").state
    assert (got.completed, got.partial) == ({"singer_state": {"c": 1}}, want_partial)

    # A complete state replaces everything: that is set.
    out = host.set("upd:1", {"singer_state": {"c": 9}})
    assert out.ok
    got = host.get("upd:1").state
    assert (got.completed, got.partial) == ({"singer_state": {"c": 9}}, {})

    # Input without singer_state needs force (nothing sent without it).
    unforced = host.merge("upd:absent", {"p": 1})
    assert unforced.code == "INVALID_ARGUMENT" and "singer_state" in unforced.message, unforced.raw
    assert unforced.requests == []
    assert host.get("upd:absent").state is None
    # A merge into an absent id writes the incoming state.
    out = host.merge("upd:absent", {"p": 1}, force=True)
    assert out.ok, out.message
    got = host.get("upd:absent").state
    assert (got.completed, got.partial) == ({}, {"p": 1})

    # set replaces both sides under the lock; a state without singer_state needs force.
    unforced = host.set("upd:1", {"x": 1}, partial={"y": 2})
    assert unforced.code == "INVALID_ARGUMENT" and "singer_state" in unforced.message, unforced.raw
    assert unforced.requests == []
    assert host.get("upd:1").state.completed == {"singer_state": {"c": 9}}
    out = host.set("upd:1", {"x": 1}, partial={"y": 2}, force=True)
    assert out.ok, out.message
    assert out.purposes() == ["foreign_lock_rows", "create_lock", "insert_state", "inspect_lock", "drop_lock"]
    got = host.get("upd:1").state
    assert (got.completed, got.partial) == ({"x": 1}, {"y": 2})
    assert lock_tables(session) == []


def test_list_with_glob_patterns(host):
    ids = [b"glob:a_b1", b"glob:axb1", b"glob:a%c", b"glob:abc", b"glob:a\\b", b"glob:a_b2", b"glob:A_b1"]
    for i, sid in enumerate(ids):
        assert host.set(sid, {"i": i}, force=True).ok

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
    assert host.set("del:1", {"a": 1}, force=True).ok
    assert host.set("del:2", {"a": 2}, force=True).ok
    assert host.set("del:3", {"a": 3}, force=True).ok
    since = len(executor.log)
    out = host.delete("del:1")
    assert out.ok, out.message
    # delete takes the id's lock (the Python backend's rows looked at first).
    assert out.purposes() == ["foreign_lock_rows", "create_lock", "delete_state", "inspect_lock", "drop_lock"]
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
    assert lock_tables(session) == []

    # Deleting an absent id succeeds.
    assert host.delete("del:absent").ok

    # Inside a lock scope the delete runs under the scope's lock: only its delete_state.
    scope = host.acquire("del:2")
    assert scope.ok, scope.message
    out = host.delete("del:2")
    assert out.ok, out.message
    assert out.purposes() == ["delete_state"], out.purposes()
    assert len(lock_tables(session)) == 1  # the scope's, still held
    assert host.release("del:2", scope.lock_id).ok
    assert host.get("del:2").state is None
    assert host.get("del:3").state.completed == {"a": 3}
    assert lock_tables(session) == []


def test_clear_all_returns_count_and_empties_table(make_host, session):
    h = make_host("chs_clear")
    assert h.init().ok
    for sid in ["c:1", "c:2", "c:3"]:
        assert h.set(sid, {"id": sid}, force=True).ok
    assert h.set("c:2", {"id": "again"}, force=True).ok  # two rows, one state
    out = h.clear_all()
    assert out.ok, out.message
    assert out.count == 3
    assert out.purposes() == ["count_states", "truncate_states"]
    assert h.list(None).state_ids == []
    assert scalar(session, "SELECT count() FROM `chs_clear`.`state`") == "0"
    again = h.clear_all()
    assert again.ok and again.count == 0


def test_copy(host):
    assert host.set("copy:src", {"c": 1}, partial={"p": 1}, force=True).ok
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
    assert host.set("move:src", {"c": 2}, force=True).ok
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
            out = host.set("aba:1", a if state is a else b)
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
        out = host.set(sid, completed, partial=partial)
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
        out = host.merge(sid, {"more": True}, force=True)
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
    impatient = make_host(lock_wait_seconds=0)
    held = host.acquire("lock:x")
    assert held.ok, held.message
    assert re.fullmatch(r"[0-9a-f]{32}", held.lock_id)
    assert held.purposes() == ["foreign_lock_rows", "create_lock"]
    assert len(lock_tables(session)) == 1

    busy = impatient.acquire("lock:x")
    assert busy.code == "ABORTED", busy.raw
    assert "lock:x" in busy.message
    assert busy.purposes() == ["foreign_lock_rows", "create_lock", "inspect_lock"]

    # Every write takes the id's lock: merge, set and delete are kept out alike.
    blocked = impatient.merge("lock:x", {"singer_state": {"p": 1}})
    assert blocked.code == "ABORTED", blocked.raw
    assert "insert_state" not in blocked.purposes()
    blocked = impatient.set("lock:x", {"singer_state": {"s": 1}})
    assert blocked.code == "ABORTED", blocked.raw
    assert "insert_state" not in blocked.purposes()
    blocked = impatient.delete("lock:x")
    assert blocked.code == "ABORTED", blocked.raw
    assert "delete_state" not in blocked.purposes()
    assert host.get("lock:x").state is None

    wrong = host.release("lock:x", "0" * 32)
    assert wrong.code == "FAILED_PRECONDITION", wrong.raw
    assert impatient.acquire("lock:x").code == "ABORTED"  # still held

    assert host.release("lock:x", held.lock_id).ok
    assert lock_tables(session) == []

    again = impatient.acquire("lock:x")
    assert again.ok, again.message
    assert again.lock_id != held.lock_id
    assert impatient.release("lock:x", again.lock_id).ok
    gone = impatient.release("lock:x", again.lock_id)
    assert gone.code == "FAILED_PRECONDITION"


def test_lock_waits_until_released(host, make_host):
    held = host.acquire("lock:wait")
    assert held.ok
    released = []

    def on_wait(ms):
        # The contender's first wait is the event: it found the lock held.
        if not released:
            released.append(host.release("lock:wait", held.lock_id))
        time.sleep(ms / 1000.0)  # the wait the core asked for (this host's sleep hook)

    patient = make_host(lock_wait_seconds=5, lock_retry_seconds=0.1, on_wait=on_wait)
    out = patient.acquire("lock:wait")
    assert out.ok, out.message
    assert released and released[0].ok
    assert out.waits and all(0 <= w <= 100 for w in out.waits)
    assert patient.release("lock:wait", out.lock_id).ok


def test_stale_lock_is_taken_over(make_host, session):
    # A holder with a 1 s window that never releases (as if it crashed).
    dead = make_host(lock_timeout_seconds=1)
    held = dead.acquire("lock:stale")
    assert held.ok
    taker = make_host(lock_timeout_seconds=1, lock_wait_seconds=10, lock_retry_seconds=0.2)
    out = taker.acquire("lock:stale")
    assert out.ok, out.message
    p = out.purposes()
    assert p[-2:] == ["entomb_lock", "create_lock"], p
    assert out.waits  # it waited until the lock was over 1 s old by the server clock
    # The old holder learns it lost the lock and drops nothing.
    lost = dead.release("lock:stale", held.lock_id)
    assert lost.code == "ABORTED", lost.raw
    assert taker.release("lock:stale", out.lock_id).ok
    assert lock_tables(session) == []
    assert len(tombstones(session)) >= 1  # the tombstone of the dead holder's lock stays


def test_renewal_keeps_a_long_hold_from_going_stale(make_host, session):
    holder = make_host(lock_timeout_seconds=2)
    held = holder.acquire("lock:renew")
    assert held.ok
    taker = make_host(lock_timeout_seconds=2, lock_wait_seconds=0)
    # Time must pass (by design): 4 x 0.7 s is longer than the window; only the
    # renewals (every third of it) keep the taker out.
    for _ in range(4):
        time.sleep(0.7)
        renewed = holder.renew("lock:renew")
        assert renewed.ok, renewed.raw
        assert renewed.purposes() == ["renew_lock", "inspect_lock"], renewed.purposes()
        assert taker.acquire("lock:renew").code == "ABORTED"
    assert holder.release("lock:renew", held.lock_id).ok


def test_init_removes_old_tombstones(make_host, session):
    dead = make_host(lock_timeout_seconds=1)
    assert dead.acquire("lock:tomb").ok
    taker = make_host(lock_timeout_seconds=1, lock_wait_seconds=10, lock_retry_seconds=0.2)
    out = taker.acquire("lock:tomb")
    assert out.ok and "entomb_lock" in out.purposes(), out.raw
    assert taker.release("lock:tomb", out.lock_id).ok
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
    cleaned = make_host(lock_timeout_seconds=1).init()
    assert cleaned.ok, cleaned.raw
    assert "drop_table" in cleaned.purposes()
    assert tombstones(session) == []


def test_taker_respects_the_holders_longer_window(host, make_host, session):
    held = host.acquire("lock:long")  # the default 10 s validity, written into the lock
    assert held.ok
    # Time must pass (by design): the lock is stale for the impatient 1 s
    # window, not for the holder's own 10 s.
    wait_lock_older_than(session, "lock:long", 1)
    impatient = make_host(lock_timeout_seconds=1, lock_wait_seconds=0.5, lock_retry_seconds=0.1)
    out = impatient.acquire("lock:long")
    assert out.code == "ABORTED", out.raw
    assert "entomb_lock" not in out.purposes()
    assert host.release("lock:long", held.lock_id).ok


def test_late_taker_cannot_entomb_a_newer_lock(make_host, executor, session):
    dead = make_host(lock_timeout_seconds=1)
    assert dead.acquire("lock:race").ok
    wait_lock_older_than(session, "lock:race", 1)  # time must pass (by design): stale for a 1 s window
    first = make_host(lock_timeout_seconds=1, lock_wait_seconds=5)
    late = make_host(lock_timeout_seconds=1, lock_wait_seconds=0.3, lock_retry_seconds=0.1)
    raced = {}

    def before(request):
        # The late taker judged the dead lock stale; before its RENAME lands,
        # the first taker entombs that lock and creates a fresh one.
        if request.get("purpose") == "entomb_lock" and not raced:
            raced["busy"] = True
            executor.before = None
            raced["first"] = first.acquire("lock:race")
            executor.before = before

    executor.before = before
    try:
        out = late.acquire("lock:race")
    finally:
        executor.before = None
    assert raced["first"].ok, raced["first"].raw
    p = out.purposes()
    assert p[:4] == ["foreign_lock_rows", "create_lock", "inspect_lock", "entomb_lock"], p
    assert "inspect_lock" in p[4:], p  # its RENAME failed: the tombstone exists
    assert out.code == "ABORTED", out.raw  # the fresh lock is respected
    assert first.release("lock:race", raced["first"].lock_id).ok


def test_lock_vanishing_before_inspection_is_retried(host, make_host, executor, session):
    """CREATE fails (57), then the holder releases before the contender inspects."""
    held = host.acquire("lock:vanish")
    assert held.ok
    released = {}

    def before(request):
        if request.get("purpose") == "inspect_lock" and not released:
            released["busy"] = True  # the release below inspects too: no recursion
            released["out"] = host.release("lock:vanish", held.lock_id)

    contender = make_host(lock_wait_seconds=0)
    executor.before = before
    try:
        out = contender.acquire("lock:vanish")
    finally:
        executor.before = None
    assert released["out"].ok
    assert out.ok, out.raw
    assert out.purposes() == ["foreign_lock_rows", "create_lock", "inspect_lock", "create_lock"]
    assert contender.release("lock:vanish", out.lock_id).ok
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

    def lock(self, state_id: str, lock_id: str):
        """The backend's lock row (its acquire_lock's INSERT, columns named)."""
        self.s.query(
            f"INSERT INTO `{self.schema}`.`{self.table}_lock` (state_id, lock_id) VALUES "
            f"({self._literal(state_id)}, {self._literal(lock_id)})"
        )

    def unlock(self, state_id: str, lock_id: str):
        self.s.query(
            f"DELETE FROM `{self.schema}`.`{self.table}_lock` WHERE state_id = {{state_id:String}} "
            "AND lock_id = {lock_id:String}",
            params={"state_id": escape_param(state_id), "lock_id": escape_param(lock_id)},
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
    assert [r[0] for r in ddl()] == ["meltano_state", "meltano_state_history", "meltano_state_history_buffer",
                                     "meltano_state_history_buffer_mv", "meltano_state_lock"]

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
    assert h.set("chs:1", {"singer_state": {"k": "ü"}}).ok
    assert py.get("chs:1") == {"completed": {"singer_state": {"k": "ü"}}, "partial": {}}
    up = h.merge("dev:tap-c-to-target-d", {"singer_state": {"q": 2}})
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
    # chstate's history lists Python's write at once: the read writes the buffer into the table first.
    hist = h.run({"op": "history", "state_id_hex": b"chs:1".hex(), "limit": 5})
    assert hist.ok, hist.message
    assert hist.purposes()[:2] == ["flush_history", "list_history"], hist.purposes()
    newest = hist.done["versions"][0]
    assert newest["current"] and newest["state"]["completed"] == {"v": "python"}, hist.done["versions"]
    # Python's writes are versions in the history too (the view sees every insert); read through
    # the buffer, which holds the versions of the last seconds and reads the table under it too.
    assert json.loads([r[0] for r in rows(session, "SELECT completed_state FROM chs_py.meltano_state_history_buffer "
                                                   "WHERE state_id = 'chs:1' ORDER BY updated_at")][-1]) == {"v": "python"}

    # A live lock row of the Python backend keeps chstate's writes out (every
    # acquisition looks at its rows first, whatever python_locks says).
    python_lock = "6f1c2b9e-python-holder"
    py.lock("chs:1", python_lock)
    impatient = make_host("chs_py", "meltano_state", lock_wait_seconds=0)
    for blocked in (impatient.set("chs:1", {"singer_state": {"k": "chstate"}}), impatient.delete("chs:1"),
                    impatient.acquire("chs:1")):
        assert blocked.code == "ABORTED", blocked.raw
        assert python_lock in blocked.message, blocked.message
        assert blocked.purposes() == ["foreign_lock_rows"], blocked.purposes()
    assert py.get("chs:1") == {"completed": {"v": "python"}, "partial": {}}
    py.unlock("chs:1", python_lock)
    assert impatient.set("chs:1", {"singer_state": {"k": "chstate"}}).ok
    assert py.get("chs:1") == {"completed": {"singer_state": {"k": "chstate"}}, "partial": {}}
    assert [r for r in ddl() if "_lock_" in r[0]] == []



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
    host.send({"op": "set", "state_id_hex": "61", "state": [1]})  # a state is an object
    assert host.receive()["failed"]["code"] == "INVALID_ARGUMENT"
    host.send({"op": "set", "state_id_hex": "61", "state": {"singer_state": {}}, "completed": {}})
    failed = host.receive()["failed"]  # not an argument of set
    assert failed["code"] == "INVALID_ARGUMENT" and "completed" in failed["message"], failed
    host.send({"op": "frobnicate"})
    assert host.receive()["failed"]["code"] == "INVALID_ARGUMENT"
    for renamed in ("update", "set_locked", "acquire_lock"):  # the verbs are the ops
        host.send({"op": renamed, "state_id_hex": "61"})
        failed = host.receive()["failed"]
        assert failed["code"] == "INVALID_ARGUMENT" and "the verbs are" in failed["message"], failed
    # A bad answer mid-operation ends that operation only.
    host.send({"op": "get", "state_id_hex": "61"})
    assert "request" in host.receive()
    host.send({"response": {"http_status": 200, "body_hex": "x"}})
    assert host.receive()["failed"]["code"] == "INVALID_ARGUMENT"
    assert host.ping().ok


def test_pipe_host_takes_one_settings_document(pipe_host_binary, executor):
    """The host opens its store on one settings document: the command line
    of old (flags) and a renamed setting are refused, naming the fix."""
    def first_line(*args):
        proc = subprocess.run([str(pipe_host_binary), *args], input=b"", capture_output=True, timeout=30)
        return proc.returncode, json.loads(proc.stdout.decode().splitlines()[0])

    code, line = first_line("--schema", SCHEMA)
    assert code == 2 and line["failed"]["code"] == "INVALID_ARGUMENT", line
    assert "one argument: a settings document" in line["failed"]["message"]
    code, line = first_line(json.dumps(settings_document(stale_lock_ms=1000)))
    assert code == 2 and line["failed"]["code"] == "INVALID_ARGUMENT", line
    assert "lock_timeout_seconds" in line["failed"]["message"], line
    # The schema and table come from the document.
    with PipeHost(executor, settings=settings_document(schema="chs_doc", table="bookmarks"),
                  binary=pipe_host_binary) as h:
        out = h.get("x")
        assert out.ok and out.state is None, out.raw
        assert "`chs_doc`.`bookmarks`" in out.requests[-1]["sql"], out.requests[-1]["sql"]


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
