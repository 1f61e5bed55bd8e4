// node hosts/wasi/example.mjs CHSTATE_WASM CLICKHOUSE_URI  (password in CLICKHOUSE_PASSWORD)
import { open } from "./chstate_wasi.mjs";

const [wasm, uri] = process.argv.slice(2);
// Settings by chstate's names; the core also reads CLICKHOUSE_* and MELTANO_STATE_BACKEND_* of this process.
const store = await open(uri, { wasm, lock_timeout_seconds: 30 });
try {
  await store.init();
  await store.set("dev:tap-to-target", { singer_state: { bookmarks: {} } });
  await store.merge("dev:tap-to-target", { singer_state: { bookmarks: { users: { id: 42 } } } });
  console.log(JSON.stringify(await store.get("dev:tap-to-target")));  // { completed, partial, merged }
  console.log(JSON.stringify(await store.list("dev:*")));
  // A lock scope: the id's lock, renewed while the function runs; writes inside run under it.
  await store.withLock("dev:tap-to-target", () => store.set("dev:tap-to-target", { singer_state: {} }));
  await store.delete("dev:tap-to-target");
} finally {
  await store.close();
}
