// One store operation through the Wasm module in Node (hosts/wasi/chstate_wasi.mjs:
// open() and the verb methods, over its httpTransport), for tests/faults/test_same_policy.py:
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
const { open } = await import(pathToFileURL(hostModule).href);

const [wasm, host, port, user, schema, op, id, stateJson] = process.argv.slice(2);
// The settings by the core's names; env: {} so that nothing of this process's environment is read.
const settings = { wasm, env: {}, password: process.env.CHSTATE_SAME_POLICY_PASSWORD ?? "", schema,
                   connect_timeout_seconds: 1, request_timeout_seconds: 1 };
let store;
try {
  store = await open(`clickhouse://${user}@${host}:${port}/default`, settings);
} catch (e) {
  console.log(JSON.stringify({ code: "CONFIG", message: String(e.detail ?? e.message ?? e) }));
  process.exit(0);
}
try {
  if (op === "get") await store.get(id);
  else if (op === "set") await store.set(id, JSON.parse(stateJson));  // the completed side
  else throw new Error(`unknown op ${op}`);
  console.log(JSON.stringify({ code: "OK" }));
} catch (e) {
  console.log(JSON.stringify({ code: e.code ?? "THROWN", message: String(e.detail ?? e.message ?? e) }));
} finally {
  await store.close();
}
