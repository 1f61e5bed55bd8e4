"""State history through real Meltano: every `meltano state set` and every
STATE message of a `meltano run` is a version; the adapter's history() and
rollback() (the core's ops); state_backend.<scheme>.history_days."""

from __future__ import annotations

import json
import time

from test_adapter import run


def tables(project) -> set:
    return set(project.server.sql(f"SHOW TABLES FROM `{project.schema}`").split())


def test_meltano_writes_are_versions_and_rollback_restores_one(project):
    p = project
    for n in (1, 2):
        p.run("state", "set", "--force", "dev:a", json.dumps({"singer_state": {"n": n}}))
        time.sleep(1.05)  # whole seconds on 18.16: one version per second keeps the order known
    assert {"state_history", "state_history_buffer", "state_history_buffer_mv"} <= tables(p)
    lines = run(p, """
        m = make()
        versions = m.history("dev:a")
        print(">", [(v["current"], v["state"].completed_state) for v in versions])
        restored = m.rollback("dev:a", versions[1]["version"])
        print(">", restored.completed_state, m.get("dev:a").completed_state)
        print(">", [v["state"].completed_state["singer_state"]["n"] for v in m.history("dev:a", limit=2)])
        try:
            m.rollback("dev:a", "yesterday")
        except ChstateStateBackendError as e:
            print(">", e.code, "Give a version as history() lists it" in str(e))
        try:
            m.rollback("dev:a", versions[0]["version"].split("-")[0] + "-00000000")
        except ChstateStateBackendError as e:
            print(">", e.code)
    """)
    assert lines[0] == "[(True, {'singer_state': {'n': 2}}), (False, {'singer_state': {'n': 1}})]"
    assert lines[1] == "{'singer_state': {'n': 1}} {'singer_state': {'n': 1}}"
    assert lines[2] == "[1, 2]"
    assert lines[3] == "INVALID_ARGUMENT True"
    assert lines[4] == "NOT_FOUND"
    assert json.loads(p.run("state", "get", "dev:a").stdout) == {"singer_state": {"n": 1}}


def test_history_days_zero_creates_no_history(project):
    p = project
    env = p.env(MELTANO_STATE_BACKEND_CLICKHOUSE_HISTORY_DAYS="0")
    p.run("state", "set", "--force", "dev:a", json.dumps({"singer_state": {}}), env=env)
    assert tables(p) == {"state", "state_lock"}
    out = p.run("state", "get", "dev:a", env=p.env(MELTANO_STATE_BACKEND_CLICKHOUSE_HISTORY_DAYS="-1"), expect=1)
    assert "state_backend.clickhouse.history_days" in out.stderr


def test_a_run_leaves_a_version_per_state_message(project):
    p = project
    out = p.run("run", "tap-counter", "target-echo", env=p.env(TAP_COUNTER_TOTAL="4", TAP_COUNTER_STATE_EVERY="1"))
    updates = out.stderr.count("Incremental state has been updated")
    assert updates == 4
    count = p.server.sql(f"SELECT count() FROM `{p.schema}`.state_history_buffer "
                         "WHERE state_id = 'dev:tap-counter-to-target-echo'").strip()
    assert int(count) == updates


def test_python_locks_yield_to_a_python_backend_holder(project):
    """A mixed fleet is safe by default: chstate honours the Python backend's
    live row in <table>_lock (here written the way that backend writes it)
    and names it, with state_backend.clickhouse.python_locks and without it
    (the setting decides whether chstate also shows itself there)."""
    p = project
    p.run("state", "set", "--force", "dev:a", json.dumps({"singer_state": {"n": 1}}))
    p.server.sql(f"INSERT INTO `{p.schema}`.state_lock (state_id, lock_id) VALUES ('dev:a', 'py-holder-1')")
    env = p.env(MELTANO_STATE_BACKEND_CLICKHOUSE_PYTHON_LOCKS="true", MELTANO_STATE_BACKEND_LOCK_TIMEOUT_SECONDS="3",
                MELTANO_STATE_BACKEND_CLICKHOUSE_LOCK_WAIT_SECONDS="2")
    out = p.run("state", "merge", "dev:a", json.dumps({"singer_state": {"m": 2}}), env=env, expect=1)
    assert "Python ClickHouse backend" in out.stderr and "py-holder-1" in out.stderr
    assert json.loads(p.run("state", "get", "dev:a").stdout) == {"singer_state": {"n": 1}}
    # The setting off: the row is still honoured.
    off = p.env(MELTANO_STATE_BACKEND_LOCK_TIMEOUT_SECONDS="3", MELTANO_STATE_BACKEND_CLICKHOUSE_LOCK_WAIT_SECONDS="2")
    out = p.run("state", "merge", "dev:a", json.dumps({"singer_state": {"m": 2}}), env=off, expect=1)
    assert "Python ClickHouse backend" in out.stderr and "py-holder-1" in out.stderr
    assert json.loads(p.run("state", "get", "dev:a").stdout) == {"singer_state": {"n": 1}}
    p.server.sql(f"ALTER TABLE `{p.schema}`.state_lock DELETE WHERE lock_id = 'py-holder-1'")
    deadline = time.monotonic() + 20
    while p.server.sql(f"SELECT count() FROM `{p.schema}`.state_lock WHERE lock_id = 'py-holder-1'").strip() != "0":
        assert time.monotonic() < deadline
        time.sleep(0.1)
    p.run("state", "merge", "dev:a", json.dumps({"singer_state": {"k": 3}}), env=env)
    assert json.loads(p.run("state", "get", "dev:a").stdout)["singer_state"]["k"] == 3
