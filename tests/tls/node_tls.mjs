// The Wasm module's Node host over HTTPS (tests/tls/test_tls.py): resolves a
// secure config with the given CA file, sets and gets one state, and prints
// one JSON line: {"ok": true, "state": ...} or {"ok": false, "code", "message"}.
//   node node_tls.mjs WASM HOST PORT USER CA_FILE|"" SCHEMA   (password in CHSTATE_TLS_PASSWORD)
import { loadChstate, httpTransport, ChstateError } from "../../hosts/wasi/chstate_wasi.mjs";

const [wasm, host, port, user, caFile, schema] = process.argv.slice(2);
const chstate = await loadChstate(wasm);
const flags = { host, port: Number(port), user, password: process.env.CHSTATE_TLS_PASSWORD, database: "default",
                secure: true, schema };
if (caFile) flags.ca_file = caFile;
const { config, failed } = chstate.resolveConfig({ flags });
if (failed) throw new Error(JSON.stringify(failed));
const store = chstate.openStore({ schema: config.schema, table: config.table }, httpTransport(config));
try {
  await store.set("tls:node", { completed: { singer_state: { tls: "node" } }, partial: {} });
  console.log(JSON.stringify({ ok: true, state: await store.get("tls:node") }));
} catch (e) {
  if (!(e instanceof ChstateError)) throw e;
  console.log(JSON.stringify({ ok: false, code: e.code, message: e.detail }));
} finally {
  store.close();
}
