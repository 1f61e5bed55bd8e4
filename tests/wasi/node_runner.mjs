// Runs the Node side of tests/wasi and prints one JSON line per case
// ({"name", "ok", "detail"}); pytest (tests/wasi) parametrizes over them.
//   node node_runner.mjs vectors PATH.wasm   the shared vectors, byte for byte
//   node node_runner.mjs server PATH.wasm    every operation against the real
//                                            server in CHSTATE_TEST_* (fetch)
//   node node_runner.mjs bare PATH.wasm      instantiation with no imports at all
//   node node_runner.mjs hostile PATH.wasm   hostile ABI input in V8
import fs from "node:fs";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { loadChstate, httpTransport, ChstateError } from "../../hosts/wasi/chstate_wasi.mjs";

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
        if (c.store) {
          const r = mod.storeNew(JSON.stringify(c.store));
          if (!r.store) throw new Error(`store_new: ${JSON.stringify(r)}`);
          handle = r.store;
        }
        const [rp, rn] = random.length ? mod.input(random, "random_fixed") : [0, 0];
        let mismatch = "";
        c.steps.forEach((step, i) => {
          if (mismatch) return;
          const [p, n] = mod.input(enc.encode(JSON.stringify(step.doc)));
          const got = step.call === "resolve_config"
            ? mod.output((o, cap) => mod.x.chstate_resolve_config(p, n, o, cap))
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
  const mod = await loadChstate(wasmPath);
  const schema = `wasi_node_${process.pid}`;
  const { config, failed } = mod.resolveConfig({
    flags: { host: env.CHSTATE_TEST_HOST, port: env.CHSTATE_TEST_PORT, user: env.CHSTATE_TEST_USER,
             password: env.CHSTATE_TEST_PASSWORD ?? "", database: "default", schema },
  });
  if (failed) return report("resolve_config", false, JSON.stringify(failed));
  const transport = httpTransport(config);
  const store = mod.openStore({ schema: config.schema, table: config.table, lock_timeout_ms: 1500, lock_retry_ms: 100 }, transport);
  const id = "dev:node-\u00e9\u0000'`%_*";  // a NUL, quotes and LIKE/glob characters cross unchanged
  const cases = [
    ["init", async () => { await store.run({ op: "init" }); }],
    ["set_get", async () => {
      const state = { completed: { singer_state: { bookmarks: { users: { id: 41 } } } }, partial: {} };
      await store.set(id, state);
      const got = await store.get(id);
      if (JSON.stringify(got) !== JSON.stringify(state)) throw new Error(`read back ${JSON.stringify(got)}`);
    }],
    ["merge", async () => {
      await store.merge(id, { singer_state: { bookmarks: { orders: { id: 7 } } } });
      const got = await store.get(id);
      if (got.partial.singer_state.bookmarks.orders.id !== 7 || got.completed.singer_state.bookmarks.users.id !== 41)
        throw new Error(`after merge ${JSON.stringify(got)}`);
    }],
    ["list", async () => {
      await store.set("dev:other", { completed: { a: 1 }, partial: {} });
      const all = await store.list();
      const some = await store.list("dev:node-*");
      if (JSON.stringify(all) !== JSON.stringify(["dev:node-\u00e9\u0000'`%_*", "dev:other"].sort()))
        throw new Error(`list() = ${JSON.stringify(all)}`);
      if (JSON.stringify(some) !== JSON.stringify([id])) throw new Error(`list(dev:node-*) = ${JSON.stringify(some)}`);
    }],
    ["locked_update", async () => {
      const other = mod.openStore({ schema: config.schema, table: config.table, lock_timeout_ms: 300, lock_retry_ms: 100 }, transport);
      await store.withLock(id, async (lock) => {
        // While held, a second store (another plugin instance) cannot take it.
        const refused = await other.run({ op: "acquire_lock", state_id_hex: Buffer.from(id).toString("hex") }).then(
          () => null, (e) => e);
        if (!(refused instanceof ChstateError) || refused.code !== "ABORTED")
          throw new Error(`second store was not refused: ${refused}`);
        await lock.setLocked({ completed: { singer_state: { v: 2 } }, partial: {} });
      });
      other.close();
      const got = await store.get(id);
      if (got.completed.singer_state.v !== 2) throw new Error(`after locked update ${JSON.stringify(got)}`);
    }],
    ["history_rollback", async () => {
      // The merge and the locked update above are versions; roll back to the merge.
      const versions = await store.history(id);
      if (versions.length < 3 || !versions[0].current) throw new Error(`history ${JSON.stringify(versions)}`);
      const merged = versions.find((v) => v.state.partial.singer_state?.bookmarks?.orders?.id === 7
                                          && v.state.completed.singer_state?.bookmarks?.users?.id === 41);
      if (!merged) throw new Error(`no merged version in ${JSON.stringify(versions)}`);
      const restored = await store.rollback(id, merged.version);
      const got = await store.get(id);
      if (JSON.stringify(got) !== JSON.stringify(restored) || got.partial.singer_state.bookmarks.orders.id !== 7)
        throw new Error(`after rollback ${JSON.stringify(got)}`);
      const refused = await store.rollback(id, "1-00000000").then(() => null, (e) => e);
      if (!(refused instanceof ChstateError) || refused.code !== "NOT_FOUND") throw new Error(`rollback: ${refused}`);
    }],
    ["delete", async () => {
      await store.delete(id);
      if ((await store.get(id)) !== null) throw new Error("still there after delete");
    }],
    ["clear_all", async () => {
      const n = await store.clearAll();
      if (n !== 1) throw new Error(`clear_all removed ${n}, expected 1`);
      if ((await store.list()).length !== 0) throw new Error("states left after clear_all");
    }],
    ["closed_port_is_unavailable", async () => {
      const dead = mod.openStore({ schema }, httpTransport({ ...config, port: 1 }));
      const e = await dead.get("x").then(() => null, (err) => err);
      if (!(e instanceof ChstateError) || e.code !== "UNAVAILABLE") throw new Error(`got ${e}`);
      dead.close();
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
  store.close();
  try {
    await transport({ sql: `DROP DATABASE IF EXISTS ${schema}`, url_params: [] });
    const left = await transport({ sql: `SELECT count() FROM system.databases WHERE name = '${schema}'`, url_params: [] });
    const n = Buffer.from(left.body_hex, "hex").toString().trim();
    report("cleanup", n === "0", `${n} databases named ${schema} left`);
  } catch (e) {
    report("cleanup", false, e.stack);
  }
}

// Hostile input through the ABI in V8 (the full set runs in wasmtime,
// tests/wasi/test_hostile.py): each gives an error document, no trap, and the
// same handle then completes a ping.
async function hostile() {
  const mod = await loadChstate(wasmPath);
  const x = mod.x;
  const handle = mod.storeNew("{}").store;
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

// The module needs no imports: plain WebAssembly with an empty import object.
async function bare() {
  try {
    const { instance } = await WebAssembly.instantiate(fs.readFileSync(wasmPath), {});
    instance.exports._initialize();
    const v = instance.exports.chstate_abi_version();
    const bad = instance.exports.chstate_free(12345);
    report("bare_instance", v === 2 && bad === -1, `abi ${v}, free(12345) = ${bad}`);
  } catch (e) {
    report("bare_instance", false, e.stack);
  }
}

await ({ vectors, server, bare, hostile }[mode])();
