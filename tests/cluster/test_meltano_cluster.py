"""The real `meltano` CLI in cluster mode: a project pointed at replica r1 and
one pointed at replica r2 (`state_backend.uri: clickhouse://...?cluster=...`)
see each other's state at once, and Meltano's own locked update() works
across replicas. Uses the cached Meltano venv of tests/meltano."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from chserver import REPO

sys.path.insert(0, str(REPO / "tests" / "meltano"))
import meltano_harness as harness  # noqa: E402

JOB = "dev:tap-counter-to-target-echo"


def project(c, replica: str, schema: str, root: Path, meltano_env) -> harness.MeltanoProject:
    venv, library = meltano_env
    p = harness.MeltanoProject(root, venv, library, state_backend_uri=c.uri(replica, schema),
                               env={"MELTANO_STATE_BACKEND_CLICKHOUSE_PASSWORD": c.password})
    p.secrets = [c.password]
    return p


def test_meltano_projects_on_different_replicas_share_state(healthy, schema, tmp_path, meltano_env):
    c = healthy
    on_r1 = project(c, "r1", schema, tmp_path / "r1", meltano_env)
    on_r2 = project(c, "r2", schema, tmp_path / "r2", meltano_env)

    # A real run through r1 saves its bookmark with Meltano's locked update().
    run = on_r1.run("run", "tap-counter", "target-echo")
    assert c.password not in run.stdout + run.stderr
    saved = json.loads(on_r2.run("state", "get", JOB).stdout)  # read through the other replica, no wait
    assert saved["singer_state"]["bookmarks"]["numbers"]["id"] == 5

    # The next run through r2 resumes from it, and r1 sees the new bookmark.
    resumed = on_r2.run("run", "tap-counter", "target-echo",
                        env=on_r2.env(TAP_COUNTER_TOTAL="8"))
    assert "tap-counter: starting after id 5" in resumed.stderr
    assert json.loads(on_r1.run("state", "get", JOB).stdout)["singer_state"]["bookmarks"]["numbers"]["id"] == 8

    # Tables are replicated on both replicas.
    for replica in ("r1", "r2"):
        engine = c.sql(replica, f"SELECT engine FROM system.tables WHERE database = '{schema}' AND name = 'state'")
        assert engine.strip() == "ReplicatedReplacingMergeTree"

    # Meltano's `state clear` through r1 is seen through r2.
    on_r1.run("state", "clear", "--force", JOB)
    listed = on_r2.run("state", "list").stdout
    assert JOB not in listed
