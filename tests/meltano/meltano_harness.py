"""A real Meltano, with chstate's adapter installed, for the tests in this
folder and tools/meltano_bench.py.

    server = start_server(folder)        # a throwaway ClickHouse 18.16
    venv = ensure_venv()                 # pinned Meltano + chDB, cached
    install_adapter(venv)                # hosts/python, as users pip-install it
    lib = native_library()               # bazel-bin/hosts/python/libchstate.so
    project = MeltanoProject(tmp, venv, lib, state_backend_uri="clickhouse://...")
    project.run("state", "list")
    rows(server, "meltano")              # the state table as stored

The venv lives under ~/.cache/chstate (or $CHSTATE_CACHE_DIR), in a folder
named by a hash of the pinned versions and the Python version, so reruns reuse
it and a change of pins makes a new one. A venv is used only once the file
`.complete` exists in it: an interrupted install is thrown away and redone.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Iterable, Mapping, Optional

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests"))

from chserver import Server, kill_server, start_server, stop_server  # noqa: E402,F401 (re-exported)

ADAPTER_SRC = REPO / "hosts" / "python"
PLUGINS = Path(__file__).resolve().parent / "plugins"

# What the tests install from PyPI, pinned.
MELTANO = "meltano==4.4.1"
CHDB = "chdb-core==26.9.0"
TARGET_JSONL = "target-jsonl==0.1.4"
PINS = (MELTANO, CHDB, "setuptools>=70.1", "wheel")


def rows(server: Server, schema: str, table: str = "state") -> dict:
    """state_id -> (partial_state, completed_state) as stored (None for NULL)."""
    text = server.sql(f"SELECT state_id, partial_state, completed_state FROM `{schema}`.`{table}` FINAL "
                      "ORDER BY state_id FORMAT JSONCompact")
    return {r[0]: (r[1], r[2]) for r in json.loads(text)["data"]}


def cache_dir() -> Path:
    base = os.environ.get("CHSTATE_CACHE_DIR")
    return Path(base) if base else Path.home() / ".cache" / "chstate"


def venv_dir() -> Path:
    key = hashlib.sha256(json.dumps([PINS, sys.version_info[:2]]).encode()).hexdigest()[:12]
    return cache_dir() / f"meltano-venv-{key}"


def _pip(venv: Path, *args: str) -> None:
    subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--disable-pip-version-check", *args],
                   check=True)


def ensure_venv() -> Path:
    """The cached venv with the pinned Meltano and chDB (made when missing)."""
    venv = venv_dir()
    venv.parent.mkdir(parents=True, exist_ok=True)
    with open(venv.parent / (venv.name + ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # two test runs must not build it at once
        if (venv / ".complete").exists():
            return venv
        shutil.rmtree(venv, ignore_errors=True)
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        _pip(venv, *PINS)
        (venv / ".complete").write_text("\n".join(PINS) + "\n")
    return venv


def install_adapter(venv: Path) -> None:
    """pip-installs hosts/python from a copy (the build leaves nothing in the
    source tree, and the copy holds no native library: the tests point
    CHSTATE_LIBRARY at the freshly built one)."""
    with tempfile.TemporaryDirectory(prefix="chstate-adapter-") as tmp:
        stage = Path(tmp) / "src"
        shutil.copytree(ADAPTER_SRC, stage,
                        ignore=shutil.ignore_patterns("__pycache__", "*.so", "build", "*.egg-info", "dist"))
        _pip(venv, "--no-deps", "--no-build-isolation", "--force-reinstall", str(stage))


def native_library() -> Path:
    """$CHSTATE_LIBRARY, else bazel-bin/hosts/python/libchstate.so (built)."""
    env = os.environ.get("CHSTATE_LIBRARY")
    if env:
        return Path(env).resolve()
    built = subprocess.run(["bazel", "build", "//hosts/python:libchstate.so"], cwd=REPO, capture_output=True,
                           text=True)
    assert built.returncode == 0, f"bazel build //hosts/python:libchstate.so failed:\n{built.stderr[-5000:]}"
    path = REPO / "bazel-bin" / "hosts" / "python" / "libchstate.so"
    assert path.exists(), f"{path} is missing after the build"
    return path.resolve()


def wasm_module() -> Path:
    """$CHSTATE_WASM, else hosts/wasi's chstate.wasm (built; bazel-bin left alone)."""
    env = os.environ.get("CHSTATE_WASM")
    if env:
        return Path(env).resolve()
    built = subprocess.run(["bazel", "build", "--config=wasi", "--symlink_prefix=/", "//hosts/wasi:chstate.wasm"],
                           cwd=REPO, capture_output=True, text=True)
    assert built.returncode == 0, f"bazel build --config=wasi //hosts/wasi:chstate.wasm failed:\n{built.stderr[-5000:]}"
    out = subprocess.run(["bazel", "info", "--config=wasi", "bazel-bin"], cwd=REPO, check=True, capture_output=True,
                         text=True).stdout.strip()
    return Path(out, "hosts", "wasi", "chstate.wasm").resolve()


def pure_wheel(out: Path, wasm: Path) -> Path:
    """The pure wheel (py3-none-any) as hosts/python/build_pure_wheel.sh makes
    it from a given chstate.wasm: no Bazel, nothing but python3 and pip."""
    env = dict(clean_env(), CHSTATE_WASM=str(wasm))
    built = subprocess.run([str(ADAPTER_SRC / "build_pure_wheel.sh"), str(out)], env=env, cwd=out,
                           capture_output=True, text=True, timeout=600)
    assert built.returncode == 0, f"build_pure_wheel.sh exited {built.returncode}\n{built.stderr[-5000:]}"
    wheel = Path(built.stdout.split()[-1])
    assert wheel.parent == out and wheel.exists(), built.stdout
    return wheel


def pure_venv(wasm: Path) -> Path:
    """A venv holding the pinned Meltano and the pure wheel made from `wasm`
    (its wasmtime from PyPI, as the wheel's dependency), installed with pip the
    way users add a plugin to Meltano's environment: no native library in it.
    Cached by the module's and the package's contents, so the suites that use
    it in one run make it once."""
    digest = hashlib.sha256()
    for path in [wasm, ADAPTER_SRC / "pyproject.toml", *sorted((ADAPTER_SRC / "chstate_meltano").glob("*.py"))]:
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    digest.update(json.dumps([MELTANO, sys.version_info[:2]]).encode())
    venv = cache_dir() / f"meltano-pure-{digest.hexdigest()[:12]}"
    venv.parent.mkdir(parents=True, exist_ok=True)
    with open(venv.parent / (venv.name + ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (venv / ".complete").exists():
            return venv
        shutil.rmtree(venv, ignore_errors=True)
        with tempfile.TemporaryDirectory(prefix="chstate-pure-wheel-") as tmp:
            wheel = pure_wheel(Path(tmp), wasm)
            subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
            _pip(venv, MELTANO, str(wheel))
        assert not list(venv.rglob("libchstate*")), "the pure venv holds a native library"
        (venv / ".complete").write_text(f"{MELTANO}\n{wheel.name}\n")
    return venv


def plugin_script(name: str, venv: Path, folder: Path) -> Path:
    """A copy of plugins/<name> in `folder` whose interpreter is the venv's."""
    src = (PLUGINS / name).read_text()
    body = src.split("\n", 1)[1] if src.startswith("#!") else src
    dst = folder / name
    dst.write_text(f"#!{venv / 'bin' / 'python'}\n{body}")
    dst.chmod(0o755)
    return dst


class MeltanoProject:
    """A Meltano project in `root` whose state backend is `state_backend_uri`.

    Plugins: tap-counter (plugins/tap_counter.py: incremental, emits a STATE
    after every record), target-echo (plugins/target_echo.py: writes records,
    echoes every STATE at once) and, with `with_target_jsonl`, target-jsonl
    from PyPI (emits its state at the end).
    """

    def __init__(self, root: Path, venv: Path, library: Path, *, state_backend_uri: str,
                 env: Optional[Mapping[str, str]] = None, with_target_jsonl: bool = False,
                 extra_yaml: str = ""):
        self.root = root
        self.venv = venv
        self.meltano = venv / "bin" / "meltano"
        root.mkdir(parents=True, exist_ok=True)
        bin_dir = root / "bin"
        bin_dir.mkdir(exist_ok=True)
        tap = plugin_script("tap_counter.py", venv, bin_dir)
        target = plugin_script("target_echo.py", venv, bin_dir)
        jsonl = ""
        if with_target_jsonl:
            jsonl = f"""
  - name: target-jsonl
    namespace: target_jsonl
    pip_url: {TARGET_JSONL}
    executable: target-jsonl
    settings:
    - name: destination_path
    config:
      destination_path: output/jsonl
"""
        (root / "meltano.yml").write_text(f"""default_environment: dev
project_id: chstate-test-{os.urandom(6).hex()}
send_anonymous_usage_stats: false
environments:
- name: dev
state_backend:
  uri: {state_backend_uri}
plugins:
  extractors:
  - name: tap-counter
    namespace: tap_counter
    executable: {tap}
    capabilities: [state, catalog, discover]
    settings:
    - name: total
      kind: integer
    - name: state_every
      kind: integer
    - name: sleep_ms
      kind: integer
    config:
      total: 5
      state_every: 1
  loaders:
  - name: target-echo
    namespace: target_echo
    executable: {target}
    settings:
    - name: output
    config:
      output: output/echo.jsonl
{jsonl}{extra_yaml}""")
        (root / "output" / "jsonl").mkdir(parents=True, exist_ok=True)
        self.base_env = clean_env()
        self.base_env["CHSTATE_LIBRARY"] = str(library)
        self.base_env.update(env or {})
        # Strings no output may ever contain (passwords).
        self.secrets: list = []

    def env(self, **overrides: Optional[str]) -> dict:
        env = dict(self.base_env)
        for k, v in overrides.items():
            if v is None:
                env.pop(k, None)
            else:
                env[k] = v
        return env

    def run(self, *args: str, expect: Optional[int] = 0, env: Optional[Mapping[str, str]] = None,
            input: Optional[str] = None, timeout: float = 300) -> subprocess.CompletedProcess:
        return self._check([str(self.meltano), *args], expect=expect, env=env, input=input, timeout=timeout)

    def python(self, code: str, *, expect: Optional[int] = 0, env: Optional[Mapping[str, str]] = None,
               timeout: float = 300) -> subprocess.CompletedProcess:
        """Runs Python code with the venv's interpreter in the project."""
        return self._check([str(self.venv / "bin" / "python"), "-c", code], expect=expect, env=env, input=None,
                           timeout=timeout)

    def _check(self, argv: list, *, expect: Optional[int], env: Optional[Mapping[str, str]], input: Optional[str],
               timeout: float) -> subprocess.CompletedProcess:
        proc = subprocess.run(argv, cwd=self.root, env=dict(env or self.base_env),
                              input=input if input is not None else "", capture_output=True, text=True,
                              timeout=timeout)
        args = argv[1:]
        for secret in self.secrets:
            assert secret not in proc.stdout, f"a secret is in the stdout of {args!r}"
            assert secret not in proc.stderr, f"a secret is in the stderr of {args!r}"
        if expect is not None:
            assert proc.returncode == expect, (
                f"{' '.join(map(str, args))[:300]} exited {proc.returncode}, expected {expect}\n"
                f"stdout: {proc.stdout[-3000:]}\nstderr: {proc.stderr[-5000:]}")
        return proc


def clean_env() -> dict:
    """The caller's environment without Meltano, ClickHouse or chstate
    settings (a developer's shell must not leak into the tests), plus quiet,
    offline Meltano defaults."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("MELTANO_", "CLICKHOUSE_", "CHSTATE_", "VIRTUAL_ENV", "PYTHON"))}
    env.update({
        "MELTANO_SEND_ANONYMOUS_USAGE_STATS": "false",
        "MELTANO_DISABLE_TRACKING": "true",
        "MELTANO_CLI_LOG_LEVEL": "info",
        "NO_COLOR": "1",
        "COLUMNS": "400",  # Rich wraps tracebacks at the terminal width; keep messages on one line
    })
    return env


def output_lines(path: Path) -> list:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def lines_of_all(paths: Iterable[Path]) -> list:
    out: list = []
    for p in sorted(paths):
        out.extend(output_lines(p))
    return out


if __name__ == "__main__":
    # `python3 tests/meltano/meltano_harness.py`: make (or find) the cached venv, e.g.
    # from tools/setup, so that the first test run does not pay for it.
    print(ensure_venv())
