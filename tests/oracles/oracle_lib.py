"""Helpers for the oracle tests: load the conformance vectors, run their
recorded request documents on a real engine over HTTP, decode TabSeparated.

An `Engine` is one ClickHouse HTTP endpoint: the throwaway ClickHouse 18.16
server (clickhouse18 dialect) or tools/chdb_http.py's front for chDB (modern
dialect). `Engine.execute(request, schema)` sends a request document the way
every chstate host sends it: POST /, the SQL as the body, `url_params` as the
URL query (settings, `param_<name>` query parameters, wait_end_of_query),
credentials in headers. The vectors name the schema `meltano` (or `ops`); each
test runs them on a fresh schema of its own, so `rewrite` swaps the schema
name: only the backtick-quoted identifier and the `'meltano'` string literal
(system.tables/system.mutations filters), and it refuses SQL where the name
would remain anywhere else.

Nothing here reuses the core's escaping: values the tests write themselves
go in as `unhex('<hex>')`, and the decoder below is written from ClickHouse's
TabSeparated rules.
"""

from __future__ import annotations

import dataclasses
import json
import re
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Iterable, Optional

REPO = Path(__file__).resolve().parents[2]
VECTORS = REPO / "tests" / "vectors"

_CODE_RE = re.compile(rb"(?:^|\n)Code: (\d+)[.,]")


# ---------------------------------------------------------------------------
# vectors


def load(name: str) -> dict:
    return json.loads((VECTORS / f"{name}.json").read_text())


@dataclasses.dataclass
class Exchange:
    """One request the core emitted and the answer the vector scripted for it."""

    index: int
    request: dict
    scripted: Optional[dict]  # the fed response document, None if the case ended without one

    @property
    def purpose(self) -> str:
        return self.request["purpose"]

    def scripted_body(self) -> bytes:
        if self.scripted is None:
            return b""
        if "body_hex" in self.scripted:
            return bytes.fromhex(self.scripted["body_hex"])
        return self.scripted.get("body", "").encode("utf-8")

    def scripted_code(self) -> Optional[int]:
        """The ClickHouse exception code the scripted answer carries (header or body)."""
        if self.scripted is None or not self.scripted.get("transport_ok", False):
            return None
        header = self.scripted.get("exception_code_header") or ""
        if header.isdigit():
            return int(header)
        return exception_code(self.scripted_body())

    def scripted_transport_failure(self) -> bool:
        return self.scripted is not None and not self.scripted.get("transport_ok", False)


def exchanges(case: dict) -> list[Exchange]:
    """The (request, scripted answer) pairs of a case, in order."""
    steps = case["steps"]
    out = []
    for i, step in enumerate(steps):
        action = json.loads(step["expect"])
        if "request" not in action:
            continue
        nxt = steps[i + 1] if i + 1 < len(steps) else None
        answer = nxt["doc"].get("response") if nxt is not None and nxt["call"] == "feed" else None
        out.append(Exchange(len(out), action["request"], answer))
    return out


def first_op(case: dict) -> dict:
    return case["steps"][0]["doc"]


def dialect_of(case: dict) -> str:
    """The dialect the case's scripted select_version answer selects (18.x/1.x: clickhouse18)."""
    for ex in exchanges(case):
        if ex.purpose == "select_version":
            version = ex.scripted_body().split(b"\t")[0].decode()
            return "clickhouse18" if int(version.split(".")[0]) < 23 else "modern"
    raise AssertionError(f"{case['name']}: no select_version exchange")


# ---------------------------------------------------------------------------
# schema rewriting


def rewrite(sql: str, old_schema: str, new_schema: str) -> str:
    out = sql.replace(f"`{old_schema}`", f"`{new_schema}`").replace(f"'{old_schema}'", f"'{new_schema}'")
    assert not re.search(rf"\b{re.escape(old_schema)}\b", out), f"schema name left after rewriting: {out}"
    return out


# ---------------------------------------------------------------------------
# TabSeparated


_ESCAPES = {ord("b"): b"\b", ord("f"): b"\f", ord("r"): b"\r", ord("n"): b"\n", ord("t"): b"\t", ord("0"): b"\0",
            ord("a"): b"\a", ord("v"): b"\v", ord("e"): b"\x1b"}


def tsv_field(raw: bytes) -> Optional[bytes]:
    """One TabSeparated field, unescaped; None for \\N (NULL)."""
    if raw == b"\\N":
        return None
    out = bytearray()
    i = 0
    while i < len(raw):
        c = raw[i]
        if c == 0x5C and i + 1 < len(raw):
            n = raw[i + 1]
            if n == ord("x") and i + 3 < len(raw) and re.fullmatch(rb"[0-9A-Fa-f]{2}", raw[i + 2:i + 4]):
                out.append(int(raw[i + 2:i + 4], 16))
                i += 4
                continue
            out += _ESCAPES.get(n, bytes([n]))  # \\ \' \" and unknown escapes: the character itself
            i += 2
            continue
        out.append(c)
        i += 1
    return bytes(out)


def tsv_rows(body: bytes) -> list[list[Optional[bytes]]]:
    """Rows of unescaped fields. Every row ends in a newline (a body that does
    not is not TabSeparated output and fails here)."""
    if body == b"":
        return []
    assert body.endswith(b"\n"), f"TabSeparated output must end in a newline: {body[-80:]!r}"
    return [[tsv_field(f) for f in line.split(b"\t")] for line in body[:-1].split(b"\n")]


def field_counts(body: bytes) -> list[int]:
    return [len(r) for r in tsv_rows(body)]


def exception_code(body: bytes) -> Optional[int]:
    m = _CODE_RE.search(body)
    return int(m.group(1)) if m else None


# ---------------------------------------------------------------------------
# engines


@dataclasses.dataclass
class Answer:
    status: int
    header_code: Optional[int]
    body: bytes

    @property
    def code(self) -> Optional[int]:
        """The exception code: the header, else the body (18.16 sends no header)."""
        if self.header_code is not None:
            return self.header_code
        if self.status != 200:
            return exception_code(self.body)
        return exception_code(self.body) if b"DB::Exception" in self.body else None

    @property
    def ok(self) -> bool:
        return self.status == 200 and self.code is None

    def rows(self) -> list:
        assert self.ok, f"not a success: HTTP {self.status}: {self.body[:500]!r}"
        return tsv_rows(self.body)


class Engine:
    """A ClickHouse HTTP endpoint (the 18.16 server or the chDB front)."""

    def __init__(self, name: str, host: str, port: int, user: str, password: str):
        self.name = name
        self.host = host
        self.port = port
        self.user = user
        self.password = password

    def post(self, sql: str, url_params: Iterable = ()) -> Answer:
        query = urllib.parse.urlencode([(k, v) for k, v in url_params])
        url = f"http://{self.host}:{self.port}/" + (f"?{query}" if query else "")
        req = urllib.request.Request(url, data=sql.encode("utf-8"), method="POST",
                                     headers={"X-ClickHouse-User": self.user, "X-ClickHouse-Key": self.password})
        try:
            with urllib.request.urlopen(req, timeout=60) as r:
                return Answer(r.status, _header_code(r.headers), r.read())
        except urllib.error.HTTPError as e:
            return Answer(e.code, _header_code(e.headers), e.read())

    def sql(self, sql: str) -> bytes:
        """Set-up and checks: must succeed."""
        a = self.post(sql)
        assert a.ok, f"{self.name}: {sql[:300]} -> HTTP {a.status}: {a.body[:500]!r}"
        return a.body

    def rows(self, sql: str) -> list:
        return tsv_rows(self.sql(sql))

    def execute(self, request: dict, old_schema: str, new_schema: str) -> Answer:
        return self.post(rewrite(request["sql"], old_schema, new_schema), request.get("url_params", []))


def _header_code(headers) -> Optional[int]:
    v = headers.get("X-ClickHouse-Exception-Code")
    return int(v) if v and v.strip().isdigit() else None


def unhex(value: bytes) -> str:
    """A SQL expression for exactly these bytes, independent of any escaping."""
    return f"unhex('{value.hex()}')"


def nullable(value: Optional[bytes]) -> str:
    return "NULL" if value is None else unhex(value)


# ---------------------------------------------------------------------------
# Meltano's glob, re-implemented


def glob_matches(pattern: str, state_id: str) -> bool:
    """Meltano's state-id glob: `*` any run of characters (newlines too), `?`
    exactly one character (a code point of the str id), everything else itself."""
    regex = "".join(".*" if c == "*" else "." if c == "?" else re.escape(c) for c in pattern)
    return re.fullmatch(regex, state_id, re.DOTALL) is not None


def select_glob(pattern: str, ids: Iterable[str]) -> set:
    return {i for i in ids if glob_matches(pattern, i)}
