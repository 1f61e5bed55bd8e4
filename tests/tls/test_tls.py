"""HTTPS against a real ClickHouse 18.16 `https_port`, with a CA and a server
certificate made by openssl for this test run.

The server certificate names IP 127.0.0.1 and DNS chstate-tls.invalid (not
"localhost"), so connecting to "localhost" - the same server - is a host
name mismatch. For the CLI, the Python adapter and the Wasm module's Node host:
- secure=true with the right CA (URI ca_file, --ca-file flag, setting) works;
- a wrong CA, the system store (which does not know the test CA), or a wrong
  host name fail closed: exit 5 / UNAVAILABLE, a message naming the
  certificate problem and the endpoint, and no state read or written;
- nothing falls back to plain HTTP: secure=true aimed at a plain listener
  sends a TLS handshake and never an HTTP request, nor the password, in
  clear (a raw listener records every byte it receives).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from chserver import Server, stop_server  # noqa: E402
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "injection"))
from pyhost import chstate_binary, modules, python_store  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
S = {"singer_state": {"tls": 1}}


def openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True)


def make_ca(folder: Path, name: str) -> tuple[Path, Path]:
    key, cert = folder / f"{name}.key", folder / f"{name}.pem"
    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", f"/CN=chstate test {name}",
            "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign",
            "-keyout", str(key), "-out", str(cert))
    return key, cert


@pytest.fixture(scope="module")
def tls(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tls")
    ca_key, ca = make_ca(folder, "ca")
    _, wrong_ca = make_ca(folder, "wrong-ca")
    key, csr, cert, ext = folder / "server.key", folder / "server.csr", folder / "server.pem", folder / "ext.cnf"
    ext.write_text("subjectAltName=IP:127.0.0.1,DNS:chstate-tls.invalid\nextendedKeyUsage=serverAuth\n")
    openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=chstate-tls.invalid", "-keyout", str(key),
            "-out", str(csr))
    openssl("x509", "-req", "-in", str(csr), "-CA", str(ca), "-CAkey", str(ca_key), "-CAcreateserial", "-days", "2",
            "-extfile", str(ext), "-out", str(cert))
    server_dir = folder / "clickhouse"
    out = subprocess.run([sys.executable, str(REPO / "tools" / "clickhouse_server.py"), "start", str(server_dir),
                          "--tls-cert", str(cert), "--tls-key", str(key)], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
    values = dict(line.split("=", 1) for line in out.stdout.splitlines() if "=" in line)
    server = Server(values["CHSTATE_TEST_HOST"], int(values["CHSTATE_TEST_PORT"]), values["CHSTATE_TEST_USER"],
                    values["CHSTATE_TEST_PASSWORD"])
    yield {"server": server, "https_port": int(values["CHSTATE_TEST_HTTPS_PORT"]), "ca": ca, "wrong_ca": wrong_ca}
    stop_server(server_dir, remove=True)


@pytest.fixture(scope="module")
def chstate_bin():
    return chstate_binary()


def cli(binary, server, *args, uri=None, env_extra=None):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CLICKHOUSE_", "MELTANO_", "CHSTATE_"))}
    env["MELTANO_STATE_BACKEND_CLICKHOUSE_PASSWORD"] = server.password
    env["MELTANO_STATE_BACKEND_CLICKHOUSE_SCHEMA"] = "tls"
    env.update(env_extra or {})
    argv = [str(binary), "--timeout", "5", "--connect-timeout", "2"] + (["--uri", uri] if uri else []) + list(args)
    r = subprocess.run(argv, capture_output=True, env=env, timeout=60)
    assert server.password.encode() not in r.stdout + r.stderr
    return r


def test_cli_secure_with_the_right_ca(tls, chstate_bin):
    s, port, ca = tls["server"], tls["https_port"], tls["ca"]
    uri = f"clickhouse://{s.user}@127.0.0.1:{port}/default?secure=true&ca_file={ca}"
    r = cli(chstate_bin, s, "set", "tls:cli", json.dumps(S), uri=uri)
    assert r.returncode == 0, r.stderr
    r = cli(chstate_bin, s, "get", "tls:cli", uri=uri)
    assert r.returncode == 0 and json.loads(r.stdout) == S, r.stderr
    # The same with flags instead of URI parameters, and clickhouses://.
    r = cli(chstate_bin, s, "--secure", "--ca-file", str(ca), "get", "tls:cli",
            uri=f"clickhouse://{s.user}@127.0.0.1:{port}/default")
    assert r.returncode == 0 and json.loads(r.stdout) == S, r.stderr
    r = cli(chstate_bin, s, "get", "tls:cli", uri=f"clickhouses://{s.user}@127.0.0.1:{port}/default?ca_file={ca}")
    assert r.returncode == 0, r.stderr
    # ping says which URI it used (no password) and works over TLS.
    r = cli(chstate_bin, s, "ping", uri=uri)
    assert r.returncode == 0 and b"secure=true" in r.stdout, r.stdout + r.stderr
    # What was written over TLS is what the server holds.
    assert json.loads(s.sql("SELECT completed_state FROM tls.state FINAL WHERE state_id = 'tls:cli'")) == S


@pytest.mark.parametrize("case", ["wrong CA", "system store", "wrong host name"])
def test_cli_fails_closed(tls, chstate_bin, case):
    s, port = tls["server"], tls["https_port"]
    host = "localhost" if case == "wrong host name" else "127.0.0.1"
    ca = {"wrong CA": tls["wrong_ca"], "system store": None, "wrong host name": tls["ca"]}[case]
    uri = f"clickhouse://{s.user}@{host}:{port}/default?secure=true" + (f"&ca_file={ca}" if ca else "")
    for args in (["get", "tls:cli"], ["set", "tls:never", json.dumps(S)], ["ping"], ["lock", "tls:x", "--", "true"]):
        r = cli(chstate_bin, s, *args, uri=uri)
        err = r.stderr.decode()
        assert r.returncode == 5, (case, args, r.returncode, err)
        assert "certificate could not be verified" in err, (case, err)
        assert f"{host}:{port}" in err, err
    assert s.sql("SELECT count() FROM system.tables WHERE database = 'tls' AND name LIKE 'state_lock_%'").strip() \
        in ("0", "")
    assert s.sql("SELECT count() FROM system.databases WHERE name = 'tls'").strip() == "0" or \
        s.sql("SELECT count() FROM tls.state FINAL WHERE state_id = 'tls:never'").strip() == "0"


class RawListener:
    """Accepts connections and records every byte received; answers nothing.
    drain() waits until everything sent to it so far has been read."""

    def __init__(self):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.port = self.sock.getsockname()[1]
        self.received = b""
        self.connections = 0
        self.ended = 0  # connections read to their end
        self.peers = set()
        self._lock = threading.Lock()
        threading.Thread(target=self._loop, daemon=True).start()

    def _loop(self):
        while True:
            try:
                conn, peer = self.sock.accept()
            except OSError:
                return
            with self._lock:
                self.connections += 1
                self.peers.add(peer)
            threading.Thread(target=self._read, args=(conn,), daemon=True).start()

    def _read(self, conn):
        conn.settimeout(1)  # then hang up: the client fails fast
        try:
            while chunk := conn.recv(65536):
                with self._lock:
                    self.received += chunk
        except OSError:
            pass
        finally:
            conn.close()
            with self._lock:
                self.ended += 1

    def drain(self, timeout: float = 10.0) -> int:
        """Waits until every connection made before the call was accepted and
        read to its end (the client hung up, or the read timed out); returns
        how many there were. A last connection of our own marks the point:
        the listener accepts connections in the order they came."""
        with socket.create_connection(("127.0.0.1", self.port)) as marker:
            me = marker.getsockname()
        deadline = time.monotonic() + timeout
        while True:
            with self._lock:
                if me in self.peers and self.ended == self.connections:
                    return self.connections - 1
            assert time.monotonic() < deadline, "the raw listener did not read every connection to its end"
            time.sleep(0.01)

    def close(self):
        self.sock.close()


def test_never_falls_back_to_plain_http(tls, chstate_bin):
    s = tls["server"]
    raw = RawListener()
    try:
        uri = f"clickhouse://{s.user}@127.0.0.1:{raw.port}/default?secure=true&ca_file={tls['ca']}"
        r = cli(chstate_bin, s, "get", "tls:cli", uri=uri)
        assert r.returncode == 5, r.stderr
        store = python_store(s, "tls", port=raw.port, secure=True, ca_file=str(tls["ca"]), timeout=2)
        _, binding = modules()
        with pytest.raises(binding.ChstateError):
            store.get("tls:cli")
        store.close()
        # Event: every byte both clients sent has been read (not a guessed pause).
        assert raw.drain() >= 2
        # A TLS ClientHello (record type 22, version 3.x), never HTTP or the password.
        assert raw.received[:2] == b"\x16\x03", raw.received[:40]
        for plain in (b"POST", b"HTTP/1.1", b"X-ClickHouse", s.password.encode(), b"SELECT"):
            assert plain not in raw.received, plain
        # And secure=true aimed at ClickHouse's plain HTTP port fails, not downgrades.
        r = cli(chstate_bin, s, "get", "tls:cli",
                uri=f"clickhouse://{s.user}@127.0.0.1:{s.port}/default?secure=true&ca_file={tls['ca']}")
        assert r.returncode == 5 and b"TLS" in r.stderr, r.stderr
    finally:
        raw.close()


def test_python_adapter_tls(tls):
    s, port = tls["server"], tls["https_port"]
    _, binding = modules()
    store = python_store(s, "tls", port=port, secure=True, ca_file=str(tls["ca"]))
    assert repr(store._transport).startswith("HttpTransport(https://"), repr(store._transport)
    store.set("tls:py", S)  # the completed side
    got = store.get("tls:py")
    assert (got["completed"], got["partial"]) == (S, {})
    store.close()
    for case, host, ca in (("wrong CA", "127.0.0.1", tls["wrong_ca"]), ("system store", "127.0.0.1", None),
                           ("wrong host name", "localhost", tls["ca"])):
        store = python_store(s, "tls", host=host, port=port, secure=True, ca_file=str(ca) if ca else None)
        with pytest.raises(binding.ChstateError) as e:
            store.get("tls:py")
        assert e.value.code == "UNAVAILABLE", (case, e.value.code, str(e.value))
        assert "certificate" in str(e.value).lower(), (case, str(e.value))
        assert s.password not in str(e.value)
        store.close()


def test_node_wasm_host_tls(tls):
    """The Wasm module's Node transport honours ca_file and verifies the
    certificate and host name (it used global fetch before, which ignored
    ca_file)."""
    import importlib.util
    # tests/wasi's build_wasm ($CHSTATE_WASM, else the Bazel build); every
    # conftest is module "conftest" to pytest, so load it by path.
    spec = importlib.util.spec_from_file_location("wasi_conftest", REPO / "tests" / "wasi" / "conftest.py")
    wasi_conftest = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(wasi_conftest)
    build_wasm = wasi_conftest.build_wasm

    s, port = tls["server"], tls["https_port"]
    wasm = build_wasm()
    env = dict(os.environ, CHSTATE_TLS_PASSWORD=s.password)

    def run(host, ca):
        r = subprocess.run(["node", "--no-warnings", str(REPO / "tests" / "tls" / "node_tls.mjs"), str(wasm), host,
                            str(port), s.user, str(ca) if ca else "", "tls"],
                           capture_output=True, text=True, env=env, timeout=60)
        assert r.returncode == 0, r.stderr
        assert s.password not in r.stdout + r.stderr
        return json.loads(r.stdout.strip().splitlines()[-1])

    s.sql("DROP TABLE IF EXISTS tls.state")  # nothing left from an earlier run
    got = run("127.0.0.1", tls["ca"])
    assert got["ok"] is True, got
    assert got["state"]["completed"] == {"singer_state": {"tls": "node"}}
    assert json.loads(s.sql("SELECT completed_state FROM tls.state FINAL WHERE state_id = 'tls:node'")) == \
        {"singer_state": {"tls": "node"}}
    s.sql("TRUNCATE TABLE tls.state")
    for case, host, ca in (("wrong CA", "127.0.0.1", tls["wrong_ca"]), ("system store", "127.0.0.1", None),
                           ("wrong host name", "localhost", tls["ca"])):
        got = run(host, ca)
        assert got["ok"] is False and got["code"] == "UNAVAILABLE", (case, got)
        assert "cert" in got["message"].lower() or "altnames" in got["message"].lower(), (case, got)
    # Fail closed: none of the refused runs wrote anything.
    assert s.sql("SELECT count() FROM tls.state").strip() == "0"
