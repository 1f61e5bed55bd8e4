// The Node side of tests/wasi/test_extism_node.py: chstate_extism.wasm in
// Extism's JavaScript SDK, one JSON line per case ({"name", "ok", "detail"}).
//   node extism_node_runner.mjs vectors PLUGIN.wasm SDK_DIR   the shared vectors, byte for byte
//   node extism_node_runner.mjs server PLUGIN.wasm SDK_DIR    operations against CHSTATE_TEST_*
// SDK_DIR holds node_modules/@extism/extism (installed the way users install it).
import fs from "node:fs";
import path from "node:path";
import { createRequire } from "node:module";
import { fileURLToPath, pathToFileURL } from "node:url";
import { ExtismChstate, ChstateError } from "../../hosts/wasi/chstate_extism.mjs";
import { httpTransport } from "../../hosts/wasi/chstate_wasi.mjs";

const [mode, wasmPath, sdkDir] = process.argv.slice(2);
const repo = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "../..");
const report = (name, ok, detail = "") => console.log(JSON.stringify({ name, ok, detail: String(detail) }));
const require = createRequire(path.join(sdkDir, "package.json"));
const sdk = await import(pathToFileURL(require.resolve("@extism/extism")).href);
const createPlugin = sdk.default ?? sdk.createPlugin;
const plugin = () => createPlugin(wasmPath, { useWasi: true });

async function vectors() {
  const p = await plugin();
  try {
    for (const file of ["config", "sql", "lock", "policy"]) {
      const doc = JSON.parse(fs.readFileSync(path.join(repo, "tests/vectors", `${file}.json`), "utf8"));
      const random = doc.random_hex ?? "";
      for (const c of doc.cases) {
        const name = `${file}_${c.name}`;
        try {
          let handle = null;
          if (c.store) {
            const r = JSON.parse((await p.call("store_new", JSON.stringify(c.store))).text());
            if (!r.store) throw new Error(`store_new: ${JSON.stringify(r)}`);
            handle = r.store;
          }
          let mismatch = "";
          for (const [i, step] of c.steps.entries()) {
            let out;
            if (step.call === "resolve_config") out = await p.call("resolve_config", JSON.stringify(step.doc));
            else {
              const [fn, key] = step.call === "start" ? ["op_start", "op"] : ["op_feed", "answer"];
              out = await p.call(fn, JSON.stringify({ store: handle, now_ms: step.now_ms, random_hex: random,
                                                      [key]: step.doc }));
            }
            if (out.text() !== step.expect) { mismatch = `step ${i}: got ${out.text()}`; break; }
          }
          if (handle !== null) await p.call("store_free", JSON.stringify({ store: handle }));
          report(name, !mismatch, mismatch);
        } catch (e) {
          report(name, false, e.stack);
        }
      }
    }
  } finally {
    await p.close();
  }
}

async function server() {
  const env = process.env;
  const chstate = new ExtismChstate(await plugin());
  const schema = `extism_node_${process.pid}`;
  const { config, failed } = await chstate.resolveConfig({
    flags: { host: env.CHSTATE_TEST_HOST, port: env.CHSTATE_TEST_PORT, user: env.CHSTATE_TEST_USER,
             password: env.CHSTATE_TEST_PASSWORD ?? "", database: "default", schema },
  });
  if (failed) return report("resolve_config", false, JSON.stringify(failed));
  const transport = httpTransport(config);
  const store = await chstate.openStore({ schema, table: config.table, lock_timeout_ms: 1500, lock_retry_ms: 100 },
                                        transport);
  const id = Buffer.from("dev:extism-node-\u00e9'%_").toString("hex");
  const cases = [
    ["set_get", async () => {
      await store.run({ op: "set", state_id_hex: id, state: { completed: { singer_state: { n: 1 } }, partial: {} } });
      const got = (await store.run({ op: "get", state_id_hex: id })).state;
      if (got.completed.singer_state.n !== 1) throw new Error(JSON.stringify(got));
    }],
    ["update_and_history", async () => {
      await store.run({ op: "update", state_id_hex: id, state: { completed: {}, partial: { p: 2 } } });
      const versions = (await store.run({ op: "history", state_id_hex: id })).versions;
      if (versions.length !== 2 || !versions[0].current) throw new Error(JSON.stringify(versions));
    }],
    ["lock_refuses_a_second_plugin", async () => {
      const other = await new ExtismChstate(await plugin()).openStore(
        { schema, lock_timeout_ms: 300, lock_retry_ms: 100 }, transport);
      const { lock_id } = await store.run({ op: "acquire_lock", state_id_hex: id });
      const refused = await other.run({ op: "acquire_lock", state_id_hex: id }).then(() => null, (e) => e);
      await store.run({ op: "release_lock", state_id_hex: id, lock_id });
      if (!(refused instanceof ChstateError) || refused.code !== "ABORTED") throw new Error(`not refused: ${refused}`);
    }],
    ["list_and_clear_all", async () => {
      const ids = (await store.run({ op: "list", pattern: null })).state_ids_hex;
      if (JSON.stringify(ids) !== JSON.stringify([id])) throw new Error(JSON.stringify(ids));
      const { count } = await store.run({ op: "clear_all" });
      if (count !== 1) throw new Error(`cleared ${count}`);
    }],
  ];
  for (const [name, fn] of cases) {
    try {
      await fn();
      report(name, true);
    } catch (e) {
      report(name, false, e.stack);
    }
  }
  await store.close();
}

if (mode === "vectors") await vectors();
else if (mode === "server") await server();
else throw new Error(`unknown mode ${mode}`);
