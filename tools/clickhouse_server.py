#!/usr/bin/env python3
"""Start and stop throwaway ClickHouse servers on loopback.

Tests, CI and `tools/chstate` use this so nobody needs a ClickHouse of their own.
It only ever stops a server it started itself: the server's PID is recorded in the
instance folder and is checked against the config path on its command line before
any signal is sent.

  tools/clickhouse_server.py start DIR     # start, wait for /ping, print env lines
  tools/clickhouse_server.py stop DIR      # stop the server recorded in DIR
  tools/clickhouse_server.py ensure DIR    # start unless the one in DIR is running
  tools/clickhouse_server.py run -- CMD    # temp server, run CMD with CHSTATE_TEST_* env, stop
  tools/clickhouse_server.py start --cluster DIR   # ZooKeeper + replicas r1, r2, r3 (cluster "chstate")
  tools/clickhouse_server.py stop --cluster DIR    # stop all three

The server listens on 127.0.0.1 only, on free ports, with a data folder under DIR.
It has a user `chstate` with a random password (stored in DIR/instance.json, mode 0600)
so that the tools are exercised with real credentials, and users with the least rights
chstate needs (LEAST_USERS, the same password; docs/operations.md).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Callable

SERVER_BIN = os.environ.get("CHSTATE_CLICKHOUSE_SERVER", "/usr/sbin/clickhouse-server")
SYSTEM_CONFIG = Path("/etc/clickhouse-server/config.xml")

CONFIG_TEMPLATE = """<?xml version="1.0"?>
<yandex>
  <logger>
    <level>warning</level>
    <log>{dir}/log/server.log</log>
    <errorlog>{dir}/log/server.err.log</errorlog>
    <size>100M</size>
    <count>2</count>
  </logger>
  <listen_host>127.0.0.1</listen_host>
  <http_port>{http_port}</http_port>
  <tcp_port>{tcp_port}</tcp_port>
  <interserver_http_port>{interserver_port}</interserver_http_port>
  <interserver_http_host>127.0.0.1</interserver_http_host>
  {https}
  <max_connections>512</max_connections>
  <keep_alive_timeout>30</keep_alive_timeout>
  <max_concurrent_queries>200</max_concurrent_queries>
  <mark_cache_size>67108864</mark_cache_size>
  <uncompressed_cache_size>67108864</uncompressed_cache_size>
  <path>{dir}/data/</path>
  <tmp_path>{dir}/data/tmp/</tmp_path>
  <user_files_path>{dir}/data/user_files/</user_files_path>
  <format_schema_path>{dir}/data/format_schemas/</format_schema_path>
  <users_config>{dir}/users.xml</users_config>
  <default_profile>default</default_profile>
  <default_database>default</default_database>
  <timezone>UTC</timezone>
  <mlock_executable>false</mlock_executable>
  {extra}
</yandex>
"""

HTTPS_TEMPLATE = """<https_port>{https_port}</https_port>
  <openSSL><server>
    <certificateFile>{cert}</certificateFile>
    <privateKeyFile>{key}</privateKeyFile>
    <verificationMode>none</verificationMode>
    <loadDefaultCAFile>false</loadDefaultCAFile>
    <cacheSessions>true</cacheSessions>
    <disableProtocols>sslv2,sslv3</disableProtocols>
    <preferServerCiphers>true</preferServerCiphers>
  </server></openSSL>"""

USERS_TEMPLATE = """<?xml version="1.0"?>
<yandex>
  <profiles>
    <default>
      <max_memory_usage>2000000000</max_memory_usage>
      <load_balancing>random</load_balancing>
    </default>
{least_profiles}
  </profiles>
  <users>
    <default>
      <password></password>
      <networks><ip>127.0.0.1</ip><ip>::1</ip></networks>
      <profile>default</profile>
      <quota>default</quota>
    </default>
    <chstate>
      <password>{password}</password>
      <networks><ip>127.0.0.1</ip><ip>::1</ip></networks>
      <profile>default</profile>
      <quota>default</quota>
    </chstate>
{least_users}
  </users>
  <quotas><default><interval><duration>3600</duration><queries>0</queries><errors>0</errors>
    <result_rows>0</result_rows><read_rows>0</read_rows><execution_time>0</execution_time>
  </interval></default></quotas>
</yandex>
"""


# Least privilege (docs/operations.md): `chstate_least` has exactly the rights chstate
# needs on 18.16, which has no SQL GRANT: the databases it may use (the connection's and
# the state schemas; tests/docs/test_least_privilege.py creates `least` and runs the API
# scenarios of two hosts side by side in least_cli_0, ... and least_lua54_0, ..., and
# its own checks in least_0, ...), DDL allowed and not read-only. The other two have one
# right less each: no DDL, or read-only (settings still allowed).
LEAST_DATABASES = (["least"] + [f"least_{n}" for n in range(4)] +
                   [f"least_{host}_{n}" for host in ("cli", "lua54") for n in range(16)])
LEAST_PROFILE = {"readonly": "0", "allow_ddl": "1"}
LEAST_USERS = {
    "chstate_least": LEAST_PROFILE,
    "chstate_least_no_ddl": dict(LEAST_PROFILE, allow_ddl="0"),
    "chstate_least_readonly": dict(LEAST_PROFILE, readonly="2"),
}


def least_privilege_xml(password: str) -> dict[str, str]:
    """The profiles and users of LEAST_USERS, for USERS_TEMPLATE."""
    profiles, users = [], []
    databases = "".join(f"<database>{d}</database>" for d in LEAST_DATABASES)
    for name, profile in LEAST_USERS.items():
        settings = "".join(f"<{k}>{v}</{k}>" for k, v in profile.items())
        profiles.append(f"    <{name}>{settings}</{name}>")
        users.append(f"""    <{name}>
      <password>{password}</password>
      <networks><ip>127.0.0.1</ip><ip>::1</ip></networks>
      <profile>{name}</profile>
      <quota>default</quota>
      <allow_databases>{databases}</allow_databases>
    </{name}>""")
    return {"least_profiles": "\n".join(profiles), "least_users": "\n".join(users)}


# ---- instances recorded in DIR/instance.json: free ports, pid checks, waiting,
# stopping, the start/stop/ensure/run command line. tools/chdb_http.py uses them too.

_handed_out: set[int] = set()


def _ephemeral_low() -> int:
    """The lowest port the kernel hands to outgoing connections (32768 unless configured)."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port() -> int:
    """A loopback port nothing listens on, below the kernel's ephemeral range. A port from that
    range (what binding port 0 gives) can be taken by any outgoing connection between the pick
    and the server's bind, or while a replica is down and restarted on the same port: a cluster
    start on a busy machine then failed with "Address already in use". Below the range only a
    listener can hold it, and binding it here checks that. Never the same port twice in one process."""
    low, high = 10000, _ephemeral_low() - 1
    rng = random.SystemRandom()
    for _ in range(200 if high - low > 1000 else 0):
        port = rng.randint(low, high)
        if port in _handed_out:
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        _handed_out.add(port)
        return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:  # an unusual port range
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def ping(port: int, scheme: str = "http", timeout: float = 1.0) -> bool:
    try:
        with urllib.request.urlopen(f"{scheme}://127.0.0.1:{port}/ping", timeout=timeout) as r:
            return r.read().strip() == b"Ok."
    except (urllib.error.URLError, OSError, ConnectionError):
        return False


def cmdline(pid: int) -> list[bytes]:
    """The process's command line, split at NULs; [] if there is no such process."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return []


def _pid_is_ours(pid: int, config: Path) -> bool:
    return any(str(config).encode() in part for part in cmdline(pid))


def _server_is_ours(inst: dict) -> bool:
    """The recorded pid is still the process started with the recorded config."""
    return _pid_is_ours(inst["pid"], Path(inst["config"]))


def load_instance(d: Path) -> dict | None:
    f = d / "instance.json"
    if not f.exists():
        return None
    return json.loads(f.read_text())


def write_record(f: Path, record: dict) -> None:
    """Writes a record that holds a password (mode 0600)."""
    f.write_text(json.dumps(record))
    os.chmod(f, 0o600)


def spawn(argv: list[str], cwd: Path, log: Path) -> subprocess.Popen:
    """Starts a process in a session of its own, stdout and stderr appended to `log`."""
    with open(log, "ab") as out:
        return subprocess.Popen(argv, cwd=cwd, stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)


def wait_ready(proc: subprocess.Popen, ready: Callable[[], bool], wait_seconds: float) -> bool:
    """Waits until ready() while `proc` runs; kills `proc` if that does not come in time."""
    deadline = time.monotonic() + wait_seconds
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            break
        if ready():
            return True
        time.sleep(0.1)
    if proc.poll() is None:
        proc.kill()
        proc.wait()
    return False


def env_lines(inst: dict) -> dict[str, str]:
    return {
        "CHSTATE_TEST_URL": f"http://127.0.0.1:{inst['http_port']}",
        "CHSTATE_TEST_HOST": "127.0.0.1",
        "CHSTATE_TEST_PORT": str(inst["http_port"]),
        "CHSTATE_TEST_USER": inst["user"],
        "CHSTATE_TEST_PASSWORD": inst["password"],
        "CHSTATE_TEST_DIR": inst["dir"],
        **({"CHSTATE_TEST_HTTPS_PORT": str(inst["https_port"])} if inst.get("https_port") else {}),
    }


def start(d: Path, *, tls_cert: str | None = None, tls_key: str | None = None,
          wait_seconds: float = 60.0, fixed_ports: dict | None = None, extra: str = "",
          password: str | None = None) -> dict:
    if not Path(SERVER_BIN).exists():
        sys.exit(f"clickhouse_server: {SERVER_BIN} not found; run tools/setup "
                 "(installs Debian's clickhouse-server)")
    d = d.resolve()
    (d / "log").mkdir(parents=True, exist_ok=True)
    (d / "data").mkdir(parents=True, exist_ok=True)
    existing = load_instance(d)
    password = password or (existing["password"] if existing else secrets.token_hex(16))
    last_err = ""
    for _attempt in range(5):
        ports = dict(fixed_ports) if fixed_ports else {"http_port": free_port(), "tcp_port": free_port(),
                                                       "interserver_port": free_port()}
        https = ""
        if tls_cert and tls_key:
            ports["https_port"] = free_port()
            https = HTTPS_TEMPLATE.format(https_port=ports["https_port"], cert=tls_cert, key=tls_key)
        config = d / "config.xml"
        config.write_text(CONFIG_TEMPLATE.format(dir=d, https=https, extra=extra, **ports))
        users = d / "users.xml"
        users.write_text(USERS_TEMPLATE.format(password=password, **least_privilege_xml(password)))
        os.chmod(users, 0o600)
        proc = spawn([SERVER_BIN, f"--config-file={config}"], d, d / "log" / "stdout.log")
        inst = {"pid": proc.pid, "dir": str(d), "config": str(config), "user": "chstate",
                "password": password, **ports}
        write_record(d / "instance.json", inst)
        if wait_ready(proc, lambda: ping(ports["http_port"]), wait_seconds):
            return inst
        last_err = tail(d / "log" / "server.err.log") or tail(d / "log" / "stdout.log")
    sys.exit(f"clickhouse_server: the server did not answer /ping; last log lines:\n{last_err}")


def tail(p: Path, n: int = 15) -> str:
    try:
        return "\n".join(p.read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return ""


def stop(d: Path, *, remove: bool = False, is_ours: Callable[[dict], bool] = _server_is_ours) -> None:
    """Stops the process recorded in d, if is_ours(record) says it is still the one started there;
    with remove, deletes d afterwards. Nothing recorded in d: nothing at all."""
    inst = load_instance(d)
    if inst is None:
        return
    stop_pid(inst["pid"], lambda: is_ours(inst))
    if remove:
        shutil.rmtree(d, ignore_errors=True)


def _reap(pid: int) -> None:
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass


def stop_pid(pid: int, is_ours: Callable[[], bool], sig: int = signal.SIGTERM) -> None:
    """Sends `sig` to `pid` if is_ours(), waits up to 20 s for it to go, then SIGKILLs it.
    is_ours() is asked again before every signal: a recycled pid is never touched."""
    if not is_ours():
        return
    os.kill(pid, sig)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and is_ours():
        _reap(pid)
        time.sleep(0.05)
    if is_ours():
        os.kill(pid, signal.SIGKILL)
        _reap(pid)


def running(d: Path, is_ours: Callable[[dict], bool] = _server_is_ours) -> dict | None:
    """The record of d's instance if its process is ours and answers /ping, else None."""
    inst = load_instance(d)
    if inst and is_ours(inst) and ping(inst["http_port"]):
        return inst
    return None


def instance_parser(description: str, commands: tuple[str, ...] = ("start", "stop", "ensure"),
                    options: Callable[[str, argparse.ArgumentParser], None] = lambda name, p: None,
                    ) -> argparse.ArgumentParser:
    """The command line instance_commands serves: each of `commands` takes DIR (and
    `stop` --remove), `run` takes the command; options(name, p) adds a tool's own."""
    ap = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    for name in commands:
        p = sub.add_parser(name)
        p.add_argument("dir", type=Path)
        if name == "stop":
            p.add_argument("--remove", action="store_true", help="delete the folder afterwards")
        options(name, p)
    r = sub.add_parser("run")
    options("run", r)
    r.add_argument("command", nargs=argparse.REMAINDER)
    return ap


def instance_commands(args, *, start: Callable[[Path], dict], stop: Callable[..., None],
                      running: Callable[[Path], dict | None], env_lines: Callable[[dict], dict[str, str]],
                      prefix: str, usage_error: Callable[[str], None], stop_failed_start: bool = False) -> int:
    """The commands `start DIR`, `ensure DIR` (start unless running), `stop [--remove] DIR`
    and `run -- CMD` (CMD with a temporary instance's env lines, removed after it;
    stop_failed_start: also stopped and removed when starting it fails)."""
    if args.cmd in ("start", "ensure"):
        inst = running(args.dir) if args.cmd == "ensure" else None
        if inst is None:
            inst = start(args.dir)
        for k, v in env_lines(inst).items():
            print(f"{k}={v}")
        return 0
    if args.cmd == "stop":
        stop(args.dir, remove=args.remove)
        return 0
    cmd = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not cmd:
        usage_error("run needs a command after --")
    d = Path(tempfile.mkdtemp(prefix=prefix))
    try:
        inst = start(d)
    except BaseException:
        if stop_failed_start:
            stop(d, remove=True)
        raise
    try:
        return subprocess.call(cmd, env=dict(os.environ, **env_lines(inst)))
    finally:
        stop(d, remove=True)


# ---- cluster: ZooKeeper plus three replicas (docs/cluster.md) ----------

ZOOKEEPER_CLASSPATH = os.environ.get("CHSTATE_ZOOKEEPER_CLASSPATH",
                                     "/etc/zookeeper/conf:/usr/share/java/zookeeper.jar")
CLUSTER_NAME = "chstate"
REPLICAS = ("r1", "r2", "r3")

ZOO_CFG = """tickTime=2000
dataDir={dir}/data
clientPort={port}
clientPortAddress=127.0.0.1
admin.enableServer=false
4lw.commands.whitelist=ruok,srvr,stat,mntr
maxClientCnxns=0
"""

CLUSTER_XML = """<remote_servers replace="replace"><{cluster}><shard>
    <internal_replication>true</internal_replication>
    {replicas}
  </shard></{cluster}></remote_servers>
  <zookeeper replace="replace"><node><host>127.0.0.1</host><port>{zk_port}</port></node>
    <session_timeout_ms>{session_ms}</session_timeout_ms></zookeeper>
  <macros replace="replace"><shard>01</shard><replica>{replica}</replica></macros>
  <distributed_ddl><path>/clickhouse/task_queue/ddl</path></distributed_ddl>"""


def zk_ok(port: int, timeout: float = 1.0) -> bool:
    """ZooKeeper serves sessions. (`ruok` answers `imok` earlier, while a session
    handshake still fails; `srvr` says "not currently serving" until then.)"""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
            s.sendall(b"srvr")
            answer = b""
            while chunk := s.recv(4096):
                answer += chunk
            return b"Mode: " in answer
    except OSError:
        return False


def start_zookeeper(d: Path, port: int | None = None, wait_seconds: float = 60.0) -> dict:
    """Starts ZooKeeper in `d` (on `port`, or a free one); returns its record."""
    d = d.resolve()
    (d / "data").mkdir(parents=True, exist_ok=True)
    port = port or free_port()
    cfg = d / "zoo.cfg"
    cfg.write_text(ZOO_CFG.format(dir=d, port=port))
    proc = spawn(["java", "-Xmx256m", "-cp", ZOOKEEPER_CLASSPATH,
                  "org.apache.zookeeper.server.quorum.QuorumPeerMain", str(cfg)], d, d / "zk.log")
    rec = {"pid": proc.pid, "port": port, "config": str(cfg), "dir": str(d)}
    (d / "zookeeper.json").write_text(json.dumps(rec))
    if wait_ready(proc, lambda: zk_ok(port), wait_seconds):
        return rec
    sys.exit(f"clickhouse_server: ZooKeeper did not start serving; last log lines:\n{tail(d / 'zk.log')}")


def stop_zookeeper(d: Path, *, kill: bool = False) -> None:
    f = d / "zookeeper.json"
    if not f.exists():
        return
    rec = json.loads(f.read_text())
    stop_pid(rec["pid"], lambda: _server_is_ours(rec), signal.SIGKILL if kill else signal.SIGTERM)


def load_cluster(d: Path) -> dict | None:
    f = d / "cluster.json"
    return json.loads(f.read_text()) if f.exists() else None


def start_replica(d: Path, name: str, cluster: dict, session_ms: int = 30000) -> dict:
    """Starts (or restarts with the same ports and data) replica `name`."""
    replicas = "\n    ".join(f"<replica><host>127.0.0.1</host><port>{cluster['ports'][r]['tcp_port']}</port></replica>"
                               for r in REPLICAS)
    extra = CLUSTER_XML.format(cluster=cluster["name"], replicas=replicas, zk_port=cluster["zk_port"],
                               replica=name, session_ms=session_ms)
    return start(d / name, fixed_ports=cluster["ports"][name], extra=extra, password=cluster["password"])


def start_cluster(d: Path) -> dict:
    """ZooKeeper plus replicas r1, r2 and r3 of one shard, all on free loopback ports.
    Restarting a stopped cluster in the same folder keeps its ports and data."""
    d = d.resolve()
    d.mkdir(parents=True, exist_ok=True)
    cluster = load_cluster(d)
    if cluster is None:
        cluster = {"name": CLUSTER_NAME, "dir": str(d), "zk_port": free_port(), "password": secrets.token_hex(16),
                   "ports": {r: {"http_port": free_port(), "tcp_port": free_port(), "interserver_port": free_port()}
                             for r in REPLICAS}}
        write_record(d / "cluster.json", cluster)
    if not zk_ok(cluster["zk_port"]):
        start_zookeeper(d / "zookeeper", cluster["zk_port"])
    for r in REPLICAS:
        if not running(d / r):
            start_replica(d, r, cluster)
    for r in REPLICAS:
        _wait_for_ddl_queue(cluster, r)
    return cluster


def _wait_for_ddl_queue(cluster: dict, replica: str, wait_seconds: float = 60.0) -> None:
    """Waits until the replica has a ZooKeeper session and its distributed DDL
    queue exists. ZooKeeper answers `ruok` before it accepts sessions, and
    18.16 crashes (null ZooKeeper) on an ON CLUSTER query sent before that."""
    port = cluster["ports"][replica]["http_port"]
    sql = b"SELECT count() FROM system.zookeeper WHERE path = '/clickhouse/task_queue' AND name = 'ddl'"
    deadline = time.monotonic() + wait_seconds
    last = ""
    while time.monotonic() < deadline:
        request = urllib.request.Request(f"http://127.0.0.1:{port}/", data=sql, headers={
            "X-ClickHouse-User": "chstate", "X-ClickHouse-Key": cluster["password"]})
        try:
            with urllib.request.urlopen(request, timeout=5) as response:
                if response.read().strip() == b"1":
                    return
        except urllib.error.HTTPError as e:
            last = e.read().decode(errors="replace")[:300]
        except (urllib.error.URLError, OSError) as e:
            last = str(e)
        time.sleep(0.1)
    sys.exit(f"clickhouse_server: replica {replica} has no ZooKeeper session or DDL queue after "
             f"{wait_seconds:.0f} s: {last}")


def stop_cluster(d: Path, *, remove: bool = False) -> None:
    for r in REPLICAS:
        stop(d / r)
    stop_zookeeper(d / "zookeeper")
    if remove:
        shutil.rmtree(d, ignore_errors=True)


def cluster_env_lines(cluster: dict) -> dict[str, str]:
    ports = [cluster["ports"][r]["http_port"] for r in REPLICAS]
    return {
        "CHSTATE_TEST_HOST": "127.0.0.1",
        "CHSTATE_TEST_PORT": str(ports[0]),
        "CHSTATE_TEST_PORT2": str(ports[1]),
        "CHSTATE_TEST_PORT3": str(ports[2]),
        # Every replica, for a several-host URI: clickhouse://chstate@HOSTS/default?cluster=chstate
        "CHSTATE_TEST_HOSTS": ",".join(f"127.0.0.1:{p}" for p in ports),
        "CHSTATE_TEST_USER": "chstate",
        "CHSTATE_TEST_PASSWORD": cluster["password"],
        "CHSTATE_TEST_CLUSTER": cluster["name"],
        "CHSTATE_TEST_ZK_PORT": str(cluster["zk_port"]),
        "CHSTATE_TEST_DIR": cluster["dir"],
    }


def cluster_main(args) -> int:
    # `ensure` is `start`: start_cluster starts only what is not running.
    return instance_commands(args, start=start_cluster, stop=stop_cluster, running=lambda d: None,
                             env_lines=cluster_env_lines, prefix="chstate-cluster-", usage_error=sys.exit,
                             stop_failed_start=True)


def _options(name: str, p: argparse.ArgumentParser) -> None:
    if name == "run":
        p.add_argument("--cluster", action="store_true", help="run CMD with a three-replica cluster")
        return
    if name != "stop":
        p.add_argument("--tls-cert")
        p.add_argument("--tls-key")
    p.add_argument("--cluster", action="store_true",
                   help="ZooKeeper plus three replicas (cluster 'chstate') instead of one server")


def main() -> int:
    ap = instance_parser(__doc__, options=_options)
    args = ap.parse_args()

    if args.cluster:
        return cluster_main(args)

    # `run` has no --tls-* options: its server is a plain start(d).
    return instance_commands(
        args, start=lambda d: start(d, tls_cert=getattr(args, "tls_cert", None), tls_key=getattr(args, "tls_key", None)),
        stop=stop, running=running, env_lines=env_lines, prefix="chstate-ch-", usage_error=ap.error)


if __name__ == "__main__":
    sys.exit(main())
