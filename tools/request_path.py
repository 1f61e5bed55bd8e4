#!/usr/bin/env python3
"""The core functions one CLI request passes through, in the order it calls them.

Builds the `chstate` CLI with every core/*.cc function instrumented
(-finstrument-functions, in a configuration of its own so the normal build
is untouched), runs one command against a real server with a small
preloaded recorder, and prints, for the calls into core/ made while the
command ran:

- how many distinct functions and source files it entered (functions
  defined in core/*.cc; calls of inline header functions, mostly the
  plain structs' constructors, are counted apart and left out of the route);
- the route as files: each time the call moved into another source file
  counts as one entry (so bouncing between two files shows as many);
- the deepest nesting of core calls;
- with --functions, every function with its file, in the order first called.

Usage (a throwaway server is started when no --uri is given):

    python3 tools/request_path.py -- get dev:tap-a
    python3 tools/request_path.py -- merge dev:tap-a '{"singer_state": {"a": 1}}'
    python3 tools/request_path.py --repo /path/to/other/checkout -- get dev:tap-a

--repo measures another checkout of chstate (an older commit, say) with
this script, so two commits are compared the same way. The command runs
twice: once to create what it needs (the state, the schema), once traced.
"""

from __future__ import annotations

import argparse
import collections
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

# The recorder: one line per call into an instrumented function (its depth
# and its offset in the executable); nothing on return but the depth.
RECORDER_C = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
static FILE* out;
static int depth;
static int off;
__attribute__((no_instrument_function)) void __cyg_profile_func_enter(void* fn, void* site) {
  (void)site;
  if (off) return;
  if (!out) {
    const char* p = getenv("CHSTATE_CALLS_OUT");
    if (!p || !(out = fopen(p, "w"))) { off = 1; return; }
  }
  Dl_info info;
  if (dladdr(fn, &info) && info.dli_fbase) {
    fprintf(out, "%d %lx\n", depth, (unsigned long)((char*)fn - (char*)info.dli_fbase));
  }
  depth++;
}
__attribute__((no_instrument_function)) void __cyg_profile_func_exit(void* fn, void* site) {
  (void)fn;
  (void)site;
  depth--;
}
"""

BUILD_FLAGS = [
    "--platform_suffix=calls",
    "--copt=-g",
    "--copt=-gdwarf-4",
    "--strip=never",
    # (per_file_copt splits its options at commas: one file list each.)
    r"--per_file_copt=core/.*\.cc@-finstrument-functions,-finstrument-functions-exclude-file-list=external/,"
    r"-finstrument-functions-exclude-file-list=/usr/,-finstrument-functions-exclude-file-list=include/c++",
]


def build(repo: Path) -> Path:
    subprocess.run(["bazel", "build", "--symlink_prefix=/", *BUILD_FLAGS, "//hosts/native:chstate"], cwd=repo,
                   check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    out = subprocess.run(["bazel", "info", *BUILD_FLAGS, "bazel-bin"], cwd=repo, capture_output=True, text=True,
                         check=True).stdout.strip()
    return Path(out) / "hosts/native/chstate"


def recorder(workdir: Path) -> Path:
    src = workdir / "recorder.c"
    src.write_text(RECORDER_C)
    lib = workdir / "recorder.so"
    subprocess.run(["cc", "-shared", "-fPIC", "-O1", "-o", str(lib), str(src), "-ldl"], check=True)
    return lib


def symbolize(binary: Path, offsets: list[str]) -> dict[str, tuple[str, str]]:
    """offset -> (function, file relative to the checkout)."""
    unique = sorted(set(offsets))
    out = subprocess.run(["addr2line", "-f", "-C", "-e", str(binary), *[f"0x{o}" for o in unique]],
                         capture_output=True, text=True, check=True).stdout.splitlines()
    names: dict[str, tuple[str, str]] = {}
    for i, off in enumerate(unique):
        func = out[2 * i]
        where = out[2 * i + 1].split(":")[0]
        if "core/" in where:
            where = "core/" + where.split("core/", 1)[1]
        names[off] = (func, where)
    return names


def short_name(func: str) -> str:
    """chstate::(anonymous namespace)::GetOp::Resume(...) -> GetOp::Resume."""
    name = func.replace("(anonymous namespace)::", "").replace("chstate::", "")
    return name.split("(", 1)[0] or func


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repo", type=Path, default=REPO, help="the checkout to measure (default: this one)")
    ap.add_argument("--uri", help="the server (default: a throwaway ClickHouse started here)")
    ap.add_argument("--functions", action="store_true", help="list every function, in the order first called")
    ap.add_argument("--route", action="store_true", help="print the route: each entry into a file, with the function")
    ap.add_argument("command", nargs=argparse.REMAINDER, help="-- then the chstate command and its arguments")
    args = ap.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        ap.error("name the chstate command after --")

    binary = build(args.repo.resolve())
    with tempfile.TemporaryDirectory(prefix="chstate-calls-") as tmp:
        work = Path(tmp)
        lib = recorder(work)
        env = dict(os.environ)
        server = None
        if args.uri:
            env["MELTANO_STATE_BACKEND_URI"] = args.uri
        else:
            server = work / "server"
            lines = subprocess.run([sys.executable, str(REPO / "tools/clickhouse_server.py"), "start", str(server)],
                                   capture_output=True, text=True, check=True).stdout.splitlines()
            srv = dict(line.split("=", 1) for line in lines if "=" in line)
            env["MELTANO_STATE_BACKEND_CLICKHOUSE_HOST"] = srv["CHSTATE_TEST_HOST"]
            env["MELTANO_STATE_BACKEND_CLICKHOUSE_PORT"] = srv["CHSTATE_TEST_PORT"]
            env["MELTANO_STATE_BACKEND_CLICKHOUSE_USER"] = srv["CHSTATE_TEST_USER"]
            env["MELTANO_STATE_BACKEND_CLICKHOUSE_PASSWORD"] = srv["CHSTATE_TEST_PASSWORD"]
            env["MELTANO_STATE_BACKEND_CLICKHOUSE_DATABASE"] = "default"
            env["MELTANO_STATE_BACKEND_CLICKHOUSE_SCHEMA"] = "calls"
        try:
            # First runs: the schema, and a state for the command to find.
            subprocess.run([str(binary), "init"], env=env, check=True, stdout=subprocess.DEVNULL)
            ids = [a for a in command[1:] if not a.startswith("-") and not a.startswith("{")]
            if ids:
                subprocess.run([str(binary), "set", ids[0], '{"singer_state": {"bookmark": 0}}'], env=env,
                               check=True, stdout=subprocess.DEVNULL)
            subprocess.run([str(binary), *command], env=env, check=True, stdout=subprocess.DEVNULL)
            calls = work / "calls.txt"
            traced = dict(env, LD_PRELOAD=str(lib), CHSTATE_CALLS_OUT=str(calls))
            subprocess.run([str(binary), *command], env=traced, check=True, stdout=subprocess.DEVNULL)
        finally:
            if server is not None:
                subprocess.run([sys.executable, str(REPO / "tools/clickhouse_server.py"), "stop", str(server)],
                               capture_output=True)
        records = [line.split() for line in calls.read_text().splitlines()]

    names = symbolize(binary, [off for _, off in records])
    # Static initialisers run before main: not the request's.
    records = [(d, off) for d, off in records
               if not names[off][0].startswith(("_GLOBAL__sub_I", "__static_initialization"))]
    inline_calls = sum(1 for _, off in records if not names[off][1].endswith(".cc"))
    records = [(d, off) for d, off in records if names[off][1].endswith(".cc")]
    order: list[tuple[str, str]] = []
    seen: set[tuple[str, str]] = set()
    entries: collections.Counter[str] = collections.Counter()
    route: list[str] = []
    deepest = 0
    for depth, off in records:
        func, where = names[off]
        deepest = max(deepest, int(depth) + 1)
        if (func, where) not in seen:
            seen.add((func, where))
            order.append((func, where))
        if not route or route[-1][0] != where:
            route.append((where, func, int(depth)))
            entries[where] += 1

    files = collections.Counter(where for _, where in order)
    print(f"chstate {' '.join(command[:1])}: {len(records)} calls of {len(order)} distinct core functions in "
          f"{len(files)} files, {len(route)} entries into a file, deepest nesting {deepest} calls "
          f"(and {inline_calls} calls of inline header functions)")
    print()
    print(f"{'file':<32} {'functions':>9} {'entries':>8}")
    for where, n in sorted(files.items(), key=lambda kv: (-entries[kv[0]], kv[0])):
        print(f"{where:<32} {n:>9} {entries[where]:>8}")
    if args.route:
        print()
        for where, func, depth in route:
            print(f"{depth:>3} {where:<28} {short_name(func)}")
    if args.functions:
        print()
        for func, where in order:
            print(f"{where:<32} {func}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
