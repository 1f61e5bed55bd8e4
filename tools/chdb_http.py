#!/usr/bin/env python3
"""A ClickHouse HTTP interface in front of chDB, on loopback, for tests.

The only modern ClickHouse engine these machines can run is chDB (the
`chdb` Python module: ClickHouse in-process, no server). This front lets
every chstate host (the native CLI, the Python adapter's http.client
transport, the Wasm module's fetch transport, the Lua module) talk to that
engine over its own real HTTP transport, exactly as it talks to a server:

  tools/chdb_http.py start DIR     # start detached, wait for /ping, print CHSTATE_TEST_* lines
  tools/chdb_http.py stop DIR      # stop the front recorded in DIR
  tools/chdb_http.py ensure DIR    # start unless the one in DIR is running
  tools/chdb_http.py run -- CMD    # temporary front, run CMD with CHSTATE_TEST_* env, stop

In a test, in process (a thread; the chDB session lives in this process):

    with ChdbHttpFront(tmp_path / "chdb", record=True) as front:
        ...  # front.host, front.port, front.user, front.password
        front.received      # every request as run: sql, params, settings, status, ...

What it does, as ClickHouse's HTTP interface does:
* POST / with the query in the body; GET (or POST) with `query=` in the URL
  (a POST body then follows the URL query after a newline, as ClickHouse joins
  them); GET /ping and GET / answer "Ok.".
* URL parameters: `database` (the current database for that query; also the
  X-ClickHouse-Database header), `param_<name>` (query parameters, in
  ClickHouse's escaped text form), `query_id` (echoed in X-ClickHouse-Query-Id),
  the other HTTP-only ones (wait_end_of_query, default_format, session_id,
  user, password, ...) consumed or ignored, and every other parameter a
  setting for that query only (set before, restored after).
* Credentials from X-ClickHouse-User / X-ClickHouse-Key, Basic auth, or the
  user/password URL parameters (the last is recorded as a problem: clients
  should never put a password in a URL). Anything but the configured user and
  password: HTTP 403 with `Code: 516. DB::Exception: <user>: Authentication
  failed: ... (AUTHENTICATION_FAILED)`, as a modern server answers.
* Success: 200, the result bytes (TabSeparated unless the query says FORMAT).
  An exception: the body `Code: N. DB::Exception: ... (NAME) (version V)`, the
  header X-ClickHouse-Exception-Code: N, and the HTTP status a modern server
  picks for that code (src/Server/HTTP/exceptionCodeToHTTPStatus.cpp: 403 for
  login errors, 400 for syntax/parse errors, 404 for unknown
  table/database/setting/..., 500 otherwise).
* HTTP/1.1 keep-alive (Content-Length always set, idle connections closed
  after `keep_alive_timeout` seconds), X-ClickHouse-Server-Display-Name,
  X-ClickHouse-Format, X-ClickHouse-Timezone.
* Queries run one at a time (a lock) in one chDB session, however many
  connections are open; the per-request logic is tests/modern/pipe_host.py's
  ChdbExecutor, the same one the modern pipe-host tests use.

What it does not emulate:
* Streaming: results are buffered, so an error never arrives after a 200 (as
  with wait_end_of_query=1); no progress headers, no X-ClickHouse-Summary.
* Compression (compress/decompress, Content-Encoding), HTTPS, sessions
  (session_id is ignored: every request gets fresh settings), GET being
  read-only, query cancellation on disconnect, users/grants/quotas beyond the
  one user, the /play, /replicas_status and dynamic handlers, multiple
  statements per request (chDB decides what it accepts).
* Concurrency: queries never overlap, so races that need two statements in
  flight at once on the server cannot happen here.
"""

from __future__ import annotations

import base64
import dataclasses
import http.server
import secrets
import signal
import sys
import threading
import urllib.parse
import uuid
from pathlib import Path
from typing import Optional

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "modern"))
sys.path.insert(0, str(REPO / "tools"))

import clickhouse_server as chs  # noqa: E402
from pipe_host import HTTP_ONLY_PARAMS, ChdbExecutor, exception_code  # noqa: E402

DISPLAY_NAME = "chstate-chdb-front"
DEFAULT_USER = "chstate"

# URL parameters the HTTP interface consumes itself (never settings).
FRONT_ONLY_PARAMS = frozenset(HTTP_ONLY_PARAMS | {
    "query", "user", "password", "quota_key", "session_timeout", "session_check", "buffer_size", "compress",
    "decompress", "stacktrace", "role", "default_format", "database", "query_id", "wait_end_of_query",
})

# exceptionCodeToHTTPStatus (modern ClickHouse), by error name; the numbers
# come from the engine's own system.errors.
_STATUS_BY_NAME = {
    403: ("UNKNOWN_USER", "WRONG_PASSWORD", "AUTHENTICATION_FAILED", "SET_NON_GRANTED_ROLE", "ACCESS_DENIED"),
    401: ("REQUIRED_PASSWORD",),
    400: ("BAD_ARGUMENTS", "CANNOT_COMPILE_REGEXP", "CANNOT_PARSE_TEXT", "CANNOT_PARSE_ESCAPE_SEQUENCE",
          "CANNOT_PARSE_QUOTED_STRING", "CANNOT_PARSE_DATE", "CANNOT_PARSE_DATETIME", "CANNOT_PARSE_NUMBER",
          "CANNOT_PARSE_DOMAIN_VALUE_FROM_STRING", "CANNOT_PARSE_IPV4", "CANNOT_PARSE_IPV6",
          "CANNOT_PARSE_INPUT_ASSERTION_FAILED", "CANNOT_PARSE_UUID", "DUPLICATE_COLUMN", "ILLEGAL_COLUMN",
          "UNKNOWN_ELEMENT_IN_AST", "UNKNOWN_TYPE_OF_AST_NODE", "THERE_IS_NO_COLUMN", "TOO_DEEP_AST", "TOO_BIG_AST",
          "UNEXPECTED_AST_STRUCTURE", "SYNTAX_ERROR", "INCORRECT_DATA", "TYPE_MISMATCH",
          "VALUE_IS_OUT_OF_RANGE_OF_DATA_TYPE"),
    404: ("UNKNOWN_TABLE", "UNKNOWN_FUNCTION", "UNKNOWN_IDENTIFIER", "UNKNOWN_TYPE", "UNKNOWN_STORAGE",
          "UNKNOWN_DATABASE", "UNKNOWN_SETTING", "UNKNOWN_DIRECTION_OF_SORTING", "UNKNOWN_AGGREGATE_FUNCTION",
          "UNKNOWN_FORMAT", "UNKNOWN_DATABASE_ENGINE", "UNKNOWN_TYPE_OF_QUERY", "UNKNOWN_ROLE"),
    413: ("QUERY_IS_TOO_LARGE",),
    501: ("NOT_IMPLEMENTED",),
    503: ("SOCKET_TIMEOUT", "CANNOT_OPEN_FILE", "CANNOT_SCHEDULE_TASK"),
    411: ("HTTP_LENGTH_REQUIRED",),
    408: ("TIMEOUT_EXCEEDED",),
    415: ("UNSUPPORTED_MEDIA_TYPE",),
}
# Used only if system.errors cannot be read.
_FALLBACK_CODES = {"UNKNOWN_TABLE": 60, "UNKNOWN_DATABASE": 81, "SYNTAX_ERROR": 62, "UNKNOWN_SETTING": 115,
                   "UNKNOWN_IDENTIFIER": 47, "UNKNOWN_FUNCTION": 46, "BAD_ARGUMENTS": 36, "TYPE_MISMATCH": 53,
                   "AUTHENTICATION_FAILED": 516, "ACCESS_DENIED": 497, "UNKNOWN_USER": 192, "WRONG_PASSWORD": 193,
                   "REQUIRED_PASSWORD": 194, "TIMEOUT_EXCEEDED": 159, "NOT_IMPLEMENTED": 48}

@dataclasses.dataclass
class Received:
    """One request as the front answered it (record=True)."""

    method: str
    path: str
    user: str
    sql: str
    database: Optional[str]
    params: dict
    settings: dict
    status: int
    body: bytes
    code: Optional[int] = None
    query_id: str = ""
    peer: int = 0  # the client's port: one per connection (keep-alive shows as one peer)


class ChdbHttpFront:
    """The front, run in this process on a thread: a context manager.

    `data_dir` holds the chDB data (one process per data folder). `port=0`
    picks a free loopback port. `record=True` keeps every Received request in
    `received` (and `take()` returns and clears them). `problems` lists
    protocol violations by clients: non-ASCII SQL or URL parameters, odd
    setting names, a password in the URL.
    """

    def __init__(self, data_dir, *, user: str = DEFAULT_USER, password: Optional[str] = None, port: int = 0,
                 host: str = "127.0.0.1", record: bool = False, keep_alive_timeout: float = 10.0,
                 session=None):
        self.data_dir = Path(data_dir)
        self.user = user
        self.password = secrets.token_hex(16) if password is None else password
        self.host = host
        self.requested_port = port
        self.port = 0
        self.record = record
        self.keep_alive_timeout = keep_alive_timeout
        self.received: list[Received] = []
        self.problems: list[str] = []
        self._external_session = session
        self._session = None
        self._executor: Optional[ChdbExecutor] = None
        self._lock = threading.Lock()
        self._server: Optional[http.server.ThreadingHTTPServer] = None
        self._thread: Optional[threading.Thread] = None
        self.version = ""
        self._status_by_code: dict[int, int] = {}
        self._names: dict[int, str] = {}

    # -- lifecycle --
    def open_engine(self) -> None:
        if self._session is not None:
            return
        if self._external_session is not None:
            self._session = self._external_session
        else:
            from chdb import session as chdb_session  # imported late: `stop` needs no chDB
            self.data_dir.mkdir(parents=True, exist_ok=True)
            self._session = chdb_session.Session(str(self.data_dir))
        self._executor = ChdbExecutor(self._session, code_header=True)
        self.version = self._scalar("SELECT version()")
        codes = dict(_FALLBACK_CODES)
        try:
            out = self._session.query(
                "SELECT DISTINCT name, code FROM system.errors SETTINGS system_events_show_zero_values = 1",
                "TabSeparated").bytes().decode()
            for line in out.splitlines():
                name, code = line.split("\t")
                codes[name] = int(code)
        except Exception as e:  # noqa: BLE001 - an older engine: keep the fallback
            self.problems.append(f"front: could not read system.errors ({e}); using built-in error codes")
        self._names = {c: n for n, c in codes.items()}
        for status, names in _STATUS_BY_NAME.items():
            for name in names:
                if name in codes:
                    self._status_by_code[codes[name]] = status

    def _scalar(self, sql: str) -> str:
        return self._session.query(sql, "TabSeparated").bytes().decode().strip()

    def _bind(self) -> None:
        self.open_engine()
        # `timeout`: idle keep-alive connections are closed after it.
        handler = type("Handler", (_Handler,), {"front": self, "timeout": self.keep_alive_timeout})
        self._server = _Server((self.host, self.requested_port), handler)
        self.port = self._server.server_address[1]

    def start(self) -> "ChdbHttpFront":
        """Serves on a daemon thread (the context manager calls this)."""
        self._bind()
        self._thread = threading.Thread(target=self._server.serve_forever, name="chdb-http-front", daemon=True)
        self._thread.start()
        return self

    def serve_forever(self) -> None:
        """Serves in this thread until shutdown() (the detached process)."""
        self._bind()
        self._server.serve_forever()

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        if self._thread is not None:
            self._thread.join(timeout=10)
            self._thread = None
        if self._session is not None and self._external_session is None:
            with self._lock:
                self._session.close()
        self._session = None

    def __enter__(self) -> "ChdbHttpFront":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # -- for tests --
    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def env(self) -> dict[str, str]:
        return {"CHSTATE_TEST_URL": self.url, "CHSTATE_TEST_HOST": self.host, "CHSTATE_TEST_PORT": str(self.port),
                "CHSTATE_TEST_USER": self.user, "CHSTATE_TEST_PASSWORD": self.password}

    def take(self) -> list[Received]:
        with self._lock:
            out, self.received = self.received, []
        return out

    def sql(self, sql: str, **params) -> bytes:
        """Runs one statement in the engine directly (no HTTP), for set-up and checks."""
        with self._lock:
            return self._session.query(sql, "TabSeparated", params=params or None).bytes()

    # -- answering --
    def status_for(self, code: Optional[int]) -> int:
        return self._status_by_code.get(code, 500) if code is not None else 500

    def exception_body(self, code: int, text: str) -> bytes:
        """ClickHouse's HTTP form: `Code: N. DB::Exception: ... (NAME) (version V)` and a newline."""
        text = text.strip()
        if not text.startswith("Code: "):
            name = self._names.get(code, "")
            text = f"Code: {code}. DB::Exception: {text}" + (f" ({name})" if name else "")
        if "(version " not in text:
            text += f" (version {self.version})"
        return (text + "\n").encode("utf-8", "replace")

    def authenticate(self, user: str, password: str) -> bool:
        return secrets.compare_digest(user.encode(), self.user.encode()) and \
            secrets.compare_digest(password.encode(), self.password.encode())

    def execute(self, sql: str, url_params: list, database: Optional[str]) -> tuple[int, bytes, Optional[int], dict,
                                                                                     dict]:
        """Runs one query under the lock: (status, body, code, params, settings)."""
        request = {"sql": sql, "url_params": url_params, "purpose": "http"}
        with self._lock:
            previous_db = None
            if database:
                try:
                    previous_db = self._scalar("SELECT currentDatabase()")
                    self._session.query(f"USE {_quote_identifier(database)}", "TabSeparated")
                except Exception as e:  # noqa: BLE001
                    text = str(e)
                    code = exception_code(text) or 81
                    return self.status_for(code), self.exception_body(code, text), code, {}, {}
            try:
                response = self._executor(request)
                executed = self._executor.log.pop()
                self._executor.log.clear()
                self.problems.extend(self._executor.problems)
                self._executor.problems.clear()
            finally:
                if previous_db is not None:
                    try:
                        self._session.query(f"USE {_quote_identifier(previous_db)}", "TabSeparated")
                    except Exception as e:  # noqa: BLE001
                        self.problems.append(f"front: could not restore the current database: {e}")
        body = bytes.fromhex(response["body_hex"])
        if executed.ok:
            return 200, body, None, executed.params, executed.settings
        code = executed.code
        if code is None:
            return 500, body, None, executed.params, executed.settings
        return self.status_for(code), self.exception_body(code, executed.error), code, executed.params, \
            executed.settings


def _quote_identifier(name: str) -> str:
    return "`" + name.replace("\\", "\\\\").replace("`", "\\`") + "`"


class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 128


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "chdb-http-front"
    sys_version = ""
    front: ChdbHttpFront  # set per front by type()

    def log_message(self, format, *args):  # noqa: A002 - never print request lines (URLs may hold secrets)
        pass

    # A modern server accepts a request line up to http_max_uri_size (1 MiB
    # by default); http.server stops at 64 KiB. Ids travel as param_* URL
    # parameters in the modern dialect, so a 100 KB id must get through.
    MAX_URI = 1 << 20

    def handle_one_request(self):
        try:
            self.raw_requestline = self.rfile.readline(self.MAX_URI + 1)
        except TimeoutError:
            self.close_connection = True
            return
        if len(self.raw_requestline) > self.MAX_URI:
            self.requestline, self.request_version, self.command = "", "", ""
            self.send_error(414)
            return
        if not self.raw_requestline:
            self.close_connection = True
            return
        if not self.parse_request():
            return
        method = getattr(self, "do_" + self.command, None)
        if method is None:
            self.send_error(501, f"Unsupported method ({self.command!r})")
            return
        try:
            method()
            self.wfile.flush()
        except TimeoutError:
            self.close_connection = True

    # -- plumbing --
    def _read_body(self) -> bytes:
        if "chunked" in (self.headers.get("Transfer-Encoding") or "").lower():
            chunks = []
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass
                    return b"".join(chunks)
                chunks.append(self.rfile.read(size))
                self.rfile.readline()
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length > 0 else b""

    def _answer(self, status: int, body: bytes, headers: Optional[dict] = None) -> None:
        self.send_response(status)
        self.send_header("X-ClickHouse-Server-Display-Name", DISPLAY_NAME)
        self.send_header("Keep-Alive", f"timeout={int(self.front.keep_alive_timeout)}")
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    # -- methods --
    def do_GET(self):
        self._handle(b"")

    def do_HEAD(self):
        self._handle(b"")

    def do_POST(self):
        self._handle(self._read_body())

    def _handle(self, body: bytes) -> None:
        try:
            self._handle_request(body)
        except (ConnectionError, TimeoutError):
            self.close_connection = True
        except Exception as e:  # noqa: BLE001 - a bug in the front: answer like a server would, and say so
            self.front.problems.append(f"front: {type(e).__name__}: {e}")
            self._answer(500, f"Code: 1001. DB::Exception: front: {type(e).__name__}: {e}. (STD_EXCEPTION)\n"
                         .encode("utf-8", "replace"), {"X-ClickHouse-Exception-Code": "1001",
                                                       "Content-Type": "text/plain; charset=UTF-8"})

    def _handle_request(self, body: bytes) -> None:
        front = self.front
        split = urllib.parse.urlsplit(self.path)
        pairs = urllib.parse.parse_qsl(split.query, keep_blank_values=True)
        query = {k: v for k, v in pairs}
        if split.path == "/ping" or (split.path == "/" and self.command in ("GET", "HEAD") and "query" not in query):
            self._answer(200, b"Ok.\n", {"Content-Type": "text/html; charset=UTF-8"})
            return
        if split.path != "/":
            self._answer(404, b"There is no handle " + split.path.encode("utf-8", "replace") + b"\n",
                         {"Content-Type": "text/plain; charset=UTF-8"})
            return

        user, password = self._credentials(query)
        query_id = query.get("query_id") or str(uuid.uuid4())
        common = {"X-ClickHouse-Query-Id": query_id, "X-ClickHouse-Timezone": "UTC"}
        if not front.authenticate(user, password):
            code = 516
            text = (f"Code: 516. DB::Exception: {user}: Authentication failed: password is incorrect, or there is no "
                    "user with such name. (AUTHENTICATION_FAILED)")
            body_out = front.exception_body(code, text)
            self._record(user, "", None, {}, {}, 403, body_out, code, query_id)
            self._answer(403, body_out, {**common, "X-ClickHouse-Exception-Code": str(code),
                                         "Content-Type": "text/plain; charset=UTF-8"})
            return

        sql_parts = []
        if "query" in query:
            sql_parts.append(query["query"])
        if body:
            sql_parts.append(body.decode("utf-8", "surrogateescape"))
        sql = "\n".join(sql_parts)
        database = query.get("database") or self.headers.get("X-ClickHouse-Database") or None
        url_params = [[k, v] for k, v in pairs if k not in FRONT_ONLY_PARAMS]
        if not sql.strip():
            code = 62
            text = "Code: 62. DB::Exception: Empty query. (SYNTAX_ERROR)"
            status, out, params, settings = front.status_for(code), front.exception_body(code, text), {}, {}
        else:
            status, out, code, params, settings = front.execute(sql, url_params, database)
        self._record(user, sql, database, params, settings, status, out, code, query_id)
        headers = dict(common)
        if status == 200:
            headers["Content-Type"] = "text/tab-separated-values; charset=UTF-8"
            headers["X-ClickHouse-Format"] = "TabSeparated"
        else:
            headers["Content-Type"] = "text/plain; charset=UTF-8"
            if code is not None:
                headers["X-ClickHouse-Exception-Code"] = str(code)
        self._answer(status, out, headers)

    def _credentials(self, query: dict) -> tuple[str, str]:
        h = self.headers
        if h.get("X-ClickHouse-User") is not None or h.get("X-ClickHouse-Key") is not None:
            return h.get("X-ClickHouse-User") or "default", h.get("X-ClickHouse-Key") or ""
        auth = h.get("Authorization") or ""
        if auth.lower().startswith("basic "):
            try:
                user, _, password = base64.b64decode(auth[6:].strip()).decode("utf-8").partition(":")
                return user or "default", password
            except (ValueError, UnicodeDecodeError):
                return "", ""
        if "password" in query:
            self.front.problems.append("a client sent a password in the URL")
        return query.get("user") or "default", query.get("password", "")

    def _record(self, user, sql, database, params, settings, status, body, code, query_id) -> None:
        if not self.front.record:
            return
        path = urllib.parse.urlsplit(self.path).path
        item = Received(self.command, path, user, sql, database, dict(params), dict(settings), status, body, code,
                        query_id, self.client_address[1])
        with self.front._lock:
            self.front.received.append(item)


# ---------------------------------------------------------------------------
# The detached front: start/stop/ensure/run DIR. Ports, instance.json, the pid
# checks, stopping and the commands are tools/clickhouse_server.py's.


def _is_ours(inst: dict) -> bool:
    """The recorded pid is still this tool serving the recorded folder."""
    parts = chs.cmdline(inst["pid"])
    return any(part.endswith(b"chdb_http.py") for part in parts) and inst["dir"].encode() in parts


def running(d: Path) -> Optional[dict]:
    return chs.running(d.resolve(), is_ours=_is_ours)


def stop(d: Path, *, remove: bool = False) -> None:
    chs.stop(d.resolve(), remove=remove, is_ours=_is_ours)


def start(d: Path, *, wait_seconds: float = 120.0) -> dict:
    """Starts the front for DIR as a detached process (data in DIR/data), after
    stopping one already there (chDB: one process per data folder); a restart
    keeps the password, the data and, if free, the port."""
    d = d.resolve()
    stop(d)
    (d / "log").mkdir(parents=True, exist_ok=True)
    existing = chs.load_instance(d)
    password = existing["password"] if existing else secrets.token_hex(16)
    log = d / "log" / "front.log"
    for attempt in range(5):
        port = existing["http_port"] if existing and attempt == 0 else chs.free_port()
        # `serve` reads the port and password from the record: written before it starts.
        inst = {"pid": 0, "dir": str(d), "user": DEFAULT_USER, "password": password, "http_port": port}
        chs.write_record(d / "instance.json", inst)
        proc = chs.spawn([sys.executable, str(Path(__file__).resolve()), "serve", str(d)], d, log)
        inst["pid"] = proc.pid
        chs.write_record(d / "instance.json", inst)
        if chs.wait_ready(proc, lambda: chs.ping(port), wait_seconds):
            return inst
    sys.exit(f"chdb_http: the front did not answer /ping; last log lines:\n{chs.tail(log)}")


def serve(d: Path) -> int:
    """The detached process: serves DIR's instance until SIGTERM."""
    d = d.resolve()
    inst = chs.load_instance(d)
    if inst is None:
        sys.exit(f"chdb_http: no instance.json in {d}")
    front = ChdbHttpFront(d / "data", user=inst["user"], password=inst["password"], port=inst["http_port"])

    def on_term(signum, frame):
        if front._server is not None:
            threading.Thread(target=front._server.shutdown, daemon=True).start()
        else:
            sys.exit(0)

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_term)
    try:
        front.serve_forever()
    finally:
        if front._server is not None:
            front._server.server_close()
        if front._session is not None:
            front._session.close()
    return 0


def main() -> int:
    ap = chs.instance_parser(__doc__, ("start", "stop", "ensure", "serve"))
    args = ap.parse_args()

    if args.cmd == "serve":
        return serve(args.dir)
    return chs.instance_commands(args, start=start, stop=stop, running=running, env_lines=chs.env_lines,
                                 prefix="chstate-chdb-", usage_error=ap.error)


if __name__ == "__main__":
    sys.exit(main())
