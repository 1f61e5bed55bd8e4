"""Checks of the Python binding of the verbs (chstate_meltano.binding.Store)
shared by the Wasm cores that run it: wasmtime (test_hosts_server.py) and
Extism's Python SDK (test_extism.py).

`every_verb(store, sid)` runs each method made from the core's verb table
against the server once and checks what it returns; it returns the verbs it
ran, so that a test can require every verb of the core's table but the lock
scope's ends (acquire and release are `store.lock()`).
`scope_keeps_its_lock(store, ...)` holds a lock scope three validities long
while the chstate command tries to take the id's lock.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest

from chstate_meltano.binding import ChstateError

STATE = {"singer_state": {"bookmarks": {"users": {"id": 41}}}}
PARTIAL = {"singer_state": {"bookmarks": {"orders": {"id": 7}}}}
MERGED = {"singer_state": {"bookmarks": {"users": {"id": 41}, "orders": {"id": 7}}}}
SCOPE_ENDS = {"acquire", "release"}  # the lock scope: store.lock(id)
PY_KEYWORDS = {"import", "from"}


def method_name(verb: str) -> str:
    return verb + "_" if verb in PY_KEYWORDS else verb


def missing_methods(store, verbs: list) -> list:
    """The verbs of the core's table (but the scope's ends) that have no method on `store`."""
    return [v["name"] for v in verbs
            if v["name"] not in SCOPE_ENDS and not callable(getattr(store, method_name(v["name"]), None))]


def every_verb(store, sid: str) -> set:
    ran: set = set()

    def call(verb: str, *args, **kwargs):
        ran.add(verb)
        return getattr(store, method_name(verb))(*args, **kwargs)

    server = call("init")
    assert server["server_version"] and server["dialect"] in ("clickhouse18", "modern"), server
    assert call("ping") == server
    assert call("compact") == server
    assert call("get", sid) is None
    assert call("set", sid, STATE) == {"completed": STATE, "partial": {}, "merged": STATE}
    # set refuses a state without singer_state unless forced (the core's check, nothing written).
    with pytest.raises(ChstateError) as e:
        store.set(sid, {"bookmarks": {}})
    assert e.value.code == "INVALID_ARGUMENT" and "singer_state" in e.value.message
    merged = call("merge", sid, PARTIAL)
    assert merged == {"completed": STATE, "partial": PARTIAL, "merged": MERGED}
    assert store.get(sid) == merged
    # An empty merge is refused and writes nothing.
    with pytest.raises(ChstateError) as e:
        store.merge(sid, {})
    assert e.value.code == "INVALID_ARGUMENT"
    assert store.get(sid) == merged

    call("copy", sid, "dev:copied")
    assert store.get("dev:copied") == merged
    call("move", "dev:copied", "dev:moved")
    assert store.get("dev:copied") is None and store.get("dev:moved") == merged
    assert call("list") == sorted([sid, "dev:moved"])
    assert call("list", "dev:mo*") == ["dev:moved"]

    page, more = call("export", limit=1)
    assert more is True and [s["state_id"] for s in page] == [min(sid, "dev:moved")]
    rest, more = store.export(after=page[0]["state_id"], limit=1)
    assert more is True and [s["state_id"] for s in rest] == [max(sid, "dev:moved")]  # more: the page is full
    assert store.export(after=rest[0]["state_id"], limit=1) == ([], False)
    assert {s["state_id"]: s["merged"] for s in page + rest} == {sid: MERGED, "dev:moved": MERGED}
    assert call("import", [{"state_id": "dev:imported", "completed": STATE, "partial": PARTIAL}]) == 1
    assert store.get("dev:imported") == merged
    document = json.dumps({"dev:imported-doc": {"completed": STATE, "partial": PARTIAL}}, indent=2)
    assert call("import_document", document) == 1
    assert store.get("dev:imported-doc") == merged

    versions = call("history", sid)
    assert len(versions) == 2 and versions[0]["current"] and not versions[1]["current"], versions
    assert versions[1]["state"]["partial"] == {} and versions[1]["state"]["completed"] == STATE
    assert len(store.history(sid, limit=1)) == 1
    restored = call("rollback", sid, versions[1]["version"])
    assert restored == {"completed": STATE, "partial": {}, "merged": STATE}
    assert store.get(sid) == restored

    with store.lock(sid) as scope:
        held = [lock for lock in call("locks") if lock["state_id"] == sid]
        assert len(held) == 1 and not held[0]["stale"], held
        assert call("renew", sid) == scope.lock_id
        # Writes of this store run under the scope's lock (set takes no lock of its own).
        store.set(sid, STATE, partial=PARTIAL)
    assert store.get(sid) == merged
    # unlock removes a lock whoever holds it: its holder finds it lost at its next renewal, and the
    # scope ends ABORTED (what it did was not exclusive).
    with pytest.raises(ChstateError) as ended:
        with store.lock("dev:unlocked"):
            assert [lock["state_id"] for lock in call("unlock", "dev:unlocked")] == ["dev:unlocked"]
            with pytest.raises(ChstateError) as e:
                store.renew("dev:unlocked")
            assert e.value.code == "ABORTED", e.value
    assert ended.value.code == "ABORTED" and "lost while held" in ended.value.message, ended.value

    call("delete", "dev:moved")
    assert store.get("dev:moved") is None
    assert call("clear_all") == 3
    assert store.list() == []
    return ran


def contender(cli: Path, server, schema: str, state_id: str, wait_s: float = 2) -> subprocess.Popen:
    """Starts `chstate lock ID --timeout WAIT -- true` against `schema`: it exits 4 when the id's lock
    stays held by someone else for WAIT seconds, 0 when it got the lock. Its validity (--stale-lock) is
    the holder's, 1 s, as in a fleet sharing its settings: with its default 10 s it would wait out a
    holder that stopped renewing too, and the test could not fail."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CLICKHOUSE_", "MELTANO_", "CHSTATE_"))}
    env["MELTANO_STATE_BACKEND_CLICKHOUSE_SCHEMA"] = schema
    env["MELTANO_STATE_BACKEND_CLICKHOUSE_PASSWORD"] = server.password  # not in argv
    return subprocess.Popen([str(cli), "--uri", server.uri(), "--stale-lock", "1", "lock", state_id,
                             "--timeout", str(wait_s), "--", "true"],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def scope_keeps_its_lock(store, cli, server, schema: str, sid: str) -> None:
    """A lock scope (validity 1 s) whose block sleeps 3 s while the chstate command waits 2 s for the
    id: the binding's timer renews the lock, so the command must give up (exit 4) and the scope end
    cleanly. Without renewals the lock would be taken over after 1 s."""
    validity = store.settings["store"]["lock_validity_ms"] / 1000
    assert validity == 1, store.settings["store"]
    with store.lock(sid):
        other = contender(cli, server, schema, sid)
        time.sleep(3 * validity)
        out, err = other.communicate(timeout=30)
        assert other.returncode == 4, (other.returncode, out, err)
        assert server.password not in out + err
        store.set(sid, STATE)  # still this scope's lock
