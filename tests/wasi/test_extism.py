"""chstate_extism.wasm in Extism's Python SDK (the `extism` package from
PyPI, its runtime from `extism-sys`): the shared conformance vectors byte for
byte; the Python binding of the verbs over the plugin
(hosts/wasi/chstate_extism.py: ExtismCore, open) against the real ClickHouse
server: every verb's method, one-call open, a lock scope refusing a second
plugin instance and keeping its lock while its block runs three validities
long; the plugin's imports and exports; bad input answered with documents,
never a trap."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

import chstate_extism
from chstate_extism import ChstateError, ExtismCore, Store
from py_binding_checks import STATE, every_verb, missing_methods, scope_keeps_its_lock
from vector_runner import compact, vector_cases

CASES = vector_cases()
EXPORTS = {"verbs", "resolve_settings", "store_new", "op_start", "op_feed", "store_free"}
SETTINGS = {"from": "api", "values": {"uri": "clickhouse://default@127.0.0.1:8123/default"}}


@pytest.fixture()
def core(extism_path) -> ExtismCore:
    import extism
    return ExtismCore(extism.Plugin(extism_path.read_bytes(), wasi=True))


def test_imports_only_extism_kernel_functions_and_exports_the_c_abi_names(extism_path):
    import wasmtime
    module = wasmtime.Module.from_file(wasmtime.Engine(), str(extism_path))
    imports = {(i.module, i.name) for i in module.imports}
    assert imports and all(m == "extism:host/env" for m, _ in imports), imports
    # The kernel's input and output, and its log functions (what the store tells, docs/diagnostics.md).
    assert {n for _, n in imports} <= {"input_length", "input_load_u8", "input_load_u64", "alloc", "store_u8",
                                       "store_u64", "output_set", "free", "log_warn", "log_info", "log_debug"}
    exports = {e.name for e in module.exports}
    assert EXPORTS <= exports, exports


@pytest.mark.parametrize("name,case,random", CASES, ids=[c[0] for c in CASES])
def test_extism_matches_vectors(core, name, case, random):
    handle = None
    if "store" in case:  # a settings document, passed as it is
        r = core.call("store_new", compact(case["store"]).decode())
        assert "store" in r, r
        handle = r["store"]
    for i, step in enumerate(case["steps"]):
        if step["call"] == "resolve_settings":
            got = core.plugin.call("resolve_settings", compact(step["doc"]))
        else:
            fn, key = ("op_start", "op") if step["call"] == "start" else ("op_feed", "answer")
            got = core.plugin.call(fn, json.dumps({"store": handle, "now_ms": step["now_ms"],
                                                      "random_hex": random.hex(), key: step["doc"]}).encode())
        assert bytes(got) == step["expect"].encode(), f"step {i} ({step['call']})"


def settings(server, schema: str, **extra) -> dict:
    return {"uri": server.uri(), "password": server.password, "schema": schema, **extra}


@pytest.fixture()
def schema(clickhouse):
    name = f"extism_{uuid.uuid4().hex[:8]}"
    yield name
    clickhouse.sql(f"DROP DATABASE IF EXISTS {name}")


@pytest.fixture()
def store(core, clickhouse, schema):
    s = Store(core, settings(clickhouse, schema, lock_timeout_seconds=1.5, lock_retry_seconds=0.1), env={})
    yield s
    s.close()


def new_plugin_store(extism_path, server, schema: str, **extra) -> Store:
    import extism
    return Store(ExtismCore(extism.Plugin(extism_path.read_bytes(), wasi=True)), settings(server, schema, **extra),
                 env={})


def test_every_verb_has_a_method(store, core):
    verbs = core.verbs()
    assert {v["name"] for v in verbs} >= {"get", "set", "merge", "acquire", "release"}, verbs
    assert missing_methods(store, verbs) == []
    assert callable(store.lock)


def test_every_verb_against_the_server(store, core):
    ran = every_verb(store, "dev:extism-\u00e9\x00'`%_*")
    table = {v["name"] for v in core.verbs()}
    assert ran == table - {"acquire", "release"}, table ^ ran


def test_one_call_open(extism_path, clickhouse, schema):
    s = chstate_extism.open(clickhouse.uri(), wasm=extism_path, password=clickhouse.password, schema=schema,
                            history_versions=3, env={})
    try:
        assert s.settings["store"]["schema"] == schema and s.settings["store"]["history_versions"] == 3
        assert clickhouse.password not in repr(s)
        s.init()
        s.set("dev:open", STATE)
        assert s.get("dev:open")["merged"] == STATE
    finally:
        s.close()
    with pytest.raises(ChstateError) as e:
        chstate_extism.open(clickhouse.uri(), wasm=extism_path, lock_timeout=5, env={})
    assert e.value.code == "INVALID_ARGUMENT" and "lock_wait_seconds" in e.value.message
    with pytest.raises(ChstateError) as e:
        chstate_extism.open(clickhouse.uri(), wasm=extism_path.with_name("absent.wasm"), env={})
    assert e.value.code == "NOT_FOUND" and "bazel build --config=wasi" in e.value.message


def test_a_held_lock_refuses_a_second_plugin_instance(store, clickhouse, schema, extism_path):
    store.init()
    other = new_plugin_store(extism_path, clickhouse, schema, lock_wait_seconds=0.3, lock_retry_seconds=0.1)
    try:
        with store.lock("dev:l"):
            with pytest.raises(ChstateError) as e:
                with other.lock("dev:l"):
                    pass
            assert e.value.code == "ABORTED"
        with other.lock("dev:l"):  # released: the other instance takes it now
            other.set("dev:l", STATE)
    finally:
        other.close()


def test_scope_keeps_its_lock(extism_path, clickhouse, schema, chstate_cli):
    s = new_plugin_store(extism_path, clickhouse, schema, lock_timeout_seconds=1)
    try:
        s.init()
        scope_keeps_its_lock(s, chstate_cli, clickhouse, schema, "dev:long-scope")
    finally:
        s.close()


EXTISM_LOG_SCRIPT = r"""
import json, os, sys
import extism
import chstate_extism
lines = []
log = extism.set_log_custom(lines.append, sys.argv[2])
settings = dict(password=os.environ["CHSTATE_TEST_PASSWORD"], schema=sys.argv[3], env={})
uri = f"clickhouse://{os.environ['CHSTATE_TEST_USER']}@{os.environ['CHSTATE_TEST_HOST']}:{os.environ['CHSTATE_TEST_PORT']}/default"
holder = chstate_extism.open(uri, wasm=sys.argv[1], **settings)
waiter = chstate_extism.open(uri, wasm=sys.argv[1], diagnostics=sys.argv[2], lock_wait_seconds=0.5,
                             lock_retry_seconds=0.1, **settings)
with holder.lock("dev:logged"):
    try:
        waiter.set("dev:logged", {"singer_state": {"bookmark": "bm-extism-py"}})
    except chstate_extism.ChstateError as e:
        assert e.code == "ABORTED", e
waiter.set("dev:logged", {"singer_state": {"bookmark": "bm-extism-py"}})
holder.close()
waiter.close()
log.drain()
print(json.dumps(lines))
"""


def extism_log(extism_path, clickhouse, schema: str, level: str) -> list[str]:
    """What a process whose Extism logger is at `level` logs while a plugin store asked for that
    level waits for a lock another plugin store holds, then writes a state."""
    env = {**clickhouse.env(), "PYTHONPATH": str(Path(chstate_extism.__file__).parent)}
    out = subprocess.run([sys.executable, "-c", EXTISM_LOG_SCRIPT, str(extism_path), level, schema],
                         capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    assert clickhouse.password not in out.stdout + out.stderr
    return [line for line in json.loads(out.stdout.splitlines()[-1]) if "extism::pdk" in line]


def test_the_plugin_logs_what_the_store_tells_through_extisms_logger(extism_path, clickhouse, schema):
    """The plugin calls Extism's log functions: a process that set Extism's logger
    (extism.set_log_custom) sees the wait for a lock at INFO; at debug each statement too."""
    logged = extism_log(extism_path, clickhouse, schema, "info")
    waits = [line for line in logged if 'chstate: waiting for the lock on "dev:logged": another process (lock ' in line]
    assert waits and all(" INFO extism::pdk: " in line for line in waits), logged
    assert not [line for line in logged if "DEBUG" in line or "insert_state" in line], logged
    logged = extism_log(extism_path, clickhouse, schema, "debug")
    inserts = [line for line in logged if " DEBUG extism::pdk: chstate: insert_state (attempt 1): ok in " in line]
    assert inserts and re.search(r"INSERT INTO .*'<state: \d+ bytes>'", inserts[0]), logged
    assert not [line for line in logged if "bm-extism-py" in line]


@pytest.mark.parametrize("export, doc", [
    ("op_start", "not json"),
    ("op_start", {"store": 99, "now_ms": 1, "random_hex": "11" * 32, "op": {"op": "ping"}}),
    ("op_start", {"store": 1, "op": {"op": "ping"}}),
    ("op_start", {"store": 1, "now_ms": 1, "random_hex": "xyz", "op": {"op": "ping"}}),
    # An SQL answer while no op runs (a timer then is the idle timer: test_timer_while_idle_is_the_idle_timer).
    ("op_feed", {"store": 1, "now_ms": 1, "random_hex": "11" * 32,
                 "answer": {"response": {"transport_ok": True, "http_status": 200, "body": ""}}}),
    ("store_free", {"store": "one"}),
    ("store_new", '{"values": {"uri": "clickhouse://u@h/db", "schema": "no-dashes"}}'),
    ("store_new", "{}"),  # a uri is required
    ("resolve_settings", "[]"),
])
def test_bad_input_is_a_failed_document_and_the_plugin_goes_on(core, export, doc):
    first = core.call("store_new", SETTINGS)
    assert first["store"] == 1 and first["settings"]["connection"]["host"] == "127.0.0.1", first
    out = core.call(export, doc if isinstance(doc, str) else json.dumps(doc))
    assert "failed" in out and out["failed"]["code"] in ("INVALID_ARGUMENT", "FAILED_PRECONDITION"), out
    # The plugin is intact: store 1 still runs an operation.
    action = core.start(1, b'{"op":"ping"}', 1000, bytes(32))
    assert action["request"]["purpose"] == "select_version"


def test_timer_while_idle_is_the_idle_timer(core):
    """Protocol v3: {"timer":true} fed while no op runs is the idle timer (it was an error before); with
    no lock held it ends at once, asking for no further timer."""
    handle = core.store_new(SETTINGS)
    assert core.feed(handle, b'{"timer":true}', 1000, bytes(32)) == {"idle": {"next_timeout_ms": None}}
