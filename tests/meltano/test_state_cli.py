"""The real `meltano state` CLI against ClickHouse 18.16 through the adapter:
every command, its output, and the rows it leaves in ClickHouse."""

from __future__ import annotations

import json
import re

from meltano_harness import rows

A = "dev:tap-a-to-target-b"
B = "dev:tap-b-to-target-b"
S1 = {"singer_state": {"bookmarks": {"s1": {"since": "2026-01-01"}}}}
S2 = {"singer_state": {"bookmarks": {"s2": {"since": "2026-02-02"}}}}
S3 = {"singer_state": {"bookmarks": {"s3": {"since": "2026-03-03"}, "s1": {"since": "2026-09-09"}}}}


def get(project, state_id: str) -> dict:
    return json.loads(project.run("state", "get", state_id).stdout)


def listed(project, *args: str) -> list:
    return project.run("state", "list", *args).stdout.splitlines()


def test_set_get_and_the_stored_row(project):
    p = project
    out = p.run("state", "set", "--force", A, json.dumps(S1))
    assert f"State for {A} was successfully set" in out.stderr
    assert "Using ClickhouseStateStoreManager add-on state backend" in out.stderr
    assert get(p, A) == S1
    # Stored as the Python backend stores it: an empty side is NULL.
    stored = rows(p.server, p.schema)
    assert stored[A][0] is None
    assert json.loads(stored[A][1]) == S1
    # Absent: {} (Meltano's get_state of a missing id).
    assert get(p, "dev:missing") == {}
    # The label names the redacted connection, never the password.
    out = p.run("state", "get", A)
    assert f"clickhouse://{p.server.user}:***@" in out.stderr or f"clickhouse://{p.server.user}@" in out.stderr


def test_set_validates_singer_state(project):
    out = project.run("state", "set", "--force", A, '{"bookmarks": {}}', expect=1)
    assert "singer_state" in out.stderr + out.stdout
    # Nothing was written, not even the tables.
    assert project.server.sql(
        f"SELECT count() FROM system.databases WHERE name = '{project.schema}'").strip() == "0"


def test_merge_lays_partial_state_over_completed(project):
    p = project
    p.run("state", "set", "--force", A, json.dumps(S1))
    p.run("state", "merge", A, json.dumps(S2))
    assert get(p, A) == {"singer_state": {"bookmarks": {**S1["singer_state"]["bookmarks"],
                                                        **S2["singer_state"]["bookmarks"]}}}
    partial, completed = rows(p.server, p.schema)[A]
    assert json.loads(completed) == S1
    assert json.loads(partial) == S2


def test_merge_from_state_id(project):
    p = project
    p.run("state", "set", "--force", A, json.dumps(S1))
    p.run("state", "set", "--force", B, json.dumps(S3))
    p.run("state", "merge", "--from-state-id", B, A)
    # B's bookmarks win where both have one (partial over completed).
    assert get(p, A) == {"singer_state": {"bookmarks": {"s1": {"since": "2026-09-09"},
                                                        "s3": {"since": "2026-03-03"}}}}
    assert get(p, B) == S3


def test_merge_input_file(project, tmp_path):
    p = project
    f = tmp_path / "state.json"
    f.write_text(json.dumps(S2))
    p.run("state", "merge", A, "--input-file", str(f))
    assert get(p, A) == S2
    partial, completed = rows(p.server, p.schema)[A]
    assert completed is None and json.loads(partial) == S2


def test_copy_and_move(project):
    p = project
    p.run("state", "set", "--force", A, json.dumps(S1))
    p.run("state", "merge", A, json.dumps(S2))
    merged = get(p, A)
    p.run("state", "copy", "--force", A, "dev:copy")
    assert get(p, "dev:copy") == merged
    assert get(p, A) == merged
    # A copy is a complete state: the merged view as completed, no partial.
    partial, completed = rows(p.server, p.schema)["dev:copy"]
    assert partial is None and json.loads(completed) == merged
    out = p.run("state", "move", "--force", "dev:copy", "dev:moved")
    assert "successfully moved" in out.stderr
    assert get(p, "dev:moved") == merged
    assert get(p, "dev:copy") == {}
    assert sorted(rows(p.server, p.schema)) == sorted([A, "dev:moved"])


def test_list_with_patterns(project):
    p = project
    ids = ["dev:tap-a-to-target-b", "dev:tap-a-to-target-c", "prod:tap-a-to-target-b", "dev:x_y", "dev:xzy",
           "dev:100%", "dev:1000"]
    for state_id in ids:
        p.run("state", "set", "--force", state_id, json.dumps(S1))
    assert listed(p) == sorted(ids)
    assert listed(p, "--pattern", "dev:*") == sorted(i for i in ids if i.startswith("dev:"))
    assert listed(p, "--pattern", "*target-b") == ["dev:tap-a-to-target-b", "prod:tap-a-to-target-b"]
    assert listed(p, "--pattern", "dev:tap-a-to-target-?") == ["dev:tap-a-to-target-b", "dev:tap-a-to-target-c"]
    # LIKE's wildcards in a glob match only themselves.
    assert listed(p, "--pattern", "dev:x_y") == ["dev:x_y"]
    assert listed(p, "--pattern", "dev:100%") == ["dev:100%"]
    assert listed(p, "--pattern", "nothing:*") == []


def test_hostile_state_ids_round_trip(project):
    p = project
    weird = "dev:it's \"quoted\" \\ back`tick` é 🙂 %_"
    p.run("state", "set", "--force", weird, json.dumps(S1))
    assert get(p, weird) == S1
    assert listed(p, "--pattern", "dev:it's*") == [weird]
    assert weird in rows(p.server, p.schema)


def test_clear_and_clear_all(project):
    p = project
    for state_id in (A, B, "dev:c"):
        p.run("state", "set", "--force", state_id, json.dumps(S1))
    p.run("state", "clear", "--force", A)
    assert get(p, A) == {}
    assert sorted(rows(p.server, p.schema)) == sorted([B, "dev:c"])
    out = p.run("state", "clear", "--force", "--all")
    assert "2 state(s) were successfully cleared" in out.stderr
    assert rows(p.server, p.schema) == {}
    assert listed(p) == []
    out = p.run("state", "clear", "--force", "--all")
    assert "0 state(s) were successfully cleared" in out.stderr


def test_export_and_import(project, tmp_path):
    p = project
    p.run("state", "set", "--force", A, json.dumps(S1))
    p.run("state", "merge", A, json.dumps(S2))
    exported = json.loads(p.run("state", "export").stdout)
    assert exported == {A: {"completed": S1, "partial": S2}}
    p.run("state", "clear", "--force", "--all")
    f = tmp_path / "export.json"
    f.write_text(json.dumps({**exported, "dev:other": {"completed": S3, "partial": None}}))
    out = p.run("state", "import", str(f))
    assert "Successfully imported 2 state(s)" in out.stderr
    assert get(p, A) == {"singer_state": {"bookmarks": {**S1["singer_state"]["bookmarks"],
                                                        **S2["singer_state"]["bookmarks"]}}}
    assert get(p, "dev:other") == S3


def test_before_any_write_reads_find_nothing(project):
    # No schema yet: list, get and clear --all must not fail (and not create it).
    p = project
    assert listed(p) == []
    assert get(p, A) == {}
    assert "0 state(s) were successfully cleared" in p.run("state", "clear", "--force", "--all").stderr


def test_meltano_upgrade_migrates_by_creating_the_tables(project):
    p = project
    out = p.run("upgrade", "database")
    assert out.returncode == 0
    # `meltano upgrade` with migrate_state is the path that calls migrate(); do it directly too.
    p.python("from meltano.core.project import Project\n"
             "from meltano.core.state_service import StateService\n"
             "with StateService(project=Project.find()) as s: s.state_store_manager.migrate()\n")
    tables = p.server.sql(f"SHOW TABLES FROM `{p.schema}`").split()
    assert "state" in tables and "state_lock" in tables


# A statement as the adapter logs it at debug: "PURPOSE (attempt N[, HOST]): OUTCOME in N ms: SQL".
STATEMENT = re.compile(r"[a-z_]+ \(attempt \d+[,)].*?: (ok|code \d+|HTTP \d+|no answer: .*?) in \d+ ms: ")


def test_log_level_debug_shows_each_statement_with_its_time_and_no_state_contents(project):
    state = json.dumps({"singer_state": {"bookmarks": {"s1": {"token_like": "bm-meltano-77"}}}})
    quiet = project.run("state", "set", "--force", A, state)
    assert not STATEMENT.search(quiet.stderr), quiet.stderr  # the default level (info): no statements
    loud = project.run("--log-level=debug", "state", "set", "--force", A, state)
    ours = [line for line in loud.stderr.splitlines() if STATEMENT.search(line)]
    assert ours and all("[debug" in line for line in ours), loud.stderr[-3000:]
    inserts = [line for line in ours if "insert_state (attempt 1): ok in " in line]
    assert len(inserts) == 1, ours
    # Under Meltano's lock the write is fenced on it (docs/lock.md): INSERT ... SELECT the row.
    assert re.search(r"INSERT INTO `[^`]+`\.`state` \(state_id, partial_state, completed_state\) SELECT "
                     r"'dev:tap-a-to-target-b', NULL, '<state: \d+ bytes>' FROM \(SELECT countIf\(", inserts[0]), inserts[0]
    # Meltano itself logs the payload at debug; what chstate logs never holds it.
    assert not [line for line in ours if "bm-meltano-77" in line]
