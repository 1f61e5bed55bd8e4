"""A mixed fleet during a migration: processes of the Python ClickHouse state
backend and chstate (`--python-locks`) locking the same state ids in one
schema, in the modern engine (chDB behind tools/chdb_http.py).

The Python side is that backend's acquire_lock, in two versions
(/work/shared/notes/meltano.md):
- published (meltano-state-backend-clickhouse at f6ec0ce): read the FINAL row
  of `<table>_lock` for the id (ORDER BY lock_id LIMIT 1); if there is one,
  delete rows older than 300 s and read again; if none, insert a candidate
  row, sleep the settle time (1 s), read every row of the id without FINAL:
  it holds the lock if min() of their lock ids is its own, else it withdraws
  the candidate; sleep and retry;
- old (before its race fix): the same without the settle, the check being
  the FINAL read again.
Release deletes its row. Its statements are sent here over HTTP as written
there (query parameters for the id), by threads of this process, each of
which pauses for a random while between reading the id free and inserting,
and between inserting and checking (a slow client or a busy server: the
pauses outlast the settle). A further thread keeps the chDB front busy with
long queries, so that every statement waits its turn. The chstate
contenders are `chstate lock` processes. Every holder logs entering and
leaving its critical section; no two holders of which one is chstate may
overlap. (Two Python processes can overlap each other: their check and
insert are not atomic. Those overlaps are counted and shown, not blamed on
chstate.)
"""

from __future__ import annotations

import os
import random
import subprocess
import threading
import time
import urllib.parse
import urllib.request
import uuid

import pytest

ROUNDS = 4
HOLD_S = 0.25
PAUSE_MAX_S = 1.6  # longer than the published settle (1 s)


class PythonBackendLock:
    """The Python backend's lock statements over HTTP (modern servers only)."""

    def __init__(self, front, schema: str, table: str = "state", version: str = "published",
                 pause_max_s: float = 0.0, seed: int = 0):
        self.front, self.lock_table = front, f"`{schema}`.`{table}_lock`"
        self.insert_table = f"{schema}.{table}_lock"
        self.version, self.pause_max_s = version, pause_max_s
        self.rng = random.Random(seed)

    def _post(self, sql: str, **params) -> str:
        query = urllib.parse.urlencode({f"param_{k}": v for k, v in params.items()})
        request = urllib.request.Request(f"{self.front.url}/?{query}", data=sql.encode(),
                                         headers={"X-ClickHouse-User": self.front.user,
                                                  "X-ClickHouse-Key": self.front.password})
        with urllib.request.urlopen(request, timeout=60) as answer:
            return answer.read().decode()

    def _pause(self) -> None:
        if self.pause_max_s and self.rng.random() < 0.6:
            time.sleep(self.rng.uniform(0, self.pause_max_s))

    def held_by(self, state_id: str):
        rows = self._post(f"SELECT lock_id FROM {self.lock_table} FINAL "
                          "WHERE state_id = {state_id:String} ORDER BY lock_id LIMIT 1 FORMAT TabSeparated",
                          state_id=state_id).splitlines()
        return rows[0] if rows else None

    def every_row(self, state_id: str) -> list:
        return self._post(f"SELECT lock_id FROM {self.lock_table} WHERE state_id = {{state_id:String}} "
                          "FORMAT TabSeparated", state_id=state_id).splitlines()

    def acquire(self, state_id: str, retry_seconds: float, timeout_s: float) -> str | None:
        lock_id = str(uuid.uuid4())
        waited = 0.0
        while waited < timeout_s:
            holder = self.held_by(state_id)
            if holder is not None:
                self._post(f"DELETE FROM {self.lock_table} WHERE locked_at < now() - 300")
                holder = self.held_by(state_id)
            if holder is None:
                self._pause()
                # clickhouse-connect's insert(): the row values, columns named.
                self._post(f"INSERT INTO {self.insert_table} (state_id, lock_id) FORMAT TabSeparated\n"
                           f"{state_id}\t{lock_id}\n")
                if self.version == "published":
                    time.sleep(1.0)  # LOCK_SETTLE_SECONDS
                    self._pause()
                    rows = self.every_row(state_id)
                    if rows and min(rows) == lock_id:
                        return lock_id
                    waited += 1.0
                else:
                    self._pause()
                    if self.held_by(state_id) == lock_id:
                        return lock_id
                self.release(state_id, lock_id)
            time.sleep(retry_seconds)
            waited += retry_seconds
        return None

    def release(self, state_id: str, lock_id: str) -> None:
        self._post(f"DELETE FROM {self.lock_table} WHERE state_id = {{state_id:String}} AND lock_id = {{lock_id:String}}",
                   state_id=state_id, lock_id=lock_id)


def overlaps(log: list) -> list:
    """Pairs of (name, name) whose [enter, leave] intervals intersect."""
    spans = sorted(log)
    out = []
    for i, (a_in, a_out, a) in enumerate(spans):
        for b_in, b_out, b in spans[i + 1:]:
            if b_in >= a_out:
                break
            out.append((a, b))
    return out


@pytest.fixture
def fleet(chstate_bin, front, schema, tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CLICKHOUSE_", "MELTANO_", "CHSTATE_"))}
    env.update({"MELTANO_STATE_BACKEND_CLICKHOUSE_SCHEMA": schema,
                "MELTANO_STATE_BACKEND_CLICKHOUSE_PASSWORD": front.password})
    uri = f"clickhouse://{front.user}@{front.host}:{front.port}/default"
    subprocess.run([str(chstate_bin), "--uri", uri, "init"], env=env, check=True, capture_output=True)
    return uri, env


class Busy:
    """Keeps the chDB front busy: one long query after another until stopped."""

    def __init__(self, front):
        self.front, self.stop, self.queries = front, threading.Event(), 0
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        lock = PythonBackendLock(self.front, "system")
        while not self.stop.is_set():
            lock._post("SELECT count() FROM numbers(3000000) WHERE sipHash64(number) % 7 = 3 FORMAT TabSeparated")
            self.queries += 1

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join(timeout=120)


@pytest.mark.parametrize("version", ["published", "old"])
def test_chstate_and_the_python_backend_never_hold_one_id_at_once(fleet, chstate_bin, front, schema, tmp_path,
                                                                  version):
    uri, env = fleet
    state_id = "dev:tap-shared-to-target"
    log: list = []
    log_lock = threading.Lock()
    errors: list = []

    def python_worker(name: str, seed: int) -> None:
        lock = PythonBackendLock(front, schema, version=version, pause_max_s=PAUSE_MAX_S, seed=seed)
        try:
            for _ in range(ROUNDS):
                lock_id = lock.acquire(state_id, retry_seconds=0.3, timeout_s=120)
                if lock_id is None:
                    errors.append(f"{name}: no lock in 120 s")
                    return
                entered = time.time()
                time.sleep(HOLD_S)
                with log_lock:
                    log.append((entered, time.time(), name))
                lock.release(state_id, lock_id)
                time.sleep(0.05)
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(f"{name}: {e!r}")

    def chstate_worker(name: str) -> None:
        marks = tmp_path / f"{name}.log"
        section = (f"python3 -c 'import time; print(time.time())' >> {marks}; sleep {HOLD_S}; "
                   f"python3 -c 'import time; print(time.time())' >> {marks}")
        for _ in range(ROUNDS):
            # A validity of 30 s: every request waits its turn behind the
            # long queries, and a renewal is three of them.
            out = subprocess.run([str(chstate_bin), "--uri", uri, "--python-locks", "--lock-retry", "0.3",
                                  "--stale-lock", "30", "lock", state_id, "--lock-timeout", "120", "--", "sh", "-c",
                                  section],
                                 env=env, capture_output=True, text=True, timeout=240)
            if out.returncode != 0:
                errors.append(f"{name}: exit {out.returncode}: {out.stderr[-500:]}")
                return
        times = [float(t) for t in marks.read_text().split()]
        with log_lock:
            log.extend((times[i], times[i + 1], name) for i in range(0, len(times), 2))

    workers = [threading.Thread(target=python_worker, args=(f"python-{i}", i)) for i in range(2)]
    workers += [threading.Thread(target=chstate_worker, args=(f"chstate-{i}",)) for i in range(2)]
    with Busy(front) as busy:
        for w in workers:
            w.start()
        for w in workers:
            w.join(timeout=900)
    assert not errors, errors
    assert len(log) == 4 * ROUNDS, log
    bad = [pair for pair in overlaps(log) if any(n.startswith("chstate") for n in pair)]
    between_pythons = [pair for pair in overlaps(log) if all(n.startswith("python") for n in pair)]
    print(f"{version}: critical sections: {len(log)}; overlaps with chstate: {len(bad)}; "
          f"between two Python processes (their own race): {len(between_pythons)}; "
          f"long queries keeping the front busy: {busy.queries}")
    assert busy.queries > 0, "the front was never kept busy"
    assert bad == []
    # Every marker was withdrawn: the Python backend sees the id free.
    assert PythonBackendLock(front, schema).held_by(state_id) is None


def test_a_python_holder_keeps_chstate_out_until_it_releases(fleet, chstate_bin, front, schema, tmp_path):
    uri, env = fleet
    lock = PythonBackendLock(front, schema)
    lock_id = lock.acquire("dev:x", retry_seconds=0.3, timeout_s=10)
    assert lock_id
    out = subprocess.run([str(chstate_bin), "--uri", uri, "--python-locks", "lock", "dev:x", "--timeout", "2", "--",
                          "true"], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 4, out.stderr
    assert "Python ClickHouse backend" in out.stderr and lock_id in out.stderr
    # Without --python-locks too: every acquisition looks at the backend's
    # live rows first (a mixed fleet is safe by default).
    out = subprocess.run([str(chstate_bin), "--uri", uri, "lock", "dev:x", "--timeout", "2", "--", "true"], env=env,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 4, out.stderr
    assert "Python ClickHouse backend" in out.stderr and lock_id in out.stderr
    lock.release("dev:x", lock_id)
    out = subprocess.run([str(chstate_bin), "--uri", uri, "--python-locks", "lock", "dev:x", "--timeout", "5", "--",
                          "true"], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr


def test_a_chstate_holder_keeps_the_python_backend_out(fleet, chstate_bin, front, schema, tmp_path):
    uri, env = fleet
    started, release = tmp_path / "started", tmp_path / "release"
    holder = subprocess.Popen([str(chstate_bin), "--uri", uri, "--python-locks", "lock", "dev:y", "--", "sh", "-c",
                               f"touch {started}; while [ ! -e {release} ]; do sleep 0.02; done"],
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 30
        while not started.exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        assert started.exists()
        lock = PythonBackendLock(front, schema)
        # The marker wins the FINAL read (the newest row) and every min().
        assert (lock.held_by("dev:y") or "").startswith("!chstate:")
        assert min(lock.every_row("dev:y")).startswith("!chstate:")
        assert lock.acquire("dev:y", retry_seconds=0.3, timeout_s=2) is None
    finally:
        release.touch()
        assert holder.wait(timeout=30) == 0
    lock = PythonBackendLock(front, schema)
    assert lock.held_by("dev:y") is None  # the marker is withdrawn on release
    assert lock.acquire("dev:y", retry_seconds=0.3, timeout_s=5)
