// A Node host for the chstate WebAssembly module (hosts/wasi/module.cc): loads
// the module under node:wasi with no arguments, environment or files, runs
// the SQL it asks for over HTTP(S), and passes it the clock and random bytes.
// It is also the README's minimal example for plugin-runtime authors.
//
//   import { loadChstate, httpTransport, storeOptions } from "./chstate_wasi.mjs";
//   const chstate = await loadChstate("bazel-bin/hosts/wasi/chstate.wasm");  // npm package: loadChstate()
//   const { config } = chstate.resolveConfig({ flags: { uri: "clickhouse://default@127.0.0.1:8123/meltano" } });
//   const store = chstate.openStore(storeOptions(config), httpTransport(config));
//   await store.set("dev:tap-x", { completed: { bookmarks: {} }, partial: {} });
//   console.log(await store.get("dev:tap-x"));
//   store.close();
import fs from "node:fs";
import http from "node:http";
import https from "node:https";
import { webcrypto } from "node:crypto";
import { performance } from "node:perf_hooks";
import { fileURLToPath } from "node:url";
import { WASI } from "node:wasi";

const enc = new TextEncoder();
const dec = new TextDecoder("utf-8", { fatal: true });

export class ChstateError extends Error {
  constructor(code, message) {
    super(`${code}: ${message}`);
    this.code = code;
    this.detail = message;
  }
}

export const hex = (s) => Buffer.from(s, "utf8").toString("hex");
export const unhex = (h) => Buffer.from(h, "hex").toString("utf8");

// The module's exports behind document-in, document-out calls. Every
// document is copied into a block the host owns (chstate_alloc) and the
// answer is copied out of another; both blocks are kept and grown as needed.
export class ChstateModule {
  constructor(instance) {
    this.x = instance.exports;
    this.blocks = {};
    this.random = this.#block("random", 32);
    this.last = null;  // the last raw output document (tests compare it)
  }

  // A host-owned block of at least `size` bytes under `name`, reused.
  #block(name, size) {
    const b = this.blocks[name];
    if (b && b.size >= size) return b.ptr;
    if (b) this.x.chstate_free(b.ptr);
    const want = Math.max(size, 256);
    const ptr = this.x.chstate_alloc(want);
    if (ptr === 0) throw new ChstateError("RESOURCE_EXHAUSTED", `chstate_alloc(${want}) failed`);
    this.blocks[name] = { ptr, size: want };
    return ptr;
  }

  #bytes() {
    return new Uint8Array(this.x.memory.buffer);  // memory may have grown: fresh view each time
  }

  // Writes `data` (bytes) to the input block; returns [ptr, len].
  input(data, name = "in") {
    if (data.length === 0) return [0, 0];
    const ptr = this.#block(name, data.length);
    this.#bytes().set(data, ptr);
    return [ptr, data.length];
  }

  // Runs `call(outPtr, outCap)` and reads its document by the module's
  // convention: r > 0 written, r < 0 too small (fetch -r bytes from chstate_last).
  output(call) {
    if (!this.blocks.out) this.#block("out", 64 * 1024);
    const out = this.blocks.out;
    let r = call(out.ptr, out.size);
    if (r < 0) {
      const ptr = this.#block("out", -r);
      r = this.x.chstate_last(ptr, this.blocks.out.size);
      if (r < 0) throw new ChstateError("INTERNAL", "chstate_last refused a large enough buffer");
    }
    const text = dec.decode(this.#bytes().slice(this.blocks.out.ptr, this.blocks.out.ptr + r));
    this.last = text;
    return text;
  }

  fillRandom() {
    webcrypto.getRandomValues(new Uint8Array(this.x.memory.buffer, this.random, 32));
    return [this.random, 32];
  }

  resolveConfig(sources) {
    const [p, n] = this.input(enc.encode(JSON.stringify(sources)));
    return JSON.parse(this.output((o, c) => this.x.chstate_resolve_config(p, n, o, c)));
  }

  // Raw store calls (tests drive these directly).
  storeNew(optionsText) {
    const [p, n] = this.input(enc.encode(optionsText));
    return JSON.parse(this.output((o, c) => this.x.chstate_store_new(p, n, o, c)));
  }

  step(fn, handle, docText, nowMs = BigInt(Math.floor(performance.now()))) {
    const [p, n] = this.input(enc.encode(docText));
    const [rp, rn] = this.fillRandom();
    return JSON.parse(this.output((o, c) => this.x[fn](handle, p, n, nowMs, rp, rn, o, c)));
  }

  openStore(options, transport) {
    const r = this.storeNew(JSON.stringify(options ?? {}));
    if (r.failed) throw new ChstateError(r.failed.code, r.failed.message);
    return new Store(this, r.store, transport);
  }
}

// Where loadChstate() looks when given no path: chstate.wasm beside this file,
// which is where the npm package (hosts/wasi/pack.sh) puts it.
export const defaultWasmUrl = new URL("./chstate.wasm", import.meta.url);

// Loads and initialises the module (a WASI reactor). It imports nothing;
// node:wasi is given no arguments, environment or directories anyway, so the
// module runs with no authority even if a later build imported something.
export async function loadChstate(path = defaultWasmUrl) {
  let bytes;
  try {
    bytes = fs.readFileSync(path);
  } catch (e) {
    if (path !== defaultWasmUrl || e?.code !== "ENOENT") throw e;
    throw new ChstateError("NOT_FOUND", `no chstate.wasm beside chstate_wasi.mjs (${fileURLToPath(defaultWasmUrl)}):`
      + " pass the module's path (in a checkout: bazel build --config=wasi //hosts/wasi:chstate.wasm),"
      + " or install the npm package (hosts/wasi/pack.sh)");
  }
  const wasi = new WASI({ version: "preview1", args: [], env: {}, preopens: {}, returnOnExit: true });
  const module = await WebAssembly.compile(bytes);
  // getImportObject() appeared in Node 19.8; before it, wasiImport is the same thing.
  const imports = wasi.getImportObject ? wasi.getImportObject() : { wasi_snapshot_preview1: wasi.wasiImport };
  const instance = await WebAssembly.instantiate(module, imports);
  wasi.initialize(instance);
  return new ChstateModule(instance);
}

// The store options a resolved config implies: where the state lives, cluster
// mode when a cluster is named, and every host of the connection (the core
// picks one for each request). `extra` adds or overrides options
// (lock_timeout_ms, history_days, ...).
export function storeOptions(config, extra = {}) {
  const options = { schema: config.schema, table: config.table };
  if (config.cluster) {
    Object.assign(options, { cluster: config.cluster, zookeeper_path: config.zookeeper_path, replica: config.replica,
                             quorum: config.quorum });
  }
  if (Array.isArray(config.hosts) && config.hosts.length > 0) {
    options.hosts = config.hosts.map(({ host, port }) => ({ host, port }));
  }
  return { ...options, ...extra };
}

// The HTTP(S) transport: one POST per request to the host and port the
// request names (the core picks one of the connection's hosts; config.host
// and config.port when it names none), over keep-alive connections kept per
// host:port (the agent's pools), credentials in headers (never in the URL),
// the answer as the core wants it.
// TLS verification is always on; config.ca_file (when set) is the trust
// anchor. Each request is given its own timeout_ms. Failures without an
// answer come back as transport_ok=false; "maybe_delivered" is false only
// when no connection was made (refused, unreachable, TLS failure), so the
// request never left. A failed request is not sent again here: the core
// decides that.
export function httpTransport(config) {
  const secure = Boolean(config.secure);
  const shownAt = (host, port) => `${host.includes(":") ? `[${host}]` : host}:${port}`;
  const base = `/?database=${encodeURIComponent(config.database)}`;
  const headers = { "X-ClickHouse-User": config.user, "Content-Type": "text/plain; charset=UTF-8" };
  if (config.password) headers["X-ClickHouse-Key"] = config.password;
  const connectTimeoutMs = Number(config.connect_timeout_ms);
  // maxSockets is per host:port: one keep-alive connection to each server.
  const agentOptions = { keepAlive: true, maxSockets: 1 };
  if (secure) {
    agentOptions.rejectUnauthorized = true;
    if (config.ca_file) agentOptions.ca = fs.readFileSync(config.ca_file);
  }
  const agent = secure ? new https.Agent(agentOptions) : new http.Agent(agentOptions);
  const transport = (request) =>
    new Promise((resolve) => {
      const host = request.host ?? config.host;
      const port = request.port ?? config.port;
      const path = base + request.url_params.map(([k, v]) => `&${encodeURIComponent(k)}=${encodeURIComponent(v)}`).join("");
      const body = Buffer.from(request.sql, "utf8");
      let connected = false;
      let settled = false;
      const fail = (e) => {
        if (settled) return;
        settled = true;
        req.destroy();
        resolve({
          transport_ok: false,
          maybe_delivered: connected,
          transport_error: `${e?.code ?? e?.name ?? "error"}: ${e?.message ?? e} (${shownAt(host, port)}); check that ClickHouse is running there and that host, port and secure are right`,
        });
      };
      const req = (secure ? https : http).request(
        { host, port, path, method: "POST", agent, setHost: true,
          headers: { ...headers, "Content-Length": body.length } },
        (res) => {
          const chunks = [];
          res.on("data", (c) => chunks.push(c));
          res.on("error", fail);
          res.on("end", () => {
            if (settled) return;
            settled = true;
            clearTimeout(timer);
            resolve({
              transport_ok: true,
              http_status: res.statusCode,
              exception_code_header: res.headers["x-clickhouse-exception-code"] ?? "",
              body_hex: Buffer.concat(chunks).toString("hex"),
            });
          });
        });
      const timeoutMs = Number(request.timeout_ms) > 0 ? Number(request.timeout_ms) : connectTimeoutMs;
      const timer = setTimeout(() => fail(Object.assign(new Error(`no answer within ${timeoutMs} ms`), { code: "ETIMEDOUT" })), timeoutMs);
      req.on("socket", (socket) => {
        // A reused keep-alive socket is connected already.
        const ready = () => { connected = true; };
        if (!socket.connecting) ready();
        else socket.once(secure ? "secureConnect" : "connect", ready);
        if (socket.connecting && connectTimeoutMs > 0) {
          socket.setTimeout(connectTimeoutMs, () => {
            if (!connected) fail(Object.assign(new Error(`connect timed out after ${connectTimeoutMs} ms`), { code: "ETIMEDOUT" }));
          });
          socket.once("connect", () => socket.setTimeout(0));
        }
      });
      req.on("error", (e) => { clearTimeout(timer); fail(e); });
      req.end(body);
    });
  transport.close = () => agent.destroy();
  return transport;
}

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

// One store handle driven to completion per operation; ops run one at a time.
export class Store {
  constructor(mod, handle, transport) {
    this.mod = mod;
    this.handle = handle;
    this.transport = transport;
    this.queue = Promise.resolve();
  }

  // Runs one op document to its end: the "done" document, or throws ChstateError.
  run(op) {
    const next = this.queue.then(() => this.#drive(op));
    this.queue = next.catch(() => {});
    return next;
  }

  async #drive(op) {
    if (this.handle === null) throw new ChstateError("FAILED_PRECONDITION", "the store was closed");
    let action = this.mod.step("chstate_op_start", this.handle, JSON.stringify(op));
    for (;;) {
      if (action.request) {
        // Sent once: whether a failed request goes again is the core's call.
        const response = await this.transport(action.request);
        action = this.mod.step("chstate_op_feed", this.handle, JSON.stringify({ response }));
      } else if (action.wait_ms !== undefined) {
        await sleep(action.wait_ms);
        action = this.mod.step("chstate_op_feed", this.handle, '{"timer":true}');
      } else if (action.done) {
        return action.done;
      } else {
        throw new ChstateError(action.failed.code, action.failed.message);
      }
    }
  }

  // The merged view is the caller's business; this returns both sides, or null.
  async get(id) {
    const done = await this.run({ op: "get", state_id_hex: hex(id) });
    return done.state && { completed: done.state.completed, partial: done.state.partial };
  }
  set(id, state) { return this.run({ op: "set", state_id_hex: hex(id), state }); }
  // Merges `partial` into the id's partial state under its lock (Meltano's update()).
  merge(id, partial) { return this.run({ op: "update", state_id_hex: hex(id), state: { completed: {}, partial } }); }
  async list(pattern = null) {
    const done = await this.run(pattern === null ? { op: "list", pattern: null } : { op: "list", pattern_hex: hex(pattern) });
    return done.state_ids_hex.map(unhex);
  }
  delete(id) { return this.run({ op: "delete", state_id_hex: hex(id) }); }
  async clearAll() { return (await this.run({ op: "clear_all" })).count; }
  // The versions kept in the state history, newest first: [{version, updated_at, current, state}, ...].
  async history(id, limit = null) {
    const op = { op: "history", state_id_hex: hex(id) };
    if (limit !== null) op.limit = limit;
    return (await this.run(op)).versions;
  }
  // Restores a version (as history() names it) under the id's lock; resolves to the restored state.
  async rollback(id, version) {
    const done = await this.run({ op: "rollback", state_id_hex: hex(id), version });
    return { completed: done.state.completed, partial: done.state.partial };
  }

  // Runs fn() while holding the id's lock; the lock is released afterwards,
  // also when fn throws. Inside, setLocked() writes within the lock's lease.
  async withLock(id, fn) {
    const { lock_id } = await this.run({ op: "acquire_lock", state_id_hex: hex(id) });
    try {
      return await fn({
        setLocked: (state) => this.run({ op: "set", state_id_hex: hex(id), state }),
        renew: () => this.run({ op: "renew_lock", state_id_hex: hex(id) }),
      });
    } finally {
      await this.run({ op: "release_lock", state_id_hex: hex(id), lock_id });
    }
  }

  close() {
    if (this.handle !== null) this.mod.x.chstate_store_free(this.handle);
    this.handle = null;
    this.transport.close?.();
  }
}
