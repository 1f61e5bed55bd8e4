// Connection configuration: parsing `clickhouse://` URIs and resolving settings
// from every place a user can give them, in one documented precedence order.
//
// The core never reads the environment: hosts collect flags and environment
// variables into maps and pass them in.
//
//   chstate::ConfigSources src;
//   src.flags = {{"uri", "clickhouse://me:pw@db.internal/analytics"}, {"port", "9123"}};
//   src.env = {{"MELTANO_STATE_BACKEND_CLICKHOUSE_SCHEMA", "meltano_prod"}};
//   absl::StatusOr<chstate::ConnectionConfig> cfg = chstate::ResolveConfig(src);
//   // cfg->host == "db.internal", cfg->port == 9123, cfg->schema == "meltano_prod"
//
// Precedence, per setting, first match wins (docs/settings.md explains why):
//   1. a granular command-line flag (--host, --port, ... ; flags["host"], ...)
//   2. the component of the --uri flag (flags["uri"])
//   3. MELTANO_STATE_BACKEND_CLICKHOUSE_<KEY> (what Meltano's granular settings map to)
//   4. the component of MELTANO_STATE_BACKEND_URI
//   5. CLICKHOUSE_<KEY> (HOST, PORT, USER, PASSWORD, DATABASE, SECURE, SCHEMA,
//      TABLE), the generic variables
//   6. defaults: host localhost, port 8123 (8443 when secure), secure false,
//      schema "meltano", table "state". user and database have no default.
#ifndef CHSTATE_CORE_CONFIG_H_
#define CHSTATE_CORE_CONFIG_H_

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/defaults.h"
#include "core/endpoint.h"

namespace chstate {

// The settings keys, as Meltano names them (state_backend.clickhouse.<key>).
// ca_file and the cluster keys are chstate additions: `cluster` names the
// ClickHouse cluster (remote_servers) and switches on cluster mode (README
// "Cluster mode"); `zookeeper_path` and `replica` override the macros the
// replicated tables are created with; `quorum` is how many replicas confirm
// each write.
inline constexpr const char* kSettingKeys[] = {"host",   "port",  "database", "user",    "password",
                                               "secure", "schema", "table",   "ca_file", "cluster",
                                               "zookeeper_path", "replica", "quorum"};

// Defaults of the cluster settings: the macros most clusters define.
inline constexpr const char* kDefaultZooKeeperPath = "/clickhouse/tables/{shard}";
inline constexpr const char* kDefaultReplica = "{replica}";

// What a `clickhouse://` URI specified. Absent components stay nullopt.
struct UriParts {
  std::optional<std::string> user;      // percent-decoded
  std::optional<std::string> password;  // percent-decoded
  std::optional<std::string> host;      // IPv6 literals without brackets: "::1"
  std::optional<int> port;
  // Several hosts (`h1:8123,h2:8123,h3`): every one with its port if it has
  // one; `host` and `port` are then the first's. Empty for one host.
  std::vector<std::pair<std::string, std::optional<int>>> hosts;
  std::optional<std::string> database;  // the path, percent-decoded, without "/"
  std::optional<bool> secure;           // ?secure=true|false|1|0
  std::optional<std::string> schema;    // ?schema=...
  std::optional<std::string> table;     // ?table=...
  std::optional<std::string> ca_file;   // ?ca_file=...
  std::optional<std::string> cluster;         // ?cluster=...
  std::optional<std::string> zookeeper_path;  // ?zookeeper_path=...
  std::optional<std::string> replica;         // ?replica=...
  std::optional<std::string> quorum;          // ?quorum=N (checked by ResolveConfig)
};

// Parses `clickhouse://[user[:password]@]host[:port][,host[:port]...][/database][?key=value&...]`.
// Also accepts the schemes `clickhouses://` (secure=true) and `http(s)://`.
// An empty host, user, password or value is "not given" (other layers or the
// default apply). Errors (all kInvalidArgument, message names the problem and
// the fix): wrong scheme, bad port (not 1..65535), bad percent-escape, unknown
// or repeated query key, bad boolean, bracketed host not closed, a fragment,
// a scheme that contradicts ?secure=, and a raw '@' after the host (a password
// holding '/', '?' or '#' must be percent-encoded, or it would spill into the
// path and be echoed).
// The password never appears in an error message.
absl::StatusOr<UriParts> ParseClickHouseUri(absl::string_view uri);

struct ConnectionConfig {
  // The first (or only) host. The `host` setting may be a comma-separated
  // list, each item with its own port or the `port` setting's (README
  // "Cluster mode"); several hosts need cluster mode.
  std::string host = "localhost";
  int port = 8123;
  // Every host, the first being host:port; at least one.
  std::vector<Endpoint> hosts;
  bool secure = false;
  std::string user;
  std::string password;
  std::string database;  // connection database (required, as in the Python backend)
  std::string schema = "meltano";  // database that holds the state tables
  std::string table = "state";
  std::string ca_file;  // empty: the system trust store
  // Cluster mode when not empty: ON CLUSTER DDL, replicated tables, quorum
  // writes and sequentially consistent reads (core/statements.h).
  std::string cluster;
  // Prefix of the replicated tables' ZooKeeper paths (the table path is
  // <zookeeper_path>/<schema>/<table>) and the replica name; macros in braces
  // are expanded by each server.
  std::string zookeeper_path = kDefaultZooKeeperPath;
  std::string replica = kDefaultReplica;
  // Replicas that confirm each write (insert_quorum); at least 2.
  int quorum = kDefaultQuorum;

  // Where each setting came from, e.g. origin["host"] == "--uri flag".
  std::map<std::string, std::string> origin;

  // clickhouse://user@host:port/database?secure=...&schema=...&table=...
  // (then &cluster=... and any non-default zookeeper_path / replica / quorum)
  // Never contains the password (it shows "***" when one is set).
  std::string RedactedUri() const;
};

// How a host's own values are named in messages ("--port flag",
// "state_backend.clickhouse.port", "the port setting"), so that an error
// names the place the user typed the value.
enum class SettingsFrom {
  kCli,      // command-line flags (chstate)
  kMeltano,  // Meltano's settings (the adapter; Meltano folded its variables in)
  kApi,      // an API's table or object (Lua's chstate.open{...}, JS, Python)
};

struct ConfigSources {
  std::map<std::string, std::string> flags;  // keys: "uri" and kSettingKeys
  std::map<std::string, std::string> env;    // environment variables by name
  SettingsFrom from = SettingsFrom::kCli;    // how `flags` are named in messages
};

// Where a value of `key` given in a host's own values came from, as messages
// name it: "--ca-file flag", "state_backend.clickhouse.ca_file" ("state_backend.uri"
// for the URI), "the ca_file setting". `meltano_namespace` is the backend's
// ("clickhouse", "chdb"); `meltano_core` keys are Meltano's own
// (state_backend.<key>).
std::string ValueOrigin(SettingsFrom from, absl::string_view key, bool meltano_core = false,
                        absl::string_view meltano_namespace = "clickhouse");

// Resolves the precedence order above. Errors (kInvalidArgument): a malformed
// URI or value (names the variable or flag it came from); a missing user or
// database (names every place it can be set). Schema and table are validated
// as identifiers ([A-Za-z_][A-Za-z0-9_]*, at most 64 bytes); a cluster name
// as [A-Za-z0-9_.-]{1,128}; zookeeper_path must start with '/' and, like
// replica, hold only [A-Za-z0-9_./{}-] (they are written into DDL); a
// quorum is a whole number from 2 to 1000, and needs cluster mode.
absl::StatusOr<ConnectionConfig> ResolveConfig(const ConfigSources& sources);

// Decodes %HH escapes; nullopt for a malformed escape.
std::optional<std::string> PercentDecodeText(absl::string_view in);

// Parses "true/false/1/0/yes/no/on/off" (case-insensitive).
std::optional<bool> ParseBool(absl::string_view text);

}  // namespace chstate

#endif  // CHSTATE_CORE_CONFIG_H_
