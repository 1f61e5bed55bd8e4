// Checks of the JS binding of the verbs (hosts/wasi/chstate_binding.mjs)
// shared by the Wasm cores that run it: node:wasi (node_runner.mjs) and
// Extism's JS SDK (extism_node_runner.mjs). The twin of py_binding_checks.py.
//
// everyVerb(store, sid) runs each method made from the core's verb table
// against the server once and checks what it returns; it returns the verbs
// it ran, so that a caller can require every verb of the core's table but the
// lock scope's ends (acquire and release are withLock).
// scopeKeepsItsLock(store, ...) holds a lock scope three validities long
// while the chstate command tries to take the id's lock.
import { spawn } from "node:child_process";
import { ChstateError } from "../../hosts/wasi/chstate_binding.mjs";

export const STATE = { singer_state: { bookmarks: { users: { id: 41 } } } };
const PARTIAL = { singer_state: { bookmarks: { orders: { id: 7 } } } };
const MERGED = { singer_state: { bookmarks: { users: { id: 41 }, orders: { id: 7 } } } };
const SCOPE_ENDS = new Set(["acquire", "release"]);  // the lock scope: withLock
export const camel = (name) => name.replace(/_([a-z])/g, (_, c) => c.toUpperCase());
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

// A key-order-independent deep equality (states come back from JSON in the server's key order).
function same(a, b) {
  if (a === b) return true;
  if (typeof a !== "object" || typeof b !== "object" || a === null || b === null) return false;
  if (Array.isArray(a) !== Array.isArray(b)) return false;
  const ka = Object.keys(a).sort(), kb = Object.keys(b).sort();
  return ka.length === kb.length && ka.every((k, i) => k === kb[i] && same(a[k], b[k]));
}

export function check(what, got, want) {
  if (!same(got, want)) throw new Error(`${what}: got ${JSON.stringify(got)}, want ${JSON.stringify(want)}`);
}

export async function refused(promise, code, word = "") {
  const e = await promise.then(() => null, (err) => err);
  if (!(e instanceof ChstateError) || e.code !== code || !e.detail.includes(word)) {
    throw new Error(`expected ${code} (${word}), got ${e?.stack ?? e}`);
  }
  return e;
}

// The verbs of the core's table (but the scope's ends) with no method on `store`.
export const missingMethods = (store, verbs) =>
  verbs.map((v) => v.name).filter((n) => !SCOPE_ENDS.has(n) && typeof store[camel(n)] !== "function");

export async function everyVerb(store, sid) {
  const ran = new Set();
  const call = (verb, ...args) => { ran.add(verb); return store[camel(verb)](...args); };
  const server = await call("init");
  if (!server.serverVersion || !["clickhouse18", "modern"].includes(server.dialect)) throw new Error(JSON.stringify(server));
  check("ping", await call("ping"), server);
  check("compact", await call("compact"), server);
  check("get (none)", await call("get", sid), null);
  check("set", await call("set", sid, STATE), { completed: STATE, partial: {}, merged: STATE });
  // set refuses a state without singer_state unless forced (the core's check, nothing written).
  await refused(store.set(sid, { bookmarks: {} }), "INVALID_ARGUMENT", "singer_state");
  const merged = await call("merge", sid, PARTIAL);
  check("merge", merged, { completed: STATE, partial: PARTIAL, merged: MERGED });
  check("get", await store.get(sid), merged);
  await refused(store.merge(sid, {}), "INVALID_ARGUMENT");  // an empty merge writes nothing
  check("get after empty merge", await store.get(sid), merged);

  await call("copy", sid, "dev:copied");
  check("copy", await store.get("dev:copied"), merged);
  await call("move", "dev:copied", "dev:moved");
  check("move (src)", await store.get("dev:copied"), null);
  check("move (dst)", await store.get("dev:moved"), merged);
  check("list", await call("list"), [sid, "dev:moved"].sort());
  check("list pattern", await call("list", "dev:mo*"), ["dev:moved"]);

  const first = await call("export", null, { limit: 1 });
  const ids = [sid, "dev:moved"].sort();
  check("export page 1", [first.more, first.states.map((s) => s.stateId)], [true, [ids[0]]]);
  const rest = await store.export(null, { after: first.states[0].stateId, limit: 1 });
  check("export page 2", [rest.more, rest.states.map((s) => s.stateId)], [true, [ids[1]]]);  // more: the page is full
  check("export page 3", await store.export(null, { after: ids[1], limit: 1 }), { states: [], more: false });
  check("exported", [...first.states, ...rest.states].map((s) => s.merged), [MERGED, MERGED]);
  check("import", await call("import", [{ stateId: "dev:imported", completed: STATE, partial: PARTIAL }]), 1);
  check("imported", await store.get("dev:imported"), merged);
  const document = JSON.stringify({ "dev:imported-doc": { completed: STATE, partial: PARTIAL } }, null, 2);
  check("importDocument", await call("import_document", document), 1);
  check("imported from a document", await store.get("dev:imported-doc"), merged);

  const versions = await call("history", sid);
  check("history", versions.map((v) => [v.current, v.state.partial]), [[true, PARTIAL], [false, {}]]);
  check("history limit", (await store.history(sid, { limit: 1 })).length, 1);
  const restored = await call("rollback", sid, versions[1].version);
  check("rollback", restored, { completed: STATE, partial: {}, merged: STATE });
  check("get after rollback", await store.get(sid), restored);

  await store.withLock(sid, async (scope) => {
    const held = (await call("locks")).filter((l) => l.stateId === sid);
    if (held.length !== 1 || held[0].stale) throw new Error(`locks: ${JSON.stringify(held)}`);
    const id = await call("renew", sid);
    if (typeof id !== "string" || !id || (await scope.renew()) !== id) throw new Error(`renew: ${id}`);
    await store.set(sid, STATE, { partial: PARTIAL });  // under the scope's lock
  });
  check("set in the scope", await store.get(sid), merged);
  // unlock removes a lock whoever holds it: its holder finds it lost at its next renewal, and the
  // scope ends ABORTED (what it did was not exclusive).
  await refused(store.withLock("dev:unlocked", async () => {
    check("unlock", (await call("unlock", "dev:unlocked")).map((l) => l.stateId), ["dev:unlocked"]);
    await refused(store.renew("dev:unlocked"), "ABORTED");
  }), "ABORTED", "lost while held");

  await call("delete", "dev:moved");
  check("delete", await store.get("dev:moved"), null);
  check("clear_all", await call("clear_all"), 3);
  check("list after clear_all", await store.list(), []);
  return ran;
}

// `chstate lock ID --timeout WAIT -- true` against `schema` (password in the
// environment): exits 4 when the id stays held by someone else for WAIT s, 0
// when it got the lock. Its validity (--stale-lock) is the holder's, 1 s, as in
// a fleet sharing its settings: with its default 10 s it would wait out a
// holder that stopped renewing too, and the check could not fail.
export function contender(cli, schema, sid, waitS = 2) {
  const env = Object.fromEntries(Object.entries(process.env).filter(([k]) =>
    !k.startsWith("CLICKHOUSE_") && !k.startsWith("MELTANO_") && !k.startsWith("CHSTATE_")));
  env.MELTANO_STATE_BACKEND_CLICKHOUSE_SCHEMA = schema;
  env.MELTANO_STATE_BACKEND_CLICKHOUSE_PASSWORD = process.env.CHSTATE_TEST_PASSWORD ?? "";
  const uri = `clickhouse://${process.env.CHSTATE_TEST_USER}@${process.env.CHSTATE_TEST_HOST}:${process.env.CHSTATE_TEST_PORT}/default`;
  const child = spawn(cli, ["--uri", uri, "--stale-lock", "1", "lock", sid, "--timeout", String(waitS), "--", "true"],
                     { env });
  let output = "";
  child.stdout.on("data", (d) => { output += d; });
  child.stderr.on("data", (d) => { output += d; });
  return new Promise((resolve) => child.on("close", (code) => resolve({ code, output })));
}

// A lock scope (validity 1 s) whose code sleeps 3 s (awaiting, so the event
// loop runs) while the chstate command waits 2 s for the id: the binding's
// timer renews the lock, so the command must give up (exit 4) and the scope
// end cleanly. Without renewals the lock would be taken over after 1 s.
export async function scopeKeepsItsLock(store, cli, schema, sid) {
  const validityMs = store.settings.store.lock_validity_ms;
  if (validityMs !== 1000) throw new Error(`validity ${validityMs} ms, want 1000`);
  await store.withLock(sid, async () => {
    const other = contender(cli, schema, sid);
    await sleep(3 * validityMs);
    const { code, output } = await other;
    if (code !== 4) throw new Error(`the contender exited ${code}, want 4 (the lock held): ${output}`);
    if (process.env.CHSTATE_TEST_PASSWORD && output.includes(process.env.CHSTATE_TEST_PASSWORD)) {
      throw new Error("the password was printed");
    }
    await store.set(sid, STATE);  // still this scope's lock
  });
}
