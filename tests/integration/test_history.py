"""State history and rollback through `chstate` against a real server: every
write is a version, `history` lists them newest first, `rollback` restores one
under the lock as a new version, retention and history off."""

from __future__ import annotations

import json
import time

STATE = {"singer_state": {"bookmarks": {"s": {"n": 0}}}}


def state(n: int) -> dict:
    return {"singer_state": {"bookmarks": {"s": {"n": n}}}}


def history(cli, sid: str, *args) -> list:
    return cli.run("history", sid, "--json", *args).json()


def test_every_write_is_a_version_listed_newest_first(cli):
    for n in range(3):
        cli.set("dev:a", state(n))
        time.sleep(1.05)  # 18.16 keeps whole seconds: one version per second, so the order is known
    cli.run("merge", "dev:a", json.dumps({"singer_state": {"p": 1}}))
    cli.set("dev:other", state(9))
    versions = history(cli, "dev:a")
    assert [v["state"] for v in versions] == [
        {"singer_state": {"bookmarks": {"s": {"n": 2}}, "p": 1}}, state(2), state(1), state(0)]
    assert [v["current"] for v in versions] == [True, False, False, False]
    assert all(v["updated_at"].endswith("Z") and "T" in v["updated_at"] for v in versions)
    assert len({v["version"] for v in versions}) == 4
    assert [v["state"] for v in history(cli, "dev:a", "--limit", "2")] == [v["state"] for v in versions[:2]]
    text = cli.run("history", "dev:a").out.splitlines()
    assert len(text) == 4 and text[0].split("\t")[0] == versions[0]["version"] and "\tcurrent\t" in text[0]
    assert history(cli, "dev:none") == []


def test_rollback_restores_a_version_as_a_new_one(cli):
    cli.set("dev:a", state(1))
    time.sleep(1.05)
    cli.set("dev:a", state(2))
    old = history(cli, "dev:a")[1]
    assert old["state"] == state(1)
    time.sleep(1.05)
    r = cli.run("rollback", "dev:a", old["version"], "--json").json()
    assert r["completed"] == state(1)
    assert cli.get("dev:a") == state(1)
    versions = history(cli, "dev:a")
    assert [v["state"] for v in versions] == [state(1), state(2), state(1)]
    assert versions[0]["current"] and versions[0]["version"] != old["version"]
    # The lock is free again (rollback released it).
    assert cli.sql(f"SELECT count() FROM system.tables WHERE database = '{cli.schema}' "
                   "AND name LIKE 'state\\\\_lock\\\\_%' AND name NOT LIKE '%dead%'").strip() == "0"


def test_rollback_refuses_unknown_and_malformed_versions(cli):
    cli.set("dev:a", STATE)
    v = history(cli, "dev:a")[0]["version"]
    ms, _, digest = v.partition("-")
    other = f"{ms}-{'0' * 8 if digest != '0' * 8 else '1' * 8}"
    r = cli.run("rollback", "dev:a", other, expect=3)
    assert f"has no version {other}" in r.err and "chstate history" in r.err
    r = cli.run("rollback", "dev:b", v, expect=3)  # another id's version
    assert "has no version" in r.err
    for bad in ("latest", "123", "123-xyz", f"{ms}-{digest.upper()}", "-1-abcdef12"):
        r = cli.run("rollback", "--", "dev:a", bad, expect=2)
        assert "is not a version" in r.err, bad
    assert cli.get("dev:a") == STATE


def test_history_off_creates_no_table_and_lists_nothing(cli):
    cli.run("set", "dev:a", json.dumps(STATE), "--history-days", "0")
    tables = set(cli.sql(f"SHOW TABLES FROM `{cli.schema}`").split())
    assert tables == {"state", "state_lock"}
    assert cli.run("history", "dev:a", "--json", "--history-days", "0").json() == []
    r = cli.run("set", "dev:a", json.dumps(STATE), "--history-days", "soon", expect=2)
    assert "--history-days" in r.err
    r = cli.run("get", "dev:a", env=cli.env(MELTANO_STATE_BACKEND_CLICKHOUSE_HISTORY_DAYS="-3"), expect=2)
    assert "MELTANO_STATE_BACKEND_CLICKHOUSE_HISTORY_DAYS" in r.err
    # `chstate init` with history on adds it to an existing schema.
    cli.run("init")
    assert {"state_history", "state_history_buffer", "state_history_buffer_mv"} <= set(
        cli.sql(f"SHOW TABLES FROM `{cli.schema}`").split())


def test_compact_removes_versions_older_than_the_retention(cli):
    cli.set("dev:a", STATE)
    cli.sql(f"INSERT INTO `{cli.schema}`.state_history VALUES ('dev:a', NULL, '{{}}', now() - 86400 * 40), "
            f"('dev:a', NULL, '{{}}', now() - 86400 * 5)")
    modern = cli.run("ping", "--json").json()["dialect"] == "modern"
    # Modern servers' TTL drops the 40-day-old version as it is written; 18.x keeps it until compact.
    assert len(history(cli, "dev:a")) == (2 if modern else 3)
    assert cli.run("compact").out.startswith("compacted: ")
    # The mutation runs in the background.
    deadline = time.monotonic() + 30
    while len(history(cli, "dev:a")) != 2 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert len(history(cli, "dev:a")) == 2
    cli.run("compact", "--history-days", "1")
    while len(history(cli, "dev:a")) != 1 and time.monotonic() < deadline + 30:
        time.sleep(0.2)
    assert [v["current"] for v in history(cli, "dev:a")] == [True]


def test_compact_keeps_at_most_the_versions_asked_for(cli):
    for n in range(4):
        cli.set("dev:a", state(n))
        time.sleep(1.05)  # one version per second (18.16's resolution)
    cli.set("dev:b", state(9))
    assert len(history(cli, "dev:a")) == 4
    cli.run("compact", "--history-versions", "2")
    deadline = time.monotonic() + 30
    while len(history(cli, "dev:a")) != 2 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert [v["state"] for v in history(cli, "dev:a")] == [state(3), state(2)]
    assert [v["state"] for v in history(cli, "dev:b")] == [state(9)]
    r = cli.run("compact", env=cli.env(MELTANO_STATE_BACKEND_CLICKHOUSE_HISTORY_VERSIONS="lots"), expect=2)
    assert "MELTANO_STATE_BACKEND_CLICKHOUSE_HISTORY_VERSIONS" in r.err


def test_writes_keep_the_history_within_its_limits_without_compact(cli):
    """One write in 64 (by its random bytes; forced here through pipe_host's
    random_hex) counts the id's versions and removes those beyond
    history_versions (1,000 by default) and past history_days, on 18.16 by a
    mutation: no `chstate compact` needed."""
    import sys
    import urllib.error
    import urllib.parse
    import urllib.request
    from pathlib import Path
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "modern"))
    from pipe_host import PipeHost  # noqa: E402

    server = cli.server
    cli.set("dev:h", state(0))  # the schema
    table = f"`{cli.schema}`.state_history"
    # 1,100 versions of the id, one a second in the past, and 5 of 40 days ago.
    cli.sql(f"INSERT INTO {table} SELECT 'dev:h', NULL, '{{}}', now() - 3600 - number FROM numbers(1100)")
    cli.sql(f"INSERT INTO {table} SELECT 'dev:h', NULL, '{{}}', now() - 40 * 86400 - number FROM numbers(5)")
    cli.sql(f"INSERT INTO {table} SELECT 'dev:old', NULL, '{{}}', now() - 40 * 86400 - number FROM numbers(5)")
    # And 1,100 recent ones: over the count, within the days.
    cli.sql(f"INSERT INTO {table} SELECT 'dev:old', NULL, '{{}}', now() - 3600 - number FROM numbers(1100)")
    modern = cli.run("ping", "--json").json()["dialect"] == "modern"

    def execute(req: dict) -> dict:
        query = urllib.parse.urlencode([tuple(p) for p in req.get("url_params", [])])
        http = urllib.request.Request(f"http://{server.host}:{server.port}/?{query}", data=req["sql"].encode(),
                                      headers={"X-ClickHouse-User": server.user, "X-ClickHouse-Key": server.password})
        try:
            with urllib.request.urlopen(http, timeout=30) as r:
                return {"transport_ok": True, "http_status": r.status, "exception_code_header": "",
                        "body": r.read().decode()}
        except urllib.error.HTTPError as e:
            return {"transport_ok": True, "http_status": e.code,
                    "exception_code_header": e.headers.get("X-ClickHouse-Exception-Code", ""),
                    "body": e.read().decode()}

    looks = "00" * 15 + "40" + "00" * 16  # byte 15: 64, a multiple of kHistoryUpkeepEvery
    settings = {"values": {"uri": "clickhouse://pipe@pipe/default", "schema": cli.schema}}
    with PipeHost(execute, args=[json.dumps(settings)]) as host:
        host.send({"op": "set", "state_id_hex": b"dev:h".hex(), "state": state(1), "force": True})
        purposes = []
        while True:
            msg = host.receive()
            if "request" not in msg:
                break
            purposes.append(msg["request"]["purpose"])
            host.send({"response": execute(msg["request"]), "random_hex": looks})
        assert "done" in msg, msg
    # The write under the id's lock, then the upkeep its random bytes chose.
    assert purposes == ["select_version", "foreign_lock_rows", "create_lock", "insert_state", "history_over_limits",
                        "trim_history_of", "inspect_lock", "drop_lock"], purposes
    for _ in range(100):  # the mutation runs in the background
        if cli.sql(f"SELECT count() FROM system.mutations WHERE database = '{cli.schema}' AND is_done = 0").strip() == "0":
            break
        time.sleep(0.1)
    # The newest 1,000 of the id's 1,107 versions are left; the other id's
    # versions wait for `compact` (or a write of that id): all its recent
    # ones, and on 18.16 its old ones too (modern servers' history table has
    # a TTL of history_days, which removes those by itself).
    assert cli.sql(f"SELECT count() FROM {table} WHERE state_id = 'dev:h'").strip() == "1000"
    assert cli.sql(f"SELECT count() FROM {table} WHERE state_id = 'dev:h' AND updated_at < now() - 86400").strip() == "0"
    assert cli.sql(f"SELECT count() FROM {table} WHERE state_id = 'dev:old' AND updated_at > now() - 86400").strip() == "1100"
    if not modern:
        assert cli.sql(f"SELECT count() FROM {table} WHERE state_id = 'dev:old' AND updated_at < now() - 86400").strip() == "5"
