// Runs the Node side of tests/wasi and prints one JSON line per case
// ({"name", "ok", "detail"}); pytest (tests/wasi) parametrizes over them.
//   node node_runner.mjs vectors PATH.wasm   the shared vectors, byte for byte
//   node node_runner.mjs server PATH.wasm    the binding against the real server
//                                            in CHSTATE_TEST_* (CHSTATE_CONTENDER:
//                                            the chstate command that contends)
//   node node_runner.mjs bare PATH.wasm      instantiation with no imports at all
//   node node_runner.mjs hostile PATH.wasm   hostile ABI input in V8
//   node node_runner.mjs binding PATH.wasm   the JS binding over a scripted core
import fs from "node:fs";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { loadChstate, httpTransport, open, openStore, WasiCore } from "../../hosts/wasi/chstate_wasi.mjs";
import { STATE, check, everyVerb, missingMethods, refused, scopeKeepsItsLock } from "./js_binding_checks.mjs";

const [mode, wasmPath] = process.argv.slice(2);
const repo = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "../..");
const enc = new TextEncoder();
const report = (name, ok, detail = "") => console.log(JSON.stringify({ name, ok, detail: String(detail) }));

async function vectors() {
  const mod = await loadChstate(wasmPath);
  for (const file of ["config", "sql", "lock", "policy"]) {
    const doc = JSON.parse(fs.readFileSync(path.join(repo, "tests/vectors", `${file}.json`), "utf8"));
    const random = Buffer.from(doc.random_hex ?? "", "hex");
    for (const c of doc.cases) {
      const name = `${file}_${c.name}`;
      try {
        let handle = 0;
        if (c.store) {  // a settings document, passed as it is
          const r = mod.storeNew(JSON.stringify(c.store));
          if (!r.store) throw new Error(`store_new: ${JSON.stringify(r)}`);
          handle = r.store;
        }
        const [rp, rn] = random.length ? mod.input(random, "random_fixed") : [0, 0];
        let mismatch = "";
        c.steps.forEach((step, i) => {
          if (mismatch) return;
          const [p, n] = mod.input(enc.encode(JSON.stringify(step.doc)));
          const got = step.call === "resolve_settings"
            ? mod.output((o, cap) => mod.x.chstate_resolve_settings(p, n, o, cap))
            : mod.output((o, cap) => mod.x[step.call === "start" ? "chstate_op_start" : "chstate_op_feed"](
                handle, p, n, BigInt(step.now_ms), rp, rn, o, cap));
          if (got !== step.expect) mismatch = `step ${i} (${step.call}):\n  got  ${got}\n  want ${step.expect}`;
        });
        if (handle) mod.x.chstate_store_free(handle);
        report(name, !mismatch, mismatch);
      } catch (e) {
        report(name, false, e.stack);
      }
    }
  }
}

async function server() {
  const env = process.env;
  const schema = `wasi_node_${process.pid}`;
  const uri = `clickhouse://${env.CHSTATE_TEST_USER}@${env.CHSTATE_TEST_HOST}:${env.CHSTATE_TEST_PORT}/default`;
  const settings = (extra = {}) => ({ wasm: wasmPath, env: {}, password: env.CHSTATE_TEST_PASSWORD ?? "", schema, ...extra });
  const mod = await loadChstate(wasmPath);
  const openOn = (extra, options = {}) =>
    openStore(new WasiCore(mod), { uri, password: env.CHSTATE_TEST_PASSWORD ?? "", schema, ...extra },
              { env: {}, makeTransport: httpTransport, ...options });
  const store = await openOn({ lock_timeout_seconds: 1.5, lock_retry_seconds: 0.1 });
  const id = "dev:node-\u00e9\u0000'`%_*";  // a NUL, quotes and LIKE/glob characters cross unchanged
  const cases = [
    ["one_call_open", async () => {
      const s = await open(uri, settings({ history_versions: 3 }));
      try {
        check("settings", [s.settings.store.schema, s.settings.store.history_versions], [schema, 3]);
        if (s.redactedUri.includes(env.CHSTATE_TEST_PASSWORD)) throw new Error("password in the redacted URI");
        await s.init();
        await s.set("dev:open", STATE);
        check("get", (await s.get("dev:open")).merged, STATE);
        await s.delete("dev:open");
      } finally {
        await s.close();
      }
      // A renamed setting is refused naming its new name.
      await refused(open(uri, settings({ stale_lock: 30 })), "INVALID_ARGUMENT", "lock_timeout_seconds");
    }],
    ["every_verb_has_a_method", async () => {
      const verbs = mod.verbs();
      if (!verbs.some((v) => v.name === "acquire")) throw new Error(`no acquire in ${JSON.stringify(verbs)}`);
      check("verbs without a method", missingMethods(store, verbs), []);
      if (typeof store.withLock !== "function") throw new Error("no withLock");
    }],
    ["every_verb", async () => {
      const ran = await everyVerb(store, id);
      const table = mod.verbs().map((v) => v.name).filter((n) => n !== "acquire" && n !== "release");
      check("verbs run", [...ran].sort(), table.sort());
    }],
    ["second_store_refused", async () => {
      const other = await openOn({ lock_wait_seconds: 0.3, lock_retry_seconds: 0.1 });
      try {
        await store.withLock(id, async () => {
          await refused(other.withLock(id, async () => {}), "ABORTED");
          await refused(other.set(id, STATE), "ABORTED");  // a write takes the id's lock
          await store.set(id, STATE);
        });
        await other.withLock(id, () => other.merge(id, { singer_state: { p: 1 } }));  // released: taken now
        check("after the other's merge", (await store.get(id)).partial, { singer_state: { p: 1 } });
      } finally {
        await other.close();
      }
    }],
    ["scope_keeps_its_lock", async () => {
      const s = await openOn({ lock_timeout_seconds: 1 });
      try {
        await scopeKeepsItsLock(s, env.CHSTATE_CONTENDER, schema, "dev:long-scope");
      } finally {
        await s.close();
      }
    }],
    ["events_reach_on_event", async () => {
      // A store waiting for a lock another holds tells onEvent so, at info (no statements).
      const told = [];
      const watcher = await openOn({ lock_wait_seconds: 0.5, lock_retry_seconds: 0.1 }, { onEvent: (e) => told.push(e) });
      try {
        await store.withLock("dev:watched", () => refused(watcher.set("dev:watched", STATE), "ABORTED"));
      } finally {
        await watcher.close();
      }
      const waiting = told.filter((e) => e.kind === "lock_waiting");
      if (waiting.length === 0) throw new Error(`no lock_waiting event in ${JSON.stringify(told)}`);
      check("the wait", [waiting[0].level, waiting[0].stateId, waiting[0].line.startsWith('waiting for the lock on "dev:watched": another process (lock ')],
            ["info", "dev:watched", true]);
      if (typeof waiting[0].numbers.next_try_ms !== "number" || typeof waiting[0].texts.holder !== "string") {
        throw new Error(`facts missing: ${JSON.stringify(waiting[0])}`);
      }
      if (told.some((e) => e.kind === "statement")) throw new Error("a statement was told at the info level");
      // At debug each statement, with its time and the state as its size only.
      const seen = [];
      const debug = await open(uri, settings({ onEvent: (e) => seen.push(e), diagnostics: "debug" }));
      try {
        await debug.set("dev:watched", { singer_state: { bookmark: "bm-node-77" } });
      } finally {
        await debug.close();
      }
      const insert = seen.find((e) => e.kind === "statement" && e.texts.purpose === "insert_state");
      if (!insert || !/ok in \d+ ms: INSERT INTO .*'<state: \d+ bytes>'/.test(insert.line)) {
        throw new Error(`no redacted INSERT statement in ${JSON.stringify(seen.map((e) => e.line))}`);
      }
      check("took_ms", typeof insert.numbers.took_ms, "number");
      if (seen.some((e) => JSON.stringify(e).includes("bm-node-77"))) throw new Error("a state's contents were told");
    }],
    ["closed_port_is_unavailable", async () => {
      const dead = await open(`clickhouse://${env.CHSTATE_TEST_USER}@127.0.0.1:1/default`,
                              { wasm: wasmPath, env: {}, schema, connect_timeout_seconds: 1 });
      await refused(dead.get("x"), "UNAVAILABLE");
      await dead.close();
    }],
  ];
  for (const [name, fn] of cases) {
    try {
      await fn();
      report(name, true);
    } catch (e) {
      report(name, false, e.stack ?? e);
    }
  }
  await store.close();
  // The settings view never holds the password: the cleanup brings its own.
  const transport = httpTransport({ ...store.settings.connection, password: env.CHSTATE_TEST_PASSWORD ?? "" });
  try {
    await transport({ sql: `DROP DATABASE IF EXISTS ${schema}`, url_params: [] });
    const left = await transport({ sql: `SELECT count() FROM system.databases WHERE name = '${schema}'`, url_params: [] });
    const n = Buffer.from(left.body_hex, "hex").toString().trim();
    report("cleanup", n === "0", `${n} databases named ${schema} left`);
  } catch (e) {
    report("cleanup", false, e.stack);
  } finally {
    transport.close();
  }
}

// Hostile input through the ABI in V8 (the full set runs in wasmtime,
// tests/wasi/test_hostile.py): each gives an error document, no trap, and the
// same handle then completes a ping.
async function hostile() {
  const mod = await loadChstate(wasmPath);
  const x = mod.x;
  const handle = mod.storeNew('{"from":"api","values":{"uri":"clickhouse://default@127.0.0.1:8123/default"}}').store;
  const version = JSON.stringify({ response: { transport_ok: true, http_status: 200, body: "18.16.1\t1\n" } });
  const rnd = mod.input(new Uint8Array(32).fill(7), "rnd");
  const start = (doc, h = handle) => JSON.parse(mod.output((o, c) => {
    const [p, n] = mod.input(enc.encode(doc));
    return x.chstate_op_start(h, p, n, 1000n, rnd[0], rnd[1], o, c);
  }));
  const feedRaw = (p, n) => JSON.parse(mod.output((o, c) => x.chstate_op_feed(handle, p, n, 1000n, rnd[0], rnd[1], o, c)));
  const feed = (doc) => { const [p, n] = mod.input(doc instanceof Uint8Array ? doc : enc.encode(doc)); return feedRaw(p, n); };
  const pingWorks = () => start('{"op":"ping"}').request?.purpose === "select_version" && feed(version).done?.server_version === "18.16.1";
  const failed = (d, code, word) => d.failed?.code === code && d.failed.message.includes(word);
  const cases = {
    bad_handle: () => failed(start('{"op":"ping"}', 4242), "INVALID_ARGUMENT", "is not open") && x.chstate_store_free(4242) === -1,
    pointer_outside_blocks: () => failed(feedRaw(0xfffff000, 64), "INVALID_ARGUMENT", "not inside a live block"),
    length_past_block: () => { const p = x.chstate_alloc(16); const d = feedRaw(p, 4096); x.chstate_free(p);
                               return failed(d, "INVALID_ARGUMENT", "not inside a live block"); },
    invalid_utf8_keeps_op: () => start('{"op":"ping"}').request &&
      failed(feed(new Uint8Array([0x7b, 0x22, 0xff, 0x22, 0x7d])), "INVALID_ARGUMENT", "not valid UTF-8") &&
      feed(version).done !== undefined,
    truncated_json: () => failed(start('{"op":"pi'), "INVALID_ARGUMENT", "JSON"),
    wrong_order: () => failed(feed(version), "FAILED_PRECONDITION", "start one first"),
    too_small_buffer: () => {
      const tiny = x.chstate_alloc(8);
      const [p, n] = mod.input(enc.encode('{"op":"ping"}'));
      const r = x.chstate_op_start(handle, p, n, 1000n, rnd[0], rnd[1], tiny, 8);
      const big = x.chstate_alloc(-r);
      const r2 = x.chstate_last(big, -r);
      const d = JSON.parse(new TextDecoder().decode(new Uint8Array(x.memory.buffer, big, r2)));
      x.chstate_free(tiny); x.chstate_free(big);
      return r < 0 && r2 === -r && d.request?.purpose === "select_version" && feed(version).done !== undefined;
    },
    oversized: () => x.chstate_alloc((16 << 20) + 1) === 0 && x.chstate_alloc(0) === 0 &&
      failed(feedRaw(x.chstate_alloc(8), (16 << 20) + 1), "INVALID_ARGUMENT", "the limit is"),
    double_free: () => { const p = x.chstate_alloc(64); return x.chstate_free(p) === 0 && x.chstate_free(p) === -1; },
  };
  for (const [name, fn] of Object.entries(cases)) {
    try {
      const ok = fn() && pingWorks();
      report(`hostile_${name}`, ok, ok ? "" : `last document: ${mod.last}`);
    } catch (e) {
      report(`hostile_${name}`, false, e.stack);  // a trap lands here
    }
  }
}

// The JS binding (chstate_binding.mjs) over a scripted core, no module and no
// server: what the pump and the idle timer do with the actions they are given.
async function binding() {
  const { openStore } = await import("../../hosts/wasi/chstate_binding.mjs");
  const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
  const scripted = (period, fed) => ({
    verbs: () => [{ name: "ping", args: [], returns: "server" }],
    storeNew: () => 1,
    storeSettings: () => ({ connection: {} }),
    start: (h, text, now) => ({ done: { server_version: "x", dialect: "modern", next_timeout_ms: now + period } }),
    feed: (h, text, now) => { fed.push(now); return { idle: { next_timeout_ms: now + period } }; },
    storeFree: () => {},
  });
  const cases = {
    // Node's timers may fire a little before the time asked for (whole
    // milliseconds of the loop's clock against performance.now()); here every
    // timer of the binding fires 2 ms early. The idle timer must go on (a
    // lock scope's renewals ride on it), not stop at the first early wake.
    idle_timer_survives_early_wakes: async () => {
      const real = globalThis.setTimeout;
      globalThis.setTimeout = (fn, ms, ...args) => real(fn, Math.max(0, ms - 2), ...args);
      const fed = [];
      const store = await openStore(scripted(20, fed), {}, { transport: async () => ({}), env: {} });
      try {
        await store.ping();
        globalThis.setTimeout = real;  // the test's own waits are exact
        const keep = setInterval(() => {}, 50);
        await sleep(400);
        clearInterval(keep);
        // About 20 timers in 400 ms; the last one recent.
        return fed.length >= 10 ? "" : `the idle timer ran ${fed.length} times in 400 ms (every 20 ms wanted)`;
      } finally {
        globalThis.setTimeout = real;
        await store.close();
      }
    },
  };
  for (const [name, fn] of Object.entries(cases)) {
    try {
      const problem = await fn();
      report(`binding_${name}`, !problem, problem);
    } catch (e) {
      report(`binding_${name}`, false, e.stack);
    }
  }
}

// The module needs no imports: plain WebAssembly with an empty import object.
async function bare() {
  try {
    const { instance } = await WebAssembly.instantiate(fs.readFileSync(wasmPath), {});
    instance.exports._initialize();
    const v = instance.exports.chstate_abi_version();
    const bad = instance.exports.chstate_free(12345);
    report("bare_instance", v === 3 && bad === -1, `abi ${v}, free(12345) = ${bad}`);
  } catch (e) {
    report("bare_instance", false, e.stack);
  }
}

await ({ vectors, server, bare, hostile, binding }[mode])();
