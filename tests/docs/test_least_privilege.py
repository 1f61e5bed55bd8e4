"""The least privilege of docs/operations.md, tested on ClickHouse 18.16.

The throwaway server (tools/clickhouse_server.py) has a user with exactly the
rights the page gives (chstate_least: its databases, DDL allowed, not
read-only) and two with one right less each. As chstate_least the API
scenarios (tests/api/scenarios.json, through the CLI and the Lua 5.4 module)
pass, and so do the statements they do not reach (a stale lock taken over by
RENAME, compact); with one right less chstate stops at its first statement and
says which right is missing, in ClickHouse's words. The page's users.xml is the
configuration this test runs with, and its GRANT statements for servers with
SQL access control parse in chDB with privilege names the server knows.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PAGE = REPO / "docs" / "operations.md"
sys.path.insert(0, str(REPO / "tools"))
sys.path.insert(0, str(REPO / "tests" / "api"))
import clickhouse_server  # noqa: E402

LEAST = "chstate_least"
CONNECTION_DB = clickhouse_server.LEAST_DATABASES[0]  # the connection's database, made by the administrator
PREFIX = "least"  # the API driver's schemas: least_cli_0, least_cli_1, ..., least_lua54_0, ...


def blocks(lang: str) -> list[str]:
    return re.findall(r"^```" + lang + r"\n(.*?)^```$", PAGE.read_text(), re.S | re.M)


@pytest.fixture(scope="module")
def server(clickhouse):
    # As an administrator: the connection's database; each schema is cleared.
    for db in clickhouse_server.LEAST_DATABASES:
        clickhouse.sql(f"DROP DATABASE IF EXISTS {db}")
    clickhouse.sql(f"CREATE DATABASE {CONNECTION_DB}")
    return clickhouse


@pytest.fixture(scope="module")
def cli(bazel_binary) -> Path:
    return bazel_binary("CHSTATE_BIN", "hosts/native/chstate", "//hosts/native:chstate")


def run(cli: Path, server, user: str, *args: str, schema: str = "least_0", database: str = CONNECTION_DB,
        timeout: float = 60) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MELTANO_", "CLICKHOUSE_"))}
    env["MELTANO_STATE_BACKEND_CLICKHOUSE_PASSWORD"] = server.password
    uri = f"clickhouse://{user}@{server.host}:{server.port}/{database}?schema={schema}"
    return subprocess.run([str(cli), "--uri", uri, *args], env=env, capture_output=True, text=True, timeout=timeout)


def test_the_page_gives_the_rights_this_test_runs_with():
    (xml,) = blocks("xml")
    root = ET.fromstring(xml)
    profile = {e.tag: e.text for e in root.find("profiles/chstate")}
    assert profile == clickhouse_server.LEAST_PROFILE, profile
    user = root.find("users/chstate")
    assert user.findtext("profile") == "chstate"
    allowed = [d.text for d in user.find("allow_databases")]
    assert allowed == ["meltano"], allowed  # one database: the schema, also the connection's
    assert "clickhouse://chstate@clickhouse.internal:8123/meltano" in PAGE.read_text()
    # The test's user is that profile, with the test's databases in place of meltano.
    assert clickhouse_server.LEAST_USERS[LEAST] == profile


def test_the_api_scenarios_pass_with_exactly_those_rights(server, cli, bazel_binary):
    from test_scenarios import SCENARIOS, expected

    for host in ("cli", "lua54"):
        wanted = {f"{PREFIX}_{host}_{n}" for n in range(len(SCENARIOS["scenarios"]))}
        assert wanted <= set(clickhouse_server.LEAST_DATABASES), f"allow the user more schemas: {sorted(wanted)}"
    lua_module = bazel_binary("CHSTATE_LUA_MODULE", "hosts/lua/chstate.so", "//hosts/lua:chstate.so")
    library = bazel_binary("CHSTATE_LIBRARY", "hosts/python/libchstate.so", "//hosts/python:libchstate.so")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MELTANO_", "CLICKHOUSE_"))}
    env.update(CHSTATE_API_URI=f"clickhouse://{LEAST}@{server.host}:{server.port}/{CONNECTION_DB}",
               CHSTATE_API_PASSWORD=server.password, CHSTATE_CLI=str(cli), CHSTATE_LIBRARY=str(library),
               LUA_CPATH_5_4=f"{lua_module.parent}/?.so;;", LUA_PATH_5_4=f"{REPO / 'tests' / 'api'}/?.lua;;")
    drivers = {"cli": [sys.executable, str(REPO / "tests" / "api" / "driver.py")],
               "lua54": ["lua5.4", str(REPO / "tests" / "api" / "driver.lua")]}

    def replay(host: str):
        return subprocess.run([*drivers[host], host, f"{PREFIX}_{host}"], env=env, capture_output=True, text=True,
                              timeout=600, cwd=REPO / "tests" / "api")

    with ThreadPoolExecutor(max_workers=2) as pool:  # side by side, each in its own schemas
        procs = dict(zip(drivers, pool.map(replay, drivers)))
    results = {}
    for host, proc in procs.items():
        assert proc.returncode == 0 and proc.stdout.strip(), f"{host}: exit {proc.returncode}\n{proc.stderr[-3000:]}"
        results[host] = json.loads(proc.stdout)
    for host, transcript in results.items():
        for scenario in SCENARIOS["scenarios"]:
            mine = next(t for t in transcript if t["scenario"] == scenario["name"])
            assert mine == expected(scenario, host), (host, scenario["name"])
    assert server.password not in json.dumps(results)


def test_a_stale_lock_is_taken_over_and_compacted_with_exactly_those_rights(server, cli):
    """What the scenarios do not reach: RENAME of a dead holder's lock, and
    compact dropping its tombstone."""
    schema = "least_1"
    assert run(cli, server, LEAST, "init", schema=schema).returncode == 0
    holder = subprocess.Popen(
        [str(cli), "--uri", f"clickhouse://{LEAST}@{server.host}:{server.port}/{CONNECTION_DB}?schema={schema}",
         "--stale-lock", "1", "lock", "dev:dead", "--", "sleep", "60"],
        env={**os.environ, "MELTANO_STATE_BACKEND_CLICKHOUSE_PASSWORD": server.password},
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
    try:
        # dev:dead has no state, so `locks` shows its lock by its table
        # ("(no state yet; table state_lock_...)"), not by the id.
        deadline = time.monotonic() + 20
        while "\tlive" not in run(cli, server, LEAST, "locks", schema=schema).stdout:
            assert time.monotonic() < deadline, holder.stderr.read1().decode() if holder.poll() is not None else ""
            time.sleep(0.2)
        os.killpg(holder.pid, signal.SIGKILL)  # the holder dies holding its lock
        holder.wait()
        taken = run(cli, server, LEAST, "--stale-lock", "1", "lock", "dev:dead", "--", "true", schema=schema)
        assert taken.returncode == 0, taken.stderr
        tombstones = server.sql(f"SELECT count() FROM system.tables WHERE database = '{schema}' AND name LIKE '%_dead_%'")
        assert int(tombstones) >= 1  # the takeover renamed the dead holder's lock
        # Tombstones older than twice the validity (2 s) go, by the server's
        # metadata_modification_time, in whole seconds: 2 s can read as 1 s more.
        time.sleep(3.5)
        compacted = run(cli, server, LEAST, "--stale-lock", "1", "compact", schema=schema)
        assert compacted.returncode == 0, compacted.stderr
        left = server.sql(f"SELECT count() FROM system.tables WHERE database = '{schema}' AND name LIKE '%_dead_%'")
        assert int(left) == 0
    finally:
        if holder.poll() is None:
            os.killpg(holder.pid, signal.SIGKILL)


# The rows of the page's table, each with the user and database that lack that one right.
ONE_RIGHT_LESS = {
    "the schema in `allow_databases`": (LEAST, "meltano"),  # a database not in its list
    "`allow_ddl`": ("chstate_least_no_ddl", "least_2"),
    "writes (`readonly` 1 or 2)": ("chstate_least_readonly", "least_3"),
}


def page_rows() -> dict:
    """The page's table: right missing -> what chstate says."""
    return dict(re.findall(r"^\| (.+?) \| `(ClickHouse .+?)` \|$", PAGE.read_text(), re.M))


def test_the_page_lists_each_right_this_test_takes_away():
    assert set(page_rows()) == set(ONE_RIGHT_LESS)


@pytest.mark.parametrize("missing", list(ONE_RIGHT_LESS))
def test_one_right_less_fails_at_once_saying_what_the_page_says(server, cli, missing):
    user, database = ONE_RIGHT_LESS[missing]
    server.sql(f"CREATE DATABASE IF NOT EXISTS {database}")  # as the page says: made by the administrator
    failed = run(cli, server, user, "init", schema=database, database=database)
    # 18.16's 164, 291 and 392 are PERMISSION_DENIED (docs/errors.md): exit 6.
    assert failed.returncode == 6, (failed.returncode, failed.stderr)
    said = page_rows()[missing].replace("user chstate", f"user {user}")
    assert failed.stderr == f"chstate: {said}\n"
    assert server.password not in failed.stdout + failed.stderr
    # The control: with the right, the same command works.
    if database != "meltano":
        done = run(cli, server, LEAST, "init", schema=database, database=database)
        assert done.returncode == 0, done.stderr
    server.sql(f"DROP DATABASE IF EXISTS {database}")


def test_the_grant_statements_parse_with_privileges_the_server_knows():
    from chdb import session

    s = session.Session()
    known = {line.split("\t")[0] for line in str(s.query("SHOW PRIVILEGES", "TSV")).splitlines()}
    statements = [st.strip() for block in blocks("sql") for st in re.sub(r"--[^\n]*", "", block).split(";")]
    grants = [st for st in statements if st.startswith("GRANT")]
    assert len(grants) >= 4, grants
    for grant in grants:
        names = re.match(r"GRANT (.*?) ON ", grant).group(1)
        for name in (n.strip() for n in names.split(",")):
            assert name in known, f"{name!r} is not a privilege of ClickHouse {s.query('SELECT version()', 'TSV')}"
        # It parses: chDB refuses only the user, which its lack of a user directory cannot know
        # (a misspelt privilege is a SYNTAX_ERROR).
        with pytest.raises(Exception, match="UNKNOWN_ROLE"):
            s.query(grant.replace("TO chstate", "TO chstate_docs_test"), "TSV")


def test_cluster_mode_needs_no_more_on_18_16(cli, tmp_path):
    """The same users.xml entry on every replica (tools/clickhouse_server.py gives each
    replica the same users): cluster mode's DDL ON CLUSTER, quorum writes, claims lock,
    tombstones and compact work as chstate_least, and not without DDL."""
    folder = tmp_path / "cluster"
    started = subprocess.run([sys.executable, str(REPO / "tools" / "clickhouse_server.py"), "start", "--cluster",
                              str(folder)], capture_output=True, text=True, timeout=300)
    assert started.returncode == 0, started.stdout + started.stderr
    try:
        env_lines = dict(line.split("=", 1) for line in started.stdout.splitlines() if "=" in line)
        hosts, password = env_lines["CHSTATE_TEST_HOSTS"], env_lines["CHSTATE_TEST_PASSWORD"]
        port = env_lines["CHSTATE_TEST_PORT"]
        import urllib.request

        urllib.request.urlopen(urllib.request.Request(
            f"http://127.0.0.1:{port}/", data=f"CREATE DATABASE IF NOT EXISTS {CONNECTION_DB} ON CLUSTER chstate".encode(),
            headers={"X-ClickHouse-User": "chstate", "X-ClickHouse-Key": password}), timeout=60).read()
        env = {k: v for k, v in os.environ.items() if not k.startswith(("MELTANO_", "CLICKHOUSE_"))}
        env["MELTANO_STATE_BACKEND_CLICKHOUSE_PASSWORD"] = password

        def chstate(user: str, schema: str, *args: str) -> subprocess.CompletedProcess:
            uri = f"clickhouse://{user}@{hosts}/{CONNECTION_DB}?cluster=chstate&schema={schema}"
            return subprocess.run([str(cli), "--uri", uri, *args], env=env, capture_output=True, text=True,
                                  timeout=120)

        for args in (["init"], ["set", "dev:a", '{"singer_state": {"x": 1}}'], ["merge", "dev:a", '{"singer_state": {"y": 2}}'],
                     ["lock", "dev:a", "--", "true"], ["clear", "dev:a"], ["clear", "--all"], ["compact"]):
            done = chstate(LEAST, "least_2", *args)
            assert done.returncode == 0, (args, done.stderr)
        refused = chstate("chstate_least_no_ddl", "least_3", "init")
        assert refused.returncode == 6 and "code 392" in refused.stderr and "allow_ddl" in refused.stderr, refused.stderr
        assert password not in refused.stdout + refused.stderr
    finally:
        subprocess.run([sys.executable, str(REPO / "tools" / "clickhouse_server.py"), "stop", "--cluster", str(folder)],
                       capture_output=True, timeout=120)
