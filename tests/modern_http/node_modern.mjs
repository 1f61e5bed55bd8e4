// The Wasm module in Node (hosts/wasi/chstate_wasi.mjs and its own HTTP
// transport: httpTransport, called fetchTransport before it used node:http)
// against the ClickHouse HTTP endpoint in CHSTATE_TEST_*: one JSON document
// on stdout with what each operation returned, for test_wasi_node.py to check.
//   node node_modern.mjs PATH.wasm SCHEMA STATE_ID
import * as host from "../../hosts/wasi/chstate_wasi.mjs";

const { loadChstate, ChstateError } = host;
const transportFor = host.httpTransport ?? host.fetchTransport;
const transports = [];
const transport = (config) => {
  const t = transportFor(config);
  transports.push(t);
  return t;
};

const [wasmPath, schema, stateId] = process.argv.slice(2);
const env = process.env;
const out = {};
const chstate = await loadChstate(wasmPath);
const { config, failed } = chstate.resolveConfig({
  flags: { host: env.CHSTATE_TEST_HOST, port: env.CHSTATE_TEST_PORT, user: env.CHSTATE_TEST_USER,
           password: env.CHSTATE_TEST_PASSWORD, database: "default", schema },
});
if (failed) throw new Error(JSON.stringify(failed));
const opts = { schema: config.schema, table: config.table, lock_timeout_ms: 400, lock_retry_ms: 100 };
const store = chstate.openStore(opts, transport(config));
const other = chstate.openStore(opts, transport(config));
const state = JSON.parse(env.T_STATE);

const ping = await store.run({ op: "ping" });
out.ping = { server_version: ping.server_version, dialect: ping.dialect };
await store.set(stateId, { completed: state, partial: {} });
await store.set("dev:plain", { completed: { singer_state: { n: 1 } }, partial: {} });
out.get = await store.get(stateId);
await store.merge(stateId, { singer_state: { more: true } });
out.merged = await store.get(stateId);
out.missing = await store.get("dev:absent");
out.list = await store.list();
out.list_pattern = await store.list("dev:p*");
out.locked = await store.withLock(stateId, async ({ setLocked }) => {
  let second = "acquired";
  try {
    await other.run({ op: "acquire_lock", state_id_hex: Buffer.from(stateId, "utf8").toString("hex") });
  } catch (e) {
    second = e instanceof ChstateError ? e.code : String(e);
  }
  await setLocked({ completed: { singer_state: { in_lock: 1 } }, partial: {} });
  return second;
});
out.after_lock = await store.get(stateId);
await store.delete(stateId);
out.after_delete = await store.get(stateId);
out.cleared = await store.clearAll();
out.list_after = await store.list();

const bad = chstate.resolveConfig({
  flags: { host: env.CHSTATE_TEST_HOST, port: env.CHSTATE_TEST_PORT, user: env.CHSTATE_TEST_USER,
           password: "wrong-" + env.CHSTATE_TEST_PASSWORD.slice(0, 5), database: "default", schema },
}).config;
const badStore = chstate.openStore(opts, transport(bad));
try {
  await badStore.get("dev:plain");
  out.wrong_password = "accepted";
} catch (e) {
  out.wrong_password = e.code;
}
store.close(); other.close(); badStore.close();
for (const t of transports) t.close?.();  // keep-alive sockets would keep Node running
console.log(JSON.stringify(out));
