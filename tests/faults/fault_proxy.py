"""A loopback HTTP fault proxy for the fault-injection tests.

It sits between a client and the real ClickHouse server, forwards each HTTP
request (keep-alive connections included), records every request it saw
(the SQL, the URL, what it did to it) and, when a rule matches, breaks that
exchange in one of these ways:

  reset_request    read the headers and half the body, then reset (RST): the
                   statement never reaches the server
  reset_response   forward it (the server runs it), then reset before answering
  reset_mid_body   forward it, send the headers and half the body, then reset
  truncate         forward it, send the headers (full Content-Length) and half
                   the body, then close normally
  slow             forward it, then hold the answer `delay` seconds (beyond the
                   client's timeout) before sending it
  slow_before      hold the request `delay` seconds, then forward it: the
                   server runs it after the client gave up
  exception_200    do not forward; answer HTTP 200 with a ClickHouse exception
                   as the body (what a server that fails after starting to
                   stream an answer sends)
  exception_after  forward it; answer 200 with the real body followed by an
                   exception
  close            read the request, close without an answer (FIN)

`refuse()` closes the listening socket and every open connection, so new
connections are refused; `accept()` listens again on the same port.

    proxy = FaultProxy("127.0.0.1", server_port)
    proxy.add_rule(r"^INSERT INTO", "reset_response")   # once, the first match
    ... run the client against proxy.port ...
    proxy.requests   # [Captured(sql=..., fault="reset_response"), ...]
    proxy.close()
"""

from __future__ import annotations

import dataclasses
import http.client
import random
import re
import socket
import struct
import threading
import time

EXCEPTION_BODY = (b"Code: 241, e.displayText() = DB::Exception: Memory limit (injected by the fault proxy) "
                  b"exceeded, e.what() = DB::Exception\n")
HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "content-length", "host", "te", "trailer", "upgrade",
              "proxy-connection"}


@dataclasses.dataclass
class Rule:
    pattern: re.Pattern
    fault: str
    times: int
    delay: float


@dataclasses.dataclass
class Captured:
    sql: str
    path: str
    headers: dict
    fault: str  # "" when passed through
    # The server's HTTP status for this request, once it answered (None: not
    # forwarded, or no answer); `upstream_done` is set when the proxy is done
    # with the server for this request (answered or not): the event a test
    # waits for to know whether a late (slow_before) statement landed.
    upstream_status: int | None = None
    upstream_done: threading.Event = dataclasses.field(default_factory=threading.Event, repr=False, compare=False)


class FaultProxy:
    def __init__(self, upstream_host: str, upstream_port: int):
        self.upstream = (upstream_host, upstream_port)
        self.requests: list[Captured] = []
        self.errors: list[str] = []  # unexpected exceptions in connection threads
        self._rules: list[Rule] = []
        self._nth: dict[int, Rule] = {}
        self._random = None
        self._lock = threading.Lock()
        self._conns: set[socket.socket] = set()
        self._closed = False
        self.port = 0
        self._listener = None
        self.accept()

    # -- control ------------------------------------------------------------
    def add_rule(self, pattern: str, fault: str, times: int = 1, delay: float = 0.0) -> None:
        with self._lock:
            self._rules.append(Rule(re.compile(pattern, re.S), fault, times, delay))

    def fault_nth(self, n: int, fault: str, delay: float = 0.0) -> None:
        """Breaks the n-th request (0-based) seen from now on."""
        with self._lock:
            self._nth[len(self.requests) + n] = Rule(re.compile(""), fault, 1, delay)

    def random_faults(self, probability: float, faults: list[str], seed: int, delay: float = 0.0) -> None:
        """From now on, breaks each request with `probability`, in a fault drawn from `faults`."""
        with self._lock:
            self._random = (probability, list(faults), random.Random(seed), delay)

    def clear(self) -> None:
        with self._lock:
            self._rules.clear()
            self._nth.clear()
            self._random = None
            self.requests.clear()

    def sqls(self) -> list[str]:
        with self._lock:
            return [r.sql for r in self.requests]

    def stop_listening(self) -> None:
        """Stop accepting: new connections are refused; open ones go on."""
        with self._lock:
            listener, self._listener = self._listener, None
        if listener is not None:
            # shutdown() wakes the thread blocked in accept(); close() alone
            # would leave the socket listening until then.
            try:
                listener.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            listener.close()

    def refuse(self) -> None:
        """Stop listening and drop every connection: clients get ECONNREFUSED."""
        self.stop_listening()
        with self._lock:
            conns = list(self._conns)
        for c in conns:
            _reset(c)

    def accept(self) -> None:
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(64)
        self.port = listener.getsockname()[1]
        self._listener = listener
        threading.Thread(target=self._accept_loop, args=(listener,), daemon=True).start()

    def close(self) -> None:
        self._closed = True
        self.refuse()

    # -- serving ------------------------------------------------------------
    def _accept_loop(self, listener: socket.socket) -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            with self._lock:
                self._conns.add(conn)
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _take_rule(self, sql: str) -> Rule | None:
        with self._lock:
            nth = self._nth.pop(len(self.requests), None)
            if nth is not None:
                return nth
            if self._random is not None:
                probability, faults, rng, delay = self._random
                if rng.random() < probability:
                    return Rule(re.compile(""), rng.choice(faults), 1, delay)
            for rule in self._rules:
                if rule.times > 0 and rule.pattern.search(sql):
                    rule.times -= 1
                    return rule
        return None

    def _serve(self, conn: socket.socket) -> None:
        buf = b""
        try:
            while True:
                while b"\r\n\r\n" not in buf:
                    chunk = conn.recv(65536)
                    if not chunk:
                        return
                    buf += chunk
                head, buf = buf.split(b"\r\n\r\n", 1)
                lines = head.decode("latin-1").split("\r\n")
                method, path, _ = lines[0].split(" ", 2)
                headers = {}
                for line in lines[1:]:
                    k, _, v = line.partition(":")
                    headers[k.strip()] = v.strip()
                length = int({k.lower(): v for k, v in headers.items()}.get("content-length", "0"))
                # Peek at the SQL to pick a rule before reading all of it.
                while len(buf) < length:
                    chunk = conn.recv(65536)
                    if not chunk:
                        return
                    buf += chunk
                body, buf = buf[:length], buf[length:]
                sql = body.decode("utf-8", "replace")
                rule = self._take_rule(sql)
                fault = rule.fault if rule else ""
                captured = Captured(sql, path, headers, fault)
                with self._lock:
                    self.requests.append(captured)
                try:
                    keep = self._exchange(conn, method, path, headers, body, rule, captured)
                finally:
                    captured.upstream_done.set()  # also when it was never forwarded
                if not keep:
                    return
        except OSError:
            return
        except Exception as e:  # noqa: BLE001 - a malformed exchange ends this connection only
            self.errors.append(repr(e))
            return
        finally:
            with self._lock:
                self._conns.discard(conn)
            try:
                conn.close()
            except OSError:
                pass

    def _forward(self, method, path, headers, body):
        up = http.client.HTTPConnection(*self.upstream, timeout=120)
        try:
            fwd = {k: v for k, v in headers.items() if k.lower() not in HOP_BY_HOP}
            up.request(method, path, body=body, headers=fwd)
            resp = up.getresponse()
            data = resp.read()
            return resp.status, resp.reason, [(k, v) for k, v in resp.getheaders()
                                              if k.lower() not in HOP_BY_HOP], data
        finally:
            up.close()

    def _exchange(self, conn, method, path, headers, body, rule, captured) -> bool:
        """Serves one request; False when the connection is finished."""
        fault = rule.fault if rule else ""
        if fault == "reset_request":
            _reset(conn)
            return False
        if fault == "close":
            conn.shutdown(socket.SHUT_RDWR)
            return False
        if fault == "exception_200":
            conn.sendall(_response(200, "OK", [("Content-Type", "text/tab-separated-values")], EXCEPTION_BODY))
            return True
        if fault == "slow_before":
            time.sleep(rule.delay)  # the fault itself: the statement reaches the server late
        try:
            status, reason, hdrs, data = self._forward(method, path, headers, body)
            captured.upstream_status = status
        except (OSError, http.client.HTTPException):
            # The server is down: the client sees the connection fail, as it would.
            _reset(conn)
            return False
        finally:
            captured.upstream_done.set()
        if fault == "reset_response":
            _reset(conn)
            return False
        if fault == "slow":
            time.sleep(rule.delay)  # the fault itself: the answer arrives after the client's timeout
        if fault == "exception_after":
            data = data + EXCEPTION_BODY
        if fault in ("truncate", "reset_mid_body") and not data:
            captured.fault = ""  # nothing to cut: the answer goes out whole
            fault = ""
        if fault in ("truncate", "reset_mid_body"):
            full = _response(status, reason, hdrs, data)
            head_len = len(full) - len(data)
            conn.sendall(full[:head_len + len(data) // 2])
            if fault == "truncate":
                conn.shutdown(socket.SHUT_RDWR)
            else:
                _reset(conn)
            return False
        conn.sendall(_response(status, reason, hdrs, data))
        return True


def _response(status: int, reason: str, headers, body: bytes) -> bytes:
    lines = [f"HTTP/1.1 {status} {reason}"] + [f"{k}: {v}" for k, v in headers]
    lines += [f"Content-Length: {len(body)}", "Connection: keep-alive"]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


def _reset(conn: socket.socket) -> None:
    """Close with RST instead of FIN."""
    try:
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        conn.close()
    except OSError:
        pass
