#!/usr/bin/env python3
"""What feeding the state history costs one write, by how the history is fed:
the raw INSERT of one state row (chstate's statement, without its lock
fence) into a plain ReplacingMergeTree (no history), into a state table whose
materialized view writes straight into the history table (chstate up to
22ec9cb), and into one whose view writes into a Buffer table in front of the
history table (chstate now, docs/operations.md "State history"); and a view
that keeps complete states only, written a complete and a partial state.

  python3 tools/history_engines_bench.py [--rounds 8] [--inserts 100]

On ClickHouse 18.16 on loopback (the one CHSTATE_TEST_* name, else a
throwaway one), in a schema of its own; the three take turns, --inserts each
per round. Prints p50 and p90 per INSERT and the ratio of medians to plain.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

from chserver import from_env, start_server, stop_server  # noqa: E402

COLS = "(state_id String, partial_state Nullable(String), completed_state Nullable(String), updated_at DateTime DEFAULT now())"
HCOLS = "(state_id String, partial_state Nullable(String), completed_state Nullable(String), updated_at DateTime)"
NAMES = {"plain": "plain ReplacingMergeTree, no history",
         "direct": "state table, view into the history table (before)",
         "complete": "state table, view of complete states only (WHERE partial_state IS NULL), a complete state",
         "partial": "the same view, a partial state (filtered out: no history row)",
         "buffered": "state table, view into a Buffer in front of the history table (now)"}
STATE = '{"singer_state":{"bookmarks":{"users":{"updated_at":"2024-01-02T03:04:05Z"}}}}'


def make(q, t: str) -> None:
    for suffix in ("_mv", "_bmv", "_history_buffer", "_history", ""):
        q(f"DROP TABLE IF EXISTS hb.{t}{suffix}")
    q(f"CREATE TABLE hb.{t} {COLS} ENGINE = ReplacingMergeTree(updated_at) ORDER BY state_id")
    if t == "plain":
        return
    q(f"CREATE TABLE hb.{t}_history {HCOLS} ENGINE = MergeTree() PARTITION BY toYYYYMM(updated_at) "
      "ORDER BY (state_id, updated_at)")
    select = f"SELECT state_id, partial_state, completed_state, updated_at FROM hb.{t}"
    if t == "direct":
        q(f"CREATE MATERIALIZED VIEW hb.{t}_mv TO hb.{t}_history AS {select}")
    elif t in ("complete", "partial"):
        q(f"CREATE MATERIALIZED VIEW hb.{t}_mv TO hb.{t}_history AS {select} WHERE partial_state IS NULL")
    else:
        # chstate's buffer (core/statements.cc CreateHistoryBuffer).
        q(f"CREATE TABLE hb.{t}_history_buffer AS hb.{t}_history ENGINE = Buffer('hb', '{t}_history', 1, 10, 10, "
          "10000, 10000, 67108864, 67108864)")
        q(f"CREATE MATERIALIZED VIEW hb.{t}_bmv TO hb.{t}_history_buffer AS {select}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--inserts", type=int, default=100)
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="chstate-history-engines-"))
    server = from_env()
    started = server is None
    if started:
        server = start_server(tmp / "clickhouse")
    try:
        q = server.sql
        q("CREATE DATABASE IF NOT EXISTS hb")
        for t in NAMES:
            make(q, t)
        times = {t: [] for t in NAMES}
        for _ in range(args.rounds):
            for t in times:
                for _ in range(args.inserts):
                    t0 = time.perf_counter()
                    partial = f"'{STATE}'" if t == "partial" else "NULL"
                    q(f"INSERT INTO hb.{t} (state_id, partial_state, completed_state) VALUES ('dev:a', {partial}, "
                      f"'{STATE}')")
                    times[t].append(time.perf_counter() - t0)
        base = statistics.median(times["plain"])
        print(f"| INSERT of one state (18.16, loopback, {args.rounds} alternating rounds of {args.inserts}) "
              "| p50 | p90 | vs plain |")
        print("| --- | ---: | ---: | ---: |")
        for t, v in times.items():
            v = sorted(v)
            print(f"| {NAMES[t]} | {statistics.median(v) * 1000:.2f} ms | {v[int(len(v) * 0.9)] * 1000:.2f} ms "
                  f"| {statistics.median(v) / base:.2f}x |")
        q("DROP DATABASE IF EXISTS hb")
    finally:
        if started:
            stop_server(tmp / "clickhouse", remove=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
