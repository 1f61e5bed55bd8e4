"""Bulk export and import through the real `meltano state export/import`
(Meltano 4.4 calls the adapter's get_all/set_all), and moving state between
Meltano's default backend (systemdb) and ClickHouse both ways."""

from __future__ import annotations

import json

from meltano_harness import rows
from test_adapter import run

S = {f"dev:tap-{i}-to-target-jsonl": {"completed": {"singer_state": {"bookmarks": {"t": {"n": i}}}},
                                      "partial": ({"singer_state": {"p": i}} if i % 3 == 0 else {})}
     for i in range(25)}


def export(project, **env) -> dict:
    return json.loads(project.run("state", "export", env=project.env(**env)).stdout)


def test_meltano_export_and_import_use_the_bulk_operations(project, tmp_path):
    p = project
    f = tmp_path / "in.json"
    f.write_text(json.dumps(S))
    out = p.run("state", "import", str(f))
    assert f"Successfully imported {len(S)} state(s)" in out.stderr
    assert len(rows(p.server, p.schema)) == len(S)
    assert export(p) == S


def test_get_all_and_set_all_send_a_request_per_page_not_per_state(project):
    """2,500 states: the base class's loops would send 2,500 INSERTs and
    2,501 SELECTs; the adapter sends one INSERT (up to 50,000 states each), and
    to export one sample of the ids and a few pages (the first a range of
    about 1,000 ids, then as many ranges as 4 MiB of these small states
    hold, at most 10,000 states: here the rest)."""
    lines = run(project, """
        m = make()
        m.migrate()   # the tables exist (a first write would create them: three more requests)
        sent = []
        store = m._store_handle()
        inner = store._transport
        store._transport = lambda r: (sent.append(r["purpose"]), inner(r))[1]
        n = m.set_all(MeltanoState(state_id=f"id{i:05d}", partial_state={}, completed_state={"singer_state": {"i": i}})
                      for i in range(2500))
        print(">", n, sent.count("insert_states"), len(sent))
        sent.clear()
        got = list(m.get_all())
        print(">", len(got), got[1234].state_id, got[1234].completed_state["singer_state"]["i"],
              sent.count("sample_state_ids"), sent.count("export_states"), len(sent))
        sent.clear()
        print(">", [s.state_id for s in m.get_all("id0001?")], len(sent))
    """)
    assert lines[0] == "2500 1 1"
    count, state_id, i, samples, pages, requests = lines[1].split()
    assert (count, state_id, i, samples) == ("2500", "id01234", "1234", "1")
    assert 1 <= int(pages) <= 3 and int(requests) == 1 + int(pages), lines[1]
    assert lines[2] == "['id00010', 'id00011', 'id00012', 'id00013', 'id00014', 'id00015', 'id00016', 'id00017', " \
                       "'id00018', 'id00019'] 2"


def test_a_bad_import_writes_nothing(project, tmp_path):
    p = project
    p.run("state", "set", "--force", "kept", json.dumps({"singer_state": {}}))
    f = tmp_path / "bad.json"
    f.write_text(json.dumps({"ok": {"completed": {}}, "bad": {"completed": [1, 2]}}))
    out = p.run("state", "import", str(f), expect=1)
    assert 'import entry for state id "bad": "completed" must be a JSON object' in out.stderr
    assert "nothing was written" in out.stderr and "Fix the entry named in the import document" in out.stderr
    assert sorted(rows(p.server, p.schema)) == ["kept"]


def test_set_all_with_an_id_twice_names_both_and_writes_nothing(project):
    """set_all sends its states as one document, where an id given twice
    would silently keep the last; the adapter sends those as entries, which
    the core refuses naming both."""
    lines = run(project, """
        m = make()
        try:
            m.set_all([MeltanoState(state_id="a", partial_state={}, completed_state={"singer_state": 1}),
                       MeltanoState(state_id="b", partial_state={}, completed_state={"singer_state": 2}),
                       MeltanoState(state_id="a", partial_state={}, completed_state={"singer_state": 3})])
            print(">", "written")
        except Exception as e:
            print(">", type(e).__name__, "entries 1 and 3" in str(e), "nothing was written" in str(e))
        print(">", sorted(m.get_state_ids()))
    """)
    assert lines == ["ChstateStateBackendError True True", "[]"]


def test_from_systemdb_to_clickhouse_and_back(project, chstate_bin, tmp_path):
    """The migration path the README gives: `meltano state export` from the
    old backend, `chstate import` (or `meltano state import`) into ClickHouse;
    and the way back."""
    p = project
    systemdb = {"MELTANO_STATE_BACKEND_URI": "systemdb"}
    f = tmp_path / "systemdb.json"
    f.write_text(json.dumps(S))
    p.run("state", "import", str(f), env=p.env(**systemdb))
    from_systemdb = p.run("state", "export", env=p.env(**systemdb)).stdout
    assert json.loads(from_systemdb) == S
    # Into ClickHouse with the chstate tool.
    import subprocess
    env = {"MELTANO_STATE_BACKEND_CLICKHOUSE_SCHEMA": p.schema, "PATH": "/usr/bin:/bin"}
    if p.server.password:
        env["MELTANO_STATE_BACKEND_CLICKHOUSE_PASSWORD"] = p.server.password
    r = subprocess.run([str(chstate_bin), "--uri", p.server.uri(), "import", "-"], input=from_systemdb.encode(),
                       env=env, capture_output=True, timeout=60)
    assert r.returncode == 0 and r.stdout.strip() == str(len(S)).encode(), r.stderr
    assert export(p) == S                      # meltano reads what chstate wrote
    assert json.loads(p.run("state", "get", "dev:tap-3-to-target-jsonl").stdout) == {
        "singer_state": {"bookmarks": {"t": {"n": 3}}, "p": 3}}
    # And back: `chstate export` into a fresh systemdb.
    r = subprocess.run([str(chstate_bin), "--uri", p.server.uri(), "export"], env=env, capture_output=True,
                       timeout=60)
    assert r.returncode == 0, r.stderr
    p.run("state", "clear", "--force", "--all", env=p.env(**systemdb))
    assert export(p, **systemdb) == {}
    back = tmp_path / "back.json"
    back.write_bytes(r.stdout)
    p.run("state", "import", str(back), env=p.env(**systemdb))
    assert export(p, **systemdb) == S
