#!/usr/bin/env bash
# Packs the npm package chstate-wasi (the JS binding of chstate's verbs, its
# node:wasi host with TypeScript declarations, its Extism host, and the two
# WebAssembly modules), so Node users need neither Bazel nor a path to a module:
#
#   hosts/wasi/pack.sh [OUT_DIR]          # default: dist/ at the repo root
#   npm install dist/chstate-wasi-*.tgz   # in your project; then import "chstate-wasi" (or "chstate-wasi/extism")
#
# Steps: `bazel build --config=wasi //hosts/wasi:chstate.wasm
# //hosts/wasi:chstate_extism.wasm` (skipped when CHSTATE_WASM and
# CHSTATE_EXTISM_WASM name modules to ship instead); copy package.json,
# README.md, chstate_wasi.mjs, chstate_wasi.d.mts, chstate_binding.mjs,
# chstate_extism.mjs and chstate_extism.d.mts to a staging folder (the source tree never holds a .wasm);
# put chstate.wasm and chstate_extism.wasm beside the hosts, where open() looks
# by default; `npm pack` there. Prints the tarball's path.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
out="$(mkdir -p "${1:-$repo/dist}" && cd "${1:-$repo/dist}" && pwd)"

wasm="${CHSTATE_WASM:-}"
extism="${CHSTATE_EXTISM_WASM:-}"
if [ -z "$wasm" ] || [ -z "$extism" ]; then
  # --symlink_prefix=/ leaves the bazel-bin symlink alone (it keeps pointing
  # at the native configuration that tests and other tools use).
  (cd "$repo" && bazel build --config=wasi --symlink_prefix=/ //hosts/wasi:chstate.wasm \
     //hosts/wasi:chstate_extism.wasm >&2)
  bin="$(cd "$repo" && bazel info --config=wasi bazel-bin 2>/dev/null)"
  wasm="${wasm:-$bin/hosts/wasi/chstate.wasm}"
  extism="${extism:-$bin/hosts/wasi/chstate_extism.wasm}"
fi
for module in "$wasm" "$extism"; do
  [ -f "$module" ] || { echo "pack.sh: $module does not exist" >&2; exit 1; }
  # A WebAssembly binary starts with "\0asm".
  [ "$(head -c 4 "$module" | od -An -tx1 | tr -d ' \n')" = "0061736d" ] \
    || { echo "pack.sh: $module is not a WebAssembly module" >&2; exit 1; }
done

stage="$(mktemp -d)"
trap 'rm -rf "$stage"' EXIT
cp "$here/package.json" "$here/README.md" "$here/chstate_wasi.mjs" "$here/chstate_wasi.d.mts" \
   "$here/chstate_binding.mjs" "$here/chstate_extism.mjs" "$here/chstate_extism.d.mts" "$stage/"
install -m 0644 "$wasm" "$stage/chstate.wasm"
install -m 0644 "$extism" "$stage/chstate_extism.wasm"

# --ignore-scripts: the package has none, and nothing of the caller's runs.
tarball="$(cd "$stage" && npm pack --ignore-scripts --loglevel=warn --pack-destination "$out" | tail -n 1)"
[ -f "$out/$tarball" ] || { echo "pack.sh: npm pack did not produce a tarball" >&2; exit 1; }
echo "$out/$tarball"
