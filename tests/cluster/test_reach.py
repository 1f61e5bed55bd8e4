"""Every runtime host reaches the cluster through a host list: the core picks
the host for each request and the host's own transport connects there.

For each runtime (the Meltano adapter's backend and transport, Node WASI,
wasmtime, Extism's Python SDK, Lua 5.4 and LuaJIT) one run opens a store in
cluster mode on "127.0.0.1:<a closed port>,127.0.0.1:<r2>,127.0.0.1:<r3>",
writes a state and reads it back (the first host refuses, so that only works
when the transport connects where each request says; the write's lock reads
its claims from two replicas), then opens one on two closed
ports and reads. The tests check the state through replica r1 with the CLI,
and that the second store's error is UNAVAILABLE, names both host:port pairs
and never holds the password. A third store, on the good list with the
runtime's `quorum` setting at 4 (the cluster has three replicas), must have
its write refused by the server as UNAVAILABLE, saying fewer than 4 replicas
are alive: the setting reached the server's insert_quorum. One process per
runtime (wasmtime and Extism run in this one), reused by the tests of that
runtime.

  python3 -m pytest tests/cluster/test_reach.py      # from the repository root
"""

from __future__ import annotations

import functools
import importlib.util
import json
import os
import socket
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from chserver import REPO

sys.path.insert(0, str(REPO / "tests" / "meltano"))
sys.path.insert(0, str(REPO / "hosts" / "wasi"))
import meltano_harness as harness  # noqa: E402

pytestmark = pytest.mark.requires_clickhouse

# Native builds first, then the two wasm32 ones (fewer switches of Bazel configuration).
RUNTIMES = ["meltano", "lua5.4", "luajit", "node_wasi", "wasmtime", "extism"]
EXIT_OK = 0


def closed_ports(n: int) -> list[int]:
    """Loopback ports nothing listens on (bound together, so distinct, then released)."""
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def host_list(*ports: int) -> str:
    return ",".join(f"127.0.0.1:{p}" for p in ports)


# ---- the built artifacts, found and built as the other suites do ----------------------------------

def _bazel_bin(*config: str) -> Path:
    out = subprocess.run(["bazel", "info", *config, "bazel-bin"], cwd=REPO, check=True, capture_output=True,
                         text=True)
    return Path(out.stdout.strip())


@functools.lru_cache(maxsize=None)
def libchstate() -> Path:
    return harness.native_library()  # $CHSTATE_LIBRARY, else built (tests/meltano)


@functools.lru_cache(maxsize=None)
def lua_so() -> Path:
    """As tests/lua/run.py: $CHSTATE_LUA_SO, else //hosts/lua:chstate.so built."""
    if os.environ.get("CHSTATE_LUA_SO"):
        return Path(os.environ["CHSTATE_LUA_SO"]).resolve()
    subprocess.run(["bazel", "build", "//hosts/lua:chstate.so"], cwd=REPO, check=True, capture_output=True)
    return _bazel_bin() / "hosts" / "lua" / "chstate.so"


@functools.lru_cache(maxsize=None)
def wasi_conftest():
    """tests/wasi/conftest.py's build helper (loaded under its own name)."""
    spec = importlib.util.spec_from_file_location("chstate_wasi_conftest", REPO / "tests" / "wasi" / "conftest.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@functools.lru_cache(maxsize=None)
def wasm_path() -> Path:
    return wasi_conftest().build_wasm()  # $CHSTATE_WASM, else built with --config=wasi


@functools.lru_cache(maxsize=None)
def extism_path() -> Path:
    """As tests/wasi's extism_path fixture ($CHSTATE_EXTISM_WASM skips the build)."""
    if os.environ.get("CHSTATE_EXTISM_WASM"):
        return Path(os.environ["CHSTATE_EXTISM_WASM"]).resolve()
    subprocess.run(["bazel", "build", "--config=wasi", "--symlink_prefix=/", "//hosts/wasi:chstate_extism.wasm"],
                   cwd=REPO, check=True, capture_output=True)
    return _bazel_bin("--config=wasi") / "hosts" / "wasi" / "chstate_extism.wasm"


# ---- one run per runtime ----------------------------------------------------------------------------
#
# Each runner writes {"singer_state": {"bookmark": <runtime>}} as the completed
# state of `sid` through `good` (a host list), reads it back, then reads
# through `bad` and returns {"got": <completed side read back>, "error":
# {"code", "message"} or None, "output": everything it printed}.

class Setup:
    def __init__(self, cluster, schema: str, tmp: Path):
        self.cluster, self.schema, self.tmp = cluster, schema, tmp
        self.password = cluster.password
        c1, c2 = closed_ports(2)
        self.closed = (c1, c2)
        # r2 and r3: a claims read (set takes the id's lock) reaches two of the three replicas.
        self.good = host_list(c1, cluster.port("r2"), cluster.port("r3"))
        self.bad = host_list(c1, c2)

    def uri(self, hosts: str, quorum: int | None = None) -> str:
        tail = "" if quorum is None else f"&quorum={quorum}"
        return f"clickhouse://chstate@{hosts}/default?cluster={self.cluster.name}&schema={self.schema}{tail}"

    def env(self, **extra: str) -> dict:
        env = self.cluster.env()  # the password in MELTANO_STATE_BACKEND_CLICKHOUSE_PASSWORD, nothing else of ours
        env.update(extra)
        return env


def _subprocess_result(argv: list[str], env: dict, cwd: Path) -> dict:
    proc = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=120)
    output = proc.stdout + proc.stderr
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert proc.returncode == EXIT_OK and lines, f"{argv[0]} exited with {proc.returncode}:\n{output[-4000:]}"
    out = json.loads(lines[-1][len("RESULT "):])
    out["output"] = output
    return out


MELTANO_SCRIPT = """
import json, os
from meltano.core.state_store.base import MeltanoState
from chstate_meltano.backend import ChstateStateBackendError, ClickhouseStateStoreManager

def make(hosts, quorum=None):
    # As Meltano constructs it; the host list in state_backend.clickhouse.host.
    return ClickhouseStateStoreManager(uri="clickhouse://chstate@127.0.0.1/default", host=hosts, port=None,
                                       database=None, user=None, password=os.environ["T_PASSWORD"], secure=None,
                                       schema=os.environ["T_SCHEMA"], table=None, cluster=os.environ["T_CLUSTER"],
                                       quorum=quorum, lock_timeout_seconds=10, lock_retry_seconds=1)

sid = os.environ["T_ID"]
m = make(os.environ["T_GOOD"])
m.set(MeltanoState(state_id=sid, completed_state={"singer_state": {"bookmark": "meltano"}}, partial_state={}))
out = {"got": m.get(sid).completed_state, "error": None}
m.close()
bad = make(os.environ["T_BAD"])
try:
    bad.get(sid)
except ChstateStateBackendError as e:
    out["error"] = {"code": e.code, "message": str(e)}
bad.close()
four = make(os.environ["T_GOOD"], quorum=4)  # an integer, as Meltano passes an integer setting
try:
    four.set(MeltanoState(state_id=sid + ":q", completed_state={"singer_state": {}}, partial_state={}))
    out["quorum_error"] = None
except ChstateStateBackendError as e:
    out["quorum_error"] = {"code": e.code, "message": str(e)}
four.close()
print("RESULT " + json.dumps(out))
"""


def run_meltano(s: Setup, sid: str) -> dict:
    """backend.py in the pinned Meltano venv (as tests/modern_http runs it), its _http.py transport."""
    venv = harness.ensure_venv()
    env = s.env(PYTHONPATH=str(REPO / "hosts" / "python"), CHSTATE_LIBRARY=str(libchstate()),
                T_PASSWORD=s.password, T_SCHEMA=s.schema, T_CLUSTER=s.cluster.name, T_ID=sid, T_GOOD=s.good,
                T_BAD=s.bad)
    return _subprocess_result([str(venv / "bin" / "python"), "-c", MELTANO_SCRIPT], env, s.tmp)


NODE_SCRIPT = """
import { open as openStore } from %(module)s;

const [wasmPath, goodUri, badUri, sid, quorumUri] = process.argv.slice(2);
// The URI form; the password from the environment variable Meltano uses (the core reads it from env).
const open = (uri) => openStore(uri, {
  wasm: wasmPath, env: { MELTANO_STATE_BACKEND_CLICKHOUSE_PASSWORD: process.env.MELTANO_STATE_BACKEND_CLICKHOUSE_PASSWORD },
});
const out = { error: null };
const store = await open(goodUri);
await store.set(sid, { singer_state: { bookmark: "node_wasi" } });
out.got = (await store.get(sid)).completed;
await store.close();
const bad = await open(badUri);
try {
  await bad.get(sid);
} catch (e) {
  out.error = { code: e.code, message: e.detail };
}
await bad.close();
const four = await open(quorumUri);
out.quorum_error = null;
try {
  await four.set(sid + ":q", { singer_state: {} });
} catch (e) {
  out.quorum_error = { code: e.code, message: e.detail };
}
await four.close();
console.log("RESULT " + JSON.stringify(out));
"""


def run_node_wasi(s: Setup, sid: str) -> dict:
    """hosts/wasi/chstate_wasi.mjs (node:wasi, node:http's keep-alive agent), the URI form."""
    script = s.tmp / "reach.mjs"
    module = json.dumps((REPO / "hosts" / "wasi" / "chstate_wasi.mjs").as_uri())
    script.write_text(NODE_SCRIPT % {"module": module})
    return _subprocess_result(["node", "--no-warnings", str(script), str(wasm_path()), s.uri(s.good), s.uri(s.bad),
                               sid, s.uri(s.good, quorum=4)], s.env(), s.tmp)


def _pump_result(open_store, run_get_set, sid: str, s: Setup) -> dict:
    """open_store(hosts, quorum=None) -> a store."""
    out = {"error": None, "output": "", "quorum_error": None}
    store = open_store(s.good)
    try:
        out["got"] = run_get_set(store)
    finally:
        store.close()
    bad = open_store(s.bad)
    try:
        bad.get(sid)
    except Exception as e:  # noqa: BLE001 - each host's own ChstateError
        out["error"] = {"code": e.code, "message": e.message}
    finally:
        bad.close()
    four = open_store(s.good, quorum=4)
    try:
        four.set(sid + ":q", {"singer_state": {}})
    except Exception as e:  # noqa: BLE001 - each host's own ChstateError
        out["quorum_error"] = {"code": e.code, "message": e.message}
    finally:
        four.close()
    return out


def run_wasmtime(s: Setup, sid: str) -> dict:
    """hosts/wasi/chstate_wasmtime.py in this process (the Python binding), the host setting as a list."""
    from chstate_wasmtime import ChstateModule, Store, WasmtimeCore
    mod = ChstateModule(wasm_path())

    def open_store(hosts: str, quorum: int | None = None):
        settings = {"host": hosts, "user": "chstate", "password": s.password, "database": "default",
                    "schema": s.schema, "cluster": s.cluster.name, "quorum": quorum}
        return Store(WasmtimeCore(mod), settings, env={})

    def set_get(store) -> dict:
        store.set(sid, {"singer_state": {"bookmark": "wasmtime"}})
        return store.get(sid)["completed"]

    return _pump_result(open_store, set_get, sid, s)


def run_extism(s: Setup, sid: str) -> dict:
    """hosts/wasi/chstate_extism.py over Extism's Python SDK in this process (the Python binding), the URI form."""
    import extism
    from chstate_extism import ExtismCore, Store
    core = ExtismCore(extism.Plugin(extism_path().read_bytes(), wasi=True))

    def open_store(hosts: str, quorum: int | None = None):
        return Store(core, {"uri": s.uri(hosts, quorum), "password": s.password}, env={})

    def set_get(store) -> dict:
        store.set(sid, {"singer_state": {"bookmark": "extism"}})
        return store.get(sid)["completed"]

    return _pump_result(open_store, set_get, sid, s)


# The same script for both Lua runtimes (the API is shared): `form` "host"
# gives the list as the host setting, "uri" in the URI.
LUA_SCRIPT = """
local chstate = require "chstate"
local form, good, bad, schema, cluster, sid, value = ...
local function open(hosts, quorum)
  if form == "uri" then
    return chstate.open{uri = "clickhouse://chstate@" .. hosts .. "/default?cluster=" .. cluster .. "&schema=" .. schema
                        .. (quorum and ("&quorum=" .. quorum) or "")}
  end
  return chstate.open{host = hosts, user = "chstate", database = "default", schema = schema, cluster = cluster,
                      quorum = quorum}
end
local store = open(good)
store:set(sid, {singer_state = {bookmark = value}})
local _, whole = store:get(sid)
store:close()
local b = open(bad)
local ok, e = pcall(b.get, b, sid)
b:close()
local out = {got = whole.completed, error = chstate.null, quorum_error = chstate.null}
if not ok then out.error = {code = e.code, message = e.message} end
local four = open(good, 4)  -- an integer setting
local qok, qe = pcall(four.set, four, sid .. ":q", {singer_state = {}})
four:close()
if not qok then out.quorum_error = {code = qe.code, message = qe.message} end
print("RESULT " .. chstate.to_json(out))
"""


def _run_lua(s: Setup, sid: str, argv0: list[str], form: str, value: str, **env: str) -> dict:
    script = s.tmp / "reach.lua"
    script.write_text(LUA_SCRIPT)
    return _subprocess_result([*argv0, str(script), form, s.good, s.bad, s.schema, s.cluster.name, sid, value],
                              s.env(**env), s.tmp)


def run_lua54(s: Setup, sid: str) -> dict:
    """chstate.so (the native executor in the module), the host setting as a list."""
    return _run_lua(s, sid, ["lua5.4"], "host", "lua5.4", LUA_CPATH_5_4=f"{lua_so().parent}/?.so;;")


def run_luajit(s: Setup, sid: str) -> dict:
    """hosts/luajit over libchstate.so (LuaSocket outside nginx), the URI form."""
    return _run_lua(s, sid, ["luajit"], "uri", "luajit", CHSTATE_LIBRARY=str(libchstate()),
                    LUA_PATH=f"{REPO}/hosts/luajit/?.lua;;")


RUNNERS = {"meltano": run_meltano, "node_wasi": run_node_wasi, "wasmtime": run_wasmtime, "extism": run_extism,
           "lua5.4": run_lua54, "luajit": run_luajit}


@pytest.fixture(scope="module")
def reach_schema(cluster) -> str:
    """One schema for the module (its tables are made once, by the first write)."""
    name = f"c_reach_{uuid.uuid4().hex[:10]}"
    yield name
    try:
        cluster.start_all()
        cluster.sql("r1", f"DROP DATABASE IF EXISTS `{name}` ON CLUSTER `{cluster.name}`",
                    wait_end_of_query=1, distributed_ddl_task_timeout=30)
    except Exception:  # noqa: BLE001 - cleanup only
        pass


_outcomes: dict = {}


@pytest.fixture
def outcome(healthy, reach_schema, tmp_path_factory):
    """outcome(runtime) -> (setup, state id, result): the runtime's one run, made once."""
    def get(runtime: str):
        if runtime not in _outcomes:
            s = Setup(healthy, reach_schema, tmp_path_factory.mktemp(f"reach-{runtime}"))
            sid = f"reach:{runtime}"
            _outcomes[runtime] = (s, sid, RUNNERS[runtime](s, sid))
        return _outcomes[runtime]
    return get


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_state_written_through_the_list_is_read_back_and_through_r1(outcome, runtime):
    s, sid, r = outcome(runtime)
    assert r["got"] == {"singer_state": {"bookmark": runtime}}, r
    got = s.cluster.cli("r1", s.schema, "get", sid)
    assert got.code == 0, got
    assert json.loads(got.out) == {"singer_state": {"bookmark": runtime}}
    assert s.password not in r["output"]


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_every_host_closed_is_unavailable_and_named(outcome, runtime):
    s, _, r = outcome(runtime)
    error = r["error"]
    assert error is not None, f"reading through two closed ports succeeded: {r}"
    assert error["code"] == "UNAVAILABLE", error
    for port in s.closed:
        assert f"127.0.0.1:{port}" in error["message"], error
    assert s.password not in error["message"] and s.password not in r["output"]


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_the_quorum_setting_reaches_the_server(outcome, runtime):
    _, _, r = outcome(runtime)
    error = r["quorum_error"]
    assert error is not None, f"a write with quorum 4 on three replicas succeeded: {r}"
    assert error["code"] == "UNAVAILABLE", error
    assert "fewer than 4 replicas" in error["message"], error
