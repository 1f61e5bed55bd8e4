"""Both WebAssembly hosts against the real ClickHouse 18.16 server: get, set,
merge, list, delete, clear-all and a locked update (with a second store
refused while the lock is held), through the module's ABI.
- wasmtime (PyPI) with hosts/wasi/chstate_wasmtime.py's http.client transport;
- Node (node:wasi + fetch) with hosts/wasi/chstate_wasi.mjs, run by
  tests/wasi/node_runner.mjs, one result per operation."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from chstate_wasmtime import ChstateError, ChstateModule, HttpTransport

REPO = Path(__file__).resolve().parents[2]
NODE_CASES = ["init", "set_get", "merge", "list", "locked_update", "history_rollback", "delete", "clear_all",
              "closed_port_is_unavailable", "cleanup"]


@pytest.fixture()
def py_store(compiled, clickhouse):
    mod = ChstateModule(engine=compiled[0], module=compiled[1])
    schema = f"wasi_py_{uuid.uuid4().hex[:8]}"
    cfg = mod.resolve_config({"flags": {"host": clickhouse.host, "port": clickhouse.port, "user": clickhouse.user,
                                        "password": clickhouse.password, "database": "default", "schema": schema}})
    assert "config" in cfg, cfg
    cfg = cfg["config"]
    store = mod.open_store({"schema": cfg["schema"], "table": cfg["table"], "lock_timeout_ms": 1500,
                            "lock_retry_ms": 100}, HttpTransport(cfg))
    store.run({"op": "init"})
    yield mod, cfg, store
    store.close()
    clickhouse.sql(f"DROP DATABASE IF EXISTS {schema}")


STATE = {"completed": {"singer_state": {"bookmarks": {"users": {"id": 41}}}}, "partial": {}}
ODD_ID = "dev:py-\u00e9\x00'`%_*"


def test_wasmtime_set_get(py_store):
    _, _, store = py_store
    store.set(ODD_ID, STATE)
    assert store.get(ODD_ID) == STATE
    assert store.get("dev:absent") is None


def test_wasmtime_merge(py_store):
    _, _, store = py_store
    store.set(ODD_ID, STATE)
    store.merge(ODD_ID, {"singer_state": {"bookmarks": {"orders": {"id": 7}}}})
    got = store.get(ODD_ID)
    assert got["completed"] == STATE["completed"]
    assert got["partial"] == {"singer_state": {"bookmarks": {"orders": {"id": 7}}}}


def test_wasmtime_list(py_store):
    _, _, store = py_store
    store.set(ODD_ID, STATE)
    store.set("dev:other", STATE)
    store.set("prod:x", STATE)
    assert store.list() == sorted([ODD_ID, "dev:other", "prod:x"])
    assert store.list("dev:*") == sorted([ODD_ID, "dev:other"])
    assert store.list("dev:py-\u00e9\x00'`%_?") == [ODD_ID]


def test_wasmtime_delete(py_store):
    _, _, store = py_store
    store.set(ODD_ID, STATE)
    store.delete(ODD_ID)
    assert store.get(ODD_ID) is None


def test_wasmtime_clear_all(py_store):
    _, _, store = py_store
    for i in range(3):
        store.set(f"dev:{i}", STATE)
    assert store.clear_all() == 3
    assert store.list() == []


def test_wasmtime_locked_update(py_store):
    mod, cfg, store = py_store
    other = mod.open_store({"schema": cfg["schema"], "table": cfg["table"], "lock_timeout_ms": 300,
                            "lock_retry_ms": 100}, HttpTransport(cfg))
    with store.locked(ODD_ID) as lock:
        with pytest.raises(ChstateError) as refused:
            other.run({"op": "acquire_lock", "state_id_hex": ODD_ID.encode().hex()})
        assert refused.value.code == "ABORTED"
        lock.set({"completed": {"v": 2}, "partial": {}})
    assert store.get(ODD_ID) == {"completed": {"v": 2}, "partial": {}}
    # Released: the other store takes it now.
    lock_id = other.run({"op": "acquire_lock", "state_id_hex": ODD_ID.encode().hex()})["lock_id"]
    other.run({"op": "release_lock", "state_id_hex": ODD_ID.encode().hex(), "lock_id": lock_id})
    # Meltano's update() (lock, get, merge, set, unlock) in one op.
    store.run({"op": "update", "state_id_hex": ODD_ID.encode().hex(),
               "state": {"completed": {}, "partial": {"p": 1}}})
    assert store.get(ODD_ID) == {"completed": {"v": 2}, "partial": {"p": 1}}
    other.close()


def test_wasmtime_history_and_rollback(py_store):
    _, _, store = py_store
    store.set("dev:h", {"completed": {"singer_state": {"n": 1}}, "partial": {}})
    store.merge("dev:h", {"singer_state": {"p": 2}})
    versions = store.history("dev:h")
    assert len(versions) == 2 and versions[0]["current"], versions
    first = next(v for v in versions if v["state"]["partial"] == {})
    assert first["state"]["completed"] == {"singer_state": {"n": 1}}
    assert store.rollback("dev:h", first["version"]) == {"completed": {"singer_state": {"n": 1}}, "partial": {}}
    assert store.get("dev:h") == {"completed": {"singer_state": {"n": 1}}, "partial": {}}
    assert len(store.history("dev:h", limit=1)) == 1
    with pytest.raises(ChstateError) as e:
        store.rollback("dev:h", "latest")
    assert e.value.code == "INVALID_ARGUMENT"


def test_wasmtime_closed_port_is_unavailable(py_store):
    mod, cfg, _ = py_store
    dead = mod.open_store({"schema": cfg["schema"]}, HttpTransport({**cfg, "port": 1}))
    with pytest.raises(ChstateError) as e:
        dead.get("x")
    assert e.value.code == "UNAVAILABLE"


@pytest.mark.parametrize("name", NODE_CASES)
def test_node_host(node_results, clickhouse, name):
    results = node_results("server", env=clickhouse.env())
    assert name in results, f"node_runner did not run {name}: {results}"
    assert results[name]["ok"], results[name]["detail"]
