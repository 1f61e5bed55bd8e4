"""A server that closes the connection while a host is still sending its
request must end in a clear error (the server's answer, or exit 5 "no answer from
ClickHouse"), never in a SIGPIPE that kills the process without a word.

The stand-in server here answers small requests and cuts a large one (a 4 MiB
state) off mid-body, as a server refusing an oversized request does. Checked for the CLI and for
the Lua 5.4 module with its native transport, whose host process (lua5.4)
does not ignore SIGPIPE either.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests" / "injection"))
from pyhost import chstate_binary  # noqa: E402


class ClosingListener:
    """A stand-in server: small requests get HTTP 200 (a version row for
    `SELECT version()`, else an empty body), on a keep-alive connection; a
    request whose body is over 1 MiB gets 414 after its headers, and the
    connection is closed while the client is still sending the body."""

    def __init__(self):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]
        self.cut = 0  # requests cut off mid-body
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self):
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._connection, args=(conn,), daemon=True).start()

    def _connection(self, conn):
        buf = b""
        with conn:
            while True:
                while b"\r\n\r\n" not in buf:
                    data = conn.recv(65536)
                    if not data:
                        return
                    buf += data
                head, _, buf = buf.partition(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n")[1:]:
                    name, _, value = line.partition(b":")
                    if name.strip().lower() == b"content-length":
                        length = int(value)
                if length > (1 << 20):
                    self.cut += 1
                    conn.sendall(b"HTTP/1.1 414 URI Too Long\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
                    return  # closed with most of the body unread
                while len(buf) < length:
                    data = conn.recv(65536)
                    if not data:
                        return
                    buf += data
                body, buf = buf[:length], buf[length:]
                answer = b"18.16.1\t1\n" if b"version()" in body else b""
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(answer), answer))

    def close(self):
        self.sock.close()


@pytest.fixture
def listener():
    lst = ClosingListener()
    yield lst
    lst.close()


BIG = json.dumps({"singer_state": {"blob": "x" * (4 << 20)}})


def test_cli_reports_a_connection_closed_mid_request(listener, tmp_path):
    state_file = tmp_path / "state.json"
    state_file.write_text(BIG)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CLICKHOUSE_", "MELTANO_", "CHSTATE_"))}
    env["MELTANO_STATE_BACKEND_CLICKHOUSE_PASSWORD"] = "pw"
    r = subprocess.run([str(chstate_binary()), "--uri", f"clickhouse://u@127.0.0.1:{listener.port}/default",
                        "--timeout", "5", "set", "big", "--input-file", str(state_file)],
                       capture_output=True, text=True, env=env, timeout=60)
    # Whichever the client sees first: the server's answer (exit 1, "HTTP
    # 414") or the broken write (exit 5, naming the endpoint). Never a signal.
    assert r.returncode in (1, 5), (r.returncode, r.stderr)
    assert r.stderr.startswith("chstate: ") and "ClickHouse" in r.stderr, r.stderr
    assert "414" in r.stderr or f"127.0.0.1:{listener.port}" in r.stderr, r.stderr
    assert listener.cut >= 1


def test_lua_module_reports_a_connection_closed_mid_request(listener, tmp_path):
    lua_dir = subprocess.run(["bazel", "info", "bazel-bin"], cwd=REPO, capture_output=True, text=True,
                             check=True).stdout.strip() + "/hosts/lua"
    subprocess.run(["bazel", "build", "//hosts/lua:chstate.so"], cwd=REPO, check=True, capture_output=True)
    script = tmp_path / "big.lua"
    script.write_text(f"""
local chstate = require "chstate"
local store = chstate.open{{uri = "clickhouse://u@127.0.0.1:{listener.port}/default", password = "pw", env = false}}
local ok, err = pcall(store.set, store, "big", {{singer_state = {{blob = string.rep("x", 4 << 20)}}}})
print(ok, err and err.code, err and err.message)
""")
    env = dict(os.environ, LUA_CPATH_5_4=f"{lua_dir}/?.so;;")
    r = subprocess.run(["lua5.4", str(script)], capture_output=True, text=True, env=env, timeout=60)
    assert r.returncode == 0, (r.returncode, r.stderr)
    assert r.stdout.startswith(("false\tUNAVAILABLE", "false\tINTERNAL")), r.stdout
    # set takes the id's lock first: the error must come from the large write
    # itself, not from a lock request the stand-in answered oddly.
    assert listener.cut >= 1, f"the large write never reached the listener: {r.stdout}"
