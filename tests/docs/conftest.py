"""The doc test's summary: how many blocks ran, how many did not and why."""

from __future__ import annotations

SUMMARY: dict = {"pages": [], "not_runnable": [], "ran": 0, "outputs": 0, "text": 0}


def pytest_terminal_summary(terminalreporter):
    if not SUMMARY["pages"]:
        return
    tr = terminalreporter
    tr.write_sep("-", "docs: blocks run and not runnable")
    for page, ran, skipped, outputs, secs in SUMMARY["pages"]:
        tr.write_line(f"{page}: {ran} run, {skipped} not runnable, {outputs} outputs compared ({secs:.0f} s)")
    tr.write_line(f"in all: {SUMMARY['ran']} blocks run, {len(SUMMARY['not_runnable'])} not runnable, "
                  f"{SUMMARY['outputs']} outputs compared")
    for where, why in SUMMARY["not_runnable"]:
        tr.write_line(f"  not runnable, {where}: {why}")
    from docrun import EXCLUDED

    for page, why in EXCLUDED.items():
        tr.write_line(f"  page left out, {page}: {why}")
