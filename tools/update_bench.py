#!/usr/bin/env python3
"""What Meltano's update() costs with chstate, against the floor and systemdb.

  python3 tools/update_bench.py [--updates 600] [--rounds 6] [--meltano-messages 300] [--repeat 3]

Three tables, each measured side by side in one run (these machines are
noisy: read the ratios):

1. update() per STATE message, as Meltano calls it (StateStoreManager.update:
   the id's lock, then set; the state is complete, so Meltano skips get), one
   id, one process, one connection, in interleaved rounds:
   - chstate: the adapter as shipped (the lock lingers between updates);
   - chstate, linger_locks off: the lock taken and dropped every time (before);
   - the same statements raw: the SQL chstate sent in the first row (its
     state-table and waiter reads and writes; the lock DDL a round's first
     update may send is left out), replayed over one keep-alive connection
     with no core in between;
   - the lock-free floor: get() + set_all() of the one state through the
     adapter (the core's import: no lock; set() takes the id's lock);
   - systemdb: Meltano's default backend (SQLite), update() in-process.
2. Fairness: one process streams update()s of an id as fast as it can while
   another process makes a single update() of the same id; its latency,
   with the default lock_retry_seconds (1) and with 0.25.
3. `meltano run tap-counter target-echo` with one STATE per record, against
   one STATE for the same records (tools/meltano_bench.py's measure): the
   cost of a persisted STATE message with systemdb and with chstate.

The server is the ClickHouse CHSTATE_TEST_* point at, else a throwaway 18.16
on loopback. Uses the cached Meltano venv of tests/meltano and builds
//hosts/python:libchstate.so with -c opt unless CHSTATE_LIBRARY is set.
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
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

# ---------------------------------------------------------------- inside the venv

INNER = r'''
import json, os, sys, time, statistics
from collections import Counter
from chstate_meltano.backend import ClickhouseStateStoreManager
from chstate_meltano._http import HttpTransport
from chstate_meltano import _native
from meltano.core.state_store import MeltanoState

cfg = json.loads(sys.argv[1])
uri, password, schema = cfg["uri"], cfg["password"], cfg["schema"]
mode = cfg["mode"]


def manager(linger=True, **kw):
    # linger_locks is a setting (on by default in Python, which renews and releases in the background).
    return ClickhouseStateStoreManager(uri, password=password, schema=schema,
                                       **({} if linger else {"linger_locks": False}), **kw)


def state(state_id, i):
    return MeltanoState(state_id=state_id, completed_state={"singer_state": {"bookmarks": {"n": i}}},
                        partial_state={})


if mode == "stream":
    m = manager(lock_retry_seconds=cfg["retry"])
    end = time.monotonic() + cfg["seconds"]
    n = 0
    while time.monotonic() < end:
        m.update(state(cfg["id"], n))
        n += 1
    m.close()
    print(json.dumps({"updates": n}))
    sys.exit(0)

if mode == "single":
    m = manager(lock_retry_seconds=cfg["retry"])
    m.get(cfg["id"])  # connected, schema known: only the update is timed
    t = time.perf_counter()
    m.update(state(cfg["id"], -1))
    took = time.perf_counter() - t
    m.close()
    print(json.dumps({"seconds": took}))
    sys.exit(0)

# mode == "update": the per-update table
def recording(m, log):
    make = m._make_transport
    def wrapped():
        t = make()
        def call(req):
            log.append(req)
            return t(req)
        call.close = t.close
        return call
    m._make_transport = wrapped
    return m

logs = {"chstate": [], "chstate_no_linger": [], "floor": []}
lingering = recording(manager(), logs["chstate"])
plain = recording(manager(linger=False), logs["chstate_no_linger"])
floor = recording(manager(), logs["floor"])
from meltano.core.project import Project
from meltano.core.db import project_engine
from meltano.core.state_store.db import DBStateStoreManager
project = Project.find()
engine, Session = project_engine(project)
systemdb = DBStateStoreManager(session=Session())

# Warm up each (schema, connection, dialect, systemdb tables).
for k, m in (("a", lingering), ("b", plain), ("c", floor), ("d", systemdb)):
    m.update(state(f"dev:bench-{k}", 0)) if m is not floor else (m.get("dev:bench-c"), m.set_all([state("dev:bench-c", 0)]))
logs_all = [req for log in logs.values() for req in log]
for log in logs.values():
    log.clear()

# The history upkeep's look (one write in 64) is a state read like the others.
REPLAYED = {"insert_state", "get_state", "lock_waiters", "select_version", "history_over_limits"}
raw_transport = HttpTransport(_native.resolve_settings({"from": "api", "values": {"uri": uri, "password": password},
                                                        "env": {}})["connection"])
times = {k: [] for k in ("chstate", "chstate_no_linger", "raw", "plain_insert", "floor", "systemdb")}
# One raw INSERT of the state into a plain ReplacingMergeTree (no view, no fence): the request
# of chstate's first insert as the template (its host and port), the SQL replaced.
template = dict(next(r for r in logs_all if r["purpose"] == "insert_state"), url_params=[])
def plain_request(sql):
    return dict(template, sql=sql)
out = raw_transport(plain_request(f"CREATE TABLE IF NOT EXISTS `{schema}`.`plain_state` (state_id String, partial_state "
                                  "Nullable(String), completed_state Nullable(String), updated_at DateTime DEFAULT now()) "
                                  "ENGINE = ReplacingMergeTree(updated_at) ORDER BY state_id"))
assert out.get("transport_ok") and out.get("http_status") == 200, out
per_update_sql = []  # the requests of each chstate update, for the raw replay
n, rounds = cfg["updates"], cfg["rounds"]
i = 0
for r in range(rounds):
    for _ in range(n // rounds):
        i += 1
        before = len(logs["chstate"])
        t = time.perf_counter(); lingering.update(state("dev:bench-a", i)); times["chstate"].append(time.perf_counter() - t)
        per_update_sql.append(logs["chstate"][before:])
    # Replayed at once, while the lock those updates took still lingers: the insert is fenced on it.
    for k in range(n // rounds):
        reqs = per_update_sql[r * (n // rounds) + k]
        t = time.perf_counter()
        for req in reqs:
            if req["purpose"] not in REPLAYED:
                continue  # lock DDL (a round's first update after an idle release) is not replayed
            out = raw_transport(req)
            # A waiter look at a lock table dropped since answers 404: an answer all the same.
            assert out.get("transport_ok") and (out.get("http_status") == 200 or req["purpose"] == "lock_waiters"), out
        times["raw"].append(time.perf_counter() - t)
    for _ in range(n // rounds):
        i += 1
        t = time.perf_counter(); plain.update(state("dev:bench-b", i)); times["chstate_no_linger"].append(time.perf_counter() - t)
    for _ in range(n // rounds):
        i += 1
        sql = (f"INSERT INTO `{schema}`.`plain_state` (state_id, partial_state, completed_state) VALUES "
               f"('dev:bench-e', NULL, '{{\"singer_state\":{{\"bookmarks\":{{\"n\":{i}}}}}}}')")
        t = time.perf_counter(); out = raw_transport(plain_request(sql)); times["plain_insert"].append(time.perf_counter() - t)
        assert out.get("transport_ok") and out.get("http_status") == 200, out
    for _ in range(n // rounds):
        i += 1
        t = time.perf_counter(); floor.get("dev:bench-c"); floor.set_all([state("dev:bench-c", i)]); times["floor"].append(time.perf_counter() - t)
    for _ in range(n // rounds):
        i += 1
        t = time.perf_counter(); systemdb.update(state("dev:bench-d", i)); times["systemdb"].append(time.perf_counter() - t)

def p(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]

requests = {
    "chstate": Counter(r["purpose"] for r in logs["chstate"]),
    "chstate_no_linger": Counter(r["purpose"] for r in logs["chstate_no_linger"]),
    "floor": Counter(r["purpose"] for r in logs["floor"]),
}
out = {k: {"p50": statistics.median(v), "p99": p(v, 0.99), "mean": statistics.fmean(v), "n": len(v)}
       for k, v in times.items()}
out["requests"] = {k: dict(v) for k, v in requests.items()}
for m in (lingering, plain, floor):
    m.close()
raw_transport.close()
print(json.dumps(out))
'''


def run_inner(project, cfg: dict, timeout: float = 900) -> dict:
    proc = project.python(INNER.replace("sys.argv[1]", repr(json.dumps(cfg))), timeout=timeout)
    return json.loads(proc.stdout.strip().splitlines()[-1])


def fairness(project, server, schema: str, retry: float, repeat: int) -> list[float]:
    """A streaming process and a single update() of the same id; the single
    one's latency, `repeat` times."""
    out = []
    base = {"uri": server.uri(), "password": server.password, "schema": schema, "retry": retry}
    for k in range(repeat):
        sid = f"dev:fair-{retry}-{k}"
        stream_cfg = dict(base, mode="stream", id=sid, seconds=6.0)
        code = INNER.replace("sys.argv[1]", repr(json.dumps(stream_cfg)))
        streamer = subprocess.Popen([str(project.venv / "bin" / "python"), "-c", code], cwd=project.root,
                                    env=project.env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        time.sleep(2.0)  # streaming: the lock lingers between its updates
        single = run_inner(project, dict(base, mode="single", id=sid), timeout=120)
        streamed, err = streamer.communicate(timeout=120)
        assert streamer.returncode == 0, err[-3000:]
        updates = json.loads(streamed.strip().splitlines()[-1])["updates"]
        assert updates > 50, f"the streamer made only {updates} updates"
        out.append(single["seconds"])
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--updates", type=int, default=600, help="update()s per row of table 1")
    ap.add_argument("--rounds", type=int, default=6, help="interleaved rounds of table 1")
    ap.add_argument("--fairness-repeat", type=int, default=3)
    ap.add_argument("--meltano-messages", type=int, default=300, help="STATE messages per run of table 3 (0: skip)")
    ap.add_argument("--repeat", type=int, default=3, help="runs per backend of table 3 (medians)")
    args = ap.parse_args()

    sys.path.insert(0, str(REPO / "tests" / "meltano"))
    sys.path.insert(0, str(REPO / "tests"))
    sys.path.insert(0, str(REPO / "tools"))
    import meltano_harness as harness
    from chserver import from_env, start_server, stop_server
    from meltano_bench import opt_library, timed_run

    venv = harness.ensure_venv()
    harness.install_adapter(venv)
    library = opt_library()
    tmp = Path(tempfile.mkdtemp(prefix="chstate-update-bench-"))
    server = from_env()
    started = server is None
    try:
        if started:
            server = start_server(tmp / "clickhouse")
        schema = "chstate_update_bench"
        server.sql(f"DROP DATABASE IF EXISTS {schema}")
        env = {"MELTANO_STATE_BACKEND_CLICKHOUSE_PASSWORD": server.password,
               "MELTANO_STATE_BACKEND_CLICKHOUSE_SCHEMA": schema}
        project = harness.MeltanoProject(tmp / "systemdb", venv, library, state_backend_uri="systemdb")
        project.run("state", "list")  # creates and migrates the systemdb
        cfg = {"uri": server.uri(), "password": server.password, "schema": schema, "mode": "update",
               "updates": args.updates, "rounds": args.rounds}
        r = run_inner(project, cfg)
        floor = r["floor"]["p50"]
        per = lambda k: sum(r["requests"][k].values()) / r["chstate"]["n"]  # noqa: E731
        rows = [
            ("chstate update() (the lock lingers)", "chstate", f"{per('chstate'):.2f}"),
            ("chstate update(), linger_locks off (before)", "chstate_no_linger", f"{per('chstate_no_linger'):.2f}"),
            ("the same statements raw (one connection)", "raw", f"{per('chstate'):.2f}"),
            ("one raw INSERT of the state into a plain table (no history view, no fence)", "plain_insert", "1.00"),
            ("lock-free floor: get() + set_all() of the one state", "floor", f"{per('floor'):.2f}"),
            ("Meltano's systemdb (SQLite)", "systemdb", "-"),
        ]
        print(f"\nupdate() as Meltano calls it, {r['chstate']['n']} per row in {args.rounds} interleaved rounds, "
              f"ClickHouse {'18.16' if started else 'from CHSTATE_TEST_*'} on loopback, {os.cpu_count()} cores:\n")
        print("| | p50 | p99 | mean | requests per update() | p50 vs the floor |")
        print("| --- | ---: | ---: | ---: | ---: | ---: |")
        for label, key, reqs in rows:
            v = r[key]
            print(f"| {label} | {v['p50'] * 1000:.2f} ms | {v['p99'] * 1000:.2f} ms | {v['mean'] * 1000:.2f} ms | "
                  f"{reqs} | {v['p50'] / floor:.2f}x |")
        print("\nrequests sent (purpose: count):")
        for k, v in r["requests"].items():
            print(f"  {k}: " + ", ".join(f"{p} {c}" for p, c in sorted(v.items())))

        print(f"\nFairness: a single update() of an id another process streams update()s of "
              f"({args.fairness_repeat} times each):\n")
        print("| lock_retry_seconds | single update() latencies | worst |")
        print("| ---: | --- | ---: |")
        for retry in (1.0, 0.25):
            lat = fairness(project, server, schema, retry, args.fairness_repeat)
            print(f"| {retry:g} | {', '.join(f'{x:.2f} s' for x in lat)} | {max(lat):.2f} s |")

        if args.meltano_messages > 0:
            n = args.meltano_messages
            backends = {"systemdb": project,
                        "chstate (ClickHouse, HTTP, loopback)": harness.MeltanoProject(
                            tmp / "chstate", venv, library, state_backend_uri=server.uri(), env=env)}
            results = {}
            state_id = "dev:tap-counter-to-target-echo"
            for p in backends.values():
                timed_run(p, state_id, 5, 1)  # warm-up
            many = {k: [] for k in backends}
            one = {k: [] for k in backends}
            for _ in range(args.repeat):
                for name, p in backends.items():  # interleaved
                    many[name].append(timed_run(p, state_id, n, 1))
                    one[name].append(timed_run(p, state_id, n, n))
            for name in backends:
                results[name] = (statistics.median(many[name]), statistics.median(one[name]))
            base = (results["systemdb"][0] - results["systemdb"][1]) / (n - 1) * 1000
            print(f"\n`meltano run` of {n} records, one STATE per record vs one STATE in all, medians of "
                  f"{args.repeat} interleaved runs (Meltano 4.4.1):\n")
            print("| state backend | one STATE per record | one STATE | per STATE message | vs systemdb |")
            print("| --- | ---: | ---: | ---: | ---: |")
            for name, (m, o) in results.items():
                per_msg = (m - o) / (n - 1) * 1000
                print(f"| {name} | {m:.2f} s | {o:.2f} s | {per_msg:.2f} ms | {per_msg / base:.2f}x |")
    finally:
        if started:
            stop_server(tmp / "clickhouse", remove=True)
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
