"""Torture tests of the per-state-id lock: real processes, a real ClickHouse.

Workers are //tools:lock_torture processes (see the comment at the top of
tools/lock_torture.cc). They append `enter`, `renew`, `renewed`, `leave`,
`lost`, ... lines with CLOCK_MONOTONIC nanoseconds to one shared log; Python's
time.monotonic_ns() reads the same clock, so the test's own events (a kill)
are on the same scale.

  python3 -m pytest tests/lock          # from the repository root
"""

from __future__ import annotations

import dataclasses
import json
import signal
import subprocess
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.requires_clickhouse

TIMEOUT_EXIT = 7  # what a worker given --timeout-exit-code 7 exits with when acquiring times out
LOST_EXIT = 3     # lock_torture's exit code after logging `lost`


@dataclasses.dataclass
class Worker:
    name: str
    proc: subprocess.Popen
    out: Path
    err: Path

    def wait(self, timeout: float) -> int:
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            pytest.fail(f"worker {self.name} did not finish within {timeout} s\n{self.stderr()}")

    def stderr(self) -> str:
        return self.err.read_text(errors="replace")


class Torture:
    def __init__(self, binary: Path, server, schema: str, folder: Path):
        self.binary, self.server, self.schema, self.folder = binary, server, schema, folder
        self.log = folder / "lock.log"
        self.workers: list[Worker] = []

    def start(self, name: str, *, rounds: int = 1, stale_ms: int, retry_ms: int, timeout_ms: int, hold_ms: int,
              state_id: str = "dev:tap-torture-to-target-test", extra: tuple[str, ...] = ()) -> Worker:
        out, err = self.folder / f"{name}.out", self.folder / f"{name}.err"
        argv = [str(self.binary), "--schema", self.schema, "--state-id", state_id, "--rounds", str(rounds),
                "--log", str(self.log), "--stale-ms", str(stale_ms), "--retry-ms", str(retry_ms),
                "--timeout-ms", str(timeout_ms), "--hold-ms", str(hold_ms), "--worker", name, *extra]
        with open(out, "wb") as o, open(err, "wb") as e:
            proc = subprocess.Popen(argv, stdout=o, stderr=e, stdin=subprocess.DEVNULL, env=self.server.env())
        w = Worker(name, proc, out, err)
        self.workers.append(w)
        return w

    def lines(self) -> list[list[str]]:
        if not self.log.exists():
            return []
        return [line.split() for line in self.log.read_text().splitlines() if line.strip()]

    def events(self, kind: str, worker: str | None = None) -> list[list[str]]:
        return [f for f in self.lines() if f[0] == kind and (worker is None or f[1] == worker)]

    def wait_for(self, predicate, timeout: float, what: str) -> None:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if predicate():
                return
            time.sleep(0.005)
        pytest.fail(f"timed out after {timeout} s waiting for {what}; log:\n{self.log_text()}")

    def log_text(self) -> str:
        return self.log.read_text() if self.log.exists() else "(no log)"

    def stop_all(self) -> None:
        for w in self.workers:
            if w.proc.poll() is None:
                w.proc.kill()
                w.proc.wait()


@pytest.fixture
def torture(torture_bin, clickhouse, schema, tmp_path):
    t = Torture(torture_bin, clickhouse, schema, tmp_path)
    yield t
    t.stop_all()


def ns(field: str) -> int:
    return int(field)


def test_eight_processes_fifty_rounds_no_overlap(torture, capsys):
    workers, rounds = 8, 50
    started = time.monotonic_ns()
    for i in range(workers):
        torture.start(f"w{i}", rounds=rounds, stale_ms=60000, retry_ms=10 + (10 * i) // (workers - 1),
                      timeout_ms=120000, hold_ms=2)
    codes = {w.name: w.wait(timeout=170) for w in torture.workers}
    elapsed_s = (time.monotonic_ns() - started) / 1e9
    failures = "\n".join(f"{w.name} exited {codes[w.name]}: {w.stderr()}" for w in torture.workers if codes[w.name])

    # Exclusion first: it is checked over every hold that was logged, even
    # when some worker failed.
    enters = {(f[1], int(f[2])): ns(f[3]) for f in torture.events("enter")}
    leaves = {(f[1], int(f[2])): ns(f[3]) for f in torture.events("leave")}
    assert set(leaves) <= set(enters), "a leave without an enter"
    intervals = sorted((enters[k], leaves.get(k), k) for k in enters)
    for enter, leave, key in intervals:
        assert leave is None or enter < leave, f"{key} left before it entered"
    unfinished = [k for _, leave, k in intervals if leave is None]
    assert len(unfinished) <= len(failures.splitlines()), f"holds without a leave: {unfinished}"
    overlaps = [(prev[2], cur[2], (prev[1] - cur[0]) / 1e6)
                for prev, cur in zip(intervals, intervals[1:]) if prev[1] is not None and cur[0] <= prev[1]]
    assert not overlaps, f"{len(overlaps)} overlapping holds (holder, next, overlap ms): {overlaps[:10]}\n{failures}"

    assert not failures, f"no overlap in {len(intervals)} holds, but workers failed:\n{failures}"
    assert not torture.events("lost")
    assert len(torture.events("enter")) == workers * rounds
    assert len(torture.events("leave")) == workers * rounds
    assert set(enters) == set(leaves) == {(f"w{i}", r) for i in range(workers) for r in range(rounds)}

    gaps_ms = sorted((cur[0] - prev[1]) / 1e6 for prev, cur in zip(intervals, intervals[1:]))
    window_s = (intervals[-1][1] - intervals[0][0]) / 1e9
    summaries = [json.loads(w.out.read_text()) for w in torture.workers]
    max_wait_s = max(x["max_acquire_ms"] for x in summaries) / 1e3
    mean_wait_ms = sum(x["mean_acquire_ms"] for x in summaries) / len(summaries)
    order = [k[0] for _, _, k in intervals]
    same_again = sum(a == b for a, b in zip(order, order[1:]))
    with capsys.disabled():
        print(f"\n[lock torture] {workers} processes x {rounds} rounds: {len(intervals)} acquisitions, no overlap; "
              f"total {elapsed_s:.1f} s (first enter to last leave {window_s:.1f} s), "
              f"{len(intervals) / window_s:.1f} acquisitions/s; leave->next enter gap "
              f"p50 {gaps_ms[len(gaps_ms) // 2]:.1f} ms, min {gaps_ms[0]:.1f} ms, max {gaps_ms[-1]:.1f} ms; "
              f"same worker re-entered {same_again}/{len(order) - 1} times; acquire wait "
              f"mean {mean_wait_ms:.0f} ms, max {max_wait_s:.1f} s")


def test_kill_9_holder_is_taken_over_only_after_stale_window(torture, capsys):
    stale_ms = 3000
    holder = torture.start("holder", stale_ms=stale_ms, retry_ms=50, timeout_ms=10000, hold_ms=60000)
    # At least one renewal sent and confirmed; the next is stale/3 away, so
    # killing now leaves the last logged `renew` as the holder's newest row.
    torture.wait_for(lambda: torture.events("enter", "holder") and torture.events("renewed", "holder"), 15,
                     "the holder to enter and renew")
    holder.proc.send_signal(signal.SIGKILL)
    killed_ns = time.monotonic_ns()
    assert holder.proc.wait(timeout=10) == -signal.SIGKILL

    taker = torture.start("taker", stale_ms=stale_ms, retry_ms=50, timeout_ms=20000, hold_ms=10)
    code = taker.wait(timeout=40)
    assert code == 0, f"taker exited {code}: {taker.stderr()}"
    taken = torture.events("enter", "taker")
    assert len(taken) == 1, torture.log_text()
    taken_ns = ns(taken[0][3])

    held_from = [ns(f[3]) for f in torture.events("enter", "holder")]
    renewals = [ns(f[2]) for f in torture.events("renew", "holder")]
    last_sign_of_life = max(held_from + renewals)
    since_life_ms = (taken_ns - last_sign_of_life) / 1e6
    since_kill_ms = (taken_ns - killed_ns) / 1e6
    with capsys.disabled():
        print(f"\n[lock torture] kill -9 takeover: {len(renewals)} renewal(s) before the kill; taken over "
              f"{since_life_ms:.0f} ms after the holder's last renewal was sent (window {stale_ms} ms), "
              f"{since_kill_ms:.0f} ms after the kill")
    assert since_life_ms > stale_ms, "taken over before the dead holder's lease window had passed"
    assert since_kill_ms >= stale_ms - stale_ms // 3 - 1000, "taken over too soon after the kill"
    assert since_kill_ms <= 20000, "the dead holder's lock was not taken over within 20 s"


def test_holder_outliving_window_keeps_lock_by_renewal(torture, capsys):
    stale_ms, hold_ms = 3000, 9000
    holder = torture.start("holder", stale_ms=stale_ms, retry_ms=50, timeout_ms=10000, hold_ms=hold_ms)
    torture.wait_for(lambda: torture.events("enter", "holder"), 15, "the holder to enter")
    # Gives up well before the hold ends: must never get in.
    impatient = torture.start("impatient", stale_ms=stale_ms, retry_ms=50, timeout_ms=4000, hold_ms=10,
                              extra=("--timeout-exit-code", str(TIMEOUT_EXIT)))
    # Waits longer than the hold: must get in only after the holder left.
    patient = torture.start("patient", stale_ms=stale_ms, retry_ms=50, timeout_ms=30000, hold_ms=10)

    assert impatient.wait(timeout=30) == TIMEOUT_EXIT, impatient.stderr()
    assert "locked by another process" in impatient.stderr()
    assert holder.wait(timeout=40) == 0, holder.stderr()
    assert patient.wait(timeout=40) == 0, patient.stderr()

    assert not torture.events("lost"), torture.log_text()
    assert not torture.events("enter", "impatient"), torture.log_text()
    entered = ns(torture.events("enter", "holder")[0][3])
    left = ns(torture.events("leave", "holder")[0][3])
    assert (left - entered) / 1e6 >= hold_ms
    gave_up = ns(torture.events("exit", "impatient")[0][3])
    assert gave_up < left, "the impatient worker should have given up during the hold"
    patient_in = ns(torture.events("enter", "patient")[0][3])
    assert patient_in > left, "the patient worker got in while the holder still held the lock"

    sent = [entered] + [ns(f[2]) for f in torture.events("renew", "holder")]
    assert len(sent) - 1 >= hold_ms // (stale_ms // 3) - 1, torture.log_text()
    intervals_ms = [(b - a) / 1e6 for a, b in zip(sent, sent[1:])]
    # Renewals every stale/3 keep the lease (stale - margin from each send) alive.
    assert max(intervals_ms) < stale_ms // 3 + 500, intervals_ms
    with capsys.disabled():
        print(f"\n[lock torture] held {(left - entered) / 1e6:.0f} ms (window {stale_ms} ms) with "
              f"{len(sent) - 1} renewals, max interval {max(intervals_ms):.0f} ms; impatient gave up after "
              f"{(gave_up - entered) / 1e6:.0f} ms; patient entered {(patient_in - left) / 1e6:.0f} ms after the leave")
