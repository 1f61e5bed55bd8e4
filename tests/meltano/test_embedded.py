"""Embedded mode: `state_backend.uri: chdb:///<dir>` keeps state in chDB
inside Meltano's own process (the core's modern dialect), no server needed."""

from __future__ import annotations

import json

import meltano_harness as harness
import pytest

A = "dev:tap-a-to-target-b"
S1 = {"singer_state": {"bookmarks": {"s1": {"since": "2026-01-01"}}}}
S2 = {"singer_state": {"bookmarks": {"s2": {"since": "2026-02-02"}}}}
JOB = "dev:tap-counter-to-target-echo"


@pytest.fixture
def embedded(tmp_path, venv, library) -> harness.MeltanoProject:
    data = tmp_path / "chdb-state"
    p = harness.MeltanoProject(tmp_path / "project", venv, library, state_backend_uri=f"chdb://{data}")
    p.data = data
    return p


def stored(p) -> dict:
    """The state table's rows, read in a separate process (chDB allows one
    data path per process, and this one must stay free for other tests)."""
    out = p.python(f"""
import json
from chdb import session
s = session.Session({str(p.data)!r})
rows = s.query("SELECT state_id, partial_state, completed_state FROM meltano.state FINAL ORDER BY state_id",
               "JSONCompact").bytes()
print(json.dumps({{r[0]: r[1:] for r in json.loads(rows)["data"]}}))
""")
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_state_commands(embedded):
    p = embedded
    out = p.run("state", "set", "--force", A, json.dumps(S1))
    assert "Using ChdbStateStoreManager add-on state backend" in out.stderr
    p.run("state", "merge", A, json.dumps(S2))
    assert json.loads(p.run("state", "get", A).stdout) == {
        "singer_state": {"bookmarks": {**S1["singer_state"]["bookmarks"], **S2["singer_state"]["bookmarks"]}}}
    p.run("state", "copy", "--force", A, "dev:b")
    p.run("state", "set", "--force", "prod:c", json.dumps(S1))
    assert p.run("state", "list", "--pattern", "dev:*").stdout.splitlines() == sorted([A, "dev:b"])
    rows = stored(p)
    assert json.loads(rows[A][1]) == S1 and json.loads(rows[A][0]) == S2
    assert rows["dev:b"][0] is None
    p.run("state", "clear", "--force", "dev:b")
    assert p.run("state", "list").stdout.splitlines() == [A, "prod:c"]
    assert "2 state(s) were successfully cleared" in p.run("state", "clear", "--force", "--all").stderr
    assert p.run("state", "list").stdout.splitlines() == []
    assert (p.data / "metadata").is_dir()  # the data lives where the URI says


def test_chdb_settings_choose_the_table(embedded):
    """state_backend.chdb.schema and .table (Meltano passes the namespace of
    the URI's scheme), from meltano.yml's environment variables."""
    p = embedded
    env = p.env(MELTANO_STATE_BACKEND_CHDB_SCHEMA="embedded_schema", MELTANO_STATE_BACKEND_CHDB_TABLE="embedded_t")
    p.run("state", "set", "--force", A, json.dumps(S1), env=env)
    assert json.loads(p.run("state", "get", A, env=env).stdout) == S1
    assert p.run("state", "list").stdout.splitlines() == []  # not in meltano.state
    out = p.python(f"""
from chdb import session
s = session.Session({str(p.data)!r})
print(s.query("SELECT state_id FROM embedded_schema.embedded_t FINAL", "TSV").bytes().decode())
""")
    assert out.stdout.split() == [A]


def test_another_package_registering_the_scheme_is_named(embedded, tmp_path):
    """With a second package registering clickhouse:// (as the Python
    ClickHouse backend does), Meltano picks one arbitrarily; chstate says
    which one is in use and how to remove the other."""
    site = tmp_path / "other-site"
    info = site / "meltano_state_backend_clickhouse-0.0.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: meltano-state-backend-clickhouse\nVersion: 0.0.1\n")
    (info / "entry_points.txt").write_text("[meltano.state_backends]\nclickhouse = other_clickhouse:Manager\n")
    (site / "other_clickhouse.py").write_text("class Manager:\n    pass\n")
    p = embedded
    # PYTHONPATH comes before site-packages: the other package is found first.
    out = p.run("state", "list", env=p.env(PYTHONPATH=str(site)))
    text = out.stdout + out.stderr
    assert "two installed packages register the clickhouse:// state backend" in text, text[-3000:]
    assert "chstate-meltano, meltano-state-backend-clickhouse" in text
    assert "here meltano-state-backend-clickhouse" in text
    assert "pip uninstall chstate-meltano" in text
    # Without it, nothing is said.
    clean = p.run("state", "list")
    assert "register the" not in clean.stdout + clean.stderr


def test_run_picks_up_state(embedded):
    p = embedded
    first = p.run("run", "tap-counter", "target-echo")
    assert "tap-counter: starting after id 0" in first.stderr
    assert first.stderr.count("Incremental state has been updated") == 5
    second = p.run("run", "tap-counter", "target-echo", env=p.env(TAP_COUNTER_TOTAL="7"))
    assert "tap-counter: starting after id 5" in second.stderr
    assert [r["id"] for r in harness.output_lines(p.root / "output" / "echo.jsonl")] == [1, 2, 3, 4, 5, 6, 7]
    assert json.loads(p.run("state", "get", JOB).stdout) == {"singer_state": {"bookmarks": {"numbers": {"id": 7}}}}


@pytest.mark.parametrize("uri, message", [
    ("chdb://relative/dir", "absolute path"),
    ("chdb:///tmp/x?schema=a&colour=blue", '"colour"'),
    ("chdb:///tmp/x?schema=no-dashes", "schema"),
])
def test_bad_chdb_uris_are_clear_errors(embedded, uri, message):
    out = embedded.run("state", "list", env=embedded.env(MELTANO_STATE_BACKEND_URI=uri), expect=1)
    assert message in out.stderr
    assert "Traceback" not in out.stderr
