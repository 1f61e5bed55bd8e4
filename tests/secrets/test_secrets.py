"""The password never shows: every `chstate` command and error path is run
with the password given each way a user can give it, and stdout, stderr,
--json output, `ping`, the server's own logs (a private 18.16 started here),
and the argv and environment of the command `chstate lock -- CMD` starts are
searched for it (as is, and percent-encoded). The Python binding's errors, repr,
settings view and transport are checked the same way.

A second, recognisable wrong password drives the "wrong password" paths.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.parse
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(TESTS / "injection"))
from chserver import start_server, stop_server  # noqa: E402
from pyhost import chstate_binary, modules, python_store  # noqa: E402

WRONG = "WrongPw-7Hq2-Zx9-marker"
S = {"singer_state": {"secret_test": 1}}


@pytest.fixture(scope="module")
def private(tmp_path_factory):
    folder = tmp_path_factory.mktemp("secrets")
    server = start_server(folder)
    yield server, folder
    stop_server(folder, remove=True)


@pytest.fixture(scope="module")
def binary():
    return chstate_binary()


def forms(secret: str) -> list[bytes]:
    return [secret.encode(), urllib.parse.quote(secret, safe="").encode(), secret[: len(secret) // 2 + 4].encode()]


def clean_env() -> dict:
    return {k: v for k, v in os.environ.items() if not k.startswith(("CLICKHOUSE_", "MELTANO_", "CHSTATE_"))}


def ways(server, password: str):
    """(name, extra argv, env) for each way of giving the password."""
    base = f"{server.user}@{server.host}:{server.port}/default"
    enc = urllib.parse.quote(password, safe="")
    env = clean_env()
    yield "meltano env", ["--uri", f"clickhouse://{base}"], {**env, "MELTANO_STATE_BACKEND_CLICKHOUSE_PASSWORD": password}
    yield "uri", ["--uri", f"clickhouse://{server.user}:{enc}@{server.host}:{server.port}/default"], env
    yield "meltano uri env", [], {**env, "MELTANO_STATE_BACKEND_URI":
                                   f"clickhouse://{server.user}:{enc}@{server.host}:{server.port}/default"}
    yield "clickhouse env", ["--uri", f"clickhouse://{base}"], {**env, "CLICKHOUSE_PASSWORD": password}
    yield "flag", ["--uri", f"clickhouse://{base}", "--password", password], env


COMMANDS = [
    ["init"], ["ping"], ["set", "sec:a", json.dumps(S)], ["get", "sec:a"], ["merge", "sec:a", json.dumps(S)],
    ["list"], ["copy", "sec:a", "sec:b"], ["move", "sec:b", "sec:c"], ["clear", "sec:c"],
    ["get", "sec:missing"],                          # exit 3
    ["set", "sec:a", "{not json"],                   # bad input
    ["set", "sec:a", json.dumps({"x": 1})],          # no singer_state
    ["frobnicate"], ["get"], ["--bogus", "list"],    # usage errors
    ["lock", "sec:a", "--", "true"],
    ["clear", "--all"],
    ["--help"], ["set", "--help"], ["--version"],
]


def run(binary, argv, env, *, schema="secrets"):
    env = {**env, "MELTANO_STATE_BACKEND_CLICKHOUSE_SCHEMA": schema}
    return subprocess.run([str(binary), "--timeout", "5", "--connect-timeout", "2", *argv], env=env,
                          capture_output=True, timeout=60)


def assert_absent(secret, *blobs, what=""):
    for blob in blobs:
        for form in forms(secret):
            assert form not in blob, f"{what}: the password ({form!r}) appears in {blob[:300]!r}"


def test_every_command_every_way(private, binary):
    server, _ = private
    ran = 0
    for way, pre, env in ways(server, server.password):
        for json_mode in ([], ["--json"]):
            for cmd in COMMANDS:
                r = run(binary, pre + json_mode + cmd, env)
                assert_absent(server.password, r.stdout, r.stderr, what=f"{way} {json_mode} {cmd}")
                if json_mode and r.stdout:
                    json.loads(r.stdout)  # --json prints JSON even for errors
                ran += 1
        # ping prints the URI it used: without the password, with the user.
        r = run(binary, pre + ["ping"], env)
        assert r.returncode == 0, r.stderr
        assert server.user.encode() in r.stdout and b"***" in r.stdout or way in ("meltano env", "clickhouse env",
                                                                                 "flag"), r.stdout
    print(f"{ran} runs")


def test_error_paths_with_a_wrong_password(private, binary):
    server, _ = private
    for way, pre, env in ways(server, WRONG):
        for json_mode in ([], ["--json"]):
            for cmd in (["get", "sec:a"], ["set", "sec:a", json.dumps(S)], ["ping"], ["lock", "sec:a", "--", "true"]):
                r = run(binary, pre + json_mode + cmd, env)
                assert r.returncode == 6, (way, cmd, r.returncode, r.stderr)
                assert_absent(WRONG, r.stdout, r.stderr, what=f"{way} {cmd}")
    # Unreachable server, bad port, malformed URI with the password inside.
    env = clean_env()
    for uri in (f"clickhouse://u:{WRONG}@127.0.0.1:1/default",
                f"clickhouse://u:{WRONG}@127.0.0.1:99999/default",
                f"clickhouse://u:{WRONG}@127.0.0.1:8123/default?bogus=1",
                f"clickhouse://u:{WRONG}@127.0.0.1:8123/default#frag",
                f"clickhouse://u:{WRONG}/x@127.0.0.1/default",
                f"clickhouses://u:{WRONG}@127.0.0.1:8123/default?secure=false"):
        for json_mode in ([], ["--json"]):
            r = run(binary, ["--uri", uri, *json_mode, "get", "x"], env)
            assert r.returncode in (2, 5), (uri, r.returncode, r.stderr)
            assert_absent(WRONG, r.stdout, r.stderr, what=uri)


def test_events_never_hold_it(private, binary):
    """What the store tells (docs/diagnostics.md) at its most verbose: `chstate -vv` in text and
    JSON lines, with states shown, the password given each way, right and wrong, and against a
    dead port (resends and their transport errors); and every event the Python binding hands to
    on_event at debug."""
    server, _ = private
    told = 0
    for secret, expect in ((server.password, (0, 3)), (WRONG, (6,))):
        for way, pre, env in ways(server, secret):
            for verbose in (["-vv"], ["-vv", "--show-states", "--log-format", "json"]):
                for cmd in (["set", "sec:ev", json.dumps(S)], ["get", "sec:ev"], ["lock", "sec:ev", "--", "true"]):
                    r = run(binary, pre + verbose + cmd, env)
                    assert r.returncode in expect, (way, cmd, r.returncode, r.stderr[-500:])
                    assert r.stderr, (way, cmd)  # something was told
                    assert_absent(secret, r.stdout, r.stderr, what=f"events: {way} {verbose} {cmd}")
                    told += r.stderr.count(b"\n")
    for uri in (f"clickhouse://u:{WRONG}@127.0.0.1:1/default", f"clickhouse://u@127.0.0.1:1/default"):
        r = run(binary, ["--uri", uri, "--password", WRONG, "-vv", "--log-format", "json", "get", "x"], clean_env())
        assert r.returncode == 5 and b'"kind":"resent"' in r.stderr, r.stderr[-500:]
        assert_absent(WRONG, r.stdout, r.stderr, what=f"events against a dead port: {uri}")
    _native, binding = modules()
    events: list = []
    settings = {"uri": f"clickhouse://{server.user}@{server.host}:{server.port}/default", "password": server.password,
                "schema": "secrets"}
    store = binding.Store(_native.NativeCore(), settings, env={}, on_event=events.append, diagnostics="debug",
                          show_states=True)
    store.set("sec:ev", S)
    store.get("sec:ev")
    with store.lock("sec:ev"):
        store.merge("sec:ev", S)
    store.close()
    assert len(events) > 10
    assert_absent(server.password, json.dumps(events).encode(), what="the Python binding's events")
    print(f"{told} lines told by the CLI, {len(events)} events in Python")


def test_lock_child_sees_no_password(private, binary, tmp_path):
    server, _ = private
    for way, pre, env in ways(server, server.password):
        dump = tmp_path / f"{way.replace(' ', '_')}.bin"
        script = f'cat /proc/$$/cmdline /proc/$PPID/cmdline > {dump}; echo >> {dump}; cat /proc/$$/environ >> {dump}'
        r = run(binary, pre + ["lock", "sec:lock", "--", "sh", "-c", script], env)
        assert r.returncode == 0, r.stderr
        seen = dump.read_bytes()
        assert b"sh\0-c\0" in seen
        # The child's argv: never. Its environment: only what the user's own
        # environment already held (chstate adds nothing).
        argv_part, _, environ = seen.partition(b"\n")
        assert_absent(server.password, argv_part, what=f"{way}: lock child's argv")
        if way in ("uri", "flag"):
            assert_absent(server.password, environ, what=f"{way}: lock child's environment")


def test_server_logs_never_hold_it(private, binary):
    server, folder = private
    for way, pre, env in ways(server, server.password):
        run(binary, pre + ["set", "sec:log", json.dumps(S)], env)
    for way, pre, env in ways(server, WRONG):
        run(binary, pre + ["get", "sec:log"], env)
    logs = list((folder / "log").glob("*"))
    assert logs and any(p.stat().st_size > 0 for p in logs)
    for p in logs:
        data = p.read_bytes()
        assert_absent(server.password, data, what=str(p))
        assert_absent(WRONG, data, what=str(p))
    # The query log, when the server keeps one, has the SQL only.
    try:
        server.sql("SYSTEM FLUSH LOGS")
        text = server.sql("SELECT query FROM system.query_log WHERE event_date >= today() - 1 FORMAT TSV")
    except Exception:  # noqa: BLE001 - no query_log table on this server
        text = ""
    assert_absent(server.password, text.encode(), what="system.query_log")


def test_python_adapter_errors(private):
    """The Python binding (as the adapter opens it, from settings): the store's
    repr, its settings view and its transport's repr hold no password, nor do
    a wrong password's error and resolve_settings' errors and results."""
    server, _ = private
    _native, binding = modules()

    def shown(store) -> list[bytes]:
        return [repr(store).encode(), json.dumps(store.settings).encode(), repr(store._transport).encode()]

    store = python_store(server, "secrets")
    assert_absent(server.password, *shown(store), what="python store")
    store.close()
    # Given in the URI: no I/O at open.
    enc = urllib.parse.quote(server.password, safe="")
    store = binding.Store(_native.NativeCore(), {"uri": f"clickhouse://{server.user}:{enc}@127.0.0.1:1/default"},
                          env={})
    assert_absent(server.password, *shown(store), what="python store, password in the URI")
    store.close()
    wrong = type(server)(server.host, server.port, server.user, WRONG)
    store = python_store(wrong, "secrets")
    with pytest.raises(binding.ChstateError) as e:
        store.get("sec:a")
    assert e.value.code == "UNAUTHENTICATED", e.value
    assert_absent(WRONG, str(e.value).encode(), repr(e.value).encode(), *shown(store), what="python")
    store.close()
    # resolve_settings' errors never echo a password from the URI; its
    # redacted URI and provenance hold none either.
    with pytest.raises(binding.ChstateError) as e:
        _native.resolve_settings({"from": "api", "values": {"uri": f"clickhouse://u:{WRONG}@h:99999/d"}, "env": {}})
    assert e.value.code == "INVALID_ARGUMENT", e.value
    assert_absent(WRONG, str(e.value).encode(), what="resolve_settings")
    resolved = _native.resolve_settings({"from": "api", "values": {"uri": f"clickhouse://u:{WRONG}@h/d"}, "env": {}})
    assert resolved["connection"]["password"] == WRONG  # for the transport only
    assert_absent(WRONG, resolved["connection"]["redacted_uri"].encode(), json.dumps(resolved["origin"]).encode(),
                  json.dumps(resolved["store"]).encode(), what="resolved settings")


def test_lua_binding_errors(private):
    """The Lua binding: a wrong password's error, the store's tostring and a
    bad URI's error never show the password (given in the URI or as a setting)."""
    server, _ = private
    repo = TESTS.parent
    subprocess.run(["bazel", "build", "//hosts/lua:chstate.so"], cwd=repo, check=True, capture_output=True)
    so_dir = repo / "bazel-out" / "k8-fastbuild" / "bin" / "hosts" / "lua"
    enc = urllib.parse.quote(WRONG, safe="")
    script = f"""
local chstate = require("chstate")
local function show(s) io.write(tostring(s), "\\n") end
local s1 = chstate.open{{uri = "clickhouse://{server.user}:{enc}@{server.host}:{server.port}/default", env = false}}
show(s1)
show(select(2, pcall(function() return s1:get("x") end)))
local s2 = chstate.open{{uri = "clickhouse://{server.user}@{server.host}:{server.port}/default",
                         password = "{WRONG}", env = false}}
show(s2)
show(select(2, pcall(function() return s2:get("x") end)))
show(select(2, pcall(chstate.open, {{uri = "clickhouse://u:{enc}@h:99999/d", env = false}})))
show(select(2, chstate.safe.open{{uri = "clickhouse://u:{enc}@h/d?bogus=1", env = false}}))
"""
    env = {**clean_env(), "LUA_CPATH_5_4": f"{so_dir}/?.so;;"}
    r = subprocess.run(["lua5.4", "-e", script], env=env, capture_output=True, timeout=60)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out
    assert b"UNAUTHENTICATED" in out or b"password" in out, out
    assert_absent(WRONG, out, what="lua")
