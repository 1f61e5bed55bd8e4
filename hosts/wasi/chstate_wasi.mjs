// A Node host for the chstate WebAssembly module (hosts/wasi/module.cc): loads
// the module under node:wasi with no arguments, environment or directories,
// runs the SQL it asks for over HTTP(S), and passes it the clock and random
// bytes. The verbs, the pump and the idle timer are the shared JS binding
// (chstate_binding.mjs), as for the Extism plugin.
//
//   import * as chstate from "chstate-wasi";
//   const store = await chstate.open("clickhouse://default@127.0.0.1:8123/meltano", { password: "..." });
//   await store.set("dev:tap-x", { singer_state: { bookmarks: {} } });
//   console.log((await store.get("dev:tap-x")).merged);
//   await store.close();
//
// The lower-level pieces stay available: loadChstate(path) gives the module,
// WasiCore(module) its calls as a core, httpTransport(connection) the
// transport, openStore(core, settings, {transport}) the binding's store.
import fs from "node:fs";
import http from "node:http";
import https from "node:https";
import { webcrypto } from "node:crypto";
import { performance } from "node:perf_hooks";
import { fileURLToPath } from "node:url";
import { WASI } from "node:wasi";
import { ChstateError, Store, failed, hex, openStore, unhex } from "./chstate_binding.mjs";

export { ChstateError, Store, hex, openStore, unhex };

const enc = new TextEncoder();
const dec = new TextDecoder("utf-8", { fatal: true });

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

  resolveSettings(settings) {
    const [p, n] = this.input(enc.encode(JSON.stringify(settings)));
    return JSON.parse(this.output((o, c) => this.x.chstate_resolve_settings(p, n, o, c)));
  }

  verbs() {
    return JSON.parse(this.output((o, c) => this.x.chstate_verbs(o, c))).verbs;
  }

  // Raw store calls (tests drive these directly).
  storeNew(optionsText) {
    const [p, n] = this.input(enc.encode(optionsText));
    return JSON.parse(this.output((o, c) => this.x.chstate_store_new(p, n, o, c)));
  }

  step(fn, handle, docText, nowMs = BigInt(Math.floor(performance.now())), random = null) {
    const [p, n] = this.input(enc.encode(docText));
    let rp, rn;
    if (random) [rp, rn] = this.input(random, "random_in");
    else [rp, rn] = this.fillRandom();
    return JSON.parse(this.output((o, c) => this.x[fn](handle, p, n, nowMs, rp, rn, o, c)));
  }
}

// The module's calls as the binding's core.
export class WasiCore {
  constructor(mod) {
    this.mod = mod;
    this.settings = new Map();
  }

  verbs() { return this.mod.verbs(); }

  storeNew(settings) {
    const r = this.mod.storeNew(JSON.stringify(settings));
    if (r.failed) throw failed(r);
    this.settings.set(r.store, r.settings);
    return r.store;
  }

  storeSettings(handle) { return this.settings.get(handle); }

  start(handle, text, nowMs, random) { return this.mod.step("chstate_op_start", handle, text, BigInt(nowMs), random); }

  feed(handle, text, nowMs, random) { return this.mod.step("chstate_op_feed", handle, text, BigInt(nowMs), random); }

  storeFree(handle) {
    this.mod.x.chstate_store_free(handle);
    this.settings.delete(handle);
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

// The HTTP(S) transport for a resolved connection (the "connection" of the
// settings a store was opened with): one POST per request to the host and
// port the request names (the core picks one of the connection's hosts;
// config.host and config.port when it names none), over keep-alive
// connections kept per host:port (the agent's pools), credentials in headers
// (never in the URL), the answer as the core wants it.
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
      // The core gives every request its timeout_ms; a direct call of this
      // public transport without one waits as long as a connect may.
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

// Opens a store in one call: the module (the packaged chstate.wasm, or
// `options.wasm`), the settings by the core's names (uri, password,
// lock_timeout_seconds, ...; any key of `options` but wasm, transport, env,
// onEvent, diagnostics and showStates), resolved by the core with
// `options.env` (default: this process's MELTANO_STATE_BACKEND_* and
// CLICKHOUSE_* variables). `options.onEvent(event)` gets what the store
// tells (a wait for a lock, a resend, ...: docs/diagnostics.md) at the level
// `options.diagnostics` ("info" by default with onEvent).
export async function open(uri, options = {}) {
  const { wasm, transport, env, onEvent, diagnostics, showStates, ...settings } = options;
  const mod = await loadChstate(wasm ?? defaultWasmUrl);
  return openStore(new WasiCore(mod), { uri, ...settings },
                   { transport, env, makeTransport: httpTransport, onEvent, diagnostics, showStates });
}
