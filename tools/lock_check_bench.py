#!/usr/bin/env python3
"""What the mixed-fleet check costs: every lock acquisition first looks for a
live row of the Python ClickHouse backend in <table>_lock (whatever
python_locks says). Prints, in one run against one server, the median time of
a lock scope (acquire + release, no write) through the Python binding, of the
look alone sent raw over one connection, and of the lock's own statements
sent raw, with the look's share.

    python3 tools/lock_check_bench.py [--n 300]     # a throwaway ClickHouse is started
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "hosts" / "python"))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=300, help="scopes (and raw sends) timed")
    args = parser.parse_args()
    subprocess.run(["bazel", "build", "//hosts/python:libchstate.so"], cwd=REPO, check=True, capture_output=True)
    lib = subprocess.run(["bazel", "info", "bazel-bin"], cwd=REPO, capture_output=True, text=True).stdout.strip()
    os.environ["CHSTATE_LIBRARY"] = f"{lib}/hosts/python/libchstate.so"
    from chstate_meltano import _native
    from chstate_meltano.binding import Store

    with tempfile.TemporaryDirectory() as tmp:
        out = subprocess.run([sys.executable, str(REPO / "tools" / "clickhouse_server.py"), "start", tmp],
                             capture_output=True, text=True, check=True)
        env = dict(line.split("=", 1) for line in out.stdout.splitlines() if "=" in line)
        try:
            host, port = env["CHSTATE_TEST_HOST"], int(env["CHSTATE_TEST_PORT"])
            uri = f"clickhouse://{env['CHSTATE_TEST_USER']}@{host}:{port}/default"
            sent: list = []
            store = Store(_native.NativeCore(), {"uri": uri, "password": env["CHSTATE_TEST_PASSWORD"],
                                                 "schema": "bench"}, env={}, timers=False)
            transport = store._transport

            def recording(request):
                sent.append(request)
                return transport(request)

            store._transport = recording
            store.set("dev:a", {"singer_state": {}})  # the schema and tables
            scope = []
            for _ in range(args.n):
                sent.clear()
                started = time.perf_counter()
                with store.lock("dev:a"):
                    pass
                scope.append(time.perf_counter() - started)
            statements = {r["purpose"]: r for r in sent}
            store.close()

            conn = http.client.HTTPConnection(host, port)
            headers = {"X-ClickHouse-User": env["CHSTATE_TEST_USER"], "X-ClickHouse-Key": env["CHSTATE_TEST_PASSWORD"]}

            def raw(purposes: list) -> float:
                times = []
                for _ in range(args.n):
                    started = time.perf_counter()
                    for p in purposes:
                        r = statements[p]
                        query = "&".join(f"{k}={v}" for k, v in r["url_params"] if not k.startswith("param_"))
                        conn.request("POST", "/?database=default&" + query, body=r["sql"].encode(), headers=headers)
                        conn.getresponse().read()
                    times.append(time.perf_counter() - started)
                return statistics.median(times)

            look = raw(["foreign_lock_rows"])
            lock_only = raw([p for p in statements if p != "foreign_lock_rows"])
        finally:
            subprocess.run([sys.executable, str(REPO / "tools" / "clickhouse_server.py"), "stop", tmp],
                           capture_output=True)
    whole = statistics.median(scope)
    print(f"{'':44}{'p50 ms':>10}")
    print(f"{'lock scope (acquire + release), binding':44}{whole * 1e3:>10.2f}")
    print(f"{'  its lock statements, raw':44}{lock_only * 1e3:>10.2f}   ({', '.join(p for p in statements if p != 'foreign_lock_rows')})")
    print(f"{'  the Python-backend look alone, raw':44}{look * 1e3:>10.2f}")
    print(f"{'the look, share of the scope':44}{look / whole * 100:>9.1f}%")
    print(json.dumps({"scope_ms": whole * 1e3, "lock_raw_ms": lock_only * 1e3, "look_raw_ms": look * 1e3}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
