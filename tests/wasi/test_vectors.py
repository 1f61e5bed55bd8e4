"""The shared conformance vectors (tests/vectors/*.json) through the
WebAssembly module, in wasmtime and in Node: every output document must equal
the committed one byte for byte (the native build passes the same files in
//tests/vectors:vectors_test)."""

from __future__ import annotations

import pytest

from vector_runner import replay, vector_cases

CASES = vector_cases()
IDS = [c[0] for c in CASES]


def test_every_vector_file_has_cases():
    for prefix in ("config_", "sql_", "lock_"):
        assert sum(1 for name in IDS if name.startswith(prefix)) >= 8, prefix


@pytest.mark.parametrize("name,case,random", CASES, ids=IDS)
def test_wasmtime_matches_vectors(module, name, case, random):
    mismatch = replay(module, case, random)
    assert mismatch is None, mismatch


@pytest.mark.parametrize("name", IDS)
def test_node_matches_vectors(node_results, name):
    results = node_results("vectors")
    assert name in results, f"node_runner did not run {name}"
    assert results[name]["ok"], results[name]["detail"]
