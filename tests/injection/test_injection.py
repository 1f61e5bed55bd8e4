"""SQL injection through every entry point that exists: the `chstate` CLI and
the Python adapter (hosts/python over libchstate.so), against ClickHouse 18.16.

- Hostile state ids, glob patterns and JSON: every statement the server
  receives (captured by a pass-through proxy) has the same shape as for a
  harmless id - string literals and lock-name hashes aside - and its literal
  decodes to exactly the id; the data comes back byte for byte.
- Patterns match exactly what the glob means (% _ \\ ' match themselves).
- Hostile schema and table names are refused before anything is sent.
- A table name read back from the server (`init` removing old lock
  tombstones) cannot change the DROP statement: a hostile tombstone-like
  table is dropped and nothing else.
(The Lua and Wasm hosts have their own hostile-input suites: tests/lua,
tests/wasi.)
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(TESTS / "faults"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from fault_proxy import FaultProxy  # noqa: E402
from pyhost import chstate_binary, modules, python_settings, python_store, wasm_module  # noqa: E402

HOSTILE_IDS = [
    "'; DROP DATABASE default; --",
    "x' OR '1'='1",
    "\\'; SELECT 1; --",
    "\\",
    "a\\",
    "`backquote`.`name`",
    "{state_id:String}",
    "100%_off*?",
    "line\nbreak\ttab\rreturn",
    "\\N",
    "Code: 57, e.displayText() = DB::Exception: fake",
    "emoji 🦆 and ünïcödé",
    "$(touch /tmp/chstate-pwned)`id`",
    "x" * 5000 + "'",
    "/*comment*/ FORMAT JSON",
    "a\x1b[31mred",
]
# Bytes argv cannot carry (NUL) or that are not UTF-8: through the Python adapter.
HOSTILE_BYTES = [b"nul\x00byte", b"\xff\xfe invalid utf-8 \xc3", b"\x00", b"'\x00; DROP TABLE state; --"]
HOSTILE_JSON = {"singer_state": {"q": "it's \"quoted\" \\ back\\slash", "nul": "a\u0000b", "u": "\u2028\u2029🦆",
                                 "sql": "'); DROP TABLE state; --", "nested": {"`": ["\\N", "\t", None, 1.5e300]},
                                 "key with 'quote'": {"{x:String}": -0.0}}}


@pytest.fixture(scope="module")
def binary():
    return chstate_binary()


@pytest.fixture
def schema(clickhouse):
    name = f"inj_{uuid.uuid4().hex[:12]}"
    yield name
    clickhouse.sql(f"DROP DATABASE IF EXISTS `{name}`")


@pytest.fixture
def proxy(clickhouse):
    p = FaultProxy(clickhouse.host, clickhouse.port)
    yield p
    p.close()


def cli(binary, server, port, schema, *args, input=None):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CLICKHOUSE_", "MELTANO_", "CHSTATE_"))}
    env["MELTANO_STATE_BACKEND_CLICKHOUSE_PASSWORD"] = server.password
    env["MELTANO_STATE_BACKEND_CLICKHOUSE_SCHEMA"] = schema
    argv = [str(binary), "--uri", f"clickhouse://{server.user}@{server.host}:{port}/default", *args]
    return subprocess.run(argv, env=env, capture_output=True, input=input, timeout=60)


def literal_values(sql: str) -> list[bytes]:
    """The decoded '...' literals of a statement, as ClickHouse reads them."""
    out = []
    for m in re.finditer(r"'((?:[^'\\]|\\.)*)'", sql, re.S):
        body, val, i = m.group(1), bytearray(), 0
        while i < len(body):
            if body[i] == "\\":
                e = body[i + 1]
                if e == "x":
                    val.append(int(body[i + 2:i + 4], 16))
                    i += 4
                    continue
                val += {"n": b"\n", "t": b"\t", "r": b"\r", "0": b"\0"}.get(e, e.encode())
                i += 2
                continue
            val += body[i].encode()
            i += 1
        out.append(bytes(val))
    return out


def shape(sql: str, schema: str) -> str:
    s = re.sub(r"'((?:[^'\\]|\\.)*)'", "'?'", sql, flags=re.S)
    s = re.sub(r"[0-9a-f]{16}", "H", s)
    s = s.replace(schema, "SCHEMA")
    return re.sub(r"VALUES \('\?', (NULL|'\?'), (NULL|'\?')\)", "VALUES (...)", s)


def test_cli_hostile_ids_statements_unchanged(binary, clickhouse, proxy, schema):
    state = {"singer_state": {"v": 1}}
    # The shape of every statement for a harmless id.
    proxy.clear()
    for args in (["set", "plain", json.dumps(state)], ["get", "plain"], ["clear", "plain"]):
        assert cli(binary, clickhouse, proxy.port, schema, *args).returncode == 0
    benign = [shape(s, schema) for s in proxy.sqls()]
    # A write runs the history upkeep one time in 64, as its random bytes
    # choose: its statements for a harmless id, from the same core through the
    # Python binding with bytes that choose it.
    _native, binding = modules()
    store = binding.Store(_native.NativeCore(), python_settings(clickhouse, schema, port=proxy.port), env={},
                          random_bytes=bytes, timers=False)
    proxy.clear()
    store.set("plain", state)
    store.close()
    upkeep = [shape(s, schema) for s in proxy.sqls()]
    assert any("`SCHEMA`.`state_history` WHERE state_id = '?'" in s for s in upkeep), upkeep
    benign += upkeep
    for hostile in HOSTILE_IDS:
        proxy.clear()
        r = cli(binary, clickhouse, proxy.port, schema, "set", hostile, json.dumps(state))
        assert r.returncode == 0, (hostile, r.stderr)
        r = cli(binary, clickhouse, proxy.port, schema, "get", hostile)
        assert r.returncode == 0 and json.loads(r.stdout) == state, (hostile, r.stderr)
        r = cli(binary, clickhouse, proxy.port, schema, "list", "--null")
        assert hostile.encode() in r.stdout.split(b"\0"), hostile
        r = cli(binary, clickhouse, proxy.port, schema, "clear", hostile)
        assert r.returncode == 0, (hostile, r.stderr)
        sqls = proxy.sqls()
        got = [shape(s, schema) for s in sqls if not s.startswith("SELECT state_id, 1")]
        changed = [g for g in got if g not in benign]
        assert not changed and len(got) >= 6, f"{hostile!r} changed a statement:\n{changed}\nknown:\n{benign}"
        id_literals = [v for s in sqls for v in literal_values(s) if v == hostile.encode()]
        assert id_literals, f"no literal decodes to {hostile!r}"
    # The server is untouched: the default database still has its tables, nothing ran.
    assert clickhouse.sql("SELECT 1").strip() == "1"
    assert not Path("/tmp/chstate-pwned").exists()


def test_cli_hostile_json_round_trip(binary, clickhouse, schema):
    for sid in ("j", "'; DROP TABLE state; --"):
        r = cli(binary, clickhouse, clickhouse.port, schema, "set", sid, "-", input=json.dumps(HOSTILE_JSON).encode())
        assert r.returncode == 0, r.stderr
        r = cli(binary, clickhouse, clickhouse.port, schema, "get", sid)
        assert json.loads(r.stdout) == HOSTILE_JSON
        partial = {"singer_state": {"added": "'\\`{p:String}", "q": "x"}}
        r = cli(binary, clickhouse, clickhouse.port, schema, "merge", sid, json.dumps(partial))
        assert r.returncode == 0, r.stderr
        merged = json.loads(cli(binary, clickhouse, clickhouse.port, schema, "get", sid).stdout)
        want = json.loads(json.dumps(HOSTILE_JSON))
        want["singer_state"].update(partial["singer_state"])
        assert merged == want


def test_cli_patterns_mean_the_glob(binary, clickhouse, schema):
    ids = ["a%b", "a_b", "axb", "a\\b", "a'b", "ab", "a%%b", "A_B"]
    for sid in ids:
        assert cli(binary, clickhouse, clickhouse.port, schema, "set", sid, '{"singer_state":{}}').returncode == 0

    def listed(pattern):
        r = cli(binary, clickhouse, clickhouse.port, schema, "list", "--null", "--pattern", pattern)
        assert r.returncode == 0, r.stderr
        return sorted(x.decode() for x in r.stdout.split(b"\0")[:-1])

    assert listed("a%b") == ["a%b"]
    assert listed("a_b") == ["a_b"]
    assert listed("a\\b") == ["a\\b"]
    assert listed("a'b") == ["a'b"]
    assert listed("a?b") == sorted(["a%b", "a_b", "axb", "a\\b", "a'b"])
    assert listed("a*b") == sorted(["a%b", "a_b", "axb", "a\\b", "a'b", "ab", "a%%b"])
    assert listed("%") == []
    assert listed("' OR '1'='1") == []


@pytest.mark.parametrize("flag,value", [
    ("--schema", "meltano`; DROP DATABASE default; --"), ("--schema", "a.b"), ("--schema", "x y"),
    ("--table", "state` (x String) ENGINE=Log; --"), ("--table", "t'"), ("--table", "1abc"),
    ("--schema", "é"), ("--table", "a" * 65),
])
def test_hostile_schema_and_table_refused_before_sending(binary, clickhouse, proxy, flag, value):
    proxy.clear()
    r = cli(binary, clickhouse, proxy.port, "s", flag, value, "get", "x")
    assert r.returncode == 2, r.stderr
    err = r.stderr.decode()
    assert flag.strip("-") in err and ("letters, digits and underscores" in err or "limit is 64" in err), err
    assert proxy.requests == [], "something was sent"


def test_hostile_tombstone_name_cannot_change_the_drop(binary, clickhouse, schema):
    """`init` drops old lock tombstones by the names the server lists: a table
    whose name has a backquote (made by anyone with CREATE rights) is dropped
    as one identifier, and a table its name points at survives."""
    assert cli(binary, clickhouse, clickhouse.port, schema, "init").returncode == 0
    clickhouse.sql(f"CREATE TABLE `{schema}`.sentinel (x UInt8) ENGINE = Log")
    hostile = "state_lock_0_dead_1`.`sentinel"
    clickhouse.sql(f"CREATE TABLE `{schema}`.`state_lock_0_dead_1\\`.\\`sentinel` (x UInt8) ENGINE = Log")
    # Time must pass (by design): `init` drops tombstones older than twice the
    # 1 s window below, by the server's clock in whole seconds. Waited for with
    # init's own test, on the server.
    aged = (f"SELECT count() FROM system.tables WHERE database = '{schema}' AND name = "
            f"'state_lock_0_dead_1`.`sentinel' AND metadata_modification_time < now() - 2")
    deadline = time.monotonic() + 15
    while clickhouse.sql(aged).strip() != "1":
        assert time.monotonic() < deadline, "the hostile table never got older than 2 s on the server"
        time.sleep(0.05)
    r = cli(binary, clickhouse, clickhouse.port, schema, "--stale-lock", "1", "init")
    assert r.returncode == 0, r.stderr
    tables = clickhouse.sql(f"SELECT name FROM system.tables WHERE database = '{schema}' ORDER BY name").split("\n")
    assert "sentinel" in tables, tables
    assert hostile not in tables, tables


def wasm_store(clickhouse, schema, port, table="state"):
    """The WebAssembly module in wasmtime (hosts/wasi/chstate_wasmtime.py) under the Python binding."""
    sys.path.insert(0, str(TESTS.parent / "hosts" / "wasi"))
    import chstate_wasmtime
    # The settings as users give them, resolved by the core (with its timeouts); no environment read.
    store = chstate_wasmtime.open(f"clickhouse://{clickhouse.user}@{clickhouse.host}:{port}/default",
                                  wasm=wasm_module(), password=clickhouse.password, schema=schema, table=table,
                                  env={})
    return store, None, chstate_wasmtime.ChstateError


@pytest.mark.parametrize("host", ["python", "wasm"])
def test_protocol_hosts_hostile_ids_and_json(clickhouse, schema, proxy, host):
    """The Python binding over the native core (ctypes over libchstate.so) and
    over the Wasm module (wasmtime), each opened from settings."""
    if host == "python":
        _, binding = modules()
        store, transport = python_store(clickhouse, schema, port=proxy.port), None
        error_type = binding.ChstateError
    else:
        store, transport, error_type = wasm_store(clickhouse, schema, proxy.port)
    state = HOSTILE_JSON  # set's state is the completed side
    try:
        for sid in [s.encode() for s in HOSTILE_IDS] + HOSTILE_BYTES:
            proxy.clear()
            store.run({"op": "set", "state_id_hex": sid.hex(), "state": state})
            got = store.run({"op": "get", "state_id_hex": sid.hex()})["state"]
            assert bytes.fromhex(got["state_id_hex"]) == sid
            assert got["completed"] == json.loads(json.dumps(HOSTILE_JSON))
            ids = store.run({"op": "list", "pattern": None})["state_ids_hex"]
            assert sid.hex() in ids
            assert any(sid in literal_values(s) for s in proxy.sqls()), sid
            store.run({"op": "delete", "state_id_hex": sid.hex()})
            assert store.run({"op": "get", "state_id_hex": sid.hex()})["state"] is None
        # Patterns as bytes.
        for sid in (b"p%q", b"p_q", b"pxq", b"p\x00q"):
            store.run({"op": "set", "state_id_hex": sid.hex(), "state": state})
        found = store.run({"op": "list", "pattern_hex": b"p_q".hex()})["state_ids_hex"]
        assert [bytes.fromhex(h) for h in found] == [b"p_q"]
        found = store.run({"op": "list", "pattern_hex": b"p?q".hex()})["state_ids_hex"]
        assert sorted(bytes.fromhex(h) for h in found) == sorted([b"p%q", b"p_q", b"pxq", b"p\x00q"])
        # Hostile schema/table: refused when the store is opened, with nothing sent.
        for bad in ({"schema": "x`; DROP"}, {"table": "t' --"}):
            proxy.clear()
            with pytest.raises(error_type) as e:
                if host == "python":
                    python_store(clickhouse, bad.get("schema", "ok"), port=proxy.port, table=bad.get("table", "state"))
                else:
                    wasm_store(clickhouse, bad.get("schema", "ok"), proxy.port, bad.get("table", "state"))
            assert e.value.code == "INVALID_ARGUMENT", e.value
            assert proxy.requests == [], f"{bad}: something was sent"
    finally:
        store.close()
        if hasattr(transport, "close"):
            transport.close()


def test_lua_binding_hostile_ids_and_json(clickhouse, schema, proxy, tmp_path):
    """The Lua binding (hosts/lua's chstate.so in lua5.4), through the proxy."""
    subprocess.run(["bazel", "build", "//hosts/lua:chstate.so"], cwd=TESTS.parent, check=True, capture_output=True)
    so_dir = TESTS.parent / "bazel-out" / "k8-fastbuild" / "bin" / "hosts" / "lua"
    assert (so_dir / "chstate.so").exists()
    ids = [s.encode() for s in HOSTILE_IDS] + HOSTILE_BYTES
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CLICKHOUSE_", "MELTANO_", "CHSTATE_"))}
    env.update({
        "LUA_CPATH_5_4": f"{so_dir}/?.so;;",
        "MELTANO_STATE_BACKEND_URI": f"clickhouse://{clickhouse.user}@{clickhouse.host}:{proxy.port}/default",
        "MELTANO_STATE_BACKEND_CLICKHOUSE_PASSWORD": clickhouse.password,
        "MELTANO_STATE_BACKEND_CLICKHOUSE_SCHEMA": schema,
        "HOSTILE_HEX": ",".join(i.hex() for i in ids),
    })
    proxy.clear()
    r = subprocess.run(["lua5.4", str(Path(__file__).resolve().parent / "hostile.lua")], env=env,
                       capture_output=True, timeout=300)
    assert r.returncode == 0, r.stdout.decode(errors="replace")[-2000:] + r.stderr.decode(errors="replace")
    assert r.stdout.strip().endswith(f"ok {len(ids)}".encode()), r.stdout[-300:]
    sqls = proxy.sqls()
    for sid in ids:
        assert any(sid in literal_values(s) for s in sqls), sid
    assert clickhouse.password.encode() not in r.stdout + r.stderr
