"""Fault injection through the Meltano adapter's own transport.

The adapter (hosts/python) runs the core through its C ABI with the Python
binding's pump (chstate_meltano.binding.Store over _native.NativeCore) and
its HTTP transport (chstate_meltano._http), not the native executor, so its
retry rules are checked here separately: each request of each operation
Meltano performs (get, set and delete, each under the id's lock, list,
clear_all, and update() = the lock scope around get and set) is broken in
each way the fault proxy knows. Stores open from settings as the adapter
opens them (its background timer, so a released lock lingers until close). After every run the outcome is success with exactly the new states,
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

from chstate_meltano import _native  # noqa: E402
from chstate_meltano.binding import ChstateError, Store  # noqa: E402
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import native_library  # noqa: E402


@pytest.fixture(scope="module")
def library():
    subprocess.run(["bazel", "build", "//hosts/python:libchstate.so"], cwd=REPO, check=True, capture_output=True)
    path = REPO / "bazel-out" / "k8-fastbuild" / "bin" / "hosts" / "python" / "libchstate.so"
    assert path.exists(), f"{path} is missing after the build"
    with native_library.loaded(path) as lib:
        yield lib


def update(store: Store) -> None:
    """Meltano's update(): under the lock, read, merge a partial, write."""
    with store.lock("dst"):
        current = store.get("dst")
        store.set("dst", current["completed"], partial=P, force=True)


# op -> (what it does with a store, the states after it succeeds)
OPS = {
    "get": (lambda s: s.get("src"), BEFORE),
    "set": (lambda s: s.set("dst", A, force=True), {"src": full(A), "dst": full(A)}),
    "delete": (lambda s: s.delete("dst"), {"src": full(A)}),
    "list": (lambda s: s.list("*s*"), BEFORE),
    "clear_all": (lambda s: s.clear_all(), {}),
    "update": (update, {"src": full(A), "dst": full(B, P)}),
}


def make_store(cli, port: int) -> Store:
    server = cli.server
    return Store(_native.NativeCore(), {
        "uri": f"clickhouse://{server.user}@{server.host}:{port}/default", "password": server.password,
        "schema": cli.schema, "lock_wait_seconds": 3, "lock_retry_seconds": 0.1, "request_timeout_seconds": 1,
        "connect_timeout_seconds": 1}, env={})


def run(cli, port: int, op: str):
    store = make_store(cli, port)
    try:
        OPS[op][0](store)
        return None
    except ChstateError as e:
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
