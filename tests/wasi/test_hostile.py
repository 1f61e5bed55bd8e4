"""Hostile input through the WebAssembly ABI, in wasmtime: bad handles,
pointers and lengths, truncated, oversized and invalid-UTF-8 documents, huge
and deeply nested inputs, calls in the wrong order, too-small output buffers.
Each must give a {"failed": ...} document (or the documented -1 / 0), never a
trap, and must leave the store usable: every test ends by driving a complete
operation on the same handle. A wasmtime trap raises and fails the test."""

from __future__ import annotations

import json
import random as rnd

import pytest

VERSION = {"response": {"transport_ok": True, "http_status": 200, "body": "18.16.1\t1\n"}}
GOOD_RANDOM = bytes(range(32))
# A store opens from a settings document (hosts/common/protocol.h); a uri is required.
SETTINGS = b'{"from":"api","values":{"uri":"clickhouse://default@127.0.0.1:8123/default"}}'


def doc(module, r: int) -> dict:
    """Reads the document of a call that returned r (fetching it from the outbox when r < 0)."""
    if r < 0:
        ptr = module.block("big", -r)
        r = module.call("chstate_last", ptr, -r)
        assert r > 0
        return json.loads(module.read(ptr, r))
    return json.loads(module.read(module.block("out", 64 * 1024), r))


def raw(module, fn: str, handle: int, data: bytes, *, length: int | None = None, ptr: int | None = None,
        random: bytes = GOOD_RANDOM, out: tuple[int, int] | None = None) -> dict:
    """Calls op_start/op_feed with full control over every argument."""
    p, n = module.put(data) if data else (0, 0)
    rp, rn = module.put(random, "random") if random else (0, 0)
    o, c = out or (module.block("out", 64 * 1024), 64 * 1024)
    r = module.call(fn, handle, p if ptr is None else ptr, n if length is None else length, 1000, rp, rn, o, c)
    return doc(module, r)


def new_store(module, options: bytes = SETTINGS) -> int:
    r = module.store_new(options)
    assert "store" in r, r
    return r["store"]


def assert_failed(d: dict, code: str, *words: str) -> None:
    assert "failed" in d, d
    assert d["failed"]["code"] == code, d
    for w in words:
        assert w in d["failed"]["message"], d


def assert_handle_works(module, handle: int) -> None:
    """A full ping on the handle: request, answer, done."""
    first = raw(module, "chstate_op_start", handle, b'{"op":"ping"}')
    assert first["request"]["purpose"] == "select_version", first
    done = raw(module, "chstate_op_feed", handle, json.dumps(VERSION).encode())
    assert done["done"]["server_version"] == "18.16.1", done


@pytest.mark.parametrize("bad", [0, -1, 1 << 20, 0x7FFFFFFF, 2])
def test_bad_handles_are_errors(module, bad):
    handle = new_store(module)
    for fn in ("chstate_op_start", "chstate_op_feed"):
        assert_failed(raw(module, fn, bad, b'{"op":"ping"}'), "INVALID_ARGUMENT", "is not open")
    assert module.call("chstate_store_free", bad) == -1
    assert_handle_works(module, handle)


def test_use_after_free_and_double_free_of_a_store(module):
    a = new_store(module)
    assert module.call("chstate_store_free", a) == 0
    assert module.call("chstate_store_free", a) == -1
    assert_failed(raw(module, "chstate_op_start", a, b'{"op":"ping"}'), "INVALID_ARGUMENT", "is not open")
    b = new_store(module)  # reuses the slot with a new generation: the old number stays dead
    assert b != a
    assert_failed(raw(module, "chstate_op_start", a, b'{"op":"ping"}'), "INVALID_ARGUMENT", "is not open")
    assert_handle_works(module, b)


def test_pointers_outside_host_blocks_are_refused(module):
    handle = new_store(module)
    for ptr in (0xFFFFFF00, 1024, 8):  # beyond memory, static data, near zero
        assert_failed(raw(module, "chstate_op_start", handle, b'{"op":"ping"}', ptr=ptr), "INVALID_ARGUMENT",
                      "not inside a live block")
    assert_handle_works(module, handle)


def test_length_beyond_the_block_keeps_the_running_operation(module):
    handle = new_store(module)
    first = raw(module, "chstate_op_start", handle, b'{"op":"ping"}')
    assert "request" in first
    small = module.alloc(16)
    module.write(small, b'{"response":{}}')
    # A length running past the block, then one past all memory.
    for length in (17, 4096, 0x7FFFFFFF):
        assert_failed(raw(module, "chstate_op_feed", handle, b"", ptr=small, length=length), "INVALID_ARGUMENT")
    # The ping still waits for its answer.
    done = raw(module, "chstate_op_feed", handle, json.dumps(VERSION).encode())
    assert done["done"]["server_version"] == "18.16.1", done


def test_truncated_documents(module):
    handle = new_store(module)
    text = json.dumps({"op": "set", "state_id_hex": "6161", "state": {"singer_state": {"a": [1, 2, 3]}}})
    for cut in (1, 5, len(text) // 2, len(text) - 1):
        assert_failed(raw(module, "chstate_op_start", handle, text[:cut].encode()), "INVALID_ARGUMENT", "JSON")
    assert_handle_works(module, handle)


@pytest.mark.parametrize("bad", [
    b'{"op":"get","state_id_hex":"\xff"}',            # not UTF-8 at all
    b'{"op":"get","state_id_hex":"\xc0\xaf"}',        # overlong '/'
    b'{"op":"get","state_id_hex":"\xed\xa0\x80"}',    # UTF-16 surrogate
    b'{"op":"get","state_id_hex":"\xf4\x90\x80\x80"}',  # above U+10FFFF
    b'{"op":"get","state_id_hex":"\xe2\x82"}',        # truncated sequence
])
def test_invalid_utf8_is_refused_before_the_store(module, bad):
    handle = new_store(module)
    first = raw(module, "chstate_op_start", handle, b'{"op":"ping"}')
    assert "request" in first
    assert_failed(raw(module, "chstate_op_feed", handle, bad), "INVALID_ARGUMENT", "not valid UTF-8 at offset")
    done = raw(module, "chstate_op_feed", handle, json.dumps(VERSION).encode())  # the op survived
    assert "done" in done, done


def test_nul_byte_is_refused(module):
    handle = new_store(module)
    assert_failed(raw(module, "chstate_op_start", handle, b'{"op":"ping"}\x00{"op":"clear_all"}'),
                  "INVALID_ARGUMENT", "NUL byte at offset 13")
    assert_handle_works(module, handle)


def test_huge_sizes(module):
    handle = new_store(module)
    assert module.alloc(0) == 0
    assert module.alloc((16 << 20) + 1) == 0
    assert module.alloc(0xFFFFFFFF) == 0
    block = module.alloc(64)
    assert_failed(raw(module, "chstate_op_start", handle, b"", ptr=block, length=(16 << 20) + 1), "INVALID_ARGUMENT",
                  "the limit is")
    assert module.free(block) == 0
    assert_handle_works(module, handle)


def test_largest_document_is_handled(module):
    """A 15 MiB state goes through set without trapping (the module grows its
    memory): the op is answered as a server would until the insert carries it."""
    handle = new_store(module)
    big = json.dumps({"op": "set", "state_id_hex": "6161",
                      "state": {"singer_state": {"blob": "x" * (15 << 20)}}}).encode()
    action = raw(module, "chstate_op_start", handle, big)
    assert action["request"]["purpose"] == "select_version", str(action)[:300]
    action = raw(module, "chstate_op_feed", handle, json.dumps(VERSION).encode())
    # set takes the id's lock first (create, look for foreign rows), then inserts: an empty 200 answers each.
    carried = False
    for _ in range(12):
        if "request" not in action:
            break
        carried = carried or len(action["request"]["sql"]) > 15 << 20
        ok = {"response": {"transport_ok": True, "http_status": 200, "body": ""}}
        action = raw(module, "chstate_op_feed", handle, json.dumps(ok).encode())
    assert carried, "no request carried the 15 MiB state"
    assert set(action) <= {"done", "failed", "request", "wait_ms"}, str(action)[:300]
    assert_handle_works(module, handle)


def test_deep_nesting_is_refused_before_recursion(module):
    handle = new_store(module)
    deep = b'{"op":"set","state_id_hex":"61","state":{"singer_state":' + b"[" * 200_000 + b"]" * 200_000 + b"}}"
    assert_failed(raw(module, "chstate_op_start", handle, deep), "INVALID_ARGUMENT", "nests deeper than")
    # Just past the state model's own limit: refused by the core, not the ABI.
    medium = b'{"op":"set","state_id_hex":"61","state":{"singer_state":{"a":' + b"[" * 515 + b"]" * 515 + b'}}}'
    assert_failed(raw(module, "chstate_op_start", handle, medium), "INVALID_ARGUMENT", "deeper")
    assert_handle_works(module, handle)


def test_calls_in_the_wrong_order(module):
    handle = new_store(module)
    # An answer before any operation.
    assert_failed(raw(module, "chstate_op_feed", handle, json.dumps(VERSION).encode()), "FAILED_PRECONDITION",
                  "start one first")
    # A timer where an SQL answer is expected, and an answer after the end.
    raw(module, "chstate_op_start", handle, b'{"op":"ping"}')
    assert_failed(raw(module, "chstate_op_feed", handle, b'{"timer":true}'), "INVALID_ARGUMENT")
    assert_handle_works(module, handle)
    assert_failed(raw(module, "chstate_op_feed", handle, json.dumps(VERSION).encode()), "FAILED_PRECONDITION")
    # A new start while an op runs abandons the old one (documented).
    raw(module, "chstate_op_start", handle, b'{"op":"get","state_id_hex":"61"}')
    assert_handle_works(module, handle)
    # Unknown op, missing fields, wrong types.
    for bad in (b'{"op":"explode"}', b'{"op":"get"}', b'{"op":"get","state_id_hex":7}', b"[]", b'"op"', b""):
        assert_failed(raw(module, "chstate_op_start", handle, bad), "INVALID_ARGUMENT")
    assert_handle_works(module, handle)


def test_too_small_output_buffer_keeps_the_document(module):
    handle = new_store(module)
    tiny = module.alloc(8)
    r = module.call("chstate_op_start", handle, *module.put(b'{"op":"ping"}'), 1000,
                    *module.put(GOOD_RANDOM, "random"), tiny, 8)
    assert r < 0
    big = module.alloc(-r)
    assert module.call("chstate_last", big, -r) == -r
    first = json.loads(module.read(big, -r))
    assert first["request"]["purpose"] == "select_version"
    assert module.call("chstate_last", tiny, 8) == r  # still too small: still nothing written, same size
    # The op advanced once: answering it finishes it.
    done = raw(module, "chstate_op_feed", handle, json.dumps(VERSION).encode())
    assert "done" in done, done


def test_output_buffer_outside_blocks_does_not_run_the_op(module):
    handle = new_store(module)
    p, n = module.put(b'{"op":"ping"}')
    rp, rn = module.put(GOOD_RANDOM, "random")
    r = module.call("chstate_op_start", handle, p, n, 1000, rp, rn, 1024, 4096)
    assert r < 0
    big = module.alloc(-r)
    assert module.call("chstate_last", big, -r) == -r
    assert_failed(json.loads(module.read(big, -r)), "INVALID_ARGUMENT", "output buffer")
    # Nothing started: an answer now finds no operation.
    assert_failed(raw(module, "chstate_op_feed", handle, json.dumps(VERSION).encode()), "FAILED_PRECONDITION")
    assert_handle_works(module, handle)


def test_bad_random_input(module):
    handle = new_store(module)
    assert_failed(raw(module, "chstate_op_start", handle, b'{"op":"ping"}', random=b"\x01" * 8), "INVALID_ARGUMENT",
                  "random_len is 8")
    assert_failed(raw(module, "chstate_op_start", handle, b'{"op":"ping"}', random=b""), "INVALID_ARGUMENT",
                  "random_len is 0")
    assert_handle_works(module, handle)


def test_block_double_free_and_foreign_pointers(module):
    block = module.alloc(100)
    assert module.free(block) == 0
    assert module.free(block) == -1
    assert module.free(block + 4) == -1
    assert module.free(12345) == -1
    assert module.free(0) == 0
    assert_handle_works(module, new_store(module))


# Settings documents the core refuses, and a word its message must contain (the problem or the fix).
BAD_SETTINGS = [
    (b"{", "JSON"),
    (b"\xff", "UTF-8"),
    (b"[]", "object"),
    (b'{"values":{}}', "URI"),                                                    # a uri is required
    (b'{"values":{"uri":"clickhouse://u@h/db","schema":"bad-name"}}', "schema"),
    (b'{"values":{"uri":"clickhouse://u@h/db","colour":"blue"}}', "colour"),    # no such setting
    (b'{"values":{"uri":"clickhouse://u@h/db","lock_timeout_seconds":-1}}', "lock_timeout_seconds"),
    (b'{"values":{"uri":"clickhouse://u@h/db","stale_lock":30}}', "lock_timeout_seconds"),  # renamed: names the new key
    (b'{"values":{"uri":"clickhouse://u@h/db","lock_timeout_ms":1500}}', "lock_wait_seconds"),   # the old wait
]


@pytest.mark.parametrize("bad,word", BAD_SETTINGS, ids=[str(i) for i in range(len(BAD_SETTINGS))])
def test_bad_settings_documents(module, bad, word):
    got = module.store_new(bad)
    assert "failed" in got and word in got["failed"]["message"], (bad, got)
    p, n = module.put(bad, "cfg")
    resolved = doc(module, module.call("chstate_resolve_settings", p, n, module.block("out", 65536), 65536))
    assert "failed" in resolved and word in resolved["failed"]["message"], (bad, resolved)
    assert_handle_works(module, new_store(module))


def test_resolve_settings_outside_blocks(module):
    assert_failed(doc(module, module.call("chstate_resolve_settings", 8, 9, module.block("out", 65536), 65536)),
                  "INVALID_ARGUMENT", "not inside a live block")
    assert_handle_works(module, new_store(module))


def test_last_before_any_document(module):
    p = module.alloc(4096)
    r = module.call("chstate_last", p, 4096)
    assert_failed(json.loads(module.read(p, r)), "FAILED_PRECONDITION")


def test_random_garbage_never_traps(module):
    """3,000 random inputs (bytes, JSON-ish fragments, random lengths) at
    start and feed: every answer is a JSON document; the handle keeps working."""
    gen = rnd.Random(20261130)
    handle = new_store(module)
    pieces = [b"{", b"}", b"[", b"]", b'"op"', b":", b",", b'"ping"', b'"response"', b'"timer"', b"true", b"null",
              b'"state_id_hex"', b'"6161"', b"1e999", b"-0", b'"\\u0000"', b"\xc3", b"\xa9", b"\x00", b'"body_hex"']
    for i in range(3000):
        if i % 2:
            data = bytes(gen.randrange(256) for _ in range(gen.randrange(64)))
        else:
            data = b"".join(gen.choice(pieces) for _ in range(gen.randrange(12)))
        fn = gen.choice(("chstate_op_start", "chstate_op_feed"))
        d = raw(module, fn, handle, data)
        # "idle": a {"timer":true} fed while no op runs is the idle timer (protocol v3).
        assert set(d) <= {"failed", "request", "done", "wait_ms", "idle"} and len(d) == 1, (data, d)
    assert_handle_works(module, handle)


def test_many_stores(module):
    handles = [new_store(module) for _ in range(200)]
    assert len(set(handles)) == 200
    for h in handles[::2]:
        assert module.call("chstate_store_free", h) == 0
    for h in handles[1::2]:
        assert_handle_works(module, h)


NODE_HOSTILE = ["bad_handle", "pointer_outside_blocks", "length_past_block", "invalid_utf8_keeps_op",
                "truncated_json", "wrong_order", "too_small_buffer", "oversized", "double_free"]


@pytest.mark.parametrize("name", NODE_HOSTILE)
def test_node_hostile(node_results, name):
    """The same kinds of input in V8 (tests/wasi/node_runner.mjs hostile)."""
    results = node_results("hostile")
    assert f"hostile_{name}" in results, results
    assert results[f"hostile_{name}"]["ok"], results[f"hostile_{name}"]["detail"]
