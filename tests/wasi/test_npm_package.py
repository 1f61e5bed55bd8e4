"""hosts/wasi as the npm package chstate-wasi (hosts/wasi/pack.sh).

The tarball holds exactly the host module, its TypeScript declarations, the
npm README, package.json and the WebAssembly module built by Bazel (the source
tree never holds a .wasm). Installed with `npm install <tarball>` (offline: the
package has no dependencies) into a scratch project outside the checkout, it is
imported by name, finds its packaged chstate.wasm with no path, and works
against the real ClickHouse 18.16: over HTTP, and over HTTPS with ca_file
(tests/tls's CA and TLS server, reused). The declarations type-check a correct
use and reject wrong ones (tsc from $CHSTATE_TSC, PATH, or `npm install
typescript@5` in the scratch project; skipped only if none can be had).
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
import { loadChstate, httpTransport, ChstateError, defaultWasmUrl } from "%(name)s";
import { fileURLToPath } from "node:url";

const out = (o) => console.log(JSON.stringify(o));
out({ module: fileURLToPath(import.meta.resolve("%(name)s")), wasm: fileURLToPath(defaultWasmUrl) });
const chstate = await loadChstate();  // no path: the packaged chstate.wasm
const { config, failed } = chstate.resolveConfig({
  flags: { uri: process.env.CHSTATE_NPM_URI },
  env: { CLICKHOUSE_PASSWORD: process.env.CLICKHOUSE_PASSWORD ?? "" },
});
if (failed) throw new Error(JSON.stringify(failed));
out({ secure: config.secure, ca_file: config.ca_file });
const store = chstate.openStore({ schema: config.schema, table: config.table }, httpTransport(config));
const state = (tag) => ({ completed: { singer_state: { bookmarks: { users: { id: tag } } } }, partial: {} });
try {
  if (process.argv[2] === "full") {
    await store.run({ op: "init" });
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
  store.close();
}
"""

GOOD_TS = r"""
import { loadChstate, httpTransport, ChstateError, type Config, type Done, type State } from "%(name)s";

const chstate = await loadChstate();
const other = await loadChstate(new URL("./chstate.wasm", import.meta.url));
const { config, failed } = chstate.resolveConfig({ flags: { uri: "clickhouse://u@127.0.0.1/default", port: 8123 },
                                                  env: { CLICKHOUSE_PASSWORD: "" } });
if (failed) throw new ChstateError(failed.code, failed.message);
const c: Config = config;
const store = chstate.openStore({ schema: c.schema, table: c.table, lock_timeout_ms: 1000 }, httpTransport(c));
const s: State = { completed: { singer_state: { bookmarks: {} } }, partial: {} };
const d: Done = await store.set("dev:a", s);
const got: State | null = await store.get("dev:a");
await store.merge("dev:a", { singer_state: { bookmarks: { users: { id: 42 } } } });
const ids: string[] = await store.list("dev:*");
const all: string[] = await store.list();
const n: number = await store.clearAll();
const r: string = await store.withLock("dev:a", async (lock) => {
  await lock.setLocked(s);
  await lock.renew();
  return "ok";
});
const next: number | null = (await store.run({ op: "tick" })).next_timeout_ms;
try {
  await store.delete("dev:a");
} catch (e) {
  if (e instanceof ChstateError) console.log(e.code.length, e.detail.length);
}
store.close();
console.log(other, d.dialect, got, ids, all, n, r, next);
"""

# Each line is a wrong use tsc must report (the error's line is checked).
BAD_TS = [
    'chstate.resolveConfig({ flags: { url: "clickhouse://u@h/db" } });',  # no such flag
    'await store.set("dev:a", { completed: 1, partial: {} });',  # completed is an object
    'const ids: number[] = await store.list("dev:*");',  # ids are strings
    "await loadChstate(42);",  # a path or a URL
    'await store.run({ op: "get" });',  # get needs state_id_hex
    'const gone: State = await store.get("dev:a");',  # may be null
    "const t = httpTransport({ host: \"h\" });",  # a resolved Config
]
BAD_PRELUDE = r"""
import { loadChstate, httpTransport, type State } from "%(name)s";
const chstate = await loadChstate();
const store = chstate.openStore({}, httpTransport(chstate.resolveConfig({}).config!));
"""


def clean_env(**extra: str) -> dict:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("CLICKHOUSE_", "MELTANO_", "CHSTATE_")) and k not in ("NODE_PATH", "NODE_OPTIONS")}
    env.update(extra)
    return env


@pytest.fixture(scope="module")
def tarball(tmp_path_factory, wasm_path) -> Path:
    out = tmp_path_factory.mktemp("npm-dist")
    built = subprocess.run([str(HOST_DIR / "pack.sh"), str(out)], env=clean_env(CHSTATE_WASM=str(wasm_path)),
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
    assert where == {"module": str(installed / "chstate_wasi.mjs"), "wasm": str(installed / "chstate.wasm")}
    return lines[1:]


def test_tarball_holds_the_host_the_types_and_the_module(tarball, wasm_path):
    with tarfile.open(tarball) as tar:
        names = sorted(tar.getnames())
        packed_wasm = tar.extractfile("package/chstate.wasm").read()
        packed = json.loads(tar.extractfile("package/package.json").read())
        for member in ("chstate_wasi.mjs", "chstate_wasi.d.mts", "README.md"):
            assert tar.extractfile(f"package/{member}").read() == (HOST_DIR / member).read_bytes(), member
    assert names == sorted(f"package/{n}" for n in ("package.json", "README.md", "chstate_wasi.mjs",
                                                      "chstate_wasi.d.mts", "chstate.wasm"))
    assert packed_wasm == wasm_path.read_bytes()
    assert packed["type"] == "module" and packed["engines"] == {"node": ">=18"}
    assert packed["exports"]["."] == {"types": "./chstate_wasi.d.mts", "default": "./chstate_wasi.mjs"}
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
                               "partial": {"singer_state": {"bookmarks": {"orders": {"id": 7}}}}}}
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
                               "partial": {}}}
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
