// The Wasm module's Node host over HTTPS (tests/tls/test_tls.py): opens a
// store over a secure connection with the given CA file, sets and gets one
// state, and prints one JSON line: {"ok": true, "state": ...} or
// {"ok": false, "code", "message"}.
//   node node_tls.mjs WASM HOST PORT USER CA_FILE|"" SCHEMA   (password in CHSTATE_TLS_PASSWORD)
import { ChstateError, open } from "../../hosts/wasi/chstate_wasi.mjs";

const [wasm, host, port, user, caFile, schema] = process.argv.slice(2);
// The settings by chstate's names; env: {} so that nothing of this process's environment is read.
const settings = { wasm, env: {}, host, port: Number(port), user, password: process.env.CHSTATE_TLS_PASSWORD,
                   database: "default", secure: true, schema };
if (caFile) settings.ca_file = caFile;
const store = await open(undefined, settings);
try {
  await store.set("tls:node", { singer_state: { tls: "node" } });
  console.log(JSON.stringify({ ok: true, state: await store.get("tls:node") }));
} catch (e) {
  if (!(e instanceof ChstateError)) throw e;
  console.log(JSON.stringify({ ok: false, code: e.code, message: e.detail }));
} finally {
  await store.close();
}
