// A host for chstate_extism.wasm with Extism's JavaScript SDK
// (@extism/extism). ExtismCore is the plugin's exports as the core's calls;
// the shared JS binding (chstate_binding.mjs) is the rest, as for node:wasi:
// it sends the request the core asks for, sleeps for its waits, calls the
// core back on the event loop at its timeout (a lock scope keeps its lock
// while its code runs), and passes the clock and fresh random bytes.
// Retries, renewals, settings and defaults are the core's.
//
//   import createPlugin from "@extism/extism";
//   import { open } from "chstate-wasi/extism";
//   const store = await open(createPlugin, "clickhouse://meltano@127.0.0.1:8123/default", { password: "..." });
//   await store.set("dev:a", { singer_state: {} });
//   await store.close();
import { fileURLToPath } from "node:url";
import { httpTransport } from "./chstate_wasi.mjs";
import { ChstateError, Store, failed, openStore } from "./chstate_binding.mjs";

export { ChstateError, Store };

export class ExtismCore {
  constructor(plugin) {
    this.plugin = plugin;
    this.settings = new Map();
  }

  async call(name, text) {
    const out = await this.plugin.call(name, text);
    return JSON.parse(out.text());
  }

  async verbs() { return (await this.call("verbs", "")).verbs; }

  async storeNew(settings) {
    const r = await this.call("store_new", JSON.stringify(settings));
    if (r.failed) throw failed(r);
    this.settings.set(r.store, r.settings);
    return r.store;
  }

  storeSettings(handle) { return this.settings.get(handle); }

  // The inner document goes in as it is (already JSON).
  #step(name, key, handle, text, nowMs, random) {
    const randomHex = Buffer.from(random).toString("hex");
    return this.call(name, `{"store":${handle},"now_ms":${nowMs},"random_hex":"${randomHex}","${key}":${text}}`);
  }

  start(handle, text, nowMs, random) { return this.#step("op_start", "op", handle, text, nowMs, random); }

  feed(handle, text, nowMs, random) { return this.#step("op_feed", "answer", handle, text, nowMs, random); }

  async storeFree(handle) {
    await this.call("store_free", JSON.stringify({ store: handle }));
    this.settings.delete(handle);
  }
}

// Opens a store in one call: the plugin (chstate_extism.wasm beside this
// file, or `options.wasm`) made by the caller's SDK (`createPlugin` of
// @extism/extism) with WASI and no other authority, the settings by the
// core's names (any key of `options` but wasm, transport, env, logger,
// diagnostics, onEvent and showStates).
//
// What the store tells (docs/diagnostics.md) the plugin logs as Extism
// plugins do, through the SDK's logger: `options.logger` (a Console: info,
// debug, warn, error) is given to createPlugin, and the core is asked for
// `options.diagnostics` ("info" by default when a logger is given, else
// "none"). `options.onEvent(event)` gets each event as an object as well.
export async function open(createPlugin, uri, options = {}) {
  const { wasm, transport, env, logger, diagnostics, onEvent, showStates, ...settings } = options;
  const level = diagnostics ?? (logger || onEvent ? "info" : "none");
  const pluginOptions = { useWasi: true };
  if (logger) pluginOptions.logger = logger;
  // SDKs from 2.0 also filter by a level of their own (silent by default).
  if (level !== "none") pluginOptions.logLevel = level === "warning" ? "warn" : level;
  // fileURLToPath, not the URL's pathname: that keeps %20 and the like escaped.
  const plugin = await createPlugin(wasm ?? fileURLToPath(new URL("./chstate_extism.wasm", import.meta.url)),
                                    pluginOptions);
  return openStore(new ExtismCore(plugin), { uri, ...settings },
                   { transport, env, makeTransport: httpTransport, onEvent, diagnostics: level, showStates });
}
