"""The pure wheel (hosts/python/build_pure_wheel.sh): py3-none-any, the core as
chstate.wasm on wasmtime from PyPI. Installed with pip into a fresh venv
beside the pinned Meltano, with no native library anywhere (not in the venv,
no CHSTATE_LIBRARY), it runs Meltano's state commands and `meltano run`
against ClickHouse, and says which core runs. $CHSTATE_CORE shows and forces
the choice (chstate_meltano/_core.py).

Only Linux x86_64 is tried here; that the wheel installs on macOS, Linux
aarch64 and Windows rests on it being py3-none-any and on wasmtime's own
wheels for those platforms."""

from __future__ import annotations

import json
import re
import subprocess
import tomllib
import zipfile
from pathlib import Path

import pytest

import meltano_harness as harness
from meltano_harness import rows

JOB = "dev:tap-counter-to-target-echo"
WASM_LINE = "chstate runs the wasm core ("


@pytest.fixture(scope="module")
def wasm() -> Path:
    return harness.wasm_module()


@pytest.fixture(scope="module")
def pure(wasm) -> Path:
    return harness.pure_venv(wasm)


def probe(venv: Path, code: str, cwd: Path, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(venv / "bin" / "python"), "-c", code], env=dict(harness.clean_env(), **env), cwd=cwd,
                          capture_output=True, text=True, timeout=120)


def test_the_pure_wheel_is_any_platform_with_the_module_and_the_same_entry_points(tmp_path, wasm):
    wheel = harness.pure_wheel(tmp_path, wasm)
    assert wheel.name == "chstate_meltano-0.1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        entry_points = z.read(next(n for n in names if n.endswith("entry_points.txt"))).decode()
        tags = z.read(next(n for n in names if n.endswith(".dist-info/WHEEL"))).decode()
        metadata = z.read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
        packaged = z.read("chstate_meltano/chstate.wasm")
    assert "Tag: py3-none-any" in tags.splitlines() and "Root-Is-Purelib: true" in tags.splitlines()
    assert packaged == wasm.read_bytes()
    assert not [n for n in names if n.endswith(".so")]
    assert "Requires-Dist: wasmtime>=50" in metadata.splitlines()
    # Every entry point of pyproject.toml (the native wheel's), and no other.
    project = tomllib.loads((harness.ADAPTER_SRC / "pyproject.toml").read_text())["project"]["entry-points"]
    want = {(group, f"{k} = {v}") for group, points in project.items() for k, v in points.items()}
    got, group = set(), None
    for line in entry_points.splitlines():
        if line.startswith("["):
            group = line.strip("[]")
        elif line.strip():
            got.add((group, line.strip()))
    assert got == want


def test_the_script_refuses_a_file_that_is_not_a_module(tmp_path):
    bogus = tmp_path / "chstate.wasm"
    bogus.write_bytes(b"\x7fELF not a module")
    out = subprocess.run([str(harness.ADAPTER_SRC / "build_pure_wheel.sh"), str(tmp_path / "dist")],
                         env=dict(harness.clean_env(), CHSTATE_WASM=str(bogus)), capture_output=True, text=True)
    assert out.returncode != 0 and "is not a WebAssembly module" in out.stderr, out.stderr
    assert not list((tmp_path / "dist").glob("*.whl"))


def test_the_core_is_chosen_and_said(tmp_path, pure, library):
    code = ("from chstate_meltano import _core\n"
            "try:\n    c = _core.chosen(); print(c.kind, c.describe())\n"
            "except Exception as e:\n    print('error', e)\n")
    auto = probe(pure, code, tmp_path).stdout
    assert auto.startswith("wasm the wasm core (") and "no native library for this platform" in auto, auto
    # The wasmtime pip chose for the wheel's `wasmtime>=50` (the newest on the index).
    assert re.search(r"site-packages/chstate_meltano/chstate\.wasm on wasmtime \d+\.\d+\.\d+;", auto), auto
    # A native library present wins in auto, and CHSTATE_CORE=wasm still forces the module.
    assert probe(pure, code, tmp_path, CHSTATE_LIBRARY=str(library)).stdout.startswith("native ")
    forced = probe(pure, code, tmp_path, CHSTATE_LIBRARY=str(library), CHSTATE_CORE="wasm").stdout
    assert forced.startswith("wasm ") and "CHSTATE_CORE=wasm" in forced, forced
    native = probe(pure, code, tmp_path, CHSTATE_CORE="native").stdout
    assert native.startswith("error ") and "native library was not found" in native, native
    bad = probe(pure, code, tmp_path, CHSTATE_CORE="fast").stdout
    assert "CHSTATE_CORE is 'fast': it is one of auto, native, wasm" in bad, bad
    # Both cores resolve settings alike (the same C++ core).
    same = ("import json\nfrom chstate_meltano import _core\n"
            "print(json.dumps(_core.chosen().resolve_settings({'from': 'meltano', 'values': "
            "{'uri': 'clickhouse://me@db.internal:8443/analytics?secure=true', 'lock_timeout_seconds': 7}, "
            "'env': {}})))\n")
    by_wasm = json.loads(probe(pure, same, tmp_path).stdout)
    by_native = json.loads(probe(pure, same, tmp_path, CHSTATE_LIBRARY=str(library)).stdout)
    assert by_wasm == by_native and by_wasm["connection"]["host"] == "db.internal"


def test_meltano_on_the_pure_wheel_keeps_state_in_clickhouse(tmp_path, pure, library, clickhouse, schema):
    env = {"MELTANO_STATE_BACKEND_CLICKHOUSE_SCHEMA": schema}
    if clickhouse.password:
        env["MELTANO_STATE_BACKEND_CLICKHOUSE_PASSWORD"] = clickhouse.password
    project = harness.MeltanoProject(tmp_path / "project", pure, library, state_backend_uri=clickhouse.uri(), env=env)
    del project.base_env["CHSTATE_LIBRARY"]  # no native library anywhere
    project.secrets = [clickhouse.password] if clickhouse.password else []

    state = {"singer_state": {"bookmarks": {"numbers": {"id": 2}}}}
    written = project.run("state", "set", "--force", JOB, json.dumps(state))
    assert WASM_LINE in written.stderr, written.stderr[-3000:]  # at Meltano's default level
    assert json.loads(project.run("state", "get", JOB).stdout) == state
    assert JOB in project.run("state", "list").stdout

    ran = project.run("run", "tap-counter", "target-echo")
    assert "tap-counter: starting after id 2" in ran.stderr
    assert ran.stderr.count("Incremental state has been updated") == 3
    done = {"singer_state": {"bookmarks": {"numbers": {"id": 5}}}}
    assert json.loads(project.run("state", "get", JOB).stdout) == done
    partial, completed = rows(clickhouse, schema)[JOB]
    assert partial is None and json.loads(completed) == done

    # The native core, given the library, reads what the module wrote (one store, two cores).
    native = project.run("state", "get", JOB, env=project.env(CHSTATE_LIBRARY=str(library)))
    assert json.loads(native.stdout) == done and WASM_LINE not in native.stderr
    # Forcing the native core where there is none fails before any I/O, naming the fix.
    refused = project.run("state", "get", JOB, expect=None, env=project.env(CHSTATE_CORE="native"))
    assert refused.returncode != 0
    assert "loading the chstate core failed: the chstate native library was not found" in refused.stderr, \
        refused.stderr[-3000:]
