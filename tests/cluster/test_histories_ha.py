"""Histories through every runtime while a replica of three is killed, checked.

tests/faults/test_histories.py runs six runtimes (the CLI, the Python binding,
wasmtime, Node, Lua 5.4, OpenResty) on two shared ids through a fault proxy in
front of one server. This is the same plan and the same checker against the
three-replica cluster, every client naming all three replicas (the host list
rotated, so two runtimes start on each replica): when a quarter of the
operations of the CLI and the in-process runtimes are done, r1 is SIGKILLed;
when two thirds are done it is started again. Cluster mode promises that one
replica down stops nothing (docs/cluster.md): writes keep their quorum of 2,
reads (select_sequential_consistency) see every confirmed write, and the lock
is claims in a replicated table.

Checked: no acknowledged merge lost and every read linearizable per id
(history_check), merges acknowledged while r1 was down, and afterwards every
replica, r1 too, holding the same final state.

  python3 -m pytest tests/cluster/test_histories_ha.py        # from the repository root
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import threading
import time

import pytest

from chserver import REPO

sys.path.insert(0, str(REPO / "tests" / "faults"))
sys.path.insert(0, str(REPO / "tests" / "openresty"))

from history_check import check  # noqa: E402
from nginx_server import check_installed, running_nginx  # noqa: E402
from test_histories import (HISTORY_LOCATION, IDS, RUNTIMES, Runtimes, keys_of, plan,  # noqa: E402
                            run_concurrently, seed_op)
from test_same_policy import artifacts, python_library, wasmtime_module  # noqa: E402,F401  (fixtures)

pytestmark = pytest.mark.requires_clickhouse

SEED = int(os.environ.get("CHSTATE_HISTORY_SEED", "39"))
OPS = 16  # per runtime
VICTIM = "r1"
ORDER = ("r1", "r2", "r3")
# A replicated 18.16 cluster beside the other suites on two cores: quorum writes take
# seconds at worst, not one.
TIMEOUTS = {"lock_timeout_seconds": 10, "lock_wait_seconds": 120, "connect_timeout_seconds": 1,
            "request_timeout_seconds": 5}


def rotated(i: int) -> tuple[str, ...]:
    return ORDER[i % 3:] + ORDER[:i % 3]


class Cli:
    def __init__(self, c, schema: str):
        self.c, self.schema = c, schema

    def __call__(self, *args: str, order: tuple[str, ...] = ORDER, alone: str | None = None):
        uri = self.c.uri(alone, self.schema, alone=True) if alone else self.c.hosts_uri(self.schema, order)
        env = dict(self.c.env(), MELTANO_STATE_BACKEND_LOCK_TIMEOUT_SECONDS=str(TIMEOUTS["lock_timeout_seconds"]),
                   MELTANO_STATE_BACKEND_CLICKHOUSE_LOCK_WAIT_SECONDS=str(TIMEOUTS["lock_wait_seconds"]))
        proc = subprocess.run([str(self.c.chstate), *args, "--uri", uri,
                               "--timeout", str(TIMEOUTS["request_timeout_seconds"]),
                               "--connect-timeout", str(TIMEOUTS["connect_timeout_seconds"])],
                              capture_output=True, env=env, timeout=300)
        assert self.c.password.encode() not in proc.stdout + proc.stderr, "the password was printed"
        return proc

    def keys(self, state_id: str, alone: str | None = None) -> frozenset | None:
        r = self("get", state_id, alone=alone)
        return keys_of(json.loads(r.stdout)) if r.returncode == 0 else None


class Killer:
    """Kills VICTIM once `kill_at` operations are done and starts it again at `restore_at`
    (or when the runtimes are done, whichever comes first): events, not durations."""

    def __init__(self, c, kill_at: int, restore_at: int):
        self.c, self.kill_at, self.restore_at = c, kill_at, restore_at
        self.count, self.cond, self.finished = 0, threading.Condition(), False
        self.killed = self.restored = None
        self.done_at_kill = None
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.error: BaseException | None = None

    def done(self, _op) -> None:
        with self.cond:
            self.count += 1
            self.cond.notify_all()

    def finish(self) -> None:
        with self.cond:
            self.finished = True
            self.cond.notify_all()
        self.thread.join(timeout=120)

    def _wait(self, n: int) -> None:
        with self.cond:
            self.cond.wait_for(lambda: self.count >= n or self.finished)

    def _run(self) -> None:
        try:
            self._wait(self.kill_at)
            self.done_at_kill = self.count
            self.c.kill_replica(VICTIM)
            self.killed = time.time()
            self._wait(self.restore_at)
            self.c.restart_replica(VICTIM, wait=False)
            self.restored = time.time()
        except BaseException as e:  # reported by the test
            self.error = e


def test_histories_through_every_runtime_while_a_replica_is_killed_are_linearizable(
        healthy, schema, artifacts, python_library, wasmtime_module, tmp_path, capsys):  # noqa: F811
    assert wasmtime_module is not None, "the wasmtime package is needed (tools/setup installs it)"
    check_installed()
    c = healthy
    cli = Cli(c, schema)
    assert cli("init").returncode == 0
    for state_id in IDS:
        r = cli("merge", state_id, json.dumps({"singer_state": {"seed": 1}}))
        assert r.returncode == 0, r.stderr
    uris = {name: c.hosts_uri(schema, rotated(i)) for i, name in enumerate(RUNTIMES)}
    rng = random.Random(SEED)
    plans = {name: plan(name, rng, OPS) for name in RUNTIMES}
    counted = 3 * OPS  # the CLI, python and wasmtime report each operation as it completes
    killer = Killer(c, kill_at=counted // 4, restore_at=2 * counted // 3)
    with running_nginx(uris["openresty"], c.password, HISTORY_LOCATION) as nginx:
        rt = Runtimes(uris, c.password, schema, lambda *args: cli(*args, order=rotated(0)), artifacts,
                      wasmtime_module, tmp_path, nginx, TIMEOUTS, done=killer.done)
        killer.thread.start()
        start = time.time()
        try:
            ops = run_concurrently({name: (lambda name=name: getattr(rt, f"run_{name}")(plans[name]))
                                    for name in RUNTIMES})
        finally:
            killer.finish()
        took = time.time() - start
    assert killer.error is None, killer.error
    assert killer.killed is not None and killer.done_at_kill < counted, "r1 was not killed while the runtimes ran"
    c.restart_replica(VICTIM, wait=True)
    end = time.time()
    final = {state_id: cli.keys(state_id) for state_id in IDS}
    assert None not in final.values(), final
    anomalies = check(seed_op() + ops, final, end)
    (tmp_path / "history.json").write_text(json.dumps(
        [dict(vars(o), value=sorted(o.value), t1=None if o.t1 == float("inf") else o.t1) for o in ops]
        + [{"killed": killer.killed, "restored": killer.restored, "final": {k: sorted(v) for k, v in final.items()}}],
        indent=0))
    by = {o: sum(1 for x in ops if x.outcome == o) for o in ("ok", "fail", "unknown")}
    down_until = killer.restored or end
    during = [o for o in ops if o.kind == "merge" and o.outcome == "ok" and o.t0 >= killer.killed
              and o.t1 <= down_until]
    # Every replica, the one killed too, ends with the same state (r1 catches up after its restart).
    deadline, per_replica = time.monotonic() + 90, {}
    while time.monotonic() < deadline:
        per_replica = {r: {state_id: cli.keys(state_id, alone=r) for state_id in IDS} for r in ORDER}
        if all(v == final for v in per_replica.values()):
            break
        time.sleep(0.5)
    with capsys.disabled():
        print(f"\n[histories, a replica killed] {len(ops)} operations through {len(RUNTIMES)} runtimes on "
              f"{len(IDS)} ids over 3 replicas in {took:.1f} s (seed {SEED}): {by['ok']} ok, {by['fail']} failed "
              f"reads, {by['unknown']} merges of unknown outcome; {VICTIM} killed after {killer.done_at_kill} "
              f"operations, down {down_until - killer.killed:.1f} s, {len(during)} merges acknowledged "
              f"while it was down; {len(anomalies)} anomalies")
    assert anomalies == [], "\n".join(anomalies[:10]) + f"\nthe history: {tmp_path / 'history.json'}"
    assert len(during) >= 3, f"only {len(during)} merges were acknowledged while {VICTIM} was down"
    assert by["ok"] >= len(ops) // 2, by
    merges_ok = {o.key for o in ops if o.kind == "merge" and o.outcome == "ok"}
    for name in RUNTIMES:
        assert any(k.startswith(f"{name}-") for k in merges_ok), f"no merge of {name} was acknowledged"
    assert all(v == final for v in per_replica.values()), per_replica
