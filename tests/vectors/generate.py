#!/usr/bin/env python3
"""Writes the conformance vectors tests/vectors/{config,sql,lock,policy}.json.

The vectors are the source of truth every build of the core replays through
its C ABI (native: tests/vectors/vectors_test.cc; WebAssembly: tests/wasi, in
wasmtime and in Node) and must reproduce byte for byte. This script holds the
INPUTS (config sources; ops with scripted server answers) and records what the
native library answers, so a reviewer reads the expected documents in the
diff. Tests never run it: they compare against the committed files. Re-run
after an intended change of the core's output and review the diff:

    bazel build //hosts/python:libchstate.so
    python3 tests/vectors/generate.py [--check]   # --check: fail if a file would change

A case is a list of steps; each step calls one C ABI function with a
document and states the exact document it must return:
  {"call": "resolve_settings", "doc": {...}, "expect": "..."}
  {"call": "start" | "feed", "now_ms": N, "doc": {...}, "expect": "..."}
Every start/feed passes the file's "random_hex" bytes as the random input.
Cases with "store" first open a store from that settings document (a feed of
{"timer": true} while no op runs is the store's idle timer).
"""

from __future__ import annotations

import ctypes
import json
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
RANDOM = bytes(range(32))
MAX_STEPS = 60


def dumps(doc) -> str:
    """How every runner serialises an input document (compact, UTF-8)."""
    return json.dumps(doc, ensure_ascii=False, separators=(",", ":"))


def library() -> ctypes.CDLL:
    out = subprocess.run(["bazel", "info", "bazel-bin"], cwd=REPO, capture_output=True, text=True, check=True)
    lib = ctypes.CDLL(str(Path(out.stdout.strip()) / "hosts/python/libchstate.so"))
    lib.chstate_resolve_settings.restype = ctypes.c_void_p
    lib.chstate_resolve_settings.argtypes = [ctypes.c_char_p]
    lib.chstate_store_new.restype = ctypes.c_void_p
    lib.chstate_store_new.argtypes = [ctypes.c_char_p, ctypes.POINTER(ctypes.c_void_p)]
    lib.chstate_store_free.argtypes = [ctypes.c_void_p]
    for fn in (lib.chstate_op_start, lib.chstate_op_feed):
        fn.restype = ctypes.c_void_p
        fn.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int64, ctypes.c_char_p, ctypes.c_size_t]
    lib.chstate_string_free.argtypes = [ctypes.c_void_p]
    return lib


def take(lib, ptr) -> str:
    text = ctypes.string_at(ptr).decode("utf-8")
    lib.chstate_string_free(ptr)
    return text


# ---- server answers ----

def ok(body: str) -> dict:
    return {"transport_ok": True, "http_status": 200, "exception_code_header": "", "body": body}


def ch_error(code: int, message: str) -> dict:
    return {"transport_ok": True, "http_status": 500, "exception_code_header": str(code),
            "body": f"Code: {code}, e.displayText() = DB::Exception: {message}, e.what() = DB::Exception\n"}


LOST = {"transport_ok": False, "maybe_delivered": True, "transport_error": "connection reset by peer"}
REFUSED = {"transport_ok": False, "maybe_delivered": False, "transport_error": "connection refused"}


def version(v: str) -> dict:
    return ok(f"{v}\t1\n")


def hexid(s: str | bytes) -> str:
    return (s.encode() if isinstance(s, str) else s).hex()


# ---- config vectors ----

CONFIG_CASES = [
    ("uri_minimal", {"from": "cli", "values": {"uri": "clickhouse://alice@db.example:8123/analytics"}}),
    ("uri_password_is_redacted", {"from": "cli", "values": {"uri": "clickhouse://alice:s3cret@db.example:8123/analytics"}}),
    ("uri_percent_decoding", {"from": "cli", "values": {"uri": "clickhouse://al%40ice:p%2Fw@db.example:8123/my%5Fdb"}}),
    ("uri_ipv6_host", {"from": "cli", "values": {"uri": "clickhouse://alice@[::1]:8123/analytics"}}),
    ("uri_secure_and_tables", {"from": "cli", "values": {
        "uri": "clickhouse://alice@db.example:8443/analytics?secure=true&schema=ops&table=bookmarks"}}),
    ("uri_ca_file", {"from": "cli", "values": {"uri": "clickhouse://alice@db.example:8443/analytics?secure=true&ca_file=/etc/ca.pem"}}),
    ("uri_default_port", {"from": "cli", "values": {"uri": "clickhouse://alice@db.example/analytics"}}),
    ("uri_wrong_scheme", {"from": "cli", "values": {"uri": "postgres://alice@db.example:5432/analytics"}}),
    ("uri_bad_port", {"from": "cli", "values": {"uri": "clickhouse://alice@db.example:99999/analytics"}}),
    ("uri_unknown_parameter", {"from": "cli", "values": {"uri": "clickhouse://alice@db.example:8123/analytics?colour=blue"}}),
    ("uri_bad_percent_escape", {"from": "cli", "values": {"uri": "clickhouse://alice@db.example:8123/ana%zzlytics"}}),
    ("flags_only", {"from": "cli", "values": {"host": "10.0.0.5", "port": 9000, "user": "bob", "database": "warehouse",
                              "secure": False}}),
    ("flag_overrides_uri_part", {"from": "cli", "values": {"uri": "clickhouse://alice@db.example:8123/analytics",
                                           "host": "override.example"}}),
    ("uri_flag_overrides_meltano_env", {"from": "cli", "values": {"uri": "clickhouse://alice@db.example:8123/analytics"},
                                        "env": {"MELTANO_STATE_BACKEND_CLICKHOUSE_HOST": "env.example"}}),
    ("meltano_setting_env_over_backend_uri", {"env": {
        "MELTANO_STATE_BACKEND_URI": "clickhouse://carol@uri.example:8123/db1",
        "MELTANO_STATE_BACKEND_CLICKHOUSE_PORT": "9123"}}),
    ("backend_uri_over_clickhouse_env", {"env": {
        "MELTANO_STATE_BACKEND_URI": "clickhouse://carol@uri.example:8123/db1",
        "CLICKHOUSE_HOST": "plain.example", "CLICKHOUSE_USER": "dave"}}),
    ("clickhouse_env_only", {"env": {"CLICKHOUSE_HOST": "plain.example", "CLICKHOUSE_USER": "dave",
                                     "CLICKHOUSE_DATABASE": "db2", "CLICKHOUSE_PASSWORD": "pw"}}),
    ("missing_user_and_database", {"from": "cli", "values": {"host": "db.example"}}),
    ("empty_sources", {"from": "cli"}),
    ("null_and_empty_are_not_given", {"from": "cli", "values": {"uri": "clickhouse://alice@db.example:8123/analytics",
                                                "host": None, "port": ""}}),
    ("unknown_flag", {"from": "cli", "values": {"hostname": "db.example"}}),
    ("unknown_top_level_key", {"values": {}, "environment": {}}),
    ("flag_of_wrong_type", {"from": "cli", "values": {"port": 8123.5}}),
    ("bad_schema_identifier", {"from": "cli", "values": {"uri": "clickhouse://alice@db.example:8123/analytics?schema=bad-name"}}),
    ("secure_not_boolean", {"from": "cli", "values": {"uri": "clickhouse://alice@db.example:8123/analytics?secure=maybe"}}),
    ("non_ascii_database", {"from": "cli", "values": {"uri": "clickhouse://alice@db.example:8123/donn%C3%A9es"}}),
    ("cluster_from_uri_and_env", {"from": "cli", "values": {"uri": "clickhouse://alice@db.example:8123/analytics?cluster=ops"},
                                  "env": {"MELTANO_STATE_BACKEND_CLICKHOUSE_REPLICA": "r_{replica}"}}),
    ("cluster_several_hosts", {"from": "cli", "values": {"uri": "clickhouse://alice@h1:8123,[::1]:8124,h3/analytics?cluster=ops",
                                         "port": "9000"}}),
    ("several_hosts_need_cluster", {"from": "cli", "values": {"uri": "clickhouse://alice@h1,h2/analytics"}}),
    ("cluster_bad_zookeeper_path", {"from": "cli", "values": {"uri": "clickhouse://alice@db.example:8123/analytics?cluster=ops",
                                              "zookeeper_path": "no-leading-slash"}}),
    ("cluster_quorum", {"from": "cli", "values": {"uri": "clickhouse://alice@h1,h2,h3,h4,h5/analytics?cluster=ops&quorum=3"}}),
    ("cluster_quorum_of_one", {"from": "cli", "values": {"uri": "clickhouse://alice@h1,h2/analytics?cluster=ops"},
                               "env": {"MELTANO_STATE_BACKEND_CLICKHOUSE_QUORUM": "1"}}),
]
# The settings beyond the connection, as every kind of host gives them: the
# same inputs give the same store options everywhere.
URI = "clickhouse://alice@db.example:8123/analytics"
CONFIG_CASES += [
    ("settings_every_default", {"values": {"uri": URI}}),
    ("settings_lock_from_the_api", {"values": {"uri": URI, "lock_timeout_seconds": 2.5, "lock_retry_seconds": "0.25"}}),
    ("settings_lock_wait_given", {"values": {"uri": URI, "lock_wait_seconds": 0}}),
    ("settings_from_meltano", {"from": "meltano", "values": {
        "uri": URI, "lock_timeout_seconds": 30, "lock_retry_seconds": 1, "history_versions": "50",
        "python_locks": "true"}}),
    ("settings_from_the_environment", {"values": {"uri": URI}, "env": {
        "MELTANO_STATE_BACKEND_LOCK_TIMEOUT_SECONDS": "20", "MELTANO_STATE_BACKEND_CLICKHOUSE_LOCK_WAIT_SECONDS": "5",
        "MELTANO_STATE_BACKEND_CLICKHOUSE_HISTORY_DAYS": "7", "MELTANO_STATE_BACKEND_CLICKHOUSE_REQUEST_TIMEOUT_SECONDS":
        "12"}}),
    ("settings_the_value_beats_the_environment", {"values": {"uri": URI, "history_days": 3},
                                                  "env": {"MELTANO_STATE_BACKEND_CLICKHOUSE_HISTORY_DAYS": "7"}}),
    ("settings_from_cli_flags", {"from": "cli", "values": {"uri": URI, "lock_timeout_seconds": "60",
                                                           "lock_wait_seconds": "5"}}),
    ("settings_cluster_timeouts", {"values": {"uri": "clickhouse://alice@h1,h2,h3/analytics?cluster=ops",
                                              "quorum_timeout_seconds": "2.5", "quorum_busy_seconds": 4,
                                              "ddl_timeout_seconds": 3, "host_down_seconds": "0.5"}}),
    ("settings_host_that_lingers", {"values": {"uri": URI}, "host": {"timers": True, "exit_release": True}}),
    ("settings_linger_asked_where_it_cannot", {"values": {"uri": URI, "linger_locks": True}}),
    ("settings_chdb_uri", {"values": {"uri": "chdb:///var/lib/meltano/state?table=bookmarks"}}),
    ("settings_chdb_uri_relative", {"values": {"uri": "chdb://relative/dir"}}),
    ("settings_unknown_key", {"values": {"uri": URI, "colour": "blue"}}),
    ("settings_renamed_key", {"values": {"uri": URI, "stale_lock": 30}}),
    ("settings_validity_below_the_floor", {"values": {"uri": URI, "lock_timeout_seconds": 0.5}}),
    ("settings_not_a_number", {"from": "meltano", "values": {"uri": URI, "lock_retry_seconds": "soon"}}),
    ("settings_password_never_in_messages", {"values": {"uri": "clickhouse://alice:hunter2@db.example/analytics",
                                                        "port": "hunter2"}}),
]


def config_file(lib) -> dict:
    cases = []
    for name, sources in CONFIG_CASES:
        expect = take(lib, lib.chstate_resolve_settings(dumps(sources).encode()))
        cases.append({"name": name, "steps": [{"call": "resolve_settings", "doc": sources, "expect": expect}]})
    return {"what": "Settings resolution (chstate_resolve_settings): raw values in, connection, store options "
                    "and origins out", "cases": cases}


# ---- scripted operations ----

def script(lib, name: str, op: dict, answers: list, store: dict | None = None, start_ms: int = 1_000_000,
           timer_ms: int | None = None, step_ms: int = 3) -> dict:
    """Runs `op`, answering the n-th request with answers[n] (the last one
    repeats) or, when `answers` is a dict, the n-th request of a purpose with
    answers[purpose][n] (the last one repeats); timers fire after their delay
    (or `timer_ms`). Records every step."""
    values = {"uri": "clickhouse://default@127.0.0.1:8123/default", "lock_wait_seconds": 3, "lock_retry_seconds": 1,
              "lock_timeout_seconds": 30}
    host = dict((store or {}).pop("host", {}))
    values.update(store or {})
    store_options = {"values": values}
    if host:
        store_options["host"] = host
    err = ctypes.c_void_p()
    handle = lib.chstate_store_new(dumps(store_options).encode(), ctypes.byref(err))
    if not handle:
        raise SystemExit(f"{name}: store_new failed: {take(lib, err.value)}")
    steps = []
    now = start_ms
    fed: dict = {}
    # `op` is one op document, or a list of them run one after another on the
    # same store, each optionally {"after_ms": N, "op": {...}} (N ms after
    # the previous op ended) or {"abandon_after": K, "op": {...}} (the op is
    # left unfinished after K actions: the next start abandons it). The op
    # IDLE is the idle timer: {"timer": true} fed while no op runs.
    ops = op if isinstance(op, list) else [op]
    try:
        for entry in ops:
            doc = entry.get("op", entry) if "after_ms" in entry or "abandon_after" in entry else entry
            now += entry.get("after_ms", 0) if doc is not entry else 0
            limit = entry.get("abandon_after", MAX_STEPS) if doc is not entry else MAX_STEPS
            call = "start"
            if doc is IDLE:
                doc, call = {"timer": True}, "feed"
            for _ in range(limit):
                fn = lib.chstate_op_start if call == "start" else lib.chstate_op_feed
                out = take(lib, fn(handle, dumps(doc).encode(), now, RANDOM, len(RANDOM)))
                steps.append({"call": call, "now_ms": now, "doc": doc, "expect": out})
                action = json.loads(out)
                if "request" in action:
                    key = action["request"]["purpose"] if isinstance(answers, dict) else ""
                    if isinstance(answers, dict) and key not in answers:
                        raise SystemExit(f"{name}: no scripted answer for a {key} request")
                    queue = answers[key] if isinstance(answers, dict) else answers
                    answer = queue[min(fed.get(key, 0), len(queue) - 1)]
                    fed[key] = fed.get(key, 0) + 1
                    now += step_ms
                    doc, call = {"response": answer}, "feed"
                elif "wait_ms" in action:
                    now += action["wait_ms"] if timer_ms is None else timer_ms
                    doc, call = {"timer": True}, "feed"
                else:
                    break
            else:
                if limit == MAX_STEPS:
                    raise SystemExit(f"{name}: more than {MAX_STEPS} steps")
    finally:
        lib.chstate_store_free(handle)
    return {"name": name, "store": store_options, "steps": steps}


IDLE = {"timer": True}  # the idle timer (compared by identity in script())
STATE = {"singer_state": {"bookmarks": {"users": {"updated_at": "2024-01-02T03:04:05Z"}}}}
ROW = "{}\t{\\\"singer_state\\\":{\\\"bookmarks\\\":{}}}\n"  # partial, completed (TSV-escaped JSON)


def cluster_row(replica: str) -> str:
    """A cluster-mode state read's answer from `replica`: the row (partial, completed, version
    in ms, the last block of its part) and the row naming the replica (Statements::GetState)."""
    return f"{ROW[:-1]}\t1000000000\t3\t\t\t\n#replica\t3\t\t\t\t{replica}\t\n"


def sql_file(lib) -> dict:
    cases = []
    for dialect, ver in (("clickhouse18", "18.16.1"), ("modern", "24.3.2.23")):
        v = version(ver)
        add = lambda name, op, answers, **kw: cases.append(script(lib, f"{dialect}_{name}", op, [v] + answers, **kw))
        add("ping", {"op": "ping"}, [])
        # init: the database, state, lock and history tables, the history
        # buffer, its view, the drop of a pre-buffer view; expire, trim; tombstones.
        add("init", {"op": "init"}, [ok("")] * 8 + [ok("")])
        # Versions as the engine names them: cityHash64 of the sides seeded
        # by the oracle (tests/oracles), modern servers' DateTime64 text.
        frac = ".000" if dialect == "modern" else ""
        # The buffer flushed into the history table first (OPTIMIZE), then the versions.
        add("history", {"op": "history", "state_id_hex": hexid("dev:tap-users"), "limit": 5},
            [ok(""), ok(f"1796155032000\teaab4add\t2026-12-01 19:57:12{frac}\t\\N\t{{\\\"singer_state\\\":{{}}}}\n"
                f"1796155031000\tfa86211b\t2026-12-01 19:57:11{frac}\t{{\\\"p\\\":1}}\t\\N\n"),
             ok("\\N\t{\\\"singer_state\\\":{}}\n")])
        # The page's boundaries first: a sample of the ids that, for the
        # oracle's seeded ids, holds none (so the page reads to the end).
        add("export_page", {"op": "export", "pattern": "dev:*", "after_hex": hexid("dev:a"), "limit": 2},
            [ok(""), ok("dev:b\t\\N\t{\\\"singer_state\\\":{}}\ndev:c\t{\\\"p\\\":1}\t\\N\n")])
        add("import", {"op": "import", "states": [
            {"state_id_hex": hexid("dev:a"), "completed": {"singer_state": {"n": 1}}, "partial": {}},
            {"state_id_hex": hexid(b"dev:'\x00"), "partial": {"p": [1]}}]}, [ok("")])
        add("init_without_history", {"op": "init"}, [ok("")] * 3 + [ok("")], store={"history_days": 0})
        add("compact", {"op": "compact"}, [ok("")] * 8 + [ok("")])
        add("get_found", {"op": "get", "state_id_hex": hexid("dev:tap-users")}, [ok(ROW)])
        add("get_absent", {"op": "get", "state_id_hex": hexid("dev:tap-users")}, [ok("")])
        add("get_missing_table", {"op": "get", "state_id_hex": hexid("dev:x")},
            [ch_error(60, "Table meltano.state doesn't exist.")])
        add("get_binary_id", {"op": "get", "state_id_hex": hexid(b"dev:\x00\xff'\\\t`%_")}, [ok("")])
        # set and delete take the id's lock around the write: create, look for
        # the Python backend's rows, write, look, drop.
        mine = ok("000102030405060708090a0b0c0d0e0f\t0\t1000000\t1000001\t30\n\t255\t1000000\t1000001\t0\n")
        add("set", {"op": "set", "state_id_hex": hexid("dev:tap-users"), "state": STATE},
            [ok(""), ok(""), ok(""), mine, ok("")])
        add("set_quote_injection", {"op": "set", "state_id_hex": hexid("x'); DROP TABLE state; --"),
                                    "state": {"k": "'; DROP TABLE t; --\\"}, "force": True},
            [ok(""), ok(""), ok(""), mine, ok("")])
        add("delete", {"op": "delete", "state_id_hex": hexid("dev:tap-users")},
            [ok(""), ok(""), ok("")] + ([ok("0\t1\n")] if dialect == "clickhouse18" else []) + [mine, ok("")])
        add("list_all", {"op": "list", "pattern": None}, [ok("dev:a\t1\ndev:b\t1\n")])
        add("list_glob_escapes_like", {"op": "list", "pattern_hex": hexid("dev:*_100%?")}, [ok("dev:x_100%a\t1\n")])
        add("clear_all", {"op": "clear_all"}, [ok("2\t1\n"), ok(""), ok("0\t1\n")])
        add("locks", {"op": "locks"}, [ok("dev:a\t1\n"), ok("state_lock_0123456789abcdef\t1\n"),
                                      ok("ffffffffffffffffffffffffffffffff\t0\t990\t1000\t30\n\t255\t990\t1000\t0\n")])
        add("server_error_is_classified", {"op": "get", "state_id_hex": hexid("dev:x")},
            [ch_error(516, "alice: Authentication failed: password is incorrect")])
        add("exception_after_200", {"op": "get", "state_id_hex": hexid("dev:x")},
            [ok("Code: 241, e.displayText() = DB::Exception: Memory limit exceeded\n")])
    cluster = {"uri": "clickhouse://default@127.0.0.1:8123/default?cluster=ops",
               "zookeeper_path": "/clickhouse/tables/{shard}", "replica": "{replica}"}
    for name, op, answers in (
            # Read from two replicas of three (a write is confirmed on two).
            ("get", {"op": "get", "state_id_hex": hexid("dev:tap-users")}, [ok(cluster_row("r1")), ok(cluster_row("r2"))]),
            # The lock as claims: read, claim, read again (ours alone).
            ("acquire_lock", {"op": "acquire", "state_id_hex": hexid("dev:tap-users")},
             # (an acquisition's claims: its random prefix and a number)
             [ok(""), ok(""), ok(f"{RANDOM[:12].hex()}00000001\t1\t0\t100\t30\t\t100\n")])):
        engine = ok("ReplicatedReplacingMergeTree\t1\n")
        cases.append(script(lib, f"cluster_clickhouse18_{name}", op, [version("18.16.1"), engine] + answers,
                            store=cluster))
    # The quorum and its timeout are store options: the write carries them.
    claimed = ok(f"{RANDOM[:12].hex()}00000001\t1\t0\t100\t30\t\t100\n")
    cases.append(script(lib, "cluster_quorum_of_three", {"op": "set", "state_id_hex": hexid("dev:q"), "state": STATE},
                        [version("18.16.1"), ok("ReplicatedReplacingMergeTree\t1\n"), ok(""), ok(""), claimed, ok(""),
                         claimed, ok("")],
                        store=dict(cluster, quorum=3, quorum_timeout_seconds=2.5)))
    # Several hosts: every request names its host; a refused one is followed
    # at once by the next, and the next request keeps to the one that answered.
    several = dict(cluster, uri="clickhouse://default@h1:8123,h2:8124/default?cluster=ops")
    cases.append(script(lib, "cluster_several_hosts_fail_over", [{"op": "get", "state_id_hex": hexid("dev:a")},
                                                                 {"op": "get", "state_id_hex": hexid("dev:a")}],
                        [REFUSED, version("18.16.1"), ok("ReplicatedReplacingMergeTree\t1\n"), ok(cluster_row("r2")),
                         ok(cluster_row("r1")), ok(cluster_row("r2")), ok(cluster_row("r1"))],
                        store=several))
    cases.append(script(lib, "cluster_refuses_an_unreplicated_state_table", {"op": "get", "state_id_hex": hexid("a")},
                        [version("18.16.1"), ok("ReplacingMergeTree\t1\n")], store=cluster))
    cases.append(script(lib, "too_old_server_refused", {"op": "ping"}, [version("1.1.54390")]))
    cases.append(script(lib, "custom_schema_and_table", {"op": "get", "state_id_hex": hexid("a")},
                        [version("18.16.1"), ok("")], store={"schema": "ops", "table": "bookmarks"}))
    # A mixed fleet is safe by default: a live row of the Python backend makes
    # the acquirer wait before it takes the table lock (here: give up).
    cases.append(script(lib, "python_backend_row_is_honoured", {"op": "acquire", "state_id_hex": hexid("dev:m")},
                        [version("18.16.1"), ok("python-holder\t1\n")], store={"lock_wait_seconds": 2.5}))
    return {"what": "SQL per dialect: ops started against a scripted server version; the exact requests",
            "random_hex": RANDOM.hex(), "cases": cases}


def lock_file(lib) -> dict:
    sid = hexid("dev:tap-users")
    lock_id = "000102030405060708090a0b0c0d0e0f"  # what the fixed random bytes make (checked by the vectors)
    exists = ch_error(57, "Table meltano.state_lock_x already exists.")
    ours = ok(f"{lock_id}\t0\t1000000\t1000001\t30\n\t255\t1000000\t1000001\t0\n")
    live_other = ok("ffffffffffffffffffffffffffffffff\t0\t999990\t1000000\t30\n\t255\t999990\t1000000\t0\n")
    stale_other = ok("ffffffffffffffffffffffffffffffff\t0\t900000\t1000000\t30\n\t255\t900000\t1000000\t0\n")
    cases = []

    def add(name, op, answers, **kw):
        answers = {"select_version": [version("18.16.1")], "foreign_lock_rows": [ok("")], **answers}
        cases.append(script(lib, name, op, answers, **kw))

    # inspect_lock rows: lock_id, seq, locked_at, now, stale_s (+ the system.tables row)
    add("acquire_free", {"op": "acquire", "state_id_hex": sid}, {"create_lock": [ok("")], "foreign_lock_rows": [ok("")]})
    add("acquire_held_live_then_timeout", {"op": "acquire", "state_id_hex": sid},
        {"create_lock": [exists], "inspect_lock": [live_other], "announce_lock_waiter": [ok("")]})
    add("acquire_stale_takeover", {"op": "acquire", "state_id_hex": sid},
        {"create_lock": [exists, ok("")], "inspect_lock": [stale_other], "entomb_lock": [ok("")]})
    add("acquire_takeover_race_lost", {"op": "acquire", "state_id_hex": sid},
        {"create_lock": [exists], "inspect_lock": [stale_other, live_other],
         "entomb_lock": [ch_error(57, "Table meltano.state_lock_x_dead_1 already exists.")],
         "announce_lock_waiter": [ok("")]})
    # linger_locks: a release lingers (no request) and the next acquisition
    # takes the lock back (no request); a tick after the linger time
    # releases it for real; a look for waiters once the check time passed,
    # and yielding to one; release_lingering before a host goes away.
    acquire = {"op": "acquire", "state_id_hex": sid}
    release = {"op": "release", "state_id_hex": sid, "lock_id": lock_id}
    lingering = {"host": {"timers": True, "exit_release": True}}  # a host that can keep a lock lingering
    add("linger_release_and_take_back", [acquire, release, acquire, release, {"after_ms": 1000, "op": IDLE}],
        {"create_lock": [ok("")], "inspect_lock": [ours], "drop_lock": [ok("")]}, store=lingering)
    add("linger_looks_for_waiters_and_yields",
        [acquire, {"after_ms": 200, "op": release}, acquire, {"after_ms": 200, "op": release}, acquire],
        {"create_lock": [ok("")], "lock_waiters": [ok(""), ok("ffffffffffffffffffffffffffffffff\t1\n")],
         "inspect_lock": [ours], "drop_lock": [ok("")]}, store=lingering)
    add("linger_released_before_the_host_goes", [acquire, release, {"close": True}],
        {"create_lock": [ok("")], "inspect_lock": [ours], "drop_lock": [ok("")]}, store=lingering)
    add("acquire_lost_answer_then_inspect_finds_ours", {"op": "acquire", "state_id_hex": sid},
        {"create_lock": [LOST], "inspect_lock": [ours]})
    add("acquire_server_down", {"op": "acquire", "state_id_hex": sid},
        {"select_version": [REFUSED]})
    add("acquire_refused_during_create", {"op": "acquire", "state_id_hex": sid},
        {"create_lock": [REFUSED], "inspect_lock": [REFUSED]})
    add("merge_under_lock", {"op": "merge", "state_id_hex": sid, "partial": {"singer_state": {"x": 1}}},
        {"create_lock": [ok("")], "get_state": [ok(ROW)], "insert_state": [ok("")], "inspect_lock": [ours],
         "drop_lock": [ok("")]})
    add("set_lock_lost_before_write", {"op": "set", "state_id_hex": sid, "state": {"a": 1}, "force": True},
        {"create_lock": [ok("")], "inspect_lock": [live_other], "drop_lock": [ok("")]}, step_ms=40000)
    add("scope_release_after_the_lease_ran_out", [acquire, {"after_ms": 40000, "op": release}],
        {"create_lock": [ok("")], "inspect_lock": [ours], "drop_lock": [ok("")]})
    add("release_without_acquire", {"op": "release", "state_id_hex": sid, "lock_id": lock_id}, {})
    add("delete_under_its_lock", {"op": "delete", "state_id_hex": sid},
        {"create_lock": [ok("")], "delete_state": [ok("")], "pending_mutations": [ok("0\t1\n")],
         "inspect_lock": [ours], "drop_lock": [ok("")]})
    return {"what": "Lock decisions: scripted server answers and timers -> the lock's actions",
            "random_hex": RANDOM.hex(), "cases": cases}


def policy_file(lib) -> dict:
    """The core's transport and timer policy, which every host must follow by
    pumping alone: which failures are resent (idempotent requests, and any
    request that provably never left), after which back-off, how often;
    renewal of a held lock across long waits; lease expiry; cancellation."""
    sid = hexid("dev:tap-users")
    lock_id = "000102030405060708090a0b0c0d0e0f"
    ours = ok(f"{lock_id}\t0\t1000000\t1000001\t30\n\t255\t1000000\t1000001\t0\n")
    renewed = ok(f"{lock_id}\t0\t1000012\t1000012\t30\n\t255\t1000000\t1000012\t0\n")
    other = ok("ffffffffffffffffffffffffffffffff\t0\t999990\t1000000\t30\n\t255\t999990\t1000000\t0\n")
    exists = ch_error(57, "Table meltano.state_lock_x already exists.")
    state = {"singer_state": {"x": 1}}
    cases = []

    def add(name, op, answers, **kw):
        answers = {"select_version": [version("18.16.1")], "foreign_lock_rows": [ok("")], **answers}
        cases.append(script(lib, name, op, answers, **kw))

    get = {"op": "get", "state_id_hex": sid}
    put = {"op": "set", "state_id_hex": sid, "state": state}
    # Reads: resent after any transport failure, 100 ms then 200 ms, three sends in all.
    add("read_refused_every_attempt", get, {"get_state": [REFUSED]})
    add("read_answer_lost_then_answered", get, {"get_state": [LOST, ok(ROW)]})
    add("read_refused_twice_then_answered", get, {"get_state": [REFUSED, REFUSED, ok("")]})
    add("server_error_is_not_a_transport_failure", get, {"get_state": [ch_error(202, "Too many queries")]})
    # Writes: resent only when they provably never left (a set takes the
    # id's lock around its write).
    locked = {"create_lock": [ok("")], "inspect_lock": [ours], "drop_lock": [ok("")]}
    add("write_answer_lost_is_not_resent", put, {"insert_state": [LOST], **locked})
    add("write_refused_is_resent", put, {"insert_state": [REFUSED, ok("")], **locked})
    add("write_refused_every_attempt", put, {"insert_state": [REFUSED], **locked})
    # The lock: a CREATE whose answer was lost is resolved by looking, never resent.
    add("lock_create_lost_is_inspected", {"op": "acquire", "state_id_hex": sid},
        {"create_lock": [LOST], "inspect_lock": [ours]})
    add("lock_create_refused_is_resent", {"op": "acquire", "state_id_hex": sid},
        {"create_lock": [REFUSED, ok("")]})
    # Renewal of a held lock after a long wait, then the lease's end.
    acquire = {"op": "acquire", "state_id_hex": sid}
    add("renewal_after_a_long_wait", [acquire, {"after_ms": 12000, "op": {"op": "renew", "state_id_hex": sid}},
                                      {"after_ms": 12000, "op": put}],
        {"create_lock": [ok("")], "renew_lock": [ok("")], "inspect_lock": [renewed], "insert_state": [ok("")]})
    tick = IDLE
    add("idle_timer_before_due_sends_nothing_then_renews_when_due",
        [acquire, {"after_ms": 5000, "op": tick}, {"after_ms": 5000, "op": tick}],
        {"create_lock": [ok("")], "renew_lock": [ok("")], "inspect_lock": [renewed]})
    add("idle_timer_finds_the_lock_lost_then_writes_are_refused",
        [acquire, {"after_ms": 10000, "op": tick}, put, {"op": "release", "state_id_hex": sid, "lock_id": lock_id}],
        {"create_lock": [ok("")], "renew_lock": [ok("")], "inspect_lock": [other]})
    add("update_of_a_held_id_uses_that_lock",
        [acquire, {"op": "merge", "state_id_hex": sid, "partial": {"singer_state": {"x": 2}}}],
        {"create_lock": [ok("")], "get_state": [ok(ROW)], "insert_state": [ok("")]})
    add("renewal_finds_another_holder", [acquire, {"after_ms": 12000, "op": {"op": "renew", "state_id_hex": sid}}],
        {"create_lock": [ok("")], "renew_lock": [ok("")], "inspect_lock": [other]})
    add("write_after_the_lease_ran_out_is_refused", [acquire, {"after_ms": 40000, "op": put}],
        {"create_lock": [ok("")]})
    # Cancellation: a new op abandons one that waits for a held lock.
    add("waiting_acquire_abandoned_by_a_new_op", [{"abandon_after": 4, "op": acquire}, get],
        {"create_lock": [exists], "inspect_lock": [other], "announce_lock_waiter": [ok("")], "get_state": [ok("")]})
    return {"what": "Transport and timer policy: resends, back-off, renewal, lease expiry, cancellation",
            "random_hex": RANDOM.hex(), "cases": cases}


def main() -> int:
    check = "--check" in sys.argv[1:]
    lib = library()
    changed = []
    for name, make in (("config", config_file), ("sql", sql_file), ("lock", lock_file), ("policy", policy_file)):
        doc = make(lib)
        doc.setdefault("random_hex", RANDOM.hex())
        text = json.dumps(doc, ensure_ascii=False, indent=1) + "\n"
        path = HERE / f"{name}.json"
        if not path.exists() or path.read_text() != text:
            changed.append(path.name)
            if not check:
                path.write_text(text)
    print(("would change: " if check else "written: ") + (", ".join(changed) or "nothing"))
    return 1 if check and changed else 0


if __name__ == "__main__":
    sys.exit(main())
