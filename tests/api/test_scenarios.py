"""One scenario suite through every host's public API (tests/api/README.md).

The scenarios (scenarios.json) are replayed by a driver per language through
the API a user of that host calls: the chstate command and the Meltano
adapter (driver.py), wasmtime and Extism from Python (driver.py), Node and
Extism from JS (driver.mjs), Lua 5.4 and LuaJIT (driver.lua). Each host's
transcript must equal the expected one, step for step; where a host differs
by design the scenario says so and why (expect_by_host, skip_hosts), and the
test prints those reasons. The hosts run side by side, each in its own
schemas, against the server of CHSTATE_TEST_* (ClickHouse 18.16, or the chDB
front when tools/test runs the suite against the modern engine).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
SCENARIOS = json.loads((HERE / "scenarios.json").read_text())
HOSTS = ["cli", "meltano", "meltano-wasm", "wasmtime", "extism", "node", "extism-js", "lua54", "luajit"]
# meltano-wasm is the Meltano adapter of the pure wheel: what it must do is what `meltano` must.
AS_HOST = {"meltano-wasm": "meltano"}


def expected(scenario: dict, host: str) -> dict:
    """The transcript a host must produce for a scenario."""
    want: dict = {"scenario": scenario["name"]}
    host = AS_HOST.get(host, host)
    opened = scenario.get("open_expect_by_host", {}).get(host, scenario.get("open_expect", {"ok": None}))
    want["open"] = {k: v for k, v in opened.items() if k != "why"}
    want["steps"] = [] if "error" in want["open"] else [step_expected(s, host) for s in scenario["steps"]]
    return want


def step_expected(step: dict, host: str) -> dict:
    if host in step.get("skip_hosts", {}):
        return {"skipped": step["skip_hosts"][host]}
    want = dict(step.get("expect_by_host", {}).get(host, step["expect"]))
    want.pop("why", None)
    if step.get("steps"):
        want["steps"] = [step_expected(s, host) for s in step["steps"]]
    return want


@pytest.fixture(scope="module")
def transcripts(clickhouse_env, drivers):
    """Every host's transcript, the hosts run side by side."""
    prefix = f"api_{uuid.uuid4().hex[:8]}"

    def run(host: str):
        cmd, env = drivers[host]
        proc = subprocess.run([*cmd, host, f"{prefix}_{host.replace('-', '_')}"], env=env, capture_output=True,
                              text=True, timeout=900, cwd=HERE)
        if proc.returncode != 0 or not proc.stdout.strip():
            return {"crashed": f"exit {proc.returncode}\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}"}
        return json.loads(proc.stdout)

    with ThreadPoolExecutor(max_workers=4) as pool:
        results = dict(zip(HOSTS, pool.map(run, HOSTS)))
    if os.environ.get("CHSTATE_API_TRANSCRIPTS"):  # for a person reading them
        Path(os.environ["CHSTATE_API_TRANSCRIPTS"]).write_text(json.dumps(results, indent=1, ensure_ascii=False))
    yield results
    # Each host's schemas go with the server's next test run (a throwaway server).


@pytest.mark.parametrize("host", HOSTS)
@pytest.mark.parametrize("scenario", SCENARIOS["scenarios"], ids=[s["name"] for s in SCENARIOS["scenarios"]])
def test_host_follows_the_scenario(transcripts, host, scenario):
    got = transcripts[host]
    assert "crashed" not in got, f"the {host} driver failed: {got.get('crashed') if isinstance(got, dict) else ''}"
    mine = next((t for t in got if t["scenario"] == scenario["name"]), None)
    assert mine is not None, f"{host} has no transcript for {scenario['name']}"
    assert mine == expected(scenario, host)


def test_transcripts_differ_only_where_a_scenario_says_why(transcripts):
    """Apart from the differences the scenarios declare (each with its
    reason), every host's transcript is the same."""
    reasons = []
    for scenario in SCENARIOS["scenarios"]:
        for host, exp in scenario.get("open_expect_by_host", {}).items():
            reasons.append(f"{scenario['name']} open, {host}: {exp['why']}")
        for step in scenario["steps"]:
            for host, exp in step.get("expect_by_host", {}).items():
                reasons.append(f"{scenario['name']}, {host}: {exp['why']}")
            for host, why in step.get("skip_hosts", {}).items():
                reasons.append(f"{scenario['name']}, {host} skips a step: {why}")
    assert all(reasons), reasons
    print("\n".join(reasons))
    plain = [h for h in HOSTS if not isinstance(transcripts[h], dict)]
    assert plain == HOSTS, "a driver crashed"
