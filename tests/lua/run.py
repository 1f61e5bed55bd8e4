#!/usr/bin/env python3
"""Runs the Lua binding's busted specs against a real ClickHouse 18.16.

  tests/lua/run.py                      build chstate.so, start a server, run every spec
  tests/lua/run.py --junit out.xml      also keep busted's JUnit XML (tools/test counts it)
  tests/lua/run.py -- --filter=lock     extra arguments go to busted
  tests/lua/run.py --lua luajit         the same specs in LuaJIT, against hosts/luajit
                                        (the FFI module over libchstate.so)

The server is the one CHSTATE_TEST_HOST/PORT/USER/PASSWORD name (tools/test
sets them), else a throwaway one from tools/clickhouse_server.py, stopped at
the end. The module is bazel-bin/hosts/lua/chstate.so (built here, with the
chstate CLI that interop_spec.lua and lock_spec.lua run), or the file CHSTATE_LUA_SO names; for
LuaJIT, hosts/luajit/chstate.lua with bazel-bin/hosts/python/libchstate.so (or
the file CHSTATE_LIBRARY names). Specs tagged #lua54 (and lua54_spec.lua, which
LuaJIT cannot parse) run in Lua 5.4 only, those tagged #luajit (and luajit_spec.lua)
in LuaJIT only.
busted writes JUnit XML; this script prints each failure and ends with
`busted: N specs passed, N failed` (only tools/test prints the overall
`N passed, N failed` line). Exit status 0 only when something passed and
nothing failed.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SPECS = ROOT / "tests" / "lua"


def summarize(xml_path: Path) -> tuple[int, int]:
    """Counts busted's test cases and prints the failures. busted reports a
    spec file that does not load as an <error> outside any test case; it is
    rewritten into a failed test case, so that any JUnit reader (tools/test)
    counts it."""
    try:
        tree = ET.parse(xml_path)
    except (ET.ParseError, OSError) as e:
        print(f"run.py: busted wrote no readable JUnit XML ({e})")
        return 0, 1
    root = tree.getroot()
    passed = failed = 0
    for case in root.iter("testcase"):
        problem = case.find("failure")
        if problem is None:
            problem = case.find("error")
        if case.find("skipped") is not None:
            print(f"  PENDING (not counted) {case.get('classname')} {case.get('name')}")
        elif problem is not None:
            failed += 1
            print(f"  FAILED {case.get('classname')}: {case.get('name')}\n"
                  f"    {(problem.get('message') or '').strip()}\n{(problem.text or '').strip()}")
        else:
            passed += 1
    stray = [e for parent in root.iter() if parent.tag != "testcase" for e in parent if e.tag in ("error", "failure")]
    for e in stray:
        failed += 1
        print(f"  FAILED (outside any test) {(e.text or '').strip()}")
        for parent in root.iter():
            if e in list(parent):
                parent.remove(e)
        suite = ET.SubElement(root, "testsuite", name="busted", tests="1", errors="1")
        case = ET.SubElement(suite, "testcase", classname="busted", name="spec files load")
        case.append(e)
    if stray:
        tree.write(xml_path)
    return passed, failed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--junit", type=Path, help="where to keep busted's JUnit XML")
    parser.add_argument("--lua", choices=("lua5.4", "luajit"), default="lua5.4", help="the interpreter")
    parser.add_argument("busted_args", nargs="*", help="extra busted arguments (after --)")
    args = parser.parse_args()

    env = dict(os.environ)
    env["CHSTATE_LUA"] = args.lua  # for the specs that start Lua processes
    if args.lua == "lua5.4":
        so = Path(os.environ["CHSTATE_LUA_SO"]).resolve() if os.environ.get("CHSTATE_LUA_SO") else None
        targets = [] if so else ["//hosts/lua:chstate.so"]
    else:
        lib = Path(os.environ["CHSTATE_LIBRARY"]).resolve() if os.environ.get("CHSTATE_LIBRARY") else None
        targets = [] if lib else ["//hosts/python:libchstate.so"]
    bin_dir = ROOT / "bazel-bin"
    if targets:
        # The CLI too: interop_spec checks that both share tables and the lock,
        # and lock_spec runs it as the contender of a scope left unrenewed.
        if subprocess.call(["bazel", "build", *targets, "//hosts/native:chstate"], cwd=ROOT) != 0:
            print(f"busted: not run ({targets[0]} did not build)")
            return 1
        # Not the bazel-bin symlink: another build (--config=wasi, -c opt) may have moved it.
        bin_dir = Path(subprocess.run(["bazel", "info", "bazel-bin"], cwd=ROOT, capture_output=True,
                                      text=True).stdout.strip() or ROOT / "bazel-bin")
        env.setdefault("CHSTATE_CLI", str(bin_dir / "hosts" / "native" / "chstate"))
    specs = sorted(p.name for p in SPECS.glob("*_spec.lua"))
    if args.lua == "lua5.4":
        so = so or bin_dir / "hosts" / "lua" / "chstate.so"
        # Lua 5.4 reads these before LUA_CPATH/LUA_PATH; ";;" keeps the defaults.
        env["LUA_CPATH_5_4"] = f"{so.parent}/?.so;;"
        env["LUA_PATH_5_4"] = f"{SPECS}/?.lua;;"
        lua = ["lua5.4", "/usr/bin/busted", "--exclude-tags=luajit"]
        specs = [s for s in specs if not s.startswith("luajit_")]
    else:
        env["CHSTATE_LIBRARY"] = str(lib or bin_dir / "hosts" / "python" / "libchstate.so")
        env["LUA_PATH"] = f"{ROOT}/hosts/luajit/?.lua;{SPECS}/?.lua;;"
        lua = ["luajit", "/usr/bin/busted", "--exclude-tags=lua54"]
        specs = [s for s in specs if not s.startswith("lua54_")]

    with tempfile.TemporaryDirectory(prefix="chstate-lua-") as tmp:
        server_dir = None
        if not all(env.get(k) for k in ("CHSTATE_TEST_HOST", "CHSTATE_TEST_PORT", "CHSTATE_TEST_USER")):
            server_dir = Path(tmp) / "clickhouse"
            out = subprocess.run([sys.executable, str(ROOT / "tools" / "clickhouse_server.py"), "start",
                                  str(server_dir)], capture_output=True, text=True)
            if out.returncode != 0:
                print(out.stdout + out.stderr)
                print("busted: not run (ClickHouse did not start)")
                return 1
            for line in out.stdout.splitlines():
                k, _, v = line.partition("=")
                if k.startswith("CHSTATE_TEST_"):
                    env[k] = v
        # The README example reads its connection from the environment.
        env["MELTANO_STATE_BACKEND_URI"] = (f"clickhouse://{env['CHSTATE_TEST_USER']}@{env['CHSTATE_TEST_HOST']}:"
                                            f"{env['CHSTATE_TEST_PORT']}/default")
        env["MELTANO_STATE_BACKEND_CLICKHOUSE_PASSWORD"] = env.get("CHSTATE_TEST_PASSWORD", "")
        xml = args.junit.resolve() if args.junit else Path(tmp) / "busted.xml"
        try:
            cmd = [*lua, "-o", "junit", f"-Xoutput={xml}", *args.busted_args, *(str(SPECS / s) for s in specs)]
            print("+ " + " ".join(cmd), flush=True)
            code = subprocess.call(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL)
        finally:
            if server_dir is not None:
                subprocess.call([sys.executable, str(ROOT / "tools" / "clickhouse_server.py"), "stop",
                                 str(server_dir)])
        passed, failed = summarize(xml)
        if code != 0 and failed == 0:
            failed = 1  # busted itself failed (a spec file that did not load)
            print(f"run.py: busted exited with {code} without reporting a failure")
    print(f"busted: {passed} specs passed, {failed} failed")
    return 0 if passed > 0 and failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
