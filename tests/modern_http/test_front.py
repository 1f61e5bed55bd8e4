"""The front itself (tools/chdb_http.py): what the hosts rely on it to do as a
modern ClickHouse HTTP interface does. Raw http.client, no chstate code."""

from __future__ import annotations

import base64
import http.client
import subprocess
import sys
import urllib.parse

from support import REPO, version_is_modern




def request(front, sql, *, params=None, user=None, password=None, method="POST", headers=None, conn=None):
    own = conn is None
    conn = conn or http.client.HTTPConnection(front.host, front.port, timeout=30)
    h = {"X-ClickHouse-User": front.user if user is None else user,
         "X-ClickHouse-Key": front.password if password is None else password}
    h.update(headers or {})
    path = "/" + ("?" + urllib.parse.urlencode(params) if params else "")
    conn.request(method, path, body=sql.encode() if method == "POST" else None, headers=h)
    r = conn.getresponse()
    body = r.read()
    if own:
        conn.close()
    return r, body


def test_engine_is_a_modern_clickhouse(fresh):
    r, body = request(fresh, "SELECT version()")
    assert r.status == 200
    assert body.decode().strip() == fresh.version
    assert version_is_modern(fresh.version), fresh.version
    assert r.getheader("X-ClickHouse-Server-Display-Name")
    conn = http.client.HTTPConnection(fresh.host, fresh.port, timeout=10)
    conn.request("GET", "/ping")
    ping = conn.getresponse()
    assert (ping.status, ping.read()) == (200, b"Ok.\n")


def test_wrong_or_missing_credentials_are_refused_like_clickhouse(fresh):
    for user, password in ((None, "wrong-" + fresh.password[:4]), ("nobody", None), ("default", "")):
        r, body = request(fresh, "SELECT 1", user=user, password=password)
        assert r.status == 403
        assert r.getheader("X-ClickHouse-Exception-Code") == "516"
        assert body.startswith(b"Code: 516. DB::Exception: ")
        assert b"(AUTHENTICATION_FAILED)" in body
        assert fresh.password.encode() not in body
    # Basic auth works too; a right password works.
    basic = base64.b64encode(f"{fresh.user}:{fresh.password}".encode()).decode()
    conn = http.client.HTTPConnection(fresh.host, fresh.port, timeout=10)
    conn.request("POST", "/", body=b"SELECT 42", headers={"Authorization": f"Basic {basic}"})
    r = conn.getresponse()
    assert (r.status, r.read()) == (200, b"42\n")


def test_exceptions_carry_code_header_status_and_clickhouse_body(fresh):
    r, body = request(fresh, "SELECT * FROM no_such_db.no_such_table")
    assert (r.status, r.getheader("X-ClickHouse-Exception-Code")) == (404, "81")
    assert body.startswith(b"Code: 81. DB::Exception: ") and b"(version " + fresh.version.encode() in body
    r, body = request(fresh, "SELECT * FROM system.no_such_table")
    assert (r.status, r.getheader("X-ClickHouse-Exception-Code")) == (404, "60")
    r, body = request(fresh, "SELEKT 1")
    assert (r.status, r.getheader("X-ClickHouse-Exception-Code")) == (400, "62")
    r, body = request(fresh, "SELECT throwIf(1, 'boom')")
    assert r.status == 500 and body.startswith(b"Code: 395. DB::Exception: ") and b"boom" in body
    assert r.getheader("X-ClickHouse-Exception-Code") == "395"


def test_url_parameters_settings_params_database_query_id(fresh):
    r, body = request(fresh, "SELECT value FROM system.settings WHERE name = 'max_threads'",
                      params={"max_threads": "3", "query_id": "qid-1", "wait_end_of_query": "1",
                              "default_format": "TabSeparated"})
    assert (r.status, body, r.getheader("X-ClickHouse-Query-Id")) == (200, b"3\n", "qid-1")
    # Settings are per query: the next one sees the default again.
    _, body = request(fresh, "SELECT changed FROM system.settings WHERE name = 'max_threads'")
    assert body == b"0\n"
    # Query parameters arrive in ClickHouse's escaped text form.
    _, body = request(fresh, "SELECT {s:String} AS s, length(s)", params={"param_s": "a\\tb\\'c\\\\"})
    assert body == b"a\\tb\\'c\\\\\t6\n"  # a, TAB, b, quote, c, backslash: TSV-escaped
    # database= is the current database of that one query.
    request(fresh, "CREATE DATABASE IF NOT EXISTS mh_front_db")
    _, body = request(fresh, "SELECT currentDatabase()", params={"database": "mh_front_db"})
    assert body == b"mh_front_db\n"
    _, body = request(fresh, "SELECT currentDatabase()")
    assert body == b"default\n"
    r, _ = request(fresh, "SELECT 1", params={"database": "mh_absent_db"})
    assert (r.status, r.getheader("X-ClickHouse-Exception-Code")) == (404, "81")
    r, body = request(fresh, "SELECT 1", params={"no_such_setting_x": "1"})
    assert (r.status, r.getheader("X-ClickHouse-Exception-Code")) == (404, "115")
    request(fresh, "DROP DATABASE mh_front_db")
    # GET with query= in the URL.
    r, body = request(fresh, "", method="GET", params={"query": "SELECT 7"})
    assert (r.status, body) == (200, b"7\n")
    rec = fresh.take()
    assert rec[0].settings == {"max_threads": "3"} and rec[0].query_id == "qid-1"


def test_keep_alive_and_content_length(fresh):
    conn = http.client.HTTPConnection(fresh.host, fresh.port, timeout=10)
    conn.connect()
    sock = conn.sock
    for i in range(5):
        r, body = request(fresh, f"SELECT {i}" if i != 2 else "SELECT * FROM nowhere_at_all", conn=conn)
        assert r.version == 11 and r.getheader("Content-Length") == str(len(body))
        assert not r.will_close
    assert conn.sock is sock, "the connection was not kept alive"
    conn.close()


def test_detached_start_and_stop(tmp_path):
    tool = [sys.executable, str(REPO / "tools" / "chdb_http.py")]
    started = subprocess.run([*tool, "start", str(tmp_path / "front")], capture_output=True, text=True, timeout=180)
    try:
        assert started.returncode == 0, started.stderr[-2000:]
        values = dict(line.split("=", 1) for line in started.stdout.splitlines() if "=" in line)
        assert {"CHSTATE_TEST_HOST", "CHSTATE_TEST_PORT", "CHSTATE_TEST_USER", "CHSTATE_TEST_PASSWORD"} <= set(values)
        assert values["CHSTATE_TEST_HOST"] == "127.0.0.1"
        port = int(values["CHSTATE_TEST_PORT"])
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        conn.request("POST", "/", body=b"SELECT version()", headers={
            "X-ClickHouse-User": values["CHSTATE_TEST_USER"], "X-ClickHouse-Key": values["CHSTATE_TEST_PASSWORD"]})
        r = conn.getresponse()
        assert r.status == 200 and version_is_modern(r.read().decode())
        conn.close()
        assert (tmp_path / "front" / "data").is_dir()
    finally:
        subprocess.run([*tool, "stop", str(tmp_path / "front")], timeout=60)
    try:
        http.client.HTTPConnection("127.0.0.1", port, timeout=5).request("GET", "/ping")
        refused = False
    except ConnectionRefusedError:
        refused = True
    assert refused, "the detached front still answers after stop"
