"""The Python adapter's own transport (hosts/python/chstate_meltano/_http.py,
http.client keep-alive) driving the core through _native.Store, and the
Meltano-facing ClickhouseStateStoreManager (backend.py, run in the pinned
Meltano venv of tests/meltano) against the modern engine behind the front."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from support import HOSTILE_ID, ODD_VALUE, REPO, check_modern, version_is_modern

sys.path.insert(0, str(REPO / "hosts" / "python"))

STATE = {"completed": {"singer_state": {"bookmarks": {"t": {"v": ODD_VALUE}}}}, "partial": {}}
# Python ids may also hold NUL and bytes that are not UTF-8 (surrogate escapes).
PY_ID = HOSTILE_ID + "\x00nul " + b"\xff\xfe".decode("utf-8", "surrogateescape")


@pytest.fixture
def native(libchstate):
    from chstate_meltano import _native
    return _native


@pytest.fixture
def open_store(native, fresh, schema):
    from chstate_meltano._http import HttpTransport
    made = []

    def make(**options):
        config = native.resolve_config({"uri": f"clickhouse://{fresh.user}@{fresh.host}:{fresh.port}/default",
                                        "password": fresh.password, "schema": schema}, env={})
        transport = HttpTransport(config)
        store = native.Store({"schema": config["schema"], "table": config["table"], **options}, transport)
        made.append((store, transport))
        return store

    yield make
    for store, transport in made:
        store.close()
        transport.close()


def test_store_over_http_transport_every_operation(open_store, native, fresh, schema):
    store = open_store()
    pong = store.run({"op": "ping"})
    assert pong["dialect"] == "modern" and pong["server_version"] == fresh.version
    assert version_is_modern(pong["server_version"])
    store.run({"op": "init"})
    sid = native.id_hex(PY_ID)
    store.run({"op": "set", "state_id_hex": sid, "state": STATE})
    got = store.run({"op": "get", "state_id_hex": sid})["state"]
    assert native.id_from_hex(got["state_id_hex"]) == PY_ID
    assert (got["completed"], got["partial"]) == (STATE["completed"], {})
    store.run({"op": "update", "state_id_hex": sid,
               "state": {"completed": {}, "partial": {"singer_state": {"more": [1, 2]}}}})
    got = store.run({"op": "get", "state_id_hex": sid})["state"]
    assert got["completed"] == STATE["completed"] and got["partial"] == {"singer_state": {"more": [1, 2]}}
    store.run({"op": "set", "state_id_hex": native.id_hex("dev:other"), "state": STATE})
    ids = [native.id_from_hex(h) for h in store.run({"op": "list", "pattern": None})["state_ids_hex"]]
    assert ids == sorted([PY_ID, "dev:other"], key=lambda s: s.encode("utf-8", "surrogateescape"))
    only = store.run({"op": "list", "pattern_hex": native.id_hex("dev:it's*")})["state_ids_hex"]
    assert [native.id_from_hex(h) for h in only] == [PY_ID]
    hexes = fresh.sql(f"SELECT hex(state_id) FROM `{schema}`.state").decode().split()
    assert PY_ID.encode("utf-8", "surrogateescape").hex().upper() in hexes
    store.run({"op": "delete", "state_id_hex": sid})
    assert store.run({"op": "get", "state_id_hex": sid})["state"] is None
    assert store.run({"op": "clear_all"})["count"] == 1
    assert store.run({"op": "list", "pattern": None})["state_ids_hex"] == []
    records = fresh.take()
    check_modern(records, creates=True)
    # http.client keep-alive: the whole test in very few connections.
    assert len(records) > 15 and len({r.peer for r in records}) <= 3, len({r.peer for r in records})


def test_lock_between_two_stores(open_store, native, fresh):
    first = open_store(lock_timeout_ms=400, lock_retry_ms=100)
    second = open_store(lock_timeout_ms=400, lock_retry_ms=100)
    sid = native.id_hex("dev:locked")
    lock_id = first.run({"op": "acquire_lock", "state_id_hex": sid})["lock_id"]
    with pytest.raises(native.ChstateError) as refused:
        second.run({"op": "acquire_lock", "state_id_hex": sid})
    assert refused.value.code == "ABORTED"
    with pytest.raises(native.ChstateError) as refused:
        second.run({"op": "set_locked", "state_id_hex": sid, "state": STATE})  # a write under its own lock
    assert refused.value.code == "ABORTED"
    first.run({"op": "release_lock", "state_id_hex": sid, "lock_id": lock_id})
    second.run({"op": "set_locked", "state_id_hex": sid, "state": STATE})
    assert second.run({"op": "get", "state_id_hex": sid})["state"]["completed"] == STATE["completed"]
    records = fresh.take()
    check_modern(records)
    assert any(r.code == 57 for r in records), "the second store never met the held lock"


def test_wrong_password_is_unauthenticated(native, fresh, schema, libchstate):
    from chstate_meltano._http import HttpTransport
    wrong = "wrong-" + fresh.password[:6][::-1]
    config = native.resolve_config({"uri": f"clickhouse://{fresh.user}@{fresh.host}:{fresh.port}/default",
                                    "password": wrong, "schema": schema}, env={})
    transport = HttpTransport(config)
    store = native.Store({"schema": schema, "table": "state"}, transport)
    try:
        with pytest.raises(native.ChstateError) as failed:
            store.run({"op": "get", "state_id_hex": native.id_hex("dev:a")})
    finally:
        store.close()
        transport.close()
    assert failed.value.code == "UNAUTHENTICATED"
    assert wrong not in str(failed.value) and fresh.password not in str(failed.value)
    assert all(r.status == 403 for r in fresh.take())


BACKEND_SCRIPT = """
import json, os
from meltano.core.state_store.base import MeltanoState, StateIDLockedError
from chstate_meltano.backend import ClickhouseStateStoreManager

def make():
    return ClickhouseStateStoreManager(uri=os.environ["T_URI"], password=os.environ["T_PASSWORD"],
                                       schema=os.environ["T_SCHEMA"], lock_wait_seconds=0.5,
                                       lock_retry_seconds=0.1, host=None, port=None, database=None, user=None,
                                       secure=None, table=None)

sid = json.loads(os.environ["T_ID"])
completed = json.loads(os.environ["T_STATE"])
out = {}
m, other = make(), make()
m.set(MeltanoState(state_id=sid, completed_state=completed, partial_state={}))
m.set(MeltanoState(state_id="dev:second", completed_state={}, partial_state={"singer_state": {"p": 1}}))
s = m.get(sid)
out["get"] = [s.state_id, s.completed_state, s.partial_state]
out["missing"] = m.get("dev:absent") is None
out["ids"] = sorted(m.get_state_ids())
out["ids_pattern"] = list(m.get_state_ids("dev:se*"))
with m.acquire_lock(sid):
    try:
        with other.acquire_lock(sid):
            out["second_lock"] = "acquired"
    except StateIDLockedError:
        out["second_lock"] = "locked"
m.delete(sid)
out["after_delete"] = m.get(sid) is None
out["cleared"] = m.clear_all()
out["ids_after"] = list(m.get_state_ids())
m.close(); other.close()
print("RESULT " + json.dumps(out))
"""


def test_meltano_backend_class(fresh, schema, libchstate):
    sys.path.insert(0, str(REPO / "tests" / "meltano"))
    import meltano_harness
    venv = meltano_harness.ensure_venv()  # pinned Meltano, cached under ~/.cache/chstate
    sid = HOSTILE_ID
    completed = {"singer_state": {"bookmarks": {"t": {"v": ODD_VALUE}}}}
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CLICKHOUSE_", "MELTANO_"))}
    env.update(PYTHONPATH=str(REPO / "hosts" / "python"), CHSTATE_LIBRARY=str(libchstate.resolve()),
               T_URI=f"clickhouse://{fresh.user}@{fresh.host}:{fresh.port}/default", T_PASSWORD=fresh.password,
               T_SCHEMA=schema, T_ID=json.dumps(sid), T_STATE=json.dumps(completed))
    proc = subprocess.run([str(venv / "bin" / "python"), "-c", textwrap.dedent(BACKEND_SCRIPT)], capture_output=True,
                          text=True, env=env, timeout=300)
    assert fresh.password not in proc.stdout + proc.stderr
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")]
    assert line, proc.stdout[-2000:]
    out = json.loads(line[-1][len("RESULT "):])
    assert out["get"] == [sid, completed, {}]
    assert out["missing"] is True
    assert out["ids"] == sorted([sid, "dev:second"])
    assert out["ids_pattern"] == ["dev:second"]
    assert out["second_lock"] == "locked"
    assert out["after_delete"] is True
    assert out["cleared"] == 1 and out["ids_after"] == []
    check_modern(fresh.take())
