// The Wasm module in Node (hosts/wasi/chstate_wasi.mjs: the JS binding of the
// verbs over node:wasi, with its own HTTP transport, httpTransport) against
// the ClickHouse HTTP endpoint in CHSTATE_TEST_*: one JSON document on stdout
// with what each operation returned, for test_wasi_node.py to check.
//   node node_modern.mjs PATH.wasm SCHEMA STATE_ID
import { ChstateError, open } from "../../hosts/wasi/chstate_wasi.mjs";

const [wasm, schema, stateId] = process.argv.slice(2);
const env = process.env;
const uri = `clickhouse://${env.CHSTATE_TEST_USER}@${env.CHSTATE_TEST_HOST}:${env.CHSTATE_TEST_PORT}/default`;
const out = {};
// The settings by the core's names; env: {} so that nothing of this process's environment is read.
const settings = { wasm, env: {}, password: env.CHSTATE_TEST_PASSWORD, schema, lock_wait_seconds: 0.4,
                   lock_retry_seconds: 0.1 };
const store = await open(uri, settings);
const other = await open(uri, settings);
const state = JSON.parse(env.T_STATE);
const sides = (s) => (s === null ? null : { completed: s.completed, partial: s.partial });

const ping = await store.ping();
out.ping = { server_version: ping.serverVersion, dialect: ping.dialect };
await store.set(stateId, state);
await store.set("dev:plain", { singer_state: { n: 1 } });
out.get = sides(await store.get(stateId));
await store.merge(stateId, { singer_state: { more: true } });
out.merged = sides(await store.get(stateId));
out.missing = await store.get("dev:absent");
out.list = await store.list();
out.list_pattern = await store.list("dev:p*");
out.locked = await store.withLock(stateId, async () => {
  let second = "acquired";
  try {
    await other.withLock(stateId, async () => {});
  } catch (e) {
    second = e instanceof ChstateError ? e.code : String(e);
  }
  await store.set(stateId, { singer_state: { in_lock: 1 } });  // under the scope's lock
  return second;
});
out.after_lock = sides(await store.get(stateId));
await store.delete(stateId);
out.after_delete = await store.get(stateId);
out.cleared = await store.clearAll();
out.list_after = await store.list();

const badStore = await open(uri, { ...settings, password: "wrong-" + env.CHSTATE_TEST_PASSWORD.slice(0, 5) });
try {
  await badStore.get("dev:plain");
  out.wrong_password = "accepted";
} catch (e) {
  out.wrong_password = e.code;
}
await store.close(); await other.close(); await badStore.close();  // close() closes each transport too
console.log(JSON.stringify(out));
