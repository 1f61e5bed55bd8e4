"""hosts/wasi as the npm package chstate-wasi (hosts/wasi/pack.sh).

The tarball holds exactly the JS binding of the verbs (chstate_binding.mjs),
the node:wasi host and its TypeScript declarations, the Extism host (the
"./extism" export), the npm README, package.json and the two WebAssembly
modules built by Bazel (the source tree never holds a .wasm). Installed with
`npm install <tarball>` (offline: the package has no dependencies) into a
scratch project outside the checkout, it is imported by name, opens a store
in one call from its packaged chstate.wasm, and works against the real
ClickHouse 18.16: over HTTP, and over HTTPS with ca_file (tests/tls's CA and
TLS server, reused). The declarations type-check a correct use and reject
wrong ones, and declare every verb of the core's table and every setting
(tsc from $CHSTATE_TSC, PATH, or `npm install typescript@5` in the scratch
project; skipped only if none can be had).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import uuid
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
HOST_DIR = REPO / "hosts" / "wasi"
sys.path.insert(0, str(REPO / "tests" / "tls"))
from test_tls import tls  # noqa: E402,F401  (the CA and the HTTPS ClickHouse of tests/tls)

PACKAGE = json.loads((HOST_DIR / "package.json").read_text())
NAME = PACKAGE["name"]

# Imports the package by name and drives one scenario; prints JSON lines.
SCRIPT = r"""
import { open, ChstateError, defaultWasmUrl } from "%(name)s";
import * as extism from "%(name)s/extism";
import { fileURLToPath } from "node:url";

const out = (o) => console.log(JSON.stringify(o));
out({ module: fileURLToPath(import.meta.resolve("%(name)s")), wasm: fileURLToPath(defaultWasmUrl),
      extism: fileURLToPath(import.meta.resolve("%(name)s/extism")), extism_open: typeof extism.open });
// No wasm option: the packaged chstate.wasm. The password comes from CLICKHOUSE_PASSWORD (the core reads it).
let store;
try {
  store = await open(process.env.CHSTATE_NPM_URI);
} catch (e) {
  if (!(e instanceof ChstateError)) throw e;
  out({ error: e.code, detail: e.detail });
  process.exit(0);
}
const connection = store.settings.connection;
out({ secure: connection.secure, ca_file: connection.ca_file });
const state = (tag) => ({ singer_state: { bookmarks: { users: { id: tag } } } });
try {
  if (process.argv[2] === "full") {
    await store.init();
    await store.set("npm:a", state(1));
    await store.set("npm:kept", state(2));
    await store.merge("npm:a", { singer_state: { bookmarks: { orders: { id: 7 } } } });
    out({ get: await store.get("npm:a") });
    out({ list: await store.list("npm:*") });
    await store.delete("npm:a");
    out({ deleted: await store.get("npm:a"), list: await store.list("npm:*") });
  } else {
    await store.set("npm:tls", state("tls"));
    out({ get: await store.get("npm:tls") });
  }
} catch (e) {
  if (!(e instanceof ChstateError)) throw e;
  out({ error: e.code, detail: e.detail });
} finally {
  await store.close();
}
"""

GOOD_TS = r"""
import { open as openExtism, ExtismCore, type CreatePlugin } from "%(name)s/extism";
declare const createPlugin: CreatePlugin;
import { open, openStore, loadChstate, httpTransport, WasiCore, ChstateError, type StateView, type Settings,
         type LockInfo, type StateVersion, type Connection, type ChstateEvent } from "%(name)s";

const store = await open("clickhouse://u@127.0.0.1:8123/default", { password: "", lock_timeout_seconds: 1.5,
                                                                    history_days: 7, wasm: "./chstate.wasm" });
const settings: Settings = { uri: "clickhouse://u@127.0.0.1/default", port: 8123, secure: false };
const told: ChstateEvent[] = [];
const watched = await open("clickhouse://u@127.0.0.1:8123/default", {
  onEvent: (e: ChstateEvent) => { told.push(e); console.log(e.kind, e.level, e.line, e.stateId?.length, e.numbers.attempt); },
  diagnostics: "debug", showStates: false });
await watched.close();
const other = await openStore(new WasiCore(await loadChstate()), settings,
                              { env: {}, makeTransport: (c: Connection) => httpTransport(c) });
const w: StateView = await store.set("dev:a", { singer_state: { bookmarks: {} } }, { partial: {}, force: false });
const got: StateView | null = await store.get("dev:a");
const m: StateView = await store.merge("dev:a", { singer_state: { bookmarks: { users: { id: 42 } } } });
await store.merge("dev:b", null, { from: "dev:a" });
const ids: string[] = await store.list("dev:*");
const all: string[] = await store.list();
const n: number = await store.clearAll();
await store.copy("dev:a", "dev:c");
await store.move("dev:c", "dev:d");
const page = await store.export(null, { after: "dev:a", limit: 10 });
const more: boolean = page.more;
const first: string | undefined = page.states[0]?.stateId;
const k: number = await store.import([{ stateId: "dev:e", completed: { singer_state: {} } }]);
const versions: StateVersion[] = await store.history("dev:a", { limit: 5 });
const back: StateView = await store.rollback("dev:a", versions[0].version);
const locks: LockInfo[] = await store.locks("dev:*");
const removed: LockInfo[] = await store.unlock("dev:a");
const { serverVersion, dialect } = await store.ping();
await store.init();
await store.compact();
const r: string = await store.withLock("dev:a", async (scope) => {
  await store.set("dev:a", { singer_state: {} });
  const lockId: string = await scope.renew();
  return lockId + (await store.renew("dev:a"));
});
const done = await store.run({ op: "get", state_id_hex: "6465763a61" });
try {
  await store.delete("dev:a");
} catch (e) {
  if (e instanceof ChstateError) console.log(e.code.length, e.detail.length);
}
await store.close();
await other.close();
const viaExtism = await openExtism(createPlugin, "clickhouse://u@h/db", { history_versions: 5 });
const logged = await openExtism(createPlugin, "clickhouse://u@h/db", { logger: console, diagnostics: "info",
                                                                      onEvent: (e) => console.log(e.line) });
await logged.close();
const sameStore: StateView | null = await viaExtism.get("dev:a");
const third = await openStore(new ExtismCore(await createPlugin("chstate_extism.wasm", { useWasi: true })), settings);
await viaExtism.withLock("dev:a", () => viaExtism.merge("dev:a", { singer_state: {} }));
console.log(sameStore, third);
console.log(w, got, m, ids, all, n, more, first, k, back, locks, removed, serverVersion, dialect, r, done,
            store.redactedUri, store.settings.connection.hosts[0].port);
"""

# Each line is a wrong use tsc must report (the error's line is checked).
BAD_TS = [
    'await open("clickhouse://u@h/db", { lock_timeout_ms: 1000 });',  # a renamed setting
    'await open("clickhouse://u@h/db", { colour: "blue" });',  # no such setting
    'await store.set("dev:a", { singer_state: {} }, { partial: 1 });',  # partial is an object
    'const ids: number[] = await store.list("dev:*");',  # ids are strings
    "await open(42);",  # the uri is a string
    'const gone: StateView = await store.get("dev:a");',  # may be null
    'await store.history("dev:a", 5);',  # limit goes in the options
    'await store.acquire("dev:a");',  # the lock scope is withLock
    'const t = httpTransport({ host: "h" });',  # a resolved Connection
    'await openExtism("clickhouse://u@h/db");',  # the plugin's maker comes first
    'await open("clickhouse://u@h/db", { diagnostics: "loud" });',  # a level the core has
    'await open("clickhouse://u@h/db", { onEvent: (e: { kind: number }) => e });',  # events' kinds are names
    'await openExtism(async () => ({ call: async () => null }), "clickhouse://u@h/db", { logger: { info: 1 } });',  # a Console
]
BAD_PRELUDE = r"""
import { open, httpTransport, type StateView } from "%(name)s";
import { open as openExtism } from "%(name)s/extism";
const store = await open("clickhouse://u@h/db");
"""


def clean_env(**extra: str) -> dict:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("CLICKHOUSE_", "MELTANO_", "CHSTATE_")) and k not in ("NODE_PATH", "NODE_OPTIONS")}
    env.update(extra)
    return env


@pytest.fixture(scope="module")
def tarball(tmp_path_factory, wasm_path, extism_path) -> Path:
    out = tmp_path_factory.mktemp("npm-dist")
    built = subprocess.run([str(HOST_DIR / "pack.sh"), str(out)],
                           env=clean_env(CHSTATE_WASM=str(wasm_path), CHSTATE_EXTISM_WASM=str(extism_path)),
                           capture_output=True, text=True, timeout=600)
    assert built.returncode == 0, built.stderr
    path = Path(built.stdout.split()[-1])
    assert path.parent == out and path.name == f"{NAME}-{PACKAGE['version']}.tgz", built.stdout
    return path


@pytest.fixture(scope="module")
def project(tmp_path_factory, tarball) -> Path:
    """A scratch ESM project, outside the checkout, with only the tarball installed."""
    folder = tmp_path_factory.mktemp("npm-project")
    assert REPO not in folder.parents and folder != REPO
    (folder / "package.json").write_text(json.dumps({"name": "scratch", "private": True, "type": "module"}))
    installed = subprocess.run(["npm", "install", "--offline", "--no-audit", "--no-fund", "--ignore-scripts",
                                str(tarball)], cwd=folder, env=clean_env(), capture_output=True, text=True,
                               timeout=300)
    assert installed.returncode == 0, installed.stdout + installed.stderr
    (folder / "scenario.mjs").write_text(SCRIPT % {"name": NAME})
    return folder


def run_scenario(project: Path, mode: str, uri: str, password: str) -> list[dict]:
    result = subprocess.run(["node", "--no-warnings", "scenario.mjs", mode], cwd=project, capture_output=True,
                            text=True, timeout=120,
                            env=clean_env(CHSTATE_NPM_URI=uri, CLICKHOUSE_PASSWORD=password))
    assert result.returncode == 0, result.stderr
    assert password not in result.stdout + result.stderr
    lines = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    # The installed copy was imported by name, and its own chstate.wasm loaded.
    where = lines[0]
    installed = project / "node_modules" / NAME
    assert where == {"module": str(installed / "chstate_wasi.mjs"), "wasm": str(installed / "chstate.wasm"),
                     "extism": str(installed / "chstate_extism.mjs"), "extism_open": "function"}
    return lines[1:]


SHIPPED_SOURCES = ("chstate_wasi.mjs", "chstate_wasi.d.mts", "chstate_binding.mjs", "chstate_extism.mjs",
                   "chstate_extism.d.mts", "README.md")


def test_tarball_holds_the_hosts_the_types_and_the_modules(tarball, wasm_path, extism_path):
    with tarfile.open(tarball) as tar:
        names = sorted(tar.getnames())
        packed_wasm = tar.extractfile("package/chstate.wasm").read()
        packed_extism = tar.extractfile("package/chstate_extism.wasm").read()
        packed = json.loads(tar.extractfile("package/package.json").read())
        for member in SHIPPED_SOURCES:
            assert tar.extractfile(f"package/{member}").read() == (HOST_DIR / member).read_bytes(), member
    assert names == sorted(f"package/{n}" for n in ("package.json", *SHIPPED_SOURCES, "chstate.wasm",
                                                      "chstate_extism.wasm"))
    assert packed_wasm == wasm_path.read_bytes() and packed_extism == extism_path.read_bytes()
    assert packed["type"] == "module" and packed["engines"] == {"node": ">=18"}
    assert packed["exports"]["."] == {"types": "./chstate_wasi.d.mts", "default": "./chstate_wasi.mjs"}
    assert packed["exports"]["./extism"] == {"types": "./chstate_extism.d.mts", "default": "./chstate_extism.mjs"}
    assert packed.get("dependencies", {}) == {} and "scripts" not in packed
    # Nothing was left in the source tree.
    assert not list(HOST_DIR.glob("*.wasm")) and not list(HOST_DIR.glob("*.tgz"))


def test_installed_package_against_clickhouse(project, clickhouse):
    schema = f"npm_{uuid.uuid4().hex[:8]}"
    uri = f"clickhouse://{clickhouse.user}@{clickhouse.host}:{clickhouse.port}/default?schema={schema}"
    try:
        config, got, listed, deleted = run_scenario(project, "full", uri, clickhouse.password)
        assert config == {"secure": False, "ca_file": ""}
        assert got == {"get": {"completed": {"singer_state": {"bookmarks": {"users": {"id": 1}}}},
                               "partial": {"singer_state": {"bookmarks": {"orders": {"id": 7}}}},
                               "merged": {"singer_state": {"bookmarks": {"users": {"id": 1}, "orders": {"id": 7}}}}}}
        assert listed == {"list": ["npm:a", "npm:kept"]}
        assert deleted == {"deleted": None, "list": ["npm:kept"]}
        # What the package wrote is what the server holds.
        assert clickhouse.sql(f"SELECT state_id FROM {schema}.state FINAL ORDER BY state_id").split() == ["npm:kept"]
        assert json.loads(clickhouse.sql(f"SELECT completed_state FROM {schema}.state FINAL")) == \
            {"singer_state": {"bookmarks": {"users": {"id": 2}}}}
    finally:
        clickhouse.sql(f"DROP DATABASE IF EXISTS {schema}")


def test_installed_package_over_https_with_ca_file(project, tls):
    s, port = tls["server"], tls["https_port"]
    schema = f"npm_tls_{uuid.uuid4().hex[:8]}"
    base = f"clickhouse://{s.user}@127.0.0.1:{port}/default?secure=true&schema={schema}"
    try:
        config, got = run_scenario(project, "tls", f"{base}&ca_file={tls['ca']}", s.password)
        assert config == {"secure": True, "ca_file": str(tls["ca"])}
        assert got == {"get": {"completed": {"singer_state": {"bookmarks": {"users": {"id": "tls"}}}},
                               "partial": {}, "merged": {"singer_state": {"bookmarks": {"users": {"id": "tls"}}}}}}
        # The wrong CA fails closed: ca_file is what is trusted, not anything that answers.
        config, failed = run_scenario(project, "tls", f"{base}&ca_file={tls['wrong_ca']}", s.password)
        assert failed["error"] == "UNAVAILABLE" and "cert" in failed["detail"].lower(), failed
    finally:
        s.sql(f"DROP DATABASE IF EXISTS {schema}")


def test_checkout_without_a_packaged_module_says_where_to_get_one():
    """In the source tree chstate.wasm is not beside the host: loadChstate()
    with no path names the file it looked for and how to build one."""
    probe = ("import { loadChstate, ChstateError } from './chstate_wasi.mjs';"
             "try { await loadChstate(); console.log('loaded'); }"
             "catch (e) { console.log(JSON.stringify([e instanceof ChstateError, e.code, e.detail])); }")
    result = subprocess.run(["node", "--no-warnings", "--input-type=module", "-e", probe], cwd=HOST_DIR,
                            capture_output=True, text=True, timeout=60, env=clean_env())
    assert result.returncode == 0, result.stderr
    is_chstate_error, code, detail = json.loads(result.stdout)
    assert is_chstate_error and code == "NOT_FOUND"
    assert str(HOST_DIR / "chstate.wasm") in detail and "bazel build --config=wasi" in detail


def tsc_command(project: Path) -> list[str]:
    if os.environ.get("CHSTATE_TSC"):
        return [os.environ["CHSTATE_TSC"]]
    if shutil.which("tsc"):
        return ["tsc"]
    local = project / "node_modules" / ".bin" / "tsc"
    if not local.exists():
        got = subprocess.run(["npm", "install", "--no-save", "--no-audit", "--no-fund", "--ignore-scripts",
                              "typescript@5"], cwd=project, env=clean_env(), capture_output=True, text=True,
                             timeout=300)
        if got.returncode != 0 or not local.exists():
            pytest.skip(f"no TypeScript: none on PATH and `npm install typescript@5` failed: {got.stderr[-500:]}")
    return [str(local)]


TSC_FLAGS = ["--noEmit", "--strict", "--target", "es2022", "--module", "nodenext", "--moduleResolution", "nodenext"]


def test_type_declarations(project):
    tsc = tsc_command(project)
    (project / "good.mts").write_text(GOOD_TS % {"name": NAME})
    good = subprocess.run([*tsc, *TSC_FLAGS, "good.mts"], cwd=project, capture_output=True, text=True, timeout=300)
    assert good.returncode == 0, good.stdout + good.stderr

    prelude = BAD_PRELUDE % {"name": NAME}
    (project / "bad.mts").write_text(prelude + "\n".join(BAD_TS) + "\n")
    bad = subprocess.run([*tsc, *TSC_FLAGS, "bad.mts"], cwd=project, capture_output=True, text=True, timeout=300)
    assert bad.returncode != 0, "tsc accepted wrong uses of the API"
    first = prelude.count("\n") + 1
    reported = {int(m.group(1)) for m in re.finditer(r"^bad\.mts\((\d+),\d+\): error TS\d+", bad.stdout, re.M)}
    assert reported == set(range(first, first + len(BAD_TS))), bad.stdout


def test_npm_readme_example_type_checks(project):
    """The npm README's example, as JavaScript checked against the declarations
    (process is declared by hand: the scratch project has no @types/node)."""
    tsc = tsc_command(project)
    readme = (HOST_DIR / "README.md").read_text()
    blocks = re.findall(r"```js\n(.*?)```", readme, re.S)
    assert len(blocks) == 1 and f'from "{NAME}"' in blocks[0]
    (project / "readme_example.mjs").write_text(blocks[0])
    (project / "process.d.ts").write_text("declare const process: { env: { [name: string]: string | undefined } };\n")
    checked = subprocess.run([*tsc, *TSC_FLAGS, "--allowJs", "--checkJs", "process.d.ts", "readme_example.mjs"],
                             cwd=project, capture_output=True, text=True, timeout=300)
    assert checked.returncode == 0, checked.stdout + checked.stderr


def _block(text: str, opening: str) -> str:
    start = text.index(opening)
    return text[start:text.index("\n}\n", start)]


def test_declarations_name_every_verb_and_every_setting(module):
    """chstate_wasi.d.mts declares a Store method for every verb of the module's table (camelCase; acquire
    and release are withLock) and a key for every setting the core resolves (its origin lists them all)."""
    dts = (HOST_DIR / "chstate_wasi.d.mts").read_text()
    camel = lambda n: re.sub(r"_([a-z])", lambda m: m.group(1).upper(), n)  # noqa: E731
    store = _block(dts, "export class Store {")
    methods = set(re.findall(r"^  ([a-zA-Z]+)(?:<[^>]*>)?\(", store, re.M))
    verbs = {camel(v["name"]) for v in json.loads(module.output(lambda o, c: module.call("chstate_verbs", o, c)))["verbs"]}
    assert verbs - {"acquire", "release"} <= methods, verbs - methods
    assert methods - verbs == {"constructor", "withLock", "run", "close"}, methods - verbs
    settings = set(re.findall(r"^  ([a-z_]+)\?: SettingValue;", _block(dts, "export interface Settings {"), re.M))
    resolved = module.resolve_settings({"values": {"uri": "clickhouse://u@h/db"}})
    assert settings == set(resolved["settings"]["origin"]), settings ^ set(resolved["settings"]["origin"])
