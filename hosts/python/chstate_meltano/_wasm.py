"""The chstate core as its WebAssembly module (hosts/wasi/module.cc), on
wasmtime (PyPI): the binding's `Core` for it, beside the native library's
(_native.py).

The module imports nothing: it is instantiated with an empty WASI context
(no arguments, environment or directories), given the clock and random bytes
with each call, and asks its host to run its SQL. The same module runs in
Node, Extism and the `chstate_wasmtime` host (hosts/wasi); here it is what
the adapter runs where no native library is there for the platform
(_core.py chooses).
"""

from __future__ import annotations

import ctypes
import json
import os
import time
from typing import Any, Callable, Mapping, Optional

import wasmtime

from .binding import ChstateError, Core, failed

OUT_BLOCK = 64 * 1024


def _fast_call(store: wasmtime.Store, func: wasmtime.Func) -> Callable[..., Any]:
    """A caller for an export taking and returning only i32/i64.

    wasmtime's public Func.__call__ converts every argument through generic
    Val objects (about 20 us per call plus as much per argument in 50.0.1,
    more than the module's own work for a small op); this fills the raw
    argument array the C API takes instead. It uses the package's internal
    ctypes bindings, so it falls back to the public call if they change."""
    public = lambda *args: func(store, *args)  # noqa: E731
    try:
        from wasmtime import _ffi as ffi
        from wasmtime._func import enter_wasm
        ty = func.type(store)
        kinds = [ffi.WASMTIME_I32.value if str(t) == "i32" else ffi.WASMTIME_I64.value if str(t) == "i64" else None
                 for t in ty.params]
        results = list(ty.results)
        if None in kinds or len(results) > 1 or any(str(t) not in ("i32", "i64") for t in results):
            return public
        i32 = ffi.WASMTIME_I32.value
        n = len(kinds)
        ArgArray = ffi.wasmtime_val_t * max(n, 1)
        ResultArray = ffi.wasmtime_val_t * 1
        context = store._context
        raw_func = ctypes.byref(func._func)
        call_raw = ffi.wasmtime_func_call
    except Exception:  # a different wasmtime: the public path works everywhere
        return public

    def call(*args: int) -> Any:
        if len(args) != n:
            raise TypeError(f"expected {n} arguments, got {len(args)}")
        params = ArgArray()
        for i, (kind, value) in enumerate(zip(kinds, args)):
            params[i].kind = kind
            if kind == i32:
                if not -(1 << 31) <= value < (1 << 32):
                    raise OverflowError(f"argument {i} = {value} does not fit in an i32")
                params[i].of.i32 = value if value < (1 << 31) else value - (1 << 32)
            else:
                params[i].of.i64 = value
        out = ResultArray()
        with enter_wasm(store) as trap:
            error = call_raw(context(), raw_func, params, n, out, len(results), trap)
            if error:
                raise wasmtime.WasmtimeError._from_ptr(error)
        if not results:
            return None
        return out[0].of.i32 if out[0].kind == i32 else out[0].of.i64

    return call


class ChstateModule:
    """The module's exports as document-in, document-out calls."""

    def __init__(self, path: str | os.PathLike | None = None, *, engine: Optional[wasmtime.Engine] = None,
                 module: Optional[wasmtime.Module] = None):
        """Instantiates the module at `path`, or an already compiled `module`
        (compiling takes most of the start-up time; instances are cheap)."""
        self.engine = engine or wasmtime.Engine()
        self.module = module or wasmtime.Module.from_file(self.engine, str(path))
        self.store = wasmtime.Store(self.engine)
        self.store.set_wasi(wasmtime.WasiConfig())  # nothing: no args, env, files
        linker = wasmtime.Linker(self.engine)
        linker.define_wasi()
        self.instance = linker.instantiate(self.store, self.module)
        self.x = self.instance.exports(self.store)
        self.x["_initialize"](self.store)
        self.memory: wasmtime.Memory = self.x["memory"]
        self._blocks: dict[str, tuple[int, int]] = {}
        self._funcs: dict[str, Any] = {}
        self.last: Optional[bytes] = None  # the last raw output document

    def call(self, name: str, *args: Any) -> int:
        fn = self._funcs.get(name)
        if fn is None:
            fn = self._funcs[name] = _fast_call(self.store, self.x[name])
        return fn(*args)

    def alloc(self, size: int) -> int:
        return self.call("chstate_alloc", size)

    def free(self, ptr: int) -> int:
        return self.call("chstate_free", ptr)

    # Raw copies through the memory's address (Memory.read/write are much
    # slower); bounds are checked against the current size, which grows.
    def _address(self, ptr: int, length: int) -> int:
        if ptr < 0 or length < 0 or ptr + length > self.memory.data_len(self.store):
            raise ChstateError("INVALID_ARGUMENT", f"[{ptr}, {ptr + length}) is outside the module's memory")
        return ctypes.cast(self.memory.data_ptr(self.store), ctypes.c_void_p).value + ptr

    def write(self, ptr: int, data: bytes) -> None:
        ctypes.memmove(self._address(ptr, len(data)), data, len(data))

    def read(self, ptr: int, length: int) -> bytes:
        return ctypes.string_at(self._address(ptr, length), length)

    def block(self, name: str, size: int) -> int:
        """A host-owned block of at least `size` bytes under `name`, reused."""
        have = self._blocks.get(name)
        if have and have[1] >= size:
            return have[0]
        if have:
            self.free(have[0])
        size = max(size, 256)
        ptr = self.alloc(size)
        if ptr == 0:
            raise ChstateError("RESOURCE_EXHAUSTED", f"chstate_alloc({size}) failed")
        self._blocks[name] = (ptr, size)
        return ptr

    def put(self, data: bytes, name: str = "in") -> tuple[int, int]:
        if not data:
            return 0, 0
        ptr = self.block(name, len(data))
        self.write(ptr, data)
        return ptr, len(data)

    def output(self, call: Callable[[int, int], int]) -> bytes:
        """Runs call(out_ptr, out_cap): r > 0 written; r < 0 fetch -r bytes with chstate_last."""
        ptr = self.block("out", OUT_BLOCK)
        r = call(ptr, self._blocks["out"][1])
        if r < 0:
            ptr = self.block("out", -r)
            r = self.call("chstate_last", ptr, self._blocks["out"][1])
            if r < 0:
                raise ChstateError("INTERNAL", "chstate_last refused a large enough buffer")
        self.last = self.read(ptr, r)
        return self.last

    def random(self) -> tuple[int, int]:
        return self.put(os.urandom(32), "random")

    def settings_table(self) -> dict:
        return json.loads(self.output(lambda o, c: self.call("chstate_settings_table", o, c)))

    def resolve_settings(self, settings: Mapping[str, Any]) -> dict:
        p, n = self.put(json.dumps(settings).encode())
        return json.loads(self.output(lambda o, c: self.call("chstate_resolve_settings", p, n, o, c)))

    def store_new(self, settings_text: bytes) -> dict:
        p, n = self.put(settings_text)
        return json.loads(self.output(lambda o, c: self.call("chstate_store_new", p, n, o, c)))

    def step(self, fn: str, handle: int, doc: bytes, now_ms: Optional[int] = None,
             random: Optional[bytes] = None) -> dict:
        now_ms = time.monotonic_ns() // 1_000_000 if now_ms is None else now_ms
        p, n = self.put(doc)
        rp, rn = self.put(random if random is not None else os.urandom(32), "random")
        return json.loads(self.output(lambda o, c: self.call(fn, handle, p, n, now_ms, rp, rn, o, c)))


class WasmtimeCore(Core):
    """The module's calls as the binding's Core (one instance, its stores)."""

    def __init__(self, module: ChstateModule):
        self.mod = module
        self._settings: dict = {}

    def verbs(self) -> list:
        return json.loads(self.mod.output(lambda o, c: self.mod.call("chstate_verbs", o, c)))["verbs"]

    def store_new(self, settings: Mapping[str, Any]) -> Any:
        r = self.mod.store_new(json.dumps(settings).encode())
        if "failed" in r:
            raise failed(r)
        self._settings[r["store"]] = {"settings": r["settings"]}
        return r["store"]

    def store_settings(self, handle: Any) -> dict:
        return self._settings[handle]

    def start(self, handle: Any, doc: bytes, now_ms: int, random: bytes) -> dict:
        return self.mod.step("chstate_op_start", handle, doc, now_ms, random)

    def feed(self, handle: Any, doc: bytes, now_ms: int, random: bytes) -> dict:
        return self.mod.step("chstate_op_feed", handle, doc, now_ms, random)

    def store_free(self, handle: Any) -> None:
        self.mod.call("chstate_store_free", handle)
        self._settings.pop(handle, None)
