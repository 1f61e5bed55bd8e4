// One store operation through the Wasm module in Node (hosts/wasi/chstate_wasi.mjs
// and its httpTransport), for tests/faults/test_same_policy.py:
//
//   node same_policy_node.mjs WASM HOST PORT USER SCHEMA get ID
//   node same_policy_node.mjs WASM HOST PORT USER SCHEMA set ID STATE_JSON
//
// The password comes from CHSTATE_SAME_POLICY_PASSWORD. Prints one JSON line:
// {"code":"OK"} or {"code":"<error code>","message":"..."}. The host module is
// the repository's, or the copy CHSTATE_SAME_POLICY_WASI_HOST names (the test's
// self-check runs a scratch copy with a resend loop of its own).
import path from "node:path";
import { fileURLToPath, pathToFileURL } from "node:url";

const here = path.dirname(fileURLToPath(import.meta.url));
const hostModule =
  process.env.CHSTATE_SAME_POLICY_WASI_HOST || path.join(here, "..", "..", "hosts", "wasi", "chstate_wasi.mjs");
const { loadChstate, httpTransport } = await import(pathToFileURL(hostModule).href);

const [wasmPath, host, port, user, schema, op, id, stateJson] = process.argv.slice(2);
const mod = await loadChstate(wasmPath);
const { config, failed } = mod.resolveConfig({
  flags: { host, port, user, password: process.env.CHSTATE_SAME_POLICY_PASSWORD ?? "", database: "default", schema },
});
if (failed) {
  console.log(JSON.stringify({ code: "CONFIG", message: failed.message }));
  process.exit(0);
}
const transport = httpTransport({ ...config, connect_timeout_ms: 1000 });
const store = mod.openStore({ schema: config.schema, table: config.table, request_timeout_ms: 1000 }, transport);
try {
  if (op === "get") await store.get(id);
  else if (op === "set") await store.set(id, { completed: JSON.parse(stateJson), partial: {} });
  else throw new Error(`unknown op ${op}`);
  console.log(JSON.stringify({ code: "OK" }));
} catch (e) {
  console.log(JSON.stringify({ code: e.code ?? "THROWN", message: String(e.detail ?? e.message ?? e) }));
} finally {
  store.close();
}
