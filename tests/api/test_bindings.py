"""Every host's API is a binding of the core's verb table: no host lacks a verb
or adds one. The table comes from the core (chstate_verbs); each host's public
surface is read from the host itself: the chstate command's commands, the
Python binding's Store (native, wasmtime and Extism share it), the Meltano
adapter, the JS binding's Store (node:wasi and Extism share it). Lua's is
tests/lua/verbs_spec.lua. What a host has besides the verbs is named here,
each with its reason."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(REPO / "hosts" / "python"))

# The lock scope's verbs are one construct in every host (with_lock,
# withLock, lock(), chstate lock); renew is also a method where a process
# can hold a lock between calls.
SCOPE = {"acquire", "release"}


def verbs(drivers) -> list:
    from chstate_meltano import _native

    _native.library.cache_clear()
    import os

    os.environ["CHSTATE_LIBRARY"] = drivers["cli"][1]["CHSTATE_LIBRARY"]
    return _native.NativeCore().verbs()


def test_the_cli_has_a_command_for_every_verb_and_no_other(drivers):
    names = {v["name"] for v in verbs(drivers)}
    env = drivers["cli"][1]
    help_text = subprocess.run([env["CHSTATE_CLI"], "--help"], capture_output=True, text=True, env=env).stdout
    commands = set(re.findall(r"^  ([a-z_]+)(?: |$)", help_text.split("Commands:")[1].split("\n\n")[0], re.M))
    # How each verb is a command (the CLI's words for Meltano's commands).
    bound = {"delete": "clear", "clear_all": "clear", "acquire": "lock", "release": "lock", "renew": "lock",
             "import_document": "import"}
    assert {bound.get(v, v) for v in names} <= commands, sorted({bound.get(v, v) for v in names} - commands)
    extra = commands - {bound.get(v, v) for v in names}
    # `settings` shows what the core resolved; it sends nothing and is no verb.
    assert extra == {"settings"}, extra


def test_the_python_binding_has_a_method_for_every_verb_and_no_other(drivers):
    from chstate_meltano import binding

    table = verbs(drivers)
    binding.bind_verbs(type("Core", (), {"verbs": lambda self: table})())
    public = {n for n in dir(binding.Store) if not n.startswith("_")}
    want = {binding._py_name(v["name"]) for v in table if v["name"] not in SCOPE}
    assert want <= public, sorted(want - public)
    # The store's own: the pump for any verb document, the lock scope, its
    # end, the settings view.
    assert public - want == {"run", "lock", "close", "redacted_uri"}, sorted(public - want)


def test_the_meltano_adapter_reaches_every_verb(drivers):
    venv_python = drivers["meltano"][0][0]
    env = drivers["meltano"][1]
    probe = """
import json, sys
from chstate_meltano.backend import ClickhouseStateStoreManager
from chstate_meltano import _native
m = ClickhouseStateStoreManager("clickhouse://u@h:1/d")
meltano = {"get": "get", "set": "set", "delete": "delete", "list": "get_state_ids", "clear_all": "clear_all",
           "export": "get_all", "import": "set_all", "acquire": "acquire_lock", "release": "acquire_lock"}
missing = [v["name"] for v in _native.NativeCore().verbs()
           if not callable(getattr(m, meltano.get(v["name"], {"from": "from_"}.get(v["name"], v["name"])), None))]
print(json.dumps(missing))
"""
    out = subprocess.run([venv_python, "-c", probe], capture_output=True, text=True, env=env)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == []


def test_the_js_binding_has_a_method_for_every_verb_and_no_other(drivers):
    env = drivers["node"][1]
    probe = f"""
import {{ Store, bindVerbs }} from "{REPO}/hosts/wasi/chstate_binding.mjs";
import {{ loadChstate }} from "{REPO}/hosts/wasi/chstate_wasi.mjs";
const mod = await loadChstate(process.env.CHSTATE_WASM);
const table = mod.verbs();
bindVerbs(table);
const camel = (n) => n.replace(/_([a-z])/g, (_, c) => c.toUpperCase());
const want = table.filter((v) => !["acquire", "release"].includes(v.name)).map((v) => camel(v.name));
const have = Object.getOwnPropertyNames(Store.prototype).filter((n) => n !== "constructor");
console.log(JSON.stringify({{ missing: want.filter((n) => !have.includes(n)),
                              extra: have.filter((n) => !want.includes(n)).sort() }}));
"""
    out = subprocess.run(["node", "--no-warnings", "--input-type=module", "-e", probe], capture_output=True, text=True,
                         env=env)
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout)
    assert got["missing"] == [], got
    # The store's own: the pump, the lock scope, its end, the settings view.
    assert got["extra"] == ["close", "redactedUri", "run", "withLock"], got
