"""The chstate core through its C ABI (hosts/common/chstate.h), with ctypes.

The library is sans-IO: it says which SQL to run and how long to wait. This
module is the `Core` of chstate_meltano.binding for it (the binding pumps it
and makes the verbs Python methods). Nothing here imports Meltano, so it can be
used and tested alone.

    from chstate_meltano import _native
    from chstate_meltano.binding import Store
    store = Store(_native.NativeCore(), {"uri": "clickhouse://me@db:8123/default"})
    print(store.get("dev:a"))

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

import ctypes
import functools
import json
import os
from pathlib import Path
from typing import Any, Mapping

from .binding import ChstateError, Core, failed, id_from_hex, id_hex  # noqa: F401 - re-exported

ABI_VERSION = 3
LIBRARY_NAME = "libchstate.so"
LIBRARY_ENV = "CHSTATE_LIBRARY"

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
    for name in ("chstate_verbs", "chstate_settings_table"):
        getattr(lib, name).restype = ctypes.c_void_p
        getattr(lib, name).argtypes = []
    lib.chstate_resolve_settings.restype = ctypes.c_void_p
    lib.chstate_resolve_settings.argtypes = [ctypes.c_char_p]
    lib.chstate_store_settings.restype = ctypes.c_void_p
    lib.chstate_store_settings.argtypes = [ctypes.c_void_p]
    lib.chstate_store_new.restype = ctypes.c_void_p
    lib.chstate_store_new.argtypes = [ctypes.c_char_p, ctypes.POINTER(ctypes.c_void_p)]
    lib.chstate_store_free.restype = None
    lib.chstate_store_free.argtypes = [ctypes.c_void_p]
    for name in ("chstate_op_start", "chstate_op_feed"):
        fn = getattr(lib, name)
        fn.restype = ctypes.c_void_p
        fn.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int64, ctypes.c_char_p, ctypes.c_size_t]
    for name in ("chstate_op_start_bytes", "chstate_op_feed_bytes"):
        fn = getattr(lib, name)
        fn.restype = ctypes.c_void_p
        fn.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_size_t, ctypes.c_int64,
                       ctypes.c_char_p, ctypes.c_size_t, ctypes.POINTER(ctypes.c_void_p),
                       ctypes.POINTER(ctypes.c_size_t)]
    lib.chstate_string_free.restype = None
    lib.chstate_string_free.argtypes = [ctypes.c_void_p]
    return lib


def _take(lib: ctypes.CDLL, ptr: "int | None") -> dict:
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


def resolve_settings(settings: Mapping[str, Any]) -> dict:
    """The core's resolution of a settings document ({"from", "values", "env",
    "host"}), without opening a store: {"connection", "store", "origin"}.
    Raises ChstateError (INVALID_ARGUMENT) with a message that never contains
    the password."""
    lib = library()
    out = _take(lib, lib.chstate_resolve_settings(_encode(settings)))
    if "settings" not in out:
        raise failed(out)
    return out["settings"]


def settings_table() -> dict:
    """The core's settings table: {"settings": [{"key", "type", "default", "meltano", "env", ...}], "renamed"}."""
    lib = library()
    return _take(lib, lib.chstate_settings_table())


class NativeCore(Core):
    """The core in this process: libchstate.so through ctypes."""

    def __init__(self) -> None:
        self._lib = library()

    def verbs(self) -> list:
        return _take(self._lib, self._lib.chstate_verbs())["verbs"]

    def store_new(self, settings: Mapping[str, Any]) -> Any:
        err = ctypes.c_void_p()
        handle = self._lib.chstate_store_new(_encode(settings), ctypes.byref(err))
        if not handle:
            raise failed(_take(self._lib, err.value)) if err.value else MemoryError("chstate_store_new failed")
        return handle

    def store_settings(self, handle: Any) -> dict:
        return _take(self._lib, self._lib.chstate_store_settings(handle))

    takes_bytes = True

    def start(self, handle: Any, doc: bytes, now_ms: int, random: bytes, data: "bytes | None" = None) -> dict:
        return self._call(self._lib.chstate_op_start_bytes, handle, doc, data, now_ms, random)

    def feed(self, handle: Any, doc: bytes, now_ms: int, random: bytes, data: "bytes | None" = None) -> dict:
        return self._call(self._lib.chstate_op_feed_bytes, handle, doc, data, now_ms, random)

    def _call(self, fn: Any, handle: Any, doc: bytes, data: "bytes | None", now_ms: int, random: bytes) -> dict:
        """The *_bytes call: `data` apart from the JSON, and an export page's
        document back apart (put into the action as the plain call has it)."""
        out = ctypes.c_void_p()
        size = ctypes.c_size_t()
        action = _take(self._lib, fn(handle, doc, data, 0 if data is None else len(data), now_ms, random, len(random),
                                     ctypes.byref(out), ctypes.byref(size)))
        if out.value:
            try:
                document = ctypes.string_at(out.value, size.value)
            finally:
                self._lib.chstate_string_free(out.value)
            done = action["done"]
            del done["document_bytes"]
            done["document"] = document.decode("utf-8", "surrogateescape")
        return action

    def store_free(self, handle: Any) -> None:
        self._lib.chstate_store_free(handle)
