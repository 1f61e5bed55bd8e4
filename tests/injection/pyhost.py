"""The Python adapter's core (hosts/python: the binding over libchstate.so
through ctypes, with its HTTP transport) for the hardening suites, without
Meltano.

    store = python_store(server, schema)            # a binding.Store, plain HTTP
    store.get("id")                                 # the verbs are its methods
    store.close()                                   # and its transport's
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
    """(_native, binding) of chstate_meltano, over the library built here."""
    library()
    if str(REPO / "hosts" / "python") not in sys.path:
        sys.path.insert(0, str(REPO / "hosts" / "python"))
    from chstate_meltano import _native, binding
    return _native, binding


def python_settings(server, schema: str, *, host: str | None = None, port: int | None = None,
                    secure: bool = False, ca_file: str | None = None, table: str = "state",
                    timeout: float = 5.0) -> dict:
    """The settings as a user gives them (by the core's names)."""
    settings = {"uri": f"clickhouse://{server.user}@{host or server.host}:{port or server.port}/default",
                "password": server.password, "schema": schema, "table": table, "secure": secure,
                "connect_timeout_seconds": timeout, "request_timeout_seconds": timeout}
    if ca_file:
        settings["ca_file"] = ca_file
    return settings


def python_store(server, schema: str, **kw):
    """A binding.Store over the native core, opened from settings (python_settings'
    keywords) with no environment read; it makes its own HTTP(S) transport from
    the core's resolution of them. Raises binding.ChstateError for settings the
    core refuses (nothing sent)."""
    _native, binding = modules()
    return binding.Store(_native.NativeCore(), python_settings(server, schema, **kw), env={})


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
