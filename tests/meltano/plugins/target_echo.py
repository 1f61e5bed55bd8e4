#!/usr/bin/env python3
"""target-echo: a tiny Singer target for the Meltano tests and benchmark.

Appends every RECORD (as JSON) to the file in config `output`, and writes
every STATE message's value to stdout at once (one line each), so Meltano
persists state as often as the tap emits it.
"""

import argparse
import json
import os
import sys


def load(path: str) -> dict:
    with open(path) as f:
        return json.load(f)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--config")
    args = ap.parse_args()
    config = load(args.config) if args.config else {}
    path = config.get("output", "output/echo.jsonl")
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(path, "a") as out:
        for line in sys.stdin:
            if not line.strip():
                continue
            message = json.loads(line)
            if message.get("type") == "RECORD":
                out.write(json.dumps(message["record"]) + "\n")
            elif message.get("type") == "STATE":
                out.flush()
                sys.stdout.write(json.dumps(message["value"]) + "\n")
                sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
