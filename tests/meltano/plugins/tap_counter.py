#!/usr/bin/env python3
"""tap-counter: a tiny incremental Singer tap for the Meltano tests.

The source is the numbers 1..`total` (config). A run emits the records whose
id is past the bookmark in --state ({"bookmarks": {"numbers": {"id": N}}}),
sleeping `sleep_ms` after each (for tests that act mid-run); a STATE message
after every `state_every` records, and one at the end unless the last record
already had one (so `total` new records with state_every 1 make exactly
`total` STATE messages). It logs the bookmark it started from on stderr
("tap-counter: starting after id N"). Capabilities: discover, catalog, state.
"""

import argparse
import json
import sys
import time

SCHEMA = {"type": "object", "properties": {"id": {"type": "integer"}, "label": {"type": "string"}}}
CATALOG = {"streams": [{"tap_stream_id": "numbers", "stream": "numbers", "schema": SCHEMA,
                        "key_properties": ["id"], "replication_key": "id", "replication_method": "INCREMENTAL",
                        "metadata": [{"breadcrumb": [], "metadata": {"selected": True, "replication-key": "id",
                                                                      "forced-replication-method": "INCREMENTAL"}}]}]}


def emit(message: dict) -> None:
    sys.stdout.write(json.dumps(message) + "\n")


def load(path: str) -> dict:
    with open(path) as f:
        return json.load(f)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--config")
    ap.add_argument("--state")
    ap.add_argument("--catalog")
    ap.add_argument("--properties")
    ap.add_argument("--discover", action="store_true")
    args = ap.parse_args()
    if args.discover:
        emit(CATALOG)
        return 0
    config = load(args.config) if args.config else {}
    total = int(config.get("total", 5))
    every = max(1, int(config.get("state_every", 1)))
    sleep_s = int(config.get("sleep_ms", 0)) / 1000.0
    bookmark = 0
    if args.state:
        state = load(args.state)
        bookmark = int(state.get("bookmarks", {}).get("numbers", {}).get("id", 0))
    print(f"tap-counter: starting after id {bookmark}", file=sys.stderr, flush=True)
    emit({"type": "SCHEMA", "stream": "numbers", "schema": SCHEMA, "key_properties": ["id"],
          "bookmark_properties": ["id"]})
    last = bookmark
    stated = None
    for i in range(bookmark + 1, total + 1):
        emit({"type": "RECORD", "stream": "numbers", "record": {"id": i, "label": f"n{i}"}})
        last = i
        if (i - bookmark) % every == 0:
            emit({"type": "STATE", "value": {"bookmarks": {"numbers": {"id": last}}}})
            stated = last
        if sleep_s:
            sys.stdout.flush()
            time.sleep(sleep_s)
    if stated != last:
        emit({"type": "STATE", "value": {"bookmarks": {"numbers": {"id": last}}}})
    print(f"tap-counter: emitted {last - bookmark} records", file=sys.stderr, flush=True)
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
