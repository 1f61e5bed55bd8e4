"""Every page of README.md and docs/ runs as it says (tests/docs/docrun.py),
against the throwaway ClickHouse 18.16 of CHSTATE_TEST_*, and the
measurements it records name commands that exist."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import docrun  # noqa: E402
from conftest import SUMMARY  # noqa: E402

REPO = docrun.REPO


@pytest.mark.parametrize("page", docrun.pages(), ids=lambda p: str(p.relative_to(REPO)))
def test_the_page_runs_as_it_says(clickhouse, page):
    server = docrun.Server(clickhouse.host, clickhouse.port, clickhouse.user, clickhouse.password)
    failure = None
    try:
        result = docrun.run_page(page, server, log=lambda line: print(line, flush=True))
    except docrun.DocError as e:
        failure = str(e)
    if failure:
        pytest.fail(failure, pytrace=False)
    SUMMARY["pages"].append((result.page, len(result.ran), len(result.not_runnable), result.outputs_checked,
                             result.seconds))
    SUMMARY["ran"] += len(result.ran)
    SUMMARY["outputs"] += result.outputs_checked
    SUMMARY["not_runnable"] += [(b.where(), b.arg) for b in result.not_runnable]


def test_every_page_is_run_or_left_out_with_a_reason():
    every = {"README.md", *(f"docs/{p.name}" for p in (REPO / "docs").glob("*.md")),
             *(str(p.relative_to(REPO)) for p in (REPO / "hosts").glob("*/README.md"))}
    assert "hosts/python/README.md" in every, every
    run = {str(p.relative_to(REPO)) for p in docrun.pages()}
    assert every == run | set(docrun.EXCLUDED)
    assert all(docrun.EXCLUDED.values())


def test_the_recorded_measurements_name_commands_that_exist():
    text = (REPO / "docs" / "performance.md").read_text()
    commands = set(re.findall(r"`(?:python3 )?(tools/[a-z_]+_bench\.py)", text))
    assert len(commands) >= 5, commands
    for command in commands:
        assert (REPO / command).exists(), command
    commits = re.findall(r"Recorded at commit ([0-9a-f]{7,40})\.", text)
    assert len(commits) == text.count("\n## "), "every table says the commit it ran at"
    shallow = subprocess.run(["git", "rev-parse", "--is-shallow-repository"], cwd=REPO, capture_output=True,
                             text=True).stdout.strip()
    if shallow == "false":
        for commit in commits:
            assert subprocess.run(["git", "cat-file", "-e", f"{commit}^{{commit}}"], cwd=REPO).returncode == 0, commit


def test_the_generated_tables_are_what_the_code_holds():
    """The reference tables (tools/gendocs): a default, flag, verb or exit code
    changed in the code only fails here, naming the command that regenerates them."""
    check = subprocess.run([sys.executable, str(REPO / "tools" / "gendocs"), "--check"], cwd=REPO,
                           capture_output=True, text=True, timeout=900)
    assert check.returncode == 0, check.stdout + check.stderr


# What every Linux program links, not named by docs/cli.md's list.
RUNTIME = {"linux-vdso.so.1", "libc.so.6", "libm.so.6", "libstdc++.so.6", "libgcc_s.so.1"}


def test_the_libraries_docs_cli_names_are_what_the_binary_links():
    """docs/cli.md names the shared libraries a machine needs besides the C
    and C++ runtime; `ldd` of the built binary must list exactly those."""
    binary = REPO / "bazel-bin" / "hosts" / "native" / "chstate"
    if not binary.exists():
        subprocess.run(["bazel", "build", "//hosts/native:chstate"], cwd=REPO, check=True)
    text = (REPO / "docs" / "cli.md").read_text()
    para = text[text.index("The binary is not standalone"):]
    para = para[:para.index("\n\n")]
    documented = set(re.findall(r"`(lib[\w+.-]+\.so\.[\d.]+)`", para))
    out = subprocess.run(["ldd", str(binary)], capture_output=True, text=True, check=True).stdout
    linked = {line.split()[0] for line in out.splitlines() if line.strip() and "ld-linux" not in line}
    assert documented, "docs/cli.md lists no libraries"
    assert linked - RUNTIME == documented, (
        f"docs/cli.md names {sorted(documented)}; ldd shows {sorted(linked - RUNTIME)}")
