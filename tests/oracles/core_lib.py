"""The core library through its C ABI (ctypes), only to ask it which request
it emits for an op: the same calls tests/vectors/generate.py makes."""

from __future__ import annotations

import ctypes
import json

RANDOM = bytes(range(32))
# The settings document the vectors' stores open on (tests/vectors/generate.py).
STORE = {"values": {"uri": "clickhouse://default@127.0.0.1:8123/default", "lock_wait_seconds": 3,
                    "lock_retry_seconds": 1, "lock_timeout_seconds": 30}}
# An op that asks for more requests than this is not one these tests script.
MAX_REQUESTS = 50


def _dumps(doc) -> bytes:
    return json.dumps(doc, ensure_ascii=False, separators=(",", ":")).encode("utf-8")


class Core:
    def __init__(self, lib: ctypes.CDLL):
        # The Python adapter's handle on the library (tests/native_library.py):
        # its ctypes signatures are the ABI's.
        self.lib = lib

    def _take(self, ptr) -> dict:
        text = ctypes.string_at(ptr).decode("utf-8")
        self.lib.chstate_string_free(ptr)
        return json.loads(text)

    def requests_for(self, op: dict, version: str, answers: list[dict] = ()) -> list[dict]:
        """Starts `op` on a new store, answers select_version with `version`,
        then each further request with the next of `answers` (default: an
        empty 200); returns every request the core emitted. A write takes
        the id's lock, answered like the rest: its empty inspect_lock says
        the lock was lost, and the op ends there (after insert_state)."""
        err = ctypes.c_void_p()
        handle = self.lib.chstate_store_new(_dumps(STORE), ctypes.byref(err))
        assert handle, f"store_new failed: {ctypes.string_at(err.value)!r}"
        try:
            now = 1_000_000
            action = self._take(self.lib.chstate_op_start(handle, _dumps(op), now, RANDOM, len(RANDOM)))
            requests, queue = [], list(answers)
            while "request" in action:
                assert len(requests) < MAX_REQUESTS, f"{op}: more than {MAX_REQUESTS} requests: {requests[-3:]}"
                requests.append(action["request"])
                if action["request"]["purpose"] == "select_version":
                    body = f"{version}\t1\n"
                else:
                    body = queue.pop(0)["body"] if queue else ""
                doc = {"response": {"transport_ok": True, "http_status": 200, "exception_code_header": "",
                                    "body": body}}
                now += 3
                action = self._take(self.lib.chstate_op_feed(handle, _dumps(doc), now, RANDOM, len(RANDOM)))
            return requests
        finally:
            self.lib.chstate_store_free(handle)
