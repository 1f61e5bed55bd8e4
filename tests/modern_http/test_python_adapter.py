"""The Python binding (hosts/python/chstate_meltano/binding.py: `Store`, whose
methods are the core's verbs) over the native core (_native.NativeCore) with
the adapter's own transport (_http.py, http.client keep-alive), and the
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

COMPLETED = {"singer_state": {"bookmarks": {"t": {"v": ODD_VALUE}}}}
# Python ids may also hold NUL and bytes that are not UTF-8 (surrogate escapes).
PY_ID = HOSTILE_ID + "\x00nul " + b"\xff\xfe".decode("utf-8", "surrogateescape")


@pytest.fixture
def binding(libchstate):
    from chstate_meltano import binding
    return binding


@pytest.fixture
def open_store(binding, fresh, schema):
    """Stores of the binding over NativeCore, each with its own HttpTransport
    made from the core's resolution of the same settings."""
    from chstate_meltano._http import HttpTransport
    from chstate_meltano._native import NativeCore, resolve_settings
    made = []

    def make(password=None, **values):
        settings = {"uri": f"clickhouse://{fresh.user}@{fresh.host}:{fresh.port}/default",
                    "password": fresh.password if password is None else password, "schema": schema, **values}
        connection = resolve_settings({"from": "api", "values": settings, "env": {}})["connection"]
        store = binding.Store(NativeCore(), settings, transport=HttpTransport(connection), env={})
        made.append(store)
        return store

    yield make
    for store in made:
        store.close()  # closes its transport too


def test_store_over_http_transport_every_verb(open_store, binding, fresh, schema):
    store = open_store()
    assert store.settings["store"]["schema"] == schema
    pong = store.ping()
    assert pong["dialect"] == "modern" and pong["server_version"] == fresh.version
    assert version_is_modern(pong["server_version"])
    store.init()
    written = store.set(PY_ID, COMPLETED)
    assert (written["completed"], written["partial"]) == (COMPLETED, {})
    got = store.get(PY_ID)
    assert (got["completed"], got["partial"], got["merged"]) == (COMPLETED, {}, COMPLETED)
    merged = store.merge(PY_ID, {"singer_state": {"more": [1, 2]}})
    assert merged["partial"] == {"singer_state": {"more": [1, 2]}}
    got = store.get(PY_ID)
    assert got["completed"] == COMPLETED and got["partial"] == {"singer_state": {"more": [1, 2]}}
    assert got["merged"] == {"singer_state": {"bookmarks": {"t": {"v": ODD_VALUE}}, "more": [1, 2]}}
    # Refused before anything is sent: an empty merge, a state without singer_state.
    records = fresh.take()
    with pytest.raises(binding.ChstateError) as refused:
        store.merge(PY_ID, {})
    assert refused.value.code == "INVALID_ARGUMENT"
    with pytest.raises(binding.ChstateError) as refused:
        store.set("dev:other", {"bookmarks": {}})
    assert refused.value.code == "INVALID_ARGUMENT" and "singer_state" in refused.value.message
    assert fresh.take() == []
    store.set("dev:other", {"bookmarks": {}}, force=True)
    store.set("dev:other", COMPLETED)
    ids = store.list()
    assert ids == sorted([PY_ID, "dev:other"], key=lambda s: s.encode("utf-8", "surrogateescape"))
    assert store.list("dev:it's*") == [PY_ID]
    # The id comes back byte for byte (NUL and surrogate escapes included).
    page, more = store.export()
    assert [s["state_id"] for s in page] == ids and more is False
    assert all(s["completed"] == COMPLETED for s in page)
    hexes = fresh.sql(f"SELECT hex(state_id) FROM `{schema}`.state").decode().split()
    assert PY_ID.encode("utf-8", "surrogateescape").hex().upper() in hexes
    assert store.delete(PY_ID) is None
    assert store.get(PY_ID) is None
    assert store.clear_all() == 1
    assert store.list() == []
    records += fresh.take()
    check_modern(records, creates=True)
    # set, merge and delete ran under the id's lock; none is left behind.
    assert any("_lock_" in r.sql and r.sql.lstrip().upper().startswith("CREATE TABLE") for r in records)
    assert fresh.sql(f"SELECT count() FROM system.tables WHERE database = '{schema}' "
                     "AND match(name, '^state_lock_[0-9a-f]{16}$')").decode().strip() == "0"
    # http.client keep-alive: the whole test in very few connections.
    assert len(records) > 15 and len({r.peer for r in records}) <= 3, len({r.peer for r in records})


def test_documents_and_bodies_cross_as_bytes(binding, fresh, schema):
    """NativeCore hands the import document and every answer's body to the
    core as bytes apart from the JSON, and takes an export page's document
    back the same way: the same results as a core spoken to in JSON alone."""
    from chstate_meltano._http import HttpTransport
    from chstate_meltano._native import NativeCore, _take, resolve_settings

    crossed = []

    class Recording(NativeCore):
        def _call(self, fn, handle, doc, data, now_ms, random):
            sent = json.loads(doc)
            # Apart means apart: the JSON holds neither the text nor its hex.
            assert not isinstance(sent.get("document"), str) and "body" not in sent.get("response", {}), sent
            assert "body_hex" not in sent.get("response", {}), sent
            action = super()._call(fn, handle, doc, data, now_ms, random)
            crossed.append((data is not None, "document" in action.get("done", {})))
            return action

    class JsonOnly(binding.Core):
        """The core through chstate_op_start/chstate_op_feed: documents inside the JSON, bodies as hex."""

        def __init__(self):
            self._native = NativeCore()

        def verbs(self):
            return self._native.verbs()

        def store_new(self, settings):
            return self._native.store_new(settings)

        def store_settings(self, handle):
            return self._native.store_settings(handle)

        def start(self, handle, doc, now_ms, random):
            lib = self._native._lib
            return _take(lib, lib.chstate_op_start(handle, doc, now_ms, random, len(random)))

        def feed(self, handle, doc, now_ms, random):
            lib = self._native._lib
            return _take(lib, lib.chstate_op_feed(handle, doc, now_ms, random, len(random)))

        def store_free(self, handle):
            self._native.store_free(handle)

    def store_of(core, sub):
        settings = {"uri": f"clickhouse://{fresh.user}@{fresh.host}:{fresh.port}/default",
                    "password": fresh.password, "schema": f"{schema}_{sub}"}
        connection = resolve_settings({"from": "api", "values": settings, "env": {}})["connection"]
        return binding.Store(core, settings, transport=HttpTransport(connection), env={})

    states = {f"dev:{i:03d} é\\t\"": {"completed": {"singer_state": {"n": i, "s": "a\tb\"c\\"}}, "partial": {}}
              for i in range(300)}
    states[HOSTILE_ID] = {"completed": COMPLETED, "partial": {"singer_state": {"p": [1, None]}}}
    document = json.dumps(states, sort_keys=True)
    results = []
    for core, sub in ((Recording(), "bytes"), (JsonOnly(), "json")):
        store = store_of(core, sub)
        try:
            assert store.import_document(document) == len(states)
            pages, after = [], None
            while True:
                text, more, ids = store.export(after=after, limit=100, document=True)
                pages.append(text)
                if not more:
                    break
                after = ids[-1]
            results.append(pages)
        finally:
            store.close()
    assert results[0] == results[1]
    # The round trip: what went in comes out, in pages of at most 100.
    assert len(results[0]) >= 4
    assert json.loads("{" + ",".join(p for p in results[0] if p) + "}") == states
    # Both ways: the document and the answers went in as bytes, pages came out apart.
    assert any(data for data, _ in crossed) and any(apart for _, apart in crossed)
    assert sum(apart for _, apart in crossed) == len(results[0])


def test_lock_between_two_stores(open_store, binding, fresh):
    first = open_store(lock_wait_seconds=0.4, lock_retry_seconds=0.1)
    second = open_store(lock_wait_seconds=0.4, lock_retry_seconds=0.1)
    sid = "dev:locked"
    with first.lock(sid) as scope:
        assert len(scope.lock_id) == 32
        with pytest.raises(binding.ChstateError) as refused:
            with second.lock(sid):
                pass
        assert refused.value.code == "ABORTED"
        with pytest.raises(binding.ChstateError) as refused:
            second.set(sid, COMPLETED)  # a write takes the id's lock
        assert refused.value.code == "ABORTED"
        with pytest.raises(binding.ChstateError) as refused:
            second.delete(sid)
        assert refused.value.code == "ABORTED"
        assert second.get(sid) is None
        first.set(sid, COMPLETED)  # under the scope's lock
    second.set(sid, {"singer_state": {"second": True}})
    assert second.get(sid)["completed"] == {"singer_state": {"second": True}}
    records = fresh.take()
    check_modern(records)
    assert any(r.code == 57 for r in records), "the second store never met the held lock"


def test_wrong_password_is_unauthenticated(open_store, binding, fresh):
    wrong = "wrong-" + fresh.password[:6][::-1]
    store = open_store(password=wrong)
    with pytest.raises(binding.ChstateError) as failed:
        store.get("dev:a")
    assert failed.value.code == "UNAUTHENTICATED"
    assert wrong not in str(failed.value) and fresh.password not in str(failed.value)
    assert wrong not in repr(store) and wrong not in json.dumps(store.settings)
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
