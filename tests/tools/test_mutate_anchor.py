"""tools/mutate anchors an entry on its text: a file move leaves the entry applying.

A scratch git repository holds a copy of tools/mutate, a list of two entries and the
sources they name; the sources are then moved and checked again.

  python3 -m pytest tests/tools       # from the repository root
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

LIST = """\
id: one
file: core/a.cc
what: a check dropped
--- original
  if (x > 3) return 1;
--- replacement
  if (x > 4) return 1;
--- end

id: two
file: core/b.cc
what: another
--- original
  return y + 1;
--- replacement
  return y;
--- end
"""


def scratch(tmp: Path) -> Path:
    (tmp / "tools").mkdir()
    (tmp / "core").mkdir()
    shutil.copy(REPO / "tools" / "mutate", tmp / "tools" / "mutate")
    (tmp / "tools" / "mutations.txt").write_text(LIST)
    (tmp / "core" / "a.cc").write_text("int f(int x) {\n  if (x > 3) return 1;\n  return 0;\n}\n")
    (tmp / "core" / "b.cc").write_text("int g(int y) {\n  return y + 1;\n}\n")
    git(tmp, "init", "-q")
    git(tmp, "add", ".")
    return tmp


def git(d: Path, *args: str) -> None:
    subprocess.run(["git", "-C", str(d), *args], check=True, capture_output=True)


def check(d: Path, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(d / "tools" / "mutate"), "--check", *extra], cwd=d,
                          capture_output=True, text=True)


def test_an_entry_follows_its_text_to_a_new_file(tmp_path):
    d = scratch(tmp_path)
    assert check(d).returncode == 0
    (d / "core" / "engine").mkdir()
    git(d, "mv", "core/a.cc", "core/engine/a.cc")
    r = check(d)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "moved: one" in r.stdout and "core/engine/a.cc" in r.stdout, r.stdout
    assert "2 of 2 mutations apply" in r.stdout
    # --fix points the entry's file: at the new home, and the next check reports no move.
    assert check(d, "--fix").returncode == 0
    assert "file: core/engine/a.cc" in (d / "tools" / "mutations.txt").read_text()
    assert "moved:" not in check(d).stdout


def test_text_found_in_two_files_is_stale_not_guessed(tmp_path):
    d = scratch(tmp_path)
    for other in ("c.cc", "d.cc"):
        (d / "core" / other).write_text("int h(int y) {\n  return y + 1;\n}\n")
    git(d, "add", ".")
    git(d, "rm", "-qf", "core/b.cc")
    r = check(d)
    assert r.returncode == 1, r.stdout
    assert "stale: two" in r.stdout and "file missing" in r.stdout, r.stdout
    assert "core/c.cc, core/d.cc" in r.stdout, r.stdout
    # Still there once in its own file: it applies there, whatever other files hold.
    (d / "core" / "b.cc").write_text("int g(int y) {\n  return y + 1;\n}\n")
    git(d, "add", ".")
    assert check(d).returncode == 0
