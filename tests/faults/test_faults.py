"""Fault injection against the real ClickHouse 18.16 through tests/faults/fault_proxy.py.

For every CLI operation (get, set, merge, list, clear ID, clear --all, copy,
move, lock) the operation is first run cleanly through the proxy to learn
its requests; then each of its requests in turn is broken in each way the
proxy knows, on a fresh schema. After every run:

- the outcome is success, or an error with exit code 5 (unavailable) or 1
  (server error) and a message naming ClickHouse and what went wrong;
- a request that is not idempotent (INSERT, CREATE TABLE without IF NOT
  EXISTS, RENAME) is never resent after its exchange failed: the proxy
  never sees it twice in a row;
- an idempotent read that failed in transport is retried and the operation
  succeeds;
- read straight from the server, the states are exactly "before" or exactly
  "after" (or, for move, the copy done and the source kept): nothing lost,
  nothing half-written; on success exactly "after".

Plus: connection refused, the server killed and restarted (in the middle of a
run of writes and under a held lock), and two lock holders through a proxy
that breaks a quarter of all requests at random, which must never overlap.
"""

from __future__ import annotations

import json
import re
import subprocess
import threading
import time
from pathlib import Path

import pytest
from fault_proxy import FaultProxy

A = {"singer_state": {"a": 1}}
B = {"singer_state": {"b": 2}}
C = {"singer_state": {"c": 3}}
P = {"singer_state": {"p": 4}}


def full(completed, partial=None):
    return {"completed": completed, "partial": partial or {}}


BEFORE = {"src": full(A), "dst": full(B)}

# op name -> (argv, the states after it succeeds, other acceptable states)
OPS = {
    "get": (["get", "src"], BEFORE, []),
    "set": (["set", "dst", json.dumps(C)], {"src": full(A), "dst": full(C)}, []),
    "merge": (["merge", "dst", json.dumps(P)], {"src": full(A), "dst": full(B, P)}, []),
    "list": (["list", "--pattern", "*s*"], BEFORE, []),
    "clear": (["clear", "dst"], {"src": full(A)}, []),
    "clear_all": (["clear", "--all"], {}, []),
    "copy": (["copy", "src", "dst"], {"src": full(A), "dst": full(A)}, []),
    # Move is a copy, then a delete: the copy alone done is not a loss.
    "move": (["move", "src", "dst"], {"dst": full(A)}, [{"src": full(A), "dst": full(A)}]),
    "lock": (["lock", "src", "--", "true"], BEFORE, []),
}

TRANSPORT_FAULTS = ["reset_request", "reset_response", "reset_mid_body", "truncate", "close"]
BODY_FAULTS = ["exception_200", "exception_after"]
SLOW_FAULTS = ["slow", "slow_before"]


def non_idempotent(sql: str) -> bool:
    s = sql.lstrip()
    return (s.startswith("INSERT") or s.startswith("RENAME")
            or (s.startswith("CREATE TABLE") and "IF NOT EXISTS" not in s))


def is_read(sql: str) -> bool:
    return sql.lstrip().startswith("SELECT")


def prepare(cli) -> None:
    for state_id, state in (("src", A), ("dst", B)):
        r = cli.direct("set", state_id, json.dumps(state))
        assert r.returncode == 0, r.stderr


def check_outcome(cli, proxy, op, fault, n, r) -> None:
    argv, after, others = OPS[op]
    what = f"{op} with {fault} on request {n}"
    err = r.stderr.decode(errors="replace")
    got = cli.snapshot()
    if r.returncode == 0:
        assert got == after, f"{what}: reported success but the states are {got}"
        if op == "get":
            assert json.loads(r.stdout) == A, f"{what}: printed {r.stdout!r}"
        if op == "list":
            assert r.stdout.split() == [b"dst", b"src"], f"{what}: listed {r.stdout!r}"
    else:
        # 7: `chstate lock` could not release (it says so, and when the lock expires).
        assert r.returncode in ((1, 5, 7) if op == "lock" else (1, 5)), f"{what}: exit {r.returncode}: {err}"
        assert "ClickHouse" in err or "clickhouse" in err, f"{what}: the message does not name ClickHouse: {err}"
        assert re.search(r"connection|timed out|answer|Memory limit|incomplete|reset|closed", err), \
            f"{what}: the message does not say what failed: {err}"
        assert got in (BEFORE, after, *others), f"{what}: failed and left the states as {got}\n{err}"
    # Only idempotent requests are sent again after a failed exchange.
    reqs = proxy.requests
    for i, req in enumerate(reqs[:-1]):
        if req.fault and non_idempotent(req.sql):
            assert reqs[i + 1].sql != req.sql, f"{what}: resent a non-idempotent request: {req.sql[:120]}"


def learn_requests(cli_factory, proxy, op) -> list[str]:
    cli = cli_factory()
    prepare(cli)
    proxy.clear()
    r = cli.run(proxy.port, *OPS[op][0])
    assert r.returncode == 0, r.stderr
    return proxy.sqls()


@pytest.mark.parametrize("op", list(OPS))
def test_every_request_of_every_operation_under_every_fault(op, cli_factory, proxy):
    sqls = learn_requests(cli_factory, proxy, op)
    assert sqls, "the operation sent nothing"
    tried = 0
    outcomes: dict[str, dict[int, int]] = {}  # fault -> exit code -> runs
    for n, sql in enumerate(sqls):
        faults = TRANSPORT_FAULTS + BODY_FAULTS
        # Timeouts cost seconds each: the first read and the first write.
        if n == 1 or (non_idempotent(sql) and not any(non_idempotent(s) for s in sqls[:n])):
            faults = faults + SLOW_FAULTS
        for fault in faults:
            cli = cli_factory()
            prepare(cli)
            proxy.clear()
            proxy.fault_nth(n, fault, delay=2.5)
            r = cli.run(proxy.port, *OPS[op][0], timeout=1.0)
            if fault == "slow_before":
                # Event: the held statement reached the server, after the
                # client gave up, and the server answered it; only then look.
                late = [q for q in proxy.requests if q.fault == "slow_before"]
                for q in late:
                    assert q.upstream_done.wait(30), f"{op}: the held statement never reached the server"
                    assert q.upstream_status is not None, f"{op}: the held statement got no answer: {q.sql[:120]}"
            check_outcome(cli, proxy, op, fault, n, r)
            outcomes.setdefault(fault, {}).setdefault(r.returncode, 0)
            outcomes[fault][r.returncode] += 1
            # A read broken in transport is retried, and then it works. (The
            # request at index n can differ from the learning run's: 18.16's
            # delete polls its mutation a varying number of times.)
            reqs = proxy.requests
            broken = [k for k, q in enumerate(reqs) if q.fault]
            if fault in TRANSPORT_FAULTS and broken and is_read(reqs[broken[0]].sql):
                i = broken[0]
                assert r.returncode == 0, f"{op}: a read broken by {fault} was not retried: {r.stderr!r}"
                assert i + 1 < len(reqs) and reqs[i + 1].sql == reqs[i].sql, f"{op}: the read was not resent"
            tried += 1
    print(f"\n{op}: {len(sqls)} requests, {tried} faulted runs; exit codes per fault: "
          + ", ".join(f"{f} {dict(sorted(c.items()))}" for f, c in outcomes.items()))


def test_connection_refused_is_a_clear_error(cli_factory, proxy):
    cli = cli_factory()
    prepare(cli)
    proxy.refuse()
    for argv in [v[0] for v in OPS.values()] + [["ping"], ["init"]]:
        r = cli.run(proxy.port, *argv)
        err = r.stderr.decode()
        assert r.returncode == 5, (argv, r.returncode, err)
        assert "connection refused" in err and f":{proxy.port}" in err, err
        assert "running" in err, err  # says what to check
    assert cli.snapshot() == BEFORE
    proxy.accept()
    assert cli.run(proxy.port, "get", "src").returncode == 0


def test_json_errors_under_faults(cli_factory, proxy):
    cli = cli_factory()
    prepare(cli)
    proxy.add_rule(r"^INSERT", "reset_response")
    r = cli.run(proxy.port, "--json", "set", "dst", json.dumps(C))
    assert r.returncode == 5
    doc = json.loads(r.stdout)
    assert "error" in doc, doc
    # The write ran (reset after the server answered): the outcome was unknown
    # to the client, and the state is whole.
    assert cli.snapshot()["dst"] in (full(B), full(C))


def test_verbose_tells_the_resend_of_a_reset_request(cli_factory, proxy):
    cli = cli_factory()
    prepare(cli)
    proxy.add_rule(r"^SELECT partial_state", "reset_request")
    quiet = cli.run(proxy.port, "get", "src")
    assert quiet.returncode == 0 and quiet.stderr == b""  # resent, and nothing said without -v
    proxy.add_rule(r"^SELECT partial_state", "reset_request")
    r = cli.run(proxy.port, "-v", "get", "src")
    assert r.returncode == 0, r.stderr
    lines = r.stderr.decode().splitlines()
    resent = [line for line in lines if "get_state is sent again in" in line]
    assert len(resent) == 1, lines
    assert resent[0].startswith("chstate: info: ") and "(attempt 2 of " in resent[0], resent[0]
    proxy.add_rule(r"^SELECT partial_state", "reset_request")
    r = cli.run(proxy.port, "-v", "--log-format", "json", "get", "src")
    events = [json.loads(line) for line in r.stderr.decode().splitlines()]
    e = next(e for e in events if e["kind"] == "resent")
    assert e["level"] == "info" and e["numbers"]["attempt"] == 2 and e["texts"]["purpose"] == "get_state", e


# A critical section that records its start and end; `sleep {hold}` is time
# that must pass by design (the section's length: a second holder inside it
# would show as an overlap of the intervals).
HOLD = """trap 'echo "end $$ $(date +%s%N)" >> {log}; exit 143' TERM
echo "start $$ $(date +%s%N)" >> {log}
sleep {hold}
echo "end $$ $(date +%s%N)" >> {log}
"""


def intervals(log: Path) -> list[tuple[int, int]]:
    """(start, end) of each critical section in the log; fails on a section that never ended."""
    return sorted((start, end) for _, start, end, _ in sections(log))


def assert_no_overlap(spans) -> None:
    for (s1, e1), (s2, e2) in zip(spans, spans[1:]):
        assert s2 >= e1, f"two holders at once: {s1}-{e1} and {s2}-{e2}"


def wait_until(predicate, what: str, timeout: float = 60) -> None:
    """Waits for an event (polling a condition), failing after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def test_lock_never_held_by_two_under_random_faults(cli_factory, proxy, tmp_path):
    """Three processes take one lock three times each through a proxy that breaks a
    tenth of all requests (every fault but the slow ones, chosen at random)."""
    cli = cli_factory()
    prepare(cli)
    log = tmp_path / "sections.log"
    log.touch()
    proxy.clear()
    proxy.random_faults(0.1, TRANSPORT_FAULTS + BODY_FAULTS, seed=7)
    results = []

    def contender():
        # Until it has held the lock three times (at most 12 attempts): a broken
        # answer makes an attempt fail, so the count of attempts varies.
        done = 0
        for _ in range(12):
            r = cli.run(proxy.port, "lock", "src", "--stale-lock", "3", "--lock-retry", "0.2", "--",
                        "sh", "-c", HOLD.format(log=log, hold=0.2), timeout=8, wait=120)
            results.append((r.returncode, r.stderr.decode(errors="replace")))
            done += r.returncode == 0
            if done == 3:
                return

    threads = [threading.Thread(target=contender) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    spans = intervals(log)
    assert_no_overlap(spans)
    faulted = sum(1 for q in proxy.requests if q.fault)
    print(f"{len(spans)} sections, {len(proxy.requests)} requests, {faulted} broken, exits "
          f"{sorted(r for r, _ in results)}")
    for code, err in results:
        assert code in (0, 4, 5, 1, 7), err
        if code:
            assert "ClickHouse" in err or "lock" in err, err
    for code, err in results:
        if code:
            print(code, err.strip()[:200])
    assert len(spans) >= 3, "almost nothing got through: the test would prove nothing"
    assert faulted >= 5
    assert cli.snapshot() == BEFORE


class Killable:
    """A private server this test may kill (never the shared one), reached
    through a pass-through proxy on a fixed port: a restarted server gets new
    ports, and the proxy stands in for "the same address" - it stops listening
    while the server is dead (clients are refused, open connections reset, as
    with a dead server) and forwards to the new port once it is back."""

    def __init__(self, folder: Path):
        from chserver import start_server
        self.folder = folder
        self.server = start_server(folder)
        self.proxy = FaultProxy(self.server.host, self.server.port)

    def kill(self) -> None:
        from chserver import kill_server
        kill_server(self.folder)
        self.proxy.refuse()

    def restart(self) -> None:
        from chserver import start_server
        self.server = start_server(self.folder)
        self.proxy.upstream = (self.server.host, self.server.port)
        self.proxy.accept()

    def cli(self, binary: Path, schema: str):
        return ProxiedCli(binary, self, schema)


class ProxiedCli:
    """conftest.Cli for a Killable: commands go through its proxy, snapshots straight to the live server."""

    def __init__(self, binary: Path, k: Killable, schema: str):
        from conftest import Cli
        self.k, self.binary, self.schema = k, binary, schema
        self._cli = lambda: Cli(binary, k.server, schema)

    def env(self):
        return self._cli().env()

    def direct(self, *args, **kw):
        return self._cli().run(self.k.proxy.port, *args, **kw)

    def snapshot(self):
        return self._cli().snapshot()


@pytest.fixture
def own_server(tmp_path_factory):
    from chserver import stop_server
    folder = tmp_path_factory.mktemp("killable")
    k = Killable(folder)
    yield k
    k.proxy.close()
    stop_server(folder, remove=True)


def test_server_killed_and_restarted(own_server, chstate_bin, tmp_path):
    k = own_server
    cli = k.cli(chstate_bin, "killed")
    prepare(cli)

    # 1. A run of writes, the server killed in the middle and restarted.
    acked, failed, stop = [], [], threading.Event()

    def writer():  # records; the test asserts after join (an assert in a thread fails nothing)
        i = 0
        while not stop.is_set():
            i += 1
            r = cli.direct("set", "w", json.dumps({"singer_state": {"i": i}}), timeout=2)
            if r.returncode == 0:
                acked.append(i)
            else:
                failed.append((r.returncode, r.stderr.decode()))

    t = threading.Thread(target=writer)
    t.start()
    # Event: the run of writes is under way (some acknowledged) when the server dies.
    wait_until(lambda: len(acked) >= 3, "three writes acknowledged before the kill")
    k.kill()
    # 2. While it is down: every operation fails clearly, nothing hangs.
    for argv in [v[0] for v in OPS.values()] + [["ping"]]:
        r = cli.direct(*argv, timeout=2)
        err = r.stderr.decode()
        assert r.returncode == 5, (argv, r.returncode, err)
        assert "no answer from ClickHouse" in err or "connection refused" in err, err
    down_acked, down_failed = len(acked), len(failed)
    # Event: a write started after this point failed (the writer tried while
    # the server was down; the one in flight may be the first failure).
    wait_until(lambda: len(failed) >= down_failed + 2, "the writer to fail twice while the server is down")
    assert len(acked) == down_acked, "a write was acknowledged while the server was down"
    mark = len(k.proxy.requests)
    k.restart()
    # Event: the restarted server answered one of the writer's requests (the
    # write may still fail: a `set` cut off by the kill can leave its lock).
    wait_until(lambda: any(q.upstream_status is not None for q in k.proxy.requests[mark:]),
               "the restarted server to answer the writer")
    stop.set()
    t.join()
    for code, err in failed:
        # 5: the server was down (naming the address). 4: a `set` cut off by the
        # kill left its lock behind, which expires after the stale window.
        assert (code == 5 and f":{k.proxy.port}" in err and "ClickHouse" in err) or \
            (code == 4 and "locked by another process" in err), (code, err)
    # 3. Nothing acknowledged is lost, nothing is half-written.
    got = cli.snapshot()
    assert got["src"] == full(A) and got["dst"] == full(B)
    last = got["w"]["completed"]["singer_state"]["i"]
    assert last >= acked[-1], f"acknowledged write {acked[-1]} lost; the state holds {last}"
    print(f"{len(acked)} writes acknowledged, {down_acked} before the kill, {len(failed)} failed; "
          f"state holds write {last}")


# For the crash test: the command records its section, and whether it ended
# by itself ("end") or was stopped with SIGTERM ("term"); `sleep & wait` lets
# the trap run at once instead of after the sleep.
HOLD_SIGNALLED = """trap 'echo "term $$ $(date +%s%N)" >> {log}; exit 143' TERM
echo "start $$ $(date +%s%N)" >> {log}
sleep {hold} &
wait $!
echo "end $$ $(date +%s%N)" >> {log}
"""


def sections(log: Path) -> list[tuple[str, int, int, str]]:
    """(pid, start, end, how) of each section in order of start; how is "end" or "term"."""
    open_at, out = {}, []
    for line in log.read_text().splitlines():
        kind, pid, t = line.split()
        if kind == "start":
            open_at[pid] = int(t)
        else:
            out.append((pid, open_at.pop(pid), int(t), kind))
    assert not open_at, f"sections without an end: {open_at}"
    return sorted(out, key=lambda s: s[1])


def test_lock_across_a_server_crash(own_server, chstate_bin, tmp_path):
    """A holder renewing its lease while the server is killed and restarted,
    and a second locker that started waiting while the first held the lock.
    The holder either keeps the lock (exit 0, its command ran to the end) or
    is told it lost it (exit 7, its command got SIGTERM); the waiter really
    waited (its CREATE was refused while the holder held), then held the lock
    itself, after the holder's section ended."""
    k = own_server
    cli = k.cli(chstate_bin, "killed_lock")
    prepare(cli)
    log = tmp_path / "sections.log"
    log.touch()

    def hold(seconds, *options):
        argv = [str(chstate_bin), "--uri", f"clickhouse://{k.server.user}@127.0.0.1:{k.proxy.port}/default",
                "--timeout", "20", "--connect-timeout", "1", "lock", "src", "--stale-lock", "3", *options,
                "--", "sh", "-c", HOLD_SIGNALLED.format(log=log, hold=seconds)]
        return subprocess.Popen(argv, env=cli.env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE)

    def lock_creates() -> int:
        return sum(1 for q in k.proxy.requests
                   if q.sql.lstrip().startswith("CREATE TABLE") and "_lock_" in q.sql and "_dead_" not in q.sql)

    first = hold(4, "--lock-retry", "0.1")
    # Event: the first locker's command runs, so it holds the lock.
    wait_until(lambda: "start" in log.read_text() or first.poll() is not None, "the first locker to hold the lock")
    assert first.poll() is None, first.communicate()
    creates = lock_creates()
    # The waiter polls every 5 s, longer than the outage below, so that the
    # outage costs it one failed attempt, not three in a row (which would end
    # it with exit 5, "unreachable").
    second = hold(0.5, "--lock-retry", "5", "--lock-timeout", "60")
    # Event: the waiter's CREATE went out while the holder's command still ran:
    # the lock was taken, so it was refused and the waiter waits.
    wait_until(lambda: lock_creates() > creates or second.poll() is not None, "the second locker to try the lock")
    assert second.poll() is None, second.communicate()
    assert [line.split()[0] for line in log.read_text().splitlines()] == ["start"], \
        "the holder's section ended before the waiter tried: it did not have to wait"
    k.kill()
    time.sleep(1.5)  # the length of the outage (a fault, not a synchronisation)
    k.restart()
    outs = [p.communicate(timeout=90) for p in (first, second)]
    codes = [first.returncode, second.returncode]
    errs = [o[1].decode(errors="replace") for o in outs]
    print("exits", codes, [e[:300] for e in errs])
    spans = sections(log)
    assert len(spans) == 2, f"both lockers must have held the lock once: {spans}"
    (pid1, start1, end1, how1), (pid2, start2, end2, how2) = spans
    assert pid1 != pid2
    # The holder: kept the lock to the end, or lost it and its command was stopped.
    if codes[0] == 0:
        assert how1 == "end", (how1, errs[0])
    else:
        assert codes[0] == 7, errs[0]
        assert how1 == "term", "exit 7 but the command was not stopped"
        assert "lock" in errs[0] and ("lost" in errs[0] or "expired" in errs[0] or "taken over" in errs[0]), errs[0]
    # The waiter: held it after the holder's section, ran to the end, released.
    assert codes[1] == 0, errs[1]
    assert how2 == "end"
    assert start2 >= end1, f"two holders at once: {start1}-{end1} and {start2}-{end2}"
    assert cli.snapshot() == BEFORE
