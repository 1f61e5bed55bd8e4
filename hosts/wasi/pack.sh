#!/usr/bin/env bash
# Packs the npm package chstate-wasi (the Node host, its TypeScript
# declarations and the WebAssembly module), so Node users need neither Bazel
# nor a path to the module:
#
#   hosts/wasi/pack.sh [OUT_DIR]          # default: dist/ at the repo root
#   npm install dist/chstate-wasi-*.tgz   # in your project; then import "chstate-wasi"
#
# Steps: `bazel build --config=wasi //hosts/wasi:chstate.wasm` (skipped when
# CHSTATE_WASM names a module to ship instead); copy package.json,
# README.md, chstate_wasi.mjs and chstate_wasi.d.mts to a staging folder
# (the source tree never holds a .wasm); put chstate.wasm beside the host, where
# loadChstate() looks by default; `npm pack` there. Prints the tarball's path.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
out="$(mkdir -p "${1:-$repo/dist}" && cd "${1:-$repo/dist}" && pwd)"

wasm="${CHSTATE_WASM:-}"
if [ -z "$wasm" ]; then
  # --symlink_prefix=/ leaves the bazel-bin symlink alone (it keeps pointing
  # at the native configuration that tests and other tools use).
  (cd "$repo" && bazel build --config=wasi --symlink_prefix=/ //hosts/wasi:chstate.wasm >&2)
  wasm="$(cd "$repo" && bazel info --config=wasi bazel-bin 2>/dev/null)/hosts/wasi/chstate.wasm"
fi
[ -f "$wasm" ] || { echo "pack.sh: $wasm does not exist" >&2; exit 1; }
# A WebAssembly binary starts with "\0asm".
[ "$(head -c 4 "$wasm" | od -An -tx1 | tr -d ' \n')" = "0061736d" ] \
  || { echo "pack.sh: $wasm is not a WebAssembly module" >&2; exit 1; }

stage="$(mktemp -d)"
trap 'rm -rf "$stage"' EXIT
cp "$here/package.json" "$here/README.md" "$here/chstate_wasi.mjs" "$here/chstate_wasi.d.mts" "$stage/"
install -m 0644 "$wasm" "$stage/chstate.wasm"

# --ignore-scripts: the package has none, and nothing of the caller's runs.
tarball="$(cd "$stage" && npm pack --ignore-scripts --loglevel=warn --pack-destination "$out" | tail -n 1)"
[ -f "$out/$tarball" ] || { echo "pack.sh: npm pack did not produce a tarball" >&2; exit 1; }
echo "$out/$tarball"
