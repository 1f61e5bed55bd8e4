"""The adapter's Python layer without Meltano: the HTTP transport against a
fake server that records what arrives, and the binding's pump around the C
ABI with a scripted transport. Runs in the test runner's own Python."""

from __future__ import annotations

import http.server
import os
import socket
import sys
import threading
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "hosts" / "python"))

from chstate_meltano import _native  # noqa: E402
from chstate_meltano._http import HttpTransport  # noqa: E402
from chstate_meltano.binding import ChstateError, Store  # noqa: E402
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import native_library  # noqa: E402

CONFIG = {"host": "127.0.0.1", "port": 0, "secure": False, "user": "meltano user", "password": "pa ss&word",
          "database": "my db/x", "ca_file": "", "connect_timeout_ms": 5000}


class Recorder(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    log: list = []
    mode = "ok"

    def do_POST(self):  # noqa: N802
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        Recorder.log.append({"path": self.path, "headers": dict(self.headers), "body": body,
                             "peer": self.client_address[1]})
        if Recorder.mode == "hang-up":
            self.close_connection = True
            return
        if Recorder.mode == "slow":
            time.sleep(1.0)  # the fault itself: answers after the client's 0.3 s timeout
        if Recorder.mode == "error":
            payload = b"Code: 60, e.displayText() = DB::Exception: Table x doesn't exist\n"
            self.send_response(404)
            self.send_header("X-ClickHouse-Exception-Code", "60")
        else:
            payload = b"18.16.1\t1\n"
            self.send_response(200)
        self.send_header("Content-Length", str(len(payload)))
        if Recorder.mode == "close":
            self.send_header("Connection", "close")
            self.close_connection = True
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, *args):
        pass


@pytest.fixture
def fake():
    Recorder.log = []
    Recorder.mode = "ok"
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Recorder)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def transport(server, **kw) -> HttpTransport:
    return HttpTransport(dict(CONFIG, port=server.server_address[1]), **kw)


REQUEST = {"sql": "SELECT version(), 1 FORMAT TabSeparated", "purpose": "select_version", "idempotent": True,
           "url_params": [["param_id", "a\\tb&c=d é"], ["wait_end_of_query", "1"]]}


def test_credentials_in_headers_and_parameters_percent_encoded(fake):
    t = transport(fake)
    r = t(REQUEST)
    assert r == {"transport_ok": True, "http_status": 200, "exception_code_header": "", "body": b"18.16.1\t1\n"}
    got = Recorder.log[0]
    assert got["path"] == "/?database=my%20db%2Fx&param_id=a%5Ctb%26c%3Dd%20%C3%A9&wait_end_of_query=1"
    assert got["headers"]["X-ClickHouse-User"] == "meltano user"
    assert got["headers"]["X-ClickHouse-Key"] == "pa ss&word"
    assert "pa" not in got["path"].split("database")[0] and "word" not in got["path"]
    assert got["body"] == REQUEST["sql"].encode()
    assert "pa ss" not in repr(t)


def test_keep_alive_is_reused_while_fresh_and_replaced_when_idle(fake):
    t = transport(fake, max_idle=0.3)
    t(REQUEST)
    t(REQUEST)
    assert Recorder.log[0]["peer"] == Recorder.log[1]["peer"]
    time.sleep(0.5)  # time must pass (by design): the connection idles past max_idle
    t(REQUEST)
    assert Recorder.log[2]["peer"] != Recorder.log[1]["peer"]


def test_a_connection_the_server_closed_is_not_reused(fake):
    Recorder.mode = "close"
    t = transport(fake)
    t(REQUEST)
    Recorder.mode = "ok"
    r = t(REQUEST)
    assert r["transport_ok"] and r["http_status"] == 200
    assert Recorder.log[0]["peer"] != Recorder.log[1]["peer"]


def test_server_errors_pass_through_with_the_code_header(fake):
    Recorder.mode = "error"
    r = transport(fake)(REQUEST)
    assert r["transport_ok"] and r["http_status"] == 404 and r["exception_code_header"] == "60"


def test_transport_failures_say_whether_the_request_may_have_arrived(fake):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed_port = s.getsockname()[1]
    r = HttpTransport(dict(CONFIG, port=closed_port))(REQUEST)
    assert r["transport_ok"] is False and r["maybe_delivered"] is False
    assert r["transport_error"].startswith(f"connection refused (127.0.0.1:{closed_port})")

    Recorder.mode = "hang-up"
    r = transport(fake)(REQUEST)
    assert r["transport_ok"] is False and r["maybe_delivered"] is True
    assert "closed the connection before answering" in r["transport_error"]

    Recorder.mode = "slow"
    started = time.monotonic()
    r = transport(fake)(dict(REQUEST, timeout_ms=300))  # the request's own timeout, set by the core
    assert time.monotonic() - started < 0.9
    assert r["transport_ok"] is False and r["maybe_delivered"] is True
    assert "timed out waiting for the answer" in r["transport_error"]
    for failure in ("connection refused", "closed the connection", "timed out"):
        assert "pa ss" not in failure


def test_missing_ca_file_is_a_transport_error():
    r = HttpTransport(dict(CONFIG, port=1, secure=True, ca_file="/nonexistent/ca.pem"))(REQUEST)
    assert r["transport_ok"] is False and "could not load the CA file /nonexistent/ca.pem" in r["transport_error"]


# ---- the loop around the C ABI ----

@pytest.fixture(scope="module")
def lib(library):
    with native_library.loaded(library) as loaded_lib:
        yield loaded_lib


class Script:
    """A transport answering from a list; records (purpose, answer kind)."""

    def __init__(self, answers):
        self.answers = list(answers)
        self.seen = []

    def __call__(self, request):
        answer = self.answers.pop(0) if self.answers else {"transport_ok": False, "maybe_delivered": False,
                                                              "transport_error": "connection refused (h:1)"}
        self.seen.append((request["purpose"], answer.get("transport_ok", True)))
        return answer


OK_VERSION = {"transport_ok": True, "http_status": 200, "body_hex": b"18.16.1\t1\n".hex()}
REFUSED = {"transport_ok": False, "maybe_delivered": False, "transport_error": "connection refused (h:1)"}
LOST = {"transport_ok": False, "maybe_delivered": True, "transport_error": "connection reset (h:1)"}


FREE = {"transport_ok": True, "http_status": 200, "body_hex": ""}  # no Python backend's row; an INSERT done


def store(script, **settings):
    clock = [0]  # a fake clock that only sleeping advances

    def sleep(seconds):
        clock[0] += int(seconds * 1e9)

    # No history: its upkeep (after one write in 64, by the write's random
    # bytes) would add requests these scripts do not answer.
    values = dict({"uri": "clickhouse://u@h:1/d", "schema": "s", "lock_wait_seconds": 0.3,
                   "lock_retry_seconds": 0.1, "history_days": 0}, **settings)
    return Store(_native.NativeCore(), values, transport=script, env={}, clock_ns=lambda: clock[0], sleep=sleep,
                 timers=False)


def test_idempotent_requests_are_retried_twice(lib):
    script = Script([REFUSED, REFUSED, OK_VERSION])
    assert store(script).ping()["server_version"] == "18.16.1"
    assert [p for p, _ in script.seen] == ["select_version"] * 3


# Writes under a lock scope's lock (taken first: version, no Python row, the
# lock), so that only the write's own requests follow.
def test_a_write_that_may_have_arrived_is_not_resent(lib):
    script = Script([OK_VERSION, FREE, FREE, LOST])
    s = store(script)
    s.run({"op": "acquire", "state_id_hex": "61"})
    with pytest.raises(ChstateError) as e:
        s.set("a", {"singer_state": 1})
    assert [p for p, _ in script.seen] == ["select_version", "foreign_lock_rows", "create_lock", "insert_state"]
    assert e.value.code == "UNAVAILABLE"


def test_a_write_that_never_left_is_resent(lib):
    script = Script([OK_VERSION, FREE, FREE, REFUSED, FREE])
    s = store(script)
    s.run({"op": "acquire", "state_id_hex": "61"})
    s.set("a", {"singer_state": 1})
    assert [p for p, _ in script.seen] == ["select_version", "foreign_lock_rows", "create_lock", "insert_state",
                                           "insert_state"]


def test_a_lock_with_no_server_answering_is_unavailable_not_locked(lib):
    script = Script([OK_VERSION, FREE])  # then refused forever
    with pytest.raises(ChstateError) as e:
        store(script).run({"op": "acquire", "state_id_hex": "61"})
    assert e.value.code == "UNAVAILABLE"
    assert "connection refused (h:1)" in e.value.message


def test_a_lock_held_by_another_process_stays_aborted(lib):
    exists = {"transport_ok": True, "http_status": 500,
              "body_hex": b"Code: 57, e.displayText() = DB::Exception: Table already exists\n".hex()}
    holder = {"transport_ok": True, "http_status": 200,
              "body_hex": b"other\t0\t100\t100\t300\n\t255\t100\t100\t0\n".hex()}
    # A refusal in between, then answers again: the lock really is held (and
    # the contender shows itself to the holder once, the first time it backs off).
    script = Script([OK_VERSION, FREE, REFUSED, REFUSED, REFUSED, REFUSED, REFUSED, REFUSED, exists, holder, FREE]
                    + [exists, holder] * 20)
    with pytest.raises(ChstateError) as e:
        # The refusals (with the transport's retry pauses) use 0.6 s of the 0.7 s.
        store(script, lock_wait_seconds=0.7, lock_retry_seconds=0.01).run({"op": "acquire", "state_id_hex": "61"})
    assert e.value.code == "ABORTED"
    assert "locked by another process" in e.value.message


def test_bad_settings_and_ops_raise_chstate_errors(lib):
    with pytest.raises(ChstateError) as e:
        store(Script([]), schema="bad name")
    assert e.value.code == "INVALID_ARGUMENT" and "schema" in e.value.message
    with pytest.raises(ChstateError) as e:
        store(Script([])).run({"op": "frobnicate"})
    assert e.value.code == "INVALID_ARGUMENT" and "unknown verb" in e.value.message
    s = store(Script([]))
    s.close()
    with pytest.raises(ChstateError) as e:
        s.ping()
    assert e.value.code == "FAILED_PRECONDITION"


def test_resolve_settings_is_the_cores(lib):
    st = _native.resolve_settings({"values": {"uri": "clickhouse://u:p%40ss@[::1]:9000/d?secure=true", "port": 9443,
                                              "host": None}})
    cfg = st["connection"]
    assert (cfg["host"], cfg["port"], cfg["secure"], cfg["password"]) == ("::1", 9443, True, "p@ss")
    assert cfg["redacted_uri"] == "clickhouse://u:***@[::1]:9443/d?secure=true&schema=meltano&table=state"
    with pytest.raises(ChstateError) as e:
        _native.resolve_settings({"values": {"uri": "clickhouse://u:p%40ss@h"}})
    assert e.value.code == "INVALID_ARGUMENT" and "p@ss" not in e.value.message


def test_state_ids_cross_as_bytes():
    weird = "a\x00b\n" + b"\xff".decode("utf-8", "surrogateescape") + "é"
    assert _native.id_from_hex(_native.id_hex(weird)) == weird
    assert _native.id_hex(weird) == b"a\x00b\n\xff\xc3\xa9".hex()


def test_missing_library_says_how_to_get_it(monkeypatch, tmp_path):
    monkeypatch.setenv("CHSTATE_LIBRARY", str(tmp_path / "nope.so"))
    with pytest.raises(_native.LibraryNotFoundError) as e:
        _native.library_path()
    assert "bazel build -c opt //hosts/python:libchstate.so" in e.value.message
    monkeypatch.delenv("CHSTATE_LIBRARY", raising=False)
    with pytest.raises(_native.LibraryNotFoundError) as e:
        _native.library_path()
    assert "CHSTATE_LIBRARY is not set" in e.value.message
