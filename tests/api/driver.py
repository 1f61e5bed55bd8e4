"""Replays tests/api/scenarios.json through one Python host's PUBLIC API and
prints the transcript (one normalised result per step) as JSON.

    python3 driver.py HOST SCHEMA_PREFIX     # HOST: meltano | wasmtime | extism | cli

meltano runs in Meltano's venv (the adapter as Meltano loads it:
chstate_meltano.backend.ClickhouseStateStoreManager); meltano-wasm is the same
adapter installed from the pure wheel, running the core as chstate.wasm on
wasmtime (the driver checks which core it chose); wasmtime and extism are
hosts/wasi/chstate_wasmtime.py and chstate_extism.py (their open()); cli is
the chstate command (one process per step, --json). Settings come from the
environment the test sets: CHSTATE_API_URI (no password), CHSTATE_API_PASSWORD,
CHSTATE_CLI (the command, also the lock contender), CHSTATE_WASM,
CHSTATE_EXTISM_WASM.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
SCENARIOS = json.loads((HERE / "scenarios.json").read_text())
URI = os.environ["CHSTATE_API_URI"]
PASSWORD = os.environ.get("CHSTATE_API_PASSWORD", "")
CLI = os.environ["CHSTATE_CLI"]


# ---- what the scenarios say, in Python values ----

def arg(value):
    """{"repeat": s, "times": n} is a long string; anything else as written."""
    if isinstance(value, dict) and set(value) == {"repeat", "times"}:
        return value["repeat"] * value["times"]
    return value


def uri_with(query: str | None) -> str:
    if not query:
        return URI
    return URI + ("&" if "?" in URI else "?") + query


def origin_class(origin: str) -> str:
    if origin == "default":
        return "default"
    if origin.startswith(("MELTANO_STATE_BACKEND_", "CLICKHOUSE_")):
        return "env"
    return "setting"


def settings_view(settings: dict, keys: list) -> dict:
    """Each setting's resolved value (as the core writes it) and the kind of
    place it came from."""
    return {key: [settings["values"][key], origin_class(settings["origin"][key])] for key in keys}


def normal(verb: str, result):
    """A verb's result as the transcript holds it (the same in every host)."""
    if verb in ("get", "set", "merge", "rollback"):
        return None if result is None else result["merged"]
    if verb in ("delete", "copy", "move"):
        return None
    if verb in ("ping", "init", "compact"):
        return "dialect" if result.get("dialect") else result
    if verb == "export":
        if len(result) == 3:  # document=True: the entries' text, more, the ids
            document, more, ids = result
            return {"ids": ids, "more": more, "entries": json.loads("{" + document + "}")}
        states, more = result
        return {"ids": [s["state_id"] for s in states], "more": more}
    if verb == "history":
        return [v["state"]["merged"] for v in result]
    if verb == "locks":
        return [lock["state_id"] for lock in result]
    if verb == "unlock":
        return result[0]["state_id"]
    if verb == "renew":
        return "renewed"
    return result


# ---- the contender: another process wanting the lock (the CLI) ----

def contender(state_id: str, wait_s: float, settings: dict) -> subprocess.Popen:
    """The CLI in the scope's schema, with the scope's validity: were the
    scope's lock not renewed, it would be stale to this contender in time."""
    args = [CLI, "--uri", URI, "--schema", settings["schema"], "--stale-lock",
            str(settings.get("lock_timeout_seconds", 10)), "--lock-timeout", str(wait_s), "lock", "--", state_id, "true"]
    return subprocess.Popen(args, env=dict(os.environ, MELTANO_STATE_BACKEND_CLICKHOUSE_PASSWORD=PASSWORD),
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def contender_outcome(proc: subprocess.Popen) -> str:
    code = proc.wait(timeout=60)
    return {0: "acquired", 4: "not acquired"}.get(code, f"exit {code}: {proc.stderr.read().decode()[-300:]}")


# ---- the hosts ----

class BindingHost:
    """wasmtime and extism: open(uri, password=..., **settings) and the
    binding's methods (snake_case, keywords for named options)."""

    def __init__(self, module):
        self.module = module

    def open(self, settings: dict):
        query = settings.pop("uri_query", None)
        return self.module.open(uri_with(query), password=PASSWORD, env={}, **settings,
                                **({"wasm": WASM} if WASM else {}))

    def call(self, store, verb, args, named):
        name = {"import": "import_"}.get(verb, verb)
        kw = {{"from": "from_"}.get(k, k): v for k, v in named.items()}
        return getattr(store, name)(*args, **kw)

    def scope(self, store, state_id):
        return store.lock(state_id)

    def settings(self, store):
        return store.settings

    def close(self, store):
        store.close()


class MeltanoHost:
    """The adapter as Meltano builds it (state_backend.* settings as keyword
    arguments); Meltano's StateStoreManager methods where Meltano names the
    verb, the adapter's own for the others."""

    def open(self, settings: dict):
        from chstate_meltano.backend import ClickhouseStateStoreManager

        query = settings.pop("uri_query", None)
        manager = ClickhouseStateStoreManager(uri_with(query), password=PASSWORD, **settings)
        return manager

    def call(self, m, verb, args, named):
        from meltano.core.state_store.base import MeltanoState

        def state(s):
            return None if s is None else {"merged": json.loads(s.json_merged())}

        if verb == "get":
            return state(m.get(*args))
        if verb == "set":
            m.set(MeltanoState(state_id=args[0], completed_state=args[1], partial_state=named.get("partial") or {}))
            return state(m.get(args[0]))
        if verb == "delete":
            return m.delete(*args)
        if verb == "list":
            return sorted(m.get_state_ids(*args))
        if verb == "clear_all":
            return m.clear_all()
        if verb == "export":
            states = list(m.get_all(*args))
            if named.get("document"):  # get_all is Meltano's, whatever the page's form: its states as entries
                entries = {s.state_id: {"completed": s.completed_state, "partial": s.partial_state} for s in states}
                return json.dumps(entries)[1:-1], False, [s.state_id for s in states]
            return [{"state_id": s.state_id} for s in states], False
        if verb == "import":
            return m.set_all(MeltanoState(state_id=e["state_id"], completed_state=e["completed"],
                                          partial_state=e["partial"]) for e in args[0])
        if verb in ("history", "rollback"):
            # The adapter's history and rollback speak MeltanoState, as Meltano does.
            got = getattr(m, verb)(*args, **named)
            if verb == "rollback":
                return state(got)
            return [{"state": state(v["state"])} for v in got]
        kw = {{"from": "from_"}.get(k, k): v for k, v in named.items()}
        return getattr(m, verb)(*args, **kw)

    def scope(self, m, state_id):
        return m.acquire_lock(state_id, retry_seconds=1)

    def settings(self, m):
        return m.settings

    def close(self, m):
        m.close()


class CliHost:
    """The chstate command: one process per step, --json, settings as flags."""

    FLAGS: dict = {}

    def open(self, settings: dict):
        query = settings.pop("uri_query", None)
        flags = ["--uri", uri_with(query)]
        for key, value in settings.items():
            # A key that is no setting becomes the flag it would be (--colour).
            flags += [f"--{self.FLAGS.get(key, key.replace('_', '-'))}", str(value)]
        out = self.run(flags, ["ping"])  # settings errors come out before any request
        if "error" in out and out["error"]["code"] == "INVALID_ARGUMENT":
            raise HostError("INVALID_ARGUMENT")
        return flags

    def run(self, flags, words, stdin=None):
        proc = subprocess.run([CLI, "--json", *flags, *words], input=stdin, capture_output=True, text=True,
                              env=dict(os.environ, MELTANO_STATE_BACKEND_CLICKHOUSE_PASSWORD=PASSWORD))
        if words and words[0] == "export" and proc.returncode == 0:
            return json.loads(proc.stdout)  # Meltano's export document, on several lines
        lines = [line for line in proc.stdout.splitlines() if line.strip()]
        return json.loads(lines[-1]) if lines else {}

    def call(self, flags, verb, args, named):
        words = {"delete": ["clear"], "clear_all": ["clear", "--all"], "import_document": ["import"]}.get(verb, [verb])
        stdin = None
        if verb in ("set", "merge") and len(args) > 1:
            words += ["--", args[0], json.dumps(args[1])]
        elif verb == "list" or verb == "locks" or verb == "export":
            words += ["--pattern", args[0]] if args else []
        elif verb == "import":
            stdin = json.dumps({e["state_id"]: {"completed": e["completed"], "partial": e["partial"]} for e in args[0]})
        elif verb == "import_document":  # chstate import reads the document's text as it is
            stdin = args[0]
        else:
            words += ["--", *args] if args else []
        if named.get("force"):
            words.insert(1, "--force")
        if "from" in named:
            words[1:1] = ["--from-state-id", named["from"]]
        if "limit" in named:
            words[1:1] = ["--limit", str(named["limit"])]
        if verb == "unlock":
            words.insert(1, "--force")
        out = self.run(flags, words, stdin)
        if isinstance(out, dict) and "error" in out:
            if verb == "get" and out["error"]["code"] == "NOT_FOUND":
                # The CLI reports get's null (no state) as exit status 3, as
                # documented for scripts; the core's get never fails so.
                return None
            raise HostError(out["error"]["code"])
        if verb in ("get", "set", "merge", "rollback"):
            return out if out else None
        if verb == "list":
            return out["state_ids"]
        if verb == "clear_all":
            return out["cleared"]
        if verb in ("import", "import_document"):
            return out["imported"]
        if verb == "export":
            if named.get("document"):  # the command's output is the document itself
                return json.dumps(out)[1:-1], False, list(out)
            return [{"state_id": k} for k in sorted(out)], False
        if verb == "history":
            return [{"state": {"merged": v["state"]}} for v in out]
        if verb == "unlock":
            return [out]
        return out

    def scope(self, flags, state_id):
        return CliScope(self, flags, state_id)

    def settings(self, flags):
        return self.run(flags, ["settings"])["settings"]

    def close(self, flags):
        pass


class CliScope:
    """`chstate lock ID -- COMMAND`: the scope is the command's run; it holds
    the lock from when it creates its flag file until it exits."""

    def __init__(self, host, flags, state_id, hold_s: float = 0):
        self.host, self.flags, self.state_id, self.hold_s = host, flags, state_id, hold_s

    def __enter__(self):
        flag = Path(os.environ.get("TMPDIR", "/tmp")) / f"chstate-api-{os.getpid()}-{time.monotonic_ns()}"
        script = f"touch {flag}; sleep {self.hold_s}"
        self.proc = subprocess.Popen([CLI, *self.flags, "lock", "--", self.state_id, "sh", "-c", script],
                                     env=dict(os.environ, MELTANO_STATE_BACKEND_CLICKHOUSE_PASSWORD=PASSWORD),
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        deadline = time.monotonic() + 30
        while not flag.exists():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise HostError("ABORTED")
            time.sleep(0.02)
        flag.unlink()
        return self

    def __exit__(self, *exc):
        code = self.proc.wait(timeout=120)
        if code != 0 and exc[0] is None:
            raise HostError({4: "ABORTED", 7: "ABORTED", 5: "UNAVAILABLE"}.get(code, f"exit {code}"))


class HostError(Exception):
    def __init__(self, code: str):
        super().__init__(code)
        self.code = code


def error_code(e: BaseException) -> str:
    return getattr(e, "code", None) or type(e).__name__


# ---- the replay ----

def replay(host_name: str, host, prefix: str) -> list:
    transcript = []
    for n, scenario in enumerate(SCENARIOS["scenarios"]):
        entry = {"scenario": scenario["name"], "steps": []}
        transcript.append(entry)
        settings = {"schema": f"{prefix}_{n}", **scenario.get("open", {})}
        try:
            store = host.open(dict(settings))
            entry["open"] = {"ok": None}
        except Exception as e:  # noqa: BLE001 - the transcript records what the host raised
            entry["open"] = {"error": error_code(e)}
            continue
        try:
            run_steps(host_name, host, store, scenario["steps"], entry["steps"], settings)
        finally:
            host.close(store)
    return transcript


def run_steps(host_name, host, store, steps, out, settings):
    for step in steps:
        if host_name in step.get("skip_hosts", {}):
            out.append({"skipped": step["skip_hosts"][host_name]})
            continue
        if "scope" in step:
            out.append(run_scope(host_name, host, store, step, settings))
            continue
        if "settings" in step:
            out.append({"ok": settings_view(host.settings(store), step["settings"])})
            continue
        args = [arg(a) for a in step.get("args", [])]
        try:
            result = host.call(store, step["verb"], args, step.get("named", {}))
            out.append({"ok": normal(step["verb"], result)})
        except Exception as e:  # noqa: BLE001
            out.append({"error": error_code(e)})


def run_scope(host_name, host, store, step, settings):
    inner: list = []
    record: dict = {}
    idle = step.get("idle_seconds", 0)
    try:
        if isinstance(host, CliHost):
            scope = CliScope(host, store, step["scope"], hold_s=idle)
        else:
            scope = host.scope(store, step["scope"])
        with scope:
            proc = (contender(step["scope"], step["contender_wait_seconds"], settings)
                    if "contender_wait_seconds" in step else None)
            if not isinstance(host, CliHost):
                time.sleep(idle)
            run_steps(host_name, host, store, step["steps"], inner, settings)
            if proc is not None:
                record["contender"] = contender_outcome(proc)
        result = {"ok": ({"contender": record["contender"]} if "contender" in record else None)}
    except Exception as e:  # noqa: BLE001
        result = {"error": error_code(e), **record}
    if inner:
        result["steps"] = inner
    return result


def main() -> int:
    global WASM, CONTENDER_URI
    host_name, prefix = sys.argv[1], sys.argv[2]
    CONTENDER_URI = URI
    WASM = None
    if host_name in ("meltano", "meltano-wasm"):
        # meltano-wasm: the pure wheel's adapter, which must be running the module.
        from chstate_meltano import _core

        kind = _core.chosen().kind
        if kind != ("wasm" if host_name == "meltano-wasm" else "native"):
            raise SystemExit(f"{host_name}: the adapter chose the {kind} core")
        host = MeltanoHost()
    elif host_name in ("wasmtime", "extism"):
        sys.path.insert(0, str(REPO / "hosts" / "wasi"))
        import importlib

        host = BindingHost(importlib.import_module("chstate_wasmtime" if host_name == "wasmtime" else "chstate_extism"))
        WASM = os.environ["CHSTATE_WASM" if host_name == "wasmtime" else "CHSTATE_EXTISM_WASM"]
    elif host_name == "cli":
        # Each setting's flag, from the core's settings table.
        sys.path.insert(0, str(REPO / "hosts" / "python"))
        from chstate_meltano import _native

        host = CliHost()
        CliHost.FLAGS = {row["key"]: row["cli_flag"][2:] for row in _native.settings_table()["settings"]}
    else:
        raise SystemExit(f"unknown host {host_name}")
    print(json.dumps(replay(host_name, host, prefix), ensure_ascii=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
