"""Fault injection through the Meltano adapter's own transport.

The adapter (hosts/python) runs the core through its C ABI with a Python
HTTP transport (chstate_meltano._http), not the native executor, so its
retry rules are checked here separately: each request of each operation
Meltano performs (get, set, delete, get_state_ids, clear_all, and update() =
acquire_lock, get, set, release) is broken in each way the fault proxy
knows. After every run the outcome is success with exactly the new states,
or a ChstateError naming what failed with the states exactly before or
after; a request that is not idempotent is never resent after its exchange
failed; a read broken in transport is retried and succeeds.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "hosts" / "python"))

from test_faults import (A, B, BEFORE, BODY_FAULTS, TRANSPORT_FAULTS, P, full, is_read,  # noqa: E402
                         non_idempotent, prepare)

from chstate_meltano import _http, _native  # noqa: E402
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import native_library  # noqa: E402


@pytest.fixture(scope="module")
def library():
    subprocess.run(["bazel", "build", "//hosts/python:libchstate.so"], cwd=REPO, check=True, capture_output=True)
    path = REPO / "bazel-out" / "k8-fastbuild" / "bin" / "hosts" / "python" / "libchstate.so"
    assert path.exists(), f"{path} is missing after the build"
    with native_library.loaded(path) as lib:
        yield lib


def hexid(s: str) -> str:
    return s.encode().hex()


def update(store: _native.Store) -> None:
    """Meltano's update(): under the lock, read, merge a partial, write."""
    lock = store.run({"op": "acquire_lock", "state_id_hex": hexid("dst")})
    try:
        current = store.run({"op": "get", "state_id_hex": hexid("dst")})["state"]
        store.run({"op": "set", "state_id_hex": hexid("dst"),
                   "state": {"completed": current["completed"], "partial": P}})
    finally:
        store.run({"op": "release_lock", "state_id_hex": hexid("dst"), "lock_id": lock["lock_id"]})


# op -> (what it does with a store, the states after it succeeds)
OPS = {
    "get": (lambda s: s.run({"op": "get", "state_id_hex": hexid("src")}), BEFORE),
    "set": (lambda s: s.run({"op": "set", "state_id_hex": hexid("dst"), "state": full(A)}),
            {"src": full(A), "dst": full(A)}),
    "delete": (lambda s: s.run({"op": "delete", "state_id_hex": hexid("dst")}), {"src": full(A)}),
    "list": (lambda s: s.run({"op": "list", "pattern_hex": hexid("*s*")}), BEFORE),
    "clear_all": (lambda s: s.run({"op": "clear_all"}), {}),
    "update": (update, {"src": full(A), "dst": full(B, P)}),
}


def make_store(cli, port: int) -> _native.Store:
    server = cli.server
    transport = _http.HttpTransport({"host": server.host, "port": port, "user": server.user,
                                     "password": server.password, "database": "default",
                                     "connect_timeout_ms": 1000})
    return _native.Store({"schema": cli.schema, "endpoint": f"{server.host}:{port}", "lock_timeout_ms": 3000,
                          "lock_retry_ms": 100, "request_timeout_ms": 1000}, transport)


def run(cli, port: int, op: str):
    store = make_store(cli, port)
    try:
        OPS[op][0](store)
        return None
    except _native.ChstateError as e:
        return e
    finally:
        store.close()


@pytest.mark.parametrize("op", list(OPS))
def test_every_request_of_every_adapter_operation_under_every_fault(op, library, cli_factory, proxy):
    cli = cli_factory()
    prepare(cli)
    proxy.clear()
    assert run(cli, proxy.port, op) is None
    sqls = proxy.sqls()
    assert sqls, "the operation sent nothing"
    after = OPS[op][1]
    outcomes: dict[str, dict[str, int]] = {}
    for n in range(len(sqls)):
        for fault in TRANSPORT_FAULTS + BODY_FAULTS:
            cli = cli_factory()
            prepare(cli)
            proxy.clear()
            proxy.fault_nth(n, fault)
            error = run(cli, proxy.port, op)
            what = f"{op} with {fault} on request {n}"
            got = cli.snapshot()
            if error is None:
                assert got == after, f"{what}: reported success but the states are {got}"
            else:
                assert error.code in ("UNAVAILABLE", "INTERNAL", "ABORTED", "UNKNOWN"), f"{what}: {error}"
                assert re.search(r"connection|timed out|answer|Memory limit|incomplete|reset|closed|lock",
                                 error.message), f"{what}: the message does not say what failed: {error}"
                assert cli.server.password not in error.message
                assert got in (BEFORE, after), f"{what}: failed and left the states as {got}\n{error}"
            reqs = proxy.requests
            for i, req in enumerate(reqs[:-1]):
                if req.fault and non_idempotent(req.sql):
                    assert reqs[i + 1].sql != req.sql, f"{what}: resent a non-idempotent request: {req.sql[:120]}"
            broken = [k for k, q in enumerate(reqs) if q.fault]
            if fault in TRANSPORT_FAULTS and broken and is_read(reqs[broken[0]].sql):
                i = broken[0]
                assert error is None, f"{what}: a read broken in transport was not retried: {error}"
                assert i + 1 < len(reqs) and reqs[i + 1].sql == reqs[i].sql, f"{what}: the read was not resent"
            key = "ok" if error is None else error.code
            outcomes.setdefault(fault, {}).setdefault(key, 0)
            outcomes[fault][key] += 1
    print(f"\nadapter {op}: {len(sqls)} requests; outcomes per fault: "
          + ", ".join(f"{f} {dict(sorted(c.items()))}" for f, c in outcomes.items()))
    assert set(outcomes) == set(TRANSPORT_FAULTS + BODY_FAULTS)
