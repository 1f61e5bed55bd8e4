"""Meltano state backends (entry-point group `meltano.state_backends`) whose
state logic is chstate's C++ core:

* `clickhouse` -> ClickhouseStateStoreManager: a ClickHouse server over HTTP(S)
  (`state_backend.uri: clickhouse://user@host:8123/default`);
* `chdb` -> ChdbStateStoreManager: embedded ClickHouse (chDB) in Meltano's own
  process, for projects with no server (`state_backend.uri: chdb:///abs/dir`).

Python only supplies what Meltano needs: settings in, a transport for the SQL
the core asks for, the clock and random bytes, and Meltano's exceptions out.
Construction does no I/O (Meltano builds the backend several times per run):
the library is loaded and the settings resolved, but the connection is opened
on the first operation, and the tables are created by the first write.
"""

from __future__ import annotations

import logging
import typing as t
from contextlib import contextmanager
from urllib.parse import parse_qsl, unquote, urlparse

from meltano.core.error import MeltanoError
from meltano.core.state_store.base import MeltanoState, StateIDLockedError, StateStoreManager

from . import _native
from ._native import ChstateError, id_from_hex, id_hex

if t.TYPE_CHECKING:
    from collections.abc import Generator, Iterable

logger = logging.getLogger(__name__)


# What a user can do about each kind of failure.
_INSTRUCTIONS = {
    "UNAVAILABLE": "Check that ClickHouse is running and reachable, and the state backend's host, port and secure "
                   "settings (state_backend.uri, state_backend.clickhouse.*); no state was lost",
    "UNAUTHENTICATED": "Check state_backend.clickhouse.user and the password "
                       "(MELTANO_STATE_BACKEND_CLICKHOUSE_PASSWORD)",
    "PERMISSION_DENIED": "Grant the ClickHouse user the rights on the state schema "
                         "(CREATE, SELECT, INSERT, ALTER DELETE, DROP)",
    "INVALID_ARGUMENT": "Fix the state backend settings (state_backend.uri, state_backend.clickhouse.*)",
}


class ChstateStateBackendError(MeltanoError):
    """An operation of the chstate state backend failed; `code` says how."""

    def __init__(self, what: str, error: ChstateError, instruction: str | None = None):
        self.code = error.code
        self.message = error.message
        super().__init__(f"chstate state backend: {what} failed: {error.message.rstrip('.')} [{error.code}]",
                         instruction or _INSTRUCTIONS.get(error.code))


class ChstateSettingsError(ChstateStateBackendError):
    """The state backend settings are incomplete or invalid."""


def _millis(value: t.Any, name: str) -> int | None:
    """A setting in seconds as the core's milliseconds; None when not given
    (the core's default then applies: core/defaults.h)."""
    if value is None or value == "":
        return None
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        raise ChstateSettingsError(f"reading {name}", ChstateError("INVALID_ARGUMENT",
                                   f"{name} is {value!r}, which is not a number of seconds")) from None
    if seconds < 0:
        raise ChstateSettingsError(f"reading {name}", ChstateError("INVALID_ARGUMENT",
                                   f"{name} is {value!r}; it must not be negative"))
    return int(seconds * 1000)


def _check_store_options(options: dict, what: str) -> None:
    """Has the core check store options (names, lock settings) without I/O,
    so that a bad setting fails when the backend is made, not at the first
    STATE message."""
    try:
        _native.Store(options, transport=lambda r: {}).close()
    except ChstateError as e:
        raise ChstateSettingsError(what, e) from None


def _meltano_names(message: str) -> str:
    """The core names setting sources as chstate's command line does; the
    adapter passes Meltano's settings in that slot, so say their names."""
    message = message.replace("--uri flag", "state_backend.uri")
    for key in ("host", "port", "database", "user", "password", "secure", "schema", "table", "ca-file", "cluster",
                "zookeeper-path", "replica", "quorum"):
        message = message.replace(f"--{key} flag", f"state_backend.clickhouse.{key.replace('-', '_')}")
        message = message.replace(f"with --{key}, ", "with ")
        # The adapter does not read the generic CLICKHOUSE_* variables.
        message = message.replace(f" or CLICKHOUSE_{key.upper()}", "")
    return message


class ChstateStateStoreManager(StateStoreManager):
    """What both backends share: every StateStoreManager method as a core op."""

    _namespace = "clickhouse"  # of this backend's settings: state_backend.<namespace>.<key>

    def __init__(self, uri: str, *, lock_timeout_seconds: t.Any = None, lock_retry_seconds: t.Any = None,
                 lock_wait_seconds: t.Any = None, history_days: t.Any = None,
                 history_versions: t.Any = None, **kwargs: t.Any) -> None:
        super().__init__()
        self.uri = uri
        self._store: _native.Store | None = None
        self._transport: t.Any = None
        try:
            _native.library()  # fail early, and without I/O, when the library is missing
        except ChstateError as e:
            raise ChstateStateBackendError("loading the native library", e) from None
        self._lock_options = self._lock_settings(lock_timeout_seconds, lock_retry_seconds, lock_wait_seconds)
        self._extra_options = self._history_settings(history_days, history_versions)  # beyond the lock's

    def _history_settings(self, days: t.Any, versions: t.Any) -> dict:
        """state_backend.<scheme>.history_days and .history_versions as the
        core's store options; not given, the core's defaults apply."""
        out = {}
        for key, value in (("history_days", days), ("history_versions", versions)):
            if value is None or value == "":
                continue
            name = f"state_backend.{self._namespace}.{key}"
            try:
                number = int(str(value))
            except ValueError:
                number = -1
            if number < 0:
                raise ChstateSettingsError(f"reading {name}", ChstateError(
                    "INVALID_ARGUMENT", f"{name} is {value!r}; it must be a whole number (0: no limit)"))
            out[key] = number
        return out

    def _lock_settings(self, timeout: t.Any, retry: t.Any, wait: t.Any) -> dict:
        """Meltano's lock settings as the core's store options.

        state_backend.lock_timeout_seconds is, in Meltano's words, how long a
        lock "should be considered valid": the stale window. A holder renews
        it every third of that while it holds; a holder that died is taken
        over once its lock is that old. Waiting is bounded by
        state_backend.<scheme>.lock_wait_seconds, by default twice the window
        plus one retry: long enough to take over a dead holder's lock. Not
        given (outside Meltano), the core's defaults apply."""
        validity = _millis(timeout, "state_backend.lock_timeout_seconds")
        retry_ms = _millis(retry, "state_backend.lock_retry_seconds")
        wait_ms = _millis(wait, f"state_backend.{self._namespace}.lock_wait_seconds")
        if wait_ms is None and validity is not None:
            wait_ms = 2 * validity + (retry_ms if retry_ms is not None else 1000)
        options = {k: v for k, v in (("stale_lock_ms", validity), ("lock_retry_ms", retry_ms),
                                     ("lock_timeout_ms", wait_ms)) if v is not None}
        _check_store_options(options, "reading the lock settings")  # a window below the floor, for one
        return options

    # -- what subclasses provide --
    _cluster_options: dict = {}  # cluster mode's store options, when a cluster is named
    _hosts_options: dict = {}  # {"hosts": [{"host", "port"}, ...]}: the servers the core picks from
    schema: str
    table: str
    endpoint: str

    def _make_transport(self) -> t.Any:
        raise NotImplementedError

    # -- the core --
    def _store_handle(self) -> _native.Store:
        if self._store is None:
            self._transport = self._make_transport()
            options = {
                "schema": self.schema,
                "table": self.table,
                "endpoint": self.endpoint,
                **self._lock_options,
                **self._extra_options,
                **self._cluster_options,
                **self._hosts_options,
            }
            if "hosts" in options:
                del options["endpoint"]  # the core names the hosts itself ("h1:8123 and h2:8123")
            # The lock off the hot path: Meltano's update() takes and
            # releases the id's lock for every STATE message; the core keeps
            # it lingering between them (renewed, released when idle, when
            # another process asks for it, at close() and at exit), which
            # the background ticks make possible.
            options.setdefault("linger_locks", True)
            self._store = _native.Store(options, self._transport, background_ticks=True)
        return self._store

    def _run(self, what: str, op: dict, bad_input: str | None = None) -> dict:
        """Runs one core op; `bad_input` is what to tell the user when the
        core refuses the op's input (INVALID_ARGUMENT) rather than a setting."""
        try:
            return self._store_handle().run(op)
        except ChstateError as e:
            instruction = bad_input if e.code == "INVALID_ARGUMENT" else None
            raise ChstateStateBackendError(what, e, instruction) from None

    # -- StateStoreManager --
    @property
    def label(self) -> str:
        return f"chstate ({self.endpoint}, {self.schema}.{self.table})"

    def set(self, state: MeltanoState) -> None:
        self._run(f"writing state {state.state_id!r}", {
            "op": "set",
            "state_id_hex": id_hex(state.state_id),
            "state": {"completed": state.completed_state or {}, "partial": state.partial_state or {}},
        })

    def get(self, state_id: str) -> MeltanoState | None:
        done = self._run(f"reading state {state_id!r}", {"op": "get", "state_id_hex": id_hex(state_id)})
        found = done.get("state")
        if found is None:
            return None
        return self._state(state_id, found)

    def delete(self, state_id: str) -> None:
        self._run(f"deleting state {state_id!r}", {"op": "delete", "state_id_hex": id_hex(state_id)})

    @staticmethod
    def _state(state_id: str, sides: dict) -> MeltanoState:
        """A MeltanoState from a protocol document's {"completed", "partial"}."""
        return MeltanoState(state_id=state_id, partial_state=sides.get("partial") or {},
                            completed_state=sides.get("completed") or {})

    @staticmethod
    def _pattern(pattern: str | None) -> dict:
        return {"pattern": None} if pattern is None else {"pattern_hex": id_hex(pattern)}

    def get_state_ids(self, pattern: str | None = None) -> Iterable[str]:
        done = self._run("listing state ids", {"op": "list", **self._pattern(pattern)})
        return [id_from_hex(h) for h in done.get("state_ids_hex", [])]

    def clear_all(self) -> int:
        return int(self._run("clearing all states", {"op": "clear_all"}).get("count", 0))

    def get_all(self, pattern: str | None = None) -> Iterable[MeltanoState]:
        """`meltano state export`: one SELECT ... FINAL per page of states
        (the core's export_page), not a request per state."""
        op = {"op": "export_page", **self._pattern(pattern)}
        while True:
            done = self._run("exporting states", op)
            for entry in done["states"]:
                yield self._state(id_from_hex(entry["state_id_hex"]), entry)
            if not done.get("more") or not done["states"]:
                return
            op = {**op, "after_hex": done["states"][-1]["state_id_hex"]}

    def set_all(self, states: Iterable[MeltanoState]) -> int:
        """`meltano state import`: every state checked by the core before any
        is written, then a few multi-row INSERTs."""
        entries = [{"state_id_hex": id_hex(state.state_id), "completed": state.completed_state or {},
                    "partial": state.partial_state or {}} for state in states]
        done = self._run(f"importing {len(entries)} states", {"op": "import", "states": entries},
                         bad_input="Fix the entry named in the import document and import it again")
        return int(done["count"])

    # -- beyond Meltano's interface: the state history (README "State history") --
    def history(self, state_id: str, limit: int | None = None) -> list[dict]:
        """The versions of a state kept in its history, newest first:
        [{"version", "updated_at", "current", "state": MeltanoState}, ...]."""
        op: dict = {"op": "history", "state_id_hex": id_hex(state_id)}
        if limit is not None:
            op["limit"] = limit
        done = self._run(f"reading the history of state {state_id!r}", op, bad_input="Give a positive limit")
        return [{"version": v["version"], "updated_at": v["updated_at"], "current": v["current"],
                 "state": self._state(state_id, v["state"])}
                for v in done["versions"]]

    def rollback(self, state_id: str, version: str) -> MeltanoState:
        """Restores `version` (as history() names it) under the id's lock; the
        restored state is a new version."""
        done = self._run(f"rolling back state {state_id!r} to version {version}",
                         {"op": "rollback", "state_id_hex": id_hex(state_id), "version": version},
                         bad_input="Give a version as history() lists it")
        return self._state(state_id, done["state"])

    def migrate(self) -> None:
        """`meltano upgrade`: create the schema and tables, and remove old lock
        tombstones (the core's `init`)."""
        self._run("initialising the state tables", {"op": "init"})

    def close(self) -> None:
        if self._store is not None:
            self._store.close()
            self._store = None
        if self._transport is not None:
            self._transport.close()
            self._transport = None

    @contextmanager
    def acquire_lock(self, state_id: str, *, retry_seconds: float = 1) -> Generator[None, None, None]:
        """The per-state-id lock, valid for lock_timeout_seconds and renewed
        while held. Waits lock_retry_seconds between attempts (the setting;
        Meltano's update() always passes retry_seconds=1) and raises
        StateIDLockedError after lock_wait_seconds. Released on every exit
        path."""
        del retry_seconds  # the constructor's lock_retry_seconds is the user's setting
        sid = id_hex(state_id)
        try:
            done = self._run(f"locking state id {state_id!r}", {"op": "acquire_lock", "state_id_hex": sid})
        except ChstateStateBackendError as e:
            if e.code == "ABORTED":
                raise StateIDLockedError(e.message) from None
            raise
        lock_id = done["lock_id"]
        body_ok = False
        try:
            yield
            body_ok = True
        finally:
            try:
                self._run(f"releasing the lock on state id {state_id!r}",
                          {"op": "release_lock", "state_id_hex": sid, "lock_id": lock_id})
            except ChstateStateBackendError as e:
                if body_ok:
                    raise
                # The body's own error matters more; this one is only logged.
                logger.warning("%s", e)


class ClickhouseStateStoreManager(ChstateStateStoreManager):
    """`clickhouse://` state backend: a ClickHouse server over HTTP(S)."""

    def __init__(self, uri: str, *, host: t.Any = None, port: t.Any = None, database: t.Any = None,
                 user: t.Any = None, password: t.Any = None, secure: t.Any = None, schema: t.Any = None,
                 table: t.Any = None, ca_file: t.Any = None, cluster: t.Any = None, zookeeper_path: t.Any = None,
                 replica: t.Any = None, quorum: t.Any = None, python_locks: t.Any = None,
                 **kwargs: t.Any) -> None:
        super().__init__(uri, **kwargs)
        if python_locks not in (None, ""):
            on = str(python_locks).strip().lower()
            if on not in ("true", "false", "1", "0", "yes", "no"):
                raise ChstateSettingsError("reading state_backend.clickhouse.python_locks", ChstateError(
                    "INVALID_ARGUMENT", f"state_backend.clickhouse.python_locks is {python_locks!r}; it must be "
                    "true or false"))
            self._extra_options = {**self._extra_options, "python_locks": on in ("true", "1", "yes")}
            _check_store_options({**self._lock_options, **self._extra_options},
                                 "reading state_backend.clickhouse.python_locks")
        # Granular settings override the URI component-wise: the core's
        # precedence (flags beat the --uri flag). Meltano already folded
        # MELTANO_STATE_BACKEND_* variables into these, so env stays empty.
        flags = {"uri": uri, "host": host, "port": port, "database": database, "user": user, "password": password,
                 "secure": secure, "schema": schema, "table": table, "ca_file": ca_file, "cluster": cluster,
                 "zookeeper_path": zookeeper_path, "replica": replica,
                 "quorum": None if quorum is None else str(quorum)}
        try:
            config = _native.resolve_config(flags, env={})
        except ChstateError as e:
            raise ChstateSettingsError("reading the ClickHouse settings",
                                       ChstateError(e.code, _meltano_names(e.message))) from None
        self._config = config  # holds the password: never logged or shown
        self.schema = config["schema"]
        self.table = config["table"]
        if config.get("cluster"):
            self._cluster_options = {k: config[k] for k in ("cluster", "zookeeper_path", "replica", "quorum")}
        if config.get("hosts"):
            # Every host of a comma-separated `host` setting: the core picks
            # one for each request and the transport connects there.
            self._hosts_options = {"hosts": [{"host": h["host"], "port": h["port"]} for h in config["hosts"]]}
            # Several hosts without a cluster fail here, without I/O.
            _check_store_options({**self._cluster_options, **self._hosts_options},
                                 "reading the ClickHouse settings")
        self.redacted_uri = config["redacted_uri"]
        self.endpoint = ", ".join(f"[{h['host']}]:{h['port']}" if ":" in h["host"] else f"{h['host']}:{h['port']}"
                                  for h in config.get("hosts") or [config])

    def __repr__(self) -> str:
        return f"ClickhouseStateStoreManager({self.redacted_uri})"

    @property
    def label(self) -> str:
        return f"ClickHouse via chstate ({self.redacted_uri})"

    def _make_transport(self) -> t.Any:
        from ._http import HttpTransport

        return HttpTransport(self._config)


class ChdbStateStoreManager(ChstateStateStoreManager):
    """`chdb:///absolute/dir` state backend: embedded ClickHouse in Meltano's
    process. Optional query keys: ?schema=...&table=...; the settings
    state_backend.chdb.schema and .table win over them.
    (`chdb:///${MELTANO_PROJECT_ROOT}/.meltano/chstate` keeps it in the project.)"""

    _namespace = "chdb"

    def __init__(self, uri: str, *, schema: t.Any = None, table: t.Any = None, **kwargs: t.Any) -> None:
        super().__init__(uri, **kwargs)
        parsed = urlparse(uri)

        def bad(message: str) -> ChstateSettingsError:
            return ChstateSettingsError("reading state_backend.uri", ChstateError("INVALID_ARGUMENT", message))

        if parsed.scheme != "chdb":
            raise bad(f"the chdb backend needs a chdb:// URI, not {parsed.scheme}://")
        if parsed.netloc:
            raise bad(f"chdb:// URIs name a local directory with an absolute path, as in chdb:///var/lib/meltano/"
                      f"state, so the part after chdb:// must start with '/' (got host {parsed.netloc!r})")
        path = unquote(parsed.path)
        if not path.startswith("/"):
            raise bad("chdb:// URIs need an absolute directory path, as in chdb:///var/lib/meltano/state")
        if parsed.fragment:
            raise bad("chdb:// URIs take no '#' fragment")
        query: dict = {}
        for key, value in parse_qsl(parsed.query, keep_blank_values=True, strict_parsing=False):
            if key not in ("schema", "table") or key in query:
                raise bad(f"unknown or repeated key {key!r} in the chdb:// URI query; expected schema and table")
            query[key] = value
        self.path = path
        self.schema = schema or query.get("schema") or "meltano"
        self.table = table or query.get("table") or "state"
        self.endpoint = f"chdb:{path}"
        # Identifiers are validated by the core when the store is made; make
        # that happen now, without I/O, so a bad name fails at construction.
        _check_store_options({"schema": self.schema, "table": self.table}, "reading the chdb state backend settings")

    def __repr__(self) -> str:
        return f"ChdbStateStoreManager(chdb://{self.path})"

    @property
    def label(self) -> str:
        return f"chDB via chstate (chdb://{self.path}, {self.schema}.{self.table})"

    def _make_transport(self) -> t.Any:
        from ._chdb import ChdbTransport

        return ChdbTransport(self.path)


__all__ = ["ChdbStateStoreManager", "ChstateStateBackendError", "ChstateStateStoreManager",
           "ClickhouseStateStoreManager"]
