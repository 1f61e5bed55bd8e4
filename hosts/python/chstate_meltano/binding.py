"""chstate's verbs in Python: one binding for every Python runtime of the core.

The core (the native library through ctypes, or the WebAssembly module in
wasmtime or Extism) decides everything: settings and their defaults, the
verbs and their checks, the SQL, resends, the lock and its renewal. A runtime
supplies a `Core` (the core's calls, as documents); this module supplies the
pump (send each request once, sleep when told, pass the clock and random
bytes), the idle timer in a background thread, and Python's idioms: a
`Store` whose methods are made from the core's verb table, a `lock()` scope,
and `ChstateError`.

    from chstate_meltano.binding import Store
    from chstate_meltano._native import NativeCore
    store = Store(NativeCore(), {"uri": "clickhouse://meltano@localhost:8123/default"})
    store.set("dev:tap", {"singer_state": {"bookmarks": {}}})
    with store.lock("dev:tap") as scope:   # the id's lock, renewed while the block runs
        store.merge("dev:tap", {"singer_state": {"bookmarks": {"users": {"id": 7}}}})
    print(store.get("dev:tap")["merged"])
    store.close()

Methods take the verb's positional arguments in its row's order and the rest
by keyword (`store.set(id, state, force=True)`, `store.history(id, limit=5)`);
Python keywords get a trailing underscore (`store.import_(states)`,
`store.merge(id, from_="src")`). Nothing here imports Meltano.

What the store tells beside its results (a wait for a lock another process
holds, a request sent again, a host marked down, each statement at debug:
docs/diagnostics.md) goes to `logger=` (a `logging.Logger`: the core is asked
for the level the logger is enabled for, and each event is logged at its
level) and/or `on_event=` (a function given each event as a dict).
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import threading
import time
import weakref
from typing import Any, Callable, Iterable, Mapping, Optional

__all__ = ["ChstateError", "Core", "Store", "diagnostics_level", "environment", "id_hex", "id_from_hex"]


class ChstateError(Exception):
    """An operation failed. `code` is an absl status code name (NOT_FOUND,
    ABORTED, UNAVAILABLE, ...), `message` the core's explanation (never the
    password)."""

    def __init__(self, code: str, message: str):
        super().__init__(f"{message} [{code}]")
        self.code = code
        self.message = message


def failed(doc: Mapping[str, Any]) -> ChstateError:
    f = doc.get("failed") or {}
    return ChstateError(str(f.get("code", "UNKNOWN")), str(f.get("message", f"unexpected answer {doc!r}")))


def id_hex(state_id: str | bytes) -> str:
    """State ids are str in Meltano; surrogate escapes carry bytes that are not UTF-8."""
    raw = state_id if isinstance(state_id, bytes) else str(state_id).encode("utf-8", "surrogateescape")
    return raw.hex()


def id_from_hex(hex_id: str) -> str:
    return bytes.fromhex(hex_id).decode("utf-8", "surrogateescape")


def environment() -> dict:
    """The variables the core reads (MELTANO_STATE_BACKEND_*, CLICKHOUSE_*)."""
    return {k: v for k, v in os.environ.items() if k.startswith(("MELTANO_STATE_BACKEND_", "CLICKHOUSE_"))}


# The core's levels (core/diagnostics.h) as Python logging's.
_LOG_LEVELS = {"warning": logging.WARNING, "info": logging.INFO, "debug": logging.DEBUG}
_DIAGNOSTICS = ("none", "warning", "info", "debug")


def diagnostics_level(logger: logging.Logger) -> str:
    """The level to ask the core for so that `logger` gets what it shows:
    DEBUG -> "debug", INFO -> "info", WARNING -> "warning", above -> "none"."""
    for name in ("debug", "info", "warning"):
        if logger.isEnabledFor(_LOG_LEVELS[name]):
            return name
    return "none"


def _event(e: Mapping[str, Any]) -> dict:
    """One "events" entry of an action document as Python gives it: the state
    id decoded (None when the event concerns no id)."""
    hex_id = e.get("state_id_hex")
    return {"kind": e["kind"], "level": e["level"], "at_ms": e["at_ms"], "message": e["message"],
            "line": e.get("line", e["message"]), "state_id": id_from_hex(hex_id) if hex_id else None,
            "numbers": dict(e.get("numbers") or {}), "texts": dict(e.get("texts") or {})}


class Core:
    """The core's calls, as one runtime makes them (documents in and out).

    verbs() -> the verb table's rows; store_new(settings_doc) -> a handle
    (raises ChstateError); store_settings(handle) -> {"settings": ...};
    start/feed(handle, doc_text, now_ms, random) -> the next action;
    store_free(handle). A core whose `takes_bytes` is true also takes
    start/feed(..., data): the op's "document" or the response's body as
    bytes apart from the JSON (chstate.h's *_bytes), and hands an export
    page's document back the same way (its actions are as without)."""

    takes_bytes = False

    def verbs(self) -> list:
        raise NotImplementedError

    def store_new(self, settings: Mapping[str, Any]) -> Any:
        raise NotImplementedError

    def store_settings(self, handle: Any) -> dict:
        raise NotImplementedError

    def start(self, handle: Any, doc: bytes, now_ms: int, random: bytes) -> dict:
        raise NotImplementedError

    def feed(self, handle: Any, doc: bytes, now_ms: int, random: bytes) -> dict:
        raise NotImplementedError

    def store_free(self, handle: Any) -> None:
        raise NotImplementedError


def _encode(doc: Mapping[str, Any]) -> bytes:
    return json.dumps(doc, ensure_ascii=True, separators=(",", ":")).encode("ascii")


# ---- what each kind of result ("returns" in the verb table) is in Python ----

def _state(s: Optional[Mapping[str, Any]]) -> Optional[dict]:
    if s is None:
        return None
    return {"completed": s.get("completed") or {}, "partial": s.get("partial") or {}, "merged": s.get("merged") or {}}


_RETURNS: dict = {
    "nothing": lambda d: None,
    "server": lambda d: {"server_version": d["server_version"], "dialect": d["dialect"]},
    "state": lambda d: _state(d.get("state")),
    "maybe_state": lambda d: _state(d.get("state")),
    "state_ids": lambda d: [id_from_hex(h) for h in d["state_ids_hex"]],
    "count": lambda d: int(d["count"]),
    # With document=True: (the entries' text, more, the page's ids).
    "page": lambda d: ((d["document"], bool(d.get("more")), [id_from_hex(h) for h in d["state_ids_hex"]])
                       if "document" in d else
                       ([{"state_id": id_from_hex(s["state_id_hex"]), **_state(s)} for s in d["states"]],
                        bool(d.get("more")))),
    "versions": lambda d: [{"version": v["version"], "updated_at": v["updated_at"], "current": v["current"],
                            "state": _state(v["state"])} for v in d["versions"]],
    "locks": lambda d: [{"state_id": None if l["state_id_hex"] is None else id_from_hex(l["state_id_hex"]),
                         **{k: l[k] for k in ("table", "holder", "held_s", "renewed_s", "validity_s", "stale")}}
                        for l in d["locks"]],
    "lock": lambda d: d["lock_id"],
}

_PY_KEYWORDS = {"from", "import", "global", "lambda", "class", "def", "in", "is", "not", "or", "and", "del"}


def _py_name(name: str) -> str:
    return name + "_" if name in _PY_KEYWORDS else name


def _put(verb: str, arg: Mapping[str, Any], value: Any, doc: dict) -> None:
    """One argument into its document member; Python values the core cannot
    take are named here (a state id must be a str or bytes)."""
    if value is None:
        return
    kind = arg["type"]
    if kind == "state_id":
        if not isinstance(value, (str, bytes)):
            raise ChstateError("INVALID_ARGUMENT", f"{verb}: {arg['name']} must be a str, not {type(value).__name__}")
        doc[arg["field"]] = id_hex(value)
    elif kind == "pattern":
        if not isinstance(value, (str, bytes)):
            raise ChstateError("INVALID_ARGUMENT", f"{verb}: pattern must be a str or None")
        doc["pattern_hex"] = id_hex(value)
    elif kind == "states":
        doc[arg["field"]] = [{"state_id_hex": id_hex(s["state_id"]), "completed": s.get("completed") or {},
                              "partial": s.get("partial") or {}} for s in value]
    else:
        doc[arg["field"]] = value


def bind_verbs(core: Core) -> None:
    """Makes Store's verb methods from `core`'s table (done by the first Store)."""
    if not Store._bound:
        _bind(Store, core.verbs())


def _bind(cls: type, verbs: Iterable[Mapping[str, Any]]) -> None:
    """Makes a method of `cls` for every verb of the table, but the lock
    scope's ends (acquire and release are `lock()`)."""
    for verb in verbs:
        name = verb["name"]
        if name in ("acquire", "release") or hasattr(cls, _py_name(name)):
            continue
        positional = [a for a in verb["args"] if a["positional"]]
        named = {_py_name(a["name"]): a for a in verb["args"] if not a["positional"]}

        def method(self: "Store", *args: Any, _verb: Mapping[str, Any] = verb, _positional: list = positional,
                   _named: dict = named, **kwargs: Any) -> Any:
            vname = _verb["name"]
            if len(args) > len(_positional):
                raise TypeError(f"{_py_name(vname)}() takes {len(_positional)} positional arguments")
            doc: dict = {"op": vname}
            for arg, value in zip(_positional, args):
                _put(vname, arg, value, doc)
            for key, value in kwargs.items():
                if key in _named:
                    _put(vname, _named[key], value, doc)
                elif any(_py_name(a["name"]) == key for a in _positional):
                    _put(vname, next(a for a in _positional if _py_name(a["name"]) == key), value, doc)
                else:
                    raise TypeError(f"{_py_name(vname)}() got an unexpected keyword argument {key!r} "
                                    f"(its options: {', '.join(sorted(_named)) or 'none'})")
            return _RETURNS[_verb["returns"]](self.run(doc))

        method.__name__ = _py_name(name)
        method.__doc__ = verb["summary"]
        setattr(cls, _py_name(name), method)
    cls._bound = True


class _Scope:
    """A lock scope: the id's lock is held (and renewed by the core's idle
    timer, from the store's thread) until the block ends. Leaving the block
    releases it; a lock lost while the block ran raises ABORTED at the end
    (what the block did was not exclusive)."""

    def __init__(self, store: "Store", state_id: str | bytes):
        self.store, self.state_id, self.lock_id = store, state_id, ""

    def __enter__(self) -> "_Scope":
        self.lock_id = self.store.run({"op": "acquire", "state_id_hex": id_hex(self.state_id)})["lock_id"]
        return self

    def renew(self) -> str:
        return self.store.renew(self.state_id)

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        try:
            self.store.run({"op": "release", "state_id_hex": id_hex(self.state_id), "lock_id": self.lock_id})
        except ChstateError:
            if exc_type is None:
                raise
            # The block's own error matters more.


class Store:
    """One store of the core, opened from the user's settings as given.

    `settings`: the settings by the core's names (uri, host, ..., password,
    lock_timeout_seconds, history_days, ...: docs/settings.md); the core
    resolves them with `env` (default: this process's MELTANO_STATE_BACKEND_*
    and CLICKHOUSE_* variables) and its defaults. `transport(request) ->
    response` runs one request (default: HTTP(S) to the host and port the
    request names); the response's body is "body" (bytes) or "body_hex".
    `timers`: a background thread calls the core back at its timeout while
    you are busy elsewhere (lock renewals, the release of a lingering lock)
    and locks are released when the process exits.
    Operations run one at a time (a lock serialises threads).

    What the store tells (docs/diagnostics.md): `logger` logs each event at
    its level (warning, info, debug) with its line as the message and the
    event as `extra={"chstate": event}`, and the core is asked for the level
    the logger is enabled for when the store is opened; `on_event(event)` is
    called with each event (a dict: kind, level, at_ms, message, line,
    state_id, numbers, texts), from the timer thread for renewals. The level
    is `diagnostics` ("none", "warning", "info" or "debug") when given, else
    the logger's, else "info" for on_event alone, else "none" (nothing is
    made). `show_states` keeps states' contents in debug statements. An
    exception raised by on_event is logged (the first), not raised: the
    operation ends as it would have.
    """

    _bound = False

    def __init__(self, core: Core, settings: Optional[Mapping[str, Any]] = None, *, transport: Any = None,
                 env: Optional[Mapping[str, str]] = None, source: str = "api",
                 clock_ns: Callable[[], int] = time.monotonic_ns, random_bytes: Callable[[int], bytes] = os.urandom,
                 sleep: Callable[[float], None] = time.sleep, timers: bool = True,
                 logger: Optional[logging.Logger] = None, on_event: Optional[Callable[[dict], None]] = None,
                 diagnostics: Optional[str] = None, show_states: bool = False):
        bind_verbs(core)
        if diagnostics is None:
            diagnostics = (diagnostics_level(logger) if logger is not None
                           else "info" if on_event is not None else "none")
        if diagnostics not in _DIAGNOSTICS:
            raise ChstateError("INVALID_ARGUMENT", f"diagnostics must be one of {', '.join(_DIAGNOSTICS)}, "
                               f"not {diagnostics!r}")
        self._logger, self._on_event, self._on_event_failed = logger, on_event, False
        self._core = core
        self._clock_ns, self._random, self._sleep = clock_ns, random_bytes, sleep
        # The core reads values as text; numbers of other types (Meltano's
        # DECIMAL settings arrive as decimal.Decimal) go as their text.
        values = {k: (v if isinstance(v, (str, int, float, bool)) else str(v))
                  for k, v in (settings or {}).items() if v is not None}
        doc = {"from": source, "values": values, "env": dict(environment() if env is None else env),
               "host": {"timers": timers, "exit_release": timers, "diagnostics": diagnostics,
                        "show_states": bool(show_states)}}
        self._handle = core.store_new(doc)
        resolved = core.store_settings(self._handle)["settings"]
        connection = resolved["connection"]
        # What the core resolved, without the password (the transport has it).
        self.settings = {**resolved, "connection": {k: v for k, v in connection.items() if k != "password"}}
        if transport is None:
            if connection.get("chdb_path"):
                core.store_free(self._handle)
                raise ChstateError("FAILED_PRECONDITION", "a chdb:// store needs a chDB transport "
                                   "(chstate_meltano._chdb.ChdbTransport): pass it as transport")
            from ._http import HttpTransport
            transport = HttpTransport(connection)
        self._transport = transport
        self._mutex = threading.RLock()
        self._closed = False
        self._next_tick_ms: Optional[int] = None  # when the core next wants its idle timer
        self._changed = threading.Event()
        self._timers = timers
        if timers:
            threading.Thread(target=_tick_in_background, args=(weakref.ref(self), self._changed),
                             name="chstate-timers", daemon=True).start()
            _OPEN.add(self)
            _register_exit_hook()

    @property
    def redacted_uri(self) -> str:
        return self.settings["connection"]["redacted_uri"]

    def __repr__(self) -> str:  # never the password
        return f"chstate.Store({self.redacted_uri})"

    def __enter__(self) -> "Store":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # ---- the pump ----

    def _now(self) -> int:
        return self._clock_ns() // 1_000_000

    def _answer(self, action: dict) -> dict:
        """Answers actions until the op (or idle timer) ends: each request is
        sent once; whether a failed one goes again is the core's decision."""
        while True:
            if "events" in action:
                self._tell(action["events"])
            if "request" in action:
                response = self._transport(action["request"])
                body = response.get("body")
                if isinstance(body, (bytes, bytearray, memoryview)):
                    # The body as bytes: apart from the JSON to a core that
                    # takes it so, else as hex inside it.
                    rest = {k: v for k, v in response.items() if k != "body"}
                    if self._core.takes_bytes:
                        action = self._core.feed(self._handle, _encode({"response": rest}), self._now(),
                                                 self._random(32), bytes(body))
                        continue
                    rest["body_hex"] = bytes(body).hex()
                    response = rest
                action = self._core.feed(self._handle, _encode({"response": response}), self._now(),
                                         self._random(32))
            elif "wait_ms" in action:
                self._sleep(max(0, int(action["wait_ms"])) / 1000.0)
                action = self._core.feed(self._handle, b'{"timer":true}', self._now(), self._random(32))
            else:
                return action

    def _tell(self, events: Iterable[Mapping[str, Any]]) -> None:
        """What the store told: to the logger at each event's level, and to on_event."""
        for raw in events:
            event = _event(raw)
            if self._logger is not None:
                self._logger.log(_LOG_LEVELS.get(event["level"], logging.INFO), "%s", event["line"],
                                 extra={"chstate": event})
            if self._on_event is not None:
                try:
                    self._on_event(event)
                except Exception:  # noqa: BLE001 - the operation must end; the first error is shown
                    if not self._on_event_failed:
                        self._on_event_failed = True
                        logging.getLogger(__name__).exception(
                            "chstate: on_event raised on a %s event (later ones are not shown)", event["kind"])

    def _note(self, action: Mapping[str, Any]) -> None:
        body = action.get("done") or action.get("idle")
        if body is not None:
            self._next_tick_ms = body.get("next_timeout_ms")
            self._changed.set()

    def _tick(self) -> None:
        """The core's idle timer, when due (held locks renewed, lingering ones
        released). A lock found lost is the core's to report: at the scope's
        release, and to any write under it."""
        if self._next_tick_ms is None or self._now() < self._next_tick_ms:
            return
        action = self._answer(self._core.feed(self._handle, b'{"timer":true}', self._now(), self._random(32)))
        if "failed" in action:
            self._next_tick_ms = None
        else:
            self._note(action)

    def run(self, doc: Mapping[str, Any]) -> dict:
        """Runs one verb document (core/verbs.h) to its end: its "done"
        document, or ChstateError. States carry their merged view."""
        with self._mutex:
            if self._closed:
                raise ChstateError("FAILED_PRECONDITION", "the store is closed")
            self._tick()
            doc = {**doc, "merged": True}
            document = doc.get("document")
            if self._core.takes_bytes and isinstance(document, str):
                # import_document's text apart from the JSON: neither escaped nor parsed twice.
                del doc["document"]
                action = self._core.start(self._handle, _encode(doc), self._now(), self._random(32),
                                          document.encode("utf-8", "surrogatepass"))
            else:
                action = self._core.start(self._handle, _encode(doc), self._now(), self._random(32))
            action = self._answer(action)
            self._note(action)
            if "failed" in action:
                raise failed(action)
            return action["done"]

    # ---- the lock scope and the store's end ----

    def lock(self, state_id: str | bytes) -> _Scope:
        """`with store.lock(id) as scope:` holds the id's lock for the block
        (verbs on the id run under it; `scope.renew()` renews at once)."""
        return _Scope(self, state_id)

    def close(self) -> None:
        """Releases every lock the store holds or keeps lingering, then frees
        it. Best effort: a lock whose release fails expires after its
        validity. Idempotent."""
        with self._mutex:
            if self._closed:
                return
            try:
                self._answer(self._core.start(self._handle, b'{"close":true}', self._now(), self._random(32)))
            except Exception:  # noqa: BLE001 - the transport may be gone at exit
                pass
            self._closed = True
            self._core.store_free(self._handle)
            _OPEN.discard(self)
            _KEPT.discard(self)
            self._changed.set()
            close = getattr(self._transport, "close", None)
            if close is not None:
                close()

    def _keep_while_holding(self) -> None:
        # Kept alive while the core holds a lock for it, so that its owner
        # being garbage-collected (Meltano drops backend objects) does not
        # strand the lock: the timer thread releases it, then lets it go.
        (_KEPT.add if self._next_tick_ms is not None and self._timers else _KEPT.discard)(self)


# Stores released at exit, and those of them that hold a lock now.
_OPEN: "weakref.WeakSet[Store]" = weakref.WeakSet()
_KEPT: set = set()
_hook: list = []


def _register_exit_hook() -> None:
    if not _hook:
        _hook.append(True)
        atexit.register(lambda: [s.close() for s in list(_OPEN)])


def _tick_in_background(ref: "weakref.ref[Store]", changed: threading.Event) -> None:
    while True:
        store = ref()
        if store is None or store._closed:
            return
        store._keep_while_holding()
        due = store._next_tick_ms
        wait = None if due is None else max(0.0, (due - store._now()) / 1000.0)
        del store  # the thread keeps no store alive
        changed.wait(timeout=60.0 if wait is None else wait)
        changed.clear()
        store = ref()
        if store is None:
            return
        if store._mutex.acquire(blocking=False):
            try:
                if not store._closed:
                    store._tick()
            except Exception:  # noqa: BLE001 - the next operation reports what matters
                pass
            finally:
                store._mutex.release()
        elif store._next_tick_ms is not None and store._now() >= store._next_tick_ms:
            time.sleep(0.01)  # an operation runs: look again shortly
        del store
