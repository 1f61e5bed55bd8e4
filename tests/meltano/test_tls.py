"""HTTPS to ClickHouse: the certificate is always verified, against the
system trust store or the CA in state_backend.clickhouse.ca_file."""

from __future__ import annotations

import json
import shutil
import subprocess

import meltano_harness as harness
import pytest
from meltano_harness import stop_server

A = "dev:tap-a-to-target-b"
S1 = {"singer_state": {"bookmarks": {"s1": {"since": "2026-01-01"}}}}


@pytest.fixture(scope="module")
def tls_server(tmp_path_factory):
    if shutil.which("openssl") is None:
        pytest.skip("openssl is not installed")
    folder = tmp_path_factory.mktemp("tls")
    cert, key = folder / "cert.pem", folder / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj",
                    "/CN=chstate-test", "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost",
                    "-keyout", str(key), "-out", str(cert)], check=True, capture_output=True)
    server_dir = folder / "clickhouse"
    out = subprocess.run(["python3", str(harness.REPO / "tools" / "clickhouse_server.py"), "start", str(server_dir),
                          "--tls-cert", str(cert), "--tls-key", str(key)], capture_output=True, text=True)
    if out.returncode != 0:
        pytest.fail(f"could not start ClickHouse with TLS:\n{out.stdout}\n{out.stderr}")
    values = dict(line.split("=", 1) for line in out.stdout.splitlines() if "=" in line)
    yield values, cert
    stop_server(server_dir, remove=True)


def test_https_verifies_the_certificate(tmp_path, venv, library, tls_server):
    values, cert = tls_server
    user, password, port = values["CHSTATE_TEST_USER"], values["CHSTATE_TEST_PASSWORD"], values["CHSTATE_TEST_HTTPS_PORT"]
    p = harness.MeltanoProject(tmp_path / "project", venv, library,
                               state_backend_uri=f"clickhouse://{user}@127.0.0.1:{port}/default",
                               env={"MELTANO_STATE_BACKEND_CLICKHOUSE_PASSWORD": password,
                                    "MELTANO_STATE_BACKEND_CLICKHOUSE_SECURE": "true"})
    p.secrets = [password]
    # The test CA is not in the system store: refused, and the error says why.
    out = p.run("state", "get", A, expect=1)
    assert "certificate could not be verified" in out.stderr, out.stderr[-3000:]
    assert f"127.0.0.1:{port}" in out.stderr
    # With the CA as a setting (meltano.yml or its variable) it works.
    env = p.env(MELTANO_STATE_BACKEND_CLICKHOUSE_CA_FILE=str(cert))
    p.run("state", "set", "--force", A, json.dumps(S1), env=env)
    assert json.loads(p.run("state", "get", A, env=env).stdout) == S1
    # ... or in the URI.
    env = p.env(MELTANO_STATE_BACKEND_URI=f"clickhouse://{user}@127.0.0.1:{port}/default?secure=true&ca_file={cert}",
                MELTANO_STATE_BACKEND_CLICKHOUSE_SECURE=None)
    assert json.loads(p.run("state", "get", A, env=env).stdout) == S1
    # Plain HTTP to the HTTPS port is a transport error, not a hang.
    env = p.env(MELTANO_STATE_BACKEND_CLICKHOUSE_SECURE="false")
    out = p.run("state", "get", A, env=env, expect=1)
    assert "UNAVAILABLE" in out.stderr or "INTERNAL" in out.stderr


def test_a_different_host_name_is_refused(tmp_path, venv, library, tls_server):
    values, cert = tls_server
    # The certificate names 127.0.0.1 and localhost, not 127.0.0.2.
    user, password, port = values["CHSTATE_TEST_USER"], values["CHSTATE_TEST_PASSWORD"], values["CHSTATE_TEST_HTTPS_PORT"]
    p = harness.MeltanoProject(tmp_path / "project", venv, library,
                               state_backend_uri=f"clickhouse://{user}@127.0.0.2:{port}/default?secure=true",
                               env={"MELTANO_STATE_BACKEND_CLICKHOUSE_PASSWORD": password,
                                    "MELTANO_STATE_BACKEND_CLICKHOUSE_CA_FILE": str(cert)})
    out = p.run("state", "get", A, expect=1)
    # 127.0.0.2 may not accept connections at all (the server listens on 127.0.0.1).
    assert "certificate could not be verified" in out.stderr or "connection refused" in out.stderr, out.stderr[-3000:]


def test_clickhouses_scheme_is_not_a_meltano_backend(tmp_path, venv, library):
    # Meltano picks the backend by the URI scheme and passes only that
    # scheme's settings, so secure connections are clickhouse:// with
    # secure=true (as for the Python backend); clickhouses:// is refused clearly.
    p = harness.MeltanoProject(tmp_path / "project", venv, library,
                               state_backend_uri="clickhouses://u@127.0.0.1:1/default")
    out = p.run("state", "get", A, expect=1)
    assert "No state backend found for scheme 'clickhouses'" in out.stderr
