"""Meltano state backends (entry-point group `meltano.state_backends`) whose
state logic is chstate's C++ core:

* `clickhouse` -> ClickhouseStateStoreManager: a ClickHouse server over HTTP(S)
  (`state_backend.uri: clickhouse://user@host:8123/default`);
* `chdb` -> ChdbStateStoreManager: embedded ClickHouse (chDB) in Meltano's own
  process, for projects with no server (`state_backend.uri: chdb:///abs/dir`).

Python only supplies what Meltano needs: its settings passed to the core as
they are, a transport for the SQL the core asks for, the clock and random
bytes (chstate_meltano.binding pumps the core), and Meltano's exceptions out.
Construction does no I/O (Meltano builds the backend several times per run):
the library is loaded and the settings resolved, but the connection is opened
on the first operation, and the tables are created by the first write.
"""

from __future__ import annotations

import json
import logging
import typing as t
from contextlib import contextmanager

from meltano.core.error import MeltanoError
from meltano.core.state_store.base import MeltanoState, StateIDLockedError, StateStoreManager

from . import _core
from .binding import ChstateError, Store, bind_verbs

if t.TYPE_CHECKING:
    from collections.abc import Generator, Iterable

logger = logging.getLogger(__name__)
# What the store tells beside its results (docs/diagnostics.md): a wait for a
# lock another process holds, a request sent again, a host marked down (info),
# a lease lost (warning), each statement with its time (debug). Meltano's log
# level is this logger's (it configures the root logger), so `meltano
# --log-level=debug ...` shows the statements, with states' contents redacted.
events_logger = logging.getLogger("chstate_meltano")


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


# The verbs Meltano's StateStoreManager has its own names for (below); the
# others (merge, copy, move, history, rollback, locks, unlock, compact, ping)
# are the binding's methods, reached through the manager as they are.
_MELTANO_NAMES = {"get", "set", "delete", "list", "clear_all", "export", "import_", "history", "rollback"}


class ChstateStateStoreManager(StateStoreManager):
    """What both backends share: every StateStoreManager method as a verb of
    the core (core/verbs.h), through the Python binding (binding.py).

    Meltano passes every state_backend.* setting of this backend's namespace
    as a keyword; they go to the core as they are, which resolves them
    (units, defaults, checks) as in every other runtime. Construction does no
    I/O (Meltano builds the backend several times per run): the settings are
    checked, but the connection is opened on the first operation."""

    _namespace = "clickhouse"  # of this backend's settings: state_backend.<namespace>.<key>

    def __init__(self, uri: str, **kwargs: t.Any) -> None:
        super().__init__()
        self.uri = uri
        # Meltano's DECIMAL settings arrive as decimal.Decimal: the core reads text.
        self._values = {"uri": uri, **{k: (v if isinstance(v, (str, int, float, bool)) else str(v))
                                       for k, v in kwargs.items() if v is not None and v != ""}}
        self._store: Store | None = None
        try:
            # The native library, else the same core as a WebAssembly module
            # ($CHSTATE_CORE chooses; _core.py). Fails early, and without I/O,
            # when neither is there.
            self._core = _core.chosen()
        except ChstateError as e:
            raise ChstateStateBackendError("loading the chstate core", e) from None
        try:
            # The core resolves them now, without I/O: a bad setting fails
            # when the backend is made, not at the first STATE message.
            self._settings = self._core.resolve_settings({"from": "meltano", "values": self._values, "env": {},
                                                       "host": {"timers": True, "exit_release": True}})
        except ChstateError as e:
            raise ChstateSettingsError("reading the state backend settings", e) from None
        connection = self._settings["connection"]
        self.redacted_uri = connection["redacted_uri"]
        self.endpoint = connection["endpoint"]
        self.schema = self._settings["store"]["schema"]
        self.table = self._settings["store"]["table"]

    def _make_transport(self) -> t.Any:
        from ._http import HttpTransport

        return HttpTransport(self._settings["connection"])

    # -- the core --
    def _store_handle(self) -> Store:
        if self._store is None:
            try:
                # The level asked of the core is the one the logger is enabled for now.
                # Which core runs: at info when it is the slower WebAssembly one.
                events_logger.log(logging.INFO if self._core.kind == "wasm" else logging.DEBUG,
                                  "chstate runs %s", self._core.describe())
                self._store = Store(self._core.make(), self._values, env={}, source="meltano",
                                    transport=self._make_transport(), logger=events_logger)
            except ChstateError as e:
                raise ChstateStateBackendError("opening the state store", e) from None
        return self._store

    def _run(self, what: str, call: t.Callable[[Store], t.Any], bad_input: str | None = None) -> t.Any:
        """Runs one verb; `bad_input` is what to tell the user when the core
        refuses the input (INVALID_ARGUMENT) rather than a setting."""
        try:
            return call(self._store_handle())
        except ChstateError as e:
            instruction = bad_input if e.code == "INVALID_ARGUMENT" else None
            raise ChstateStateBackendError(what, e, instruction) from None

    def __getattr__(self, name: str) -> t.Any:
        """The verbs Meltano has no name for, as the binding's methods."""
        if name.startswith("_") or name in _MELTANO_NAMES:
            raise AttributeError(name)
        bind_verbs(self._core.make())
        if not hasattr(Store, name):
            raise AttributeError(name)
        method = getattr(Store, name)
        if not callable(method) or name in ("run", "close", "lock"):
            raise AttributeError(name)

        def verb(*args: t.Any, **kwargs: t.Any) -> t.Any:
            return self._run(name.replace("_", " ").strip(), lambda s: method(s, *args, **kwargs),
                             bad_input=f"Fix the arguments of {name}")

        return verb

    # -- StateStoreManager --
    @property
    def label(self) -> str:
        return f"chstate ({self.endpoint}, {self.schema}.{self.table})"

    def set(self, state: MeltanoState) -> None:
        # Meltano's set() writes both sides as given (its CLI checks input
        # itself): the verb with force. Under update()'s acquire_lock it runs
        # under that lock; alone it takes the id's lock for the write.
        self._run(f"writing state {state.state_id!r}",
                  lambda s: s.set(state.state_id, state.completed_state or {}, partial=state.partial_state or {},
                                  force=True))

    def get(self, state_id: str) -> MeltanoState | None:
        found = self._run(f"reading state {state_id!r}", lambda s: s.get(state_id))
        if found is None:
            return None
        return MeltanoState(state_id=state_id, partial_state=found["partial"], completed_state=found["completed"])

    def delete(self, state_id: str) -> None:
        self._run(f"deleting state {state_id!r}", lambda s: s.delete(state_id))

    def get_state_ids(self, pattern: str | None = None) -> Iterable[str]:
        return self._run("listing state ids", lambda s: s.list(pattern))

    def clear_all(self) -> int:
        return self._run("clearing all states", lambda s: s.clear_all())

    def get_all(self, pattern: str | None = None) -> Iterable[MeltanoState]:
        """`meltano state export`: the core's export, a page at a time, each
        page the text of its entries in Meltano's export document (the core
        writes it from the stored columns; one json.loads reads it)."""
        after = None
        while True:
            document, more, ids = self._run("exporting states",
                                            lambda s: s.export(pattern, after=after, document=True))
            for state_id, st in json.loads("{" + document + "}").items():
                yield MeltanoState(state_id=state_id, partial_state=st["partial"], completed_state=st["completed"])
            if not more or not ids:
                return
            after = ids[-1]

    def set_all(self, states: Iterable[MeltanoState]) -> int:
        """`meltano state import`: the states as an export document's text,
        which the core reads in one pass and checks whole before any is
        written, then a few multi-row INSERTs."""
        states = states if isinstance(states, list) else list(states)
        document = {st.state_id: {"completed": st.completed_state or {}, "partial": st.partial_state or {}}
                    for st in states}
        fix = "Fix the entry named in the import document and import it again"
        if len(document) != len(states):
            # An id twice: the entries' import refuses it, naming both.
            entries = [{"state_id": st.state_id, "completed": st.completed_state or {},
                        "partial": st.partial_state or {}} for st in states]
            return self._run(f"importing {len(entries)} states", lambda s: s.import_(entries), bad_input=fix)
        # Keys sorted, as the core stores them, so it copies each side as it reads it.
        text = json.dumps(document, separators=(",", ":"), sort_keys=True)
        del document
        return self._run(f"importing {len(states)} states", lambda s: s.import_document(text), bad_input=fix)

    # -- the state history, in Meltano's terms (docs/meltano.md "History, and the rest of the API") --
    def history(self, state_id: str, limit: int | None = None) -> list[dict]:
        """The versions of a state kept in its history, newest first:
        [{"version", "updated_at", "current", "state": MeltanoState}, ...]."""
        versions = self._run(f"reading the history of state {state_id!r}",
                             lambda s: s.history(state_id, limit=limit), bad_input="Give a positive limit")
        return [{"version": v["version"], "updated_at": v["updated_at"], "current": v["current"],
                 "state": MeltanoState(state_id=state_id, partial_state=v["state"]["partial"],
                                       completed_state=v["state"]["completed"])} for v in versions]

    def rollback(self, state_id: str, version: str) -> MeltanoState:
        """Restores `version` (as history() names it) under the id's lock; the
        restored state is a new version."""
        st = self._run(f"rolling back state {state_id!r} to version {version}", lambda s: s.rollback(state_id, version),
                       bad_input="Give a version as history() lists it")
        return MeltanoState(state_id=state_id, partial_state=st["partial"], completed_state=st["completed"])

    @property
    def settings(self) -> dict:
        """What the core resolved from Meltano's settings (the password left
        out): {"connection", "store", "origin"}."""
        connection = {k: v for k, v in self._settings["connection"].items() if k != "password"}
        return {**self._settings, "connection": connection}

    def migrate(self) -> None:
        """`meltano upgrade`: create the schema and tables, apply retention."""
        self._run("initialising the state tables", lambda s: s.init())

    def close(self) -> None:
        if self._store is not None:
            self._store.close()
            self._store = None

    @contextmanager
    def acquire_lock(self, state_id: str, *, retry_seconds: float = 1) -> Generator[None, None, None]:
        """The state id's lock scope: valid for lock_timeout_seconds and
        renewed while held, waiting lock_retry_seconds between attempts (the
        setting; Meltano's update() always passes retry_seconds=1) and raising
        StateIDLockedError after lock_wait_seconds. Released on every exit
        path; a lock lost while the block ran fails it."""
        del retry_seconds  # the settings' lock_retry_seconds is the user's
        store = self._store_handle()
        scope = store.lock(state_id)
        try:
            scope.__enter__()
        except ChstateError as e:
            if e.code == "ABORTED":
                raise StateIDLockedError(e.message) from None
            raise ChstateStateBackendError(f"locking state id {state_id!r}", e) from None
        body_ok = False
        try:
            yield
            body_ok = True
        finally:
            try:
                scope.__exit__(None, None, None)
            except ChstateError as e:
                error = ChstateStateBackendError(f"releasing the lock on state id {state_id!r}", e)
                if body_ok:
                    raise error from None
                # The body's own error matters more; this one is only logged.
                logger.warning("%s", error)


class ClickhouseStateStoreManager(ChstateStateStoreManager):
    """`clickhouse://` state backend: a ClickHouse server over HTTP(S)."""

    def __repr__(self) -> str:
        return f"ClickhouseStateStoreManager({self.redacted_uri})"

    @property
    def label(self) -> str:
        return f"ClickHouse via chstate ({self.redacted_uri})"


class ChdbStateStoreManager(ChstateStateStoreManager):
    """`chdb:///absolute/dir` state backend: embedded ClickHouse in Meltano's
    process. The URI's ?schema=&table= and the settings state_backend.chdb.*
    are the core's to resolve (the settings win).
    (`chdb:///${MELTANO_PROJECT_ROOT}/.meltano/chstate` keeps it in the project.)"""

    _namespace = "chdb"

    def __init__(self, uri: str, **kwargs: t.Any) -> None:
        super().__init__(uri, **kwargs)
        self.path = self._settings["connection"]["chdb_path"]

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
