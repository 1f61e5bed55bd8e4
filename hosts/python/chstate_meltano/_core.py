"""Which chstate core the adapter runs: the native library (_native.py), or
the same core as a WebAssembly module on wasmtime (_wasm.py).

$CHSTATE_CORE chooses:
  auto    (the default) the native library when there is one for this
          platform (the manylinux wheel ships it, or $CHSTATE_LIBRARY names
          it), else the WebAssembly module (the pure wheel, py3-none-any,
          ships it and depends on wasmtime);
  native  the native library, or an error saying how to get it;
  wasm    the WebAssembly module even where a native library is there.

Both are the same C++ core, so the settings, SQL, locks and results are the
same; the native one costs less per operation (docs/performance.md). The
module comes from chstate.wasm inside this package, else $CHSTATE_WASM.
Compiling it takes about a second; wasmtime's own compilation cache (under
the user's cache folder) makes later processes start in milliseconds.
"""

from __future__ import annotations

import functools
import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping

from .binding import ChstateError, Core, failed

CORE_ENV = "CHSTATE_CORE"
WASM_ENV = "CHSTATE_WASM"
WASM_NAME = "chstate.wasm"
KINDS = ("auto", "native", "wasm")


class CoreNotFoundError(ChstateError):
    def __init__(self, message: str):
        super().__init__("FAILED_PRECONDITION", message)


@dataclass(frozen=True)
class Choice:
    kind: str  # "native" or "wasm"
    where: str  # the library or module path (and the wasmtime version)
    why: str  # why this one: asked for, or the native library is not there
    make: Callable[[], Core]
    resolve_settings: Callable[[Mapping[str, Any]], dict]
    settings_table: Callable[[], dict]

    def describe(self) -> str:
        return f"the {self.kind} core ({self.where}; {self.why})"


def wasm_path() -> Path:
    packaged = Path(__file__).resolve().parent / WASM_NAME
    if packaged.is_file():
        return packaged
    env = os.environ.get(WASM_ENV)
    if env:
        if Path(env).is_file():
            return Path(env)
        raise CoreNotFoundError(f"{WASM_ENV} is {env!r}, which is not a file: point it at chstate.wasm "
                                "(bazel build --config=wasi //hosts/wasi:chstate.wasm)")
    raise CoreNotFoundError(f"chstate.wasm is not in {packaged.parent} and {WASM_ENV} is not set: install the "
                            "pure chstate-meltano wheel (py3-none-any), or set it to the module's path")


@functools.lru_cache(maxsize=None)
def _compiled(path: str) -> tuple:
    """(engine, module, wasmtime version) for the module at `path`, compiled once per process."""
    try:
        import wasmtime
    except ImportError:
        raise CoreNotFoundError("the WebAssembly core needs the wasmtime package: pip install wasmtime "
                                "(the pure chstate-meltano wheel depends on it)") from None
    config = wasmtime.Config()
    try:
        config.cache = True  # wasmtime's compilation cache: the next process skips the compile
    except Exception:  # no usable cache folder: compile every time
        pass
    engine = wasmtime.Engine(config)
    try:
        module = wasmtime.Module.from_file(engine, path)
    except Exception as e:
        raise CoreNotFoundError(f"could not compile {path}: {e}") from None
    try:
        from importlib.metadata import version
        installed = version("wasmtime")
    except Exception:  # not installed as a distribution (a checkout's path)
        installed = "(version unknown)"
    return engine, module, installed


def _wasm_choice(why: str) -> Choice:
    path = str(wasm_path())
    engine, module, version = _compiled(path)
    from ._wasm import ChstateModule, WasmtimeCore

    def make() -> Core:
        return WasmtimeCore(ChstateModule(engine=engine, module=module))

    # Settings are resolved by one instance of the module (a wasmtime store is
    # not for two threads at once).
    shared = ChstateModule(engine=engine, module=module)
    lock = threading.Lock()

    def resolve(settings: Mapping[str, Any]) -> dict:
        with lock:
            out = shared.resolve_settings(settings)
        if "settings" not in out:
            raise failed(out)
        return out["settings"]

    def table() -> dict:
        with lock:
            return shared.settings_table()

    where = f"{path} on wasmtime {version}"
    return Choice("wasm", where, why, make, resolve, table)


def _native_choice(why: str) -> Choice:
    from . import _native
    _native.library()  # raises LibraryNotFoundError, naming the fix
    return Choice("native", str(_native.library_path()), why, _native.NativeCore, _native.resolve_settings,
                  _native.settings_table)


@functools.lru_cache(maxsize=None)
def _choose(asked: str) -> Choice:
    if asked not in KINDS:
        raise CoreNotFoundError(f"{CORE_ENV} is {asked!r}: it is one of auto, native, wasm")
    if asked == "native":
        return _native_choice(f"{CORE_ENV}=native")
    if asked == "wasm":
        return _wasm_choice(f"{CORE_ENV}=wasm")
    from . import _native
    try:
        return _native_choice("a native library for this platform")
    except _native.LibraryNotFoundError as native_error:
        try:
            return _wasm_choice("no native library for this platform")
        except CoreNotFoundError as wasm_error:
            raise CoreNotFoundError(f"no chstate core to run. The native library: {native_error.message.rstrip('.')}. "
                                    f"The WebAssembly module: {wasm_error.message.rstrip('.')}") from None


def chosen() -> Choice:
    """The core $CHSTATE_CORE asks for (cached per value)."""
    return _choose((os.environ.get(CORE_ENV) or "auto").strip().lower())


def settings_table() -> dict:
    """The core's settings table (what the adapter registers with Meltano).
    It is the same for both cores, so where the core $CHSTATE_CORE forces is
    not there the other one answers: Meltano loads the settings for every
    command, and the backend itself then says what is missing when it is made."""
    try:
        return chosen().settings_table()
    except ChstateError:
        return _choose("auto").settings_table()
