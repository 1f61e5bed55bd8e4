"""Oracles for tests/vectors/sql.json: its recorded SQL, EXECUTED on real engines.

The vectors record what the core emitted and what a scripted server answered,
so they prove agreement between hosts, not correctness. Here every non-cluster
case's request sequence runs in order, on a fresh schema, on the engine of its
dialect (clickhouse18: the ClickHouse 18.16 server the test tooling starts;
modern: chDB behind tools/chdb_http.py), and the results are checked as rows:

* replay: each real answer agrees with the scripted one: the same exception
  code where an error was scripted; otherwise success with the same decoded
  TabSeparated rows (the table is seeded first so that the scripted rows are
  the right answer: get_found, list_all, list_glob, clear_all's count), or the
  same shape where the values cannot match (select_version, pending_mutations:
  field counts and the constant column; inspect_lock: the holder, seq and
  validity, times as numbers close to the server's now). The Python backend's
  live lock row a case scripts (python_backend_row_is_honoured) is seeded as
  that backend writes it. Scripted answers no engine can give
  on demand here (an authentication failure, an exception after HTTP 200, a
  1.1 server) are checked only for the SQL being accepted.
* after the sequence, the server's rows: a written state reads back JSON-equal
  with its id byte for byte (quote injection included), set and delete (which
  take the id's lock) leave no lock table behind, a deleted id is gone
  under FINAL (18.x: once the mutation is done, polled with the vector's own
  pending_mutations query), clear_all leaves nothing, init's tables exist with
  the expected engines and columns.
* every id literal / query parameter the core wrote parses, on the engine, to
  exactly the op's id bytes; hostile ids seeded independently (unhex) are found
  by the recorded get and listed byte for byte by the recorded list.

Each case's store is a settings document: the schema, table and cluster come
from its values or its uri's query (defaults: meltano, state, none).

Out of scope: the cluster_* cases (and cluster_refuses_an_unreplicated_state_table)
need a replicated cluster with ZooKeeper (tests/cluster covers it): they are
skipped explicitly, never counted as passes.
"""

from __future__ import annotations

import json
import re
import time
import urllib.parse

import pytest

from oracle_lib import exchanges, first_op, dialect_of, load, nullable, rewrite, select_glob, tsv_rows, unhex

SQL = load("sql")
CASES = {c["name"]: c for c in SQL["cases"]}

# Scripted answers that stand for failures the engine cannot be made to give on
# demand: only the SQL being accepted is checked for these exchanges.
SYNTHETIC = {
    ("server_error_is_classified", "get_state"): "a login failure (516) scripted for an accepted query",
    ("exception_after_200", "get_state"): "an exception after HTTP 200 (241, memory) scripted",
    ("too_old_server_refused", "select_version"): "a 1.1.54390 server scripted",
}

STATE_COLUMNS = [(b"state_id", b"String"), (b"partial_state", b"Nullable(String)"),
                 (b"completed_state", b"Nullable(String)")]


def suffix(name: str) -> str:
    return re.sub(r"^(clickhouse18|modern)_", "", name)


def store_setting(case: dict, key: str, default: str = "") -> str:
    """A setting of the case's store (a settings document): its value, else
    the uri's query parameter of that name, else `default`."""
    values = case["store"]["values"]
    if values.get(key) not in (None, ""):
        return str(values[key])
    query = urllib.parse.parse_qs(urllib.parse.urlsplit(values["uri"]).query)
    return query[key][0] if query.get(key) else default


def store_schema(case: dict) -> str:
    return store_setting(case, "schema", "meltano")


def store_table(case: dict) -> str:
    return store_setting(case, "table", "state")


def is_cluster(case: dict) -> bool:
    return store_setting(case, "cluster") != ""


def lock_tables(engine, schema: str, table: str) -> list:
    """The per-id lock tables (and tombstones) left in the schema."""
    return [r[0] for r in engine.rows(
        f"SELECT name FROM system.tables WHERE database = '{schema}' AND startsWith(name, '{table}_lock_') "
        "ORDER BY name FORMAT TabSeparated")]


def engine_for(request, case: dict):
    return request.getfixturevalue("ch18" if dialect_of(case) == "clickhouse18" else "modern")


def init_case(dialect: str) -> dict:
    return CASES[f"{dialect}_init"]


def prepare(engine, case: dict, schema: str, *, tables: bool = True) -> None:
    """The schema as `init` leaves it, made with init's own recorded DDL."""
    table = store_table(case)
    dialect = dialect_of(case)
    for ex in exchanges(init_case(dialect)):
        # The history buffer too (a history read flushes it first), not its view: the
        # seeds below write the history rows they need themselves.
        wanted = ("create_state_table", "create_lock_table", "create_history_table",
                  "create_history_buffer") if tables else ()
        if ex.purpose == "create_database" or ex.purpose in wanted:
            sql = ex.request["sql"].replace("`meltano`.`state`", f"`meltano`.`{table}`") \
                .replace("`meltano`.`state_lock`", f"`meltano`.`{table}_lock`")
            answer = engine.post(rewrite(sql, "meltano", schema), ex.request["url_params"])
            assert answer.ok, f"{ex.purpose}: HTTP {answer.status}: {answer.body[:400]!r}"


def seed(engine, schema: str, table: str, rows) -> None:
    values = ", ".join(f"({unhex(i)}, {nullable(p)}, {nullable(c)})" for i, p, c in rows)
    engine.sql(f"INSERT INTO `{schema}`.`{table}` (state_id, partial_state, completed_state) VALUES {values}")


# The recorded pattern is dev:*_100%? : one id matches (Meltano's glob agrees:
# test_glob_seed_is_the_scripted_answer), the others differ from it in one
# place a LIKE without escapes would not notice.
GLOB_DECOYS = [b"dev:x_100%a", b"dev:xX100%a", b"dev:x_100Xa", b"dev:x_100%", b"dev:x_100%ab", b"dev:x_100\\a",
               b"dev:x_100\\%a", b"prod:x_100%a", b"dev:x_1000%a"]

# Rows that make the scripted answers the right ones (by case suffix).
SEEDS = {
    "get_found": [(b"dev:tap-users", b"{}", b'{"singer_state":{"bookmarks":{}}}'), (b"dev:tap-other", b"{}", b"{}")],
    "get_absent": [(b"dev:tap-user", b"{}", b"{}"), (b"dev:tap-users ", b"{}", b"{}")],
    "list_all": [(b"dev:a", None, b"{}"), (b"dev:b", None, b"{}")],
    "list_glob_escapes_like": [(i, None, b"{}") for i in GLOB_DECOYS],
    "clear_all": [(b"dev:a", None, b"{}"), (b"dev:b", None, b"{}")],
    "delete": [(b"dev:tap-users", None, b'{"x":1}'), (b"dev:tap-other", None, b'{"y":2}')],
    "export_page": [(b"dev:a", None, b"{}"), (b"dev:b", None, b'{"singer_state":{}}'), (b"dev:c", b'{"p":1}', None),
                    (b"dev:d", None, b"{}"), (b"prod:b", None, b"{}")],
    "history": [(b"dev:tap-users", None, b'{"singer_state":{}}')],
    "locks": [(b"dev:a", None, b"{}")],
}

# locks: the lock table the scripted answers name, held by another process
# (renewed 10 s ago, a 30 s validity), made as the core makes one.
LOCKS_SEED = ("state_lock_0123456789abcdef", b"f" * 32, 10, 30)

# history: the versions the scripted answer names, written at fixed times
# straight into the history table (partial, completed, unix seconds).
HISTORY_SEED = [(b"dev:tap-users", None, b'{"singer_state":{}}', 1796155032),
                (b"dev:tap-users", b'{"p":1}', None, 1796155031),
                (b"dev:tap-other", None, b"{}", 1796155033)]


def replay(engine, case: dict, schema: str) -> list:
    """Runs the case's requests in order; checks each real answer against the scripted one."""
    old = store_schema(case)
    answers = []
    for ex in exchanges(case):
        real = engine.execute(ex.request, old, schema)
        answers.append(real)
        where = f"{case['name']} #{ex.index} {ex.purpose}"
        synthetic = SYNTHETIC.get((suffix(case["name"]), ex.purpose))
        scripted_code = ex.scripted_code()
        if ex.scripted is None:
            assert real.ok, f"{where}: HTTP {real.status}: {real.body[:400]!r}"
            continue
        if synthetic:
            assert real.ok, f"{where} ({synthetic}): the SQL itself failed: HTTP {real.status}: {real.body[:400]!r}"
            scripted = tsv_rows(ex.scripted_body()) if ex.purpose == "select_version" else None
            if scripted:
                assert [len(r) for r in real.rows()] == [len(r) for r in scripted], where
            continue
        if scripted_code is not None:
            assert real.code == scripted_code, (
                f"{where}: scripted exception code {scripted_code}, the engine answered HTTP {real.status} "
                f"code {real.code}: {real.body[:400]!r}")
            continue
        assert real.ok, f"{where}: scripted success, the engine answered HTTP {real.status}: {real.body[:400]!r}"
        scripted_rows = tsv_rows(ex.scripted_body())
        real_rows = real.rows()
        if ex.purpose == "select_version":
            assert len(real_rows) == 1 and len(real_rows[0]) == 2 and real_rows[0][1] == b"1", where
            assert re.fullmatch(rb"\d+\.\d+\.\d+(\.\d+)?", real_rows[0][0]), where
            major = int(real_rows[0][0].split(b".")[0])
            assert (major < 23) == (dialect_of(case) == "clickhouse18"), f"{where}: engine {real_rows[0][0]!r}"
        elif ex.purpose == "pending_mutations":
            assert [len(r) for r in real_rows] == [len(r) for r in scripted_rows] == [2], where
            assert real_rows[0][1] == b"1" and real_rows[0][0].isdigit(), where
        elif ex.purpose == "inspect_lock":
            # (lock_id, seq, locked_at, now, stale_s): the times are the server's.
            assert all(len(r) == 5 for r in real_rows + scripted_rows), where
            assert sorted((r[0], r[1], r[4]) for r in real_rows) == sorted((r[0], r[1], r[4]) for r in scripted_rows), (
                f"{where}: holders differ\n  real:     {real_rows!r}\n  scripted: {scripted_rows!r}")
            for r in real_rows:
                assert r[2].lstrip(b"-").isdigit() and r[3].isdigit() and 0 <= int(r[3]) - int(r[2]) <= 60, (where, r)
        else:
            assert real_rows == scripted_rows, (
                f"{where}: the engine's rows differ from the scripted answer\n  real:     {real_rows!r}\n"
                f"  scripted: {scripted_rows!r}")
    return answers


def stored(engine, schema: str, table: str) -> dict:
    """id bytes -> (partial, completed) under FINAL, read independently (hex ids)."""
    rows = engine.rows(f"SELECT hex(state_id), partial_state, completed_state FROM `{schema}`.`{table}` FINAL "
                       "ORDER BY state_id FORMAT TabSeparated")
    return {bytes.fromhex(r[0].decode()): (r[1], r[2]) for r in rows}


def as_state(value):
    """A stored JSON column as the state it holds (NULL: the empty state)."""
    return {} if value is None else json.loads(value)


# ---------------------------------------------------------------------------

REPLAYED = [c["name"] for c in SQL["cases"]]


@pytest.mark.parametrize("name", REPLAYED)
def test_replay_on_the_real_engine(request, name, schema):
    case = CASES[name]
    if is_cluster(case):
        pytest.skip("cluster case: needs a replicated cluster with ZooKeeper (tests/cluster); out of scope here")
    engine = engine_for(request, case)
    kind = suffix(name)
    op = first_op(case)
    table = store_table(case)
    if kind in ("init", "init_without_history"):
        pass  # a fresh server: init makes everything
    else:
        prepare(engine, case, schema, tables=kind != "get_missing_table")
        if kind in SEEDS:
            seed(engine, schema, table, SEEDS[kind])
        if kind == "locks":
            name, holder, age_s, validity_s = LOCKS_SEED
            engine.sql(f"CREATE TABLE `{schema}`.`{name}` ENGINE = Log AS SELECT {unhex(holder)} AS lock_id, "
                       f"toUInt8(0) AS seq, toDateTime(now() - {age_s}) AS locked_at, toUInt32({validity_s}) AS stale_s")
        if kind == "python_backend_row_is_honoured":
            # The Python backend's live lock row, as its acquire_lock inserts it.
            holder = tsv_rows(next(ex for ex in exchanges(case) if ex.purpose == "foreign_lock_rows")
                              .scripted_body())[0][0]
            engine.sql(f"INSERT INTO `{schema}`.`{table}_lock` (state_id, lock_id) VALUES "
                       f"({unhex(bytes.fromhex(op['state_id_hex']))}, {unhex(holder)})")
        if kind == "history":
            at = "toDateTime64({}, 3)" if dialect_of(case) == "modern" else "toDateTime({})"
            engine.sql(f"INSERT INTO `{schema}`.`{table}_history` VALUES " + ", ".join(
                f"({unhex(i)}, {nullable(p)}, {nullable(c)}, {at.format(t)})" for i, p, c, t in HISTORY_SEED))
    before = stored(engine, schema, table) if kind not in ("init", "init_without_history", "get_missing_table") else {}

    replay(engine, case, schema)

    if kind in ("init", "init_without_history"):
        engines = dict((r[0], r[1]) for r in engine.rows(
            f"SELECT name, engine FROM system.tables WHERE database = '{schema}' FORMAT TabSeparated"))
        want = {b"state": b"ReplacingMergeTree", b"state_lock": b"ReplacingMergeTree"}
        if kind == "init":
            want.update({b"state_history": b"MergeTree", b"state_history_buffer": b"Buffer",
                         b"state_history_buffer_mv": b"MaterializedView"})
        assert engines == want, engines
        cols = engine.rows(f"SELECT name, type FROM system.columns WHERE database = '{schema}' AND table = 'state' "
                           "FORMAT TabSeparated")
        assert [tuple(c) for c in cols[:3]] == STATE_COLUMNS, cols
        # init is idempotent: the same sequence again succeeds.
        replay(engine, case, schema)
    elif kind in ("set", "set_quote_injection"):
        state_id = bytes.fromhex(op["state_id_hex"])
        after = stored(engine, schema, table)
        assert set(after) == {state_id}, f"ids in the table: {list(after)!r}, written {state_id!r}"
        partial, completed = after[state_id]
        assert as_state(completed) == op["state"]
        assert as_state(partial) == op.get("partial", {})
        assert engine.rows(f"EXISTS TABLE `{schema}`.`state`") == [[b"1"]]
        assert lock_tables(engine, schema, table) == [], "set left its lock table behind"
    elif kind == "delete":
        state_id = bytes.fromhex(op["state_id_hex"])
        if dialect_of(case) == "clickhouse18":
            # The vector's own pending_mutations query must reach 0 once the mutation is done.
            pending = next(ex for ex in exchanges(case) if ex.purpose == "pending_mutations")
            deadline = time.monotonic() + 20
            while True:
                count = engine.execute(pending.request, "meltano", schema).rows()[0][0]
                if count == b"0" or time.monotonic() > deadline:
                    break
                time.sleep(0.1)
            assert count == b"0", "the ALTER DELETE mutation did not finish in 20 s"
        after = stored(engine, schema, table)
        assert state_id in before and state_id not in after, f"{state_id!r} still there under FINAL"
        assert set(after) == set(before) - {state_id}, "the delete touched other ids"
        assert lock_tables(engine, schema, table) == [], "delete left its lock table behind"
        get = next(ex for ex in exchanges(CASES[f"{dialect_of(case)}_get_absent"]) if ex.purpose == "get_state")
        assert engine.execute(get.request, "meltano", schema).rows() == []
    elif kind == "clear_all":
        assert before and stored(engine, schema, table) == {}
    elif kind == "import":
        after = stored(engine, schema, table)
        want = {bytes.fromhex(e["state_id_hex"]): (e.get("completed") or {}, e.get("partial") or {})
                for e in op["states"]}
        assert {i: (as_state(c), as_state(p)) for i, (p, c) in after.items()} == want
    elif kind in ("get_found", "get_absent", "list_all", "list_glob_escapes_like", "get_binary_id", "export_page",
                  "history",
                  "server_error_is_classified", "exception_after_200", "custom_schema_and_table"):
        assert stored(engine, schema, table) == before, "a read changed the table"
    elif kind == "locks":
        assert stored(engine, schema, table) == before, "locks changed the table"
        assert lock_tables(engine, schema, table) == [LOCKS_SEED[0].encode()], "locks changed the lock tables"
    elif kind == "python_backend_row_is_honoured":
        # The acquisition gave up without a lock table of its own.
        assert lock_tables(engine, schema, table) == []
        assert stored(engine, schema, table) == before


# ---------------------------------------------------------------------------
# Literals and parameters parse to exactly the op's bytes

_LITERAL = r"'(?:[^'\\]|\\.)*'"


def id_expression(request_doc: dict) -> tuple[str, list]:
    """(SQL expression, url_params) that evaluate to the id the request addresses."""
    sql = request_doc["sql"]
    params = [p for p in request_doc["url_params"] if p[0] == "param_state_id"]
    if params:
        assert "{state_id:String}" in sql
        return "{state_id:String}", params
    m = (re.search(rf"state_id = ({_LITERAL})", sql) or re.search(rf"VALUES \(({_LITERAL}), ", sql)
         or re.search(rf"\) SELECT ({_LITERAL}), ", sql))  # a write fenced on its lock: INSERT ... SELECT
    assert m, f"no id literal in {sql}"
    return m.group(1), []


ID_REQUESTS = [(c["name"], ex.index) for c in SQL["cases"] if not is_cluster(c) and "state_id_hex" in first_op(c)
               for ex in exchanges(c) if ex.purpose in ("get_state", "insert_state", "delete_state", "foreign_lock_rows")]


@pytest.mark.parametrize("name,index", ID_REQUESTS)
def test_id_literal_or_parameter_is_the_id(request, name, index):
    case = CASES[name]
    engine = engine_for(request, case)
    expr, params = id_expression(exchanges(case)[index].request)
    answer = engine.post(f"SELECT hex({expr}), length({expr}) FORMAT TabSeparated", params)
    want = bytes.fromhex(first_op(case)["state_id_hex"])
    assert answer.rows() == [[want.hex().upper().encode(), str(len(want)).encode()]]


INSERTS = [c["name"] for c in SQL["cases"] if not is_cluster(c) and
           any(ex.purpose == "insert_state" for ex in exchanges(c))]


@pytest.mark.parametrize("name", INSERTS)
def test_insert_values_are_the_state_json(request, name):
    """The partial/completed literals of an insert parse to JSON equal to the op's state."""
    case = CASES[name]
    engine = engine_for(request, case)
    sql = next(ex for ex in exchanges(case) if ex.purpose == "insert_state").request["sql"]
    # VALUES (id, partial, completed), or a write fenced on its lock:
    # SELECT id, partial, completed FROM (SELECT countIf(... lock_id ...) ...) WHERE throwIf(...)
    m = re.search(rf"(?:VALUES \(|\) SELECT )({_LITERAL}), (NULL|{_LITERAL}), (NULL|{_LITERAL})"
                  rf"(?:\)$| FROM \(SELECT countIf\()", sql)
    assert m, sql
    row = engine.post(f"SELECT {m.group(2)}, {m.group(3)} FORMAT TabSeparated").rows()
    op = first_op(case)
    assert [as_state(row[0][0]), as_state(row[0][1])] == [op.get("partial", {}), op["state"]]


HOSTILE = [b"dev:\x00\xff'\\\t`%_", b"dev:\x00", b"dev:'", b"dev:\\", b"dev:\\'", b"dev:\n\r", b"dev:%_",
           b"dev:\xff\xfe", b"dev:\xc3\xa9", b"dev:`", b"dev:\\x00", b"dev:\\N", b"\\N"]


@pytest.mark.parametrize("dialect", ["clickhouse18", "modern"])
def test_hostile_ids_round_trip(request, dialect, schema):
    """Ids written independently (unhex) are found by the recorded get of the
    binary id and listed byte for byte by the recorded list."""
    case = CASES[f"{dialect}_get_binary_id"]
    engine = engine_for(request, case)
    prepare(engine, case, schema)
    seed(engine, schema, "state", [(i, None, json.dumps({"id": i.hex()}).encode()) for i in HOSTILE])
    get = next(ex for ex in exchanges(case) if ex.purpose == "get_state")
    rows = engine.execute(get.request, "meltano", schema).rows()
    assert len(rows) == 1 and json.loads(rows[0][1]) == {"id": bytes.fromhex(first_op(case)["state_id_hex"]).hex()}
    listing = next(ex for ex in exchanges(CASES[f"{dialect}_list_all"]) if ex.purpose == "list_state_ids")
    listed = [r[0] for r in engine.execute(listing.request, "meltano", schema).rows()]
    assert listed == sorted(HOSTILE), f"listed {listed!r}"


@pytest.mark.parametrize("dialect", ["clickhouse18", "modern"])
def test_a_write_reaches_the_history_through_its_buffer(request, dialect, schema):
    """init's schema: a write of the state leaves its version in the buffer
    (no history part yet), and the history read's flush puts it in the table."""
    init = CASES[f"{dialect}_init"]
    engine = engine_for(request, init)
    replay(engine, init, schema)
    seed(engine, schema, "state", [(b"dev:tap-users", None, b'{"singer_state":{}}')])
    count = f"SELECT count() FROM `{schema}`.`state_history` FORMAT TabSeparated"
    buffered = f"SELECT count() FROM `{schema}`.`state_history_buffer` FORMAT TabSeparated"
    assert engine.rows(count) == [[b"0"]] and engine.rows(buffered) == [[b"1"]]
    flush = next(ex for ex in exchanges(CASES[f"{dialect}_history"]) if ex.purpose == "flush_history")
    answer = engine.execute(flush.request, "meltano", schema)
    assert answer.ok, answer.body[:400]
    assert engine.rows(count) == [[b"1"]]


@pytest.mark.parametrize("dialect", ["clickhouse18", "modern"])
def test_latest_write_wins_under_final(request, dialect, schema, core):
    """Two writes of one id in the same second: FINAL (and so get/list/count)
    sees the second. The first insert is the recorded set; the second is the
    core's SQL for a set of other content (asked from the core library)."""
    case = CASES[f"{dialect}_set"]
    engine = engine_for(request, case)
    prepare(engine, case, schema)
    op = dict(first_op(case), state={"singer_state": {"n": 2}}, partial={"p": True})
    version = "18.16.1" if dialect == "clickhouse18" else "24.3.2.23"
    second = [r for r in core.requests_for(op, version) if r["purpose"] == "insert_state"][0]
    # The recorded set up to its insert (the lock it takes fences both writes), then the second.
    for ex in exchanges(case):
        answer = engine.execute(ex.request, "meltano", schema)
        assert answer.ok, f"{ex.purpose}: HTTP {answer.status}: {answer.body[:400]!r}"
        if ex.purpose == "insert_state":
            break
    answer = engine.execute(second, "meltano", schema)
    assert answer.ok, f"second insert: HTTP {answer.status}: {answer.body[:400]!r}"
    get = next(ex for ex in exchanges(CASES[f"{dialect}_get_found"]) if ex.purpose == "get_state")
    rows = engine.execute(get.request, "meltano", schema).rows()
    assert [[as_state(f) for f in r] for r in rows] == [[{"p": True}, {"singer_state": {"n": 2}}]]
    count = next(ex for ex in exchanges(CASES[f"{dialect}_clear_all"]) if ex.purpose == "count_states")
    assert engine.execute(count.request, "meltano", schema).rows() == [[b"1", b"1"]]


@pytest.mark.parametrize("dialect", ["clickhouse18", "modern"])
def test_glob_seed_is_the_scripted_answer(dialect):
    """The list_glob seed is fair: Meltano's glob picks exactly the scripted ids from it."""
    case = CASES[f"{dialect}_list_glob_escapes_like"]
    pattern = bytes.fromhex(first_op(case)["pattern_hex"]).decode()
    scripted = [r[0] for r in tsv_rows(next(ex for ex in exchanges(case) if ex.purpose == "list_state_ids")
                                       .scripted_body())]
    assert select_glob(pattern, [i.decode() for i in GLOB_DECOYS]) == {i.decode() for i in scripted}
