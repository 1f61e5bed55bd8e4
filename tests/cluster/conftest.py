"""Fixtures for the cluster tests (tests/cluster/test_*.py).

`cluster`: ZooKeeper plus replicas r1, r2 and r3 of one shard (cluster
"chstate"), started once per session with tools/clickhouse_server.py in a
private folder and removed at the end. Fault tests stop, kill and restart its
processes; the `healthy` fixture brings everything back before each test.
`Cluster.uri` names one replica, `Cluster.hosts_uri` all three (a host list,
in a given order: the core starts with the first and fails over).
`chstate_bin`, `torture_bin`: the CLI and the lock torture worker (built when
missing). Each test gets its own schema.

  python3 -m pytest tests/cluster        # from the repository root
"""

from __future__ import annotations

import io
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from pathlib import Path

import pytest

from chserver import REPO

sys.path.insert(0, str(REPO / "tools"))
import clickhouse_server as chs  # noqa: E402

REPLICAS = chs.REPLICAS


class Run:
    def __init__(self, proc: subprocess.CompletedProcess, seconds: float):
        self.code, self.seconds = proc.returncode, seconds
        self.out = proc.stdout.decode(errors="replace")
        self.err = proc.stderr.decode(errors="replace")

    def __repr__(self) -> str:
        return f"exit {self.code} after {self.seconds:.1f} s\nstdout: {self.out}\nstderr: {self.err}"


class Cluster:
    def __init__(self, folder: Path, chstate: Path):
        self.folder, self.chstate = folder, chstate
        self.info = chs.start_cluster(folder)
        self.name = self.info["name"]
        self.password = self.info["password"]

    def port(self, replica: str) -> int:
        return self.info["ports"][replica]["http_port"]

    def uri(self, replica: str, schema: str, cluster: bool = True, alone: bool = False) -> str:
        """A client that talks to `replica`: in cluster mode the host list with `replica` first,
        the others after it (a claims read must reach a majority of the replicas, docs/cluster.md),
        so requests go to `replica` while it answers; `alone` (or no cluster): that host only."""
        q = f"?schema={schema}" + (f"&cluster={self.name}" if cluster else "")
        if not cluster or alone:
            return f"clickhouse://chstate@127.0.0.1:{self.port(replica)}/default{q}"
        order = (replica, *(r for r in REPLICAS if r != replica))
        return f"clickhouse://chstate@{self.hosts(order)}/default{q}"

    def hosts(self, order: tuple[str, ...] = REPLICAS) -> str:
        """The host list `127.0.0.1:P1,127.0.0.1:P2,...` of the replicas in `order`."""
        return ",".join(f"127.0.0.1:{self.port(r)}" for r in order)

    def hosts_uri(self, schema: str, order: tuple[str, ...] = REPLICAS) -> str:
        """A URI naming several hosts (docs/cluster.md), the first of `order` first."""
        return f"clickhouse://chstate@{self.hosts(order)}/default?schema={schema}&cluster={self.name}"

    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("CLICKHOUSE_", "MELTANO_", "CHSTATE_"))}
        env["MELTANO_STATE_BACKEND_CLICKHOUSE_PASSWORD"] = self.password
        return env

    def cli(self, replica: str, schema: str, *args: str, timeout: float = 120, cluster: bool = True) -> Run:
        start = time.monotonic()
        proc = subprocess.run([str(self.chstate), *args, "--uri", self.uri(replica, schema, cluster)],
                              capture_output=True, env=self.env(), timeout=timeout)
        return Run(proc, time.monotonic() - start)

    def cli_hosts(self, schema: str, *args: str, order: tuple[str, ...] = REPLICAS, timeout: float = 120) -> Run:
        """The CLI with the several-host URI of `order`."""
        start = time.monotonic()
        proc = subprocess.run([str(self.chstate), *args, "--uri", self.hosts_uri(schema, order)],
                              capture_output=True, env=self.env(), timeout=timeout)
        return Run(proc, time.monotonic() - start)

    # A replica whose ZooKeeper session is being restored (it expires on a
    # loaded machine) answers a read with one of these until it is back. A
    # lagging replica's 289 is the callers' to wait out (raw_rows, ...).
    TRANSIENT_READ_CODES = ("Code: 225,", "Code: 242,", "Code: 999,", "Replica is not active")

    def sql(self, replica: str, sql: str, **settings) -> str:
        """One statement on `replica`. A SELECT that meets a replica catching up
        (TRANSIENT_READ_CODES) is asked again for up to 30 s; anything else raises."""
        url = f"http://127.0.0.1:{self.port(replica)}/?" + urllib.parse.urlencode(settings)
        deadline = time.monotonic() + 30
        while True:
            request = urllib.request.Request(url, data=sql.encode(), headers={
                "X-ClickHouse-User": "chstate", "X-ClickHouse-Key": self.password})
            try:
                with urllib.request.urlopen(request, timeout=60) as response:
                    return response.read().decode()
            except urllib.error.HTTPError as e:
                body = e.read().decode(errors="replace")
                transient = any(code in body for code in self.TRANSIENT_READ_CODES)
                if not (sql.lstrip().upper().startswith("SELECT") and transient and time.monotonic() < deadline):
                    # The body stays readable for callers that look at it.
                    raise urllib.error.HTTPError(e.url, e.code, e.msg, e.headers, io.BytesIO(body.encode())) from None
                time.sleep(0.5)

    # ---- faults ----
    def stop_replica(self, replica: str) -> None:
        chs.stop(self.folder / replica)

    def kill_replica(self, replica: str) -> None:
        inst = chs.load_instance(self.folder / replica)
        assert chs._pid_is_ours(inst["pid"], Path(inst["config"])), "the recorded pid is not this replica's server"
        os.kill(inst["pid"], signal.SIGKILL)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and chs._pid_is_ours(inst["pid"], Path(inst["config"])):
            try:
                stat = Path(f"/proc/{inst['pid']}/stat").read_text()
                if stat.split(")")[-1].split()[0] == "Z":
                    break
            except OSError:
                break
            time.sleep(0.05)

    def restart_replica(self, replica: str, wait: bool = True, wait_seconds: float = 90) -> None:
        """Starts a stopped or killed replica again, with its ports and data (nothing if it runs).
        With `wait`, returns once it has its ZooKeeper session and DDL queue and is writable
        (not read-only: a killed replica's old session may hold its is_active node for up
        to the session timeout, 30 s)."""
        info = chs.load_cluster(self.folder)
        if not chs.running(self.folder / replica):
            chs.start_replica(self.folder, replica, info)
        if not wait:
            return
        chs._wait_for_ddl_queue(info, replica)
        self.wait_writable((replica,), wait_seconds)

    def wait_writable(self, replicas: tuple[str, ...] = REPLICAS, wait_seconds: float = 90) -> None:
        """Waits until no replicated table of `replicas` is read-only or without a session."""
        deadline = time.monotonic() + wait_seconds
        last = ""
        while time.monotonic() < deadline:
            try:
                if all(self.sql(r, "SELECT count() FROM system.replicas WHERE is_readonly OR is_session_expired")
                       .strip() == "0" for r in replicas):
                    return
            except (urllib.error.URLError, OSError) as e:
                last = str(e)
            time.sleep(0.2)
        pytest.fail(f"replicas {', '.join(replicas)} were not writable within {wait_seconds:.0f} s: {last}")

    def stop_zookeeper(self) -> None:
        chs.stop_zookeeper(self.folder / "zookeeper")

    def start_all(self) -> None:
        """Starts whatever is down and waits until every replica accepts quorum writes again."""
        chs.start_cluster(self.folder)
        self.wait_writable(REPLICAS, 90)


@pytest.fixture(scope="session")
def binaries(tmp_path_factory) -> dict[str, Path]:
    """Private copies of the CLI and the torture worker, built from this tree
    (or $CHSTATE_BIN / $CHSTATE_LOCK_TORTURE). Copies, and the default
    configuration's output folder rather than the bazel-bin link: another
    build in this tree (-c opt, --config=wasi) can repoint that link while
    the suite runs."""
    folder = tmp_path_factory.mktemp("bin")
    wanted = {"chstate": ("CHSTATE_BIN", "//hosts/native:chstate", "hosts/native/chstate"),
              "lock_torture": ("CHSTATE_LOCK_TORTURE", "//tools:lock_torture", "tools/lock_torture")}
    out = {}
    if not all(os.environ.get(env) for env, _, _ in wanted.values()):
        subprocess.run(["bazel", "build", *[t for _, t, _ in wanted.values()]], cwd=REPO, check=True)
        bin_dir = Path(subprocess.run(["bazel", "info", "bazel-bin"], cwd=REPO, check=True, capture_output=True,
                                      text=True).stdout.strip())
    for name, (env, _, relative) in wanted.items():
        src = Path(os.environ[env]) if os.environ.get(env) else bin_dir / relative
        out[name] = Path(shutil.copy2(src, folder / name))
    return out


@pytest.fixture(scope="session")
def chstate_bin(binaries) -> Path:
    return binaries["chstate"]


@pytest.fixture(scope="session")
def torture_bin(binaries) -> Path:
    return binaries["lock_torture"]


@pytest.fixture(scope="session")
def cluster(chstate_bin) -> Cluster:
    folder = Path(tempfile.mkdtemp(prefix="chstate-cluster-"))
    try:
        yield Cluster(folder, chstate_bin)
    finally:
        # CHSTATE_KEEP_CLUSTER=1 keeps the folder (logs) for a post-mortem.
        chs.stop_cluster(folder, remove=not os.environ.get("CHSTATE_KEEP_CLUSTER"))


@pytest.fixture
def healthy(cluster) -> Cluster:
    cluster.start_all()
    return cluster


@pytest.fixture
def schema(healthy) -> str:
    name = f"c_{uuid.uuid4().hex[:12]}"
    yield name
    try:
        healthy.start_all()
        healthy.sql("r1", f"DROP DATABASE IF EXISTS `{name}` ON CLUSTER `{healthy.name}`",
                    wait_end_of_query=1, distributed_ddl_task_timeout=30)
    except Exception:  # noqa: BLE001 - cleanup only; the test's own result stands
        pass


@pytest.fixture(scope="session")
def meltano_env():
    """(venv, native library) for real `meltano` runs: the Meltano venv with the
    adapter wheel installed as users install it (tests/meltano's harness)."""
    sys.path.insert(0, str(REPO / "tests" / "meltano"))
    import meltano_harness as harness  # noqa: E402 (only the Meltano tests need it)
    venv = harness.ensure_venv()
    harness.install_adapter(venv)
    return venv, harness.native_library()
