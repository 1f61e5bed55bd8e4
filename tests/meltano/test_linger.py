"""The lock off the hot path (docs/lock.md "The lock off the hot path"): the
adapter keeps a released lock lingering between Meltano's update()s, gives it
up to another process that waits, releases it when idle, on close and at
exit, and a process killed while it lingers blocks the id no longer than the
lock's validity. Real Meltano classes in the test venv, a real ClickHouse."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import textwrap
import time

from test_adapter import PRELUDE, run

COUNTING = """
def counting(m):
    seen = []
    make_transport = m._make_transport
    def wrapped():
        t = make_transport()
        def call(req):
            seen.append(req["purpose"])
            return t(req)
        call.close = t.close
        return call
    m._make_transport = wrapped
    return seen

def lock_tables():
    import urllib.request
    req = urllib.request.Request(os.environ["T_HTTP"], data=f"SHOW TABLES FROM `{SCHEMA}`".encode(),
                                 headers={"X-ClickHouse-User": os.environ["T_USER"], "X-ClickHouse-Key": PASSWORD})
    return [t for t in urllib.request.urlopen(req).read().decode().split() if t.startswith("state_lock_")]

def state(i):
    return MeltanoState("dev:stream", {}, {"singer_state": {"n": i}})
"""


# The fairness test's two processes (tests/cluster/test_linger_cluster.py runs
# them too): one streams update()s of an id for argv[1] seconds, says
# "streaming" once its first update() holds the lock, and prints how many; the
# other makes one update() of it and prints how long that took.
STREAMER = """
m = make()
end = time.monotonic() + float(sys.argv[1])
n = 0
while time.monotonic() < end:
    m.update(MeltanoState("dev:fair", {}, {"singer_state": {"streamer": n}}))
    if n == 0:
        print("streaming", flush=True)
    n += 1
m.close()
print(">", n)
"""
SINGLE_UPDATE = """
m = make()
m.get("dev:fair")
t0 = time.monotonic()
m.update(MeltanoState("dev:fair", {}, {"singer_state": {"single": True}}))
print(">", round(time.monotonic() - t0, 3))
m.close()
"""


def run_counting(project, body: str) -> list:
    env = project.env(T_URI=project.server.uri(), T_PASSWORD=project.server.password, T_SCHEMA=project.schema,
                      T_HTTP=f"http://{project.server.host}:{project.server.port}/", T_USER=project.server.user)
    out = project.python(PRELUDE + COUNTING + textwrap.dedent(body), env=env)
    return [line[1:].strip() for line in out.stdout.splitlines() if line.startswith(">")]


def test_updates_of_one_id_cost_one_insert_each_and_the_lock_goes_when_idle(project):
    lines = run_counting(project, """
        m = make()
        seen = counting(m)
        m.update(state(-1))              # creates the schema and takes the lock
        del seen[:]
        t0 = time.monotonic()
        for i in range(50):
            m.update(state(i))           # Meltano's update(): the lock, then set (a complete state)
        elapsed_ms = (time.monotonic() - t0) * 1000
        from collections import Counter
        c = Counter(seen)
        # Besides: one write in 64 looks at the id's history (and may trim it).
        upkeep = ("lock_waiters", "history_over_limits", "trim_history_of")
        others = {p: n for p, n in c.items() if p != "insert_state" and p not in upkeep}
        print(">", c["insert_state"], json.dumps(others))
        print(">", c["lock_waiters"], round(elapsed_ms))
        print(">", json.dumps(m.get("dev:stream").completed_state))
        print(">", len(lock_tables()))   # lingering
        time.sleep(1.8)                  # idle: the background ticks release it
        print(">", len(lock_tables()), Counter(seen)["drop_lock"])
        m.update(state(50))
        m.close()                        # releases the lingering lock
        print(">", len(lock_tables()))
    """)
    # 50 INSERTs and nothing else but a few looks for waiters (and the
    # history's upkeep): the lock lingered.
    assert lines[0] == "50 {}", lines
    # A lingering lock looks for waiters at most once per WaiterCheckEveryMs
    # (200 ms at the default retry), however long the 50 updates took (a
    # loaded machine, the cluster suite running beside, makes them slower).
    looks, elapsed_ms = map(int, lines.pop(1).split())
    assert looks <= elapsed_ms // 200 + 1, (looks, elapsed_ms)
    assert json.loads(lines[1]) == {"singer_state": {"n": 49}}
    assert lines[2] == "1"
    assert lines[3] == "0 1"
    assert lines[4] == "0"


def test_a_process_waiting_for_a_streamed_id_gets_it_within_two_seconds(project):
    """Fairness: one process streams update()s of an id as fast as it can;
    another's single update() of that id completes within 2 s."""
    env = project.env(T_URI=project.server.uri(), T_PASSWORD=project.server.password, T_SCHEMA=project.schema)
    streamer = subprocess.Popen(
        [str(project.venv / "bin" / "python"), "-c", PRELUDE + STREAMER, "6"], cwd=project.root, env=env,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert streamer.stdout.readline().strip() == "streaming", "the streamer stopped before its first update()"
        lines = run(project, SINGLE_UPDATE)
    finally:
        out, err = streamer.communicate(timeout=60)
    assert streamer.returncode == 0, err[-3000:]
    streamed = int([line for line in out.splitlines() if line.startswith(">")][0][1:])
    assert streamed > 50, f"the streamer made only {streamed} updates"
    assert float(lines[0]) < 2.0, f"the single update() took {lines[0]} s while another process streamed"


def test_a_process_killed_while_its_lock_lingers_blocks_the_id_for_the_validity_at_most(project):
    env = project.env(T_URI=project.server.uri(), T_PASSWORD=project.server.password, T_SCHEMA=project.schema)
    holder = subprocess.Popen(
        [str(project.venv / "bin" / "python"), "-c", PRELUDE + """
m = make(lock_timeout_seconds=4)
m.update(MeltanoState("dev:killed", {}, {"singer_state": {"holder": 1}}))
print("lingering", flush=True)
time.sleep(60)
"""], cwd=project.root, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "lingering"
        killed = time.monotonic()
    finally:
        holder.send_signal(signal.SIGKILL)  # no release, no renewal, no exit hook
        holder.communicate(timeout=60)
    lines = run(project, """
        m = make(lock_timeout_seconds=4)
        t0 = time.monotonic()
        m.update(MeltanoState("dev:killed", {}, {"singer_state": {"after": 1}}))
        print(">", round(time.monotonic() - t0, 2))
        m.close()
    """)
    waited = float(lines[0])
    total = time.monotonic() - killed
    # Taken over once the dead holder's lock is 4 s old (not before: it was fresh).
    assert 1.0 < waited and total < 4 + 3, (waited, total)


def test_processes_merging_into_one_id_with_lingering_locks_lose_no_update(project):
    """Lock torture through the lingering lock: four processes each make 30
    update()s of one id with a partial state under a key of their own.
    Meltano's update() reads the current partial state, merges and writes it
    back under the lock, so two holders at once would overwrite each other's
    keys: every key must be there at the end."""
    env = project.env(T_URI=project.server.uri(), T_PASSWORD=project.server.password, T_SCHEMA=project.schema)
    code = PRELUDE + """
tag = sys.argv[1]
m = make(lock_retry_seconds=0.2)
for k in range(30):
    m.update(MeltanoState("dev:torture", {"singer_state": {f"{tag}-{k}": k}}, {}))
m.close()
print(">", tag, "done")
"""
    workers = [subprocess.Popen([str(project.venv / "bin" / "python"), "-c", code, f"w{i}"], cwd=project.root,
                                env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
               for i in range(4)]
    for w in workers:
        out, err = w.communicate(timeout=300)
        assert w.returncode == 0, err[-3000:]
    lines = run(project, """
        print(">", json.dumps(make().get("dev:torture").partial_state))
    """)
    merged = json.loads(lines[0])["singer_state"]
    missing = [f"w{i}-{k}" for i in range(4) for k in range(30) if f"w{i}-{k}" not in merged]
    assert missing == [], f"{len(missing)} updates lost: {missing[:10]}"
