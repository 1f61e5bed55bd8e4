#!/usr/bin/env python3
"""What cluster mode costs: one ClickHouse server vs a three-replica cluster
(ZooKeeper + r1, r2, r3, quorum 2) on this machine, in one run.

  python3 tools/cluster_bench.py [--iterations N] [--binary PATH]

Starts both with tools/clickhouse_server.py in temporary folders, builds
//tools:cluster_bench (-c opt, without touching bazel-bin) and runs it twice,
the cluster named by its host list r1,r2,r3 (the client starts on r1):
first with every replica up, then with r2 stopped cleanly (a replica the
client does not use first; writes still reach their quorum of 2 on r1 and
r3). Each run measures the one server again and prints a Markdown table with
the ratios and the line "cluster update / one-server update", and beside
update() as the Meltano adapter runs it its raw floor on the same target: the
state read (sequentially consistent on the cluster) and the quorum INSERT, as
the store writes them, sent raw over one connection. Stops everything
it started. Passwords reach the binary through its environment only.
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

DOWN = "r2"  # stopped for the second table: not the first host of the list


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--iterations", type=int, default=30)
    ap.add_argument("--binary", type=Path, help="a cluster_bench built before (say, of another commit) instead of "
                                                "building this tree's")
    args = ap.parse_args()
    if args.binary:
        binary = args.binary.resolve()
    else:
        build = ["bazel", "build", "-c", "opt", "--symlink_prefix=/", "//tools:cluster_bench"]
        subprocess.run(build, cwd=ROOT, check=True)
        bin_dir = subprocess.run(["bazel", "info", "-c", "opt", "bazel-bin"], cwd=ROOT, check=True,
                                 capture_output=True, text=True).stdout.strip()
        binary = Path(bin_dir) / "tools" / "cluster_bench"
    with tempfile.TemporaryDirectory(prefix="chstate-bench-") as tmp:
        single_dir, cluster_dir = Path(tmp) / "single", Path(tmp) / "cluster"
        try:
            single = chs.start(single_dir)
            cluster = chs.start_cluster(cluster_dir)
            env = dict(os.environ, CHSTATE_BENCH_SINGLE_PASSWORD=single["password"],
                       CHSTATE_BENCH_CLUSTER_PASSWORD=cluster["password"])
            hosts = ",".join(f"127.0.0.1:{cluster['ports'][r]['http_port']}" for r in chs.REPLICAS)
            replicas = len(chs.REPLICAS)

            def bench(title: str, *extra: str) -> int:
                sys.stdout.flush()
                return subprocess.call([str(binary), "--single-port", str(single["http_port"]),
                                        "--cluster-hosts", hosts, "--cluster", cluster["name"],
                                        "--iterations", str(args.iterations), "--title", title, *extra], env=env)

            healthy = bench(f"one server vs a {replicas}-replica cluster (quorum 2), every replica up")
            chs.stop(cluster_dir / DOWN)
            down = bench(f"one server vs the {replicas}-replica cluster (quorum 2) with {DOWN} stopped "
                         f"(the client starts on {chs.REPLICAS[0]})", "--skip-init")
            return healthy or down
        finally:
            chs.stop(single_dir)
            chs.stop_cluster(cluster_dir)


if __name__ == "__main__":
    sys.exit(main())
