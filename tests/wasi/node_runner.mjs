// Runs the Node side of tests/wasi and prints one JSON line per case
// ({"name", "ok", "detail"}); pytest (tests/wasi) parametrizes over them.
//   node node_runner.mjs vectors PATH.wasm   the shared vectors, byte for byte
//   node node_runner.mjs server PATH.wasm    every operation against the real
//                                            server in CHSTATE_TEST_* (fetch)
//   node node_runner.mjs bare PATH.wasm      instantiation with no imports at all
import fs from "node:fs";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { loadChstate, fetchTransport, ChstateError } from "../../hosts/wasi/chstate_wasi.mjs";

const [mode, wasmPath] = process.argv.slice(2);
const repo = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "../..");
const enc = new TextEncoder();
const report = (name, ok, detail = "") => console.log(JSON.stringify({ name, ok, detail: String(detail) }));

async function vectors() {
  const mod = await loadChstate(wasmPath);
  for (const file of ["config", "sql", "lock"]) {
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
  const transport = fetchTransport(config);
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
      const dead = mod.openStore({ schema }, fetchTransport({ ...config, port: 1 }));
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

// The module needs no imports: plain WebAssembly with an empty import object.
async function bare() {
  try {
    const { instance } = await WebAssembly.instantiate(fs.readFileSync(wasmPath), {});
    instance.exports._initialize();
    const v = instance.exports.chstate_abi_version();
    const bad = instance.exports.chstate_free(12345);
    report("bare_instance", v === 1 && bad === -1, `abi ${v}, free(12345) = ${bad}`);
  } catch (e) {
    report("bare_instance", false, e.stack);
  }
}

await ({ vectors, server, bare }[mode])();
