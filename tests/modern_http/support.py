"""Shared checks for tests/modern_http: what proves a host spoke the modern
dialect to the chDB front (tools/chdb_http.py), and hostile test data."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

# Errors the core provokes on purpose: 57 (a lock table exists: the lock's
# test-and-set), 60/81 (a missing table/database reads as absent).
EXPECTED_CODES = {57, 60, 81}

# A state id with every kind of trouble an argv can carry (no NUL):
# quotes, backslashes, SQL, a query parameter, LIKE wildcards, control
# characters, newlines and non-ASCII text.
HOSTILE_ID = "dev:it's \"q\" `b` back\\slash\\\\ {id:String} 100%_*? \t\r\nx'); DROP TABLE state; -- \x01\x7f ünïcødé 状态 🚀"
# Values that must come back byte for byte inside a state.
ODD_VALUE = "it's \"quoted\" \\ `x` \t\n\u0000 \u2028 ünï 🚀 {v:String} \\N"


def version_is_modern(version: str) -> bool:
    m = re.match(r"(\d+)\.(\d+)", version)
    return bool(m) and (int(m.group(1)), int(m.group(2))) >= (23, 3)


def check_modern(records, *, writes: bool = True, creates: bool = False) -> None:
    """Asserts that what the front received is the modern dialect, answered
    without surprises:
    * no unexpected exception (only the codes the core provokes on purpose);
    * with writes=True: values travel as `{name:Type}` query parameters
      (param_* URL params), and there is at least one INSERT;
    * every INSERT carries async_insert=0 and an insert_deduplication_token;
    * deletes are lightweight `DELETE FROM`, never an `ALTER TABLE ... DELETE` mutation;
    * with creates=True: the state table has a DateTime64(3) version column and
      lock tables a TTL.
    """
    assert records, "the front received nothing"
    unexpected = [(r.status, r.code, r.sql[:200], r.body[:300]) for r in records
                  if r.status != 200 and r.code not in EXPECTED_CODES]
    assert not unexpected, f"unexpected errors from the modern engine: {unexpected}"
    sqls = [r.sql for r in records]
    if writes:  # (init and ping have no values to send)
        assert any(r.params for r in records), f"no query parameters were used: {sqls[:10]}"
        assert any(re.search(r"\{\w+:\w+", s) for s in sqls), "no {name:Type} placeholders in any statement"
    assert not any(re.search(r"ALTER\s+TABLE[^;]*\bDELETE\b", s, re.I | re.S) for s in sqls), \
        "an 18.x-style ALTER TABLE ... DELETE mutation was sent to a modern server"
    inserts = [r for r in records if re.match(r"\s*INSERT\b", r.sql, re.I)]
    if writes:
        assert inserts, f"no INSERT was sent: {sqls}"
    for r in inserts:
        assert r.settings.get("async_insert") == "0", f"INSERT without async_insert=0: {r.settings}"
        assert r.settings.get("insert_deduplication_token"), f"INSERT without a dedup token: {r.settings}"
    if creates:
        ddl = [s for s in sqls if re.match(r"\s*CREATE\s+TABLE", s, re.I)]
        assert any("DateTime64(3)" in s for s in ddl), f"no DateTime64(3) in the CREATE TABLEs: {ddl}"
        assert any(re.search(r"\bTTL\b", s) for s in ddl), f"no TTL in the CREATE TABLEs: {ddl}"


def check_no_problems(front) -> None:
    problems, front.problems[:] = list(front.problems), []
    assert not problems, f"protocol problems seen by the front: {problems}"
