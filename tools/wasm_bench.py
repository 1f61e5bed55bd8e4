#!/usr/bin/env python3
"""Per-operation cost of the WebAssembly core versus the native core.

The same op sequences (the scripted cases of tests/vectors: an op, the
canned server answers, to the end; no server is involved) run through
  - the native core: //hosts/python:libchstate.so via ctypes,
  - the Wasm core in wasmtime (hosts/wasi/chstate_wasmtime.py's calls),
  - the Wasm core in Node's V8 (tools/wasm_bench_node.mjs),
timing only the ABI calls with their document copies (the host's own JSON
work is outside the timer, and the same for all three). Prints a Markdown
table of the median time per operation over --reps runs and the ratios.

    python3 tools/wasm_bench.py [--reps 200]
"""

from __future__ import annotations

import argparse
import ctypes
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "hosts" / "wasi"))

# (label, vector file, case name); "set_100k" is the set case with a 100 KB state.
OPS = [
    ("resolve_settings (URI)", "config", "uri_minimal"),
    ("get (found)", "sql", "clickhouse18_get_found"),
    ("set (takes the id's lock)", "sql", "clickhouse18_set"),
    ("set, 100 KB state", "sql", "clickhouse18_set"),
    ("list", "sql", "clickhouse18_list_all"),
    ("delete", "sql", "clickhouse18_delete"),
    ("clear_all", "sql", "clickhouse18_clear_all"),
    ("acquire lock", "lock", "acquire_free"),
    ("merge (lock, get, merge, set, unlock)", "lock", "merge_under_lock"),
]


def compact(doc) -> bytes:
    return json.dumps(doc, ensure_ascii=False, separators=(",", ":")).encode()


def load_cases() -> list[dict]:
    files = {n: json.loads((REPO / "tests" / "vectors" / f"{n}.json").read_text()) for n in ("config", "sql", "lock")}
    out = []
    for label, file, name in OPS:
        case = json.loads(json.dumps(next(c for c in files[file]["cases"] if c["name"] == name)))
        if "100 KB" in label:
            case["steps"][0]["doc"]["state"] = {"singer_state": {"blob": "x" * 100_000}}  # the completed side
        # "expect": what the vector says the call answers (None where the case was changed here): the
        # first run of each case is checked against it, so a broken case is never timed as if it worked.
        out.append({"label": label, "random_hex": files[file].get("random_hex", ""), "store": case.get("store"),
                    "steps": [{"call": s["call"], "now_ms": s.get("now_ms", 0), "doc": compact(s["doc"]).decode(),
                               "expect": None if "100 KB" in label else s["expect"]}
                              for s in case["steps"]]})
    return out


def bazel_bin(*config: str) -> Path:
    out = subprocess.run(["bazel", "info", *config, "bazel-bin"], cwd=REPO, capture_output=True, text=True, check=True)
    return Path(out.stdout.strip())


def checked(label: str, step: dict, got: bytes) -> None:
    """The first run's answers must be the vector's (or, for a changed case, not a failure)."""
    want = step["expect"]
    if (want is not None and got != want.encode()) or (want is None and got.startswith(b'{"failed"')):
        sys.exit(f"wasm_bench: {label}, {step['call']}: got {got[:300]!r}, want {str(want)[:300]!r}")


def empty_call(fn, reps: int) -> float:
    """Median µs of one call that does nothing: the binding's own cost."""
    times = []
    for _ in range(reps):
        t0 = time.perf_counter_ns()
        fn()
        times.append(time.perf_counter_ns() - t0)
    return statistics.median(times) / 1000


def bench_native(cases: list[dict], reps: int, lib_path: Path) -> list[float]:
    lib = ctypes.CDLL(str(lib_path))
    lib.chstate_resolve_settings.restype = ctypes.c_void_p
    lib.chstate_resolve_settings.argtypes = [ctypes.c_char_p]
    lib.chstate_store_new.restype = ctypes.c_void_p
    lib.chstate_store_new.argtypes = [ctypes.c_char_p, ctypes.c_void_p]
    lib.chstate_store_free.argtypes = [ctypes.c_void_p]
    for fn in (lib.chstate_op_start, lib.chstate_op_feed):
        fn.restype = ctypes.c_void_p
        fn.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int64, ctypes.c_char_p, ctypes.c_size_t]
    lib.chstate_string_free.argtypes = [ctypes.c_void_p]
    medians = [empty_call(lambda: lib.chstate_abi_version(), reps)]
    for case in cases:
        random = bytes.fromhex(case["random_hex"])
        docs = [(s["call"], s["now_ms"], s["doc"].encode(), s) for s in case["steps"]]
        # A case's store is a settings document, passed as it is.
        store = lib.chstate_store_new(compact(case["store"]), None) if case["store"] else None
        times = []
        for rep in range(reps):
            total = 0
            for call, now, d, step in docs:
                t0 = time.perf_counter_ns()
                if call == "resolve_settings":
                    p = lib.chstate_resolve_settings(d)
                else:
                    fn = lib.chstate_op_start if call == "start" else lib.chstate_op_feed
                    p = fn(store, d, now, random, len(random))
                got = ctypes.string_at(p)
                lib.chstate_string_free(p)
                total += time.perf_counter_ns() - t0
                if rep == 0:
                    checked("native " + case["label"], step, got)
            times.append(total)
        if store:
            lib.chstate_store_free(store)
        medians.append(statistics.median(times) / 1000)
    return medians


def bench_wasmtime(cases: list[dict], reps: int, wasm: Path) -> list[float]:
    from chstate_wasmtime import ChstateModule
    mod = ChstateModule(wasm)
    medians = [empty_call(lambda: mod.call("chstate_abi_version"), reps)]
    for case in cases:
        random = bytes.fromhex(case["random_hex"])
        rp, rn = mod.put(random, "random") if random else (0, 0)
        docs = [(s["call"], s["now_ms"], s["doc"].encode(), s) for s in case["steps"]]
        handle = mod.store_new(compact(case["store"]))["store"] if case["store"] else 0
        times = []
        for rep in range(reps):
            total = 0
            for call, now, d, step in docs:
                t0 = time.perf_counter_ns()
                p, n = mod.put(d)
                if call == "resolve_settings":
                    got = mod.output(lambda o, c: mod.call("chstate_resolve_settings", p, n, o, c))
                else:
                    fn = "chstate_op_start" if call == "start" else "chstate_op_feed"
                    got = mod.output(lambda o, c: mod.call(fn, handle, p, n, now, rp, rn, o, c))
                total += time.perf_counter_ns() - t0
                if rep == 0:
                    checked("wasmtime " + case["label"], step, got)
            times.append(total)
        if handle:
            mod.call("chstate_store_free", handle)
        medians.append(statistics.median(times) / 1000)
    return medians


def bench_node(cases: list[dict], reps: int, wasm: Path) -> list[float]:
    out = subprocess.run(["node", "--no-warnings", str(REPO / "tools" / "wasm_bench_node.mjs"), str(wasm), str(reps)],
                         input=json.dumps(cases), capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=200)
    args = ap.parse_args()
    subprocess.run(["bazel", "build", "-c", "opt", "--symlink_prefix=/", "//hosts/python:libchstate.so"], cwd=REPO, check=True,
                   capture_output=True)
    subprocess.run(["bazel", "build", "--config=wasi", "--symlink_prefix=/", "//hosts/wasi:chstate.wasm"], cwd=REPO,
                   check=True, capture_output=True)
    wasm = bazel_bin("--config=wasi") / "hosts/wasi/chstate.wasm"
    cases = load_cases()
    # -c opt: the native library is measured as optimised as the Wasm module (-O2).
    native = bench_native(cases, args.reps, bazel_bin("-c", "opt") / "hosts/python/libchstate.so")
    wt = bench_wasmtime(cases, args.reps, wasm)
    node = bench_node(cases, args.reps, wasm)
    print(f"Module: {wasm.stat().st_size:,} bytes after wasm-opt -Oz; median of {args.reps} runs per operation, "
          "each run = every ABI call of the op with canned answers (no server).\n")
    print("| operation | calls | native (µs) | Wasm in wasmtime (µs) | Wasm in Node (µs) | wasmtime / native "
          "| Node / native |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    labels = [("empty call (chstate_abi_version): the binding's own cost", 1)] + [
        (c["label"], len(c["steps"])) for c in cases]
    for (label, calls), n, w, v in zip(labels, native, wt, node):
        print(f"| {label} | {calls} | {n:.1f} | {w:.1f} | {v:.1f} | {w / n:.2f}x | {v / n:.2f}x |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
