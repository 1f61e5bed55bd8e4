"""Facts docs/wasm.md states about the module: no imports at all (it runs
with an empty import object), the documented exports, under 1 MB."""

from __future__ import annotations

import re
from pathlib import Path

import wasmtime

REPO = Path(__file__).resolve().parents[2]
ABI = {"chstate_abi_version", "chstate_wasm_abi_version", "chstate_alloc", "chstate_free", "chstate_last",
       "chstate_verbs", "chstate_settings_table", "chstate_resolve_settings", "chstate_store_new", "chstate_store_free", "chstate_op_start",
       "chstate_op_feed"}


def test_module_imports_nothing(compiled):
    engine, module = compiled
    assert [(i.module, i.name) for i in module.imports] == []
    # Instantiable with no imports and no WASI context at all.
    store = wasmtime.Store(engine)
    instance = wasmtime.Instance(store, module, [])
    exports = instance.exports(store)
    exports["_initialize"](store)
    # ABI v3: stores open from settings documents; wasm ABI 2: the verb table and resolve_settings
    # exports, 3: the settings table.
    assert exports["chstate_abi_version"](store) == 3
    assert exports["chstate_wasm_abi_version"](store) == 3


def test_exports_are_the_documented_abi(compiled):
    names = {e.name for e in compiled[1].exports}
    assert ABI <= names
    page = (REPO / "docs" / "wasm.md").read_text()
    section = page[page.index("## The module's exports"):]
    documented = set(re.findall(r"`(chstate_[a-z_]+)\(", section))
    assert documented == ABI, documented ^ ABI


def test_module_is_under_one_megabyte(wasm_path):
    size = wasm_path.stat().st_size
    assert size < 1_000_000, size
    # The page's figure stays true within 5% (core changes move it a little).
    stated = re.search(r"\*\*([0-9,]+) bytes\*\*", (REPO / "docs" / "wasm.md").read_text())
    assert stated, "docs/wasm.md states no module size"
    assert abs(int(stated.group(1).replace(",", "")) - size) <= size * 0.05, (stated.group(1), size)


def test_node_instantiates_with_an_empty_import_object(node_results):
    results = node_results("bare")
    assert results["bare_instance"]["ok"], results["bare_instance"]["detail"]
