#!/usr/bin/env python3
"""Bulk export and import of Meltano state: chstate's core operations against
the base class's loops, on one ClickHouse 18.16 on loopback.

  python3 tools/export_bench.py [--states 10000] [--repeat 3]

Rows, each in a fresh process so that its peak memory is its own:
  - the adapter's set_all / get_all (what `meltano state import/export` call):
    a few multi-row INSERTs, one SELECT ... FINAL per page of 1,000 states;
  - Meltano's StateStoreManager.set_all / get_all on the same adapter object:
    the base class's loops, one set() per state, and list + one get() per
    state;
  - the `chstate import` / `chstate export` commands.
Each export iterates the states and keeps none (Meltano's own `state export`
then builds one dict of all of them, whatever the backend does). Round trips
are counted at the adapter's transport (the CLI's: from the core's paging,
run once more through a recording proxy (tests/faults/fault_proxy.py), its
timing not used); peak memory is the process's maximum resident set (for
the CLI rows, the chstate process alone). The export row at a tenth of the
states shows whether memory grows with their number. Times are medians over
--repeat runs; ratios are within this one run. Uses the cached Meltano venv of
tests/meltano and a -c opt build (tools/meltano_bench.py's library).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "meltano"))
sys.path.insert(0, str(REPO / "tools"))
sys.path.insert(0, str(REPO / "tests" / "faults"))

import meltano_harness as harness  # noqa: E402
from chserver import from_env, start_server, stop_server  # noqa: E402
from fault_proxy import FaultProxy  # noqa: E402
from meltano_bench import opt_library  # noqa: E402

# Runs in the Meltano venv: one measurement, printed as one JSON line.
CHILD = r"""
import json, os, resource, sys, time
from meltano.core.state_store.base import MeltanoState, StateStoreManager
from chstate_meltano.backend import ClickhouseStateStoreManager

what, n = sys.argv[1], int(sys.argv[2])
m = ClickhouseStateStoreManager(uri=os.environ["B_URI"], password=os.environ.get("B_PASSWORD") or None,
                                schema=os.environ["B_SCHEMA"], lock_timeout_seconds=10, lock_retry_seconds=1)
m.get_state_ids("none")          # connect (version) outside the timing
store = m._store_handle()
inner = store._transport
sent = []
store._transport = lambda r: (sent.append(r["purpose"]), inner(r))[1]

def states():
    for i in range(n):
        yield MeltanoState(state_id=f"dev:tap-{i:06d}-to-target-jsonl",
                           completed_state={"singer_state": {"bookmarks": {"stream": {"id": i, "at": "2026-12-01"}}}},
                           partial_state={})

t0 = time.perf_counter()
if what == "import":
    count = m.set_all(states())
elif what == "import-loop":
    count = StateStoreManager.set_all(m, states())
elif what == "export":
    count = sum(1 for _ in m.get_all())
elif what == "export-loop":
    count = sum(1 for _ in StateStoreManager.get_all(m))
elapsed = time.perf_counter() - t0
print(json.dumps({"count": count, "seconds": elapsed, "requests": len(sent),
                  "peak_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss}))
"""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--states", type=int, default=10000)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    n = args.states

    venv = harness.ensure_venv()
    harness.install_adapter(venv)
    library = opt_library()
    subprocess.run(["bazel", "build", "-c", "opt", "--symlink_prefix=/", "//hosts/native:chstate"], cwd=REPO,
                   check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    bin_dir = subprocess.run(["bazel", "info", "-c", "opt", "bazel-bin"], cwd=REPO, check=True,
                             capture_output=True, text=True).stdout.strip()
    cli = Path(bin_dir, "hosts", "native", "chstate")
    tmp = Path(tempfile.mkdtemp(prefix="chstate-export-bench-"))
    server = from_env()
    started = server is None
    try:
        if started:
            server = start_server(tmp / "clickhouse")
        schema = "chstate_export_bench"
        env = harness.clean_env()
        env.update({"CHSTATE_LIBRARY": str(library), "B_URI": server.uri(), "B_PASSWORD": server.password or "",
                    "B_SCHEMA": schema, "MELTANO_STATE_BACKEND_CLICKHOUSE_SCHEMA": schema,
                    "MELTANO_STATE_BACKEND_CLICKHOUSE_PASSWORD": server.password or ""})
        python = str(venv / "bin" / "python")

        def child(what: str, count: int) -> dict:
            out = subprocess.run([python, "-c", CHILD, what, str(count)], env=env, capture_output=True, text=True,
                                 timeout=3600)
            if out.returncode != 0:
                raise SystemExit(f"{what} failed:\n{out.stderr[-3000:]}")
            result = json.loads(out.stdout.strip().splitlines()[-1])
            assert result["count"] == count, result
            return result

        def cli_requests(*cli_args: str, stdin: bytes | None = None) -> int:
            """How many requests the command sends, counted at a proxy."""
            proxy = FaultProxy(server.host, server.port)
            try:
                out = subprocess.run([str(cli), "--uri", server.uri().replace(f":{server.port}/", f":{proxy.port}/"),
                                      *cli_args], input=stdin or b"", env=env, capture_output=True, timeout=3600)
                assert out.returncode == 0, out.stderr
                return len(proxy.requests)
            finally:
                proxy.close()

        def cli_run(*cli_args: str, stdin: bytes | None = None) -> tuple[float, int, bytes]:
            # A fresh Python process per command: RUSAGE_CHILDREN is then chstate's alone.
            code = (
                "import resource, subprocess, sys, time\n"
                "data = open(sys.argv[1], 'rb').read() if sys.argv[1] != '-' else b''\n"
                "t0 = time.perf_counter()\n"
                "p = subprocess.run(sys.argv[2:], input=data, capture_output=True)\n"
                "dt = time.perf_counter() - t0\n"
                "sys.stderr.buffer.write(p.stderr)\n"
                "sys.stdout.buffer.write(p.stdout)\n"
                "print(f'\\n{dt} {resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss} {p.returncode}',"
                " file=sys.stderr)\n")
            stdin_path = "-"
            if stdin is not None:
                stdin_path = str(tmp / "stdin.json")
                Path(stdin_path).write_bytes(stdin)
            out = subprocess.run([sys.executable, "-c", code, stdin_path, str(cli), "--uri", server.uri(), *cli_args],
                                 env=env, capture_output=True, timeout=3600)
            dt, peak, rc = out.stderr.decode().strip().splitlines()[-1].split()
            if rc != "0":
                raise SystemExit(f"chstate {' '.join(cli_args)} failed:\n{out.stderr.decode()[-3000:]}")
            return float(dt), int(peak), out.stdout

        rows: dict[str, list[dict]] = {}

        def record(name: str, result: dict) -> None:
            rows.setdefault(name, []).append(result)

        document = b""
        for r in range(args.repeat):
            # A schema per round: the loops leave thousands of small parts (twice as many with the
            # state history), and dropping them takes the server a while.
            schema = f"chstate_export_bench_{r}"
            env["B_SCHEMA"] = env["MELTANO_STATE_BACKEND_CLICKHOUSE_SCHEMA"] = schema
            server.sql(f"DROP DATABASE IF EXISTS `{schema}`", timeout=600)
            server.sql(f"CREATE DATABASE `{schema}`")
            child("import", 1)  # the tables, outside the timing
            record("import-loop", child("import-loop", n))
            server.sql(f"TRUNCATE TABLE `{schema}`.state")
            record("import", child("import", n))
            record("export-loop", child("export-loop", n))
            record("export", child("export", n))
            dt, peak, document = cli_run("export")
            assert len(json.loads(document)) == n
            record("cli-export", {"seconds": dt, "requests": cli_requests("export"), "peak_kib": peak, "count": n})
            server.sql(f"TRUNCATE TABLE `{schema}`.state")
            dt, peak, out = cli_run("import", "-", stdin=document)
            assert out.strip() == str(n).encode(), out
            record("cli-import", {"seconds": dt, "requests": cli_requests("import", "-", stdin=document),
                                  "peak_kib": peak, "count": n})
        # Memory against the number of states: a tenth of them, exported by the CLI.
        small = n // 10
        server.sql(f"TRUNCATE TABLE `{schema}`.state")
        child("import", small)
        for _ in range(args.repeat):
            dt, peak, _ = cli_run("export")
            record("cli-export-small", {"seconds": dt, "requests": cli_requests("export"), "peak_kib": peak,
                                        "count": small})
        for r in range(args.repeat):
            server.sql(f"DROP DATABASE IF EXISTS `chstate_export_bench_{r}`", timeout=600)
    finally:
        if started:
            stop_server(tmp / "clickhouse", remove=True)
        shutil.rmtree(tmp, ignore_errors=True)

    def med(name: str, key: str) -> float:
        return statistics.median(r[key] for r in rows[name])

    labels = [
        ("import", f"import {n:,}: adapter set_all (core import)", "import-loop"),
        ("import-loop", f"import {n:,}: base-class set_all loop", None),
        ("cli-import", f"import {n:,}: `chstate import`", "import-loop"),
        ("export", f"export {n:,}: adapter get_all (core export)", "export-loop"),
        ("export-loop", f"export {n:,}: base-class get_all loop", None),
        ("cli-export", f"export {n:,}: `chstate export`", "export-loop"),
        ("cli-export-small", f"export {n // 10:,}: `chstate export`", None),
    ]
    print(f"\n{n:,} Meltano states on ClickHouse 18.16 (loopback), medians of {args.repeat} runs, "
          f"{os.cpu_count()} cores:\n")
    print("| operation | round trips | time | peak memory (RSS) | speed-up vs the loop |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for key, label, versus in labels:
        seconds = med(key, "seconds")
        speedup = f"{med(versus, 'seconds') / seconds:.1f}x" if versus else "-"
        print(f"| {label} | {int(med(key, 'requests')):,} | {seconds * 1000:,.0f} ms | "
              f"{med(key, 'peak_kib') / 1024:.1f} MiB | {speedup} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
