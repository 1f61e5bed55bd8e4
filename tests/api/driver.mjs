// Replays tests/api/scenarios.json through one JS host's PUBLIC API and prints
// the transcript as JSON (the same normalisation as driver.py).
//
//   node driver.mjs HOST SCHEMA_PREFIX    // HOST: node | extism-js
//
// node is hosts/wasi/chstate_wasi.mjs's open(uri, {...}); extism-js is
// hosts/wasi/chstate_extism.mjs's open(createPlugin, uri, {...}) with the
// @extism/extism SDK found from CHSTATE_EXTISM_SDK (a folder with it
// installed). Environment as for driver.py.
import fs from "node:fs";
import { createRequire } from "node:module";
import path from "node:path";
import { spawn } from "node:child_process";
import { fileURLToPath, pathToFileURL } from "node:url";

const here = path.dirname(fileURLToPath(import.meta.url));
const repo = path.resolve(here, "../..");
const scenarios = JSON.parse(fs.readFileSync(path.join(here, "scenarios.json"), "utf8"));
const env = process.env;
const URI = env.CHSTATE_API_URI;
const PASSWORD = env.CHSTATE_API_PASSWORD ?? "";
const CLI = env.CHSTATE_CLI;
const camel = (name) => name.replace(/_([a-z])/g, (_, c) => c.toUpperCase());
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

const arg = (v) => (v && typeof v === "object" && !Array.isArray(v) && "repeat" in v ? v.repeat.repeat(v.times) : v);
const uriWith = (q) => (q ? URI + (URI.includes("?") ? "&" : "?") + q : URI);
const originClass = (o) => (o === "default" ? "default" : /^(MELTANO_STATE_BACKEND_|CLICKHOUSE_)/.test(o) ? "env" : "setting");

function normal(verb, r) {
  switch (verb) {
    case "get": case "set": case "merge": case "rollback": return r == null ? null : r.merged;
    case "delete": case "copy": case "move": return null;
    case "ping": case "init": case "compact": return r.dialect ? "dialect" : r;
    case "export": return r.document !== undefined
      ? { ids: r.stateIds, more: r.more, entries: JSON.parse("{" + r.document + "}") }
      : { ids: r.states.map((s) => s.stateId), more: r.more };
    case "history": return r.map((v) => v.state.merged);
    case "locks": return r.map((l) => l.stateId);
    case "unlock": return r[0].stateId;
    case "renew": return "renewed";
    default: return r;
  }
}

// The CLI in the scope's schema, with the scope's validity: were the scope's
// lock not renewed, it would be stale to this contender in time.
function contender(stateId, waitS, settings) {
  const child = spawn(CLI, ["--uri", URI, "--schema", settings.schema, "--stale-lock",
                            String(settings.lock_timeout_seconds ?? 10), "--lock-timeout", String(waitS), "lock", "--",
                            stateId, "true"],
                      { env: { ...env, MELTANO_STATE_BACKEND_CLICKHOUSE_PASSWORD: PASSWORD }, stdio: "ignore" });
  return new Promise((resolve) => child.on("exit", (code) => resolve(
    code === 0 ? "acquired" : code === 4 ? "not acquired" : `exit ${code}`)));
}

async function openHost(host) {
  if (host === "node") {
    const chstate = await import(pathToFileURL(path.join(repo, "hosts/wasi/chstate_wasi.mjs")).href);
    return (settings) => chstate.open(settings.uri, { ...settings.rest, password: PASSWORD, env: {}, wasm: env.CHSTATE_WASM });
  }
  const chstate = await import(pathToFileURL(path.join(repo, "hosts/wasi/chstate_extism.mjs")).href);
  const require = createRequire(path.join(env.CHSTATE_EXTISM_SDK, "package.json"));
  const sdk = await import(pathToFileURL(require.resolve("@extism/extism")).href);
  const createPlugin = sdk.default ?? sdk.createPlugin;
  return (settings) => chstate.open(createPlugin, settings.uri,
                                    { ...settings.rest, password: PASSWORD, env: {}, wasm: env.CHSTATE_EXTISM_WASM });
}

async function call(store, verb, args, named) {
  const options = Object.keys(named).length ? named : undefined;
  const method = store[camel(verb)];
  return options === undefined ? method.call(store, ...args) : method.call(store, ...args, ...(
    args.length < positionalCount(verb) ? new Array(positionalCount(verb) - args.length).fill(undefined) : []), options);
}

// How many positional arguments a verb takes (the core's table, as the binding has it).
let positional = {};
const positionalCount = (verb) => positional[verb];

async function runSteps(host, store, steps, out, settings) {
  for (const step of steps) {
    if (step.skip_hosts && host in step.skip_hosts) { out.push({ skipped: step.skip_hosts[host] }); continue; }
    if ("scope" in step) { out.push(await runScope(host, store, step, settings)); continue; }
    if ("settings" in step) {
      const s = store.settings;
      out.push({ ok: Object.fromEntries(step.settings.map((k) => [k, [s.values[k], originClass(s.origin[k])]])) });
      continue;
    }
    try {
      out.push({ ok: normal(step.verb, await call(store, step.verb, (step.args ?? []).map(arg), step.named ?? {})) });
    } catch (e) {
      out.push({ error: e.code ?? String(e) });
    }
  }
}

async function runScope(host, store, step, settings) {
  const inner = [];
  const record = {};
  try {
    await store.withLock(step.scope, async () => {
      const waiting = "contender_wait_seconds" in step ? contender(step.scope, step.contender_wait_seconds, settings) : null;
      await sleep((step.idle_seconds ?? 0) * 1000);
      await runSteps(host, store, step.steps, inner, settings);
      if (waiting) record.contender = await waiting;
    });
    const result = { ok: "contender" in record ? { contender: record.contender } : null };
    if (inner.length) result.steps = inner;
    return result;
  } catch (e) {
    const result = { error: e.code ?? String(e), ...record };
    if (inner.length) result.steps = inner;
    return result;
  }
}

const [host, prefix] = process.argv.slice(2);
const open = await openHost(host);
const transcript = [];
for (const [n, scenario] of scenarios.scenarios.entries()) {
  const entry = { scenario: scenario.name, steps: [] };
  transcript.push(entry);
  const { uri_query: query, ...rest } = { schema: `${prefix}_${n}`, ...(scenario.open ?? {}) };
  let store;
  try {
    store = await open({ uri: uriWith(query), rest });
    entry.open = { ok: null };
  } catch (e) {
    entry.open = { error: e.code ?? String(e) };
    continue;
  }
  // The positional counts, from the store's own methods' table (the core's).
  positional = Object.fromEntries((await verbsOf(store)).map((v) => [v.name, v.args.filter((a) => a.positional).length]));
  try {
    await runSteps(host, store, scenario.steps, entry.steps, rest);
  } finally {
    await store.close();
  }
}
process.stdout.write(JSON.stringify(transcript));

async function verbsOf(store) {
  return store.core.verbs();
}
