"""Both WebAssembly hosts against the real ClickHouse 18.16 server (and, run
by tools/test, the modern engine behind tools/chdb_http.py), through the
binding of the core's verb table:
- wasmtime (PyPI): hosts/wasi/chstate_wasmtime.py, whose core runs the Python
  binding (chstate_meltano.binding: methods from the verb table, store.lock());
- Node (node:wasi): hosts/wasi/chstate_wasi.mjs over the JS binding
  (chstate_binding.mjs: methods from the table in camelCase, withLock), run by
  tests/wasi/node_runner.mjs, one result per case.
Each: every verb's method against the server, a store opened in one call,
a second store refused while a lock scope holds the id, and a lock scope
whose code runs three validities long while the chstate command tries to
take the id (it must not get it)."""

from __future__ import annotations

import logging
import re
import uuid
from pathlib import Path

import pytest

import chstate_wasmtime
from chstate_wasmtime import ChstateError, ChstateModule, Store, WasmtimeCore
from py_binding_checks import STATE, every_verb, missing_methods, scope_keeps_its_lock

REPO = Path(__file__).resolve().parents[2]
NODE_CASES = ["one_call_open", "every_verb_has_a_method", "every_verb", "second_store_refused",
              "scope_keeps_its_lock", "events_reach_on_event", "closed_port_is_unavailable", "cleanup"]
ODD_ID = "dev:py-\u00e9\x00'`%_*"


def settings(server, schema: str, **extra) -> dict:
    return {"uri": server.uri(), "password": server.password, "schema": schema, **extra}


@pytest.fixture()
def schema(clickhouse):
    name = f"wasi_py_{uuid.uuid4().hex[:8]}"
    yield name
    clickhouse.sql(f"DROP DATABASE IF EXISTS {name}")


def new_store(compiled, server, schema: str, **extra) -> Store:
    core = WasmtimeCore(ChstateModule(engine=compiled[0], module=compiled[1]))
    return Store(core, settings(server, schema, **extra), env={})


@pytest.fixture()
def py_store(compiled, clickhouse, schema):
    store = new_store(compiled, clickhouse, schema, lock_timeout_seconds=1.5, lock_retry_seconds=0.1)
    yield store
    store.close()


def test_wasmtime_every_verb_has_a_method(py_store):
    verbs = py_store._core.verbs()
    assert {v["name"] for v in verbs} >= {"get", "set", "merge", "acquire", "release"}, verbs
    assert missing_methods(py_store, verbs) == []
    assert callable(py_store.lock)


def test_wasmtime_every_verb(py_store):
    ran = every_verb(py_store, ODD_ID)
    table = {v["name"] for v in py_store._core.verbs()}
    assert ran == table - {"acquire", "release"}, table ^ ran


def test_wasmtime_one_call_open(wasm_path, clickhouse, schema):
    store = chstate_wasmtime.open(clickhouse.uri(), wasm=wasm_path, password=clickhouse.password, schema=schema,
                                  history_versions=3, env={})
    try:
        assert store.settings["store"]["schema"] == schema and store.settings["store"]["history_versions"] == 3
        assert clickhouse.password not in repr(store) and clickhouse.password not in store.redacted_uri
        store.init()
        store.set("dev:open", STATE)
        assert store.get("dev:open")["merged"] == STATE
    finally:
        store.close()
    # A setting the core does not know is refused, naming it; so is a missing module.
    with pytest.raises(ChstateError) as e:
        chstate_wasmtime.open(clickhouse.uri(), wasm=wasm_path, stale_lock=30, env={})
    assert e.value.code == "INVALID_ARGUMENT" and "lock_timeout_seconds" in e.value.message
    with pytest.raises(ChstateError) as e:
        chstate_wasmtime.open(clickhouse.uri(), wasm=REPO / "no.wasm", env={})
    assert e.value.code == "NOT_FOUND" and "bazel build --config=wasi" in e.value.message


def test_wasmtime_second_store_refused_while_a_scope_holds(compiled, clickhouse, schema, py_store):
    py_store.init()
    other = new_store(compiled, clickhouse, schema, lock_wait_seconds=0.3, lock_retry_seconds=0.1)
    try:
        with py_store.lock(ODD_ID):
            with pytest.raises(ChstateError) as refused:
                with other.lock(ODD_ID):
                    pass
            assert refused.value.code == "ABORTED"
            # and a write of the other store, which takes the id's lock, is refused too
            with pytest.raises(ChstateError) as refused:
                other.set(ODD_ID, STATE)
            assert refused.value.code == "ABORTED"
            py_store.set(ODD_ID, STATE)
        # Released: the other store takes it now.
        with other.lock(ODD_ID):
            other.merge(ODD_ID, {"singer_state": {"p": 1}})
        assert py_store.get(ODD_ID)["partial"] == {"singer_state": {"p": 1}}
    finally:
        other.close()


def test_wasmtime_scope_keeps_its_lock(compiled, clickhouse, schema, chstate_cli):
    store = new_store(compiled, clickhouse, schema, lock_timeout_seconds=1)
    try:
        store.init()
        scope_keeps_its_lock(store, chstate_cli, clickhouse, schema, "dev:long-scope")
    finally:
        store.close()


def test_wasmtime_logs_what_the_store_tells(wasm_path, compiled, clickhouse, schema, py_store, caplog):
    """chstate_wasmtime.open logs under `chstate_wasmtime` at the level that logger is enabled for:
    a wait for a lock another store holds at INFO, each statement at DEBUG (states redacted)."""
    py_store.init()
    caplog.set_level(logging.INFO, logger="chstate_wasmtime")
    waiter = chstate_wasmtime.open(clickhouse.uri(), wasm=wasm_path, password=clickhouse.password, schema=schema,
                                   lock_wait_seconds=0.5, lock_retry_seconds=0.1, env={})
    try:
        with py_store.lock("dev:watched"):
            with pytest.raises(ChstateError) as refused:
                waiter.set("dev:watched", STATE)
            assert refused.value.code == "ABORTED"
    finally:
        waiter.close()
    ours = [r for r in caplog.records if r.name == "chstate_wasmtime"]
    waiting = [r for r in ours if r.chstate["kind"] == "lock_waiting"]
    assert waiting, [r.getMessage() for r in ours]
    assert waiting[0].levelno == logging.INFO and waiting[0].chstate["state_id"] == "dev:watched"
    assert waiting[0].getMessage().startswith('waiting for the lock on "dev:watched": another process (lock ')
    assert not [r for r in ours if r.levelno < logging.INFO]  # nothing below the logger's level was made
    caplog.clear()
    caplog.set_level(logging.DEBUG, logger="chstate_wasmtime")
    told = []
    debug = chstate_wasmtime.open(clickhouse.uri(), wasm=wasm_path, password=clickhouse.password, schema=schema,
                                  env={}, on_event=told.append)
    try:
        debug.set("dev:watched", {"singer_state": {"bookmark": "bm-py-77"}})
    finally:
        debug.close()
    inserts = [r for r in caplog.records if r.name == "chstate_wasmtime" and r.levelno == logging.DEBUG
               and r.chstate["texts"].get("purpose") == "insert_state"]
    assert len(inserts) == 1 and re.search(r"ok in \d+ ms: INSERT INTO .*'<state: \d+ bytes>'",
                                           inserts[0].getMessage()), [r.getMessage() for r in caplog.records]
    assert "bm-py-77" not in caplog.text
    assert [e["line"] for e in told] == [r.getMessage() for r in caplog.records if r.name == "chstate_wasmtime"]
    # A logger enabled for ERROR only: the core is asked for nothing, and nothing is logged.
    caplog.clear()
    caplog.set_level(logging.ERROR, logger="chstate_wasmtime")
    quiet = chstate_wasmtime.open(clickhouse.uri(), wasm=wasm_path, password=clickhouse.password, schema=schema,
                                  env={})
    try:
        quiet.set("dev:watched", STATE)
    finally:
        quiet.close()
    assert not [r for r in caplog.records if r.name == "chstate_wasmtime"]


def test_wasmtime_closed_port_is_unavailable(compiled, clickhouse, schema):
    dead = Store(WasmtimeCore(ChstateModule(engine=compiled[0], module=compiled[1])),
                 {"uri": f"clickhouse://{clickhouse.user}@127.0.0.1:1/default", "schema": schema,
                  "connect_timeout_seconds": 1}, env={})
    try:
        with pytest.raises(ChstateError) as e:
            dead.get("x")
        assert e.value.code == "UNAVAILABLE"
    finally:
        dead.close()


@pytest.mark.parametrize("name", NODE_CASES)
def test_node_host(node_results, clickhouse, chstate_cli, name):
    results = node_results("server", env={**clickhouse.env(), "CHSTATE_CONTENDER": str(chstate_cli)})
    assert name in results, f"node_runner did not run {name}: {results}"
    assert results[name]["ok"], results[name]["detail"]
