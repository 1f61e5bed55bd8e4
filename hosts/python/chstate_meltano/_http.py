"""ClickHouse's HTTP(S) interface as a chstate transport, with http.client.

    transport = HttpTransport(config)          # config from _native.resolve_config
    response = transport({"sql": "SELECT 1", "url_params": [], "host": "h2", "port": 8123, ...})
    transport.close()

* Each request goes to the request's own "host" and "port" (the core picks
  one of the connection's hosts for every request: docs/cluster.md),
  else to config's host and port. Which host comes next after a failure is
  the core's decision, never this transport's.
* One keep-alive connection per host:port, reused while it is fresh: it is
  replaced when it sat idle for `max_idle` seconds (servers close idle
  connections after a few seconds, 3 by default on older ones, and a write
  sent into a closing connection has an unknown outcome) or when the server
  already closed it.
* Separate connect and read timeouts.
* HTTPS verifies the certificate and the host name, against the system trust
  store or `ca_file`; there is deliberately no switch to turn that off.
* Credentials go in X-ClickHouse-User / X-ClickHouse-Key headers, never in the
  URL; url_params are percent-encoded into the query string after
  database=<database>.
* A failure without an HTTP answer comes back as transport_ok=false, with
  maybe_delivered saying whether the request may have reached the server.
"""

from __future__ import annotations

import http.client
import select
import socket
import ssl
import time
from typing import Any, Dict, Mapping, Optional, Tuple
from urllib.parse import quote


class CaFileError(OSError):
    """The CA file could not be read or parsed."""


def _describe(error: BaseException, *, connecting: bool) -> str:
    if isinstance(error, CaFileError):
        return str(error)
    if isinstance(error, ssl.SSLCertVerificationError):
        return f"the server's TLS certificate could not be verified (wrong CA or host name: {error.verify_message})"
    if isinstance(error, ssl.SSLError):
        return f"TLS failed ({error.reason or error})"
    if isinstance(error, ConnectionRefusedError):
        return "connection refused"
    if isinstance(error, socket.gaierror):
        return "the host name could not be resolved"
    if isinstance(error, (socket.timeout, TimeoutError)):
        return "connect timed out" if connecting else "timed out waiting for the answer"
    if isinstance(error, http.client.RemoteDisconnected):
        return "the server closed the connection before answering"
    if isinstance(error, (ConnectionResetError, BrokenPipeError)):
        return "the connection was reset"
    if isinstance(error, http.client.HTTPException):
        return f"bad HTTP answer ({type(error).__name__})"
    return f"{type(error).__name__}: {error}"


def _shown(host: str, port: int) -> str:
    """host:port as messages show it (IPv6 in brackets)."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


class _Kept:
    """A keep-alive connection to one host:port and when it was last used."""

    def __init__(self, conn: http.client.HTTPConnection):
        self.conn = conn
        self.last_used = 0.0


class HttpTransport:
    def __init__(self, config: Mapping[str, Any], *, max_idle: float = 2.0):
        self._host = str(config["host"])
        self._port = int(config["port"])
        self._secure = bool(config.get("secure"))
        self._ca_file = config.get("ca_file") or None
        self._headers = {"X-ClickHouse-User": str(config["user"]), "Content-Type": "text/plain; charset=UTF-8"}
        if config.get("password"):
            self._headers["X-ClickHouse-Key"] = str(config["password"])
        self._base = "/?database=" + quote(str(config["database"]), safe="")
        # The core's defaults (core/defaults.h), from the resolved config;
        # each request then carries its own timeout_ms.
        self._connect_timeout = int(config["connect_timeout_ms"]) / 1000
        self._max_idle = max_idle
        self._kept: Dict[Tuple[str, int], _Kept] = {}  # (host, port) -> its keep-alive connection
        self._context: Optional[ssl.SSLContext] = None
        self.endpoint = _shown(self._host, self._port)  # the configured (first) host

    def __repr__(self) -> str:  # never the password
        return f"HttpTransport({'https' if self._secure else 'http'}://{self.endpoint})"

    def _drop(self, key: Tuple[str, int]) -> None:
        kept = self._kept.pop(key, None)
        if kept is not None:
            kept.conn.close()

    def close(self) -> None:
        for key in list(self._kept):
            self._drop(key)

    def _ssl_context(self) -> ssl.SSLContext:
        if self._context is None:
            try:
                ctx = ssl.create_default_context(cafile=self._ca_file)
            except (OSError, ssl.SSLError) as e:
                raise CaFileError(f"could not load the CA file {self._ca_file}: {e}") from e
            ctx.check_hostname = True
            ctx.verify_mode = ssl.CERT_REQUIRED
            self._context = ctx
        return self._context

    def _stale(self, kept: _Kept) -> bool:
        conn = kept.conn
        if conn.sock is None:
            return True
        if time.monotonic() - kept.last_used > self._max_idle:
            return True
        try:
            # Readable while idle means the server closed it (or sent junk).
            readable, _, _ = select.select([conn.sock], [], [], 0)
        except (OSError, ValueError):
            return True
        return bool(readable)

    def _connection(self, key: Tuple[str, int]) -> _Kept:
        kept = self._kept.get(key)
        if kept is not None and self._stale(kept):
            self._drop(key)
            kept = None
        if kept is None:
            host, port = key
            if self._secure:
                conn: http.client.HTTPConnection = http.client.HTTPSConnection(
                    host, port, timeout=self._connect_timeout, context=self._ssl_context())
            else:
                conn = http.client.HTTPConnection(host, port, timeout=self._connect_timeout)
            try:
                conn.connect()
            except BaseException:
                conn.close()
                raise
            kept = self._kept[key] = _Kept(conn)
        return kept

    def _failure(self, key: Tuple[str, int], error: BaseException, *, connecting: bool,
                 maybe_delivered: bool) -> dict:
        self._drop(key)
        return {
            "transport_ok": False,
            "maybe_delivered": maybe_delivered,
            "transport_error": (f"{_describe(error, connecting=connecting)} ({_shown(*key)}). Check that "
                                "ClickHouse is running there and that host, port and secure are right"),
        }

    def __call__(self, request: Mapping[str, Any]) -> dict:
        # Where the core sends this request; the configured host when it names none.
        key = (str(request.get("host") or self._host), int(request.get("port") or self._port))
        path = self._base + "".join(
            "&" + quote(str(k), safe="") + "=" + quote(str(v), safe="") for k, v in request.get("url_params", []))
        body = str(request["sql"]).encode("utf-8")
        try:
            kept = self._connection(key)
        except (OSError, ssl.SSLError, http.client.HTTPException) as e:
            return self._failure(key, e, connecting=True, maybe_delivered=False)
        conn = kept.conn
        try:
            if request.get("timeout_ms"):
                conn.sock.settimeout(int(request["timeout_ms"]) / 1000)
            conn.request("POST", path, body=body, headers=self._headers)
        except (OSError, http.client.HTTPException) as e:
            return self._failure(key, e, connecting=False, maybe_delivered=True)
        try:
            response = conn.getresponse()
            data = response.read()
        except (OSError, http.client.HTTPException) as e:
            return self._failure(key, e, connecting=False, maybe_delivered=True)
        kept.last_used = time.monotonic()
        if response.will_close:
            self._drop(key)
        return {
            "transport_ok": True,
            "http_status": response.status,
            "exception_code_header": response.getheader("X-ClickHouse-Exception-Code") or "",
            "body": data,
        }
