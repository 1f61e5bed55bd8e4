"""The native `chstate` CLI (hosts/native, cpp-httplib transport) against the
modern engine behind the front: every command end to end, a hostile state id,
the lock command, and a wrong password."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

from support import HOSTILE_ID, ODD_VALUE, check_modern, version_is_modern

STATE_A = {"singer_state": {"bookmarks": {"users": {"updated_at": "2026-11-01", "odd": ODD_VALUE}}}}
PARTIAL = {"singer_state": {"bookmarks": {"orders": {"id": 7}}}}
PASSWORD_VAR = "MELTANO_STATE_BACKEND_CLICKHOUSE_PASSWORD"


def _integration_runner():
    """tests/integration's CLI runner (Chstate, in its conftest.py). Loaded from
    its file under a name of its own: every conftest.py is module `conftest`."""
    path = Path(__file__).resolve().parents[1] / "integration" / "conftest.py"
    spec = importlib.util.spec_from_file_location("integration_conftest", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # (its dataclass looks itself up there)
    spec.loader.exec_module(module)
    return module.Chstate


Chstate = _integration_runner()


@pytest.fixture
def cli(chstate_bin, fresh, schema):
    """`chstate --uri clickhouse://USER@HOST:PORT/default ARGS` against the front, the
    password and schema in the environment, never in argv; checks no output holds it."""
    return Chstate(chstate_bin, fresh, schema)


def rows(front, schema: str) -> int:
    return int(front.sql(f"SELECT count() FROM `{schema}`.state").decode())


def test_ping_and_init_choose_the_modern_dialect(cli, fresh):
    ping = cli.run("ping", "--json").json()
    assert ping["server_version"] == fresh.version and version_is_modern(ping["server_version"])
    assert ping["dialect"] == "modern"
    init = cli.run("init", "--json").json()
    assert (init["dialect"], init["schema"], init["server_version"]) == ("modern", cli.schema, fresh.version)
    check_modern(fresh.take(), writes=False, creates=True)
    tables = fresh.sql("SELECT name, engine FROM system.tables WHERE database = {d:String} ORDER BY name",
                       d=cli.schema).decode().splitlines()
    assert any(t.startswith("state\t") and "MergeTree" in t for t in tables), tables
    cols = fresh.sql("SELECT type FROM system.columns WHERE database = {d:String} AND table = 'state' "
                     "AND type LIKE 'DateTime64%'", d=cli.schema)
    assert cols.strip() == b"DateTime64(3)"


def test_set_get_merge_list_clear(cli, fresh):
    cli.run("set", "dev:a", json.dumps(STATE_A))
    first = fresh.take()
    assert len(first) >= 3 and len({r.peer for r in first}) == 1, "one `chstate set` did not keep its connection"
    assert cli.run("get", "dev:a").json() == STATE_A
    assert rows(fresh, cli.schema) >= 1  # it is really in the engine
    cli.run("merge", "dev:a", json.dumps(PARTIAL))
    full = cli.run("get", "dev:a", "--json").json()
    assert full["completed"] == STATE_A and full["partial"] == PARTIAL
    merged = {"singer_state": {"bookmarks": {**STATE_A["singer_state"]["bookmarks"], "orders": {"id": 7}}}}
    assert cli.run("get", "dev:a").json() == merged == full["merged"]

    # A write that repeats an earlier one (A, B, A) must land (dedup tokens).
    state_b = {"singer_state": {"n": 2}}
    for state in (STATE_A, state_b, STATE_A):
        cli.run("set", "dev:b", json.dumps(state))
    assert cli.run("get", "dev:b").json() == STATE_A
    cli.run("set", "prod:c", json.dumps(state_b))
    assert cli.list() == [b"dev:a", b"dev:b", b"prod:c"]
    assert cli.list("--pattern", "dev:*") == [b"dev:a", b"dev:b"]
    assert cli.list("--pattern", "prod:?") == [b"prod:c"]

    cli.run("clear", "dev:a")
    cli.run("get", "dev:a", expect=3)
    assert cli.list() == [b"dev:b", b"prod:c"]
    cleared = cli.run("clear", "--all", "--json").json()
    assert cleared == {"cleared": 2}
    assert cli.list() == []
    cli.run("get", "dev:b", expect=3)
    records = fresh.take()
    check_modern(records)
    assert any(r.sql.lstrip().upper().startswith("DELETE FROM") for r in records), "no lightweight DELETE"


def test_hostile_state_id_round_trips_byte_for_byte(cli, fresh):
    raw = HOSTILE_ID.encode()
    state = {"singer_state": {"id": HOSTILE_ID, "value": ODD_VALUE}}
    cli.run("set", "--", HOSTILE_ID, json.dumps(state))
    got = cli.run("get", "--json", "--", HOSTILE_ID).json()
    assert got["state_id"] == HOSTILE_ID and got["completed"] == state
    assert cli.list() == [raw]
    assert cli.list("--pattern", HOSTILE_ID) == [raw]  # its own ? * % _ as a glob match it
    stored = fresh.sql(f"SELECT hex(state_id) FROM `{cli.schema}`.state").decode().split()
    assert raw.hex().upper() in stored
    cli.run("copy", "--", HOSTILE_ID, "dev:copy")
    assert cli.run("get", "dev:copy").json() == state
    cli.run("clear", "--", HOSTILE_ID)
    cli.run("get", "--", HOSTILE_ID, expect=3)
    assert cli.list() == [b"dev:copy"]
    check_modern(fresh.take())


def test_lock_command_holds_the_lock(cli, fresh):
    # Inside `chstate lock ID -- CMD`, a set of the same id by another process
    # waits for the lock and gives up (exit 4); the command's exit code passes
    # through, and the lock is free afterwards.
    cli.run("set", "dev:locked", json.dumps(STATE_A))
    inner = (f"{cli.binary} --uri {cli.uri} --lock-timeout 1 --lock-retry 0.2 set dev:locked "
             "'{\"singer_state\": {\"intruder\": 1}}'; echo \"inner=$?\"; exit 9")
    r = cli.run("lock", "dev:locked", "--", "sh", "-c", inner, expect=9)
    assert "inner=4" in r.out, r.out + r.err
    assert cli.run("get", "dev:locked").json() == STATE_A
    cli.run("set", "dev:locked", json.dumps(PARTIAL))  # the lock was released
    assert cli.run("get", "dev:locked").json() == PARTIAL
    records = fresh.take()
    check_modern(records)
    assert any(r.code == 57 for r in records), "the waiting set never met the held lock (code 57)"
    ttl = [r.sql for r in records if r.sql.lstrip().startswith("CREATE TABLE") and "TTL" in r.sql]
    assert ttl, "lock tables were created without a TTL"


def test_wrong_password_fails_clearly_without_showing_it(cli, fresh):
    wrong = "wrong-pw-" + fresh.password[::-1][:12]
    r = cli.run("get", "dev:a", expect=6, env=cli.env(**{PASSWORD_VAR: wrong}), secrets=(wrong,))
    assert "516" in r.err or "login" in r.err.lower() or "password" in r.err.lower(), r.err
    j = cli.run("--json", "ping", expect=6, env=cli.env(**{PASSWORD_VAR: wrong}), secrets=(wrong,)).json()
    assert j["error"]["exit_code"] == 6 and j["error"]["code"] == "UNAUTHENTICATED", j
    records = fresh.take()
    assert records and all(x.status == 403 and x.code == 516 for x in records)
