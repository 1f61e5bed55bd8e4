// TypeScript declarations for chstate_wasi.mjs, the Node host of the chstate
// WebAssembly module (the npm package's entry point). The documents are those
// of hosts/common/protocol.h; README.md "Plugin runtimes (WebAssembly)".

/** Any JSON value. */
export type Json = null | boolean | number | string | Json[] | { [key: string]: Json };
/** A JSON object. */
export type JsonObject = { [key: string]: Json };

/** One state id's two sides, as Meltano keeps them. */
export interface State {
  completed: JsonObject;
  partial: JsonObject;
}

/** A setting's value: strings, integers or booleans; null or "" count as not given. */
export type SettingValue = string | number | boolean | null;

/** What chstate.resolveConfig() reads: flags (highest precedence) and environment variables. */
export interface ConfigSources {
  flags?: {
    /** clickhouse://user[:password]@host[:port]/database?secure=&schema=&table=&ca_file=... */
    uri?: SettingValue;
    host?: SettingValue;
    port?: SettingValue;
    database?: SettingValue;
    user?: SettingValue;
    password?: SettingValue;
    secure?: SettingValue;
    schema?: SettingValue;
    table?: SettingValue;
    /** PEM file of the CA that signed the server's certificate (secure=true). */
    ca_file?: SettingValue;
    cluster?: SettingValue;
    zookeeper_path?: SettingValue;
    replica?: SettingValue;
  };
  /** The module has no environment of its own: pass the variables it may read
   *  (CLICKHOUSE_*, MELTANO_STATE_BACKEND_*), e.g. { CLICKHOUSE_PASSWORD: process.env.CLICKHOUSE_PASSWORD ?? "" }. */
  env?: { [name: string]: string };
}

/** One ClickHouse server of a connection. */
export interface HostPort {
  /** A name or address; IPv6 without brackets. */
  host: string;
  port: number;
}

/** Resolved connection settings: what httpTransport() and storeOptions() need. */
export interface Config {
  /** The first (or only) host: hosts[0]. */
  host: string;
  port: number;
  /** Every host of the connection (the host setting may be a comma-separated list; several need
   *  cluster mode); at least one. */
  hosts: HostPort[];
  secure: boolean;
  user: string;
  password: string;
  database: string;
  schema: string;
  table: string;
  /** "" when not set: the system's trust store is used. */
  ca_file: string;
  connect_timeout_ms: number;
  request_timeout_ms: number;
  cluster: string;
  zookeeper_path: string;
  replica: string;
  /** The URI without the password, for messages. */
  redacted_uri: string;
  /** Where each setting came from ("--uri flag", "CLICKHOUSE_PASSWORD", "default", ...). */
  origin: { [setting: string]: string };
}

/** An error document: code is an absl::StatusCode name (NOT_FOUND, UNAVAILABLE, ...). */
export interface Failed {
  code: string;
  message: string;
}

/** resolveConfig()'s answer: exactly one of config and failed is present. */
export type ResolveResult = { config: Config; failed?: undefined } | { failed: Failed; config?: undefined };

/** Store options (all optional; the core's defaults otherwise). */
export interface StoreOptions {
  schema?: string;
  table?: string;
  /** The server, for messages. */
  endpoint?: string;
  lock_timeout_ms?: number;
  lock_retry_ms?: number;
  stale_lock_ms?: number;
  mutation_timeout_ms?: number;
  request_timeout_ms?: number;
  /** Days each state version is kept in the history (default 30; 0: no history table). */
  history_days?: number;
  cluster?: string;
  zookeeper_path?: string;
  replica?: string;
  /** The connection's hosts (config.hosts): the core picks one for every request. */
  hosts?: HostPort[];
}

/** One SQL request the core wants sent: an HTTP POST of sql to /?database=<db>&<url_params>. */
export interface HttpRequest {
  sql: string;
  url_params: Array<[string, string]>;
  /** Where to send it (one of the store's hosts); absent when the store was given no hosts. */
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

/** The result of a finished operation. */
export interface Done {
  state: (State & { state_id_hex: string }) | null;
  state_ids_hex: string[];
  count: number;
  server_version: string;
  dialect: string;
  lock_id: string;
  waited_ms: number;
  /** When a held lock needs renewing: run { op: "tick" } once this (ms on the host's clock) has passed. */
  next_timeout_ms: number | null;
  /** export_page: one page of states, sorted by id, and whether another page follows. */
  states?: (State & { state_id_hex: string })[];
  more?: boolean;
  /** history: the versions, newest first. */
  versions?: StateVersion[];
}

/** One version of a state in its history ("<unix ms>-<8 hex digits>"). */
export interface StateVersion {
  version: string;
  unix_ms: number;
  /** ISO 8601, UTC. */
  updated_at: string;
  /** The version the state table holds now. */
  current: boolean;
  state: State;
}

/** An operation document (hosts/common/protocol.h). Ids and patterns are hex-encoded UTF-8. */
export type Op =
  | { op: "ping" | "init" | "clear_all" | "tick" }
  | { op: "get" | "delete" | "delete_locked" | "acquire_lock" | "renew_lock"; state_id_hex: string }
  | { op: "set" | "set_locked" | "update"; state_id_hex: string; state: State }
  | { op: "release_lock"; state_id_hex: string; lock_id: string }
  | { op: "list"; pattern: string | null }
  | { op: "list"; pattern_hex: string }
  | { op: "copy" | "move"; src_hex: string; dst_hex: string }
  | { op: "export_page"; pattern?: string | null; pattern_hex?: string; after_hex?: string; limit?: number }
  | { op: "import"; states: (State & { state_id_hex: string })[] }
  | { op: "history"; state_id_hex: string; limit?: number }
  | { op: "rollback"; state_id_hex: string; version: string };

/** Thrown for a failed operation (and by loadChstate() when the packaged module is missing). */
export class ChstateError extends Error {
  constructor(code: string, message: string);
  /** An absl::StatusCode name: NOT_FOUND, UNAVAILABLE, FAILED_PRECONDITION, INVALID_ARGUMENT, ... */
  readonly code: string;
  /** The message without the code. */
  readonly detail: string;
}

/** UTF-8 text to lower-case hex, and back. */
export function hex(s: string): string;
export function unhex(h: string): string;

/** Inside Store.withLock(). */
export interface LockHandle {
  /** Writes the state within the lock's lease. */
  setLocked(state: State): Promise<Done>;
  /** Renews the lease. */
  renew(): Promise<Done>;
}

/** A store: one operation at a time (calls queue), each driven to its end. */
export class Store {
  constructor(mod: ChstateModule, handle: number, transport: Transport);
  /** Runs one operation document; resolves to its result or rejects with ChstateError. */
  run(op: Op): Promise<Done>;
  /** Both sides of the id's state, or null when there is none. */
  get(id: string): Promise<State | null>;
  set(id: string, state: State): Promise<Done>;
  /** Merges `partial` into the id's partial state under its lock (Meltano's update()). */
  merge(id: string, partial: JsonObject): Promise<Done>;
  /** The ids matching a glob-like pattern ("dev:*"), or all ids. */
  list(pattern?: string | null): Promise<string[]>;
  delete(id: string): Promise<Done>;
  /** Deletes every state; resolves to how many there were. */
  clearAll(): Promise<number>;
  /** The versions kept in the id's state history, newest first (at most `limit`, default 20). */
  history(id: string, limit?: number | null): Promise<StateVersion[]>;
  /** Restores a version (as history() names it) under the id's lock; resolves to the restored state. */
  rollback(id: string, version: string): Promise<State>;
  /** Runs fn while holding the id's lock, releasing it afterwards (also when fn throws). */
  withLock<T>(id: string, fn: (lock: LockHandle) => T | Promise<T>): Promise<T>;
  /** Frees the store in the module and closes the transport. */
  close(): void;
}

/** The loaded module. resolveConfig() and openStore() are the API; the rest is the raw ABI for tests. */
export class ChstateModule {
  constructor(instance: { readonly exports: { readonly [name: string]: unknown } });
  resolveConfig(sources: ConfigSources): ResolveResult;
  /** Creates a store over the given transport; throws ChstateError for bad options. */
  openStore(options: StoreOptions | null | undefined, transport: Transport): Store;
  /** The module's exports. */
  readonly x: { readonly [name: string]: any };
  /** The last raw output document. */
  last: string | null;
  storeNew(optionsText: string): { store: number; failed?: undefined } | { failed: Failed; store?: undefined };
  step(fn: "chstate_op_start" | "chstate_op_feed", handle: number, docText: string, nowMs?: bigint):
    { request: HttpRequest } | { wait_ms: number } | { done: Done } | { failed: Failed };
  input(data: Uint8Array, name?: string): [number, number];
  output(call: (outPtr: number, outCap: number) => number): string;
  fillRandom(): [number, number];
}

/** Where loadChstate() looks by default: chstate.wasm beside the module (shipped in the npm package). */
export const defaultWasmUrl: URL;

/** Compiles, instantiates and initialises chstate.wasm (by default the packaged one). */
export function loadChstate(path?: string | URL): Promise<ChstateModule>;

/** The store options a resolved config implies: schema, table, the cluster settings when a cluster
 *  is named, and hosts; `extra` adds or overrides options. */
export function storeOptions(config: Config, extra?: StoreOptions): StoreOptions;

/** HTTP(S) to ClickHouse over node:http(s): each request to its host and port (else config's),
 *  keep-alive per host:port, credentials in headers, TLS verification always on (config.ca_file as
 *  the trust anchor when set), each request within its timeout_ms. */
export function httpTransport(config: Config): Transport & { close(): void };
