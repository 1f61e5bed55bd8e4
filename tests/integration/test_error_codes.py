"""What the CLI makes of ClickHouse code 159 (TIMEOUT_EXCEEDED; for ON CLUSTER
DDL: a host did not run the statement within distributed_ddl_task_timeout).

The core classifies it as UNAVAILABLE ("ClickHouse error 159 while ...: ...
Retry later"; core/response.cc, asserted in core/lock_defences_test.cc), and
the CLI maps UNAVAILABLE to exit code 5. The server is real; the fault proxy
(tests/faults/fault_proxy.py) answers the chosen statement with a code-159
exception instead of forwarding it.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "faults"))
import fault_proxy  # noqa: E402
from fault_proxy import FaultProxy  # noqa: E402

pytestmark = pytest.mark.requires_clickhouse

CODE_159 = (b"Code: 159, e.displayText() = DB::Exception: Watching task /clickhouse/task_queue/ddl/query-0000000007 "
            b"is executing longer than distributed_ddl_task_timeout (=10) seconds. There are 1 unfinished hosts "
            b"(0 of them are currently active), e.what() = DB::Exception\n")
EXIT_UNAVAILABLE = 5


@pytest.fixture
def proxy(clickhouse, monkeypatch):
    # The proxy's exception_200 answer, made a code-159 one for these tests.
    monkeypatch.setattr(fault_proxy, "EXCEPTION_BODY", CODE_159)
    p = FaultProxy(clickhouse.host, clickhouse.port)
    yield p
    p.close()


def via(cli, proxy) -> str:
    return f"clickhouse://{cli.server.user}@{cli.server.host}:{proxy.port}/default"


def test_code_159_on_a_read_is_exit_5_naming_the_code(cli, proxy):
    cli.set("src", {"singer_state": {"a": 1}})
    # Every read of the state table answers 159 (retries included).
    proxy.add_rule(r"(?s)^SELECT.*FROM `" + cli.schema + r"`\.`state`", "exception_200", times=100)
    r = cli.run("get", "src", uri=via(cli, proxy), expect=None)
    assert r.returncode == EXIT_UNAVAILABLE, (r.returncode, r.err)
    assert "ClickHouse error 159" in r.err, r.err
    assert "distributed_ddl_task_timeout" in r.err, r.err
    assert "Retry later" in r.err, r.err
    assert r.out == ""
    assert any(q.fault == "exception_200" for q in proxy.requests), proxy.sqls()


def test_code_159_as_json_is_unavailable_with_exit_code_5(cli, proxy):
    cli.set("src", {"singer_state": {"a": 1}})
    proxy.add_rule(r"(?s)^SELECT.*FROM `" + cli.schema + r"`\.`state`", "exception_200", times=100)
    r = cli.run("get", "src", "--json", uri=via(cli, proxy), expect=None)
    assert r.returncode == EXIT_UNAVAILABLE, (r.returncode, r.err)
    error = json.loads(r.out.splitlines()[-1])["error"]
    assert error["code"] == "UNAVAILABLE", error
    assert error["exit_code"] == EXIT_UNAVAILABLE, error
    assert "ClickHouse error 159" in error["message"], error


def test_code_159_on_the_lock_create_is_settled_by_looking_not_resent(cli, proxy):
    # 159 on the lock's CREATE means it may have run on some hosts: the lock
    # looks at the table before anything else, and never runs the command.
    cli.run("init")
    proxy.add_rule(r"(?s)^CREATE TABLE `" + cli.schema + r"`\.`state_lock_", "exception_200", times=1)
    r = cli.run("lock", "src", "--", "true", uri=via(cli, proxy), expect=None)
    sqls = proxy.sqls()
    first = next(i for i, q in enumerate(proxy.requests) if q.fault == "exception_200")
    assert first + 1 < len(sqls), sqls
    after = sqls[first + 1]
    assert "state_lock_" in after and not after.lstrip().upper().startswith("CREATE"), sqls[first:first + 3]
    # The look found no lock (the proxy did not forward the CREATE): the next
    # CREATE goes through and the command runs.
    assert r.returncode == 0, (r.returncode, r.err)
