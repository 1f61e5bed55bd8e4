#!/usr/bin/env python3
"""What cluster mode costs: one ClickHouse server vs a two-replica cluster
(ZooKeeper + r1 + r2, quorum 2) on this machine, in one run.

  python3 tools/cluster_bench.py [--iterations N]

Starts both with tools/clickhouse_server.py in temporary folders, builds and
runs //tools:cluster_bench (-c opt, without touching bazel-bin), prints its
Markdown table, and stops everything it started. Passwords reach the binary
through its environment only.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))
import clickhouse_server as chs  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--iterations", type=int, default=30)
    args = ap.parse_args()
    build = ["bazel", "build", "-c", "opt", "--symlink_prefix=/", "//tools:cluster_bench"]
    subprocess.run(build, cwd=ROOT, check=True)
    bin_dir = subprocess.run(["bazel", "info", "-c", "opt", "bazel-bin"], cwd=ROOT, check=True, capture_output=True,
                             text=True).stdout.strip()
    binary = Path(bin_dir) / "tools" / "cluster_bench"
    with tempfile.TemporaryDirectory(prefix="chstate-bench-") as tmp:
        single_dir, cluster_dir = Path(tmp) / "single", Path(tmp) / "cluster"
        try:
            single = chs.start(single_dir)
            cluster = chs.start_cluster(cluster_dir)
            env = dict(os.environ, CHSTATE_BENCH_SINGLE_PASSWORD=single["password"],
                       CHSTATE_BENCH_CLUSTER_PASSWORD=cluster["password"])
            return subprocess.call([str(binary), "--single-port", str(single["http_port"]),
                                    "--cluster-port", str(cluster["ports"]["r1"]["http_port"]),
                                    "--cluster", cluster["name"], "--iterations", str(args.iterations)], env=env)
        finally:
            chs.stop(single_dir)
            chs.stop_cluster(cluster_dir)


if __name__ == "__main__":
    sys.exit(main())
