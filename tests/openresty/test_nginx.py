"""The LuaJIT module inside a real nginx (Debian's lua-nginx-module), talking
to a real ClickHouse 18.16 over cosockets: states set and read there are the
CLI's, concurrent requests lose nothing, a request waiting for ClickHouse
or for a lock never stops the one nginx process from serving others, and a
lock scope whose function sleeps past the lock's validity keeps its lock (a
light thread of the request renews it) and loses it when the request ends
inside the scope."""

from __future__ import annotations

import json
import re
import socket
import subprocess
import threading
import time
import uuid

import pytest


@pytest.fixture
def schema(clickhouse):
    name = f"nginx_{uuid.uuid4().hex[:12]}"
    yield name
    clickhouse.sql(f"DROP DATABASE IF EXISTS `{name}`")


@pytest.fixture
def cli(bazel_binary, clickhouse, schema):
    binary = bazel_binary("CHSTATE_CLI", "hosts/native/chstate", "//hosts/native:chstate")

    def run(*args: str) -> str:
        env = clickhouse.env()
        env.update(MELTANO_STATE_BACKEND_URI=clickhouse.uri(), MELTANO_STATE_BACKEND_CLICKHOUSE_PASSWORD=clickhouse.password,
                   MELTANO_STATE_BACKEND_CLICKHOUSE_SCHEMA=schema)
        out = subprocess.run([str(binary), *args], env=env, capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        return out.stdout

    return run


def in_thread(fn, *args, **kwargs):
    box = {}

    def body():
        box["result"] = fn(*args, **kwargs)

    t = threading.Thread(target=body)
    t.start()
    return t, box


def test_the_module_comes_from_the_rock_tree(nginx):
    status, text, _ = nginx.get("/which")
    assert status == 200, text
    library, null_is_ngx_null = text.split()
    assert library == str(nginx.tree / "lib" / "lua" / "5.1" / "chstate" / "libchstate.so")
    assert null_is_ngx_null == "true"  # chstate.null is ngx.null inside nginx


def test_a_state_set_in_nginx_is_the_clis(nginx, cli, schema):
    state = {"singer_state": {"bookmarks": {"issues": {"since": "2026-12-01"}}, "ids": [1, 2, 3]}}
    status, text, _ = nginx.get("/set", schema=schema, id="dev:nginx", state=json.dumps(state))
    assert (status, text) == (200, "ok\n")
    assert json.loads(cli("get", "dev:nginx")) == state
    cli("merge", "dev:nginx", json.dumps({"singer_state": {"more": True}}))
    status, text, _ = nginx.get("/get", schema=schema, id="dev:nginx")
    assert status == 200, text
    assert json.loads(text) == {"singer_state": {**state["singer_state"], "more": True}}


def test_concurrent_merges_of_one_id_lose_nothing(nginx, cli, schema):
    keys = [f"k{i}" for i in range(8)]
    threads = [in_thread(nginx.get, "/merge", schema=schema, id="dev:contended", key=k, n=i)
               for i, k in enumerate(keys)]
    for t, _ in threads:
        t.join()
    for _, box in threads:
        assert box["result"][0] == 200, box["result"][1]
    final = json.loads(cli("get", "dev:contended"))
    assert final == {"singer_state": {k: i for i, k in enumerate(keys)}}


def pong_times(nginx, n: int = 8) -> list[float]:
    times = []
    for _ in range(n):
        status, text, seconds = nginx.get("/pong", timeout=10)
        assert (status, text) == (200, "pong\n")
        times.append(seconds)
        time.sleep(0.1)
    return times


def test_a_lock_wait_does_not_block_the_worker(nginx, schema):
    logged_before = len(nginx.error_log())
    hold, _ = in_thread(nginx.get, "/hold", schema=schema, id="dev:held", seconds=2)
    time.sleep(0.5)  # the holder has its lock and sleeps in ngx.sleep
    start = time.monotonic()
    waiter, box = in_thread(nginx.get, "/merge", schema=schema, id="dev:held", key="after", n=1)
    time.sleep(0.2)  # the waiter is retrying the lock (every second, the default lock_retry)
    times = pong_times(nginx)  # over about a second of its waiting
    waiter.join()
    hold.join()
    waited = time.monotonic() - start
    assert box["result"][0] == 200, box["result"][1]
    assert json.loads(box["result"][1]) == {"singer_state": {"after": 1}}
    assert waited >= 1.0, f"the merge finished after {waited:.2f} s: it did not wait for the held lock"
    assert max(times) < 0.3, f"/pong took {max(times):.2f} s while a lock was held and waited for: {times}"
    # With no on_event, the wait went to nginx's error log at [info] (error_log ... info), saying who holds it.
    logged = nginx.error_log()[logged_before:].splitlines()
    waits = [line for line in logged if 'chstate: waiting for the lock on "dev:held": another process (lock ' in line]
    assert waits and all("[info]" in line for line in waits), "\n".join(logged[-20:])
    assert any('[info]' in line and 'chstate: acquired the lock on "dev:held" after ' in line for line in logged)
    assert not [line for line in logged if "chstate: " in line and "[debug]" in line]  # statements are debug


def test_on_event_inside_nginx_gets_the_events_instead_of_the_error_log(nginx, schema):
    logged_before = len(nginx.error_log())
    status, text, _ = nginx.get("/told", schema=schema, id="dev:told", bookmark="bm-nginx-77")
    assert status == 200, text
    lines = text.splitlines()
    inserts = [line for line in lines if line.startswith("debug statement insert_state (attempt 1): ok in ")]
    assert len(inserts) == 1 and re.search(r"INSERT INTO .*'<state: \d+ bytes>'", inserts[0]), lines
    assert "bm-nginx-77" not in text
    assert "chstate: " not in nginx.error_log()[logged_before:]


def test_a_request_waiting_for_clickhouse_does_not_block_the_worker(nginx):
    # A listener that never accepts: connections complete in the kernel's
    # backlog, requests are never answered, so each one times out (1 s).
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(16)
        start = time.monotonic()
        waiter, box = in_thread(nginx.get, "/silent", port=silent.getsockname()[1])
        time.sleep(0.2)
        times = pong_times(nginx)
        waiter.join()
    waited = time.monotonic() - start
    assert box["result"][0] == 200, box["result"][1]
    assert box["result"][1].startswith("UNAVAILABLE ") and "timed out" in box["result"][1], box["result"][1]
    assert waited >= 1.0, f"the request ended after {waited:.2f} s, before its timeout"
    assert max(times) < 0.3, f"/pong took {max(times):.2f} s while a request waited for its answer: {times}"


def test_the_measurement_sees_a_blocked_worker(nginx):
    # The control for the test above: a blocking call in the worker holds up /pong.
    blocker, _ = in_thread(nginx.get, "/block", seconds=1.5)
    time.sleep(0.2)
    status, _, seconds = nginx.get("/pong", timeout=10)
    blocker.join()
    assert status == 200
    assert seconds >= 1.0, f"/pong took {seconds:.2f} s during a blocking call: the measurement cannot see blocking"


def sleeper_against_a_contender(nginx, clickhouse, bazel_binary, schema, block: bool) -> tuple[str, int, str, dict]:
    """/sleeper holds dev:sleeper for 4 s (4x its 1 s validity) without a store
    call while the chstate CLI, with the same validity, tries for 2.6 s to
    merge into it. Returns /sleeper's answer, the contender's exit status and
    output, and the state after both. The server judges staleness in whole
    seconds, so an unrenewed lock of 1 s validity is taken over between 1 and
    2 s after its last row: the contender's 2.6 s cover that (at 1.8 s the
    control failed once in a clean-clone run), and end before the holder's
    4 s do."""
    binary = bazel_binary("CHSTATE_CLI", "hosts/native/chstate", "//hosts/native:chstate")
    env = clickhouse.env()
    env.update(MELTANO_STATE_BACKEND_URI=clickhouse.uri(), MELTANO_STATE_BACKEND_CLICKHOUSE_PASSWORD=clickhouse.password,
               MELTANO_STATE_BACKEND_CLICKHOUSE_SCHEMA=schema)

    def cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
        return subprocess.run([str(binary), *args], env=env, capture_output=True, text=True, timeout=timeout)

    holder, box = in_thread(nginx.get, "/sleeper", schema=schema, id="dev:sleeper", seconds=4, block=int(block))
    # Event: the holder wrote inside its scope (it holds the lock). The
    # deadline only bounds a broken build.
    deadline = time.monotonic() + 20
    while True:
        got = cli("get", "dev:sleeper")
        if got.returncode == 0 and json.loads(got.stdout).get("singer_state", {}).get("holder") == "in":
            break
        assert time.monotonic() < deadline, f"the holder never wrote inside its scope: {got.stdout} {got.stderr}"
        time.sleep(0.05)
    contender = cli("--stale-lock", "1", "--lock-timeout", "2.6", "--lock-retry", "0.1", "merge", "dev:sleeper",
                    json.dumps({"singer_state": {"contender": 1}}))
    holder.join()
    status, text, _ = box["result"]
    assert status == 200, text
    final = json.loads(cli("get", "dev:sleeper").stdout)
    return text.strip(), contender.returncode, contender.stdout + contender.stderr, final


def test_nginx_renews_a_lock_whose_function_sleeps(nginx, clickhouse, bazel_binary, schema):
    text, code, out, final = sleeper_against_a_contender(nginx, clickhouse, bazel_binary, schema, block=False)
    assert text == "true held", text  # renewed in the background (a light thread), and the scope ended well
    assert code == 4, f"the contender got the lock of a live holder (exit {code}): {out}"
    assert "contender" not in final["singer_state"], final


def test_the_sleeper_measurement_sees_a_lock_left_unrenewed(nginx, clickhouse, bazel_binary, schema):
    # The control for the test above: a worker blocked in poll() runs none of
    # its light threads, the lock goes stale, the contender takes it, and the scope ends
    # ABORTED naming the lease.
    text, code, out, final = sleeper_against_a_contender(nginx, clickhouse, bazel_binary, schema, block=True)
    assert text.startswith("true ABORTED ") and "lease" in text, text
    assert code == 0, f"the contender did not get a lock left to go stale (exit {code}): {out}"
    assert final["singer_state"].get("contender") == 1, final


def test_store_calls_never_collide_with_a_background_renewal(nginx, schema):
    status, text, _ = nginx.get("/busy", schema=schema, id="dev:busy", seconds=3)
    assert status == 200, text
    calls, failures, scope, first = text.strip().split(" ", 3)
    assert int(calls) > 100, text  # the function kept calling throughout its 3 s (3x the validity)
    assert (failures, scope) == ("0", "held"), f"calls failed while the lock was renewed in the background: {text}"


def test_a_scope_abandoned_by_ngx_exit_is_not_renewed(nginx, clickhouse, bazel_binary, schema):
    # A request that ends inside with_lock leaves a store nobody closes, as a
    # process that dies does: its lock must go stale after its validity (1 s)
    # for the next holder, not be renewed in the background for as long as
    # nginx runs (as it was from an ngx.timer, which outlives its request).
    status, text, _ = nginx.get("/abandon", schema=schema, id="dev:abandoned")
    assert (status, text) == (200, "abandoned\n")
    binary = bazel_binary("CHSTATE_CLI", "hosts/native/chstate", "//hosts/native:chstate")
    env = clickhouse.env()
    env.update(MELTANO_STATE_BACKEND_URI=clickhouse.uri(), MELTANO_STATE_BACKEND_CLICKHOUSE_PASSWORD=clickhouse.password,
               MELTANO_STATE_BACKEND_CLICKHOUSE_SCHEMA=schema)
    start = time.monotonic()
    contender = subprocess.run([str(binary), "--stale-lock", "1", "--lock-timeout", "6", "--lock-retry", "0.1", "merge",
                                "dev:abandoned", json.dumps({"singer_state": {"next": 1}})],
                               env=env, capture_output=True, text=True, timeout=60)
    waited = time.monotonic() - start
    assert contender.returncode == 0, f"the abandoned lock was still held after {waited:.1f} s: {contender.stderr}"
    assert waited < 4, f"the next holder waited {waited:.1f} s for a lock whose validity is 1 s"


def test_an_unreachable_server_is_unavailable_and_the_password_stays_out(nginx):
    status, text, _ = nginx.get("/dead")
    assert status == 200, text
    assert text.startswith("UNAVAILABLE "), text
    assert "connection refused" in text and "127.0.0.1:1" in text, text
    assert "s3cret-nginx" not in text
    assert "s3cret-nginx" not in nginx.error_log()
