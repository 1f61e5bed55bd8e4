"""End-to-end tests of the `chstate` tool against a real ClickHouse server.

Every run goes through `cli.run` (conftest.py), which checks the exit code and
that the password is in neither stdout nor stderr. Run with
`python3 -m pytest tests/integration`.
"""

from __future__ import annotations

import json
import re
import socket
import subprocess
import time

import pytest

COMMANDS = ["list", "get", "set", "merge", "copy", "move", "clear", "export", "import", "history", "rollback",
            "compact", "locks", "unlock", "init", "ping"]

STATE_A = {"singer_state": {"bookmarks": {"users": {"updated_at": "2024-01-01"}}}}
STATE_B = {"singer_state": {"bookmarks": {"users": {"updated_at": "2024-02-02"}, "orders": {"id": 7}}}}


def free_port() -> int:
    """A port nothing listens on (bound, then closed)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ---- help, version, usage ----------------------------------------------------

def test_general_help_lists_commands_and_exit_codes(cli):
    for flag in ("--help", "-h"):
        r = cli.run(flag, uri=None)
        for command in COMMANDS:
            assert f"\n  {command}" in r.out
        assert "Exit codes" in r.out
        for code in range(8):
            assert f"\n  {code}  " in r.out
        assert "MELTANO_STATE_BACKEND_CLICKHOUSE_PASSWORD" in r.out


@pytest.mark.parametrize("command", COMMANDS)
def test_command_help(cli, command):
    # Help wins over missing arguments, before or after the command.
    for args in ([command, "--help"], ["--help", command], [command, "-h"]):
        r = cli.run(*args)
        assert r.out.startswith(f"Usage: chstate {command}")
        assert "Exit codes" in r.out


def test_version(cli):
    assert cli.run("--version", uri=None).out.startswith("chstate ")
    assert "version" in cli.run("--version", "--json", uri=None).json()
    assert "Usage" in cli.run("--help", "--json", uri=None).json()["help"]


@pytest.mark.parametrize("args, fragment", [
    ([], "no command"),
    (["frobnicate"], "unknown command"),
    (["list", "--bogus"], "unknown option"),
    (["get", "x", "--all"], "not an option of `chstate get`"),
    (["get"], "too few arguments"),
    (["get", "a", "b"], "too many arguments"),
    (["copy", "a"], "too few arguments"),
    (["list", "--pattern"], "--pattern needs a value"),
    (["clear"], "either a state ID or --all"),
    (["clear", "x", "--all"], "either a state ID or --all"),
    (["set", "x"], "set needs the state"),
    (["merge", "x"], "merge needs the state"),
    (["set", "x", "{}", "--input-file", "/dev/null"], "not both"),
    (["merge", "x", "{}", "--from-state-id", "y"], "not several"),
    (["get", ""], "state id is empty"),
    (["--lock-timeout", "soon", "get", "x"], "--lock-timeout"),
    (["--json=maybe", "list"], "--json"),
    (["set", "x", "--input-file", "/nonexistent/state.json"], "cannot read --input-file"),
])
def test_usage_errors_exit_2(cli, args, fragment):
    r = cli.run(*args, expect=2)
    assert r.err.startswith("chstate: ")
    assert fragment in r.err
    assert r.err.count("\n") == 1


def test_usage_error_in_json_mode(cli):
    r = cli.run("get", "a", "b", "--json", expect=2)
    error = r.json()["error"]
    assert error["exit_code"] == 2 and error["code"] == "INVALID_ARGUMENT"
    assert "too many arguments" in error["message"]
    assert r.stderr == b""


def test_unknown_option_does_not_echo_its_value(cli):
    r = cli.run("ping", "--pasword=hunter2-secret", expect=2, secrets=("hunter2-secret",))
    assert "--pasword" in r.err


def test_bad_lock_timeout_from_env_names_the_variable(cli):
    env = cli.env(MELTANO_STATE_BACKEND_LOCK_TIMEOUT_SECONDS="-1")
    r = cli.run("get", "x", env=env, expect=2)
    assert "MELTANO_STATE_BACKEND_LOCK_TIMEOUT_SECONDS" in r.err


# ---- ping and init --------------------------------------------------------------

def test_ping(cli):
    r = cli.run("ping")
    lines = dict(line.split(": ", 1) for line in r.out.splitlines())
    assert set(lines) == {"server_version", "dialect", "round_trip_ms", "uri"}
    assert lines["dialect"] in ("clickhouse18", "modern")
    assert int(lines["round_trip_ms"]) >= 0
    assert lines["uri"].startswith(f"clickhouse://{cli.server.user}:***@")
    assert f"schema={cli.schema}" in lines["uri"]

    j = cli.run("ping", "--json").json()
    assert set(j) == {"server_version", "dialect", "round_trip_ms", "uri"}
    assert j["server_version"] == lines["server_version"]
    assert isinstance(j["round_trip_ms"], int)
    assert "***" in j["uri"]


def test_init_is_idempotent(cli):
    assert cli.run("init").out.startswith(f"ready: {cli.schema}.state")
    j = cli.run("--json", "init").json()
    assert j["schema"] == cli.schema and j["table"] == "state" and j["server_version"]
    assert cli.list() == []


def test_commands_work_before_init(cli):
    assert cli.list() == []
    cli.run("get", "nothing", expect=3)
    cli.set("first", STATE_A)
    assert cli.get("first") == STATE_A


# ---- set / get ---------------------------------------------------------------------

def test_set_get_round_trip(cli):
    state = {"singer_state": {"bookmarks": {"s": {"v": 1.5, "n": None, "t": True, "l": [1, "two", {"x": []}]}}},
             "other": "kept"}
    cli.set("dev:tap-a-to-target-b", state)
    assert cli.get("dev:tap-a-to-target-b") == state
    full = cli.get_full("dev:tap-a-to-target-b")
    assert full == {"state_id": "dev:tap-a-to-target-b", "completed": state, "partial": {}, "merged": state}


def test_set_overwrites_both_sides(cli):
    cli.set("id", STATE_A)
    cli.run("merge", "id", json.dumps({"singer_state": {"partial": 1}}))
    cli.set("id", STATE_B)
    assert cli.get_full("id") == {"state_id": "id", "completed": STATE_B, "partial": {}, "merged": STATE_B}


def test_set_json_output(cli):
    j = cli.run("set", "id", json.dumps(STATE_A), "--json").json()
    assert j == {"state_id": "id", "completed": STATE_A, "partial": {}, "merged": STATE_A}


def test_set_from_stdin_and_files(cli, tmp_path):
    cli.run("set", "stdin", "-", input=json.dumps(STATE_A))
    assert cli.get("stdin") == STATE_A
    f = tmp_path / "state.json"
    f.write_text(json.dumps(STATE_B, indent=2))
    cli.run("set", "file", "--input-file", str(f))
    assert cli.get("file") == STATE_B
    cli.run("set", "file-stdin", "--input-file", "-", input=json.dumps(STATE_A))
    assert cli.get("file-stdin") == STATE_A


def test_set_requires_singer_state_unless_forced(cli):
    r = cli.run("set", "id", '{"bookmarks": {}}', expect=2)
    assert "singer_state" in r.err
    cli.run("get", "id", expect=3)
    cli.run("set", "id", '{"bookmarks": {}}', "--force")
    assert cli.get("id") == {"bookmarks": {}}


@pytest.mark.parametrize("text, line, column", [
    ('{"singer_state": {', 1, 19),
    ('{"singer_state": {"a": 1,}}', 1, 26),
    ('{\n  "singer_state": {\n    "a": tru\n  }\n}', 3, 13),
    ("[1, 2]", None, None),
    ("", None, None),
])
def test_invalid_json_exits_2_with_position(cli, text, line, column):
    r = cli.run("set", "id", "-", input=text, expect=2)
    if line is not None:
        assert f"line {line}, column {column}" in r.err
    assert r.err.startswith("chstate: ") and r.err.count("\n") == 1
    j = cli.run("set", "id", "-", "--json", input=text, expect=2).json()
    assert j["error"]["exit_code"] == 2
    if line is not None:
        assert f"line {line}" in j["error"]["message"]
    cli.run("get", "id", expect=3)


def test_get_absent_exits_3(cli):
    cli.set("present", STATE_A)
    r = cli.run("get", "absent", expect=3)
    assert "absent" in r.err and r.out == ""
    error = cli.run("get", "absent", "--json", expect=3).json()["error"]
    assert error == {"code": "NOT_FOUND", "message": error["message"], "exit_code": 3}


def test_last_write_wins_when_writing_quickly(cli):
    # Rows written within the same millisecond must still read back in write order.
    for i in range(6):
        state_id = f"aba-{i}"
        cli.set(state_id, STATE_A)
        cli.set(state_id, STATE_B)
        cli.set(state_id, STATE_A)
        assert cli.get(state_id) == STATE_A, f"iteration {i}"
        cli.set(state_id, STATE_B)
        assert cli.get(state_id) == STATE_B, f"iteration {i}"


# ---- merge ---------------------------------------------------------------------------

def test_merge_semantics(cli):
    completed = {"singer_state": {
        "bookmarks": {"users": {"updated_at": "2024-01-01", "version": 1}, "orders": {"id": 5}},
        "currently_syncing": "users",
        "columns": ["a", "b", "c"]}}
    cli.set("id", completed)

    first = {"singer_state": {"bookmarks": {"users": {"updated_at": "2024-03-03"}}, "columns": ["z"]}}
    cli.run("merge", "id", json.dumps(first))
    full = cli.get_full("id")
    assert full["completed"] == completed
    assert full["partial"] == first
    assert full["merged"] == {"singer_state": {
        "bookmarks": {"users": {"updated_at": "2024-03-03", "version": 1}, "orders": {"id": 5}},
        "currently_syncing": "users",
        "columns": ["z"]}}
    assert cli.get("id") == full["merged"]

    # A second merge lands on the partial side, recursively; lists are replaced.
    second = {"singer_state": {"bookmarks": {"invoices": {"n": 1}}, "columns": [], "currently_syncing": None}}
    j = cli.run("merge", "id", json.dumps(second), "--json").json()
    assert j["completed"] == completed
    assert j["partial"] == {"singer_state": {
        "bookmarks": {"users": {"updated_at": "2024-03-03"}, "invoices": {"n": 1}},
        "columns": [],
        "currently_syncing": None}}
    assert j["merged"] == {"singer_state": {
        "bookmarks": {"users": {"updated_at": "2024-03-03", "version": 1}, "orders": {"id": 5},
                      "invoices": {"n": 1}},
        "currently_syncing": None,
        "columns": []}}
    assert cli.get_full("id") == j


def test_merge_into_absent_id_creates_partial_state(cli, tmp_path):
    f = tmp_path / "partial.json"
    f.write_text(json.dumps(STATE_A))
    cli.run("merge", "new", "--input-file", str(f))
    assert cli.get_full("new") == {"state_id": "new", "completed": {}, "partial": STATE_A, "merged": STATE_A}


def test_merge_requires_singer_state_and_refuses_empty_input(cli):
    cli.set("id", STATE_A)
    assert "singer_state" in cli.run("merge", "id", '{"x": 1}', expect=2).err
    assert "nothing to merge" in cli.run("merge", "id", "{}", "--force", expect=2).err
    assert cli.get("id") == STATE_A
    cli.run("merge", "id", '{"x": 1}', "--force")
    assert cli.get("id") == {**STATE_A, "x": 1}


def test_merge_from_state_id(cli):
    src_completed = {"singer_state": {"bookmarks": {"a": {"v": 1}, "b": {"v": 1}}}}
    src_partial = {"singer_state": {"bookmarks": {"a": {"v": 2}}}}
    cli.set("src", src_completed)
    cli.run("merge", "src", json.dumps(src_partial))
    src_merged = {"singer_state": {"bookmarks": {"a": {"v": 2}, "b": {"v": 1}}}}
    assert cli.get("src") == src_merged

    dst_completed = {"singer_state": {"bookmarks": {"b": {"v": 0, "old": True}, "c": {"v": 9}}}, "extra": [1]}
    cli.set("dst", dst_completed)
    cli.run("merge", "dst", "--from-state-id", "src")
    full = cli.get_full("dst")
    assert full["completed"] == dst_completed
    assert full["partial"] == src_merged
    assert full["merged"] == {"singer_state": {"bookmarks": {"a": {"v": 2}, "b": {"v": 1, "old": True},
                                                              "c": {"v": 9}}},
                              "extra": [1]}
    assert cli.get("src") == src_merged  # the source is untouched

    r = cli.run("merge", "dst", "--from-state-id", "missing", expect=3)
    assert "missing" in r.err
    assert cli.get_full("dst") == full


# ---- list ------------------------------------------------------------------------------

def test_list_patterns_escape_like_wildcards(cli):
    ids = ["dev:tap-a-to-target-b", "dev:tap-b-to-target-b", "prod:tap-a-to-target-b",
           "a_b1", "a_b2", "axb1", "aXb", "a%b", "a*b", "a?b", "100%", "1000", "back\\slash", "backXslash"]
    for state_id in ids:
        cli.set(state_id, STATE_A)

    def listed(pattern=None):
        args = ["--pattern", pattern] if pattern is not None else []
        return sorted(i.decode() for i in cli.list(*args))

    assert listed() == sorted(ids)
    assert listed("*") == sorted(ids)
    assert listed("dev:*") == ["dev:tap-a-to-target-b", "dev:tap-b-to-target-b"]
    assert listed("*:tap-a-*") == ["dev:tap-a-to-target-b", "prod:tap-a-to-target-b"]
    assert listed("a_b*") == ["a_b1", "a_b2"]          # `_` is literal, not LIKE's any-character
    assert listed("a%b") == ["a%b"]                     # `%` is literal, not LIKE's any-run
    assert listed("100%") == ["100%"]
    assert listed("*%") == ["100%"]
    assert listed("a?b") == sorted(["aXb", "a%b", "a*b", "a?b"])
    assert listed("a?b?") == sorted(["a_b1", "a_b2", "axb1"])
    assert listed("back\\slash") == ["back\\slash"]
    assert listed("nothing*") == []

    plain = cli.run("list", "--pattern", "dev:*").stdout
    assert plain == b"dev:tap-a-to-target-b\ndev:tap-b-to-target-b\n"
    assert cli.run("list", "--pattern", "a_b*", "--json").json() == {"state_ids": ["a_b1", "a_b2"]}


def test_list_options_before_the_command(cli):
    cli.set("x1", STATE_A)
    assert cli.run("--pattern", "x*", "--json", "list").json() == {"state_ids": ["x1"]}


# ---- clear ---------------------------------------------------------------------------------

def test_clear_one(cli):
    cli.set("a", STATE_A)
    cli.set("b", STATE_B)
    cli.run("clear", "a")
    cli.run("get", "a", expect=3)
    assert cli.list() == [b"b"]
    assert cli.run("clear", "b", "--json").json() == {"state_id": "b"}
    assert cli.list() == []
    cli.run("clear", "never-existed")


def test_clear_all_prints_count(cli):
    assert cli.run("clear", "--all").out == "0\n"
    for i in range(3):
        cli.set(f"id-{i}", STATE_A)
    assert cli.run("clear", "--all").out == "3\n"
    assert cli.list() == []
    cli.set("again", STATE_A)
    assert cli.run("--json", "clear", "--all").json() == {"cleared": 1}
    assert cli.run("clear", "--all", "--json").json() == {"cleared": 0}


# ---- copy / move -------------------------------------------------------------------------------

def test_copy(cli):
    cli.set("src", STATE_A)
    cli.run("merge", "src", json.dumps(STATE_B))
    before = cli.get_full("src")
    assert cli.run("copy", "src", "dst", "--json").json() == {"source": "src", "destination": "dst"}
    assert {**cli.get_full("dst"), "state_id": "src"} == before
    assert cli.get_full("src") == before
    cli.set("dst2", STATE_B)
    cli.run("copy", "src", "dst2")
    assert cli.get("dst2") == before["merged"]
    cli.run("copy", "missing", "dst", expect=3)


def test_move(cli):
    cli.set("src", STATE_A)
    cli.run("merge", "src", json.dumps(STATE_B))
    before = cli.get_full("src")
    cli.run("move", "src", "dst")
    cli.run("get", "src", expect=3)
    assert {**cli.get_full("dst"), "state_id": "src"} == before
    assert cli.list() == [b"dst"]
    cli.run("move", "src", "elsewhere", expect=3)
    cli.run("move", "dst", "dst", expect=2)
    assert cli.get_full("dst")["merged"] == before["merged"]


# ---- hostile state ids -----------------------------------------------------------------------------

HOSTILE_IDS = {
    "single-quote": "it's",
    "double-quote": 'say "hi"',
    "backslashes": "back\\slash\\\\end\\",
    "backtick": "`tick`",
    "sql-injection": "x'); DROP TABLE state; --",
    "drop-table": ";DROP TABLE meltano.state",
    "newlines": "line1\nline2\r\nline3\n",
    "tab": "tab\there",
    "tsv-null": "\\N",
    "like-wildcards": "100%_*?",
    "query-param": "{id:String}",
    "unicode": "ünïcødé 状态 🚀",
    "leading-space": " padded ",
    "long-100kb": "x" * (100 * 1024),
    "invalid-utf8": b"bad\xff\xfe\x80utf8\xc3",
}


@pytest.mark.parametrize("name", list(HOSTILE_IDS))
def test_hostile_id_round_trips_byte_exact(cli, name):
    state_id = HOSTILE_IDS[name]
    raw = state_id if isinstance(state_id, bytes) else state_id.encode()
    state = {"singer_state": {"id": name, "value": "it's \"quoted\" \\ `x`"}}
    cli.set(state_id, state)
    assert cli.get(state_id) == state
    assert cli.list() == [raw]
    assert raw in cli.list("--pattern", "*")

    cli.run("merge", state_id, json.dumps({"singer_state": {"more": 1}}))
    assert cli.get(state_id) == {"singer_state": {**state["singer_state"], "more": 1}}

    if not isinstance(state_id, bytes):
        assert cli.run("list", "--json").json() == {"state_ids": [state_id]}
        assert cli.get_full(state_id)["state_id"] == state_id
    if b"\n" not in raw:
        assert cli.run("list").stdout == raw + b"\n"

    cli.run("copy", state_id, "copy")
    cli.run("move", "copy", state_id + (b"-moved" if isinstance(state_id, bytes) else "-moved"))
    cli.run("clear", state_id)
    cli.run("get", state_id, expect=3)
    assert cli.list() == [raw + b"-moved"]


def test_id_beginning_with_dash_after_double_dash(cli):
    cli.run("set", "--", "-dash", json.dumps(STATE_A))
    assert cli.run("get", "--", "-dash").json() == STATE_A
    assert cli.list() == [b"-dash"]
    cli.run("get", "-dash", expect=2)


# ---- locks --------------------------------------------------------------------------------------------

def fnv1a64(text: str) -> int:
    h = 0xcbf29ce484222325
    for byte in text.encode():
        h = ((h ^ byte) * 0x100000001b3) & 0xFFFFFFFFFFFFFFFF
    return h


def lock_table(state_id: str) -> str:
    """The lock table core/statements.cc uses for `state_id` on the default
    state table: state_lock_<FNV-1a 64 of the id>."""
    return f"state_lock_{fnv1a64(state_id):016x}"


def tombstone(state_id: str, holder: str) -> str:
    """The name a takeover renames `holder`'s lock table to (Statements::TombstoneName)."""
    return f"{lock_table(state_id)}_dead_{fnv1a64('holder:' + holder):016x}"


def hold_lock(cli, state_id: str, stale_seconds: int = 300) -> None:
    """Takes the lock on `state_id` as another process would, with the
    statement of Statements::CreateLock. Tied to that statement on purpose:
    no command holds a lock long enough to contend with."""
    cli.run("init")
    cli.sql(f"CREATE TABLE `{cli.schema}`.`{lock_table(state_id)}` ENGINE = Log AS SELECT "
            f"'held-by-test' AS lock_id, toUInt8(0) AS seq, now() AS locked_at, "
            f"toUInt32({stale_seconds}) AS stale_s")


def test_meltano_lock_timeout_is_the_validity(cli):
    # MELTANO_STATE_BACKEND_LOCK_TIMEOUT_SECONDS means what Meltano says: how
    # long a lock stays valid (--stale-lock), with a floor of 1 s.
    env = cli.env(MELTANO_STATE_BACKEND_LOCK_TIMEOUT_SECONDS="0.5")
    r = cli.run("get", "x", env=env, expect=2)
    assert "MELTANO_STATE_BACKEND_LOCK_TIMEOUT_SECONDS is \"0.5\"" in r.err and "from 1 to a year" in r.err
    cli.set("valid", STATE_A)
    hold_lock(cli, "valid", stale_seconds=1)
    env = cli.env(MELTANO_STATE_BACKEND_LOCK_TIMEOUT_SECONDS="1",
                  MELTANO_STATE_BACKEND_CLICKHOUSE_LOCK_WAIT_SECONDS="10",
                  MELTANO_STATE_BACKEND_LOCK_RETRY_SECONDS="0.2")
    started = time.monotonic()
    cli.run("set", "valid", json.dumps(STATE_B), env=env)  # the 1 s lock is taken over, not waited out for 10 s
    assert time.monotonic() - started < 8
    assert cli.get("valid") == STATE_B


def test_held_lock_exits_4(cli):
    cli.set("busy", STATE_A)
    hold_lock(cli, "busy")
    r = cli.run("set", "busy", json.dumps(STATE_B), "--lock-timeout", "0.3", "--lock-retry", "0.1", expect=4)
    assert "locked" in r.err
    env = cli.env(MELTANO_STATE_BACKEND_CLICKHOUSE_LOCK_WAIT_SECONDS="0.2",
                  MELTANO_STATE_BACKEND_LOCK_RETRY_SECONDS="0.1")
    error = cli.run("merge", "busy", json.dumps(STATE_B), "--json", env=env, expect=4).json()["error"]
    assert error["exit_code"] == 4 and error["code"] == "ABORTED"
    cli.run("clear", "busy", "--lock-timeout", "0", expect=4)
    assert cli.get("busy") == STATE_A
    # Reads and other ids are not blocked.
    cli.set("free", STATE_B, "--lock-timeout", "0")
    cli.sql(f"DROP TABLE `{cli.schema}`.`{lock_table('busy')}`")
    cli.set("busy", STATE_B, "--lock-timeout", "0")
    assert cli.get("busy") == STATE_B


def test_stale_lock_is_taken_over(cli):
    cli.set("stale", STATE_A)
    hold_lock(cli, "stale", stale_seconds=1)
    # While it is fresh, the lock is honoured.
    r = cli.run("set", "stale", json.dumps(STATE_B), "--stale-lock", "1", "--lock-timeout", "0", expect=4)
    assert "locked by another process" in r.err
    # Time must pass (by design): the server counts the lock's age in whole
    # seconds, and it must exceed the 1 s window. Waited for on the server's clock.
    age = f"SELECT toInt64(now()) - toInt64(max(locked_at)) FROM `{cli.schema}`.`{lock_table('stale')}`"
    deadline = time.monotonic() + 10
    while int(cli.sql(age)) <= 1:
        assert time.monotonic() < deadline, "the lock's age never exceeded 1 s on the server's clock"
        time.sleep(0.05)
    cli.set("stale", STATE_B, "--stale-lock", "1", "--lock-timeout", "5")
    assert cli.get("stale") == STATE_B
    # It was a takeover: the test's lock table was renamed to its tombstone.
    assert cli.sql(f"SELECT lock_id FROM `{cli.schema}`.`{tombstone('stale', 'held-by-test')}`").split() == \
        ["held-by-test"]


# ---- configuration and connection failures ---------------------------------------------------------------

def test_missing_user_exits_2_naming_the_setting(cli):
    uri = f"clickhouse://{cli.server.host}:{cli.server.port}/default"
    r = cli.run("ping", uri=uri, expect=2)
    assert "MELTANO_STATE_BACKEND_CLICKHOUSE_USER" in r.err
    j = cli.run("ping", "--json", uri=uri, expect=2).json()
    assert "MELTANO_STATE_BACKEND_CLICKHOUSE_USER" in j["error"]["message"]


def test_missing_database_exits_2_naming_the_setting(cli):
    r = cli.run("ping", uri=f"clickhouse://{cli.server.user}@{cli.server.host}:{cli.server.port}", expect=2)
    assert "MELTANO_STATE_BACKEND_CLICKHOUSE_DATABASE" in r.err


def test_settings_from_environment_only(cli):
    env = cli.env(MELTANO_STATE_BACKEND_CLICKHOUSE_HOST=cli.server.host,
                  MELTANO_STATE_BACKEND_CLICKHOUSE_PORT=str(cli.server.port),
                  MELTANO_STATE_BACKEND_CLICKHOUSE_USER=cli.server.user,
                  MELTANO_STATE_BACKEND_CLICKHOUSE_DATABASE="default")
    cli.run("set", "env-only", json.dumps(STATE_A), uri=None, env=env)
    assert cli.get("env-only") == STATE_A


def test_settings_from_flags_only(cli):
    flags = ["--host", cli.server.host, "--port", str(cli.server.port), "--user", cli.server.user,
             "--database", "default", "--table", "custom_state"]
    cli.run(*flags, "set", "flags-only", json.dumps(STATE_A), uri=None)
    assert cli.run(*flags, "get", "flags-only", uri=None).json() == STATE_A
    assert "table=custom_state" in cli.run(*flags, "ping", "--json", uri=None).json()["uri"]
    assert cli.list() == []  # the default table is another table


def test_generic_schema_and_table_variables_are_the_lowest_level(cli):
    # CLICKHOUSE_TABLE moves where state lives (the settings table's generic level)...
    env = cli.env(CLICKHOUSE_TABLE="generic_state")
    cli.run("set", "generic", json.dumps(STATE_A), env=env)
    assert cli.run("get", "generic", env=env).json() == STATE_A
    assert "table=generic_state" in cli.run("ping", "--json", env=env).json()["uri"]
    assert cli.list() == []  # not in the default table
    # ...and CLICKHOUSE_SCHEMA too, below the Meltano-scoped variable.
    env = cli.env(CLICKHOUSE_SCHEMA="elsewhere", CLICKHOUSE_TABLE="generic_state")
    assert cli.run("get", "generic", env=env).json() == STATE_A  # MELTANO_..._SCHEMA (the test's) wins
    env = cli.env(MELTANO_STATE_BACKEND_CLICKHOUSE_SCHEMA=None, CLICKHOUSE_SCHEMA=cli.schema,
                  CLICKHOUSE_TABLE="generic_state")
    assert cli.run("get", "generic", env=env).json() == STATE_A


def test_password_in_uri_environment_is_never_shown(cli):
    password = cli.server.password or "unused"
    uri = f"clickhouse://{cli.server.user}:{password}@{cli.server.host}:{cli.server.port}/default"
    env = cli.env(MELTANO_STATE_BACKEND_URI=uri, MELTANO_STATE_BACKEND_CLICKHOUSE_PASSWORD=None)
    r = cli.run("ping", uri=None, env=env, expect=0 if cli.server.password else None)
    if cli.server.password:
        assert ":***@" in r.out


def test_unreachable_server_exits_5(cli):
    port = free_port()
    r = cli.run("ping", "--port", str(port), "--connect-timeout", "2", expect=5)  # --port wins over --uri
    assert f"127.0.0.1:{port}" in r.err
    assert "ClickHouse" in r.err
    uri = f"clickhouse://{cli.server.user}@127.0.0.1:{port}/default"
    error = cli.run("get", "x", "--json", uri=uri, expect=5).json()["error"]
    assert error["exit_code"] == 5 and error["code"] == "UNAVAILABLE"
    cli.run("set", "x", json.dumps(STATE_A), uri=uri, expect=5)


@pytest.mark.parametrize("how", ["env", "flag", "uri"])
def test_wrong_password_exits_6_without_showing_it(cli, how):
    wrong = "wr0ng-Pa55word-for-test"
    env = cli.env(MELTANO_STATE_BACKEND_CLICKHOUSE_PASSWORD=wrong if how == "env" else None)
    args = ["--password", wrong] if how == "flag" else []
    uri = (f"clickhouse://{cli.server.user}:{wrong}@{cli.server.host}:{cli.server.port}/default"
           if how == "uri" else "default")
    for command in (["ping"], ["get", "x"], ["list", "--json"]):
        r = cli.run(*command, *args, env=env, uri=uri, expect=6, secrets=(wrong,))
        assert "password" in (r.err + r.out)


def test_wrong_user_exits_6(cli):
    uri = f"clickhouse://nobody_here@{cli.server.host}:{cli.server.port}/default"
    cli.run("ping", uri=uri, expect=6)


# ---- --json everywhere -----------------------------------------------------------------------------------

def test_every_command_has_json_output(cli):
    outputs = [
        cli.run("--json", "init"),
        cli.run("--json", "ping"),
        cli.run("--json", "set", "a", json.dumps(STATE_A)),
        cli.run("--json", "merge", "a", json.dumps(STATE_B)),
        cli.run("--json", "get", "a"),
        cli.run("--json", "copy", "a", "b"),
        cli.run("--json", "move", "b", "c"),
        cli.run("--json", "list"),
        cli.run("--json", "clear", "a"),
        cli.run("--json", "clear", "--all"),
        cli.run("--json", "get", "a", expect=3),
    ]
    for r in outputs:
        assert isinstance(r.json(), dict), r.args
        assert r.stdout.count(b"\n") == 1 and r.stdout.endswith(b"\n")
        assert r.stderr == b""


# ---- -v / -vv: what the store tells on stderr (docs/diagnostics.md) --------------------------------------

def test_help_lists_the_verbose_flags(cli):
    out = cli.run("--help", uri=None).out
    for flag in ("-v, --verbose", "--log-format FORMAT", "--show-states"):
        assert flag in out
    assert "-vv" in out
    r = cli.run("-v", "--log-format", "yaml", "get", "x", expect=2)
    assert "--log-format must be text or json" in r.err


def test_verbose_tells_a_wait_for_a_lock_another_process_holds(cli, tmp_path):
    started, release = tmp_path / "started", tmp_path / "release"
    holder = subprocess.Popen([str(cli.binary), "--uri", cli.uri, "lock", "busy", "--", "sh", "-c",
                               f"touch {started}; while [ ! -e {release} ]; do sleep 0.02; done"],
                              env=cli.env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 20
        while not started.exists():
            assert time.monotonic() < deadline, "the holder never took the lock"
            time.sleep(0.02)
        waiter = subprocess.Popen([str(cli.binary), "--uri", cli.uri, "-v", "--lock-retry", "0.2", "set", "busy",
                                   json.dumps(STATE_A)], env=cli.env(), stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE)
        # Told while it waits, not at the end: the first line arrives with the lock still held.
        first = waiter.stderr.readline().decode()
        assert first.startswith('chstate: info: waiting for the lock on "busy": another process (lock '), first
        assert "stays valid up to" in first and "next try in 200 ms" in first
        release.touch()
        rest = waiter.communicate(timeout=60)[1].decode()
        assert waiter.returncode == 0, rest
        assert 'chstate: info: acquired the lock on "busy" after ' in rest
        assert all(line.startswith("chstate: info: ") for line in rest.splitlines()), rest
    finally:
        release.touch()
        holder.wait(timeout=30)
    assert cli.get("busy") == STATE_A


def test_vv_tells_each_statement_with_its_time_and_no_state_contents(cli):
    state = {"singer_state": {"bookmarks": {"users": {"token_like": "bm-2026-12-05-q7"}}}}
    quiet = cli.set("s", state)
    assert quiet.stderr == b""  # nothing without -v
    r = cli.run("-vv", "set", "s", json.dumps(state))
    lines = r.err.splitlines()
    assert lines and all(line.startswith(("chstate: debug: ", "chstate: info: ")) for line in lines), r.err
    inserts = [line for line in lines if "INSERT INTO" in line and "insert_state" in line]
    assert len(inserts) == 1, r.err
    size = len(json.dumps(state, separators=(",", ":"), sort_keys=True))
    assert f"'<state: {size} bytes>'" in inserts[0]
    assert re.search(r"insert_state \(attempt 1\): ok in \d+ ms: INSERT INTO ", inserts[0]), inserts[0]
    assert "bm-2026-12-05-q7" not in r.err
    # -v alone: no statements.
    r = cli.run("-v", "get", "s")
    assert "SELECT" not in r.err and "debug" not in r.err
    # --show-states keeps them, on purpose.
    r = cli.run("-vv", "--show-states", "set", "s", json.dumps(state))
    assert "bm-2026-12-05-q7" in r.err


def test_log_format_json_gives_one_event_per_line(cli):
    r = cli.run("-vv", "--log-format", "json", "set", "j\x01", json.dumps(STATE_A))
    events = [json.loads(line) for line in r.err.splitlines()]
    assert events
    for e in events:
        assert set(e) >= {"kind", "level", "at_ms", "message", "line", "numbers", "texts"}, e
        assert e["level"] in ("warning", "info", "debug")
    statements = [e for e in events if e["kind"] == "statement"]
    assert {"select_version", "insert_state"} <= {e["texts"]["purpose"] for e in statements}
    insert = next(e for e in statements if e["texts"]["purpose"] == "insert_state")
    assert insert["line"] == insert["message"] + ": " + insert["texts"]["sql"]
    assert isinstance(insert["numbers"]["took_ms"], int)
    acquired = [e for e in events if e["kind"] == "lock_acquired"]
    assert acquired and acquired[0]["state_id"] == "j\\x01"  # printable
    assert r.out == ""  # stdout keeps the result alone
