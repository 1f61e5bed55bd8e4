"""A checker for histories of merges and reads of shared state ids.

Each merge adds one key no other merge adds (`{"singer_state": {KEY: 1}}`),
so an id's state is a grow-only set of keys, and a history is linearizable
exactly when the reads and merges can be given points in time, each within
its own [invoke, complete] interval, such that every read returns the keys
of the merges placed before it. An operation whose outcome is unknown (it
failed, maybe after the server did the work) may be placed anywhere after
its invocation, or left out; a failed read constrains nothing.

The check is exact for this model:
  1. the values of the reads of one id form a chain under inclusion (two
     reads that each saw a key the other did not cannot both be right);
  2. walking that chain from the smallest value, each step's new keys are
     placed as early as their merges allow (after every earlier read), and
     then the step's reads as early as they allow (after those merges); a
     merge or read that cannot be placed before it completed is an anomaly;
  3. a merge acknowledged as done must be in the final state (read from the
     server at the end, as one more read after everything), and every key
     of a read or of the final state comes from a merge that was invoked.

Placing each group as early as possible leaves the most room for the next,
so when this walk fails, no order exists (the values being a chain fixes the
order of the groups).
"""

from __future__ import annotations

import dataclasses
import math


@dataclasses.dataclass
class Op:
    runtime: str
    kind: str      # "merge" or "read"
    state_id: str
    t0: float      # invoked (wall clock, seconds)
    t1: float      # completed; math.inf for an unknown outcome
    outcome: str   # "ok", "fail" (did not happen), "unknown" (may have happened)
    key: str = ""  # merge: the key it adds
    value: frozenset = frozenset()  # read: the keys it returned
    detail: str = ""


def check(ops: list[Op], final: dict[str, frozenset], end: float) -> list[str]:
    """The anomalies of a history (empty when it is linearizable), given each id's final
    keys read at `end`, after every operation completed."""
    anomalies: list[str] = []
    for state_id in sorted({o.state_id for o in ops} | set(final)):
        mine = [o for o in ops if o.state_id == state_id]
        anomalies += [f"{state_id}: {a}" for a in _check_id(mine, final.get(state_id, frozenset()), end)]
    return anomalies


def _check_id(ops: list[Op], final: frozenset, end: float) -> list[str]:
    out: list[str] = []
    merges = {o.key: o for o in ops if o.kind == "merge"}
    acked = {k for k, o in merges.items() if o.outcome == "ok"}
    for k in sorted(acked - final):
        out.append(f"acknowledged merge lost: {k} ({merges[k].runtime}), not in the final state")
    reads = [o for o in ops if o.kind == "read" and o.outcome == "ok"]
    reads.append(Op("server", "read", "", end, math.inf, "ok", value=final, detail="the final state"))
    for r in reads:
        ghosts = sorted(k for k in r.value if k not in merges or merges[k].outcome == "fail")
        if ghosts:
            out.append(f"a read ({r.runtime}, {r.detail or 'at %.3f' % r.t0}) returned keys no merge that "
                       f"may have happened added: {ghosts[:5]}")
    if out:
        return out
    # 1. The values form a chain.
    values = sorted({r.value for r in reads}, key=len)
    for a, b in zip(values, values[1:]):
        if not a <= b:
            return [f"two reads saw different keys each: {sorted(a - b)[:3]} and {sorted(b - a)[:3]} "
                    "(no order of the merges gives both)"]
    # 2. Place the groups as early as they allow.
    cursor = -math.inf
    seen: frozenset = frozenset()
    for v in values:
        new = v - seen
        placed = cursor
        for k in sorted(new):
            m = merges[k]
            at = max(cursor, m.t0)
            if at > m.t1:
                out.append(f"merge {k} ({m.runtime}) completed at {m.t1:.3f} but is seen only by a read "
                           f"that must come after {cursor:.3f} (a read that began after it ended missed it)")
            placed = max(placed, at)
        group_end = placed
        for r in (r for r in reads if r.value == v):
            at = max(placed, r.t0)
            if at > r.t1:
                out.append(f"a read ({r.runtime}) completed at {r.t1:.3f} returned keys whose merges must "
                           f"come after {placed:.3f}")
            group_end = max(group_end, at)
        # Acknowledged merges this group's reads did not see must complete after them.
        for k in sorted(acked - v):
            if merges[k].t1 < group_end:
                out.append(f"merge {k} ({merges[k].runtime}) was acknowledged at {merges[k].t1:.3f}, before "
                           f"a read that did not see it must have run (by {group_end:.3f})")
        cursor, seen = group_end, v
        if out:
            return out
    return out
