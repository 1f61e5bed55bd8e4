"""The Python adapter's core (hosts/python: ctypes over libchstate.so and its
HTTP transport) for the hardening suites, without Meltano.

    store, transport = python_store(server, schema)            # plain HTTP
    store.run({"op": "get", "state_id_hex": b"id".hex()})
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def library() -> Path:
    # Not bazel-bin: that symlink follows whichever configuration was built last.
    if os.environ.get("CHSTATE_LIBRARY"):
        return Path(os.environ["CHSTATE_LIBRARY"])
    subprocess.run(["bazel", "build", "//hosts/python:libchstate.so"], cwd=REPO, check=True, capture_output=True)
    path = REPO / "bazel-out" / "k8-fastbuild" / "bin" / "hosts" / "python" / "libchstate.so"
    assert path.exists(), path
    os.environ["CHSTATE_LIBRARY"] = str(path)
    return path


def modules():
    library()
    if str(REPO / "hosts" / "python") not in sys.path:
        sys.path.insert(0, str(REPO / "hosts" / "python"))
    from chstate_meltano import _http, _native
    return _native, _http


def python_store(server, schema: str, *, host: str | None = None, port: int | None = None,
                 secure: bool = False, ca_file: str | None = None, table: str = "state", timeout: float = 5.0):
    _native, _http = modules()
    flags = {"uri": f"clickhouse://{server.user}@{host or server.host}:{port or server.port}/default",
             "password": server.password, "schema": schema, "table": table, "secure": "true" if secure else "false"}
    if ca_file:
        flags["ca_file"] = ca_file
    config = _native.resolve_config(flags, env={})
    transport = _http.HttpTransport(dict(config, connect_timeout_ms=int(timeout * 1000)))
    store = _native.Store({"schema": config["schema"], "table": config["table"], "endpoint": transport.endpoint,
                           "request_timeout_ms": int(timeout * 1000)}, transport)
    return store, transport


def chstate_binary() -> Path:
    """The `chstate` CLI: $CHSTATE_BIN, else the default (fastbuild) output."""
    if os.environ.get("CHSTATE_BIN"):
        return Path(os.environ["CHSTATE_BIN"]).resolve()
    subprocess.run(["bazel", "build", "//hosts/native:chstate"], cwd=REPO, check=True, capture_output=True)
    path = REPO / "bazel-out" / "k8-fastbuild" / "bin" / "hosts" / "native" / "chstate"
    assert path.exists(), path
    return path


def wasm_module() -> Path:
    """hosts/wasi's chstate.wasm: $CHSTATE_WASM, else built the way tests/wasi
    builds it (--symlink_prefix=/ leaves the bazel-bin link alone)."""
    if os.environ.get("CHSTATE_WASM"):
        return Path(os.environ["CHSTATE_WASM"]).resolve()
    subprocess.run(["bazel", "build", "--config=wasi", "--symlink_prefix=/", "//hosts/wasi:chstate.wasm"], cwd=REPO,
                   check=True, capture_output=True)
    out = subprocess.run(["bazel", "info", "--config=wasi", "bazel-bin"], cwd=REPO, check=True, capture_output=True,
                         text=True)
    path = Path(out.stdout.strip()) / "hosts" / "wasi" / "chstate.wasm"
    assert path.exists(), path
    return path
