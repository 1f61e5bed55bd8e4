"""The JS binding of the verbs (hosts/wasi/chstate_binding.mjs) over a
scripted core, without the module or a server: tests/wasi/node_runner.mjs
binding, one result per case."""

from __future__ import annotations

import pytest

CASES = ["idle_timer_survives_early_wakes"]


@pytest.mark.parametrize("name", CASES)
def test_js_binding(node_results, name):
    results = node_results("binding")
    assert f"binding_{name}" in results, results
    assert results[f"binding_{name}"]["ok"], results[f"binding_{name}"]["detail"]
