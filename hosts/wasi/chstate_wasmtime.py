"""A Python host for the chstate WebAssembly module, on wasmtime (PyPI).

The module (hosts/wasi/module.cc) imports nothing: it is instantiated with an
empty WASI context (no arguments, environment or directories), given the
clock and random bytes with each call, and asks this host to run its SQL.
`WasmtimeCore` (chstate_meltano/_wasm.py, which the Meltano adapter also runs
where it has no native library) is the module's calls; the Python binding of chstate's verbs
(chstate_meltano.binding: the pump, the idle timer, the methods made from the
core's verb table) does the rest, as for the native library and Extism.

    import chstate_wasmtime as chstate
    store = chstate.open("clickhouse://meltano@127.0.0.1:8123/default", password="...")
    store.set("dev:tap", {"singer_state": {"bookmarks": {}}})
    print(store.get("dev:tap")["merged"])
    store.close()

What the store tells beside its results (docs/diagnostics.md) is logged under
the `chstate_wasmtime` logger, each event at its level, as the Meltano adapter
does: configure Python logging (`logging.basicConfig(level=logging.INFO)`) to
see why a run waits.
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path
from typing import Any, Callable, Mapping, Optional

import wasmtime  # noqa: F401 - a clear ImportError here when wasmtime is missing

try:
    from chstate_meltano.binding import ChstateError, Core, Store, failed, id_from_hex, id_hex  # noqa: F401
except ImportError:  # in a checkout: the binding beside this folder
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "python"))
    from chstate_meltano.binding import ChstateError, Core, Store, failed, id_from_hex, id_hex  # noqa: F401
# The module's calls and the binding's Core for them live in the adapter's
# package (which runs them where no native library is there for the platform).
from chstate_meltano._wasm import OUT_BLOCK, ChstateModule, WasmtimeCore  # noqa: E402,F401

# Where open() looks when given no module: beside this file, else a checkout's
# build output (bazel build --config=wasi //hosts/wasi:chstate.wasm).
DEFAULT_WASM = Path(__file__).resolve().parent / "chstate.wasm"


# Where the store's events go unless open() is given another logger.
logger = logging.getLogger("chstate_wasmtime")


def open(uri: Optional[str] = None, *, wasm: str | os.PathLike | None = None, transport: Any = None,
         env: Optional[Mapping[str, str]] = None, logger: Optional[logging.Logger] = logger,
         on_event: Optional[Callable[[dict], None]] = None, diagnostics: Optional[str] = None,
         show_states: bool = False, **settings: Any) -> Store:  # noqa: A001 - chstate.open
    """Opens a store in one call: the module at `wasm` (default: chstate.wasm
    beside this file), the settings by the core's names (uri, password,
    lock_timeout_seconds, ...), resolved by the core with `env` (default:
    this process's MELTANO_STATE_BACKEND_* and CLICKHOUSE_* variables).
    The store's events go to `logger` (default: the `chstate_wasmtime`
    logger; the core is asked for the level it is enabled for) and
    `on_event`; `diagnostics` and `show_states` as for the binding's Store."""
    path = Path(wasm) if wasm is not None else DEFAULT_WASM
    if not path.is_file():
        raise ChstateError("NOT_FOUND", f"no chstate.wasm at {path}: pass wasm=PATH (in a checkout: bazel build "
                           "--config=wasi //hosts/wasi:chstate.wasm)")
    return Store(WasmtimeCore(ChstateModule(path)), {"uri": uri, **settings}, transport=transport, env=env,
                 logger=logger, on_event=on_event, diagnostics=diagnostics, show_states=show_states)
