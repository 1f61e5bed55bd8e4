// Runs a plan of merges and reads through the Wasm module in Node (hosts/wasi/
// chstate_wasi.mjs: open() and the verb methods, over its httpTransport), for
// tests/faults/test_histories.py:
//
//   node history_node.mjs WASM URI SCHEMA SETTINGS_JSON PLAN_JSON
//
// SETTINGS_JSON: the store's timeouts ({"request_timeout_seconds": 1, ...}). PLAN_JSON: [["merge", id, key] | ["read", id], ...]. The password comes from
// CHSTATE_HISTORY_PASSWORD. Prints one JSON line per operation: {"t0", "t1"
// (wall clock, s), "code" ("OK" or the error code), "value" (a read's state)}.
import path from "node:path";
import { fileURLToPath, pathToFileURL } from "node:url";

const here = path.dirname(fileURLToPath(import.meta.url));
const { open } = await import(pathToFileURL(path.join(here, "..", "..", "hosts", "wasi", "chstate_wasi.mjs")).href);
const [wasm, uri, schema, settingsJson, planJson] = process.argv.slice(2);
const settings = { ...JSON.parse(settingsJson), wasm, env: {}, password: process.env.CHSTATE_HISTORY_PASSWORD ?? "",
                   schema };
const store = await open(uri, settings);
const now = () => (performance.timeOrigin + performance.now()) / 1000;
for (const [op, id, key] of JSON.parse(planJson)) {
  const t0 = now();
  let line;
  try {
    const r = op === "merge" ? await store.merge(id, { singer_state: { [key]: 1 } }) : await store.get(id);
    line = { t0, t1: now(), code: "OK", value: op === "read" ? r : null };
  } catch (e) {
    line = { t0, t1: now(), code: e.code ?? "THROWN", message: String(e.detail ?? e.message ?? e).slice(0, 300) };
  }
  console.log(JSON.stringify(line));
}
await store.close();
