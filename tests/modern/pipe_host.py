"""Drive the chstate core through //tools:pipe_host and run its SQL somewhere.

The pipe host (tools/pipe_host.cc) keeps one chstate::Store and speaks JSON
lines: for every operation it asks for SQL requests to be run, waits to be
timed, and ends with {"done": ...} or {"failed": ...}. This module is the
driver side:

    from chdb import session
    from pipe_host import ChdbExecutor, PipeHost

    executor = ChdbExecutor(session.Session(path))
    with PipeHost(executor, settings=settings_document(schema="meltano")) as host:
        assert host.init().ok
        host.set(b"dev:tap-a-to-b", {"singer_state": {}})
        out = host.get(b"dev:tap-a-to-b")      # Outcome; out.state.completed == {...}

The host takes one settings document (hosts/common/protocol.h: {"values":
{...}}); its methods are the verbs of core/verbs.h with their arguments
(`set(id, state, partial=None, force=False)`, `merge(id, partial, from_=...)`,
`acquire(id)` ... `release(id, lock_id)`), and `timer()` feeds the idle timer.

`ChdbExecutor` runs each request in a chDB session the way ClickHouse's HTTP
interface would: `param_<name>` URL parameters become query parameters (their
values are already in the escaped text form the server parses), the other URL
parameters are settings applied to that one query, and an exception becomes
HTTP 500 with the exception text as the body.

The binary comes from $CHSTATE_PIPE_HOST or <repo>/bazel-bin/tools/pipe_host.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import subprocess
import time
from pathlib import Path
from typing import Callable, Iterable, Optional, Union

REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_BINARY = REPO_ROOT / "bazel-bin" / "tools" / "pipe_host"

# URL parameters the HTTP interface consumes itself; they are not settings.
HTTP_ONLY_PARAMS = frozenset({"wait_end_of_query", "database", "default_format", "query_id", "session_id"})

_CODE_RE = re.compile(r"(?:^|\n)Code: (\d+)[.,]")

StateId = Union[bytes, str]


# The URI pipe_host's stores open on: the driver decides where requests go.
PIPE_URI = "clickhouse://pipe@pipe/default"


def settings_document(**values) -> dict:
    """A settings document for pipe_host (hosts/common/protocol.h): the
    user's settings by the core's names (schema, table, lock_timeout_seconds,
    lock_wait_seconds, lock_retry_seconds, ...), on PIPE_URI unless `uri` is
    given."""
    return {"values": {"uri": PIPE_URI, **values}}


def binary_path() -> Path:
    env = os.environ.get("CHSTATE_PIPE_HOST")
    return Path(env) if env else DEFAULT_BINARY


def _id_bytes(state_id: StateId) -> bytes:
    return state_id.encode("utf-8") if isinstance(state_id, str) else bytes(state_id)


def escape_param(value: StateId) -> str:
    """ClickHouse's escaped (TabSeparated) text form of a String, all ASCII.

    Independent of core/quoting.cc on purpose: the emulated Python backend in
    the tests uses it to send its own parameters.
    """
    out = []
    for b in _id_bytes(value):
        if b == 0x5C:
            out.append("\\\\")
        elif b == 0x27:
            out.append("\\'")
        elif 0x20 <= b <= 0x7E:
            out.append(chr(b))
        else:
            out.append("\\x%02x" % b)
    return "".join(out)


def exception_code(text: str) -> Optional[int]:
    m = _CODE_RE.search(text)
    return int(m.group(1)) if m else None


# ---------------------------------------------------------------------------
# Executing requests in chDB


@dataclasses.dataclass
class Executed:
    """One request as it was run, for assertions and coverage."""

    request: dict
    params: dict
    settings: dict
    ok: bool
    body: bytes
    error: str = ""
    code: Optional[int] = None

    @property
    def purpose(self) -> str:
        return self.request.get("purpose", "")

    @property
    def sql(self) -> str:
        return self.request.get("sql", "")


class ChdbExecutor:
    """Runs SqlRequests in a chDB session, faithful to the HTTP interface.

    * `param_<name>=<value>` -> params={name: value}; the value is passed
      unchanged (chDB, like the HTTP server, parses the escaped text form).
    * HTTP-only parameters (wait_end_of_query, database, ...) are skipped.
    * Every other URL parameter is a server setting for this query only:
      `SET k = '<value>'` before it (a string, as the HTTP server receives it)
      and afterwards the previous value back (`SET k = DEFAULT` when it had not
      been changed, else `SET k = '<previous>'`), read from system.settings.
    * Success: HTTP 200 with the raw output bytes. An exception (including one
      applying a setting, as the HTTP server would refuse the request): HTTP
      500 with the exception text as the body; `code_header=True` also fills
      X-ClickHouse-Exception-Code like the server does (default: leave it
      empty so the core reads the code from the body).

    `log` keeps every Executed request; `problems` collects protocol
    violations (non-ASCII SQL, restore failures, non-ClickHouse exceptions).
    `before` (optional) is called with each request before it runs.
    """

    def __init__(self, session, *, code_header: bool = False, before: Optional[Callable[[dict], None]] = None):
        self.session = session
        self.code_header = code_header
        self.before = before
        self.log: list[Executed] = []
        self.problems: list[str] = []

    # -- helpers --
    def _query(self, sql: str, params: Optional[dict] = None) -> bytes:
        return self.session.query(sql, "TabSeparated", params=params or None).bytes()

    @staticmethod
    def _literal(value: str) -> str:
        return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"

    def _previous_settings(self, names: Iterable[str]) -> dict:
        names = list(names)
        if not names:
            return {}
        in_list = ", ".join(self._literal(n) for n in names)
        rows = self._query(
            f"SELECT name, hex(value), changed FROM system.settings WHERE name IN ({in_list}) FORMAT TabSeparated"
        )
        prev = {}
        for line in rows.decode("ascii").splitlines():
            name, value_hex, changed = line.split("\t")
            prev[name] = (bytes.fromhex(value_hex).decode("utf-8"), changed == "1")
        return prev

    def _restore(self, applied: list, prev: dict) -> None:
        for name in applied:
            if name not in prev:
                continue
            value, changed = prev[name]
            sql = f"SET {name} = {self._literal(value)}" if changed else f"SET {name} = DEFAULT"
            try:
                self._query(sql)
            except Exception as e:  # noqa: BLE001
                self.problems.append(f"could not restore setting {name}: {e}")

    # -- the callback --
    def __call__(self, request: dict) -> dict:
        if self.before is not None:
            self.before(request)
        sql = request["sql"]
        if any(not (0x20 <= ord(c) <= 0x7E or c == "\n") for c in sql):
            self.problems.append(f"{request.get('purpose')}: SQL is not printable ASCII: {sql[:200]!r}")
        params: dict = {}
        settings: dict = {}
        for key, value in request.get("url_params", []):
            if not isinstance(value, str) or any(not (0x20 <= ord(c) <= 0x7E) for c in value):
                self.problems.append(f"{request.get('purpose')}: URL parameter {key} is not printable ASCII")
            if key.startswith("param_"):
                params[key[len("param_"):]] = value
            elif key in HTTP_ONLY_PARAMS:
                continue
            else:
                settings[key] = value
        if any(not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", k) for k in settings):
            self.problems.append(f"{request.get('purpose')}: odd setting name in {sorted(settings)}")

        applied: list = []
        prev: dict = {}
        try:
            prev = self._previous_settings(settings)
            for name, value in settings.items():
                self._query(f"SET {name} = {self._literal(value)}")
                applied.append(name)
            body = self._query(sql, params)
            executed = Executed(request, params, settings, True, body)
        except Exception as e:  # noqa: BLE001 - chDB raises ChdbError / RuntimeError
            text = str(e)
            code = exception_code(text)
            if code is None:
                self.problems.append(f"{request.get('purpose')}: exception without a ClickHouse code: {text[:300]}")
            executed = Executed(request, params, settings, False, text.encode("utf-8"), text, code)
        finally:
            self._restore(applied, prev)
        self.log.append(executed)

        if executed.ok:
            return {"transport_ok": True, "http_status": 200, "exception_code_header": "", "body_hex": executed.body.hex()}
        header = str(executed.code) if (self.code_header and executed.code is not None) else ""
        return {
            "transport_ok": True,
            "http_status": 500,
            "exception_code_header": header,
            "body_hex": executed.body.hex(),
        }


# ---------------------------------------------------------------------------
# The co-process


class PipeHostError(RuntimeError):
    pass


@dataclasses.dataclass
class State:
    state_id: bytes
    completed: dict
    partial: dict
    merged: Optional[dict] = None  # only when the op asked for {"merged": true}


@dataclasses.dataclass
class Outcome:
    raw: dict
    requests: list  # the request dicts the core asked for, in order
    waits: list  # wait_ms values the core asked for

    @property
    def ok(self) -> bool:
        return "done" in self.raw or "idle" in self.raw

    @property
    def code(self) -> Optional[str]:
        return self.raw["failed"]["code"] if "failed" in self.raw else None

    @property
    def message(self) -> str:
        return self.raw["failed"]["message"] if "failed" in self.raw else ""

    @property
    def done(self) -> dict:
        if not self.ok:
            raise AssertionError(f"operation failed: {self.code}: {self.message}")
        return self.raw["done"]

    @property
    def state(self) -> Optional[State]:
        s = self.done["state"]
        if s is None:
            return None
        return State(bytes.fromhex(s["state_id_hex"]), s["completed"], s["partial"], s.get("merged"))

    @property
    def state_ids(self) -> list:
        return [bytes.fromhex(h) for h in self.done["state_ids_hex"]]

    @property
    def count(self) -> int:
        return self.done["count"]

    @property
    def lock_id(self) -> str:
        return self.done["lock_id"]

    @property
    def server_version(self) -> str:
        return self.done["server_version"]

    @property
    def dialect(self) -> Optional[str]:
        return self.done["dialect"]

    @property
    def next_timeout_ms(self) -> Optional[int]:
        body = self.raw.get("done") or self.raw.get("idle") or {}
        return body.get("next_timeout_ms")

    # One write in kHistoryUpkeepEvery (by the host's random bytes) also looks
    # at its id's history and may trim it: left out of the sequences these
    # tests compare (core/store_test.cc tests that upkeep).
    HISTORY_UPKEEP = ("history_over_limits", "trim_history_of")

    def purposes(self) -> list:
        return [r["purpose"] for r in self.requests if r["purpose"] not in self.HISTORY_UPKEEP]


class PipeHost:
    """A running pipe_host process answering through `execute`.

    `settings` is the one settings document the host opens its store with
    (default: PIPE_URI's, every other setting at its default); `args` gives
    the command line as is instead (tests of the command line)."""

    def __init__(
        self,
        execute: Callable[[dict], dict],
        *,
        settings: Optional[dict] = None,
        args: Optional[Iterable[str]] = None,
        binary: Optional[Union[str, Path]] = None,
        on_wait: Optional[Callable[[int], None]] = None,
    ):
        if settings is not None and args is not None:
            raise ValueError("give settings or args, not both")
        if args is None:
            args = [json.dumps(settings if settings is not None else settings_document())]
        self.execute = execute
        self.on_wait = on_wait or (lambda ms: time.sleep(ms / 1000.0))
        path = Path(binary) if binary else binary_path()
        if not path.exists():
            raise PipeHostError(f"{path} does not exist: run `bazel build //tools:pipe_host` or set CHSTATE_PIPE_HOST")
        self.proc = subprocess.Popen(
            [str(path), *args], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=None, bufsize=0
        )

    # -- lifecycle --
    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                self.proc.stdin.close()
            except OSError:
                pass
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc.stdout.close()

    def __enter__(self) -> "PipeHost":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- raw protocol --
    def send(self, obj) -> None:
        line = obj if isinstance(obj, str) else json.dumps(obj)
        self.proc.stdin.write(line.encode("utf-8") + b"\n")
        self.proc.stdin.flush()

    def receive(self) -> dict:
        line = self.proc.stdout.readline()
        if not line:
            raise PipeHostError(f"pipe_host ended (exit status {self.proc.poll()})")
        return json.loads(line)

    def run(self, op: Union[dict, str]) -> Outcome:
        """Sends one op line (or the idle timer) and serves its requests until
        done/failed (idle for the timer)."""
        self.send(op)
        requests, waits = [], []
        while True:
            msg = self.receive()
            if "request" in msg:
                requests.append(msg["request"])
                self.send({"response": self.execute(msg["request"])})
            elif "wait_ms" in msg:
                waits.append(msg["wait_ms"])
                self.on_wait(msg["wait_ms"])
                self.send({"timer": True})
            elif "done" in msg or "failed" in msg or "idle" in msg:
                return Outcome(msg, requests, waits)
            else:
                raise PipeHostError(f"unexpected line from pipe_host: {msg!r}")

    # -- the verbs (core/verbs.h) --
    def ping(self) -> Outcome:
        return self.run({"op": "ping"})

    def init(self) -> Outcome:
        return self.run({"op": "init"})

    def compact(self) -> Outcome:
        return self.run({"op": "compact"})

    def get(self, state_id: StateId, *, merged: bool = False) -> Outcome:
        return self.run(_doc("get", merged=merged or None, state_id_hex=_id_bytes(state_id).hex()))

    def set(self, state_id: StateId, state: Optional[dict] = None, partial: Optional[dict] = None, *,
            force: bool = False) -> Outcome:
        """Replaces both sides: `state` is the completed side."""
        return self.run(_doc("set", state_id_hex=_id_bytes(state_id).hex(), state=state or {}, partial=partial,
                             force=force or None))

    def merge(self, state_id: StateId, partial: Optional[dict] = None, *, from_: Optional[StateId] = None,
              force: bool = False) -> Outcome:
        return self.run(_doc("merge", state_id_hex=_id_bytes(state_id).hex(), partial=partial,
                             from_hex=None if from_ is None else _id_bytes(from_).hex(), force=force or None))

    def delete(self, state_id: StateId) -> Outcome:
        return self.run({"op": "delete", "state_id_hex": _id_bytes(state_id).hex()})

    def list(self, pattern: Optional[StateId] = None) -> Outcome:
        if pattern is None:
            return self.run({"op": "list", "pattern": None})
        return self.run({"op": "list", "pattern_hex": _id_bytes(pattern).hex()})

    def clear_all(self) -> Outcome:
        return self.run({"op": "clear_all"})

    def copy(self, src: StateId, dst: StateId) -> Outcome:
        return self.run({"op": "copy", "src_hex": _id_bytes(src).hex(), "dst_hex": _id_bytes(dst).hex()})

    def move(self, src: StateId, dst: StateId) -> Outcome:
        return self.run({"op": "move", "src_hex": _id_bytes(src).hex(), "dst_hex": _id_bytes(dst).hex()})

    def export(self, pattern: Optional[StateId] = None, *, after: Optional[StateId] = None,
               limit: Optional[int] = None) -> Outcome:
        return self.run(_doc("export", pattern_hex=None if pattern is None else _id_bytes(pattern).hex(),
                             after_hex=None if after is None else _id_bytes(after).hex(), limit=limit))

    def import_(self, states: Iterable[dict]) -> Outcome:
        """`states`: [{"state_id": id, "completed": {...}, "partial": {...}}]."""
        return self.run({"op": "import", "states": [
            {"state_id_hex": _id_bytes(s["state_id"]).hex(), "completed": s.get("completed") or {},
             "partial": s.get("partial") or {}} for s in states]})

    def history(self, state_id: StateId, *, limit: Optional[int] = None) -> Outcome:
        return self.run(_doc("history", state_id_hex=_id_bytes(state_id).hex(), limit=limit))

    def rollback(self, state_id: StateId, version: str) -> Outcome:
        return self.run({"op": "rollback", "state_id_hex": _id_bytes(state_id).hex(), "version": version})

    def locks(self, pattern: Optional[StateId] = None) -> Outcome:
        return self.run(_doc("locks", pattern_hex=None if pattern is None else _id_bytes(pattern).hex()))

    def unlock(self, state_id: StateId) -> Outcome:
        return self.run({"op": "unlock", "state_id_hex": _id_bytes(state_id).hex()})

    # -- the lock scope --
    def acquire(self, state_id: StateId) -> Outcome:
        return self.run({"op": "acquire", "state_id_hex": _id_bytes(state_id).hex()})

    def renew(self, state_id: StateId) -> Outcome:
        return self.run({"op": "renew", "state_id_hex": _id_bytes(state_id).hex()})

    def release(self, state_id: StateId, lock_id: str) -> Outcome:
        return self.run({"op": "release", "state_id_hex": _id_bytes(state_id).hex(), "lock_id": lock_id})

    # -- the store's timers and end --
    def timer(self) -> Outcome:
        """The idle timer (renewals of held locks, lingering releases): ends in {"idle": ...}."""
        return self.run({"timer": True})

    def close_store(self) -> Outcome:
        """{"close": true}: releases every lock the store holds; done's count says how many."""
        return self.run({"close": True})


def _doc(op: str, **members) -> dict:
    """A verb document without the members left out (None)."""
    return {"op": op, **{k: v for k, v in members.items() if v is not None}}
