"""The settings Meltano learns from this package (entry-point group
`meltano.settings`): the same names, kinds and environment variables as the
Python ClickHouse state backend, so an existing meltano.yml works unchanged,
plus chstate's `ca_file` and the cluster-mode settings `cluster`,
`zookeeper_path`, `replica` and `quorum` (README "Cluster mode").

    state_backend:
      uri: clickhouse://meltano@clickhouse.internal:8123/default
      clickhouse:
        secure: true
        schema: meltano_prod
    # password: MELTANO_STATE_BACKEND_CLICKHOUSE_PASSWORD
"""

from __future__ import annotations

from meltano.core.setting_definition import SettingDefinition, SettingKind

from ._conflicts import warn_once

# Meltano loads these settings whichever package it then picks for the
# scheme: the one place to say that two packages register it.
warn_once()


def _setting(key: str, label: str, description: str, kind: SettingKind, **extra) -> SettingDefinition:
    return SettingDefinition(name=f"state_backend.clickhouse.{key}", label=label, description=description,
                             kind=kind, env_specific=True, **extra)


CLICKHOUSE_HOST = _setting("host", "ClickHouse Host", "ClickHouse server hostname, or a comma-separated list of "
                           "host[:port] entries (h1:8123,h2:8123; cluster mode only): chstate picks one for each "
                           "request and goes on to the next when one is unreachable", SettingKind.STRING)
CLICKHOUSE_PORT = _setting("port", "ClickHouse Port", "ClickHouse HTTP interface port (default 8123, 8443 when "
                           "secure)", SettingKind.INTEGER)
CLICKHOUSE_DATABASE = _setting("database", "ClickHouse Database", "ClickHouse database name (the connection's "
                               "database; required)", SettingKind.STRING)
CLICKHOUSE_USER = _setting("user", "ClickHouse User", "ClickHouse username", SettingKind.STRING)
CLICKHOUSE_PASSWORD = _setting("password", "ClickHouse Password", "ClickHouse password", SettingKind.STRING,
                               sensitive=True)
CLICKHOUSE_SECURE = _setting("secure", "ClickHouse Secure (TLS)", "Connect to ClickHouse over HTTPS/TLS",
                             SettingKind.BOOLEAN)
CLICKHOUSE_SCHEMA = _setting("schema", "ClickHouse Database/Schema", "ClickHouse database used for state storage "
                             "(default: meltano)", SettingKind.STRING)
CLICKHOUSE_TABLE = _setting("table", "ClickHouse Table", "ClickHouse table name for state storage (default: state)",
                            SettingKind.STRING)
CLICKHOUSE_CA_FILE = _setting("ca_file", "ClickHouse CA File", "PEM file of the CA that signed the server's "
                              "certificate (default: the system trust store); chstate only", SettingKind.STRING)
CLICKHOUSE_CLUSTER = _setting("cluster", "ClickHouse Cluster", "Cluster name (remote_servers): switches on cluster "
                              "mode: ON CLUSTER DDL, replicated tables, quorum writes, sequentially consistent "
                              "reads; chstate only", SettingKind.STRING)
CLICKHOUSE_ZOOKEEPER_PATH = _setting("zookeeper_path", "ClickHouse ZooKeeper Path", "Cluster mode: prefix of the "
                                     "replicated tables' ZooKeeper paths (default /clickhouse/tables/{shard}); "
                                     "chstate only", SettingKind.STRING)
CLICKHOUSE_REPLICA = _setting("replica", "ClickHouse Replica", "Cluster mode: replica name of the replicated "
                              "tables (default {replica}); chstate only", SettingKind.STRING)
CLICKHOUSE_QUORUM = _setting("quorum", "ClickHouse Write Quorum", "Cluster mode: replicas that must confirm each "
                             "write (insert_quorum; default 2, at least 2: with three replicas, writes and locks go on "
                             "with one down); chstate only", SettingKind.INTEGER)

# The chdb:// backend's settings (state_backend.chdb.<key>; Meltano passes the
# namespace of the URI's scheme). They win over the URI's ?schema=&table=.
CHDB_SCHEMA = SettingDefinition(name="state_backend.chdb.schema", label="chDB Database/Schema",
                                description="Database of the embedded state table (default: meltano; the chdb:// "
                                "URI's ?schema= is used when this is not set)", kind=SettingKind.STRING,
                                env_specific=True)
CHDB_TABLE = SettingDefinition(name="state_backend.chdb.table", label="chDB Table",
                               description="Embedded state table (default: state; the chdb:// URI's ?table= is used "
                               "when this is not set)", kind=SettingKind.STRING, env_specific=True)

# The lock's wait, per backend (state_backend.lock_timeout_seconds is the
# lock's validity, as Meltano defines it; see backend.py).
_WAIT = ("How long an update waits for a state id's lock held by another process before it fails (default: twice "
         "state_backend.lock_timeout_seconds plus one retry, long enough to take over a dead holder's lock)")
CLICKHOUSE_LOCK_WAIT_SECONDS = _setting("lock_wait_seconds", "Lock Wait (seconds)", _WAIT, SettingKind.INTEGER)
CHDB_LOCK_WAIT_SECONDS = SettingDefinition(name="state_backend.chdb.lock_wait_seconds", label="Lock Wait (seconds)",
                                           description=_WAIT, kind=SettingKind.INTEGER, env_specific=True)

# State history (README "State history"): how long each version is kept.
_HISTORY = ("Days each state version is kept in the state history (default 30; 0: no history table). "
            "`chstate history ID` lists the versions and `chstate rollback ID VERSION` restores one; chstate only")
CLICKHOUSE_HISTORY_DAYS = _setting("history_days", "State History (days)", _HISTORY, SettingKind.INTEGER)
_VERSIONS = ("At most this many versions of each state id are kept in the state history (default 1000; 0: no "
             "limit); applied as states are written, and by `meltano upgrade` and `chstate compact`; chstate only")
CLICKHOUSE_HISTORY_VERSIONS = _setting("history_versions", "State History (versions per id)", _VERSIONS,
                                       SettingKind.INTEGER)
CHDB_HISTORY_VERSIONS = SettingDefinition(name="state_backend.chdb.history_versions",
                                          label="State History (versions per id)", description=_VERSIONS,
                                          kind=SettingKind.INTEGER, env_specific=True)
CHDB_HISTORY_DAYS = SettingDefinition(name="state_backend.chdb.history_days", label="State History (days)",
                                      description=_HISTORY, kind=SettingKind.INTEGER, env_specific=True)

# A mixed fleet during a migration from the Python ClickHouse backend.
CLICKHOUSE_PYTHON_LOCKS = _setting("python_locks", "Share Locks With The Python Backend",
                                   "Also lock the way the Python ClickHouse backend does (its rows in <table>_lock), so "
                                   "that pipelines still on that backend and pipelines on chstate never run one state id "
                                   "at once; costs about a second per lock taken. For the time of a migration; chstate "
                                   "only", SettingKind.BOOLEAN)
