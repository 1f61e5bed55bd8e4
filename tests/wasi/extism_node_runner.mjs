// The Node side of tests/wasi/test_extism_node.py: chstate_extism.wasm in
// Extism's JavaScript SDK, one JSON line per case ({"name", "ok", "detail"}).
//   node extism_node_runner.mjs vectors PLUGIN.wasm SDK_DIR   the shared vectors, byte for byte
//   node extism_node_runner.mjs server PLUGIN.wasm SDK_DIR    the JS binding (chstate_extism.mjs) against
//                                                             CHSTATE_TEST_* (CHSTATE_CONTENDER: the chstate
//                                                             command that contends for a lock scope's id)
// SDK_DIR holds node_modules/@extism/extism (installed the way users install it).
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { createRequire } from "node:module";
import { fileURLToPath, pathToFileURL } from "node:url";
import { ExtismCore, open } from "../../hosts/wasi/chstate_extism.mjs";
import { httpTransport, openStore } from "../../hosts/wasi/chstate_wasi.mjs";
import { STATE, check, everyVerb, missingMethods, refused, scopeKeepsItsLock } from "./js_binding_checks.mjs";

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
          if (c.store) {  // a settings document, passed as it is
            const r = JSON.parse((await p.call("store_new", JSON.stringify(c.store))).text());
            if (!r.store) throw new Error(`store_new: ${JSON.stringify(r)}`);
            handle = r.store;
          }
          let mismatch = "";
          for (const [i, step] of c.steps.entries()) {
            let out;
            if (step.call === "resolve_settings") out = await p.call("resolve_settings", JSON.stringify(step.doc));
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
  const schema = `extism_node_${process.pid}`;
  const uri = `clickhouse://${env.CHSTATE_TEST_USER}@${env.CHSTATE_TEST_HOST}:${env.CHSTATE_TEST_PORT}/default`;
  const password = env.CHSTATE_TEST_PASSWORD ?? "";
  const openOn = async (extra) => openStore(new ExtismCore(await plugin()), { uri, password, schema, ...extra },
                                            { env: {}, makeTransport: httpTransport });
  const store = await openOn({ lock_timeout_seconds: 1.5, lock_retry_seconds: 0.1 });
  const id = "dev:extism-node-\u00e9'%_";
  const cases = [
    ["one_call_open", async () => {
      const s = await open(createPlugin, uri, { wasm: wasmPath, env: {}, password, schema, history_versions: 3 });
      try {
        check("settings", [s.settings.store.schema, s.settings.store.history_versions], [schema, 3]);
        await s.init();
        await s.set("dev:open", STATE);
        check("get", (await s.get("dev:open")).merged, STATE);
        await s.delete("dev:open");
      } finally {
        await s.close();
      }
      await refused(open(createPlugin, uri, { wasm: wasmPath, env: {}, lock_retry: 1 }), "INVALID_ARGUMENT",
                    "lock_retry_seconds");
    }],
    ["default_plugin_in_a_folder_with_a_space", async () => {
      // As the npm package installs it: the hosts with chstate_extism.wasm beside them, here under a
      // folder whose name has a space (a URL's pathname would spell it %20).
      const dir = fs.mkdtempSync(path.join(os.tmpdir(), "chstate extism "));
      try {
        for (const f of ["chstate_extism.mjs", "chstate_wasi.mjs", "chstate_binding.mjs"]) {
          fs.copyFileSync(path.join(repo, "hosts/wasi", f), path.join(dir, f));
        }
        fs.copyFileSync(wasmPath, path.join(dir, "chstate_extism.wasm"));
        const copy = await import(pathToFileURL(path.join(dir, "chstate_extism.mjs")).href);
        const s = await copy.open(createPlugin, uri, { env: {}, password, schema });
        try {
          check("ping", (await s.ping()).dialect.length > 0, true);
        } finally {
          await s.close();
        }
      } finally {
        fs.rmSync(dir, { recursive: true, force: true });
      }
    }],
    ["every_verb_has_a_method", async () => {
      const verbs = await store.core.verbs();
      if (!verbs.some((v) => v.name === "release")) throw new Error(`no release in ${JSON.stringify(verbs)}`);
      check("verbs without a method", missingMethods(store, verbs), []);
      if (typeof store.withLock !== "function") throw new Error("no withLock");
    }],
    ["every_verb", async () => {
      const ran = await everyVerb(store, id);
      const table = (await store.core.verbs()).map((v) => v.name).filter((n) => n !== "acquire" && n !== "release");
      check("verbs run", [...ran].sort(), table.sort());
    }],
    ["events_through_the_extism_logger", async () => {
      // The plugin logs what the store tells through the SDK's logger, each at its level:
      // a wait for a lock another plugin holds at info (the core asked for info: no statements).
      const logged = [];
      const logger = Object.fromEntries(["info", "debug", "warn", "error"].map((level) =>
        [level, (text) => logged.push({ level, text })]));
      const waiter = await open(createPlugin, uri, { wasm: wasmPath, env: {}, password, schema, logger,
                                                     lock_wait_seconds: 0.5, lock_retry_seconds: 0.1 });
      try {
        await store.withLock("dev:logged", () => refused(waiter.set("dev:logged", STATE), "ABORTED"));
      } finally {
        await waiter.close();
      }
      const ours = logged.filter((l) => l.text.startsWith("chstate: "));
      const waits = ours.filter((l) => l.text.startsWith('chstate: waiting for the lock on "dev:logged": another process (lock '));
      if (waits.length === 0) throw new Error(`no wait logged: ${JSON.stringify(logged)}`);
      check("levels", [...new Set(waits.map((l) => l.level))], ["info"]);
      if (ours.some((l) => l.level === "debug")) throw new Error(`debug lines at info: ${JSON.stringify(ours)}`);
      // At debug, each statement, the state as its size only.
      const verbose = [];
      const debugLogger = { ...logger, debug: (text) => verbose.push(text) };
      const d = await open(createPlugin, uri, { wasm: wasmPath, env: {}, password, schema, logger: debugLogger,
                                                diagnostics: "debug" });
      try {
        await d.set("dev:logged", { singer_state: { bookmark: "bm-extism-77" } });
      } finally {
        await d.close();
      }
      if (!verbose.some((t) => /^chstate: insert_state \(attempt 1\): ok in \d+ ms: INSERT INTO .*'<state: \d+ bytes>'/.test(t))) {
        throw new Error(`no redacted INSERT logged at debug: ${JSON.stringify(verbose)}`);
      }
      if (verbose.some((t) => t.includes("bm-extism-77"))) throw new Error("a state's contents were logged");
    }],
    ["lock_refuses_a_second_plugin", async () => {
      const other = await openOn({ lock_wait_seconds: 0.3, lock_retry_seconds: 0.1 });
      try {
        await store.withLock(id, () => refused(other.withLock(id, async () => {}), "ABORTED"));
        await other.withLock(id, () => other.set(id, STATE));  // released: the other plugin takes it now
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
