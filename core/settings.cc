// The settings table and its resolver (core/settings.h).
#include "core/settings.h"

#include <algorithm>
#include <cmath>
#include <iterator>
#include <cstdint>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "core/defaults.h"
#include "core/quoting.h"
#include "re2/re2.h"

namespace chstate {

using G = SettingGroup;
using T = SettingType;

const SettingSpec kSettings[] = {
    // ---- where the state lives (core/config.h resolves these) ----
    {"uri", T::kText, G::kConnection, kNoNumber, "", true, "MELTANO_STATE_BACKEND_URI", "uri", 0,
     "clickhouse://USER[:PASSWORD]@HOST[:PORT][,HOST[:PORT]...]/DATABASE[?secure=true&schema=S&table=T...]; "
     "chdb:///DIR for an embedded chDB (Python)"},
    {"host", T::kText, G::kConnection, kNoNumber, "localhost", false, "MELTANO_STATE_BACKEND_CLICKHOUSE_HOST", "host",
     0, "server host; several (cluster mode): h1:8123,h2:8123"},
    {"port", T::kPort, G::kConnection, kNoNumber, "8123 (8443 with secure)", false,
     "MELTANO_STATE_BACKEND_CLICKHOUSE_PORT", "port", 0, "HTTP(S) port"},
    {"database", T::kText, G::kConnection, kNoNumber, "", false, "MELTANO_STATE_BACKEND_CLICKHOUSE_DATABASE",
     "database", 0, "database to connect to (required)"},
    {"user", T::kText, G::kConnection, kNoNumber, "", false, "MELTANO_STATE_BACKEND_CLICKHOUSE_USER", "user", 0,
     "user name (required)"},
    {"password", T::kSecret, G::kConnection, kNoNumber, "", false, "MELTANO_STATE_BACKEND_CLICKHOUSE_PASSWORD",
     "password", 0, "password (prefer the environment variable: a flag shows in the process list)"},
    {"secure", T::kBool, G::kConnection, kNoNumber, "false", false, "MELTANO_STATE_BACKEND_CLICKHOUSE_SECURE", "secure",
     0, "HTTPS, verifying the server's certificate"},
    {"schema", T::kText, G::kConnection, kNoNumber, "meltano", false, "MELTANO_STATE_BACKEND_CLICKHOUSE_SCHEMA",
     "schema", 0, "database that holds the state tables"},
    {"table", T::kText, G::kConnection, kNoNumber, "state", false, "MELTANO_STATE_BACKEND_CLICKHOUSE_TABLE", "table",
     0, "state table"},
    {"ca_file", T::kText, G::kConnection, kNoNumber, "", false, "MELTANO_STATE_BACKEND_CLICKHOUSE_CA_FILE", "ca-file",
     0, "PEM file of the CA that signed the server's certificate (default: the system trust store)"},
    // ---- cluster mode ----
    {"cluster", T::kText, G::kCluster, kNoNumber, "", false, "MELTANO_STATE_BACKEND_CLICKHOUSE_CLUSTER", "cluster", 0,
     "cluster name (remote_servers): ON CLUSTER DDL, replicated tables, quorum writes"},
    {"zookeeper_path", T::kText, G::kCluster, kNoNumber, kDefaultZooKeeperPath, false,
     "MELTANO_STATE_BACKEND_CLICKHOUSE_ZOOKEEPER_PATH", "zookeeper-path", 0,
     "cluster mode: prefix of the replicated tables' ZooKeeper paths"},
    {"replica", T::kText, G::kCluster, kNoNumber, kDefaultReplica, false, "MELTANO_STATE_BACKEND_CLICKHOUSE_REPLICA",
     "replica", 0, "cluster mode: replica name of the replicated tables"},
    {"quorum", T::kCount, G::kCluster, kDefaultQuorum, "", false, "MELTANO_STATE_BACKEND_CLICKHOUSE_QUORUM", "quorum",
     2, "cluster mode: replicas that confirm each write (at least 2)"},
    {"quorum_timeout_seconds", T::kSeconds, G::kCluster, kDefaultQuorumTimeoutMs, "", false,
     "MELTANO_STATE_BACKEND_CLICKHOUSE_QUORUM_TIMEOUT_SECONDS", "", 0.001,
     "cluster mode: a write waits this long for its quorum (code 319 after)"},
    {"quorum_busy_seconds", T::kSeconds, G::kCluster, kDefaultQuorumBusyMs, "", false,
     "MELTANO_STATE_BACKEND_CLICKHOUSE_QUORUM_BUSY_SECONDS", "", 0,
     "cluster mode: a write refused because an earlier one is unconfirmed (code 286) retries this long"},
    {"ddl_timeout_seconds", T::kSeconds, G::kCluster, kDefaultDdlTimeoutS * 1000, "", false,
     "MELTANO_STATE_BACKEND_CLICKHOUSE_DDL_TIMEOUT_SECONDS", "", 1,
     "cluster mode: ON CLUSTER DDL waits this long for every host (whole seconds)"},
    {"host_down_seconds", T::kSeconds, G::kCluster, kDefaultHostDownMs, "", false,
     "MELTANO_STATE_BACKEND_CLICKHOUSE_HOST_DOWN_SECONDS", "", 0,
     "several hosts: a host that failed is skipped this long"},
    // ---- the lock ----
    {"lock_timeout_seconds", T::kSeconds, G::kLock, kDefaultStaleLockMs, "", true,
     "MELTANO_STATE_BACKEND_LOCK_TIMEOUT_SECONDS", "stale-lock", kMinStaleLockMs / 1000.0,
     "the lock's validity (Meltano's meaning): a lock not renewed for this long is taken over; the holder renews "
     "every third of it"},
    {"lock_retry_seconds", T::kSeconds, G::kLock, kDefaultLockRetryMs, "", true,
     "MELTANO_STATE_BACKEND_LOCK_RETRY_SECONDS", "lock-retry", 0.001, "wait between attempts at a held lock"},
    {"lock_wait_seconds", T::kSeconds, G::kLock, kNoNumber, "2 x lock_timeout_seconds + lock_retry_seconds", false,
     "MELTANO_STATE_BACKEND_CLICKHOUSE_LOCK_WAIT_SECONDS", "lock-timeout", 0,
     "how long taking a lock held by another process waits before it fails (0: try once)"},
    {"python_locks", T::kBool, G::kLock, kNoNumber, "false", false, "MELTANO_STATE_BACKEND_CLICKHOUSE_PYTHON_LOCKS",
     "python-locks", 0,
     "also lock the way the Python ClickHouse backend does, for a mixed fleet during a migration (rows of that "
     "backend are honoured either way)"},
    {"linger_locks", T::kBool, G::kLock, kNoNumber, "true where the runtime renews in the background and releases at "
     "exit (Python); a runtime that cannot never lingers", false, "MELTANO_STATE_BACKEND_CLICKHOUSE_LINGER_LOCKS", "", 0,
     "keep a released lock a moment for the next acquisition by the same process (the lock off the hot path)"},
    // ---- timeouts ----
    {"connect_timeout_seconds", T::kSeconds, G::kTimeouts, kDefaultConnectTimeoutMs, "", false,
     "MELTANO_STATE_BACKEND_CLICKHOUSE_CONNECT_TIMEOUT_SECONDS", "connect-timeout", 0.001,
     "TCP/TLS connection set-up"},
    {"request_timeout_seconds", T::kSeconds, G::kTimeouts, kDefaultRequestTimeoutMs, "", false,
     "MELTANO_STATE_BACKEND_CLICKHOUSE_REQUEST_TIMEOUT_SECONDS", "timeout", 0.001,
     "one request, sent and answered"},
    {"mutation_timeout_seconds", T::kSeconds, G::kTimeouts, kDefaultMutationTimeoutMs, "", false,
     "MELTANO_STATE_BACKEND_CLICKHOUSE_MUTATION_TIMEOUT_SECONDS", "", 0,
     "18.x: a delete's mutation may run this long"},
    // ---- history ----
    {"history_days", T::kCount, G::kHistory, kDefaultHistoryDays, "", false,
     "MELTANO_STATE_BACKEND_CLICKHOUSE_HISTORY_DAYS", "history-days", 0,
     "state history: each version is kept this many days (0: no history table)"},
    {"history_versions", T::kCount, G::kHistory, kDefaultHistoryVersions, "", false,
     "MELTANO_STATE_BACKEND_CLICKHOUSE_HISTORY_VERSIONS", "history-versions", 0,
     "state history: at most this many versions of each id (0: no limit by count)"},
};
const size_t kSettingsCount = sizeof(kSettings) / sizeof(kSettings[0]);

const RenamedSetting kRenamedSettings[] = {
    // The Lua module's and the store options' earlier names.
    {"stale_lock", "lock_timeout_seconds"},
    {"stale_lock_ms", "lock_timeout_seconds"},
    {"lock_timeout", "lock_wait_seconds"},
    {"lock_timeout_ms", "lock_wait_seconds"},
    {"lock_retry", "lock_retry_seconds"},
    {"lock_retry_ms", "lock_retry_seconds"},
    {"connect_timeout", "connect_timeout_seconds"},
    {"connect_timeout_ms", "connect_timeout_seconds"},
    {"timeout", "request_timeout_seconds"},
    {"request_timeout_ms", "request_timeout_seconds"},
    {"mutation_timeout_ms", "mutation_timeout_seconds"},
    {"quorum_timeout_ms", "quorum_timeout_seconds"},
    {"quorum_busy_ms", "quorum_busy_seconds"},
    {"ddl_timeout_s", "ddl_timeout_seconds"},
    {"host_down_ms", "host_down_seconds"},
};
const size_t kRenamedSettingsCount = sizeof(kRenamedSettings) / sizeof(kRenamedSettings[0]);

const SettingSpec* FindSetting(absl::string_view key) {
  for (const SettingSpec& s : kSettings) {
    if (key == s.key) return &s;
  }
  return nullptr;
}

std::string CliFlag(const SettingSpec& spec) {
  if (spec.cli_flag[0] != '\0') return spec.cli_flag;
  return absl::StrReplaceAll(spec.key, {{"_", "-"}});
}

namespace {

// Milliseconds as seconds without trailing zeros: 10000 -> "10", 500 -> "0.5".
std::string SecondsText(int64_t ms) {
  std::string text = absl::StrCat(ms / 1000);
  if (int64_t rest = ms % 1000; rest != 0) {
    std::string frac = absl::StrCat(1000 + rest).substr(1);
    while (!frac.empty() && frac.back() == '0') frac.pop_back();
    absl::StrAppend(&text, ".", frac);
  }
  return text;
}

}  // namespace

std::string DefaultText(const SettingSpec& spec) {
  if (spec.default_number == kNoNumber) return spec.default_text;
  if (spec.type == SettingType::kSeconds) return SecondsText(spec.default_number);
  return absl::StrCat(spec.default_number);
}

std::vector<std::string> SecretsGiven(const SettingsSources& sources) {
  std::vector<std::string> secrets;
  auto add = [&secrets](const std::string& secret) {
    if (!secret.empty() && std::find(secrets.begin(), secrets.end(), secret) == secrets.end()) {
      secrets.push_back(secret);
    }
  };
  auto add_uri = [&add](const std::string& uri) {
    absl::StatusOr<UriParts> parts = ParseClickHouseUri(uri);
    if (parts.ok() && parts->password) add(*parts->password);
    // As written, too, and from a URI that does not parse: the user info's
    // text after its first ':'.
    absl::string_view rest = uri;
    if (size_t scheme = rest.find("://"); scheme != absl::string_view::npos) rest.remove_prefix(scheme + 3);
    rest = rest.substr(0, rest.find_first_of("/?#"));
    if (size_t at = rest.rfind('@'); at != absl::string_view::npos) {
      absl::string_view info = rest.substr(0, at);
      if (size_t colon = info.find(':'); colon != absl::string_view::npos) add(std::string(info.substr(colon + 1)));
    }
  };
  const SettingSpec* password = FindSetting("password");
  const SettingSpec* uri = FindSetting("uri");
  if (auto it = sources.values.find(password->key); it != sources.values.end()) add(it->second);
  if (auto it = sources.values.find(uri->key); it != sources.values.end()) add_uri(it->second);
  for (const char* name : {password->env, "CLICKHOUSE_PASSWORD"}) {
    if (auto it = sources.env.find(name); it != sources.env.end()) add(it->second);
  }
  if (auto it = sources.env.find(uri->env); it != sources.env.end()) add_uri(it->second);
  return secrets;
}

std::string ValueText(const Settings& s, const SettingSpec& spec) {
  const ConnectionConfig& c = s.connection;
  const StoreOptions& o = s.store;
  const std::string key = spec.key;
  auto flag = [](bool on) { return std::string(on ? "true" : "false"); };
  if (key == "uri") return s.chdb_path.empty() ? c.RedactedUri() : absl::StrCat("chdb://", s.chdb_path);
  if (key == "host") {
    std::vector<std::string> hosts;
    for (const Endpoint& e : c.hosts) hosts.push_back(e.host);
    return hosts.empty() ? c.host : absl::StrJoin(hosts, ",");
  }
  if (key == "port") return absl::StrCat(c.port);
  if (key == "database") return c.database;
  if (key == "user") return c.user;
  if (key == "password") return c.password.empty() ? "" : "***";
  if (key == "secure") return flag(c.secure);
  if (key == "schema") return o.schema;
  if (key == "table") return o.table;
  if (key == "ca_file") return c.ca_file;
  if (key == "cluster") return o.cluster.name;
  if (key == "zookeeper_path") return o.cluster.zookeeper_path;
  if (key == "replica") return o.cluster.replica;
  if (key == "quorum") return absl::StrCat(o.cluster.quorum);
  if (key == "quorum_timeout_seconds") return SecondsText(o.cluster.quorum_timeout_ms);
  if (key == "quorum_busy_seconds") return SecondsText(o.cluster.quorum_busy_ms);
  if (key == "ddl_timeout_seconds") return absl::StrCat(o.cluster.ddl_timeout_s);
  if (key == "host_down_seconds") return SecondsText(o.host_down_ms);
  if (key == "lock_timeout_seconds") return SecondsText(o.lock.stale_ms);
  if (key == "lock_retry_seconds") return SecondsText(o.lock.retry_ms);
  if (key == "lock_wait_seconds") return SecondsText(o.lock.timeout_ms);
  if (key == "python_locks") return flag(o.python_locks);
  if (key == "linger_locks") return flag(o.linger_locks);
  if (key == "connect_timeout_seconds") return SecondsText(s.connect_timeout_ms);
  if (key == "request_timeout_seconds") return SecondsText(o.transport.request_timeout_ms);
  if (key == "mutation_timeout_seconds") return SecondsText(o.mutation_timeout_ms);
  if (key == "history_days") return absl::StrCat(o.history_days);
  if (key == "history_versions") return absl::StrCat(o.history_versions);
  return "";
}

namespace {

constexpr double kMaxSeconds = 366 * 86400.0;  // a year: beyond any useful wait, and in range as ms
constexpr int64_t kMaxCount = 1000000;

std::string Shown(absl::string_view text) { return absl::StrCat("\"", absl::CHexEscape(text), "\""); }

struct Given {
  std::string text;
  std::string origin;
};

// The namespace of the backend's Meltano settings: state_backend.<ns>.<key>.
std::string MeltanoNamespace(const SettingsSources& src) {
  auto it = src.values.find("uri");
  if (it != src.values.end() && absl::StartsWithIgnoreCase(absl::StripAsciiWhitespace(it->second), "chdb://")) {
    return "chdb";
  }
  return "clickhouse";
}

std::optional<Given> Lookup(const SettingsSources& src, const SettingSpec& spec) {
  auto it = src.values.find(spec.key);
  if (it != src.values.end() && !it->second.empty()) {
    if (src.from == SettingsFrom::kCli) return Given{it->second, absl::StrCat("--", CliFlag(spec), " flag")};
    return Given{it->second, ValueOrigin(src.from, spec.key, spec.meltano_core, MeltanoNamespace(src))};
  }
  auto env = src.env.find(spec.env);
  if (env != src.env.end() && !env->second.empty()) return Given{env->second, spec.env};
  return std::nullopt;
}

absl::StatusOr<int64_t> ParseSeconds(const Given& given, const SettingSpec& spec) {
  double seconds = 0;
  const bool ok = absl::SimpleAtod(given.text, &seconds) && std::isfinite(seconds) && seconds >= spec.min &&
                  seconds <= kMaxSeconds;
  if (!ok) {
    return absl::InvalidArgumentError(absl::StrCat(
        given.origin, " is ", Shown(given.text), ", which is not a number of seconds from ",
        spec.min >= 1 || spec.min == 0 ? absl::StrCat(spec.min) : absl::StrCat(spec.min * 1000, " ms"),
        " to a year (fractions are fine, as in 2.5)"));
  }
  const int64_t ms = std::llround(seconds * 1000);
  return spec.min > 0 ? std::max<int64_t>(ms, 1) : ms;
}

absl::StatusOr<int64_t> ParseCount(const Given& given, const SettingSpec& spec) {
  static const RE2* const kDigits = new RE2("[0-9]{1,7}");
  int64_t n = 0;
  if (!RE2::FullMatch(given.text, *kDigits) || !absl::SimpleAtoi(given.text, &n) || n < spec.min || n > kMaxCount) {
    return absl::InvalidArgumentError(absl::StrCat(given.origin, " is ", Shown(given.text),
                                                   ", which is not a whole number from ", spec.min, " to ", kMaxCount));
  }
  return n;
}

absl::StatusOr<bool> ParseFlag(const Given& given) {
  std::optional<bool> on = ParseBool(given.text);
  if (!on) {
    return absl::InvalidArgumentError(absl::StrCat(given.origin, " is ", Shown(given.text),
                                                   ", which is not a boolean: set it to true or false"));
  }
  return *on;
}

// Unknown keys fail loudly: a typo must not pass as "not given". Meltano's
// are the exception: it passes every state_backend.<key> it defines (a later
// Meltano may define more), and validates its own settings itself.
absl::Status CheckKeys(const SettingsSources& src) {
  for (const auto& [key, value] : src.values) {
    if (FindSetting(key) != nullptr || src.from == SettingsFrom::kMeltano) continue;
    for (size_t i = 0; i < kRenamedSettingsCount; ++i) {
      if (key == kRenamedSettings[i].old_key) {
        const SettingSpec* now = FindSetting(kRenamedSettings[i].new_key);
        return absl::InvalidArgumentError(absl::StrCat(
            "the setting ", Shown(key), " is now called \"", now->key, "\" (", now->meaning, "; in ",
            now->type == SettingType::kSeconds ? "seconds" : "its own unit", "): rename it"));
      }
    }
    std::vector<std::string> known;
    for (const SettingSpec& s : kSettings) known.push_back(s.key);
    return absl::InvalidArgumentError(absl::StrCat("unknown setting ", Shown(key.substr(0, 100)),
                                                   "; the settings are ", absl::StrJoin(known, ", ")));
  }
  return absl::OkStatus();
}

// chdb:///absolute/dir[?schema=S&table=T]: the embedded engine's directory.
absl::Status ResolveChdb(const SettingsSources& src, const std::string& uri, Settings* out) {
  const std::string origin = ValueOrigin(src.from, "uri", /*meltano_core=*/true);
  auto bad = [&origin](absl::string_view why) {
    return absl::InvalidArgumentError(absl::StrCat(origin, ": ", why));
  };
  absl::string_view rest = absl::StripAsciiWhitespace(uri);
  rest.remove_prefix(std::string("chdb://").size());
  if (!absl::StartsWith(rest, "/")) {
    return bad("chdb:// URIs name a local directory with an absolute path, as in chdb:///var/lib/meltano/state, so "
               "the part after chdb:// must start with '/'");
  }
  if (absl::StrContains(rest, '#')) return bad("chdb:// URIs take no '#' fragment");
  absl::string_view path = rest, query;
  if (size_t q = rest.find('?'); q != absl::string_view::npos) {
    path = rest.substr(0, q);
    query = rest.substr(q + 1);
  }
  std::optional<std::string> decoded = PercentDecodeText(path);
  if (!decoded || decoded->empty()) return bad("the directory has an invalid percent-escape (write '%' as %25)");
  out->chdb_path = *decoded;
  std::map<std::string, std::string> params;
  for (absl::string_view kv : absl::StrSplit(query, '&', absl::SkipEmpty())) {
    const size_t eq = kv.find('=');
    const std::string key(kv.substr(0, eq));
    std::optional<std::string> value = PercentDecodeText(eq == absl::string_view::npos ? "" : kv.substr(eq + 1));
    if ((key != "schema" && key != "table") || params.count(key) || !value) {
      return bad(absl::StrCat("unknown, repeated or badly escaped key ", Shown(key),
                              " in the chdb:// URI query; expected schema and table"));
    }
    params[key] = *value;
  }
  ConnectionConfig& c = out->connection;
  c.hosts.clear();
  for (const char* key : {"schema", "table"}) {
    std::string* target = std::string(key) == "schema" ? &c.schema : &c.table;
    const SettingSpec* spec = FindSetting(key);
    if (std::optional<Given> g = Lookup(src, *spec)) {
      *target = g->text;
      c.origin[key] = g->origin;
    } else if (auto it = params.find(key); it != params.end() && !it->second.empty()) {
      *target = it->second;
      c.origin[key] = origin;
    } else {
      c.origin[key] = "default";
    }
    if (absl::Status s = ValidateIdentifier(*target, key); !s.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(s.message(), " (set by ", c.origin[key], ")"));
    }
  }
  c.origin["uri"] = origin;
  return absl::OkStatus();
}


// Every password the sources hold, wherever it was given.
std::vector<std::string> Secrets(const SettingsSources& src) {
  std::vector<std::string> out;
  auto add_uri = [&out](const std::string& uri) {
    absl::StatusOr<UriParts> parts = ParseClickHouseUri(uri);
    if (parts.ok() && parts->password) out.push_back(*parts->password);
  };
  for (const auto& [map, key, is_uri] :
       {std::make_tuple(&src.values, "password", false), std::make_tuple(&src.values, "uri", true),
        std::make_tuple(&src.env, "MELTANO_STATE_BACKEND_CLICKHOUSE_PASSWORD", false),
        std::make_tuple(&src.env, "CLICKHOUSE_PASSWORD", false), std::make_tuple(&src.env, "MELTANO_STATE_BACKEND_URI", true)}) {
    auto it = map->find(key);
    if (it == map->end() || it->second.empty()) continue;
    if (is_uri) {
      add_uri(it->second);
    } else {
      out.push_back(it->second);
    }
  }
  // Longest first, so that a password holding another is hidden whole.
  std::sort(out.begin(), out.end(), [](const std::string& a, const std::string& b) { return a.size() > b.size(); });
  return out;
}

absl::StatusOr<Settings> Resolve(const SettingsSources& src);

}  // namespace

// Messages are built never to hold the password; a value typed into the
// wrong setting is echoed, though, so every password given is hidden in them.
absl::StatusOr<Settings> ResolveSettings(const SettingsSources& src) {
  absl::StatusOr<Settings> out = Resolve(src);
  if (out.ok()) return out;
  std::string message(out.status().message());
  for (const std::string& secret : Secrets(src)) {
    message = absl::StrReplaceAll(message, {{secret, "***"}, {absl::CHexEscape(secret), "***"}});
  }
  return absl::Status(out.status().code(), message);
}

namespace {

absl::StatusOr<Settings> Resolve(const SettingsSources& src) {
  if (absl::Status s = CheckKeys(src); !s.ok()) return s;
  Settings out;

  // ---- the connection ----
  auto uri = src.values.find("uri");
  const bool chdb = MeltanoNamespace(src) == "chdb";
  if (chdb) {
    if (absl::Status s = ResolveChdb(src, uri->second, &out); !s.ok()) return s;
  } else {
    ConfigSources cs;
    cs.from = src.from;
    cs.env = src.env;
    for (const auto& [key, value] : src.values) {
      if (key == "uri" || std::find(std::begin(kSettingKeys), std::end(kSettingKeys), key) != std::end(kSettingKeys)) {
        cs.flags[key] = value;
      }
    }
    absl::StatusOr<ConnectionConfig> config = ResolveConfig(cs);
    if (!config.ok()) return config.status();
    out.connection = *std::move(config);
    if (uri != src.values.end() && !uri->second.empty()) {
      out.connection.origin["uri"] = ValueOrigin(src.from, "uri", /*meltano_core=*/true);
    } else if (auto e = src.env.find("MELTANO_STATE_BACKEND_URI"); e != src.env.end() && !e->second.empty()) {
      out.connection.origin["uri"] = "MELTANO_STATE_BACKEND_URI";
    } else {
      out.connection.origin["uri"] = "default";
    }
  }
  out.origin = out.connection.origin;

  // ---- everything else, by the table ----
  StoreOptions& o = out.store;
  std::map<std::string, int64_t> number;  // ms for seconds, the count for counts
  std::map<std::string, bool> flag;
  for (const SettingSpec& spec : kSettings) {
    if (spec.group == SettingGroup::kConnection || std::string(spec.key) == "cluster" ||
        std::string(spec.key) == "zookeeper_path" || std::string(spec.key) == "replica" ||
        std::string(spec.key) == "quorum") {
      continue;  // resolved above, with the URI and CLICKHOUSE_* layers
    }
    std::optional<Given> given = Lookup(src, spec);
    out.origin[spec.key] = given ? given->origin : "default";
    if (spec.type == SettingType::kBool) {
      if (given) {
        absl::StatusOr<bool> on = ParseFlag(*given);
        if (!on.ok()) return on.status();
        flag[spec.key] = *on;
      }
      continue;
    }
    if (!given) {
      if (spec.default_number != kNoNumber) number[spec.key] = spec.default_number;
      continue;
    }
    absl::StatusOr<int64_t> n =
        spec.type == SettingType::kSeconds ? ParseSeconds(*given, spec) : ParseCount(*given, spec);
    if (!n.ok()) return n.status();
    number[spec.key] = *n;
  }

  o.schema = out.connection.schema;
  o.table = out.connection.table;
  if (!chdb) {
    o.cluster.name = out.connection.cluster;
    o.cluster.zookeeper_path = out.connection.zookeeper_path;
    o.cluster.replica = out.connection.replica;
    o.cluster.quorum = out.connection.quorum;
    if (out.connection.hosts.size() > 1) {
      o.hosts = out.connection.hosts;  // the store names them all in messages
    } else {
      const std::string& h = out.connection.host;
      o.endpoint = absl::StrCat(absl::StrContains(h, ':') ? absl::StrCat("[", h, "]") : h, ":", out.connection.port);
    }
  } else {
    o.endpoint = absl::StrCat("chdb:", out.chdb_path);
  }
  o.lock.stale_ms = number["lock_timeout_seconds"];
  o.lock.retry_ms = number["lock_retry_seconds"];
  if (auto wait = number.find("lock_wait_seconds"); wait != number.end()) {
    o.lock.timeout_ms = wait->second;
  } else {
    o.lock.timeout_ms = 2 * o.lock.stale_ms + o.lock.retry_ms;
  }
  o.cluster.quorum_timeout_ms = number["quorum_timeout_seconds"];
  o.cluster.quorum_busy_ms = number["quorum_busy_seconds"];
  o.cluster.ddl_timeout_s = (number["ddl_timeout_seconds"] + 999) / 1000;
  o.host_down_ms = number["host_down_seconds"];
  o.transport.request_timeout_ms = number["request_timeout_seconds"];
  o.mutation_timeout_ms = number["mutation_timeout_seconds"];
  o.history_days = number["history_days"];
  o.history_versions = number["history_versions"];
  out.connect_timeout_ms = number["connect_timeout_seconds"];
  o.python_locks = flag.count("python_locks") ? flag["python_locks"] : false;
  // Lingering needs a host that renews while its user is idle and releases
  // at exit; where the user asked for it on a host that cannot, it is an
  // error rather than a lock left behind.
  // (A runtime that cannot keep one lingering never lingers: the setting
  // only allows it, so one environment serves every runtime.)
  const bool can_linger = src.host.timers && src.host.exit_release;
  o.linger_locks = can_linger && (flag.count("linger_locks") ? flag["linger_locks"] : true);
  o.diagnostics = src.host.diagnostics;
  o.diagnostics_show_states = src.host.show_states;
  return out;
}

}  // namespace
}  // namespace chstate
