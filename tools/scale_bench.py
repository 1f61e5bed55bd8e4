#!/usr/bin/env python3
"""Costs against the size of the work, each beside its floor, in one run.

  python3 tools/scale_bench.py [--sizes 1000,100000] [--big] [--acquisitions 10,1000]
                               [--seeded 100000] [--updates 300,3000]

Tables (ClickHouse 18.16 on loopback; the cluster is three replicas and
ZooKeeper, quorum 2; both started here with tools/clickhouse_server.py unless
CHSTATE_TEST_* point at a server):

1. Per number of states (--sizes, and 1,000,000 with --big): the Meltano
   adapter's get() and get_state_ids(glob) (100 and 20 calls, p50), update()
   of one id (100 calls, p50, as Meltano calls it), get_all() (the export) and
   set_all() (the import); and the `chstate export` and `chstate import`
   commands (the CLI's export document imported into a fresh schema). Each
   beside its floor: the statements chstate sent, replayed raw over one
   keep-alive connection; for the import, the same rows sent raw in INSERTs
   of 100,000 into the emptied table (and, beside it, chstate's own INSERTs
   replayed: a floor that hides the cost of small batches); for the export one
   raw `SELECT ... FINAL FORMAT JSONEachRow` of the table, read as curl would
   (streamed, not hex-encoded as the binding's transport does), the faster of
   one read before and one after the export. Beside them, what the JSON
   library alone costs on the CLI's export document (tools/json_floor.cc):
   one pass over the whole document, which the import cannot go below plus
   its raw INSERTs (it checks the whole document before it writes), and one
   pass over each stored side, which the export's client cannot go below.
2. A cluster lock acquisition (acquire, through the adapter with the lock not
   lingering) after N earlier acquisitions of the same id (--acquisitions,
   made for real), and after --seeded earlier acquisitions whose rows (a claim
   and an end row each, as an acquisition leaves) are written straight into
   `<table>_claims` (a backlog, as from before claims were removed): the
   acquisitions that remove them are counted and timed, until fewer than
   1,000 claim rows are left, and then measured as the others. The floor:
   the acquisition's own statements replayed raw.
3. The history rows of one id after N update()s (--updates) and the cap.

Progress goes to stderr, the tables to stdout.

Times are from one run on a shared machine: read the ratios. Uses the cached
Meltano venv of tests/meltano and -c opt builds (tools/meltano_bench.py's).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "meltano"))
sys.path.insert(0, str(REPO / "tools"))
sys.path.insert(0, str(REPO / "tests"))

import clickhouse_server as chs  # noqa: E402
import meltano_harness as harness  # noqa: E402
from meltano_bench import opt_library  # noqa: E402

# Runs in the Meltano venv; prints one JSON line.
CHILD = r'''
import json, os, random, statistics, sys, time
from chstate_meltano.backend import ClickhouseStateStoreManager
from chstate_meltano._http import HttpTransport
from chstate_meltano import _native
from meltano.core.state_store import MeltanoState

cfg = json.loads(sys.argv[1])
uri, password, schema = cfg["uri"], cfg["password"], cfg["schema"]
log = []

def manager(linger=True):
    # linger_locks is a setting (on by default in Python).
    m = ClickhouseStateStoreManager(uri, password=password, schema=schema, lock_timeout_seconds=60,
                                    **({} if linger else {"linger_locks": False}))
    make = m._make_transport
    def wrapped():
        t = make()
        def call(req):
            # What succeeded is the work to replay (an import's first INSERT
            # into a schema not made yet fails, and is sent again once it is).
            out = t(req)
            if out.get("transport_ok") and out.get("http_status") == 200:
                log.append(req)
            return out
        call.close = t.close
        return call
    m._make_transport = wrapped
    return m

raw = HttpTransport(_native.resolve_settings({"from": "api", "values": {"uri": uri, "password": password},
                                             "env": {}})["connection"])
def replay(reqs):
    t = time.perf_counter()
    for req in reqs:
        out = raw(req)
        assert out.get("transport_ok") and out.get("http_status") == 200, (req["purpose"], out)
    return time.perf_counter() - t

def sql(text):
    req = {"sql": text, "url_params": [], "purpose": "bench", "idempotent": True, "timeout_ms": 600000}
    out = raw(req)
    assert out.get("http_status") == 200, out
    return bytes(out["body"]).decode()

def raw_stream(text):
    import http.client
    conn_cfg = _native.resolve_settings({"from": "api", "values": {"uri": uri, "password": password},
                                        "env": {}})["connection"]
    conn = http.client.HTTPConnection(conn_cfg["host"], int(conn_cfg["port"]), timeout=600)
    conn.request("POST", "/", body=text.encode(), headers={"X-ClickHouse-User": conn_cfg["user"],
                                                          "X-ClickHouse-Key": password})
    resp = conn.getresponse()
    assert resp.status == 200, resp.read()[:500]
    lines = 0
    while True:
        chunk = resp.read(1 << 20)
        if not chunk:
            break
        lines += chunk.count(b"\n")
    conn.close()
    return lines

def p50(xs):
    return statistics.median(xs) * 1000

def sid(i):
    return f"dev:tap-{i:07d}-to-target-jsonl"

def state(i, v=0):
    return MeltanoState(state_id=sid(i), partial_state={},
                        completed_state={"singer_state": {"bookmarks": {"stream": {"id": i, "v": v, "at": "2026-12-01"}}}})

out = {}
if cfg["mode"] == "states":
    n = cfg["n"]
    m = manager()
    m.get(sid(0))  # connected, schema made
    log.clear()
    t = time.perf_counter(); m.set_all(state(i) for i in range(n)); out["import"] = time.perf_counter() - t
    inserts = [r for r in log if r["purpose"] == "insert_states"]
    out["import_requests"] = len(inserts)
    sql(f"TRUNCATE TABLE `{schema}`.state")
    out["import_replay"] = replay(inserts)
    # The floor, whatever chstate's batching: the same rows sent raw in
    # INSERTs of 100,000 (the table emptied first, its history view on).
    sql(f"TRUNCATE TABLE `{schema}`.state")
    def literal(text):
        return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"
    statements = [
        f"INSERT INTO `{schema}`.state (state_id, partial_state, completed_state) VALUES " + ", ".join(
            f"({literal(sid(i))}, NULL, {literal(json.dumps(state(i).completed_state, separators=(',', ':')))})"
            for i in range(start, min(n, start + 100000)))
        for start in range(0, n, 100000)]
    t = time.perf_counter()
    for text in statements:
        sql(text)
    out["import_raw"] = time.perf_counter() - t
    del statements
    assert int(sql(f"SELECT count() FROM `{schema}`.state").strip()) == n
    # The reads and updates below, on a table whose parts are merged by then
    # (whatever batches the import made), up to two minutes.
    for _ in range(1200):
        if sql(f"SELECT count() FROM system.merges WHERE database = '{schema}'").strip() == "0":
            break
        time.sleep(0.1)
    ids = [sid(random.randrange(n)) for _ in range(100)]
    for kind, call, count in (("get", lambda k: m.get(ids[k]), 100),
                              ("list", lambda k: m.get_state_ids(f"dev:tap-{k % 100:05d}*"), 20)):
        mine, floor = [], []
        for k in range(count):
            log.clear()
            t = time.perf_counter(); call(k); mine.append(time.perf_counter() - t)
            floor.append(replay(list(log)))
        out[kind], out[kind + "_raw"] = p50(mine), p50(floor)
    mine, floor = [], []
    m.update(state(0, -1))
    for k in range(100):
        log.clear()
        t = time.perf_counter(); m.update(state(0, k)); mine.append(time.perf_counter() - t)
        floor.append(replay([r for r in log if r["purpose"] in ("insert_state", "get_state", "lock_waiters")]))
    out["update"], out["update_raw"] = p50(mine), p50(floor)
    m.close()
    # The floor: one SELECT ... FINAL of the table, read raw as curl would
    # (streamed and dropped, lines counted; not hex-encoded as the binding's
    # transport does), timed before and after the export: the faster of the two.
    def export_raw():
        t = time.perf_counter()
        lines = raw_stream(f"SELECT state_id, partial_state, completed_state FROM `{schema}`.state FINAL "
                           "FORMAT JSONEachRow")
        assert lines == n, lines
        return time.perf_counter() - t
    first_raw = export_raw()
    m = manager()
    m.get(sid(0))
    log.clear()
    t = time.perf_counter(); count = sum(1 for _ in m.get_all()); out["export"] = time.perf_counter() - t
    assert count == n, count
    out["export_requests"] = len(log)
    out["export_raw"] = min(first_raw, export_raw())
    m.close()
elif cfg["mode"] == "lock":
    # Acquisitions of one id, the lock not lingering: each is real.
    m = manager(linger=False)
    lock_id = "dev:tap-lock-to-target"
    m.get(lock_id)
    def acquire_once():
        log.clear()
        t = time.perf_counter()
        ctx = m.acquire_lock(lock_id, retry_seconds=0.1)
        ctx.__enter__()
        took = time.perf_counter() - t
        # The acquisition's own statements: the look at the Python backend's
        # rows every acquisition makes first, then the claim.
        reqs = [r for r in log if r["purpose"] in ("foreign_lock_rows", "inspect_claims", "claim_lock", "prune_claims")]
        ctx.__exit__(None, None, None)
        return took, reqs
    for _ in range(cfg["before"]):
        acquire_once()
    # A backlog (seeded rows): acquisitions until the id's claims are fewer
    # than a thousand rows (the removals are mutations: they land later).
    out["backlog_acquisitions"], out["backlog_s"] = 0, 0.0
    if cfg.get("clear_backlog"):
        t = time.perf_counter()
        while int(sql(f"SELECT count() FROM `{schema}`.state_claims").strip()) >= 1000:
            assert time.perf_counter() - t < 600, "the backlog was not removed in 10 minutes"
            acquire_once()
            out["backlog_acquisitions"] += 1
        out["backlog_s"] = time.perf_counter() - t
    mine, floor, pruned = [], [], 0
    for k in range(cfg["measure"]):
        took, reqs = acquire_once()
        mine.append(took)
        pruned += sum(1 for r in reqs if r["purpose"] == "prune_claims")
        floor.append(replay(reqs))
    out["first"] = mine[0] * 1000
    out["acquire"], out["acquire_raw"] = p50(mine[1:]), p50(floor[1:])
    out["pruned"] = pruned
    out["claim_rows"] = int(sql(f"SELECT count() FROM `{schema}`.state_claims").strip())
    m.close()
elif cfg["mode"] == "history":
    m = manager()
    hid = "dev:tap-history-to-target"
    for k in range(cfg["updates"]):
        m.update(MeltanoState(state_id=hid, partial_state={}, completed_state={"singer_state": {"n": k}}))
    m.close()
    for _ in range(300):  # the trims are mutations: wait for them
        if sql(f"SELECT count() FROM system.mutations WHERE database = '{schema}' AND is_done = 0").strip() == "0":
            break
        time.sleep(0.1)
    out["rows"] = int(sql(f"SELECT count() FROM `{schema}`.state_history WHERE state_id = '{hid}'").strip())
raw.close()
print(json.dumps(out))
'''


def opt_bin(target: str) -> str:
    """Builds `target` with -c opt; returns bazel-bin."""
    subprocess.run(["bazel", "build", "-c", "opt", "--symlink_prefix=/", target], cwd=REPO, check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return subprocess.run(["bazel", "info", "-c", "opt", "bazel-bin"], cwd=REPO, check=True, capture_output=True,
                          text=True).stdout.strip()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="1000,100000")
    ap.add_argument("--big", action="store_true", help="also 1,000,000 states (about ten minutes more)")
    ap.add_argument("--acquisitions", default="10,1000")
    ap.add_argument("--seeded", type=int, default=100000)
    ap.add_argument("--updates", default="300,3000,10000")
    ap.add_argument("--skip-cluster", action="store_true")
    ap.add_argument("--cli", type=Path, help="a chstate binary built before (another commit's) instead of this "
                                             "tree's (the adapter's library: CHSTATE_LIBRARY, as meltano_bench.py)")
    args = ap.parse_args()
    sizes = [int(s) for s in args.sizes.split(",") if s] + ([1000000] if args.big else [])

    venv = harness.ensure_venv()
    harness.install_adapter(venv)
    library = opt_library()
    if args.cli:
        built = args.cli.resolve()
    else:
        built = Path(opt_bin("//hosts/native:chstate"), "hosts", "native", "chstate")
    json_floor = Path(opt_bin("//tools:json_floor"), "tools", "json_floor")
    tmp = Path(tempfile.mkdtemp(prefix="chstate-scale-bench-"))
    cli = tmp / "chstate"
    cli.write_bytes(built.read_bytes())
    cli.chmod(0o755)
    env = harness.clean_env()
    env["CHSTATE_LIBRARY"] = str(library)
    python = str(venv / "bin" / "python")

    started = time.perf_counter()

    def progress(what: str) -> None:
        print(f"[{time.perf_counter() - started:7.1f} s] {what}", file=sys.stderr, flush=True)

    def child(uri: str, password: str, schema: str, **cfg) -> dict:
        progress(f"{cfg['mode']} {schema}")
        cfg.update(uri=uri, password=password, schema=schema)
        out = subprocess.run([python, "-c", CHILD, json.dumps(cfg)], env=env, capture_output=True, text=True,
                             timeout=7200)
        if out.returncode != 0:
            raise SystemExit(f"{cfg['mode']} failed:\n{out.stderr[-3000:]}")
        return json.loads(out.stdout.strip().splitlines()[-1])

    def print_states() -> None:
        print(f"\nScale, one run, {os.cpu_count()} cores, ClickHouse 18.16 on loopback:\n")
        print("| states | get() p50 | list(glob) p50 | update() p50 | export: get_all() | `chstate export` | "
              "import: set_all() | `chstate import` |")
        print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
        for n, r in results["states"].items():
            print(f"| {n:,} | {r['get']:.2f} ms (raw {r['get_raw']:.2f}, {r['get'] / r['get_raw']:.2f}x) | "
                  f"{r['list']:.2f} ms (raw {r['list_raw']:.2f}, {r['list'] / r['list_raw']:.2f}x) | "
                  f"{r['update']:.2f} ms (raw {r['update_raw']:.2f}, {r['update'] / r['update_raw']:.2f}x) | "
                  f"{r['export']:.2f} s, {r['export_requests']} requests (raw {r['export_raw']:.2f} s, "
                  f"{r['export'] / r['export_raw']:.2f}x) | {r['cli_export']:.2f} s ({r['cli_export'] / r['export_raw']:.2f}x) | "
                  f"{r['import']:.2f} s, {r['import_requests']} INSERTs (raw {r['import_raw']:.2f} s, "
                  f"{r['import'] / r['import_raw']:.2f}x; its INSERTs replayed {r['import_replay']:.2f} s, "
                  f"{r['import'] / r['import_replay']:.2f}x) | "
                  f"{r['cli_import']:.2f} s ({r['cli_import'] / r['import_raw']:.2f}x) |")
        sys.stdout.flush()

    def print_floor() -> None:
        print("\nWhat the JSON library (nlohmann/json) alone costs on the CLI's export document, beside the raw "
              "floors (the fastest of 3 passes; the least each command could take while it keeps its checks):\n")
        print("| states | document | one pass over it | import: raw INSERTs | least import (pass + INSERTs) | "
              "`chstate import` | stored sides | one pass over each | export: raw SELECT | least export (the "
              "passes, read as the answer arrives) | `chstate export` |")
        print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
        for n, r in results["states"].items():
            f = r["floor"]
            least_import = f["document_s"] + r["import_raw"]
            least_export = max(f["sides_s"], r["export_raw"])
            print(f"| {n:,} | {f['document_bytes'] / 1e6:.1f} MB | {f['document_s']:.2f} s | {r['import_raw']:.2f} s | "
                  f"{least_import:.2f} s ({least_import / r['import_raw']:.2f}x) | {r['cli_import']:.2f} s "
                  f"({r['cli_import'] / r['import_raw']:.2f}x) | {f['sides']:,}, {f['side_bytes'] / 1e6:.1f} MB | "
                  f"{f['sides_s']:.2f} s | {r['export_raw']:.2f} s | {least_export:.2f} s "
                  f"({least_export / r['export_raw']:.2f}x) | {r['cli_export']:.2f} s "
                  f"({r['cli_export'] / r['export_raw']:.2f}x) |")
        sys.stdout.flush()

    def print_lock() -> None:
        if results["lock"]:
            print("\nCluster lock acquisition of one id (three replicas, quorum 2), p50 of 29 after the first "
                  "(a seeded backlog: acquired until fewer than 1,000 claim rows are left, then measured):\n")
            print("| | backlog removed by | first acquisition | then, p50 | raw statements p50 | vs raw | "
                  "vs after the first count | prunes | claims rows after |")
            print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
            base = results["lock"][0][1]["acquire"]
            for label, r in results["lock"]:
                backlog = (f"{r['backlog_acquisitions']} acquisitions in {r['backlog_s']:.1f} s"
                           if r["backlog_acquisitions"] else "-")
                print(f"| {label} | {backlog} | {r['first']:.1f} ms | {r['acquire']:.1f} ms | {r['acquire_raw']:.1f} ms | "
                      f"{r['acquire'] / r['acquire_raw']:.2f}x | {r['acquire'] / base:.2f}x | {r['pruned']} | "
                      f"{r['claim_rows']:,} |")
        sys.stdout.flush()

    def print_history() -> None:
        print("\nHistory rows of one id after N update()s (history_versions default "
              f"1,000; trims are looked for at one write in 64):\n")
        print("| updates | history rows | bound |")
        print("| ---: | ---: | ---: |")
        for u, rows in results["history"]:
            print(f"| {u:,} | {rows:,} | {min(u + 1, 1000):,} + writes since the last look |")
        sys.stdout.flush()

    single = cluster = None
    results: dict = {"states": {}, "lock": [], "history": []}
    try:
        single = chs.start(tmp / "single")
        uri = f"clickhouse://chstate@127.0.0.1:{single['http_port']}/default"
        pw = single["password"]

        def sql(text: str) -> str:
            import urllib.request
            req = urllib.request.Request(f"http://127.0.0.1:{single['http_port']}/", data=text.encode(),
                                         headers={"X-ClickHouse-User": "chstate", "X-ClickHouse-Key": pw})
            # DROP of a schema after thousands of writes unlinks tens of
            # thousands of part files (kept for old_parts_lifetime): slow disks.
            return urllib.request.urlopen(req, timeout=3600).read().decode()

        for n in sizes:
            schema = f"scale_{n}"
            r = child(uri, pw, schema, mode="states", n=n)
            cli_env = dict(env, MELTANO_STATE_BACKEND_CLICKHOUSE_PASSWORD=pw)
            document = tmp / f"export_{n}.json"
            progress(f"chstate export, then chstate import, of {n:,} states")
            t = time.perf_counter()
            done = subprocess.run([str(cli), "--uri", f"{uri}?schema={schema}", "export", "--output", str(document)],
                                  env=cli_env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, timeout=7200)
            r["cli_export"] = time.perf_counter() - t
            assert done.returncode == 0, done.stderr
            progress(f"the JSON library's floor on the export document of {n:,} states")
            floor = subprocess.run([str(json_floor), str(document)], capture_output=True, text=True, timeout=3600)
            assert floor.returncode == 0, floor.stderr
            r["floor"] = json.loads(floor.stdout)
            # The same states into a fresh schema, made first (as the child's import found it made).
            target = f"{uri}?schema={schema}_cli"
            made = subprocess.run([str(cli), "--uri", target, "init"], env=cli_env, capture_output=True, timeout=600)
            assert made.returncode == 0, made.stderr
            t = time.perf_counter()
            done = subprocess.run([str(cli), "--uri", target, "import", str(document)], env=cli_env,
                                  capture_output=True, text=True, timeout=7200)
            r["cli_import"] = time.perf_counter() - t
            assert done.returncode == 0 and done.stdout.strip() == str(n), (done.stdout, done.stderr)
            document.unlink()
            results["states"][n] = r
            sql(f"DROP DATABASE IF EXISTS `{schema}`")
            sql(f"DROP DATABASE IF EXISTS `{schema}_cli`")
        print_states()
        print_floor()
        for u in [int(x) for x in args.updates.split(",") if x]:
            schema = f"scale_history_{u}"
            results["history"].append((u, child(uri, pw, schema, mode="history", updates=u)["rows"]))
            # Not dropped: the server is thrown away (its parts are many and small).
        print_history()
        if not args.skip_cluster:
            cluster = chs.start_cluster(tmp / "cluster")
            hosts = ",".join(f"127.0.0.1:{cluster['ports'][r]['http_port']}" for r in chs.REPLICAS)
            curi = f"clickhouse://chstate@{hosts}/default?cluster={cluster['name']}"
            cpw = cluster["password"]
            for k in [int(x) for x in args.acquisitions.split(",") if x]:
                schema = f"scale_lock_{k}"
                results["lock"].append((f"after {k:,} acquisitions", child(curi, cpw, schema, mode="lock", before=k,
                                                                             measure=30)))
            if args.seeded:
                schema = "scale_lock_seeded"
                child(curi, cpw, schema, mode="lock", before=1, measure=2)  # the tables
                import urllib.request
                port = cluster["ports"][chs.REPLICAS[0]]["http_port"]
                rows = (f"INSERT INTO `{schema}`.state_claims SELECT n, id, seq, now() - 86400 + intDiv(number, 2), "
                        f"toUInt32(if(seq = 0, 300, 0)), '' FROM (SELECT number, (SELECT any(name) FROM "
                        f"`{schema}`.state_claims) AS n, concat('seeded', toString(intDiv(number, 2))) AS id, "
                        f"toUInt8(if(number % 2 = 0, 0, 3)) AS seq FROM numbers({2 * args.seeded}))")
                req = urllib.request.Request(f"http://127.0.0.1:{port}/?insert_quorum=2&insert_deduplicate=0",
                                             data=rows.encode(),
                                             headers={"X-ClickHouse-User": "chstate", "X-ClickHouse-Key": cpw})
                urllib.request.urlopen(req, timeout=600).read()
                results["lock"].append((f"after {args.seeded:,} seeded acquisitions (rows written directly)",
                                        child(curi, cpw, schema, mode="lock", before=0, measure=30,
                                              clear_backlog=True)))
            print_lock()
    finally:
        if single:
            chs.stop(tmp / "single")
        if cluster:
            chs.stop_cluster(tmp / "cluster")
        shutil.rmtree(tmp, ignore_errors=True)

    return 0


if __name__ == "__main__":
    sys.exit(main())
