"""The settings Meltano learns from this package (entry-point group
`meltano.settings`), made from the core's settings table (core/settings.h):
every setting of the table as state_backend.clickhouse.<key>, with the same
names, kinds and environment variables as the Python ClickHouse state backend
for the ones it has, so an existing meltano.yml works unchanged; and the
chdb:// backend's own (state_backend.chdb.<key>). Meltano's own
state_backend.uri, lock_timeout_seconds and lock_retry_seconds are Meltano's.

    state_backend:
      uri: clickhouse://meltano@clickhouse.internal:8123/default
      clickhouse:
        secure: true
        schema: meltano_prod
    # password: MELTANO_STATE_BACKEND_CLICKHOUSE_PASSWORD

pyproject.toml names one entry point per definition (Meltano loads each);
tests/meltano/test_core_choice.py checks the list against the core's table.
"""

from __future__ import annotations

from meltano.core.setting_definition import SettingDefinition, SettingKind

from . import _core
from ._conflicts import warn_once

# Meltano loads these settings whichever package it then picks for the
# scheme: the one place to say that two packages register it.
warn_once()

_KINDS = {"text": SettingKind.STRING, "secret": SettingKind.PASSWORD, "bool": SettingKind.BOOLEAN,
          "port": SettingKind.INTEGER, "count": SettingKind.INTEGER, "seconds": SettingKind.DECIMAL}

# The chdb:// backend (an embedded engine: no server to connect to) takes these.
CHDB_KEYS = ("schema", "table", "lock_wait_seconds", "linger_locks", "history_days", "history_versions")


def _definition(namespace: str, row: dict) -> SettingDefinition:
    default = f" (default: {row['default']})" if row["default"] else ""
    return SettingDefinition(name=f"state_backend.{namespace}.{row['key']}",
                             label=row["key"].replace("_", " ").capitalize(),
                             description=f"{row['meaning']}{default}; chstate",
                             kind=_KINDS[row["type"]], env_specific=True,
                             sensitive=row["type"] == "secret")


def definitions() -> dict:
    """Attribute name -> SettingDefinition, from the core's table."""
    out = {}
    for row in _core.settings_table()["settings"]:
        if row["meltano"] != f"state_backend.clickhouse.{row['key']}":
            continue  # Meltano's own (uri, lock_timeout_seconds, lock_retry_seconds)
        out[f"CLICKHOUSE_{row['key'].upper()}"] = _definition("clickhouse", row)
        if row["key"] in CHDB_KEYS:
            out[f"CHDB_{row['key'].upper()}"] = _definition("chdb", row)
    return out


globals().update(definitions())
