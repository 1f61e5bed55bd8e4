#!/usr/bin/env bash
# Builds a wheel of chstate-meltano that ships the native library, so users
# need neither Bazel nor CHSTATE_LIBRARY:
#
#   hosts/python/build_wheel.sh [OUT_DIR]      # default: dist/ at the repo root
#   pip install dist/chstate_meltano-*.whl     # into Meltano's environment
#
# Steps: `bazel build -c opt //hosts/python:libchstate.so` (skipped when
# CHSTATE_LIBRARY names a library to ship instead); copy the package to a
# staging folder (the source tree never holds a stale library); put the library
# inside it; `pip wheel` with a platform tag, py3-none-linux_<arch>: any
# CPython 3 on this OS and architecture, since ctypes needs no CPython ABI.
# $PYTHON (default python3) runs pip; it needs setuptools>=70.1, or network
# access to PyPI for an isolated build.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
out="$(mkdir -p "${1:-$repo/dist}" && cd "${1:-$repo/dist}" && pwd)"
py="${PYTHON:-python3}"

lib="${CHSTATE_LIBRARY:-}"
if [ -z "$lib" ]; then
  # --symlink_prefix=/ leaves the bazel-bin symlink alone (it keeps pointing
  # at the default configuration that tests and other tools use).
  (cd "$repo" && bazel build -c opt --symlink_prefix=/ //hosts/python:libchstate.so >&2)
  lib="$(cd "$repo" && bazel info -c opt bazel-bin 2>/dev/null)/hosts/python/libchstate.so"
fi
[ -f "$lib" ] || { echo "build_wheel: $lib does not exist" >&2; exit 1; }

stage="$(mktemp -d)"
trap 'rm -rf "$stage"' EXIT
cp -r "$here/pyproject.toml" "$here/README.md" "$here/chstate_meltano" "$stage/"
find "$stage" -name __pycache__ -prune -exec rm -rf {} +
install -m 0755 "$lib" "$stage/chstate_meltano/libchstate.so"
cat > "$stage/setup.cfg" <<CFG
[bdist_wheel]
python_tag = py3
plat_name = linux_$(uname -m)
CFG
"$py" -m pip wheel -q --no-deps --no-build-isolation -w "$out" "$stage" >&2 2>/dev/null \
  || "$py" -m pip wheel -q --no-deps -w "$out" "$stage" >&2
ls "$out"/chstate_meltano-*.whl
