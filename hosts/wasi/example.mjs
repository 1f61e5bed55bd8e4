// node hosts/wasi/example.mjs CHSTATE_WASM CLICKHOUSE_URI  (password in CLICKHOUSE_PASSWORD)
import { loadChstate, httpTransport, storeOptions } from "./chstate_wasi.mjs";

const [wasmPath, uri] = process.argv.slice(2);
const chstate = await loadChstate(wasmPath);
// The module has no environment: pass it the variables it may read.
const { config, failed } = chstate.resolveConfig({
  flags: { uri },
  env: { CLICKHOUSE_PASSWORD: process.env.CLICKHOUSE_PASSWORD ?? "" },
});
if (failed) throw new Error(failed.message);
// storeOptions: schema, table, cluster settings and every host (the core picks one per request).
const store = chstate.openStore(storeOptions(config), httpTransport(config));
await store.run({ op: "init" });
await store.set("dev:tap-to-target", { completed: { singer_state: { bookmarks: {} } }, partial: {} });
await store.merge("dev:tap-to-target", { singer_state: { bookmarks: { users: { id: 42 } } } });
console.log(JSON.stringify(await store.get("dev:tap-to-target")));
console.log(JSON.stringify(await store.list("dev:*")));
await store.withLock("dev:tap-to-target", (lock) => lock.setLocked({ completed: {}, partial: {} }));
await store.delete("dev:tap-to-target");
store.close();
