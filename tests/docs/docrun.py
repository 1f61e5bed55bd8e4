#!/usr/bin/env python3
"""Runs the code blocks of README.md and docs/*.md the way the pages say to run them.

Every fenced block of a page is one of:

- a shell block (```sh): run with bash from the checkout's root, in order, each
  block in the environment and folder the page's earlier blocks left (`set -e`:
  a failing command fails the page);
- a code block (```python, ```lua, ```js, ```yaml, ```nginx, ...) preceded by
  `<!-- doc-test: file PATH -->` (or `append to PATH`): written to PATH, in the
  folder the page's shell is in at that point, where a later shell block runs it
  (the page says how: `python3 example.py`, `node index.mjs`, `meltano ...`);
  or by `<!-- doc-test: the content of PATH -->`: it must be that file of the
  checkout as it is, which a later shell block runs;
- `<!-- doc-test: output of the block above -->` before a ```text block: the
  previous shell block's standard output must be that text (a line `...` stands
  for any lines, and `...` inside a line for any text);
- `<!-- not runnable: REASON -->` before a block: not run, and the reason is
  counted (a package-index install that needs publishing is the expected case);
- any other ```text block (or a block with no language): an illustration, not code.

A code block with none of these is an error: every example runs or says why not.

The pages speak of a server `clickhouse://meltano@clickhouse.internal:8123/...`
whose password is `'...'`; the runner stands its own server in for it (the
CHSTATE_TEST_* variables tools/test sets: ClickHouse 18.16), by these
replacements in every block, reversed in the output it compares:

  meltano@clickhouse.internal:8123             -> USER@HOST:PORT of CHSTATE_TEST_*
  MELTANO_STATE_BACKEND_CLICKHOUSE_PASSWORD='...'  -> the real password
  127.0.0.1:8080                               -> a free loopback port (a server a page starts)

Each page runs in a clean environment (no MELTANO_*, CLICKHOUSE_* or CHSTATE_*
variable) and TMPDIR a folder removed after it, with the real HOME (Bazel's cache and
~/.bazelrc live there). A page
must leave the checkout as clean as it found it (files ignored by git aside), and
the processes it starts are stopped at its end (found by a token in their
environment) if the page did not stop them itself.

  python3 tests/docs/docrun.py [PAGE ...]     # with CHSTATE_TEST_* set (tools/clickhouse_server.py)
  python3 tests/docs/docrun.py --list         # the blocks and what the runner does with each
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import re
import shlex
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tools"))
from clickhouse_server import free_port  # noqa: E402  (below the ephemeral range)
FENCE = re.compile(r"^(`{3,})([A-Za-z0-9_+-]*)[^\n]*$")
DIRECTIVE = re.compile(r"^<!--\s*(not runnable|doc-test)\s*:\s*(.*?)\s*-->$")
SHELL = {"sh", "bash", "shell"}
TEXT = {"text", ""}
BLOCK_TIMEOUT = 900
# Pages the doc test leaves out, each with why.
EXCLUDED: dict = {}


@dataclasses.dataclass
class Block:
    page: str
    line: int  # of the opening fence
    lang: str
    code: str
    kind: str  # shell, file, append, output, not-runnable, text
    arg: str = ""  # the file's path, the reason, or the output's options

    def where(self) -> str:
        return f"{self.page}:{self.line}"


class DocError(Exception):
    pass


def pages(root: Path = REPO) -> list[Path]:
    """Every page the doc test runs (EXCLUDED aside)."""
    every = [root / "README.md", *sorted((root / "docs").glob("*.md")), *sorted((root / "hosts").glob("*/README.md"))]
    return [p for p in every if str(p.relative_to(root)) not in EXCLUDED]


def parse(path: Path, root: Path = REPO) -> list[Block]:
    """The page's fenced blocks, each with what the runner does with it."""
    rel = str(path.relative_to(root))
    lines = path.read_text().splitlines()
    blocks: list[Block] = []
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        ticks, lang = m.group(1), m.group(2).lower()
        start = i
        body = []
        i += 1
        while i < len(lines) and lines[i].rstrip() != ticks:
            body.append(lines[i])
            i += 1
        if i == len(lines):
            raise DocError(f"{rel}:{start + 1}: a ``` block is never closed")
        i += 1
        code = "\n".join(body) + "\n"
        directive = DIRECTIVE.match(lines[start - 1].strip()) if start > 0 else None
        if directive and directive.group(1) == "not runnable":
            kind, arg = "not-runnable", directive.group(2)
            if not arg:
                raise DocError(f"{rel}:{start + 1}: `not runnable` needs a reason")
        elif directive:
            what = directive.group(2)
            if what.startswith("file "):
                kind, arg = "file", what[5:].split(",")[0].strip()
            elif what.startswith("append to "):
                kind, arg = "append", what[10:].split(",")[0].strip()
            elif what.startswith("the content of "):
                kind, arg = "content", what[len("the content of "):].split(",")[0].strip()
            elif what.startswith("output of the block above"):
                kind, arg = "output", what
            else:
                raise DocError(f"{rel}:{start + 1}: unknown doc-test directive {what!r}")
        elif lang in SHELL:
            kind, arg = "shell", ""
        elif lang in TEXT:
            kind, arg = "text", ""
        else:
            raise DocError(f"{rel}:{start + 1}: a ```{lang} block that is neither run (`<!-- doc-test: file PATH -->`, "
                           "run by a later shell block) nor marked `<!-- not runnable: REASON -->`")
        blocks.append(Block(rel, start + 1, lang, code, kind, arg))
    for n, b in enumerate(blocks):
        if b.kind in ("file", "append", "content"):
            later = [x for x in blocks[n + 1:] if x.kind == "shell"]
            name = Path(b.arg).name
            used = any(name in x.code for x in later)
            if name == "meltano.yml":
                used = any(re.search(r"(^|\s)meltano\s", x.code, re.M) for x in later)
            if not used:
                raise DocError(f"{b.where()}: {b.arg} is written but no later shell block of the page runs it")
        if b.kind == "output" and (n == 0 or blocks[n - 1].kind != "shell"):
            raise DocError(f"{b.where()}: an output block must follow the shell block whose output it is")
    return blocks


# ---- the server the pages' examples stand for --------------------------------

@dataclasses.dataclass
class Server:
    host: str
    port: int
    user: str
    password: str

    @classmethod
    def from_env(cls) -> "Server":
        missing = [k for k in ("CHSTATE_TEST_HOST", "CHSTATE_TEST_PORT", "CHSTATE_TEST_USER") if not os.environ.get(k)]
        if missing:
            raise DocError("no server: set CHSTATE_TEST_* (tools/clickhouse_server.py start DIR prints them)")
        return cls(os.environ["CHSTATE_TEST_HOST"], int(os.environ["CHSTATE_TEST_PORT"]),
                   os.environ["CHSTATE_TEST_USER"], os.environ.get("CHSTATE_TEST_PASSWORD", ""))

    def sql(self, sql: str) -> str:
        request = urllib.request.Request(f"http://{self.host}:{self.port}/", data=sql.encode(),
                                         headers={"X-ClickHouse-User": self.user, "X-ClickHouse-Key": self.password})
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.read().decode()



def replacements(server: Server, web_port: int) -> list[tuple[str, str]]:
    return [
        ("meltano@clickhouse.internal:8123", f"{server.user}@{server.host}:{server.port}"),
        ("MELTANO_STATE_BACKEND_CLICKHOUSE_PASSWORD='...'",
         f"MELTANO_STATE_BACKEND_CLICKHOUSE_PASSWORD={shlex.quote(server.password)}"),
        ("127.0.0.1:8080", f"127.0.0.1:{web_port}"),
    ]


def substitute(text: str, pairs: list[tuple[str, str]]) -> str:
    for old, new in pairs:
        text = text.replace(old, new)
    return text


def unsubstitute(text: str, pairs: list[tuple[str, str]], server: Server) -> str:
    text = text.replace(f"{server.user}:***@{server.host}:{server.port}", "meltano:***@clickhouse.internal:8123")
    text = text.replace(f"{server.user}@{server.host}:{server.port}", "meltano@clickhouse.internal:8123")
    for old, new in pairs[2:]:
        text = text.replace(new, old)
    return text


def output_matches(expected: str, actual: str) -> bool:
    """`...` alone on a line: any lines; `...` in a line: any text."""
    parts = []
    for line in expected.rstrip("\n").split("\n"):
        if line.strip() == "...":
            parts.append(r"(?:.*\n)*?")
        else:
            parts.append(".*".join(re.escape(p) for p in line.split("...")) + r"\n")
    return re.fullmatch("".join(parts), actual.rstrip("\n") + "\n") is not None


# ---- running a page ------------------------------------------------------------

PRELUDE = """set -eo pipefail
source {state}/env.sh
cd "$(cat {state}/cwd)"
trap 'declare -p | grep -Ev "{skip}" > {state}/env.sh; pwd > {state}/cwd' EXIT
"""


# Shell variables a block leaves for the next ones, all but bash's own.
SKIP_VARIABLES = ("^declare -[a-zA-Z-]*r|^declare -[a-zA-Z-]* (BASH[A-Z_]*|PIPESTATUS|FUNCNAME|GROUPS|DIRSTACK|"
                  "SHELLOPTS|EUID|PPID|UID|_|HISTCMD|LINENO|RANDOM|SECONDS|SRANDOM|EPOCHREALTIME|EPOCHSECONDS|"
                  "OPTIND|OPTERR|COLUMNS|LINES|PWD|SHLVL|HOSTNAME|HOSTTYPE|MACHTYPE|OSTYPE|IFS|PS4)=")


def clean_env(token: str) -> dict:
    """The runner's environment without anything that configures chstate or points a
    runtime at this checkout's builds: what a user's shell would have."""
    drop = ("MELTANO_", "CLICKHOUSE_", "CHSTATE_", "LUA_PATH", "LUA_CPATH", "NODE_PATH", "PYTHONPATH",
            "VIRTUAL_ENV", "PYTEST_", "BAZEL_", "TEST_")
    env = {k: v for k, v in os.environ.items() if not k.startswith(drop)}
    env.update(LANG="C.UTF-8", LC_ALL="C.UTF-8", TERM="dumb", CHSTATE_DOCTEST_TOKEN=token, NO_COLOR="1")
    return env


def processes_with(token: str) -> list[int]:
    """Processes whose environment holds the page's token: the ones it started."""
    found = []
    needle = f"CHSTATE_DOCTEST_TOKEN={token}".encode()
    for d in Path("/proc").iterdir():
        if not d.name.isdigit() or int(d.name) == os.getpid():
            continue
        try:
            if needle in (d / "environ").read_bytes().split(b"\0"):
                found.append(int(d.name))
        except OSError:
            continue
    return found


def stop_leftovers(token: str) -> list[int]:
    pids = processes_with(token)
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in pids:
            try:
                os.kill(pid, sig)
            except OSError:
                pass
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and processes_with(token):
            time.sleep(0.2)
        pids_left = processes_with(token)
        if not pids_left:
            break
        pids = pids_left
    return pids


def git_untracked(root: Path) -> set[str]:
    out = subprocess.run(["git", "status", "--porcelain", "--untracked-files=all"], cwd=root, capture_output=True,
                         text=True)
    return {line[3:] for line in out.stdout.splitlines() if line.startswith("??")}


@dataclasses.dataclass
class PageResult:
    page: str
    ran: list[Block]
    not_runnable: list[Block]
    outputs_checked: int
    seconds: float


def run_page(path: Path, server: Server, log=print, root: Path = REPO) -> PageResult:
    blocks = parse(path, root)
    rel = str(path.relative_to(root))
    token = uuid.uuid4().hex
    pairs = replacements(server, free_port())
    ran: list[Block] = []
    skipped = [b for b in blocks if b.kind == "not-runnable"]
    checked = 0
    started = time.monotonic()
    if not any(b.kind in ("shell", "file", "append") for b in blocks):
        return PageResult(rel, ran, skipped, 0, 0.0)
    for db in server.sql("SELECT name FROM system.databases WHERE name NOT IN ('system', 'default')").split():
        server.sql(f"DROP DATABASE IF EXISTS `{db}`")
    before = git_untracked(root)
    with tempfile.TemporaryDirectory(prefix="chstate-docs-") as tmp:
        state = Path(tmp) / "shell"
        state.mkdir()
        scratch = Path(tmp) / "tmp"  # the page's mktemp -d folders, removed with it
        scratch.mkdir()
        env = dict(clean_env(token), TMPDIR=str(scratch))
        (state / "env.sh").write_text("".join(f"export {k}={shlex.quote(v)}\n" for k, v in env.items()))
        (state / "cwd").write_text(str(root))
        last_out = None
        try:
            for n, b in enumerate(blocks):
                cwd = Path((state / "cwd").read_text().strip())
                if b.kind == "content":
                    if (root / b.arg).read_text() != b.code:
                        raise DocError(f"{b.where()}: the block is not the content of {b.arg} (it must be the file "
                                       "as it is)")
                    ran.append(b)
                    log(f"  {b.where()}: the content of {b.arg}")
                elif b.kind in ("file", "append"):
                    target = cwd / substitute(b.arg, pairs)
                    target.parent.mkdir(parents=True, exist_ok=True)
                    with open(target, "a" if b.kind == "append" else "w") as f:
                        f.write(substitute(b.code, pairs))
                    ran.append(b)
                    log(f"  {b.where()}: {b.kind} {b.arg} ({cwd})")
                elif b.kind == "shell":
                    script = PRELUDE.format(state=shlex.quote(str(state)), skip=SKIP_VARIABLES) + substitute(b.code, pairs)
                    t0 = time.monotonic()
                    proc = subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True,
                                          timeout=BLOCK_TIMEOUT, stdin=subprocess.DEVNULL)
                    secs = time.monotonic() - t0
                    log(f"  {b.where()}: shell, exit {proc.returncode} ({secs:.1f} s)")
                    if proc.returncode != 0:
                        shown = substitute(b.code, pairs).replace(server.password, "***") if server.password \
                            else b.code
                        err = proc.stderr[-4000:]
                        out = proc.stdout[-2000:]
                        if server.password:
                            err, out = err.replace(server.password, "***"), out.replace(server.password, "***")
                        raise DocError(f"{b.where()}: the block exited {proc.returncode}\n--- block\n{shown}"
                                       f"--- stdout\n{out}\n--- stderr\n{err}")
                    last_out = unsubstitute(proc.stdout, pairs, server)
                    ran.append(b)
                elif b.kind == "output":
                    if last_out is None:
                        raise DocError(f"{b.where()}: no output to compare")
                    if not output_matches(b.code, last_out):
                        raise DocError(f"{b.where()}: the block above printed\n{last_out}--- but the page says\n"
                                       f"{b.code}")
                    checked += 1
                    log(f"  {b.where()}: output matches")
        finally:
            left = stop_leftovers(token)
            if left:
                log(f"  {rel}: could not stop processes {left}")
    after = git_untracked(root)
    litter = sorted(after - before)
    if litter:
        raise DocError(f"{rel}: the page left files in the checkout: {', '.join(litter[:20])}")
    return PageResult(rel, ran, skipped, checked, time.monotonic() - started)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("pages", nargs="*", type=Path, help="pages to run (default: README.md and docs/*.md)")
    ap.add_argument("--list", action="store_true", help="list every block and what the runner does with it")
    args = ap.parse_args()
    chosen = [p.resolve() for p in args.pages] or pages()
    for page, why in EXCLUDED.items():
        print(f"{page}: left out: {why}")
    if args.list:
        for p in chosen:
            for b in parse(p):
                print(f"{b.where():28} {b.lang or '-':8} {b.kind:13} {b.arg}")
        return 0
    server = Server.from_env()
    failed = 0
    for p in chosen:
        print(f"{p.relative_to(REPO)}:", flush=True)
        try:
            r = run_page(p, server, log=lambda s: print(s, flush=True))
            print(f"  ran {len(r.ran)}, not runnable {len(r.not_runnable)}, outputs checked {r.outputs_checked} "
                  f"({r.seconds:.0f} s)")
        except DocError as e:
            failed += 1
            print(f"FAILED: {e}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
