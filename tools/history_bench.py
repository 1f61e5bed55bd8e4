#!/usr/bin/env python3
"""What keeping the state history costs a write: Meltano's set() (and
update()) through the adapter with history on (the default, 30 days) and off
(history_days = 0), on one ClickHouse 18.16 on loopback.

  python3 tools/history_bench.py [--writes 300] [--rounds 5]

Two stores in one process, each on its own schema, take turns: each round
times --writes writes with one, then the other, so both see the same machine
load. With history on, every insert into the state table also feeds the
history table through a materialized view (no request of its own). Prints
p50 and p90 of the per-write times over all rounds, and the ratio of the
medians (on / off). Uses the cached Meltano venv of tests/meltano and a -c opt
build of the library (tools/meltano_bench.py's).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "meltano"))
sys.path.insert(0, str(REPO / "tools"))

import meltano_harness as harness  # noqa: E402
from chserver import from_env, start_server, stop_server  # noqa: E402
from meltano_bench import opt_library  # noqa: E402

CHILD = r"""
import json, os, statistics, sys, time
from meltano.core.state_store.base import MeltanoState
from chstate_meltano.backend import ClickhouseStateStoreManager

writes, rounds = int(sys.argv[1]), int(sys.argv[2])
def make(schema, days):
    m = ClickhouseStateStoreManager(uri=os.environ["B_URI"], password=os.environ.get("B_PASSWORD") or None,
                                    schema=schema, history_days=days, lock_timeout_seconds=10, lock_retry_seconds=1)
    m.migrate()
    return m
stores = {"on": make("chstate_history_bench_on", 30), "off": make("chstate_history_bench_off", 0)}
times = {"on": {"set": [], "update": []}, "off": {"set": [], "update": []}}
for r in range(rounds):
    for name, m in (stores.items() if r % 2 == 0 else reversed(list(stores.items()))):
        for i in range(writes):
            s = MeltanoState(state_id=f"dev:tap-{i % 10}-to-target", partial_state={},
                             completed_state={"singer_state": {"bookmarks": {"s": {"n": i, "round": r}}}})
            t0 = time.perf_counter()
            m.set(s)
            times[name]["set"].append(time.perf_counter() - t0)
        for i in range(writes // 3):
            s = MeltanoState(state_id="dev:tap-u-to-target", partial_state={"singer_state": {"n": i}},
                             completed_state={})
            t0 = time.perf_counter()
            m.update(s)
            times[name]["update"].append(time.perf_counter() - t0)
history_rows = stores["on"].history("dev:tap-0-to-target", limit=1000000)
print(json.dumps({"times": times, "versions_of_one_id": len(history_rows)}))
"""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--writes", type=int, default=300)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    venv = harness.ensure_venv()
    harness.install_adapter(venv)
    library = opt_library()
    server = from_env()
    started = server is None
    tmp = Path(os.environ.get("TMPDIR", "/tmp")) / f"chstate-history-bench-{os.getpid()}"
    try:
        if started:
            server = start_server(tmp / "clickhouse")
        for schema in ("chstate_history_bench_on", "chstate_history_bench_off"):
            server.sql(f"DROP DATABASE IF EXISTS `{schema}`")
        env = harness.clean_env()
        env.update({"CHSTATE_LIBRARY": str(library), "B_URI": server.uri(), "B_PASSWORD": server.password or ""})
        out = subprocess.run([str(venv / "bin" / "python"), "-c", CHILD, str(args.writes), str(args.rounds)],
                             env=env, capture_output=True, text=True, timeout=3600)
        if out.returncode != 0:
            raise SystemExit(out.stderr[-3000:])
        result = json.loads(out.stdout.strip().splitlines()[-1])
        for schema in ("chstate_history_bench_on", "chstate_history_bench_off"):
            server.sql(f"DROP DATABASE IF EXISTS `{schema}`")
    finally:
        if started:
            stop_server(tmp / "clickhouse", remove=True)

    def pct(xs: list, q: float) -> float:
        xs = sorted(xs)
        return xs[min(len(xs) - 1, int(q * len(xs)))] * 1000

    times = result["times"]
    expected = args.rounds * -(-args.writes // 10)
    assert result["versions_of_one_id"] == expected, (result["versions_of_one_id"], expected)
    print(f"\nWrites through the Meltano adapter, ClickHouse 18.16 on loopback, {args.rounds} rounds, "
          f"{os.cpu_count()} cores (every write of one id was found in its history: "
          f"{result['versions_of_one_id']} versions):\n")
    print("| operation | history off p50 / p90 | history on p50 / p90 | on / off (p50) |")
    print("| --- | ---: | ---: | ---: |")
    for op in ("set", "update"):
        off, on = times["off"][op], times["on"][op]
        print(f"| {op}() x {len(on)} | {pct(off, .5):.2f} / {pct(off, .9):.2f} ms | {pct(on, .5):.2f} / "
              f"{pct(on, .9):.2f} ms | {pct(on, .5) / pct(off, .5):.2f}x |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
