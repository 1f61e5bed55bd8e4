"""chstate_extism.wasm in Extism's Python SDK (the `extism` package from
PyPI, its runtime from `extism-sys`): the shared conformance vectors byte for
byte, every operation against the real ClickHouse server through
hosts/wasi/chstate_extism.py, the plugin's imports and exports, and bad input
answered with documents, never a trap."""

from __future__ import annotations

import json
import uuid

import pytest

from chstate_extism import ChstateError, ExtismChstate
from chstate_wasmtime import HttpTransport
from vector_runner import compact, vector_cases

CASES = vector_cases()
EXPORTS = {"resolve_config", "store_new", "op_start", "op_feed", "store_free"}


@pytest.fixture()
def chstate(extism_path) -> ExtismChstate:
    import extism
    return ExtismChstate(extism.Plugin(extism_path.read_bytes(), wasi=True))


def test_imports_only_extism_kernel_functions_and_exports_the_c_abi_names(extism_path):
    import wasmtime
    module = wasmtime.Module.from_file(wasmtime.Engine(), str(extism_path))
    imports = {(i.module, i.name) for i in module.imports}
    assert imports and all(m == "extism:host/env" for m, _ in imports), imports
    assert {n for _, n in imports} <= {"input_length", "input_load_u8", "input_load_u64", "alloc", "store_u8",
                                       "store_u64", "output_set"}
    exports = {e.name for e in module.exports}
    assert EXPORTS <= exports, exports


@pytest.mark.parametrize("name,case,random", CASES, ids=[c[0] for c in CASES])
def test_extism_matches_vectors(chstate, name, case, random):
    handle = None
    if "store" in case:
        r = chstate.call("store_new", compact(case["store"]).decode())
        assert "store" in r, r
        handle = r["store"]
    for i, step in enumerate(case["steps"]):
        if step["call"] == "resolve_config":
            got = chstate.plugin.call("resolve_config", compact(step["doc"]))
        else:
            fn, key = ("op_start", "op") if step["call"] == "start" else ("op_feed", "answer")
            got = chstate.plugin.call(fn, json.dumps({"store": handle, "now_ms": step["now_ms"],
                                                      "random_hex": random.hex(), key: step["doc"]}).encode())
        assert bytes(got) == step["expect"].encode(), f"step {i} ({step['call']})"


@pytest.fixture()
def store(chstate, clickhouse):
    schema = f"extism_{uuid.uuid4().hex[:8]}"
    cfg = chstate.resolve_config({"flags": {"host": clickhouse.host, "port": clickhouse.port, "user": clickhouse.user,
                                            "password": clickhouse.password, "database": "default",
                                            "schema": schema}})["config"]
    s = chstate.open_store({"schema": cfg["schema"], "table": cfg["table"], "lock_timeout_ms": 1500,
                            "lock_retry_ms": 100}, HttpTransport(cfg))
    s.schema = schema
    yield s
    s.close()
    clickhouse.sql(f"DROP DATABASE IF EXISTS {schema}")


def hexid(s: str) -> str:
    return s.encode().hex()


def test_every_operation_against_the_server(store):
    sid = "dev:extism-\u00e9\x00'`%_*"
    state = {"completed": {"singer_state": {"n": 1}}, "partial": {}}
    store.run({"op": "set", "state_id_hex": hexid(sid), "state": state})
    got = store.run({"op": "get", "state_id_hex": hexid(sid)})["state"]
    assert (got["completed"], got["partial"]) == (state["completed"], {})
    store.run({"op": "update", "state_id_hex": hexid(sid), "state": {"completed": {}, "partial": {"p": 2}}})
    assert store.run({"op": "get", "state_id_hex": hexid(sid)})["state"]["partial"] == {"p": 2}
    store.run({"op": "set", "state_id_hex": hexid("dev:other"), "state": state})
    ids = store.run({"op": "list", "pattern_hex": hexid("dev:extism-*")})["state_ids_hex"]
    assert ids == [hexid(sid)]
    versions = store.run({"op": "history", "state_id_hex": hexid(sid)})["versions"]
    assert len(versions) == 2 and versions[0]["current"]
    page = store.run({"op": "export_page", "pattern": None})
    assert len(page["states"]) == 2 and page["more"] is False
    lock = store.run({"op": "acquire_lock", "state_id_hex": hexid(sid)})
    assert lock["lock_id"] and lock["next_timeout_ms"] is not None
    store.run({"op": "release_lock", "state_id_hex": hexid(sid), "lock_id": lock["lock_id"]})
    store.run({"op": "delete", "state_id_hex": hexid(sid)})
    assert store.run({"op": "get", "state_id_hex": hexid(sid)})["state"] is None
    assert store.run({"op": "clear_all"})["count"] == 1


def test_a_held_lock_refuses_a_second_plugin_instance(chstate, store, clickhouse, extism_path):
    import extism
    other_chstate = ExtismChstate(extism.Plugin(extism_path.read_bytes(), wasi=True))
    lock = store.run({"op": "acquire_lock", "state_id_hex": hexid("dev:l")})
    other = other_chstate.open_store({"schema": store.schema, "lock_timeout_ms": 300, "lock_retry_ms": 100},
                                     store.transport)
    with pytest.raises(ChstateError) as e:
        other.run({"op": "acquire_lock", "state_id_hex": hexid("dev:l")})
    assert e.value.code == "ABORTED"
    store.run({"op": "release_lock", "state_id_hex": hexid("dev:l"), "lock_id": lock["lock_id"]})
    again = other.run({"op": "acquire_lock", "state_id_hex": hexid("dev:l")})
    other.run({"op": "release_lock", "state_id_hex": hexid("dev:l"), "lock_id": again["lock_id"]})


@pytest.mark.parametrize("export, doc", [
    ("op_start", "not json"),
    ("op_start", {"store": 99, "now_ms": 1, "random_hex": "11" * 32, "op": {"op": "ping"}}),
    ("op_start", {"store": 1, "op": {"op": "ping"}}),
    ("op_start", {"store": 1, "now_ms": 1, "random_hex": "xyz", "op": {"op": "ping"}}),
    ("op_feed", {"store": 1, "now_ms": 1, "random_hex": "11" * 32, "answer": {"timer": True}}),
    ("store_free", {"store": "one"}),
    ("store_new", '{"schema": "no-dashes"}'),
    ("resolve_config", "[]"),
])
def test_bad_input_is_a_failed_document_and_the_plugin_goes_on(chstate, export, doc):
    first = chstate.call("store_new", {})
    assert first == {"store": 1}
    out = chstate.call(export, doc if isinstance(doc, str) else json.dumps(doc))
    assert "failed" in out and out["failed"]["code"] in ("INVALID_ARGUMENT", "FAILED_PRECONDITION"), out
    # The plugin is intact: store 1 still runs an operation.
    action = chstate.step("op_start", 1, "op", {"op": "ping"})
    assert action["request"]["purpose"] == "select_version"
