"""Another installed package registering the same state backend scheme.

The Python ClickHouse backend also registers `clickhouse` in the entry-point
group `meltano.state_backends`. With both installed, Meltano takes the first
entry point of that name in the order Python finds distributions on sys.path
(`entry_points(group=...)[name]`), which is effectively arbitrary. This says
so once per process, naming the package in use and how to remove the other.
"""

from __future__ import annotations

import logging
from importlib.metadata import entry_points

logger = logging.getLogger("chstate_meltano")

OURS = "chstate-meltano"
SCHEMES = ("clickhouse", "chdb")
_warned = False


def _dist_name(ep) -> str:
    dist = getattr(ep, "dist", None)
    return dist.name if dist is not None and dist.name else ep.value.split(":")[0].split(".")[0]


def _normal(name: str) -> str:
    return name.lower().replace("_", "-")


def conflicts() -> list[str]:
    """One message per scheme that another distribution also registers."""
    found = entry_points(group="meltano.state_backends")
    messages = []
    for scheme in SCHEMES:
        eps = list(found.select(name=scheme))
        others = sorted({_dist_name(ep) for ep in eps if _normal(_dist_name(ep)) != OURS})
        if not others or not any(_normal(_dist_name(ep)) == OURS for ep in eps):
            continue
        in_use = _dist_name(eps[0])
        remove = [OURS] if _normal(in_use) != OURS else others
        messages.append(
            f"two installed packages register the {scheme}:// state backend: {', '.join(sorted({OURS, *others}))}. "
            f"Meltano uses the first it finds, here {in_use}. Keep one: remove "
            f"{' and '.join(remove)} from Meltano's environment (pip uninstall {' '.join(remove)}, or "
            f"`uv tool install meltano --with ...` / `pipx inject` with only the one you want)")
    return messages


def warn_once() -> None:
    global _warned
    if _warned:
        return
    _warned = True
    try:
        messages = conflicts()
    except Exception:  # metadata of another package is none of our business to crash on
        return
    for message in messages:
        logger.warning("chstate: %s", message)
