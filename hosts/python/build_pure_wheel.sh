#!/usr/bin/env bash
# Builds the pure wheel of chstate-meltano (py3-none-any): the same package as
# build_wheel.sh's manylinux wheel, with the core as its WebAssembly module
# (chstate.wasm) instead of the native library, and wasmtime (PyPI) as a
# dependency. It installs wherever wasmtime's wheels do (macOS x86_64 and
# arm64, Linux x86_64 and aarch64, Windows); the adapter runs the module when
# no native library is there (chstate_meltano/_core.py, $CHSTATE_CORE).
#
#   hosts/python/build_pure_wheel.sh [OUT_DIR]        # default: dist/ at the repo root
#   CHSTATE_WASM=path/to/chstate.wasm hosts/python/build_pure_wheel.sh   # no Bazel
#   pip install dist/chstate_meltano-*-py3-none-any.whl
#
# The module: $CHSTATE_WASM when set (a chstate.wasm from a release, or from
# another machine's build), else `bazel build --config=wasi
# //hosts/wasi:chstate.wasm` (Emscripten, optimised). With CHSTATE_WASM the
# script needs only python3 with pip (setuptools comes from the package index
# when pip builds in isolation): no Bazel, no compiler, so it runs on a Mac.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
out="$(mkdir -p "${1:-$repo/dist}" && cd "${1:-$repo/dist}" && pwd)"
py="${PYTHON:-python3}"

wasm="${CHSTATE_WASM:-}"
if [ -z "$wasm" ]; then
  # --symlink_prefix=/ leaves the bazel-bin symlink where the other builds put it.
  (cd "$repo" && bazel build --config=wasi --symlink_prefix=/ //hosts/wasi:chstate.wasm >&2)
  wasm="$(cd "$repo" && bazel info --config=wasi bazel-bin 2>/dev/null)/hosts/wasi/chstate.wasm"
fi
[ -f "$wasm" ] || { echo "build_pure_wheel: $wasm does not exist (set CHSTATE_WASM to a chstate.wasm)" >&2; exit 1; }
# A WebAssembly module starts with \0asm.
[ "$(head -c 4 "$wasm" | od -An -tx1 | tr -d ' \n')" = "0061736d" ] \
  || { echo "build_pure_wheel: $wasm is not a WebAssembly module" >&2; exit 1; }

stage="$(mktemp -d)"
trap 'rm -rf "$stage"' EXIT
mkdir "$stage/src" "$stage/wheelhouse"
cp -r "$here/pyproject.toml" "$here/README.md" "$here/build_backend" "$here/chstate_meltano" "$stage/src/"
find "$stage/src" -name __pycache__ -prune -exec rm -rf {} +
rm -f "$stage/src/chstate_meltano/libchstate.so"
install -m 0644 "$wasm" "$stage/src/chstate_meltano/chstate.wasm"
# The staged metadata: wasmtime a dependency (the `wasm` extra's pin), the
# module the package data. Each edit must apply, or the wheel would be wrong.
"$py" - "$stage/src/pyproject.toml" <<'PY'
import re, sys
path = sys.argv[1]
text = open(path).read()
pin = re.search(r'^wasm = \[("wasmtime[^"]*")\]$', text, re.M)
assert pin, "pyproject.toml has no `wasm` extra naming wasmtime"
edits = [("dependencies = []", f"dependencies = [{pin.group(1)}]"),
         ('chstate_meltano = ["libchstate.so"]', 'chstate_meltano = ["chstate.wasm"]')]
for old, new in edits:
    assert text.count(old) == 1, f"pyproject.toml: {old!r} is not there once"
    text = text.replace(old, new)
open(path, "w").write(text)
PY
"$py" -m pip wheel -q --no-deps --no-build-isolation -w "$stage/wheelhouse" "$stage/src" >&2 2>/dev/null \
  || "$py" -m pip wheel -q --no-deps -w "$stage/wheelhouse" "$stage/src" >&2
wheel="$(ls "$stage/wheelhouse"/chstate_meltano-*-py3-none-any.whl)"
mv -f "$wheel" "$out/"
echo "$out/$(basename "$wheel")"
