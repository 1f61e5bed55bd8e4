"""chstate_meltano/_core.py in this process: which core the adapter runs
($CHSTATE_CORE auto/native/wasm), what it says when one is missing, and that
both cores answer alike. Fast (no Meltano, no server): the native library and
chstate.wasm come from $CHSTATE_LIBRARY and $CHSTATE_WASM, else are built.
tools/mutate runs this file for the mutations of _core.py."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

import meltano_harness as harness

sys.path.insert(0, str(harness.ADAPTER_SRC))
from chstate_meltano import _core  # noqa: E402
from chstate_meltano.binding import ChstateError  # noqa: E402


@pytest.fixture(scope="module")
def built(library) -> tuple:
    return library, harness.wasm_module()


@pytest.fixture
def env(monkeypatch, built):
    """Sets the core's variables for one test (None: unset), with fresh choices."""
    library, wasm = built
    for name in ("CHSTATE_CORE", "CHSTATE_LIBRARY", "CHSTATE_WASM"):
        monkeypatch.delenv(name, raising=False)
    _core._choose.cache_clear()

    def set_(core=None, native=True, module=True, **paths):
        for name, value in (("CHSTATE_CORE", core), ("CHSTATE_LIBRARY", str(library) if native else None),
                            ("CHSTATE_WASM", str(wasm) if module else None)):
            if value is not None:
                monkeypatch.setenv(name, value)
        for name, value in paths.items():
            monkeypatch.setenv(name, value)
        _core._choose.cache_clear()

    yield set_
    _core._choose.cache_clear()


def test_auto_runs_the_native_library_when_there_is_one(env):
    env()
    choice = _core.chosen()
    assert choice.kind == "native" and "a native library for this platform" in choice.describe()


def test_auto_runs_the_module_where_no_native_library_is(env, built):
    env(native=False)
    choice = _core.chosen()
    assert choice.kind == "wasm"
    assert choice.describe().startswith(f"the wasm core ({built[1]} on wasmtime ")
    assert choice.describe().endswith("; no native library for this platform)")


def test_wasm_is_forced_even_with_a_native_library(env):
    env(core="wasm")
    assert _core.chosen().kind == "wasm" and "CHSTATE_CORE=wasm" in _core.chosen().why
    env(core=" Wasm ")  # as a shell might give it
    assert _core.chosen().kind == "wasm"


def test_native_forced_where_there_is_none_names_the_fix(env):
    env(core="native", native=False)
    with pytest.raises(ChstateError) as e:
        _core.chosen()
    assert e.value.code == "FAILED_PRECONDITION"
    assert "the chstate native library was not found" in e.value.message


def test_an_unknown_choice_is_refused(env):
    env(core="fast")
    with pytest.raises(ChstateError) as e:
        _core.chosen()
    assert e.value.message == "CHSTATE_CORE is 'fast': it is one of auto, native, wasm"


def test_neither_core_says_both_fixes(env, tmp_path):
    env(native=False, module=False)
    with pytest.raises(ChstateError) as e:
        _core.chosen()
    assert e.value.message.startswith("no chstate core to run. The native library: the chstate native library was "
                                      "not found")
    assert ". The WebAssembly module: chstate.wasm is not in " in e.value.message
    assert "install the pure chstate-meltano wheel" in e.value.message
    env(native=False, module=False, CHSTATE_WASM=str(tmp_path / "missing.wasm"))
    with pytest.raises(ChstateError) as e:
        _core.chosen()
    assert "missing.wasm', which is not a file" in e.value.message


def test_the_settings_table_comes_from_the_other_core_when_the_forced_one_is_missing(env):
    env(core="native", native=False)
    table = _core.settings_table()
    assert {"uri", "password", "schema"} <= {row["key"] for row in table["settings"]}
    env()
    assert _core.settings_table() == table  # the same table from either core


def test_both_cores_resolve_settings_alike(env):
    doc = {"from": "meltano", "env": {},
           "values": {"uri": "clickhouse://me@db.internal:8443/analytics?secure=true", "lock_timeout_seconds": 7}}
    env(core="native")
    native = _core.chosen().resolve_settings(doc)
    env(core="wasm")
    wasm = _core.chosen().resolve_settings(doc)
    assert wasm == native and wasm["connection"]["host"] == "db.internal"
    bad = dict(doc, values={"uri": "clickhouse://me@db.internal:port/analytics"})
    errors = []
    for core in ("native", "wasm"):
        env(core=core)
        with pytest.raises(ChstateError) as e:
            _core.chosen().resolve_settings(bad)
        errors.append((e.value.code, e.value.message))
    assert errors[0] == errors[1] and errors[0][0] == "INVALID_ARGUMENT", errors


def test_the_module_runs_a_store_as_the_library_does(env):
    """A store on each core: the same verb table, the same first request of a get."""
    seen = {}
    for core in ("native", "wasm"):
        env(core=core)
        made = _core.chosen().make()
        verbs = sorted(v["name"] for v in made.verbs())
        handle = made.store_new({"from": "api", "values": {"uri": "clickhouse://me@127.0.0.1:1/default"},
                                 "env": {}, "host": {"timers": False}})
        first = made.start(handle, b'{"op":"get","state_id_hex":"6465763a61"}', 1000, bytes(32))
        made.store_free(handle)
        seen[core] = (verbs, first["request"]["sql"])
    assert seen["native"] == seen["wasm"], seen


def test_pyproject_registers_one_setting_per_row_of_the_core_table(env):
    """pyproject.toml's meltano.settings entry points are the table's
    state_backend.clickhouse.* rows (and chDB's subset), no more, no fewer:
    the list both wheels register, checked against the table either core gives."""
    import ast
    import tomllib

    env()
    table = _core.settings_table()["settings"]
    source = (harness.ADAPTER_SRC / "chstate_meltano" / "settings.py").read_text()
    chdb_keys = next(ast.literal_eval(node.value) for node in ast.parse(source).body
                     if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == "CHDB_KEYS")
    want = {}
    for row in table:
        if row["meltano"] != f"state_backend.clickhouse.{row['key']}":
            continue
        want[f"clickhouse_{row['key']}"] = f"chstate_meltano.settings:CLICKHOUSE_{row['key'].upper()}"
        if row["key"] in chdb_keys:
            want[f"chdb_{row['key']}"] = f"chstate_meltano.settings:CHDB_{row['key'].upper()}"
    project = tomllib.loads((harness.ADAPTER_SRC / "pyproject.toml").read_text())["project"]
    assert project["entry-points"]["meltano.settings"] == want
