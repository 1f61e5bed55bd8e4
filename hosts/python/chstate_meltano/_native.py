"""The chstate core through its C ABI (hosts/common/chstate.h), with ctypes.

The library is sans-IO: it says which SQL to run and how long to wait, and this
module pumps it: it sends each request once, sleeps when told, and supplies the
time and fresh random bytes with every call. Resends after transport failures,
timeouts and every other rule are the library's. Nothing here imports Meltano, so it can be used and tested alone.

    from chstate_meltano import _native
    config = _native.resolve_config({"uri": "clickhouse://me@db:8123/default"})
    store = _native.Store({"schema": "meltano"}, transport=my_transport)
    done = store.run({"op": "get", "state_id_hex": b"dev:a".hex()})

Where the library comes from (first match wins):
  1. libchstate.so inside this package (a wheel built by hosts/python/build_wheel.sh),
  2. the path in $CHSTATE_LIBRARY (e.g. bazel-bin/hosts/python/libchstate.so).
The packaged copy wins so that an installed wheel always runs the library it
was built and tested with, whatever a shell happens to export.

Memory: every string the library returns is copied into Python and released
with chstate_string_free at once; a store handle is released by Store.close()
or when the Store is garbage-collected.
"""

from __future__ import annotations

import atexit
import ctypes
import functools
import json
import os
import threading
import time
import weakref
from pathlib import Path
from typing import Any, Callable, Mapping, Optional

ABI_VERSION = 2
LIBRARY_NAME = "libchstate.so"
LIBRARY_ENV = "CHSTATE_LIBRARY"

class ChstateError(Exception):
    """An operation failed. `code` is an absl status code name (NOT_FOUND,
    ABORTED, UNAVAILABLE, ...), `message` the core's explanation."""

    def __init__(self, code: str, message: str):
        super().__init__(f"{message} [{code}]")
        self.code = code
        self.message = message


class LibraryNotFoundError(ChstateError):
    def __init__(self, message: str):
        super().__init__("FAILED_PRECONDITION", message)


def library_path() -> Path:
    packaged = Path(__file__).resolve().parent / LIBRARY_NAME
    if packaged.is_file():
        return packaged
    env = os.environ.get(LIBRARY_ENV)
    if env:
        path = Path(env)
        if path.is_file():
            return path
        raise LibraryNotFoundError(f"{LIBRARY_ENV} is {env!r}, which is not a file: build the library with "
                                   "`bazel build -c opt //hosts/python:libchstate.so` and point it at "
                                   "bazel-bin/hosts/python/libchstate.so")
    raise LibraryNotFoundError(
        f"the chstate native library was not found: it is not in {packaged.parent} and {LIBRARY_ENV} is not set. "
        "Install a wheel that ships it (hosts/python/build_wheel.sh), or build it with "
        f"`bazel build -c opt //hosts/python:libchstate.so` and set {LIBRARY_ENV} to its path")


@functools.lru_cache(maxsize=None)
def library() -> ctypes.CDLL:
    path = library_path()
    try:
        lib = ctypes.CDLL(str(path))
    except OSError as e:
        raise LibraryNotFoundError(f"could not load {path}: {e}") from None
    lib.chstate_abi_version.restype = ctypes.c_int32
    lib.chstate_abi_version.argtypes = []
    version = lib.chstate_abi_version()
    if version != ABI_VERSION:
        raise LibraryNotFoundError(f"{path} speaks ABI version {version}, this package needs {ABI_VERSION}: "
                                   "rebuild the library from the same checkout as the package")
    # Returned strings are c_void_p, not c_char_p: ctypes would copy a c_char_p
    # and lose the pointer that must be given back to chstate_string_free.
    lib.chstate_resolve_config.restype = ctypes.c_void_p
    lib.chstate_resolve_config.argtypes = [ctypes.c_char_p]
    lib.chstate_store_new.restype = ctypes.c_void_p
    lib.chstate_store_new.argtypes = [ctypes.c_char_p, ctypes.POINTER(ctypes.c_void_p)]
    lib.chstate_store_free.restype = None
    lib.chstate_store_free.argtypes = [ctypes.c_void_p]
    for name in ("chstate_op_start", "chstate_op_feed"):
        fn = getattr(lib, name)
        fn.restype = ctypes.c_void_p
        fn.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int64, ctypes.c_char_p, ctypes.c_size_t]
    lib.chstate_string_free.restype = None
    lib.chstate_string_free.argtypes = [ctypes.c_void_p]
    return lib


def _take(lib: ctypes.CDLL, ptr: Optional[int]) -> dict:
    """Copies a returned document into Python and frees the library's copy."""
    if not ptr:
        raise MemoryError("the chstate library ran out of memory")
    try:
        data = ctypes.string_at(ptr)
    finally:
        lib.chstate_string_free(ptr)
    return json.loads(data)


def _encode(doc: Mapping[str, Any]) -> bytes:
    return json.dumps(doc, ensure_ascii=True, separators=(",", ":")).encode("ascii")


def _failed(doc: dict) -> ChstateError:
    f = doc.get("failed") or {}
    return ChstateError(str(f.get("code", "UNKNOWN")), str(f.get("message", f"unexpected answer {doc!r}")))


def resolve_config(flags: Mapping[str, Any], env: Optional[Mapping[str, str]] = None) -> dict:
    """The core's connection settings: precedence, URI parsing, defaults.

    Returns host, port, hosts ([{"host", "port"}, ...], the first being
    host and port), secure, user, password, database, schema, table,
    ca_file, redacted_uri and origin. Raises ChstateError (INVALID_ARGUMENT)
    with a message that never contains the password.
    """
    lib = library()
    clean = {k: v for k, v in flags.items() if v is not None}
    out = _take(lib, lib.chstate_resolve_config(_encode({"flags": clean, "env": dict(env or {})})))
    if "config" not in out:
        raise _failed(out)
    return out["config"]


def id_hex(state_id: str) -> str:
    """State ids are str in Meltano; surrogate escapes carry bytes that are not UTF-8."""
    return state_id.encode("utf-8", "surrogateescape").hex()


def id_from_hex(hex_id: str) -> str:
    return bytes.fromhex(hex_id).decode("utf-8", "surrogateescape")


Transport = Callable[[dict], dict]


class Store:
    """One chstate::Store and the loop that drives its operations.

    `transport(request) -> response` runs one {"sql", "url_params", "host",
    "port", "purpose", "idempotent", "timeout_ms"} request (at the host and
    port it names, when the store options gave "hosts") and returns the
    response document ({"transport_ok", "http_status",
    "exception_code_header", "body_hex"} or a transport failure). Operations
    run one at a time (a lock serialises threads).
    """

    def __init__(self, options: Mapping[str, Any], transport: Transport, *,
                 clock_ns: Callable[[], int] = time.monotonic_ns,
                 random_bytes: Callable[[int], bytes] = os.urandom,
                 sleep: Callable[[float], None] = time.sleep,
                 background_ticks: bool = False):
        self._lib = library()
        self._transport = transport
        self._clock_ns = clock_ns
        self._random = random_bytes
        self._sleep = sleep
        self._mutex = threading.Lock()
        # When the core next wants a tick (a held lock's renewal), on the
        # clock below; from the last "done" document.
        self._next_tick_ms: Optional[int] = None
        err = ctypes.c_void_p()
        handle = self._lib.chstate_store_new(_encode(options), ctypes.byref(err))
        if not handle:
            raise _failed(_take(self._lib, err.value)) if err.value else MemoryError("chstate_store_new failed")
        # The handle lives in a box the finalizer empties, so that no call
        # reaches a freed store, whoever frees it (close, GC, exit).
        self._box: dict = {"handle": handle}
        # Freed under the mutex: the background ticker may be inside a call.
        self._finalizer = weakref.finalize(self, _free_store, self._lib, self._box, self._mutex)
        # background_ticks: a thread calls the core back at next_timeout_ms
        # even while the caller is idle (renewals of held locks, the release
        # of a lingering one: the store option linger_locks needs it), and
        # lingering locks are released when the store closes or the process
        # exits.
        self._tick_changed = threading.Event()
        if background_ticks:
            ref = weakref.ref(self)
            threading.Thread(target=_tick_in_background, args=(ref, self._tick_changed),
                             name="chstate-ticks", daemon=True).start()
            _BACKGROUND.add(self)
            _release_at_exit()

    def close(self) -> None:
        if self in _BACKGROUND:
            _BACKGROUND.discard(self)
            self.release_lingering()
        _KEPT.discard(self)
        self._finalizer()  # takes the mutex
        self._tick_changed.set()  # the ticker sees the store closed and ends

    def release_lingering(self) -> None:
        """Releases the locks the core keeps lingering (linger_locks), best
        effort: one that cannot be released expires after its validity."""
        if self._next_tick_ms is None:
            return  # no lock held or lingering
        try:
            self.run({"op": "release_lingering"})
        except (ChstateError, OSError):
            pass

    def _tick_due(self) -> bool:
        """The core's timer has passed (from the last "done" document)."""
        return self._next_tick_ms is not None and self._clock_ns() // 1_000_000 >= self._next_tick_ms

    def _tick_if_due(self) -> None:
        """The ticker's call: a tick when one is due and no op runs (an op
        that runs ticks first anyway)."""
        if not self._mutex.acquire(blocking=False):
            return
        try:
            if self._box["handle"] is not None and self._tick_due():
                try:
                    self._drive({"op": "tick"})
                except ChstateError:
                    pass  # a lock found lost: the next op on it says so
        finally:
            self._mutex.release()

    def _call(self, fn, doc: Mapping[str, Any]) -> dict:
        now_ms = self._clock_ns() // 1_000_000
        random = self._random(32)
        return _take(self._lib, fn(self._box["handle"], _encode(doc), now_ms, random, len(random)))

    def run(self, op: Mapping[str, Any]) -> dict:
        """Runs one operation to its end; returns its "done" document or
        raises ChstateError. When the core's timer is due (a held lock needs
        renewing), a tick runs first; a lock found lost raises (ABORTED)."""
        with self._mutex:
            if self._box["handle"] is None:
                raise ChstateError("FAILED_PRECONDITION", "the store was closed")
            if self._tick_due():
                self._drive({"op": "tick"})
            return self._drive(op)

    def _drive(self, op: Mapping[str, Any]) -> dict:
        action = self._call(self._lib.chstate_op_start, op)
        while True:
            if "request" in action:
                # Sent once: whether a failed request goes again, and when,
                # is the core's decision (it answers with a wait).
                response = self._transport(action["request"])
                action = self._call(self._lib.chstate_op_feed, {"response": response})
            elif "wait_ms" in action:
                self._sleep(max(0, int(action["wait_ms"])) / 1000.0)
                action = self._call(self._lib.chstate_op_feed, {"timer": True})
            elif "done" in action:
                self._next_tick_ms = action["done"].get("next_timeout_ms")
                if self in _BACKGROUND:
                    # Kept alive while the core holds a lock for it (held or
                    # lingering), so that its owner being garbage-collected
                    # (Meltano drops backend objects) does not strand the
                    # lock: the ticker releases it, then lets the store go.
                    (_KEPT.add if self._next_tick_ms is not None else _KEPT.discard)(self)
                self._tick_changed.set()
                return action["done"]
            else:
                # A failed op leaves the timer as it was: a tick that could
                # not renew is tried again before the next op.
                raise _failed(action)


def _free_store(lib: ctypes.CDLL, box: dict, mutex: threading.Lock) -> None:
    with mutex:
        handle, box["handle"] = box["handle"], None
        if handle:
            lib.chstate_store_free(handle)


# Stores whose lingering locks are released at exit (background_ticks), and
# those of them that hold or keep a lock now (strong references).
_BACKGROUND: "weakref.WeakSet[Store]" = weakref.WeakSet()
_KEPT: set = set()


def _tick_in_background(ref: "weakref.ref[Store]", changed: threading.Event) -> None:
    while True:
        store = ref()
        if store is None or store._box["handle"] is None:
            return
        due = store._next_tick_ms
        wait = None if due is None else max(0.0, (due - store._clock_ns() // 1_000_000) / 1000.0)
        del store  # the thread keeps no store alive
        changed.wait(timeout=60.0 if wait is None else wait)
        changed.clear()
        store = ref()
        if store is None:
            return
        store._tick_if_due()
        if store._tick_due():
            time.sleep(0.01)  # an op was running: try again shortly
        del store


def _release_lingering_at_exit() -> None:
    for store in list(_BACKGROUND):
        store.release_lingering()


_exit_hook: list = []


def _release_at_exit() -> None:
    """Registers the exit hook once, after weakref.finalize's own (atexit runs
    hooks last-in first-out: this one runs while the stores still exist)."""
    if not _exit_hook:
        _exit_hook.append(True)
        atexit.register(_release_lingering_at_exit)
