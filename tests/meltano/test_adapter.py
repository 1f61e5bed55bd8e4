"""The StateStoreManager itself, constructed the way Meltano constructs it
(keyword arguments, unset ones as None), run in the test venv's Python:
construction without I/O, settings, Meltano's get/set contract, the lock."""

from __future__ import annotations

import json
import textwrap

PRELUDE = """
import json, os, sys, time, threading
from meltano.core.state_store.base import MeltanoState, StateIDLockedError
from chstate_meltano.backend import (ClickhouseStateStoreManager, ChstateStateBackendError,
                                     ChstateSettingsError)
URI = os.environ["T_URI"]
PASSWORD = os.environ.get("T_PASSWORD", "")
SCHEMA = os.environ["T_SCHEMA"]

def make(uri=None, **overrides):
    kwargs = dict(uri=uri or URI, lock_timeout_seconds=10, lock_retry_seconds=1, host=None, port=None,
                  database=None, user=None, password=PASSWORD, secure=None, schema=SCHEMA, table=None)
    kwargs.update(overrides)
    return ClickhouseStateStoreManager(**kwargs)
"""


def run(project, body: str) -> list:
    """Runs PRELUDE + body in the venv; returns the lines it printed that
    start with '>' (Meltano's own logging goes to stdout too)."""
    env = project.env(T_URI=project.server.uri(), T_PASSWORD=project.server.password, T_SCHEMA=project.schema)
    out = project.python(PRELUDE + textwrap.dedent(body), env=env)
    return [line[1:].strip() for line in out.stdout.splitlines() if line.startswith(">")]


def test_construction_does_no_io_and_never_shows_the_password(project):
    lines = run(project, """
        uri = "clickhouse://u:hunter2-secret@127.0.0.1:1/default"
        t0 = time.monotonic()
        ms = [make(uri=uri, password=None) for _ in range(50)]   # Meltano builds it several times
        print(">", time.monotonic() - t0 < 5)
        m = ms[0]
        print(">", "hunter2" not in m.label and "hunter2" not in repr(m), m.label)
        try:
            m.get("dev:x")
        except ChstateStateBackendError as e:
            print(">", e.code, "hunter2" not in str(e), "connection refused (127.0.0.1:1)" in str(e))
    """)
    assert lines[0] == "True"
    assert lines[1].startswith("True ClickHouse via chstate (clickhouse://u:***@127.0.0.1:1/default")
    assert lines[2] == "UNAVAILABLE True True"


def test_settings_errors_name_meltanos_settings(project):
    lines = run(project, """
        for uri, kw in [("clickhouse://127.0.0.1:8123/default", {}),
                        ("clickhouse://me:hunter2@127.0.0.1:8123", {}),
                        ("clickhouse://me@127.0.0.1/default", {"port": "eighty"}),
                        ("clickhouse://me@127.0.0.1/default", {"schema": "no-dashes"}),
                        ("mysql://me@127.0.0.1/default", {}),
                        ("clickhouse://me@127.0.0.1/default", {"cluster": "c", "quorum": 1}),
                        ("clickhouse://me@127.0.0.1/default", {"quorum": 3})]:
            try:
                make(uri=uri, password=None, **kw)
                print("> constructed", uri)
            except ChstateSettingsError as e:
                print(">", e.code, "hunter2" not in str(e), str(e))
    """)
    assert len(lines) == 7 and all(line.startswith("INVALID_ARGUMENT True") for line in lines), lines
    assert "state_backend.clickhouse.user" in lines[0] and "MELTANO_STATE_BACKEND_CLICKHOUSE_USER" in lines[0]
    assert "--user" not in lines[0] and "CLICKHOUSE_USER or" not in lines[0]
    assert "database" in lines[1]
    assert "state_backend.clickhouse.port" in lines[2]
    assert "schema" in lines[3]
    assert "scheme" in lines[4]
    assert "state_backend.clickhouse.quorum is \"1\"" in lines[5] and "at least 2" in lines[5]
    assert "state_backend.clickhouse.quorum" in lines[6] and "needs cluster mode" in lines[6]


def test_granular_settings_override_the_uri(project):
    s = project.server
    lines = run(project, f"""
        m = make(uri="clickhouse://nobody@198.51.100.1:1/nowhere", host={s.host!r}, port={s.port},
                 user={s.user!r}, database="default", secure=False)
        print(">", m.label)
        print(">", m.get("dev:absent"))
        print(">", list(m.get_state_ids()))
    """)
    assert lines[0] == (f"ClickHouse via chstate (clickhouse://{s.user}:***@{s.host}:{s.port}/default"
                        f"?secure=false&schema={project.schema}&table=state)")
    assert lines[1:] == ["None", "[]"]


def test_get_set_delete_contract(project):
    lines = run(project, """
        m = make()
        weird = "dev:nul\\x00 newline\\n é 🙂 'q' \\\\ %_"
        m.set(MeltanoState(weird, partial_state=None, completed_state={"singer_state": {"a": 1}}))
        got = m.get(weird)
        print(">", json.dumps([got.state_id == weird, got.partial_state, got.completed_state]))
        m.set(MeltanoState("dev:p", partial_state={"singer_state": {"b": 2}}, completed_state=None))
        got = m.get("dev:p")
        print(">", json.dumps([got.partial_state, got.completed_state]))
        print(">", json.dumps(sorted(m.get_state_ids()) == sorted([weird, "dev:p"])))
        print(">", json.dumps([s.state_id == weird for s in m.get_all("dev:nul*")]))
        print(">", m.set_all([MeltanoState("x:1", {}, {"a": 1}), MeltanoState("x:2", {}, {"b": 2})]))
        m.delete(weird)
        print(">", m.get(weird), m.clear_all())
        m.close(); m.close()
        print(">", m.get("x:1"))   # usable again after close: reconnects lazily
    """)
    assert json.loads(lines[0]) == [True, {}, {"singer_state": {"a": 1}}]
    assert json.loads(lines[1]) == [{"singer_state": {"b": 2}}, {}]
    assert lines[2] == "true"
    assert lines[3] == "[true]"
    assert lines[4] == "2"
    assert lines[5] == "None 3"
    assert lines[6] == "None"


def test_lock_times_out_with_state_id_locked_error_and_is_released_on_errors(project):
    lines = run(project, """
        # lock_timeout_seconds is the lock's validity (Meltano's meaning); the
        # wait is lock_wait_seconds.
        holder, contender = make(), make(lock_wait_seconds=1.5, lock_retry_seconds=0.5)
        with holder.acquire_lock("dev:l", retry_seconds=1):
            t0 = time.monotonic()
            try:
                with contender.acquire_lock("dev:l", retry_seconds=1):
                    print("> acquired a held lock")
            except StateIDLockedError as e:
                print(">", "locked", round(time.monotonic() - t0) , "dev:l" in str(e))
        # An exception inside the body still releases the lock, and is the one raised.
        try:
            with holder.acquire_lock("dev:l", retry_seconds=1):
                raise KeyError("boom")
        except KeyError:
            print("> body error propagated")
        t0 = time.monotonic()
        with contender.acquire_lock("dev:l", retry_seconds=1):
            print(">", "free", time.monotonic() - t0 < 1)
        # Meltano's update() runs get and set under the lock.
        contender.update(MeltanoState("dev:l", {"singer_state": {"p": 1}}, {}))
        contender.update(MeltanoState("dev:l", {"singer_state": {"q": 2}}, {}))
        print(">", json.dumps(contender.get("dev:l").partial_state))
    """)
    assert lines[0] in ("locked 1 True", "locked 2 True"), lines
    assert lines[1] == "body error propagated"
    assert lines[2] == "free True"
    assert json.loads(lines[3]) == {"singer_state": {"p": 1, "q": 2}}
    tables = project.server.sql(f"SHOW TABLES FROM `{project.schema}`").split()
    assert [t for t in tables if t.startswith("state_lock_")] == []


def test_long_hold_is_renewed_and_not_taken_over(project):
    # A 4 s validity (lock_timeout_seconds): held 6 s with operations in between, the lock is
    # renewed (every stale/3) and a contender must still give up. The sleeps
    # are time that must pass (by design): past the window, only renewal
    # keeps the lock; without it the contender would print "taken over".
    lines = run(project, """
        holder = make(lock_timeout_seconds=4)
        contender = make(lock_timeout_seconds=4, lock_wait_seconds=1, lock_retry_seconds=0.25)
        with holder.acquire_lock("dev:long", retry_seconds=1):
            for _ in range(4):
                time.sleep(1.5)
                holder.get("dev:long")          # renews when due
            try:
                with contender.acquire_lock("dev:long", retry_seconds=1):
                    print("> taken over")
            except StateIDLockedError:
                print("> still held")
            holder.set(MeltanoState("dev:long", {}, {"singer_state": {"ok": True}}))
        print(">", json.dumps(contender.get("dev:long").completed_state))
    """)
    assert lines == ["still held", json.dumps({"singer_state": {"ok": True}})]


def test_lock_validity_has_a_floor_named_at_construction(project):
    lines = run(project, """
        try:
            make(lock_timeout_seconds=0.5)
        except ChstateSettingsError as e:
            print(">", e)
        m = make(lock_timeout_seconds=1, lock_wait_seconds=0)
        print(">", "ok")
    """)
    # The core's resolver names the Meltano setting, the value and the range.
    assert ('state_backend.lock_timeout_seconds is "0.5"' in lines[0] and "from 1 to a year" in lines[0]), lines
    assert lines[1] == "ok"


def test_a_missing_library_is_named_before_any_setting_is_checked(project):
    env = project.env(T_URI=project.server.uri(), T_PASSWORD="", T_SCHEMA=project.schema,
                      CHSTATE_LIBRARY="/nonexistent/libchstate.so")
    out = project.python(PRELUDE + textwrap.dedent("""
        try:
            make(lock_timeout_seconds=5)
        except ChstateStateBackendError as e:
            print(">", type(e).__name__, e)
    """), env=env)
    lines = [line[1:].strip() for line in out.stdout.splitlines() if line.startswith(">")]
    assert lines and lines[0].startswith("ChstateStateBackendError") and "native library" in lines[0], lines
