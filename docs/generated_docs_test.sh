#!/usr/bin/env bash
# The generated blocks of README.md, docs/*.md and the npm package's TypeScript
# declarations are what tools/gendocs writes from the code's tables
# (//tools:docs_tables): a setting, default, verb, exit code or --help text
# changed in the code only fails here, and the message names the one command
# that regenerates the pages.
set -euo pipefail
root="$TEST_SRCDIR/$TEST_WORKSPACE"
tables="$TEST_TMPDIR/tables.json"
"$root/tools/docs_tables" > "$tables"
exec python3 "$root/tools/gendocs" --check --tables "$tables" --root "$root"
