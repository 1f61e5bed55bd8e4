"""Embedded ClickHouse (chDB) as a chstate transport, for users with no server.

    transport = ChdbTransport("/abs/path/to/state-dir")
    response = transport({"sql": "SELECT 1", "url_params": [], ...})

Each request runs in one chDB session the way ClickHouse's HTTP interface
would run it:
* `param_<name>=<value>` URL parameters become query parameters (the values
  are already in the escaped text form the server parses);
* HTTP-only parameters (database, wait_end_of_query, ...) are dropped;
* every other URL parameter is a setting for this query only: `SET k = 'v'`
  before it and `SET k = DEFAULT` afterwards (the session is this module's
  alone, so DEFAULT is always what it was);
* success is HTTP 200 with the raw output; an exception is HTTP 500 with the
  exception text ("Code: N. DB::Exception: ...") as the body.

chDB allows one data path per process, so sessions are shared process-wide by
path and stay open until the process exits (Meltano builds its state backend
several times per run; reopening each time would be slow).
"""

from __future__ import annotations

import atexit
import logging
import os
import re
import threading
from typing import Any, Mapping

from .binding import ChstateError

HTTP_ONLY_PARAMS = frozenset({"wait_end_of_query", "database", "default_format", "query_id", "session_id"})
_SETTING_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")

logger = logging.getLogger(__name__)

_sessions: dict = {}
_sessions_lock = threading.Lock()


def session_for(path: str):
    """The process's chDB session for `path` (absolute), opened on first use."""
    path = os.path.realpath(path)
    with _sessions_lock:
        if path in _sessions:
            return _sessions[path]
        if _sessions:
            other = next(iter(_sessions))
            raise ChstateError("FAILED_PRECONDITION",
                               f"chDB allows one data path per process and {other} is already open here; "
                               f"cannot also open {path}")
        try:
            from chdb import session as chdb_session
        except ImportError:
            raise ChstateError("FAILED_PRECONDITION",
                               "the chdb:// state backend needs chDB: pip install 'chstate-meltano[chdb]' "
                               "(or chdb-core) into Meltano's environment") from None
        os.makedirs(path, exist_ok=True)
        s = chdb_session.Session(path)
        _sessions[path] = s
        return s


@atexit.register
def _close_sessions() -> None:
    with _sessions_lock:
        for s in _sessions.values():
            try:
                s.close()
            except Exception:  # noqa: BLE001 - best effort at exit
                pass
        _sessions.clear()


def _literal(value: str) -> str:
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


class ChdbTransport:
    def __init__(self, path: str):
        self.path = os.path.realpath(path)
        self.endpoint = f"chdb:{self.path}"
        self._session = None

    def __repr__(self) -> str:
        return f"ChdbTransport({self.path})"

    def close(self) -> None:
        # The session is the process's (see session_for); only forget it.
        self._session = None

    def _query(self, sql: str, params: Mapping[str, str] | None = None) -> bytes:
        return self._session.query(sql, "TabSeparated", params=dict(params) if params else None).bytes()

    def _restore(self, applied: list) -> None:
        # The session is this module's alone and every SET is undone after
        # its query, so the value before was always the default.
        for name in applied:
            self._query(f"SET {name} = DEFAULT")

    def __call__(self, request: Mapping[str, Any]) -> dict:
        if self._session is None:
            try:
                self._session = session_for(self.path)
            except ChstateError as e:
                return {"transport_ok": False, "maybe_delivered": False, "transport_error": e.message}
        params: dict = {}
        settings: dict = {}
        for key, value in request.get("url_params", []):
            if key.startswith("param_"):
                params[key[len("param_"):]] = value
            elif key not in HTTP_ONLY_PARAMS:
                if not _SETTING_NAME.fullmatch(key):
                    return {"transport_ok": True, "http_status": 400, "exception_code_header": "",
                            "body": f"Code: 115. DB::Exception: Unknown setting {key!r}".encode()}
                settings[key] = value
        applied: list = []
        error = None
        try:
            for name, value in settings.items():
                self._query(f"SET {name} = {_literal(str(value))}")
                applied.append(name)
            body = self._query(str(request["sql"]), params)
        except Exception as e:  # noqa: BLE001 - chDB raises RuntimeError / ChdbError
            error = e
        try:
            self._restore(applied)
        except Exception as e:  # noqa: BLE001 - the query's own outcome stands
            logger.warning("chstate: could not restore chDB settings %s after %s: %s", applied,
                           request.get("purpose"), e)
        if error is not None:
            return {"transport_ok": True, "http_status": 500, "exception_code_header": "",
                    "body": str(error).encode("utf-8", "replace")}
        return {"transport_ok": True, "http_status": 200, "exception_code_header": "", "body": body}
