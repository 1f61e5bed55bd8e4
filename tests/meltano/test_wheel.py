"""hosts/python/build_wheel.sh: a wheel that ships the native library and
works without CHSTATE_LIBRARY or Bazel. (The test packages the library the
other tests use instead of an optimised build, to keep CI short.)"""

from __future__ import annotations

import json
import subprocess
import sys
import zipfile

import meltano_harness as harness


def test_wheel_ships_the_library_and_prefers_it(tmp_path, venv, library):
    out = tmp_path / "dist"
    env = dict(harness.clean_env(), CHSTATE_LIBRARY=str(library), PYTHON=str(venv / "bin" / "python"))
    built = subprocess.run([str(harness.ADAPTER_SRC / "build_wheel.sh"), str(out)], env=env, capture_output=True,
                           text=True, timeout=600)
    assert built.returncode == 0, built.stderr
    wheel = out / built.stdout.split()[-1].rsplit("/", 1)[-1]
    assert wheel.name.endswith("-py3-none-linux_x86_64.whl") or "-py3-none-linux_" in wheel.name
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        entry_points = z.read(next(n for n in names if n.endswith("entry_points.txt"))).decode()
    assert "chstate_meltano/libchstate.so" in names
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
cfg = _native.resolve_config({"uri": "clickhouse://me@db.internal/analytics", "port": 9000})
print(json.dumps([str(_native.library_path()), cfg["host"], cfg["port"]]))
"""
    env = dict(harness.clean_env(), CHSTATE_LIBRARY="/nonexistent/libchstate.so")  # the packaged copy wins
    result = subprocess.run([str(bare / "bin" / "python"), "-c", probe], env=env, capture_output=True, text=True,
                            cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    path, host, port = json.loads(result.stdout)
    assert path.startswith(str(bare)) and path.endswith("chstate_meltano/libchstate.so")
    assert (host, port) == ("db.internal", 9000)
