"""Oracle for list's glob: the LIKE the core writes selects, on the real
engine, exactly the ids a Python re-implementation of Meltano's glob (`*` any
run of characters, `?` one character, everything else literal) selects from a
set of tricky ids (%, _, \\, quotes, backticks, newlines, non-ASCII).

The recorded pattern (sql.json's *_list_glob_escapes_like) runs as recorded;
further patterns are the core's own SQL for them, asked from the core library
(a list op answered with the dialect's version), then executed on the engine.

`?` is one character, not one byte: both engines' LIKE `_` matches a whole
UTF-8 character (test_question_mark_is_one_character).
"""

from __future__ import annotations

import json

import pytest

from oracle_lib import exchanges, first_op, load, rewrite, select_glob, unhex

SQL = {c["name"]: c for c in load("sql")["cases"]}

IDS = ["dev:a", "dev:b", "dev:ab", "dev:a%b", "dev:a_b", "dev:axb", "dev:a\\b", "dev:a\\\\b", "dev:a'b", 'dev:a"b',
       "dev:a`b", "dev:%", "dev:_", "dev:\\", "dev:'", "dev:", "dev:*", "dev:?", "dev:\\%", "dev:\\_", "dev:%%",
       "dev:x_100%a", "dev:x_100%", "dev:xX100%a", "dev:x_100Xa", "dev:x_100%ab", "Dev:a", "prod:a", "dev:a\nb",
       "dev:a\tb", "dev:[a]", "dev:a.b", "dev:a+b", "dev:(a)", "dev:a$", "^dev:a", "dev:a|b", "%", "_", "\\"]
NON_ASCII = ["dev:é", "dev:日本", "dev:aé"]

PATTERNS = ["dev:*", "dev:?", "dev:??", "dev:%", "dev:_", "dev:\\", "dev:\\*", "dev:a?b", "dev:a*b", "*%*", "*_*",
            "*\\*", "*'*", "*`*", '*"*', "dev:x_100%?", "?", "*", "*:*", "dev:a\\?b", "dev:\\%", "dev:\\_",
            "dev:[a]", "dev:a.b", "dev:a+b", "dev:(a)", "dev:a$", "^dev:a", "dev:a|b", "%", "_", "\\", "dev:%%",
            "*\n*", "dev:a?b*", "D*", "dev:"]
NON_ASCII_PATTERNS = ["dev:?", "dev:??", "dev:a?", "dev:*"]

VERSION = {"clickhouse18": "18.16.1", "modern": "24.3.2.23"}


def prepared(engine, dialect: str, schema: str, ids: list[str]) -> None:
    for ex in exchanges(SQL[f"{dialect}_init"]):
        if ex.purpose in ("create_database", "create_state_table"):
            assert engine.execute(ex.request, "meltano", schema).ok
    values = ", ".join(f"({unhex(i.encode())}, NULL, '{{}}')" for i in ids)
    engine.sql(f"INSERT INTO `{schema}`.`state` (state_id, partial_state, completed_state) VALUES {values}")


def listed(engine, request_doc: dict, schema: str) -> set:
    return {r[0].decode("utf-8") for r in engine.execute(request_doc, "meltano", schema).rows()}


@pytest.mark.parametrize("dialect", ["clickhouse18", "modern"])
def test_recorded_pattern_selects_what_meltano_selects(request, dialect, schema):
    case = SQL[f"{dialect}_list_glob_escapes_like"]
    engine = request.getfixturevalue("ch18" if dialect == "clickhouse18" else "modern")
    prepared(engine, dialect, schema, IDS)
    pattern = bytes.fromhex(first_op(case)["pattern_hex"]).decode()
    req = next(ex for ex in exchanges(case) if ex.purpose == "list_state_ids").request
    assert listed(engine, req, schema) == select_glob(pattern, IDS)


def core_list_request(core, dialect: str, pattern: str) -> dict:
    op = {"op": "list", "pattern_hex": pattern.encode().hex()}
    return [r for r in core.requests_for(op, VERSION[dialect]) if r["purpose"] == "list_state_ids"][0]


@pytest.mark.parametrize("dialect", ["clickhouse18", "modern"])
def test_core_patterns_select_what_meltano_selects(request, dialect, schema, core):
    engine = request.getfixturevalue("ch18" if dialect == "clickhouse18" else "modern")
    prepared(engine, dialect, schema, IDS)
    wrong = {}
    for pattern in PATTERNS:
        got = listed(engine, core_list_request(core, dialect, pattern), schema)
        want = select_glob(pattern, IDS)
        if got != want:
            wrong[pattern] = {"extra": sorted(got - want), "missing": sorted(want - got)}
    assert not wrong, "LIKE and Meltano's glob disagree:\n" + json.dumps(wrong, indent=1, ensure_ascii=False)


@pytest.mark.parametrize("dialect", ["clickhouse18", "modern"])
def test_question_mark_is_one_character(request, dialect, schema, core):
    engine = request.getfixturevalue("ch18" if dialect == "clickhouse18" else "modern")
    ids = IDS + NON_ASCII
    prepared(engine, dialect, schema, ids)
    for pattern in NON_ASCII_PATTERNS:
        assert listed(engine, core_list_request(core, dialect, pattern), schema) == select_glob(pattern, ids), pattern
