"""A mixed fleet during a migration: processes of the Python ClickHouse state
backend and chstate (`--python-locks`) locking the same state ids in one
schema, in the modern engine (chDB behind tools/chdb_http.py).

The Python side is that backend's acquire_lock as published (meltano-state-
backend-clickhouse, backend.py): read the FINAL row of `<table>_lock` for the
id (lowest lock_id), if there is one delete rows older than 300 s and read
again; if none, insert a candidate row and read again: it holds the lock if
the row read is its own, else it withdraws the candidate; sleep and retry.
Release deletes its row. Its statements are sent here over HTTP exactly as
written there (query parameters for the id), by threads of this process; the
chstate contenders are `chstate lock` processes. Every holder logs entering
and leaving its critical section; no two holders of which one is chstate may
overlap. (Two Python processes can overlap each other: their check and insert
are not atomic. Those overlaps are counted and shown, not blamed on chstate.)
"""

from __future__ import annotations

import os
import subprocess
import threading
import time
import urllib.parse
import urllib.request
import uuid

import pytest

ROUNDS = 4
HOLD_S = 0.25


class PythonBackendLock:
    """The Python backend's lock statements over HTTP (modern servers only)."""

    def __init__(self, front, schema: str, table: str = "state"):
        self.front, self.lock_table = front, f"`{schema}`.`{table}_lock`"
        self.insert_table = f"{schema}.{table}_lock"

    def _post(self, sql: str, **params) -> str:
        query = urllib.parse.urlencode({f"param_{k}": v for k, v in params.items()})
        request = urllib.request.Request(f"{self.front.url}/?{query}", data=sql.encode(),
                                         headers={"X-ClickHouse-User": self.front.user,
                                                  "X-ClickHouse-Key": self.front.password})
        with urllib.request.urlopen(request, timeout=30) as answer:
            return answer.read().decode()

    def held_by(self, state_id: str):
        rows = self._post(f"SELECT lock_id FROM {self.lock_table} FINAL "
                          "WHERE state_id = {state_id:String} ORDER BY lock_id LIMIT 1 FORMAT TabSeparated",
                          state_id=state_id).splitlines()
        return rows[0] if rows else None

    def acquire(self, state_id: str, retry_seconds: float, timeout_s: float) -> str | None:
        lock_id = str(uuid.uuid4())
        waited = 0.0
        while waited < timeout_s:
            holder = self.held_by(state_id)
            if holder is not None:
                self._post(f"DELETE FROM {self.lock_table} WHERE locked_at < now() - 300")
                holder = self.held_by(state_id)
            if holder is None:
                # clickhouse-connect's insert(): the row values, columns named.
                self._post(f"INSERT INTO {self.insert_table} (state_id, lock_id) FORMAT TabSeparated\n"
                           f"{state_id}\t{lock_id}\n")
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


def test_chstate_and_the_python_backend_never_hold_one_id_at_once(fleet, chstate_bin, front, schema, tmp_path):
    uri, env = fleet
    state_id = "dev:tap-shared-to-target"
    log: list = []
    log_lock = threading.Lock()
    errors: list = []

    def python_worker(name: str) -> None:
        lock = PythonBackendLock(front, schema)
        try:
            for _ in range(ROUNDS):
                lock_id = lock.acquire(state_id, retry_seconds=0.3, timeout_s=90)
                if lock_id is None:
                    errors.append(f"{name}: no lock in 90 s")
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
            out = subprocess.run([str(chstate_bin), "--uri", uri, "--python-locks", "--lock-retry", "0.3", "lock",
                                  state_id, "--timeout", "90", "--", "sh", "-c", section],
                                 env=env, capture_output=True, text=True, timeout=180)
            if out.returncode != 0:
                errors.append(f"{name}: exit {out.returncode}: {out.stderr[-500:]}")
                return
        times = [float(t) for t in marks.read_text().split()]
        with log_lock:
            log.extend((times[i], times[i + 1], name) for i in range(0, len(times), 2))

    workers = [threading.Thread(target=python_worker, args=(f"python-{i}",)) for i in range(2)]
    workers += [threading.Thread(target=chstate_worker, args=(f"chstate-{i}",)) for i in range(2)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(timeout=600)
    assert not errors, errors
    assert len(log) == 4 * ROUNDS, log
    bad = [pair for pair in overlaps(log) if any(n.startswith("chstate") for n in pair)]
    between_pythons = [pair for pair in overlaps(log) if all(n.startswith("python") for n in pair)]
    print(f"critical sections: {len(log)}; overlaps with chstate: {len(bad)}; "
          f"between two Python processes (their own race): {len(between_pythons)}")
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
        assert (lock.held_by("dev:y") or "").startswith("chstate:")
        assert lock.acquire("dev:y", retry_seconds=0.3, timeout_s=2) is None
    finally:
        release.touch()
        assert holder.wait(timeout=30) == 0
    lock = PythonBackendLock(front, schema)
    assert lock.held_by("dev:y") is None  # the marker is withdrawn on release
    assert lock.acquire("dev:y", retry_seconds=0.3, timeout_s=5)
