"""Replays one shared vector case (tests/vectors) through the WebAssembly
module in wasmtime; returns the first mismatch as text, or None."""

from __future__ import annotations

import json
from pathlib import Path

VECTORS = Path(__file__).resolve().parents[1] / "vectors"


def vector_cases() -> list[tuple[str, dict, bytes]]:
    """(file_case, case, random bytes) for every case of the shared vectors."""
    out = []
    for name in ("config", "sql", "lock", "policy"):
        doc = json.loads((VECTORS / f"{name}.json").read_text())
        random = bytes.fromhex(doc.get("random_hex", ""))
        out += [(f"{name}_{c['name']}", c, random) for c in doc["cases"]]
    return out


def compact(doc) -> bytes:
    return json.dumps(doc, ensure_ascii=False, separators=(",", ":")).encode()


def replay(module, case: dict, random: bytes) -> str | None:
    handle = None
    if "store" in case:  # a settings document, passed as it is
        r = module.store_new(compact(case["store"]))
        if "store" not in r:
            return f"store_new failed: {r}"
        handle = r["store"]
    rp, rn = module.put(random, "random") if random else (0, 0)
    for i, step in enumerate(case["steps"]):
        p, n = module.put(compact(step["doc"]))
        if step["call"] == "resolve_settings":
            got = module.output(lambda o, c: module.call("chstate_resolve_settings", p, n, o, c))
        else:
            fn = "chstate_op_start" if step["call"] == "start" else "chstate_op_feed"
            got = module.output(lambda o, c: module.call(fn, handle, p, n, step["now_ms"], rp, rn, o, c))
        want = step["expect"].encode()
        if got != want:
            return (f"step {i} ({step['call']}):\n  got  {got!r}\n  want {want!r}\n(if the core changed on purpose: "
                    "python3 tests/vectors/generate.py, review the diff, rebuild the module)")
    if handle is not None:
        module.call("chstate_store_free", handle)
    return None
