"""`chstate export` and `chstate import` against a real server: Meltano's
export format both ways, paging and batching past their sizes, and bad input
refused before anything is written."""

from __future__ import annotations

import json

import pytest

STATE = {"singer_state": {"bookmarks": {"users": {"updated_at": "2024-01-01"}}}}


def export(cli, *args) -> dict:
    r = cli.run("export", *args)
    return json.loads(r.stdout)


def test_export_of_nothing_is_an_empty_object(cli):
    assert export(cli) == {}


def test_export_writes_both_sides_of_every_state(cli):
    cli.set("dev:a", STATE)
    cli.run("merge", "dev:b", json.dumps({"singer_state": {"p": 1}}))
    cli.set("prod:c", STATE)
    doc = export(cli)
    assert doc == {"dev:a": {"completed": STATE, "partial": {}},
                   "dev:b": {"completed": {}, "partial": {"singer_state": {"p": 1}}},
                   "prod:c": {"completed": STATE, "partial": {}}}
    assert list(export(cli, "--pattern", "dev:*")) == ["dev:a", "dev:b"]
    assert export(cli, "--pattern", "nothing*") == {}


def test_export_clear_import_restores_everything(cli, tmp_path):
    ids = [f"dev:tap-{i}-to-target" for i in range(40)] + ['odd "id"\n\twith\\bytes', "é-ü"]
    for i, sid in enumerate(ids):
        cli.run("merge", sid, json.dumps({"singer_state": {"n": i}}))
        cli.run("set", sid, json.dumps({"singer_state": {"done": i}})) if i % 2 else None
    before = export(cli)
    assert len(before) == len(ids)
    path = tmp_path / "states.json"
    r = cli.run("export", "--output", path, "--json")
    assert r.json() == {"exported": len(ids), "output": str(path)}
    assert json.loads(path.read_text()) == before
    assert not list(tmp_path.glob("*.chstate-partial"))
    cli.run("clear", "--all")
    assert export(cli) == {}
    assert cli.run("import", path).out.strip() == str(len(ids))
    assert export(cli) == before
    # From stdin, again: the same states, nothing duplicated.
    assert cli.run("import", "-", "--json", input=path.read_bytes()).json() == {"imported": len(ids)}
    assert export(cli) == before


def test_pages_and_batches_past_their_size(cli):
    # 12,345 states of about 1,450 bytes of SQL each: two import INSERTs, the
    # first cut where the next row would pass 16 MiB of SQL (11,498 states),
    # not at 50,000 states; the export samples the ids for about a dozen
    # ranges and reads them in pages of about 4 MiB.
    n = 12345
    pad = "x" * 1400
    doc = {f"id{i:05d}": {"completed": {"singer_state": {"i": i, "pad": pad}}, "partial": {}} for i in range(n)}
    imported = cli.run("-vv", "import", "-", input=json.dumps(doc))
    assert imported.out.strip() == str(n)
    inserts = [line for line in imported.err.splitlines() if "insert_states (attempt 1): ok" in line]
    assert len(inserts) == 2, imported.err[:3000]
    assert "VALUES ('id00000'," in inserts[0] and "VALUES ('id11498'," in inserts[1], inserts
    inserts = cli.sql(f"SELECT count() FROM `{cli.schema}`.state")
    assert int(inserts) == n  # one row per state: no batch written twice
    # Newer versions of every 7th state, not merged yet: each range reads
    # the newest (FINAL), and no state comes twice.
    newer = {k: {"completed": {"singer_state": {"i": -1}}, "partial": {}} for k in list(doc)[::7]}
    assert cli.run("import", "-", input=json.dumps(newer)).out.strip() == str(len(newer))
    doc.update(newer)
    text = cli.run("export").stdout
    top = json.loads(text, object_pairs_hook=lambda pairs: pairs if pairs and pairs[0][0].startswith("id") else 0)
    assert [k for k, _ in top] == sorted(doc)  # each id once, in id order
    assert json.loads(text) == doc
    # A glob: its own sample, its ids alone.
    assert export(cli, "--pattern", "id0123*") == {k: v for k, v in doc.items() if k.startswith("id0123")}


@pytest.mark.parametrize("text, fragment", [
    ("not json", "not JSON"),
    ("[1, 2]", "must be a JSON object"),
    ('{"ok": {}, "bad": {"completed": [1]}}', 'import entry for state id "bad"'),
    ('{"ok": {}, "bad": {"nope": {}}}', 'import entry for state id "bad"'),
    ('{"ok": {}, "": {}}', 'import entry for state id ""'),
    ('{"ok": {}, "x": 3}', 'import entry for state id "x"'),
])
def test_bad_input_is_refused_before_anything_is_written(cli, text, fragment):
    cli.set("kept", STATE)
    r = cli.run("import", "-", input=text, expect=2)
    assert fragment in r.err
    assert "nothing was written" in r.err
    assert export(cli) == {"kept": {"completed": STATE, "partial": {}}}


def test_an_id_too_long_is_refused_naming_its_entry(cli):
    doc = '{"a": {}, "' + "x" * (200 * 1024) + '": {}}'
    r = cli.run("import", "-", input=doc, expect=2)
    assert 'import entry for state id "xxxx' in r.err and "nothing was written" in r.err
    assert len(r.err) < 2000  # the id is cut short in the message
    assert export(cli) == {}


def test_import_of_a_missing_file_names_it(cli, tmp_path):
    r = cli.run("import", tmp_path / "nope.json", expect=2)
    assert "nope.json" in r.err


def test_an_id_json_cannot_carry_stops_the_export_and_leaves_no_file(cli, tmp_path):
    cli.set("fine", STATE)
    cli.run("set", b"bad\xff", json.dumps(STATE))
    out = tmp_path / "x.json"
    r = cli.run("export", "--output", out, expect=7)
    assert "not valid UTF-8" in r.err and "bad\\xff" in r.err
    assert not out.exists() and not list(tmp_path.iterdir())
    assert export(cli, "--pattern", "f*") == {"fine": {"completed": STATE, "partial": {}}}


def test_unreachable_server_leaves_no_file(cli, tmp_path):
    out = tmp_path / "x.json"
    r = cli.run("export", "--output", out, uri="clickhouse://u@127.0.0.1:1/default", expect=5)
    assert "127.0.0.1:1" in r.err
    assert not out.exists() and not list(tmp_path.iterdir())
