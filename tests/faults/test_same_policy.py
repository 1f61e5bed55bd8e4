"""Every host resends exactly what the core tells it to, and nothing else.

Since the core owns the transport policy (core/task.h: a failed idempotent
request, or one that provably never left, goes again after 100 ms and then
200 ms, three sends in all; a non-idempotent request whose answer was lost is
never resent), the hosts are pumps that send each request once. Here the same
persistent fault, in front of the real ClickHouse 18.16, meets the same
operation through each host:

  cli            the native CLI (bazel-out/k8-fastbuild/bin/hosts/native/chstate)
  python         the Python binding as the Meltano adapter opens it: chstate_meltano.binding.Store
                 over _native.NativeCore, opened from settings (its own _http.HttpTransport)
  lua            the Lua module with its native transport, driven in C (store:run)
  lua_hooks      the same, driven by chstate.lua's own loop (now/sleep hooks given)
  wasm_node      the Wasm module in Node with httpTransport (same_policy_node.mjs)
  wasm_wasmtime  the Wasm module under wasmtime with hosts/wasi/chstate_wasmtime.py

and the proxy's own record (its request log with arrival times, and for
refusals the SYNs it refused, read off the loopback interface) must show the
same number of sends of the broken request from every host, the same spacing
(>= 100 ms, then >= 200 ms) and the same error (UNAVAILABLE; the CLI exits 5).

Faults (every attempt of one request kind, for the whole run):
  read_reset_request   every get_state is reset before the server sees it: 3 sends
  read_reset_response  every get_state runs, then its answer is reset: 3 sends
  write_lost           every insert_state runs, then its answer is reset: 1 send
  write_refused        from insert_state on, connections are refused: 3 connection
                       attempts (it never left, so even a write goes again)
  read_refused         from get_state on, connections are refused: 3 attempts

`test_the_comparison_catches_*` run the read fault through two broken Python
pumps (subclasses of binding.Store: one resends on its own, one gives up at
the core's first wait) and check that the same comparison rejects them.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import socket
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Callable

import pytest
from fault_proxy import FaultProxy, _response

REPO = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(REPO / "hosts" / "python"))
sys.path.insert(0, str(REPO / "hosts" / "wasi"))

from chstate_meltano import _native, binding  # noqa: E402
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import native_library  # noqa: E402

A = {"singer_state": {"a": 1}}
B = {"singer_state": {"b": 2}}
C = {"singer_state": {"c": 3}}

HOSTS = ["cli", "python", "lua", "lua_hooks", "wasm_node", "wasm_wasmtime"]
BACKOFF_S = [0.100, 0.200]  # core/defaults.h: kDefaultTransportBackoffMs, doubled
SLACK_S = 0.005             # clock granularity between the host's sleep and our timestamps
UNAVAILABLE_EXIT = 5


def full(completed, partial=None):
    return {"completed": completed, "partial": partial or {}}


# ---------------------------------------------------------------- what was sent

KINDS = [
    ("select_version", r"^SELECT version\(\)"),
    ("get_state", r"^SELECT partial_state, completed_state FROM"),
    ("insert_state", r"^INSERT INTO `[^`]+`\.`state` \(state_id, partial_state, completed_state\)"),
    ("create_database", r"^CREATE DATABASE"),
    ("create_state_table", r"^CREATE TABLE IF NOT EXISTS `[^`]+`\.`state`"),
    ("create_lock_table", r"^CREATE TABLE IF NOT EXISTS `[^`]+`\.`state_lock`"),
    ("create_history_table", r"^CREATE TABLE IF NOT EXISTS `[^`]+`\.`state_history`"),
    ("create_history_buffer", r"^CREATE TABLE IF NOT EXISTS `[^`]+`\.`state_history_buffer` AS"),
    ("create_history_view", r"^CREATE MATERIALIZED VIEW IF NOT EXISTS `[^`]+`\.`state_history_buffer_mv`"),
    ("drop_unbuffered_history_view", r"^DROP TABLE IF EXISTS `[^`]+`\.`state_history_mv`$"),
    ("create_lock", r"^CREATE TABLE `[^`]+`\.`state_lock_\w+`.* ENGINE = .* AS SELECT"),
    ("foreign_lock_rows", r"^SELECT lock_id, 1 FROM"),
    ("inspect_lock", r"^SELECT lock_id, seq,"),
    ("renew_lock", r"^INSERT INTO `[^`]+`\.`state_lock_\w+` SELECT"),
    ("drop_lock", r"^DROP TABLE IF EXISTS `[^`]+`\.`state_lock_\w+`"),
]
PATTERN = dict(KINDS)


def kind_of(sql: str) -> str:
    s = sql.lstrip()
    for name, pattern in KINDS:
        if re.search(pattern, s, re.S):
            return name
    return s[:40]


class _TimedLog(list):
    """The proxy's request log, stamping each request when the proxy has read it."""

    def append(self, item):
        item.at = time.monotonic()
        super().append(item)


class PolicyProxy(FaultProxy):
    """FaultProxy with arrival times, and one more fault: "refuse_after" answers the
    request (with Connection: close) after it stopped listening, so every later
    connection is refused (ECONNREFUSED: the next request provably never left)."""

    def __init__(self, host: str, port: int):
        super().__init__(host, port)
        self.requests = _TimedLog()

    def listening(self) -> bool:
        return self._listener is not None

    def _exchange(self, conn, method, path, headers, body, rule, captured) -> bool:
        if rule is None or rule.fault != "refuse_after":
            return super()._exchange(conn, method, path, headers, body, rule, captured)
        status, reason, hdrs, data = self._forward(method, path, headers, body)
        self.stop_listening()
        whole = _response(status, reason, hdrs, data)
        head, _, rest = whole.partition(b"\r\n\r\n")
        conn.sendall(head.replace(b"Connection: keep-alive", b"Connection: close") + b"\r\n\r\n" + rest)
        conn.shutdown(socket.SHUT_RDWR)
        return False


class SynRecorder:
    """Connection attempts to one loopback port, read off `lo` with a packet socket
    (kernel timestamps): which were refused (no SYN-ACK came back) and when."""

    SO_TIMESTAMPNS = 35  # Linux; the socket module does not export it

    def __init__(self, port: int):
        self.port = port
        self.sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(0x0003))
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)
        self.sock.setsockopt(socket.SOL_SOCKET, self.SO_TIMESTAMPNS, 1)
        self.sock.bind(("lo", 0))
        self.sock.settimeout(0.05)
        self._lock = threading.Lock()
        self._syns: list[tuple[float, int]] = []  # (kernel time, client port)
        self._accepted: set[int] = set()            # client ports that got a SYN-ACK
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                data, anc, _, addr = self.sock.recvmsg(256, socket.CMSG_SPACE(16))
            except socket.timeout:
                continue
            except OSError:
                return
            if addr[2] != 0:  # PACKET_HOST only: `lo` shows each packet twice
                continue
            stamp = time.time()
            for level, kind, value in anc:
                if level == socket.SOL_SOCKET and kind == self.SO_TIMESTAMPNS and len(value) >= 16:
                    sec, nsec = struct.unpack("qq", value[:16])
                    stamp = sec + nsec / 1e9
            ip = data[14:]
            if len(ip) < 20 or ip[0] >> 4 != 4 or ip[9] != 6:
                continue
            ihl = (ip[0] & 15) * 4
            if len(ip) < ihl + 14:
                continue
            sport, dport = struct.unpack("!HH", ip[ihl:ihl + 4])
            flags = ip[ihl + 13]
            with self._lock:
                if dport == self.port and flags & 0x12 == 0x02:
                    self._syns.append((stamp, sport))
                elif sport == self.port and flags & 0x12 == 0x12:
                    self._accepted.add(dport)

    def clear(self) -> None:
        time.sleep(0.05)  # let packets in flight be read
        with self._lock:
            self._syns.clear()
            self._accepted.clear()

    def refused(self) -> list[float]:
        """Kernel times of the connection attempts that were not accepted."""
        time.sleep(0.05)
        with self._lock:
            return [t for t, client in self._syns if client not in self._accepted]

    def close(self) -> None:
        self._stop.set()
        self._thread.join(1)
        self.sock.close()


# ---------------------------------------------------------------- the hosts


@dataclasses.dataclass
class Outcome:
    code: str                 # "OK" or the error code
    exit: int | None = None   # the CLI's exit status
    message: str = ""


def _build(*targets: str, config: list[str] | None = None) -> None:
    r = subprocess.run(["bazel", "build", *(config or []), *targets], cwd=REPO, capture_output=True, text=True)
    assert r.returncode == 0, f"bazel build {' '.join(targets)} failed:\n{r.stderr[-3000:]}"


@pytest.fixture(scope="session")
def artifacts(chstate_bin) -> dict:
    """The Python adapter's libchstate.so, the Lua module and the Wasm module
    ($CHSTATE_LIBRARY, $CHSTATE_LUA_SO, $CHSTATE_WASM, else built: fastbuild
    outputs, as tests/faults/conftest.py, and wasm32 as tests/wasi/conftest.py)."""
    fast = REPO / "bazel-out" / "k8-fastbuild" / "bin"
    wanted = {"CHSTATE_LIBRARY": ("//hosts/python:libchstate.so", fast / "hosts/python/libchstate.so"),
              "CHSTATE_LUA_SO": ("//hosts/lua:chstate.so", fast / "hosts/lua/chstate.so")}
    missing = [target for var, (target, _) in wanted.items() if not os.environ.get(var)]
    if missing:
        _build(*missing)
    out = {var: Path(os.environ[var]).resolve() if os.environ.get(var) else path
           for var, (_, path) in wanted.items()}
    if os.environ.get("CHSTATE_WASM"):
        out["CHSTATE_WASM"] = Path(os.environ["CHSTATE_WASM"]).resolve()
    else:
        _build("//hosts/wasi:chstate.wasm", config=["--config=wasi", "--symlink_prefix=/"])
        info = subprocess.run(["bazel", "info", "--config=wasi", "bazel-bin"], cwd=REPO, check=True,
                              capture_output=True, text=True)
        out["CHSTATE_WASM"] = Path(info.stdout.strip()) / "hosts" / "wasi" / "chstate.wasm"
    for var, path in out.items():
        assert path.exists(), f"{var}: {path} is missing"
    return out


@pytest.fixture(scope="session")
def python_library(artifacts):
    with native_library.loaded(artifacts["CHSTATE_LIBRARY"]) as lib:
        yield lib


@pytest.fixture(scope="session")
def wasmtime_module(artifacts):
    """None without the wasmtime package: that (extra) host is then left out."""
    try:
        import wasmtime
    except ImportError:
        return None
    engine = wasmtime.Engine()
    return engine, wasmtime.Module.from_file(engine, str(artifacts["CHSTATE_WASM"]))


LUA_SCRIPT = r"""
local chstate = require "chstate"
local mode, host, port, user, schema, op, id, state_json = table.unpack(arg)
local opts = {host = host, port = port, user = user, password = os.getenv("CHSTATE_SAME_POLICY_PASSWORD") or "",
              database = "default", schema = schema, env = false, request_timeout_seconds = 1,
              connect_timeout_seconds = 1}
if mode == "hooks" then
  -- chstate.lua's own driving loop (the C loop, store:run, is used without hooks)
  local socket = require "socket"
  opts.now, opts.sleep = socket.gettime, socket.sleep
end
local store = chstate.open(opts)
local ok, err = pcall(function()
  if op == "get" then return store:get(id) end
  return store:set(id, chstate.from_json(state_json))
end)
if ok then
  print(chstate.to_json({code = "OK"}))
else
  print(chstate.to_json({code = chstate.is_error(err) and err.code or "THROWN", message = tostring(err)}))
end
store:close()
"""


class Hosts:
    """Runs one operation, ("get", id) or ("set", id, completed), through one host."""

    def __init__(self, server, artifacts, tmp: Path, python_store_class=None):
        self.server, self.artifacts = server, artifacts
        self.lua_script = tmp / "same_policy.lua"
        self.lua_script.write_text(LUA_SCRIPT)
        self.python_store_class = python_store_class or binding.Store
        self.compiled = None  # (engine, module) for wasmtime

    def _child_env(self) -> dict:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("CLICKHOUSE_", "MELTANO_", "CHSTATE_"))}
        env["CHSTATE_SAME_POLICY_PASSWORD"] = self.server.password
        return env

    def _json_line(self, proc: subprocess.CompletedProcess, who: str) -> Outcome:
        lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
        assert lines, f"{who} printed no result (exit {proc.returncode}):\n{proc.stdout}\n{proc.stderr[-3000:]}"
        doc = json.loads(lines[-1])
        return Outcome(doc["code"], message=doc.get("message", ""))

    def run(self, host: str, cli, port: int, op: tuple) -> Outcome:
        return getattr(self, host)(cli, port, op)

    def cli(self, cli, port: int, op: tuple) -> Outcome:
        args = ["get", op[1]] if op[0] == "get" else ["set", op[1], json.dumps(op[2])]
        r = cli.run(port, "--json", *args, timeout=1.0, wait=60)
        if r.returncode == 0:
            return Outcome("OK", 0)
        doc = json.loads(r.stdout)
        return Outcome(doc["error"]["code"], r.returncode, doc["error"]["message"])

    def python(self, cli, port: int, op: tuple) -> Outcome:
        s = self.server
        store = self.python_store_class(_native.NativeCore(), {
            "uri": f"clickhouse://{s.user}@{s.host}:{port}/default", "password": s.password, "schema": cli.schema,
            "connect_timeout_seconds": 1, "request_timeout_seconds": 1}, env={})
        try:
            if op[0] == "get":
                store.get(op[1])
            else:
                store.set(op[1], op[2])  # the completed side
            return Outcome("OK")
        except binding.ChstateError as e:
            return Outcome(e.code, message=e.message)
        finally:
            store.close()  # and its transport

    def _lua(self, mode: str, cli, port: int, op: tuple) -> Outcome:
        so = self.artifacts["CHSTATE_LUA_SO"]
        env = self._child_env()
        env["LUA_CPATH_5_4"] = f"{so.parent}/?.so;;"
        argv = ["lua5.4", str(self.lua_script), mode, self.server.host, str(port), self.server.user, cli.schema,
                *op[:2], *([json.dumps(op[2])] if op[0] == "set" else [])]
        return self._json_line(subprocess.run(argv, capture_output=True, text=True, env=env, timeout=60), "lua")

    def lua(self, cli, port: int, op: tuple) -> Outcome:
        return self._lua("native", cli, port, op)

    def lua_hooks(self, cli, port: int, op: tuple) -> Outcome:
        return self._lua("hooks", cli, port, op)

    def wasm_node(self, cli, port: int, op: tuple) -> Outcome:
        argv = ["node", "--no-warnings", str(HERE / "same_policy_node.mjs"), str(self.artifacts["CHSTATE_WASM"]),
                self.server.host, str(port), self.server.user, cli.schema, *op[:2],
                *([json.dumps(op[2])] if op[0] == "set" else [])]
        env = self._child_env()
        if os.environ.get("CHSTATE_SAME_POLICY_WASI_HOST"):  # the self-check's scratch copy
            env["CHSTATE_SAME_POLICY_WASI_HOST"] = os.environ["CHSTATE_SAME_POLICY_WASI_HOST"]
        return self._json_line(subprocess.run(argv, capture_output=True, text=True, env=env, timeout=60), "node")

    def wasm_wasmtime(self, cli, port: int, op: tuple) -> Outcome:
        from chstate_wasmtime import ChstateError, ChstateModule, Store, WasmtimeCore
        engine, module = self.compiled
        s = self.server
        store = Store(WasmtimeCore(ChstateModule(engine=engine, module=module)),
                      {"uri": f"clickhouse://{s.user}@{s.host}:{port}/default", "password": s.password,
                       "schema": cli.schema, "connect_timeout_seconds": 1, "request_timeout_seconds": 1}, env={})
        try:
            if op[0] == "get":
                store.get(op[1])
            else:
                store.set(op[1], op[2])  # the completed side
            return Outcome("OK")
        except ChstateError as e:
            return Outcome(e.code, message=str(e))
        finally:
            store.close()


# ---------------------------------------------------------------- the scenarios


@dataclasses.dataclass
class Observed:
    outcome: Outcome
    kinds: list[str]           # what reached the proxy, in order
    attempts: int              # sends of the faulted request (refusals: refused connection attempts)
    times: list[float]         # when each of those arrived (proxy log / kernel timestamps)
    state: dict | None         # the written id's state on the server afterwards (write scenarios)
    later: list[list[float]] = dataclasses.field(default_factory=list)  # refusals: the requests after it

    def gaps(self) -> list[float]:
        return _gaps(self.times)


def _gaps(times: list[float]) -> list[float]:
    return [round(b - a, 3) for a, b in zip(times, times[1:])]


def split_requests(times: list[float]) -> list[list[float]]:
    """Refused connection attempts, one group per request: the core's resends
    follow a wait (>= 100 ms); a new request follows a failure at once. (A host
    resending on its own without waiting splits into groups of one, and shows
    as one send.)"""
    groups: list[list[float]] = []
    for t in times:
        if groups and t - groups[-1][-1] >= BACKOFF_S[0] / 2:
            groups[-1].append(t)
        else:
            groups.append([t])
    return groups


@dataclasses.dataclass
class Scenario:
    name: str
    op: tuple
    target: str                # the request kind under the fault
    fault: str                 # a FaultProxy fault, or "refuse" (refuse_after the request before it)
    attempts: int              # expected sends of it
    states: tuple = ()         # acceptable states of the written id afterwards


SCENARIOS = {
    "read_reset_request": Scenario("read_reset_request", ("get", "src"), "get_state", "reset_request", 3),
    "read_reset_response": Scenario("read_reset_response", ("get", "src"), "get_state", "reset_response", 3),
    "write_lost": Scenario("write_lost", ("set", "dst", C), "insert_state", "reset_response", 1,
                           (full(B), full(C))),
    "write_refused": Scenario("write_refused", ("set", "dst", C), "insert_state", "refuse", 3, (full(B),)),
    "read_refused": Scenario("read_refused", ("get", "src"), "get_state", "refuse", 3),
}


def prepare(cli) -> None:
    for state_id, state in (("src", A), ("dst", B)):
        r = cli.direct("set", state_id, json.dumps(state))
        assert r.returncode == 0, r.stderr


@pytest.fixture
def policy_proxy(clickhouse):
    p = PolicyProxy(clickhouse.host, clickhouse.port)
    yield p
    p.close()


@pytest.fixture
def syn_recorder(policy_proxy):
    try:
        rec = SynRecorder(policy_proxy.port)
    except (PermissionError, OSError) as e:
        pytest.skip(f"no packet socket on lo ({e}): refused connection attempts cannot be counted")
    yield rec
    rec.close()


@pytest.fixture
def hosts(clickhouse, artifacts, python_library, wasmtime_module, tmp_path):
    h = Hosts(clickhouse, artifacts, tmp_path)
    h.compiled = wasmtime_module
    return h


def observe(sc: Scenario, host: str, hosts: Hosts, cli_factory, proxy: PolicyProxy,
            syns: SynRecorder | None) -> Observed:
    """Runs the scenario's operation through one host on a fresh schema."""
    n_before = None
    cli = cli_factory()
    prepare(cli)
    if sc.fault == "refuse":
        # Learn where the target comes in this host's sequence (a clean run),
        # then, with the states put back, refuse every connection from just
        # after the request before it.
        proxy.clear()
        assert hosts.run(host, cli, proxy.port, sc.op).code == "OK", f"{host}: the clean run failed"
        clean = [kind_of(s) for s in proxy.sqls()]
        assert sc.target in clean, f"{host}: {sc.op} sent no {sc.target}: {clean}"
        n_before = clean.index(sc.target)
        prepare(cli)
    proxy.clear()
    if not proxy.listening():
        proxy.accept()
    if syns is not None:
        syns.clear()
    if sc.fault == "refuse":
        if n_before == 0:
            proxy.stop_listening()
        else:
            proxy.fault_nth(n_before - 1, "refuse_after")
    else:
        proxy.add_rule(PATTERN[sc.target], sc.fault, times=1000)
    outcome = hosts.run(host, cli, proxy.port, sc.op)
    reqs = list(proxy.requests)
    kinds = [kind_of(r.sql) for r in reqs]
    later: list[list[float]] = []
    if sc.fault == "refuse":
        # Every connection after the refusal starts is refused, so requests the
        # operation sends after the target (the CLI's and Lua's set release
        # their lock) are refused too: each is one group of attempts.
        groups = split_requests(syns.refused())
        times, later = (groups[0], groups[1:]) if groups else ([], [])
    else:
        times = [r.at for r in reqs if kind_of(r.sql) == sc.target]
    state = cli.snapshot().get(sc.op[1]) if sc.op[0] == "set" else None
    if not proxy.listening():
        proxy.accept()
    return Observed(outcome, kinds, len(times), times, state, later)


def table(sc: Scenario, seen: dict[str, Observed]) -> str:
    rows = [f"{sc.name}: {sc.fault} on every {sc.target} during {sc.op[:2]}"]
    for host, o in seen.items():
        rows.append(f"  {host:14} {sc.target} x{o.attempts} gaps {o.gaps()} -> {o.outcome.code}"
                    f"{'' if o.outcome.exit is None else f' (exit {o.outcome.exit})'}"
                    f"{'' if o.state is None else f' state {o.state}'}; reached the proxy {o.kinds}"
                    f"{'' if not o.later else f'; later refused requests, gaps {[_gaps(g) for g in o.later]}'}")
    return "\n".join(rows)


def check(sc: Scenario, seen: dict[str, Observed]) -> None:
    """The one policy, for every host: raises AssertionError naming what differed."""
    report = table(sc, seen)
    problems = []
    for host, o in seen.items():
        if o.attempts != sc.attempts:
            problems.append(f"{host}: {o.attempts} sends of {sc.target}, the core's policy is {sc.attempts}")
        if o.outcome.code != "UNAVAILABLE":
            problems.append(f"{host}: ended with {o.outcome.code}, not UNAVAILABLE ({o.outcome.message})")
        if host == "cli" and o.outcome.exit != UNAVAILABLE_EXIT:
            problems.append(f"cli: exit {o.outcome.exit}, not {UNAVAILABLE_EXIT}")
        for i, (gap, least) in enumerate(zip(o.gaps(), BACKOFF_S)):
            if gap < least - SLACK_S:
                problems.append(f"{host}: resend {i + 1} came {gap * 1000:.0f} ms after the previous send "
                                f"(the core waits {least * 1000:.0f} ms)")
            if gap > least + 1.0:
                problems.append(f"{host}: resend {i + 1} came {gap * 1000:.0f} ms after the previous send")
        if sc.fault == "refuse" and sc.target in o.kinds:
            problems.append(f"{host}: a {sc.target} reached the proxy after it stopped listening")
        for k, group in enumerate(o.later):  # never left either: the same three sends
            if len(group) != 3 or any(g < least - SLACK_S for g, least in zip(_gaps(group), BACKOFF_S)):
                problems.append(f"{host}: refused request {k + 2} after the target: {len(group)} attempts, "
                                f"gaps {_gaps(group)}")
        if sc.states and o.state not in sc.states:
            problems.append(f"{host}: left {sc.op[1]} as {o.state}")
    summary = {(o.attempts, o.outcome.code) for o in seen.values()}
    if len(summary) > 1:
        problems.append(f"the hosts differ: {sorted(summary)}")
    assert not problems, "\n".join(problems) + "\n" + report


def run_scenario(name, hosts, cli_factory, proxy, syns, host_names=None) -> dict[str, Observed]:
    sc = SCENARIOS[name]
    if host_names is None:
        host_names = [h for h in HOSTS if h != "wasm_wasmtime" or hosts.compiled is not None]
    return {host: observe(sc, host, hosts, cli_factory, proxy, syns) for host in host_names}


@pytest.mark.parametrize("name", [n for n, s in SCENARIOS.items() if s.fault != "refuse"])
def test_same_resends_under_the_same_fault(name, hosts, cli_factory, policy_proxy):
    seen = run_scenario(name, hosts, cli_factory, policy_proxy, None)
    print("\n" + table(SCENARIOS[name], seen))
    check(SCENARIOS[name], seen)


@pytest.mark.parametrize("name", [n for n, s in SCENARIOS.items() if s.fault == "refuse"])
def test_same_resends_when_connections_are_refused(name, hosts, cli_factory, policy_proxy, syn_recorder):
    seen = run_scenario(name, hosts, cli_factory, policy_proxy, syn_recorder)
    print("\n" + table(SCENARIOS[name], seen))
    check(SCENARIOS[name], seen)


# ---------------------------------------------------------------- the self-check


def _resending_transport(transport: Callable[[dict], dict]) -> Callable[[dict], dict]:
    """A host that (wrongly) resends a failed request on its own, twice."""

    def send(request: dict) -> dict:
        response = transport(request)
        for _ in range(2):
            if response.get("transport_ok", True):
                break
            time.sleep(0.1)
            response = transport(request)
        return response

    send.close = transport.close
    return send


class _SelfResendingStore(binding.Store):
    """The binding's pump over a transport that resends on its own."""

    def __init__(self, core, settings, **kw):
        super().__init__(core, settings, **kw)
        self._transport = _resending_transport(self._transport)


class _NeverResendingStore(binding.Store):
    """A pump that (wrongly) ends an operation at the core's first wait."""

    def _answer(self, action):
        while True:
            if "request" in action:
                response = dict(self._transport(action["request"]))
                if "body" in response:  # the transport's bytes, as hex inside the JSON
                    response["body_hex"] = bytes(response.pop("body")).hex()
                action = self._core.feed(self._handle, binding._encode({"response": response}), self._now(),
                                         self._random(32))
            elif "wait_ms" in action:
                raise binding.ChstateError("UNAVAILABLE", "gave up instead of waiting")
            else:
                return action


@pytest.mark.parametrize("store_class", [_SelfResendingStore, _NeverResendingStore])
def test_the_comparison_catches_a_host_with_its_own_policy(store_class, hosts, cli_factory, policy_proxy):
    broken = Hosts(hosts.server, hosts.artifacts, Path(hosts.lua_script).parent, python_store_class=store_class)
    seen = run_scenario("read_reset_request", hosts, cli_factory, policy_proxy, None, ["cli"])
    seen["python"] = observe(SCENARIOS["read_reset_request"], "python", broken, cli_factory, policy_proxy, None)
    print("\n" + store_class.__name__ + ": " + table(SCENARIOS["read_reset_request"], seen))
    with pytest.raises(AssertionError, match=r"python: \d+ sends of get_state"):
        check(SCENARIOS["read_reset_request"], seen)
