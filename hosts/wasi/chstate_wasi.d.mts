// TypeScript declarations for chstate_wasi.mjs, the Node host of the chstate
// WebAssembly module (the npm package's entry point), and for what it
// re-exports from the shared JS binding (chstate_binding.mjs). The verbs are
// the core's table (core/verbs.h) and the settings the core's settings table
// (core/settings.h); README.md "Plugin runtimes (WebAssembly)".

/** Any JSON value. */
export type Json = null | boolean | number | string | Json[] | { [key: string]: Json };
/** A JSON object. */
export type JsonObject = { [key: string]: Json };

/** A state as the store returns it: both sides, as Meltano keeps them, and the merged view a tap gets. */
export interface StateView {
  completed: JsonObject;
  partial: JsonObject;
  merged: JsonObject;
}

/** A setting's value: seconds may be fractions; null or undefined count as not given. */
export type SettingValue = string | number | boolean | null | undefined;

/** The settings, by the core's names (docs/settings.md; core/settings.h). A uri (or host, user and
 *  database) is required; everything else has the core's default. Durations are in seconds. */
export interface Settings {
  /** clickhouse://user@host[:port][,host2[:port]]/database?secure=&schema=&table=&ca_file=... */
  uri?: SettingValue;
  host?: SettingValue;
  port?: SettingValue;
  database?: SettingValue;
  user?: SettingValue;
  /** Never shown in any message. */
  password?: SettingValue;
  secure?: SettingValue;
  schema?: SettingValue;
  table?: SettingValue;
  /** PEM file of the CA that signed the server's certificate (secure=true). */
  ca_file?: SettingValue;
  cluster?: SettingValue;
  zookeeper_path?: SettingValue;
  replica?: SettingValue;
  quorum?: SettingValue;
  quorum_timeout_seconds?: SettingValue;
  quorum_busy_seconds?: SettingValue;
  ddl_timeout_seconds?: SettingValue;
  host_down_seconds?: SettingValue;
  /** The lock's validity: a lock not renewed for this long is taken over (default 10). */
  lock_timeout_seconds?: SettingValue;
  lock_retry_seconds?: SettingValue;
  /** How long taking a held lock waits (default 2 x lock_timeout_seconds + lock_retry_seconds). */
  lock_wait_seconds?: SettingValue;
  python_locks?: SettingValue;
  linger_locks?: SettingValue;
  connect_timeout_seconds?: SettingValue;
  request_timeout_seconds?: SettingValue;
  mutation_timeout_seconds?: SettingValue;
  history_days?: SettingValue;
  history_versions?: SettingValue;
}

/** One ClickHouse server of a connection. */
export interface HostPort {
  /** A name or address; IPv6 without brackets. */
  host: string;
  port: number;
}

/** Where to connect and as whom, as the core resolved it: what a transport needs. */
export interface Connection {
  /** The first (or only) host: hosts[0]. */
  host: string;
  port: number;
  hosts: HostPort[];
  secure: boolean;
  user: string;
  password: string;
  database: string;
  /** "" when not set: the system's trust store is used. */
  ca_file: string;
  connect_timeout_ms: number;
  /** The URI without the password, for messages. */
  redacted_uri: string;
  endpoint: string;
  chdb_path: string;
}

/** What a store was opened with. */
export interface ResolvedSettings {
  connection: Connection;
  /** The store's options (lock_validity_ms, lock_wait_ms, schema, table, ...). */
  store: { [option: string]: Json };
  /** Where each setting came from ("default", "the uri setting", "MELTANO_STATE_BACKEND_...", ...). */
  origin: { [setting: string]: string };
}

/** The environment variables the core may read (MELTANO_STATE_BACKEND_*, CLICKHOUSE_*). */
export type Environment = { [name: string]: string };

/** One SQL request the core wants sent: an HTTP POST of sql to /?database=<db>&<url_params>. */
export interface HttpRequest {
  sql: string;
  url_params: Array<[string, string]>;
  /** Where to send it (one of the connection's hosts); else the connection's host and port. */
  host?: string;
  port?: number;
  purpose: string;
  idempotent: boolean;
  attempt: number;
  timeout_ms: number;
}

/** What came back: the server's answer, or why there was none. */
export type HttpResponse =
  | { transport_ok: true; http_status: number; exception_code_header: string; body_hex: string }
  | { transport_ok: false; transport_error: string; maybe_delivered: boolean };

/** Sends each request once (never resends: the core decides that). */
export interface Transport {
  (request: HttpRequest): Promise<HttpResponse>;
  /** Called by Store.close(). */
  close?(): void;
}

/** The server a store talks to. */
export interface ServerInfo {
  serverVersion: string;
  /** "clickhouse18" or "modern". */
  dialect: string;
}

/** One state of an export page. */
export interface ExportedState extends StateView {
  stateId: string;
}

/** One state to import. */
export interface ImportedState {
  stateId: string;
  completed?: JsonObject;
  partial?: JsonObject;
}

/** One version of a state in its history. */
export interface StateVersion {
  /** "<unix ms>-<8 hex digits>": what rollback() takes. */
  version: string;
  /** ISO 8601, UTC. */
  updatedAt: string;
  /** The version the state table holds now. */
  current: boolean;
  state: StateView;
}

/** A lock held now. */
export interface LockInfo {
  /** null for a lock row whose id is not a state id (a foreign backend's). */
  stateId: string | null;
  table: string;
  holder: string;
  heldS: number;
  renewedS: number;
  validityS: number;
  stale: boolean;
}

/** A verb document (core/verbs.h): { op: VERB, ... } with ids as hex; Store.run() takes any. */
export interface VerbDocument {
  op: string;
  [argument: string]: Json | undefined;
}

/** A verb's "done" document, as run() resolves to it. */
export interface Done {
  [member: string]: Json;
}

/** A row of the core's verb table. */
export interface Verb {
  name: string;
  args: { name: string; type: string; required: boolean; positional: boolean; meaning: string; field: string }[];
  lock: "none" | "id" | "scope";
  lock_note: string;
  checks: string;
  returns: string;
  summary: string;
}

/** Inside Store.withLock(). */
export interface LockScope {
  /** Renews the lease now (the binding renews it on the event loop anyway); resolves to the lock id. */
  renew(): Promise<string>;
}

/** Thrown for a failed call (and by loadChstate() when the packaged module is missing). */
export class ChstateError extends Error {
  constructor(code: string, message: string);
  /** An absl::StatusCode name: NOT_FOUND, UNAVAILABLE, ABORTED, FAILED_PRECONDITION, INVALID_ARGUMENT, ... */
  readonly code: string;
  /** The message without the code (never the password). */
  readonly detail: string;
}

/** UTF-8 text to lower-case hex, and back. */
export function hex(s: string): string;
export function unhex(h: string): string;

/** How much of what the store tells to ask the core for (docs/diagnostics.md); "none" makes nothing. */
export type DiagnosticsLevel = "none" | "warning" | "info" | "debug";

/** One thing the store told beside its results (docs/diagnostics.md). */
export interface ChstateEvent {
  /** What happened. */
  kind: "lock_waiting" | "lock_acquired" | "lease_renewed" | "lease_lost" | "lock_yielded" | "resent" | "host_down"
    | "quorum_busy" | "history_pruned" | "statement";
  /** The core's level for it: a log shows it at this level. */
  level: "warning" | "info" | "debug";
  /** The host's monotonic clock (performance.now()) when it happened, in ms. */
  atMs: number;
  /** One sentence for a person. */
  message: string;
  /** What a log line shows: the message, and for a statement its SQL (states as <state: N bytes>). */
  line: string;
  /** The state id it concerns, or null. */
  stateId: string | null;
  /** Facts by name, in ms or counts (waited_ms, attempt, took_ms, ...). */
  numbers: { [name: string]: number };
  /** Facts by name (holder, host, purpose, sql, ...). */
  texts: { [name: string]: string };
}

/** What the store tells, and at which level (open()'s options). */
export interface EventOptions {
  /** Called with each event as it comes (a throw becomes a process warning, not a failed call). */
  onEvent?: (event: ChstateEvent) => void;
  /** The level asked of the core: "info" by default when onEvent is given, else "none". */
  diagnostics?: DiagnosticsLevel;
  /** Keep states' contents in debug statements (default: shown as <state: N bytes>). */
  showStates?: boolean;
}

/** A store: its methods are the core's verbs (camelCase); calls queue and run one at a time; each
 *  rejects with ChstateError. */
export class Store {
  constructor(core: Core, handle: number, settings: ResolvedSettings, transport: Transport,
              onEvent?: ((event: ChstateEvent) => void) | null);
  /** What the store was opened with. */
  readonly settings: ResolvedSettings;
  /** The URI without the password. */
  readonly redactedUri: string;
// BEGIN GENERATED store-methods: tools/gendocs writes this block from the code; do not edit it
  /** The state of an id: both sides and the merged view a tap gets; null when the id has none. */
  get(stateId: string): Promise<StateView | null>;
  /** Replace the state of an id (both sides). Takes the id's lock unless this store holds it (inside
   * withLock). A state without a top-level "singer_state" key needs force (meltano state set refuses it too;
   * its bypass is --no-validate). */
  set(stateId: string, state: JsonObject, options?: { partial?: JsonObject; force?: boolean }): Promise<StateView>;
  /** Merge a partial state into an id as Meltano does for each STATE message: objects merge recursively,
   * lists and scalars from the input replace. Takes the id's (state_id) lock unless this store holds it
   * (inside withLock). Exactly one of partial and from; an empty partial is refused (merging nothing would
   * look like a success and change nothing); input without a top-level "singer_state" key needs force. */
  merge(stateId: string, partial?: JsonObject | null, options?: { from?: string; force?: boolean }): Promise<StateView>;
  /** Remove the state of an id (an id with no state is fine). Takes the id's lock unless this store holds it
   * (inside withLock). */
  delete(stateId: string): Promise<void>;
  /** The state ids, sorted. */
  list(pattern?: string | null): Promise<string[]>;
  /** Remove every state (no locks, as Meltano's clear_all); returns how many. */
  clearAll(): Promise<number>;
  /** Copy the state of one id to another. Takes dst's lock unless this store holds it (inside withLock). Src
   * must have a state (NOT_FOUND). */
  copy(src: string, dst: string): Promise<void>;
  /** Copy, then remove the source: a failure in between leaves both, never neither. Takes dst's, then src's
   * lock unless this store holds it (inside withLock). Src and dst differ; src must have a state (NOT_FOUND). */
  move(src: string, dst: string): Promise<void>;
  /** One page of every state (meltano state export), sorted by id; ask again after the page's last id while
   * more is true. */
  export(pattern?: string | null, options?: { after?: string; limit?: number; document?: false }):
    Promise<{ states: ExportedState[]; more: boolean }>;
  export(pattern: string | null | undefined, options: { after?: string; limit?: number; document: true }):
    Promise<{ document: string; stateIds: string[]; more: boolean }>;
  /** Write many states at once (meltano state import), in a few multi-row INSERTs. Every entry is checked
   * before anything is written (one bad entry: nothing written); ids unique. */
  import(states: ImportedState[]): Promise<number>;
  /** Import as chstate import does: the document read in one pass, without the tree of it import's states
   * make. The whole document is checked before anything is written (one bad entry: nothing written, the entry
   * named). */
  importDocument(document: string): Promise<number>;
  /** The versions of a state kept in its history, newest first. */
  history(stateId: string, options?: { limit?: number }): Promise<StateVersion[]>;
  /** Restore a version of a state (itself written as a new version). Takes the id's lock unless this store
   * holds it (inside withLock). The version looks like <unix ms>-<8 hex digits>; NOT_FOUND when not kept. */
  rollback(stateId: string, version: string): Promise<StateView>;
  /** The locks held now: by whom, since when, until when. */
  locks(pattern?: string | null): Promise<LockInfo[]>;
  /** Remove an id's lock whoever holds it (its holder loses it at its next renewal). NOT_FOUND when the id is
   * not locked. */
  unlock(stateId: string): Promise<LockInfo[]>;
  /** Create the database and tables when missing, then apply retention. */
  init(): Promise<ServerInfo>;
  /** Apply retention: drop history past its days and count, and old lock tombstones. */
  compact(): Promise<ServerInfo>;
  /** The server's version and the SQL dialect chosen. */
  ping(): Promise<ServerInfo>;
  /** Renew the lease of a lock this store holds now. FAILED_PRECONDITION when this store does not hold it;
   * ABORTED when it was lost. */
  renew(stateId: string): Promise<string>;
// END GENERATED store-methods
  /** Runs fn holding the id's lock, renewed on the event loop however long fn runs; released
   *  afterwards, also when fn throws (fn's error wins). A lock lost meanwhile rejects with ABORTED. */
  withLock<T>(id: string, fn: (scope: LockScope) => T | Promise<T>): Promise<T>;
  /** Runs one verb document to its end: its "done" document. */
  run(doc: VerbDocument): Promise<Done>;
  /** Releases what the store holds, frees it and closes the transport. */
  close(): Promise<void>;
}

/** A runtime of the core: its calls as documents (each may be async). */
export interface Core {
  verbs(): Verb[] | Promise<Verb[]>;
  storeNew(settings: JsonObject): number | Promise<number>;
  storeSettings(handle: number): ResolvedSettings | Promise<ResolvedSettings>;
  start(handle: number, text: string, nowMs: number, random: Uint8Array): JsonObject | Promise<JsonObject>;
  feed(handle: number, text: string, nowMs: number, random: Uint8Array): JsonObject | Promise<JsonObject>;
  storeFree(handle: number): void | Promise<void>;
}

/** The loaded module; its calls are the raw ABI (WasiCore makes a Core of them). */
export class ChstateModule {
  constructor(instance: { readonly exports: { readonly [name: string]: unknown } });
  /** A settings document -> { settings } or { failed }. */
  resolveSettings(doc: { from?: "api" | "cli" | "meltano"; values?: Settings; env?: Environment }):
    { settings: ResolvedSettings; failed?: undefined } | { failed: { code: string; message: string }; settings?: undefined };
  verbs(): Verb[];
  /** The module's exports. */
  readonly x: { readonly [name: string]: any };
  /** The last raw output document. */
  last: string | null;
  storeNew(settingsText: string): JsonObject;
  step(fn: "chstate_op_start" | "chstate_op_feed", handle: number, docText: string, nowMs?: bigint,
       random?: Uint8Array | null): JsonObject;
  input(data: Uint8Array, name?: string): [number, number];
  output(call: (outPtr: number, outCap: number) => number): string;
  fillRandom(): [number, number];
}

/** The module's calls as a Core. */
export class WasiCore implements Core {
  constructor(mod: ChstateModule);
  verbs(): Verb[];
  storeNew(settings: JsonObject): number;
  storeSettings(handle: number): ResolvedSettings;
  start(handle: number, text: string, nowMs: number, random: Uint8Array): JsonObject;
  feed(handle: number, text: string, nowMs: number, random: Uint8Array): JsonObject;
  storeFree(handle: number): void;
}

/** Where loadChstate() looks by default: chstate.wasm beside the module (shipped in the npm package). */
export const defaultWasmUrl: URL;

/** Compiles, instantiates and initialises chstate.wasm (by default the packaged one). */
export function loadChstate(path?: string | URL): Promise<ChstateModule>;

/** Opens a store of `core` from the settings; the core resolves them with `env` (default: this
 *  process's MELTANO_STATE_BACKEND_* and CLICKHOUSE_*). makeTransport builds the transport from the
 *  resolved connection when none is given. */
export function openStore(core: Core, settings?: Settings, options?: EventOptions & {
  transport?: Transport;
  env?: Environment;
  makeTransport?: (connection: Connection) => Transport;
}): Promise<Store>;

/** HTTP(S) to ClickHouse over node:http(s): each request to its host and port (else the
 *  connection's), keep-alive per host:port, credentials in headers, TLS verification always on
 *  (ca_file as the trust anchor when set), each request within its timeout_ms. */
export function httpTransport(connection: Connection): Transport & { close(): void };

/** Options of open(): any setting, and where the module, the transport and the environment come from. */
export interface OpenOptions extends Settings, EventOptions {
  /** chstate.wasm to load (default: the packaged one). */
  wasm?: string | URL;
  transport?: Transport;
  env?: Environment;
}

/** Opens a store in one call: the module, the settings (uri and options), httpTransport. */
export function open(uri: string, options?: OpenOptions): Promise<Store>;
