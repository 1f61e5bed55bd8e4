"""Histories of merges and reads through every runtime at once, under injected faults, checked.

Six runtimes run a seeded plan of operations on two shared state ids at the
same time, all through one seeded fault proxy in front of the real ClickHouse
18.16:

  cli       the native CLI, one process per operation (`chstate merge`, `chstate get`)
  python    the Python binding over the native library (chstate_meltano.binding.Store)
  wasmtime  the Wasm module under wasmtime (hosts/wasi/chstate_wasmtime.py)
  node      the Wasm module in Node (history_node.mjs over chstate_wasi.mjs)
  lua       the Lua 5.4 module (chstate.so)
  openresty the LuaJIT module in a real nginx (the rock made into a tree
            outside the checkout, as tests/openresty runs it; cosockets), its
            whole plan one request to the /history location below

A merge adds a key no other merge adds; a read returns the id's keys. The
proxy breaks a share of all requests: dropped before the server sees them,
the answer lost after the server did the work, reset in the middle of the
answer, or answered after the client's request timeout. Every operation is
recorded (runtime, invoked, completed, ok / failed / unknown, value), and
history_check proves the history: no acknowledged merge lost, and every read
linearizable per id (an exact check for a grow-only set; history_check.py).

The negative control: Python threads that read, then write the read state
plus their key, with no lock around the pair. The same checker must find
the merges they lose.

Found by this suite and closed: a request the server runs after the client
gave up on it (`slow_before`: held past the request timeout, then
forwarded). Before state writes were fenced on their lock, 2 of 6 runs with
it (seeds 1 to 4) lost acknowledged merges: the requests run late included
releases' `DROP TABLE IF EXISTS <lock table>` (which removes whoever holds
that lock when it runs) and state INSERTs. It is in the default faults now
(docs/lock.md, "Fenced writes").

A replica killed under this load: tests/cluster/test_histories_ha.py runs the
same runtimes, plans and checker against three replicas and kills one.
"""

from __future__ import annotations

import json
import math
import os
import random
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from history_check import Op, check

REPO = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(REPO / "hosts" / "python"))
sys.path.insert(0, str(REPO / "hosts" / "wasi"))
sys.path.insert(0, str(REPO / "tests" / "openresty"))

from chstate_meltano import _native, binding  # noqa: E402
from nginx_server import Nginx, NginxMissing, check_installed, running_nginx  # noqa: E402
from test_same_policy import artifacts, python_library, wasmtime_module  # noqa: E402,F401  (fixtures)

pytestmark = pytest.mark.requires_clickhouse

SEED = int(os.environ.get("CHSTATE_HISTORY_SEED", "38"))
OPS = int(os.environ.get("CHSTATE_HISTORY_OPS", "24"))  # per runtime
IDS = ["dev:shared-a", "dev:shared-b"]
FAULT_SHARE = 0.08
FAULTS = os.environ.get("CHSTATE_HISTORY_FAULTS",
                        "reset_request,close,reset_response,reset_mid_body,slow,slow_before").split(",")
RUNTIMES = ["cli", "python", "wasmtime", "node", "lua", "openresty"]
# Short enough that a lock whose release was lost blocks the others for seconds, not ten.
LOCK = {"lock_timeout_seconds": 3, "lock_wait_seconds": 30, "connect_timeout_seconds": 1,
        "request_timeout_seconds": 1}

LUA_SCRIPT = r"""
local chstate = require "chstate"
local socket = require "socket"
local uri, schema, settings_json, plan_json = table.unpack(arg)
local opts = chstate.from_json(settings_json)
opts.uri, opts.schema, opts.env = uri, schema, false
opts.password = os.getenv("CHSTATE_HISTORY_PASSWORD") or ""
local store = chstate.open(opts)
for _, step in ipairs(chstate.from_json(plan_json)) do
  local op, id, key = step[1], step[2], step[3]
  local t0 = socket.gettime()
  local ok, r = pcall(function()
    if op == "merge" then return store:merge(id, {singer_state = {[key] = 1}}) end
    return store:get(id)
  end)
  local line = {t0 = t0, t1 = socket.gettime(), code = "OK"}
  if ok then
    if op == "read" then line.value = r end
  else
    line.code = chstate.is_error(r) and r.code or "THROWN"
    line.message = tostring(r):sub(1, 300)
  end
  print(chstate.to_json(line))
end
store:close()
"""

# OpenResty's runtime: nginx (one worker, master_process off) with this location; the
# store's URI (the fault proxy's port, or a cluster's host list) and password come from
# nginx's environment. The plan is the request body, the schema and the timeouts (JSON)
# arguments; one store runs the steps in order,
# each error recorded (pcall) and the plan going on, and the answer is one JSON line per
# step. ngx.now() (after ngx.update_time()) is the wall clock in whole milliseconds,
# rounded down: t1 gets 1 ms more, so the recorded interval holds the real one.
HISTORY_LOCATION = r"""
    location = /history {
      client_max_body_size 1m;
      client_body_buffer_size 1m;
      content_by_lua_block {
        local chstate = require "chstate"
        ngx.req.read_body()
        local steps = chstate.from_json(ngx.req.get_body_data() or "null")
        local opts = chstate.from_json(ngx.unescape_uri(ngx.var.arg_settings))
        opts.schema = ngx.var.arg_schema
        local store = chstate.open(opts)
        for _, step in ipairs(steps) do
          local op, id, key = step[1], step[2], step[3]
          ngx.update_time()
          local t0 = ngx.now()
          local ok, r = pcall(function()
            if op == "merge" then return store:merge(id, {singer_state = {[key] = 1}}) end
            return store:get(id)
          end)
          ngx.update_time()
          local line = {t0 = t0, t1 = ngx.now() + 0.001, code = "OK"}
          if ok then
            if op == "read" then line.value = r end
          else
            line.code = chstate.is_error(r) and r.code or "THROWN"
            line.message = tostring(r):sub(1, 300)
          end
          ngx.say(chstate.to_json(line))
        end
        local closed, err = pcall(store.close, store)
        if not closed then ngx.log(ngx.ERR, "history: close failed: ", tostring(err)) end
      }
    }
"""


def keys_of(value) -> frozenset:
    if isinstance(value, dict) and "merged" in value:
        value = value["merged"]
    return frozenset((value or {}).get("singer_state", {}).keys()) if isinstance(value, dict) else frozenset()


def plan(runtime: str, rng: random.Random, n: int) -> list[list]:
    out = []
    for i in range(n):
        state_id = rng.choice(IDS)
        out.append(["merge", state_id, f"{runtime}-{i}"] if rng.random() < 0.6 else ["read", state_id])
    return out


def record(runtime: str, step: list, t0: float, t1: float, ok: bool, value=None, detail: str = "") -> Op:
    kind, state_id = step[0], step[1]
    if kind == "merge":
        return Op(runtime, "merge", state_id, t0, t1 if ok else math.inf, "ok" if ok else "unknown",
                  key=step[2], detail=detail)
    return Op(runtime, "read", state_id, t0, t1, "ok" if ok else "fail", value=keys_of(value) if ok else frozenset(),
              detail=detail)


class Runtimes:
    """The six runtimes, each running its plan against `uris[name]` (a URI with no password:
    one host, the fault proxy's, or a cluster's host list) in one schema, with the store
    settings `timeouts`. `cli(*args)` runs one `chstate` command (its URI, password and
    timeouts its own); `done(op)`, if given, is called as each operation of the CLI and the
    in-process runtimes (python, wasmtime) completes."""

    def __init__(self, uris: dict[str, str], password: str, schema: str, cli, artifacts, wasm_compiled, tmp: Path,
                 nginx: Nginx | None = None, timeouts: dict | None = None, done=None):
        self.uris, self.password, self.schema, self.cli = uris, password, schema, cli
        self.artifacts, self.compiled, self.tmp, self.nginx = artifacts, wasm_compiled, tmp, nginx
        self.timeouts = dict(timeouts or LOCK)
        self.done = done or (lambda op: None)

    def settings(self, runtime: str) -> dict:
        return {"uri": self.uris[runtime], "password": self.password, "schema": self.schema, **self.timeouts}

    def child_env(self) -> dict:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("CLICKHOUSE_", "MELTANO_", "CHSTATE_"))}
        env["CHSTATE_HISTORY_PASSWORD"] = self.password
        return env

    def _recorded(self, op: Op) -> Op:
        self.done(op)
        return op

    def run_cli(self, steps: list) -> list[Op]:
        out = []
        for step in steps:
            args = (["merge", step[1], json.dumps({"singer_state": {step[2]: 1}})] if step[0] == "merge"
                    else ["get", step[1]])
            t0 = time.time()
            r = self.cli(*args)
            t1 = time.time()
            value = json.loads(r.stdout) if r.returncode == 0 and step[0] == "read" else None
            out.append(self._recorded(record("cli", step, t0, t1, r.returncode == 0, value,
                                             f"exit {r.returncode} {r.stderr.decode(errors='replace')[-200:]}")))
        return out

    def _run_store(self, runtime: str, store, error_type, steps: list) -> list[Op]:
        out = []
        try:
            for step in steps:
                t0 = time.time()
                try:
                    value = (store.merge(step[1], {"singer_state": {step[2]: 1}}) if step[0] == "merge"
                             else store.get(step[1]))
                    out.append(self._recorded(record(runtime, step, t0, time.time(), True, value)))
                except error_type as e:
                    out.append(self._recorded(record(runtime, step, t0, time.time(), False, detail=str(e)[:200])))
        finally:
            store.close()
        return out

    def run_python(self, steps: list) -> list[Op]:
        return self._run_store("python", binding.Store(_native.NativeCore(), self.settings("python"), env={}),
                               binding.ChstateError, steps)

    def run_wasmtime(self, steps: list) -> list[Op]:
        from chstate_wasmtime import ChstateError, ChstateModule, Store, WasmtimeCore
        engine, module = self.compiled
        return self._run_store("wasmtime", Store(WasmtimeCore(ChstateModule(engine=engine, module=module)),
                                                 self.settings("wasmtime"), env={}), ChstateError, steps)

    def _lines(self, runtime: str, argv: list[str], env: dict, steps: list) -> list[Op]:
        p = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=600)
        return self._records(runtime, p.stdout, steps, f"(exit {p.returncode}):\n{p.stderr[-2000:]}")

    def _records(self, runtime: str, text: str, steps: list, why: str) -> list[Op]:
        lines = [json.loads(line) for line in text.splitlines() if line.startswith("{")]
        assert len(lines) == len(steps), f"{runtime} ran {len(lines)} of {len(steps)} {why}"
        return [record(runtime, step, d["t0"], d["t1"], d["code"] == "OK", d.get("value"), d.get("message", ""))
                for step, d in zip(steps, lines)]

    def run_node(self, steps: list) -> list[Op]:
        argv = ["node", "--no-warnings", str(HERE / "history_node.mjs"), str(self.artifacts["CHSTATE_WASM"]),
                self.uris["node"], self.schema, json.dumps(self.timeouts), json.dumps(steps)]
        return self._lines("node", argv, self.child_env(), steps)

    def run_lua(self, steps: list) -> list[Op]:
        script = self.tmp / "history.lua"
        script.write_text(LUA_SCRIPT)
        env = self.child_env()
        env["LUA_CPATH_5_4"] = f"{self.artifacts['CHSTATE_LUA_SO'].parent}/?.so;;"
        argv = ["lua5.4", str(script), self.uris["lua"], self.schema, json.dumps(self.timeouts), json.dumps(steps)]
        return self._lines("lua", argv, env, steps)

    def run_openresty(self, steps: list) -> list[Op]:
        # The whole plan is one request: nginx's one worker runs it while serving nothing else.
        # Its URI is nginx's own (running_nginx); uris["openresty"] is what it was given.
        status, text, _ = self.nginx.post("/history", json.dumps(steps).encode(), timeout=600,
                                          schema=self.schema, settings=json.dumps(self.timeouts))
        return self._records("openresty", text, steps,
                             f"(HTTP {status}):\n{text[-1000:]}\nerror log:\n{self.nginx.error_log()[-2000:]}")


def final_keys(cli) -> dict[str, frozenset]:
    out = {}
    for state_id in IDS:
        r = cli.direct("get", state_id)
        assert r.returncode == 0, r.stderr
        out[state_id] = keys_of(json.loads(r.stdout))
    return out


def seed_ids(cli) -> None:
    for state_id in IDS:
        r = cli.direct("merge", state_id, json.dumps({"singer_state": {"seed": 1}}))
        assert r.returncode == 0, r.stderr


def run_concurrently(jobs: dict) -> list[Op]:
    results, errors = {}, {}

    def go(name, fn):
        try:
            results[name] = fn()
        except BaseException as e:  # reported below, with the runtime's name
            errors[name] = e

    threads = [threading.Thread(target=go, args=(name, fn)) for name, fn in jobs.items()]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    return [op for name in jobs for op in results[name]]


def seed_op() -> list[Op]:
    return [Op("seed", "merge", state_id, 0.0, 0.0, "ok", key="seed") for state_id in IDS]


# ---- the checker itself: it must reject what is wrong -------------------------------------

def test_the_checker_rejects_a_lost_merge_a_stale_read_and_incomparable_reads():
    m = lambda k, t0, t1, outcome="ok": Op("t", "merge", "x", t0, t1, outcome, key=k)  # noqa: E731
    r = lambda keys, t0, t1: Op("t", "read", "x", t0, t1, "ok", value=frozenset(keys))  # noqa: E731
    good = [m("a", 0, 1), m("b", 2, 3), r({"a"}, 1.5, 1.6), r({"a", "b"}, 2.5, 4)]
    assert check(good, {"x": frozenset({"a", "b"})}, 10) == []
    # A merge acknowledged, then missing from the final state.
    assert any("lost" in a for a in check(good, {"x": frozenset({"a"})}, 10))
    # A read that began after b was acknowledged and did not see it.
    assert check([m("a", 0, 1), m("b", 2, 3), r({"a"}, 3.5, 4)], {"x": frozenset({"a", "b"})}, 10) != []
    # A read that saw b before b was invoked.
    assert check([m("a", 0, 1), m("b", 5, 6), r({"a", "b"}, 2, 3)], {"x": frozenset({"a", "b"})}, 10) != []
    # Two reads each seeing what the other did not.
    assert check([m("a", 0, 5), m("b", 0, 5), r({"a"}, 1, 2), r({"b"}, 1, 2)],
                 {"x": frozenset({"a", "b"})}, 10) != []
    # A later read seeing less than an earlier one.
    assert check([m("a", 0, 1), m("b", 0, 5), r({"a", "b"}, 2, 3), r({"a"}, 4, 4.5)],
                 {"x": frozenset({"a", "b"})}, 10) != []
    # An unknown merge may or may not have happened; a failed one did not.
    assert check([m("a", 0, math.inf, "unknown"), r(set(), 1, 2)], {"x": frozenset({"a"})}, 10) == []
    assert check([m("a", 0, math.inf, "fail"), r({"a"}, 1, 2)], {"x": frozenset({"a"})}, 10) != []


# ---- the suite --------------------------------------------------------------------------------

@pytest.fixture
def openresty(clickhouse, proxy):
    """nginx running the LuaJIT rock with HISTORY_LOCATION, its store's URI this test's
    fault proxy (started after the proxy, stopped before it); or, when nginx or its Lua
    module is not installed, the message saying so, for the test to fail with."""
    try:
        check_installed()
    except NginxMissing as e:
        yield str(e)
        return
    s = clickhouse
    with running_nginx(f"clickhouse://{s.user}@{s.host}:{proxy.port}/default", s.password,
                       HISTORY_LOCATION) as server:
        yield server


def test_histories_through_every_runtime_under_faults_are_linearizable(
        clickhouse, proxy, cli_factory, artifacts, python_library, wasmtime_module, openresty,  # noqa: F811
        tmp_path, capsys):
    assert wasmtime_module is not None, "the wasmtime package is needed (tools/setup installs it)"
    assert isinstance(openresty, Nginx), openresty
    cli = cli_factory()
    assert cli.direct("init").returncode == 0
    seed_ids(cli)
    s = clickhouse
    uri = f"clickhouse://{s.user}@{s.host}:{proxy.port}/default"
    extra = {"MELTANO_STATE_BACKEND_LOCK_TIMEOUT_SECONDS": str(LOCK["lock_timeout_seconds"]),
             "MELTANO_STATE_BACKEND_CLICKHOUSE_LOCK_WAIT_SECONDS": str(LOCK["lock_wait_seconds"])}
    rt = Runtimes({name: uri for name in RUNTIMES}, s.password, cli.schema,
                  lambda *args: cli.run(proxy.port, *args, timeout=1.0, extra_env=extra, wait=120),
                  artifacts, wasmtime_module, tmp_path, openresty)
    rng = random.Random(SEED)
    plans = {name: plan(name, rng, OPS) for name in RUNTIMES}
    proxy.random_faults(FAULT_SHARE, FAULTS, SEED, delay=1.3)
    start = time.time()
    ops = run_concurrently({name: (lambda name=name: getattr(rt, f"run_{name}")(plans[name])) for name in RUNTIMES})
    took = time.time() - start
    proxy.random_faults(0.0, FAULTS, SEED)
    # Nothing in flight: the proxy is done with the server for every request it took.
    for r in list(proxy.requests):
        assert r.upstream_done.wait(30), f"the proxy never finished with {r.sql[:80]!r}"
    end = time.time()
    final = final_keys(cli)
    anomalies = check(seed_op() + ops, final, end)
    faults = [r.fault for r in proxy.requests if r.fault]
    by = {o: sum(1 for x in ops if x.outcome == o) for o in ("ok", "fail", "unknown")}
    with capsys.disabled():
        print(f"\n[histories] {len(ops)} operations through {len(RUNTIMES)} runtimes on {len(IDS)} ids in {took:.1f} s "
              f"(seed {SEED}): {by['ok']} ok, {by['fail']} failed reads, {by['unknown']} merges of unknown outcome; "
              f"{len(proxy.requests)} requests, {len(faults)} faults injected "
              f"({', '.join(f'{f} {faults.count(f)}' for f in FAULTS)}); {len(anomalies)} anomalies")
    late = [r.sql.split("(")[0][:70] for r in proxy.requests if r.fault == "slow_before"]
    assert anomalies == [], "\n".join(anomalies[:10]) + f"\nrequests run late (slow_before): {late}"
    # The faults were there, and the runtimes still got most of their work done.
    assert len(faults) >= 10, faults
    assert by["ok"] >= len(ops) // 2, by
    merges_ok = {o.key for o in ops if o.kind == "merge" and o.outcome == "ok"}
    for name in RUNTIMES:
        assert any(k.startswith(f"{name}-") for k in merges_ok), f"no merge of {name} was acknowledged"


def test_the_negative_control_a_read_then_write_without_a_lock_is_caught(clickhouse, cli_factory, python_library,  # noqa: F811
                                                                        capsys):
    """Three threads read the id and write back what they read plus their key, with no lock
    around the pair (each write takes the lock alone): merges are lost, and the checker
    must say so."""
    cli = cli_factory()
    assert cli.direct("init").returncode == 0
    seed_ids(cli)
    s = clickhouse
    settings = {"uri": f"clickhouse://{s.user}@{s.host}:{s.port}/default", "password": s.password,
                "schema": cli.schema, **LOCK}

    def unlocked(name: str) -> list[Op]:
        store = binding.Store(_native.NativeCore(), settings, env={})
        out = []
        try:
            for i in range(12):
                key, t0 = f"{name}-{i}", time.time()
                seen = store.get(IDS[0])["merged"]
                time.sleep(0.02)  # a client between its read and its write
                state = {"singer_state": {**seen.get("singer_state", {}), key: 1}}
                store.set(IDS[0], state)
                out.append(Op(name, "merge", IDS[0], t0, time.time(), "ok", key=key))
        finally:
            store.close()
        return out

    ops = run_concurrently({f"rmw{i}": (lambda i=i: unlocked(f"rmw{i}")) for i in range(3)})
    anomalies = check(seed_op() + ops, final_keys(cli), time.time())
    with capsys.disabled():
        print(f"\n[histories, negative control] {len(ops)} unlocked read-then-writes by 3 threads: "
              f"{len(anomalies)} anomalies, e.g. {anomalies[:1]}")
    assert any("lost" in a for a in anomalies), "the checker passed a history with lost updates"
