// TypeScript declarations for chstate_extism.mjs ("chstate-wasi/extism"): the
// JS binding of chstate's verbs over the Extism plugin (chstate_extism.wasm)
// with Extism's JS SDK. The Store, settings and errors are those of the
// node:wasi host (chstate_wasi.d.mts).
import type { Core, Environment, JsonObject, OpenOptions, ResolvedSettings, Store, Verb } from "./chstate_wasi.mjs";

export { ChstateError, Store } from "./chstate_wasi.mjs";
export type { ChstateEvent, DiagnosticsLevel } from "./chstate_wasi.mjs";

/** What the plugin logs through: Extism's logger (a Console; the SDK's default is console). */
export interface ExtismLogger {
  info(message: string): void;
  debug(message: string): void;
  warn(message: string): void;
  error(message: string): void;
}

/** open()'s options: those of the node:wasi host, and the logger the plugin logs what the store tells
 *  through (given to createPlugin; with it, diagnostics defaults to "info"). */
export interface ExtismOpenOptions extends OpenOptions {
  logger?: ExtismLogger;
}

/** What the binding needs of an Extism plugin (@extism/extism's Plugin). */
export interface ExtismPlugin {
  call(name: string, input: string): Promise<{ text(): string } | null>;
  close?(): Promise<void>;
}

/** How open() makes the plugin: @extism/extism's createPlugin (the default export). */
export type CreatePlugin = (source: string | URL,
                             options: { useWasi: boolean; logger?: ExtismLogger; logLevel?: string }) =>
  Promise<ExtismPlugin>;

/** The plugin's exports as a Core of the binding. */
export class ExtismCore implements Core {
  constructor(plugin: ExtismPlugin);
  readonly plugin: ExtismPlugin;
  verbs(): Promise<Verb[]>;
  storeNew(settings: JsonObject): Promise<number>;
  storeSettings(handle: number): ResolvedSettings;
  start(handle: number, text: string, nowMs: number, random: Uint8Array): Promise<JsonObject>;
  feed(handle: number, text: string, nowMs: number, random: Uint8Array): Promise<JsonObject>;
  storeFree(handle: number): Promise<void>;
}

/** Opens a store in one call: the plugin (chstate_extism.wasm beside this module, or options.wasm)
 *  made by createPlugin with WASI and no other authority, the settings by chstate's names. */
export function open(createPlugin: CreatePlugin, uri: string, options?: ExtismOpenOptions): Promise<Store>;

export type { Environment };
