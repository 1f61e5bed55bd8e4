"""A host for chstate_extism.wasm with Extism's Python SDK.

`ExtismCore` is the plugin's exports as the core's calls; the Python binding
of chstate's verbs (chstate_meltano.binding) is the rest, as for the native
library and wasmtime: it sends the request the core asks for, sleeps for its
waits, calls the core back at its timeout from a thread (a lock scope keeps
its lock while its block runs), and passes the clock and fresh random bytes.
Retries, renewals, settings and defaults are the core's.

    import chstate_extism as chstate
    store = chstate.open("clickhouse://meltano@127.0.0.1:8123/default", password="...")
    store.set("dev:tap", {"singer_state": {"bookmarks": {}}})
    store.close()

With a plugin of your own (Extism's manifest, allowed hosts, limits):
    store = chstate.Store(chstate.ExtismCore(extism.Plugin(wasm_bytes, wasi=True)), {"uri": ...})

What the store tells beside its results (docs/diagnostics.md) the plugin logs
as Extism plugins do, through the runtime's log functions: Extism's logger
shows it once configured (`extism.set_log_file("stderr", "info")`, or
`extism.set_log_custom(callback, "info")` and its `drain()`), at the level
`open(..., diagnostics="info")` asks the core for (none by default).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, Callable, Mapping, Optional

try:
    from chstate_meltano.binding import ChstateError, Core, Store, failed  # noqa: F401
except ImportError:  # in a checkout: the binding beside this folder
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "python"))
    from chstate_meltano.binding import ChstateError, Core, Store, failed  # noqa: F401

# Where open() looks when given no plugin: beside this file.
DEFAULT_WASM = Path(__file__).resolve().parent / "chstate_extism.wasm"


class ExtismCore(Core):
    """The plugin's exports (each a JSON document in and out) as the core's calls."""

    def __init__(self, plugin: Any):
        self.plugin = plugin
        self._settings: dict = {}

    def call(self, name: str, doc: Mapping[str, Any] | str | bytes) -> dict:
        data = doc if isinstance(doc, (str, bytes)) else json.dumps(doc)
        return json.loads(self.plugin.call(name, data if isinstance(data, bytes) else data.encode()))

    def verbs(self) -> list:
        return self.call("verbs", b"")["verbs"]

    def store_new(self, settings: Mapping[str, Any]) -> Any:
        r = self.call("store_new", settings)
        if "failed" in r:
            raise failed(r)
        self._settings[r["store"]] = {"settings": r["settings"]}
        return r["store"]

    def store_settings(self, handle: Any) -> dict:
        return self._settings[handle]

    def _step(self, name: str, key: str, handle: Any, doc: bytes, now_ms: int, random: bytes) -> dict:
        # The inner document goes in as it is (already JSON).
        text = (b'{"store":%d,"now_ms":%d,"random_hex":"%s","%s":' % (handle, now_ms, random.hex().encode(),
                                                                        key.encode())) + doc + b"}"
        return self.call(name, text)

    def start(self, handle: Any, doc: bytes, now_ms: int, random: bytes) -> dict:
        return self._step("op_start", "op", handle, doc, now_ms, random)

    def feed(self, handle: Any, doc: bytes, now_ms: int, random: bytes) -> dict:
        return self._step("op_feed", "answer", handle, doc, now_ms, random)

    def store_free(self, handle: Any) -> None:
        self.call("store_free", {"store": handle})
        self._settings.pop(handle, None)


def open(uri: Optional[str] = None, *, wasm: str | Path | None = None, transport: Any = None,  # noqa: A001
         env: Optional[Mapping[str, str]] = None, diagnostics: str = "none", show_states: bool = False,
         on_event: Optional[Callable[[dict], None]] = None, **settings: Any) -> Store:
    """Opens a store in one call: the plugin at `wasm` (default:
    chstate_extism.wasm beside this file) in Extism with WASI and no other
    authority, the settings by the core's names (uri, password,
    lock_timeout_seconds, ...), resolved by the core with `env` (default: this
    process's MELTANO_STATE_BACKEND_* and CLICKHOUSE_* variables).
    `diagnostics`: the level ("warning", "info", "debug") at which the plugin
    logs what the store tells through Extism's logger; `on_event(event)` also
    gets each event as a dict."""
    import extism

    path = Path(wasm) if wasm is not None else DEFAULT_WASM
    if not path.is_file():
        raise ChstateError("NOT_FOUND", f"no chstate_extism.wasm at {path}: pass wasm=PATH (in a checkout: "
                           "bazel build --config=wasi //hosts/wasi:chstate_extism.wasm)")
    plugin = extism.Plugin(path.read_bytes(), wasi=True)
    return Store(ExtismCore(plugin), {"uri": uri, **settings}, transport=transport, env=env,
                 diagnostics=diagnostics, show_states=show_states, on_event=on_event)
