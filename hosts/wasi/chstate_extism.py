"""A host for chstate_extism.wasm with Extism's Python SDK: the pump every
chstate host is. It sends the request the plugin's core asks for, sleeps for
its waits, and passes the clock and fresh random bytes with every call;
retries, renewals and defaults are the core's.

    import extism
    from chstate_extism import ExtismChstate
    from chstate_wasmtime import HttpTransport, store_options   # or any callable: request -> response document

    chstate = ExtismChstate(extism.Plugin(open("chstate_extism.wasm", "rb").read(), wasi=True))
    cfg = chstate.resolve_config({"flags": {"uri": "clickhouse://meltano@127.0.0.1:8123/default"}})["config"]
    store = chstate.open_store(store_options(cfg), HttpTransport(cfg))   # requests carry "host" and "port"
    store.run({"op": "get", "state_id_hex": "dev:a".encode().hex()})   # the "done" document
"""

from __future__ import annotations

import json
import os
import time
from typing import Any, Callable, Mapping, Optional


class ChstateError(Exception):
    def __init__(self, code: str, message: str):
        super().__init__(f"{code}: {message}")
        self.code, self.message = code, message


class ExtismChstate:
    """The plugin's five exports, each a JSON document in and out."""

    def __init__(self, plugin: Any, clock_ms: Callable[[], int] = lambda: time.monotonic_ns() // 1_000_000):
        self.plugin, self.clock_ms = plugin, clock_ms

    def call(self, name: str, doc: Mapping[str, Any] | str) -> dict:
        text = doc if isinstance(doc, str) else json.dumps(doc)
        return json.loads(self.plugin.call(name, text.encode()))

    def resolve_config(self, sources: Mapping[str, Any]) -> dict:
        return self.call("resolve_config", sources)

    def step(self, name: str, handle: int, key: str, doc: Mapping[str, Any], now_ms: Optional[int] = None,
             random: Optional[bytes] = None) -> dict:
        return self.call(name, {"store": handle, "now_ms": self.clock_ms() if now_ms is None else now_ms,
                                "random_hex": (random or os.urandom(32)).hex(), key: doc})

    def open_store(self, options: Mapping[str, Any], transport: Callable[[dict], dict]) -> "ExtismStore":
        r = self.call("store_new", options)
        if "failed" in r:
            raise ChstateError(r["failed"]["code"], r["failed"]["message"])
        return ExtismStore(self, r["store"], transport)


class ExtismStore:
    """One store in the plugin instance; run() drives one operation to its end."""

    def __init__(self, chstate: ExtismChstate, handle: int, transport: Callable[[dict], dict]):
        self.chstate, self.handle, self.transport = chstate, handle, transport

    def run(self, op: Mapping[str, Any]) -> dict:
        action = self.chstate.step("op_start", self.handle, "op", op)
        while True:
            if "request" in action:
                answer = {"response": self.transport(action["request"])}
            elif "wait_ms" in action:
                time.sleep(max(0, int(action["wait_ms"])) / 1000)
                answer = {"timer": True}
            elif "done" in action:
                return action["done"]
            else:
                raise ChstateError(action["failed"]["code"], action["failed"]["message"])
            action = self.chstate.step("op_feed", self.handle, "answer", answer)

    def close(self) -> None:
        if self.handle is not None:
            self.chstate.call("store_free", {"store": self.handle})
        self.handle = None
