"""The conformance vectors (tests/vectors/*.json) replayed through the Python
adapter's own binding: the library it loads (chstate_meltano._native.library,
as an installed adapter finds it) and its ctypes signatures, feeding every
recorded document with the recorded time and random bytes and requiring every
answer byte for byte, as the native (tests/vectors/vectors_test.cc) and Wasm
(tests/wasi) runners do. The policy vectors hold the transport and timer
rules the adapter's pump relies on instead of rules of its own.
"""

from __future__ import annotations

import ctypes
import json
import os
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "hosts" / "python"))
from chstate_meltano import _native  # noqa: E402
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import native_library  # noqa: E402

FILES = ("config", "sql", "lock", "policy")


def load_cases():
    cases = []
    for name in FILES:
        doc = json.loads((REPO / "tests" / "vectors" / f"{name}.json").read_text())
        random = bytes.fromhex(doc["random_hex"])
        for case in doc["cases"]:
            cases.append(pytest.param(case, random, id=f"{name}_{case['name']}"))
    return cases


@pytest.fixture(scope="module")
def lib(library):
    with native_library.loaded(library) as loaded_lib:
        yield loaded_lib


def compact(doc) -> bytes:
    return json.dumps(doc, ensure_ascii=False, separators=(",", ":")).encode("utf-8")


def take(lib, ptr) -> str:
    assert ptr, "the library returned NULL"
    try:
        return ctypes.string_at(ptr).decode("utf-8")
    finally:
        lib.chstate_string_free(ptr)


@pytest.mark.parametrize("case,random", load_cases())
def test_python_binding_replays_the_vectors(lib, case, random):
    store = None
    if "store" in case:
        err = ctypes.c_void_p()
        store = lib.chstate_store_new(compact(case["store"]), ctypes.byref(err))
        assert store, take(lib, err.value)
    try:
        for i, step in enumerate(case["steps"]):
            doc = compact(step["doc"])
            if step["call"] == "resolve_settings":
                got = take(lib, lib.chstate_resolve_settings(doc))
            else:
                fn = lib.chstate_op_start if step["call"] == "start" else lib.chstate_op_feed
                got = take(lib, fn(store, doc, step["now_ms"], random, len(random)))
            assert got == step["expect"], f"step {i} ({step['call']} {doc[:200]!r})"
    finally:
        if store:
            lib.chstate_store_free(store)


def test_every_file_has_cases():
    counts = {name: len(json.loads((REPO / "tests" / "vectors" / f"{name}.json").read_text())["cases"])
              for name in FILES}
    assert all(n >= 8 for n in counts.values()), counts
