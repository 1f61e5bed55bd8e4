#!/usr/bin/env python3
"""What chstate costs Meltano per STATE message, against the default backend.

  python3 tools/meltano_bench.py [--messages 1000] [--repeat 3] [--backends systemdb,clickhouse,chdb]

For each backend it times `meltano run tap-counter target-echo` twice: once
with the tap emitting N STATE messages (one per record; Meltano persists each
with update(): lock, get, set, unlock) and once with a single STATE message
for the same N records. The difference, divided by N - 1, is the cost of one
persisted STATE message; the last column is that cost minus systemdb's.

Backends: `systemdb` (Meltano's default, SQLite in .meltano/meltano.db),
`clickhouse` (chstate over HTTP to a throwaway ClickHouse 18.16 on loopback,
or the one CHSTATE_TEST_* point at), `clickhouse-nohistory` (the same with
history_days = 0: no history table or view), `clickhouse-wasm` (the same, from the
pure wheel: the core as chstate.wasm on wasmtime, no native library) and
`chdb` (chstate embedded in Meltano's process). Uses the cached Meltano venv
of tests/meltano (pinned versions) and builds //hosts/python:libchstate.so
with -c opt unless CHSTATE_LIBRARY is set; the pure wheel's venv is
tests/meltano's too (harness.pure_venv). The backends take turns within each
repetition (A B A B), so a slow moment of the machine falls on all of them.
With a server it also times the raw INSERT floor: --messages INSERTs of one
state into a plain ReplacingMergeTree (no view, no lock) over one keep-alive
connection, --repeat times after all the runs (the floor's own parts, one
per INSERT, would load the server the runs share), shown per INSERT.
Prints a Markdown table; times are medians over --repeat runs.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "meltano"))

import meltano_harness as harness  # noqa: E402
from chserver import from_env, start_server, stop_server  # noqa: E402


def opt_library() -> Path:
    if os.environ.get("CHSTATE_LIBRARY"):
        return Path(os.environ["CHSTATE_LIBRARY"]).resolve()
    # --symlink_prefix=/ leaves bazel-bin pointing where it did: others use it.
    subprocess.run(["bazel", "build", "-c", "opt", "--symlink_prefix=/", "//hosts/python:libchstate.so"], cwd=REPO,
                   check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    bin_dir = subprocess.run(["bazel", "info", "-c", "opt", "bazel-bin"], cwd=REPO, check=True, capture_output=True,
                             text=True).stdout.strip()
    return Path(bin_dir, "hosts", "python", "libchstate.so").resolve()


def timed_run(project: harness.MeltanoProject, state_id: str, messages: int, state_every: int) -> float:
    # A fresh start every time: clear the state, then time the run alone.
    project.run("state", "clear", "--force", state_id, expect=None)
    env = project.env(TAP_COUNTER_TOTAL=str(messages), TAP_COUNTER_STATE_EVERY=str(state_every))
    started = time.perf_counter()
    out = project.run("run", "tap-counter", "target-echo", env=env, timeout=1800)
    elapsed = time.perf_counter() - started
    updates = out.stderr.count("Incremental state has been updated")
    expected = messages // state_every + (1 if messages % state_every else 0)
    assert updates == expected, f"expected {expected} state updates, Meltano logged {updates}"
    return elapsed


def raw_insert_ms(server, n: int) -> float:
    """Median ms of n INSERTs of one state into a plain ReplacingMergeTree, one connection."""
    import http.client
    import urllib.parse

    server.sql("CREATE DATABASE IF NOT EXISTS chstate_meltano_bench_floor")
    server.sql("CREATE TABLE IF NOT EXISTS chstate_meltano_bench_floor.state (state_id String, partial_state "
               "Nullable(String), completed_state Nullable(String), updated_at DateTime DEFAULT now()) "
               "ENGINE = ReplacingMergeTree(updated_at) ORDER BY state_id")
    conn = http.client.HTTPConnection(server.host, server.port, timeout=30)
    headers = {"X-ClickHouse-User": server.user, "X-ClickHouse-Key": server.password}
    state = '{"singer_state":{"bookmarks":{"numbers":{"id":1}}}}'
    sql = ("INSERT INTO chstate_meltano_bench_floor.state (state_id, partial_state, completed_state) VALUES "
           f"('dev:tap-counter-to-target-echo', NULL, '{state}')")
    out = []
    try:
        for _ in range(n):
            started = time.perf_counter()
            conn.request("POST", "/?" + urllib.parse.urlencode({"database": "default"}), body=sql.encode(),
                         headers=headers)
            response = conn.getresponse()
            body = response.read()
            out.append((time.perf_counter() - started) * 1000)
            if response.status != 200:
                raise SystemExit(f"the raw INSERT failed: HTTP {response.status}: {body[:300]!r}")
    finally:
        conn.close()
    return statistics.median(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--messages", type=int, default=1000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--backends", default="systemdb,clickhouse,chdb",
                    help="comma-separated subset of systemdb, clickhouse, clickhouse-nohistory, clickhouse-wasm, chdb "
                         "(systemdb is "
                         "always measured: it is the baseline)")
    args = ap.parse_args()
    n = args.messages
    wanted = {"systemdb", *args.backends.split(",")}
    unknown = wanted - {"systemdb", "clickhouse", "clickhouse-nohistory", "clickhouse-wasm", "chdb"}
    if unknown:
        ap.error(f"unknown backend(s) {', '.join(sorted(unknown))}")

    venv = harness.ensure_venv()
    harness.install_adapter(venv)
    library = opt_library()
    tmp = Path(tempfile.mkdtemp(prefix="chstate-meltano-bench-"))
    pure = harness.pure_venv(harness.wasm_module()) if "clickhouse-wasm" in wanted else None
    need_server = bool(wanted & {"clickhouse", "clickhouse-nohistory", "clickhouse-wasm"})
    server = from_env() if need_server else None
    started = need_server and server is None
    try:
        if started:
            server = start_server(tmp / "clickhouse")
        backends = {"systemdb": ("systemdb", {}, venv)}
        if server is not None:
            ch_env = {"MELTANO_STATE_BACKEND_CLICKHOUSE_PASSWORD": server.password,
                      "MELTANO_STATE_BACKEND_CLICKHOUSE_SCHEMA": "chstate_meltano_bench"}
            if "clickhouse" in wanted:
                backends["chstate → ClickHouse 18.16 (HTTP, loopback)"] = (server.uri(), ch_env, venv)
            if "clickhouse-nohistory" in wanted:
                backends["chstate, history off (history_days = 0) → ClickHouse 18.16"] = (
                    server.uri(), dict(ch_env, MELTANO_STATE_BACKEND_CLICKHOUSE_SCHEMA="chstate_meltano_bench_nohist",
                                       MELTANO_STATE_BACKEND_CLICKHOUSE_HISTORY_DAYS="0"), venv)
            if pure is not None:
                backends["chstate, pure wheel (Wasm core) → ClickHouse 18.16"] = (
                    server.uri(), dict(ch_env, MELTANO_STATE_BACKEND_CLICKHOUSE_SCHEMA="chstate_meltano_bench_wasm"),
                    pure)
        if "chdb" in wanted:
            backends["chstate → chDB 26.9 (embedded)"] = (f"chdb://{tmp / 'chdb'}", {}, venv)
        state_id = "dev:tap-counter-to-target-echo"
        projects = {}
        for name, (uri, env, where) in backends.items():
            project = harness.MeltanoProject(tmp / f"project-{len(projects)}", where, library,
                                             state_backend_uri=uri, env=env)
            if where is pure:
                del project.base_env["CHSTATE_LIBRARY"]  # the pure wheel's core alone
            projects[name] = project
            timed_run(project, state_id, 5, 1)  # warm-up: systemdb migrations, the schema, caches
        times = {name: ([], []) for name in projects}
        floor = []
        for _ in range(args.repeat):
            for name, project in projects.items():  # A B A B: each backend once per round
                times[name][0].append(timed_run(project, state_id, n, 1))
                times[name][1].append(timed_run(project, state_id, n, n))
        # After every run: its parts (one per INSERT) would load the server the runs share.
        if server is not None:
            floor = [raw_insert_ms(server, n) for _ in range(args.repeat)]
        results = {}
        for name, (many, one) in times.items():
            results[name] = (statistics.median(many), statistics.median(one))
            print(f"  {name}: {n} STATE messages {results[name][0]:.2f} s, 1 STATE message {results[name][1]:.2f} s",
                  file=sys.stderr, flush=True)
    finally:
        if started:
            stop_server(tmp / "clickhouse", remove=True)
        shutil.rmtree(tmp, ignore_errors=True)

    base_many, base_one = results["systemdb"]
    base_per = (base_many - base_one) / (n - 1) * 1000
    print(f"\n`meltano run` of {n} records, medians of {args.repeat} runs (Meltano 4.4.1, "
          f"{os.cpu_count()} cores):\n")
    print(f"| state backend | {n} STATE messages | 1 STATE message | per STATE message | vs systemdb per message "
          "| ratio to systemdb |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    per_of = {}
    for name, (many, one) in results.items():
        per = per_of[name] = (many - one) / (n - 1) * 1000
        ratio = f"{per / base_per:.2f}x" if base_per > 0 else "n/a (systemdb's difference was not positive)"
        print(f"| {name} | {many:.2f} s | {one:.2f} s | {per:.2f} ms | {per - base_per:+.2f} ms | {ratio} |")
    if floor:
        print(f"| the raw INSERT floor: one INSERT of a state into a plain table, no Meltano | | | "
              f"{statistics.median(floor):.2f} ms | | |")
    native = next((v for k, v in per_of.items() if k.startswith("chstate → ClickHouse")), None)
    wasm = next((v for k, v in per_of.items() if "pure wheel" in k), None)
    if native and wasm and native > 0:
        print(f"\nThe pure wheel's Wasm core per STATE message: {wasm / native:.2f}x the native wheel's.")
    print(f"\n(total difference / {n}, as the simple measure: "
          + ", ".join(f"{name.split(' ')[0] if name == 'systemdb' else name}: "
                      f"{(many - base_many) / n * 1000:+.2f} ms" for name, (many, _) in results.items()
                      if name != "systemdb") + ")")
    return 0


if __name__ == "__main__":
    sys.exit(main())
