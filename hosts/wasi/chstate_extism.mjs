// A host for chstate_extism.wasm with Extism's JavaScript SDK
// (@extism/extism): the pump every chstate host is. It sends the request the
// plugin's core asks for, sleeps for its waits, and passes the clock and
// fresh random bytes with every call; retries, renewals and defaults are the
// core's. The plugin comes from the caller's SDK:
//
//   import createPlugin from "@extism/extism";
//   import { ExtismChstate } from "chstate-wasi/extism";        // this file
//   import { httpTransport, storeOptions } from "chstate-wasi"; // or any (request) => Promise<response>
//   const chstate = new ExtismChstate(await createPlugin("chstate_extism.wasm", { useWasi: true }));
//   const { config } = await chstate.resolveConfig({ flags: { uri: "clickhouse://meltano@127.0.0.1:8123/default" } });
//   const store = await chstate.openStore(storeOptions(config), httpTransport(config));  // request.host, .port
//   await store.run({ op: "get", state_id_hex: Buffer.from("dev:a").toString("hex") });   // the "done" document
import { randomBytes } from "node:crypto";
import { performance } from "node:perf_hooks";
import { setTimeout as sleep } from "node:timers/promises";

export class ChstateError extends Error {
  constructor(code, message) {
    super(`${code}: ${message}`);
    this.code = code;
    this.detail = message;
  }
}

export class ExtismChstate {
  constructor(plugin, clockMs = () => Math.floor(performance.timeOrigin + performance.now())) {
    this.plugin = plugin;
    this.clockMs = clockMs;
  }

  async call(name, doc) {
    const out = await this.plugin.call(name, typeof doc === "string" ? doc : JSON.stringify(doc));
    return JSON.parse(out.text());
  }

  resolveConfig(sources) { return this.call("resolve_config", sources); }

  step(name, handle, key, doc, nowMs = this.clockMs(), random = randomBytes(32)) {
    return this.call(name, { store: handle, now_ms: nowMs, random_hex: random.toString("hex"), [key]: doc });
  }

  async openStore(options, transport) {
    const r = await this.call("store_new", options);
    if (r.failed) throw new ChstateError(r.failed.code, r.failed.message);
    return new ExtismStore(this, r.store, transport);
  }
}

export class ExtismStore {
  constructor(chstate, handle, transport) {
    this.chstate = chstate;
    this.handle = handle;
    this.transport = transport;
  }

  async run(op) {
    let action = await this.chstate.step("op_start", this.handle, "op", op);
    for (;;) {
      let answer;
      if (action.request) answer = { response: await this.transport(action.request) };
      else if (action.wait_ms !== undefined) {
        await sleep(Math.max(0, action.wait_ms));
        answer = { timer: true };
      } else if (action.done) return action.done;
      else throw new ChstateError(action.failed.code, action.failed.message);
      action = await this.chstate.step("op_feed", this.handle, "answer", answer);
    }
  }

  async close() {
    if (this.handle !== null) await this.chstate.call("store_free", { store: this.handle });
    this.handle = null;
    this.transport.close?.();
  }
}
