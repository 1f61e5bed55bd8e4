"""A Python host for the chstate WebAssembly module, on wasmtime (PyPI).

The module (hosts/wasi/module.cc) imports nothing: it is instantiated with an
empty WASI context (no arguments, environment or directories), given the
clock and random bytes with each call, and asks this host to run its SQL,
which `HttpTransport` does with http.client.

    mod = ChstateModule("bazel-bin/hosts/wasi/chstate.wasm")
    config = mod.resolve_config({"flags": {"uri": "clickhouse://default@127.0.0.1:8123/default"}})["config"]
    store = mod.open_store(store_options(config), HttpTransport(config))
    store.set("dev:tap", {"completed": {"bookmarks": {}}, "partial": {}})
    print(store.get("dev:tap"))
    store.close()
"""

from __future__ import annotations

import ctypes
import http.client
import json
import os
import ssl
import time
from typing import Any, Callable, Mapping, Optional
from urllib.parse import quote

import wasmtime

OUT_BLOCK = 64 * 1024


class ChstateError(Exception):
    def __init__(self, code: str, message: str):
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message


def id_hex(state_id: str) -> str:
    return state_id.encode("utf-8", "surrogateescape").hex()


def id_from_hex(h: str) -> str:
    return bytes.fromhex(h).decode("utf-8", "surrogateescape")


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

    def resolve_config(self, sources: Mapping[str, Any]) -> dict:
        p, n = self.put(json.dumps(sources).encode())
        return json.loads(self.output(lambda o, c: self.call("chstate_resolve_config", p, n, o, c)))

    def store_new(self, options_text: bytes) -> dict:
        p, n = self.put(options_text)
        return json.loads(self.output(lambda o, c: self.call("chstate_store_new", p, n, o, c)))

    def step(self, fn: str, handle: int, doc: bytes, now_ms: Optional[int] = None) -> dict:
        now_ms = time.monotonic_ns() // 1_000_000 if now_ms is None else now_ms
        p, n = self.put(doc)
        rp, rn = self.random()
        return json.loads(self.output(lambda o, c: self.call(fn, handle, p, n, now_ms, rp, rn, o, c)))

    def open_store(self, options: Mapping[str, Any], transport: Callable[[dict], dict]) -> "Store":
        r = self.store_new(json.dumps(options).encode())
        if "failed" in r:
            raise ChstateError(r["failed"]["code"], r["failed"]["message"])
        return Store(self, r["store"], transport)


def store_options(config: Mapping[str, Any], **extra: Any) -> dict:
    """The store options a resolved config implies: schema, table, the cluster
    settings when a cluster is named, and every host of the connection (the
    core picks one for each request); `extra` adds or overrides options."""
    options: dict = {"schema": config["schema"], "table": config["table"]}
    if config.get("cluster"):
        options.update({k: config[k] for k in ("cluster", "zookeeper_path", "replica", "quorum")})
    if config.get("hosts"):
        options["hosts"] = [{"host": h["host"], "port": h["port"]} for h in config["hosts"]]
    return {**options, **extra}


def _shown(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


class HttpTransport:
    """POSTs each request to ClickHouse, at the request's "host" and "port"
    (the core picks one of the store's hosts), else at config's; a new
    connection per request; credentials in headers only."""

    def __init__(self, config: Mapping[str, Any]):
        self.host, self.port, self.secure = str(config["host"]), int(config["port"]), bool(config.get("secure"))
        self.ca_file = config.get("ca_file") or None
        self.connect_timeout = int(config["connect_timeout_ms"]) / 1000  # the core's default
        self.headers = {"X-ClickHouse-User": str(config["user"]), "Content-Type": "text/plain; charset=UTF-8"}
        if config.get("password"):
            self.headers["X-ClickHouse-Key"] = str(config["password"])
        self.base = "/?database=" + quote(str(config["database"]), safe="")

    def __repr__(self) -> str:  # never the password
        return f"HttpTransport({self.host}:{self.port})"

    def __call__(self, request: Mapping[str, Any]) -> dict:
        host, port = str(request.get("host") or self.host), int(request.get("port") or self.port)
        path = self.base + "".join(f"&{quote(str(k), safe='')}={quote(str(v), safe='')}"
                                   for k, v in request.get("url_params", []))
        if self.secure:
            ctx = ssl.create_default_context(cafile=self.ca_file)
            conn: http.client.HTTPConnection = http.client.HTTPSConnection(
                host, port, timeout=self.connect_timeout, context=ctx)
        else:
            conn = http.client.HTTPConnection(host, port, timeout=self.connect_timeout)
        try:
            try:
                conn.connect()
            except OSError as e:
                return {"transport_ok": False, "maybe_delivered": False,
                        "transport_error": f"cannot connect to {_shown(host, port)}: {e.strerror or e}"}
            try:
                if request.get("timeout_ms"):
                    conn.sock.settimeout(int(request["timeout_ms"]) / 1000)
                conn.request("POST", path, body=str(request["sql"]).encode(), headers=self.headers)
                res = conn.getresponse()
                body = res.read()
            except (OSError, http.client.HTTPException) as e:
                return {"transport_ok": False, "maybe_delivered": True,
                        "transport_error": f"no answer from {_shown(host, port)}: {e}"}
            return {"transport_ok": True, "http_status": res.status,
                    "exception_code_header": res.getheader("X-ClickHouse-Exception-Code") or "",
                    "body_hex": body.hex()}
        finally:
            conn.close()


class Store:
    """One store handle; each method drives one operation to its end."""

    def __init__(self, mod: ChstateModule, handle: int, transport: Callable[[dict], dict]):
        self.mod, self.handle, self.transport = mod, handle, transport

    def run(self, op: Mapping[str, Any]) -> dict:
        if self.handle is None:
            raise ChstateError("FAILED_PRECONDITION", "the store was closed")
        action = self.mod.step("chstate_op_start", self.handle, json.dumps(op).encode())
        while True:
            if "request" in action:
                request = action["request"]
                response = self.transport(request)  # once: resending is the core's decision
                action = self.mod.step("chstate_op_feed", self.handle, json.dumps({"response": response}).encode())
            elif "wait_ms" in action:
                time.sleep(max(0, int(action["wait_ms"])) / 1000)
                action = self.mod.step("chstate_op_feed", self.handle, b'{"timer":true}')
            elif "done" in action:
                return action["done"]
            else:
                raise ChstateError(action["failed"]["code"], action["failed"]["message"])

    def get(self, state_id: str) -> Optional[dict]:
        st = self.run({"op": "get", "state_id_hex": id_hex(state_id)})["state"]
        return None if st is None else {"completed": st["completed"], "partial": st["partial"]}

    def set(self, state_id: str, state: Mapping[str, Any]) -> None:
        self.run({"op": "set", "state_id_hex": id_hex(state_id), "state": state})

    def merge(self, state_id: str, partial: Mapping[str, Any]) -> None:
        """Merges `partial` into the id's partial state under its lock (Meltano's update())."""
        self.run({"op": "update", "state_id_hex": id_hex(state_id), "state": {"completed": {}, "partial": partial}})

    def list(self, pattern: Optional[str] = None) -> list[str]:
        op = {"op": "list", "pattern": None} if pattern is None else {"op": "list", "pattern_hex": id_hex(pattern)}
        return [id_from_hex(h) for h in self.run(op)["state_ids_hex"]]

    def delete(self, state_id: str) -> None:
        self.run({"op": "delete", "state_id_hex": id_hex(state_id)})

    def clear_all(self) -> int:
        return int(self.run({"op": "clear_all"})["count"])

    def history(self, state_id: str, limit: Optional[int] = None) -> list[dict]:
        """The versions kept in the state history, newest first: [{version, updated_at, current, state}, ...]."""
        op: dict = {"op": "history", "state_id_hex": id_hex(state_id)}
        if limit is not None:
            op["limit"] = limit
        return self.run(op)["versions"]

    def rollback(self, state_id: str, version: str) -> dict:
        """Restores a version (as history() names it) under the id's lock; returns the restored state."""
        st = self.run({"op": "rollback", "state_id_hex": id_hex(state_id), "version": version})["state"]
        return {"completed": st["completed"], "partial": st["partial"]}

    def locked(self, state_id: str) -> "_Lock":
        """`with store.locked(id) as lock: lock.set(state)`; released on exit, also on errors."""
        return _Lock(self, state_id)

    def close(self) -> None:
        if self.handle is not None:
            self.mod.call("chstate_store_free", self.handle)
        self.handle = None


class _Lock:
    def __init__(self, store: Store, state_id: str):
        self.store, self.state_id, self.lock_id = store, state_id, ""

    def __enter__(self) -> "_Lock":
        self.lock_id = self.store.run({"op": "acquire_lock", "state_id_hex": id_hex(self.state_id)})["lock_id"]
        return self

    def set(self, state: Mapping[str, Any]) -> None:
        self.store.set(self.state_id, state)

    def __exit__(self, *exc: Any) -> None:
        self.store.run({"op": "release_lock", "state_id_hex": id_hex(self.state_id), "lock_id": self.lock_id})
