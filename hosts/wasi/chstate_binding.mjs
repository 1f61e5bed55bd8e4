// chstate's verbs in JavaScript: one binding for every JS runtime of the core
// (the WebAssembly module under node:wasi, the Extism plugin). The core
// decides everything: settings and their defaults, the verbs and their
// checks, the SQL, resends, the lock and its renewal. A runtime supplies a
// core (its calls, as documents); this file supplies the pump (each request
// sent once, waits slept, the clock and random bytes passed), the idle timer
// on the event loop, and JavaScript's idioms: a Store whose methods are made
// from the core's verb table (camelCase), withLock, ChstateError.
//
//   const store = await openStore(core, { uri: "clickhouse://meltano@localhost:8123/default" });
//   await store.set("dev:tap", { singer_state: { bookmarks: {} } });
//   await store.withLock("dev:tap", async () => { ... });   // renewed on the event loop while it runs
//   console.log((await store.get("dev:tap")).merged);
//   await store.close();
//
// Methods take the verb's positional arguments in its row's order, then an
// object of the others: store.set(id, state, { force: true }),
// store.history(id, { limit: 5 }). Every call returns a Promise; calls on
// one store run one at a time.
//
// What the store tells beside its results (a wait for a lock another
// process holds, a request sent again, a host marked down, each statement at
// debug: docs/diagnostics.md) goes to the `onEvent(event)` option of open(),
// at the level `diagnostics` asks the core for ("info" by default when
// onEvent is given, else "none": nothing is made).
import { webcrypto } from "node:crypto";
import { performance } from "node:perf_hooks";

export class ChstateError extends Error {
  constructor(code, message) {
    super(`${code}: ${message}`);
    this.code = code;
    this.detail = message;
  }
}

export const failed = (doc) => new ChstateError(doc.failed?.code ?? "UNKNOWN", doc.failed?.message ?? JSON.stringify(doc));
export const hex = (s) => Buffer.from(s, "utf8").toString("hex");
export const unhex = (h) => Buffer.from(h, "hex").toString("utf8");
const camel = (name) => name.replace(/_([a-z])/g, (_, c) => c.toUpperCase());
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
const nowMs = () => Math.floor(performance.now());
const random32 = () => webcrypto.getRandomValues(new Uint8Array(32));

// The variables the core reads (MELTANO_STATE_BACKEND_*, CLICKHOUSE_*).
export function environment() {
  return Object.fromEntries(Object.entries(process.env).filter(([k]) =>
    k.startsWith("MELTANO_STATE_BACKEND_") || k.startsWith("CLICKHOUSE_")));
}

const LEVELS = ["none", "warning", "info", "debug"];

// One "events" entry of an action document as JavaScript gets it.
const eventOf = (e) => ({
  kind: e.kind, level: e.level, atMs: e.at_ms, message: e.message, line: e.line ?? e.message,
  stateId: e.state_id_hex === undefined ? null : unhex(e.state_id_hex), numbers: e.numbers ?? {}, texts: e.texts ?? {},
});

const state = (s) => (s == null ? null : { completed: s.completed ?? {}, partial: s.partial ?? {}, merged: s.merged ?? {} });

// What each kind of result ("returns" in the verb table) is in JavaScript.
const RETURNS = {
  nothing: () => undefined,
  server: (d) => ({ serverVersion: d.server_version, dialect: d.dialect }),
  state: (d) => state(d.state),
  maybe_state: (d) => state(d.state),
  state_ids: (d) => d.state_ids_hex.map(unhex),
  count: (d) => d.count,
  page: (d) => (d.document !== undefined
    ? { document: d.document, stateIds: d.state_ids_hex.map(unhex), more: d.more }  // with { document: true }
    : { states: d.states.map((s) => ({ stateId: unhex(s.state_id_hex), ...state(s) })), more: d.more }),
  versions: (d) => d.versions.map((v) => ({ version: v.version, updatedAt: v.updated_at, current: v.current,
                                             state: state(v.state) })),
  locks: (d) => d.locks.map((l) => ({ stateId: l.state_id_hex === null ? null : unhex(l.state_id_hex), table: l.table,
                                      holder: l.holder, heldS: l.held_s, renewedS: l.renewed_s,
                                      validityS: l.validity_s, stale: l.stale })),
  lock: (d) => d.lock_id,
};

// One argument into its document member; JS values the core cannot take
// are named here (a state id must be a string).
function put(verb, arg, value, doc) {
  if (value === undefined || value === null) return;
  switch (arg.type) {
    case "state_id":
      if (typeof value !== "string") throw new ChstateError("INVALID_ARGUMENT", `${verb}: ${arg.name} must be a string`);
      doc[arg.field] = hex(value);
      break;
    case "pattern":
      if (typeof value !== "string") throw new ChstateError("INVALID_ARGUMENT", `${verb}: pattern must be a string`);
      doc.pattern_hex = hex(value);
      break;
    case "states":
      doc[arg.field] = value.map((s) => ({ state_id_hex: hex(s.stateId ?? s.state_id), completed: s.completed ?? {},
                                           partial: s.partial ?? {} }));
      break;
    default:
      doc[arg.field] = value;
  }
}

// One store of a core, opened from the user's settings as given.
export class Store {
  // `core`: { verbs(), storeNew(doc) -> handle (throws ChstateError),
  // storeSettings(handle), start(handle, text, nowMs, random), feed(...),
  // storeFree(handle) }, each maybe async.
  constructor(core, handle, settings, transport, onEvent = null) {
    this.core = core;
    this.handle = handle;
    this.settings = settings;
    this.transport = transport;
    this.onEvent = onEvent;  // what the store tells, each event as it comes
    this.onEventFailed = false;
    this.queue = Promise.resolve();
    this.nextTickMs = null;  // when the core next wants its idle timer
    this.timer = null;
  }

  get redactedUri() { return this.settings.connection.redacted_uri; }

  // Each event to onEvent; a callback that throws does not stop the
  // operation (its first error becomes a process warning).
  #tell(events) {
    if (!this.onEvent) return;
    for (const e of events) {
      try {
        this.onEvent(eventOf(e));
      } catch (err) {
        if (this.onEventFailed) continue;
        this.onEventFailed = true;
        process.emitWarning(`chstate: onEvent threw on a ${e.kind} event (later ones are not shown): ${err?.stack ?? err}`);
      }
    }
  }

  async #answer(action) {
    for (;;) {
      if (action.events) this.#tell(action.events);
      if (action.request) {
        // Sent once: whether a failed request goes again is the core's call.
        const response = await this.transport(action.request);
        action = await this.core.feed(this.handle, JSON.stringify({ response }), nowMs(), random32());
      } else if (action.wait_ms !== undefined) {
        await sleep(action.wait_ms);
        action = await this.core.feed(this.handle, '{"timer":true}', nowMs(), random32());
      } else {
        return action;
      }
    }
  }

  #note(action) {
    const body = action.done ?? action.idle;
    if (body) this.nextTickMs = body.next_timeout_ms ?? null;
    this.#schedule();
  }

  // The core's idle timer on the event loop while it holds a lock (held or
  // lingering): renewals run while the caller's code does. unref: a timer
  // alone does not keep a process alive.
  #schedule() {
    if (this.timer) clearTimeout(this.timer);
    this.timer = null;
    if (this.nextTickMs === null || this.handle === null) return;
    this.timer = setTimeout(() => {
      this.timer = null;
      this.#enqueue(() => this.#tick()).catch(() => {});
    }, Math.max(0, this.nextTickMs - nowMs()));
    this.timer.unref?.();
  }

  // A lock found lost is the core's to report: at the scope's release, and
  // to any write under it.
  async #tick() {
    if (this.handle === null || this.nextTickMs === null) return;
    if (nowMs() < this.nextTickMs) {
      // Not due yet: Node's timers may fire a millisecond early (the loop's
      // whole-millisecond clock against performance.now()). Wait again, or
      // the idle timer, and with it a lock scope's renewals, would stop.
      this.#schedule();
      return;
    }
    const action = await this.#answer(await this.core.feed(this.handle, '{"timer":true}', nowMs(), random32()));
    if (action.failed) this.nextTickMs = null;
    this.#note(action);
  }

  #enqueue(fn) {
    const next = this.queue.then(fn);
    this.queue = next.catch(() => {});
    return next;
  }

  // Runs one verb document (core/verbs.h) to its end: its "done" document,
  // or throws ChstateError. States carry their merged view.
  run(doc) {
    return this.#enqueue(async () => {
      if (this.handle === null) throw new ChstateError("FAILED_PRECONDITION", "the store was closed");
      await this.#tick();
      const action = await this.#answer(
        await this.core.start(this.handle, JSON.stringify({ ...doc, merged: true }), nowMs(), random32()));
      this.#note(action);
      if (action.failed) throw failed(action);
      return action.done;
    });
  }

  // Runs fn() holding the id's lock (a lock scope), renewed on the event loop
  // while fn runs however long; released afterwards, also when fn throws
  // (fn's error wins). A lock lost while fn ran rejects with ABORTED.
  async withLock(id, fn) {
    const idHex = hex(id);
    const { lock_id } = await this.run({ op: "acquire", state_id_hex: idHex });
    let ok = false;
    try {
      const result = await fn({ renew: () => this.renew(id) });
      ok = true;
      return result;
    } finally {
      try {
        await this.run({ op: "release", state_id_hex: idHex, lock_id });
      } catch (e) {
        if (ok) throw e;  // otherwise fn's error is the one thrown
      }
    }
  }

  // Releases every lock the store holds or keeps lingering, then frees it.
  close() {
    return this.#enqueue(async () => {
      if (this.handle === null) return;
      if (this.timer) clearTimeout(this.timer);
      try {
        await this.#answer(await this.core.start(this.handle, '{"close":true}', nowMs(), random32()));
      } catch { /* best effort: a lock whose release fails expires */ }
      await this.core.storeFree(this.handle);
      this.handle = null;
      this.transport.close?.();
    });
  }
}

let bound = false;

// Makes a Store method of every verb of the table (camelCase), but the lock
// scope's ends (acquire and release are withLock).
export function bindVerbs(verbs) {
  if (bound) return;
  bound = true;
  for (const verb of verbs) {
    if (verb.name === "acquire" || verb.name === "release") continue;
    const positional = verb.args.filter((a) => a.positional);
    const named = Object.fromEntries(verb.args.filter((a) => !a.positional).map((a) => [camel(a.name), a]));
    Store.prototype[camel(verb.name)] = async function (...args) {
      const doc = { op: verb.name };
      positional.forEach((arg, i) => put(verb.name, arg, args[i], doc));
      const options = args[positional.length];
      if (args.length > positional.length + 1) {
        throw new ChstateError("INVALID_ARGUMENT", `${camel(verb.name)} takes ${positional.length} arguments and an options object`);
      }
      if (options !== undefined && options !== null) {
        if (typeof options !== "object") throw new ChstateError("INVALID_ARGUMENT", `${camel(verb.name)}: options must be an object`);
        for (const [k, v] of Object.entries(options)) {
          const arg = named[k];
          if (!arg) {
            throw new ChstateError("INVALID_ARGUMENT", `${camel(verb.name)}: unknown option "${k}" (options: ${Object.keys(named).join(", ") || "none"})`);
          }
          put(verb.name, arg, v, doc);
        }
      }
      return RETURNS[verb.returns](await this.run(doc));
    };
  }
}

// Opens a store of `core` from the user's settings (the core's names: uri,
// password, lock_timeout_seconds, ...), resolved by the core with `env`
// (default: this process's MELTANO_STATE_BACKEND_* and CLICKHOUSE_*).
// `transport(request) -> Promise<response>` runs one request; `makeTransport`
// builds one from the resolved connection when none is given. `onEvent`,
// `diagnostics` and `showStates`: what the store tells (see above; showStates
// keeps states' contents in debug statements).
export async function openStore(core, settings = {},
                                { transport, env, makeTransport, onEvent, diagnostics, showStates } = {}) {
  if (onEvent !== undefined && onEvent !== null && typeof onEvent !== "function") {
    throw new ChstateError("INVALID_ARGUMENT", "onEvent must be a function (event) => void");
  }
  const level = diagnostics ?? (onEvent ? "info" : "none");
  if (!LEVELS.includes(level)) {
    throw new ChstateError("INVALID_ARGUMENT", `diagnostics must be one of ${LEVELS.join(", ")}, not ${JSON.stringify(level)}`);
  }
  bindVerbs(await core.verbs());
  const values = Object.fromEntries(Object.entries(settings).filter(([, v]) => v !== undefined && v !== null));
  const handle = await core.storeNew({ from: "api", values, env: env ?? environment(),
                                       host: { timers: true, exit_release: false, diagnostics: level,
                                               show_states: Boolean(showStates) } });
  const resolved = await core.storeSettings(handle);
  // store.settings: what the core resolved (values, origins), without the password.
  const { password, ...shown } = resolved.connection;
  return new Store(core, handle, { ...resolved, connection: shown }, transport ?? makeTransport(resolved.connection),
                   onEvent ?? null);
}
