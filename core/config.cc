// Resolving connection settings from flags, environment variables, the URI
// (parsed in uri.cc) and defaults in the precedence order of config.h.
#include "core/config.h"

#include <algorithm>
#include <iterator>
#include <set>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "core/quoting.h"
#include "core/uri_internal.h"
#include "re2/re2.h"

namespace chstate {

using uri_internal::HostNamePattern;
using uri_internal::Ipv6Pattern;
using uri_internal::ParseHostPort;
using uri_internal::ParsePort;
using uri_internal::PercentEncode;
using uri_internal::Shown;

namespace {

constexpr absl::string_view kUriEnv = "MELTANO_STATE_BACKEND_URI";
constexpr absl::string_view kMeltanoEnvPrefix = "MELTANO_STATE_BACKEND_CLICKHOUSE_";

bool HasClickHouseScheme(absl::string_view uri) {
  std::string lower = absl::AsciiStrToLower(absl::StripAsciiWhitespace(uri));
  for (absl::string_view scheme : {"clickhouse://", "clickhouses://", "http://", "https://"}) {
    if (absl::StartsWith(lower, scheme)) return true;
  }
  return false;
}

// The URI's components as the text a flag or variable would hold, so every
// layer goes through the same lookup and value checks.
std::map<std::string, std::string> UriComponents(const UriParts& p) {
  std::map<std::string, std::string> m;
  if (!p.hosts.empty()) {
    // A list is one setting: each item keeps its own port.
    std::vector<std::string> items;
    for (const auto& [host, port] : p.hosts) {
      const bool ipv6 = absl::StrContains(host, ':');
      items.push_back(absl::StrCat(ipv6 ? "[" : "", host, ipv6 ? "]" : "",
                                   port ? absl::StrCat(":", *port) : std::string()));
    }
    m["host"] = absl::StrJoin(items, ",");
  } else {
    if (p.host) m["host"] = *p.host;
    if (p.port) m["port"] = absl::StrCat(*p.port);
  }
  if (p.database) m["database"] = *p.database;
  if (p.user) m["user"] = *p.user;
  if (p.password) m["password"] = *p.password;
  if (p.secure) m["secure"] = *p.secure ? "true" : "false";
  if (p.schema) m["schema"] = *p.schema;
  if (p.table) m["table"] = *p.table;
  if (p.ca_file) m["ca_file"] = *p.ca_file;
  if (p.cluster) m["cluster"] = *p.cluster;
  if (p.zookeeper_path) m["zookeeper_path"] = *p.zookeeper_path;
  if (p.replica) m["replica"] = *p.replica;
  if (p.quorum) m["quorum"] = *p.quorum;
  return m;
}

// A URI from `values[name]`, split into components. The message of a parse
// error says which flag or variable held the URI (never the URI itself: it
// may hold the password).
absl::StatusOr<std::map<std::string, std::string>> UriLayer(const std::map<std::string, std::string>& values,
                                                            const std::string& name, absl::string_view label,
                                                            bool skip_other_schemes) {
  auto it = values.find(name);
  if (it == values.end() || it->second.empty()) return std::map<std::string, std::string>();
  // Meltano uses the same variable for every backend ("systemdb", "s3://...");
  // only ClickHouse URIs are ours to read.
  if (skip_other_schemes && !HasClickHouseScheme(it->second)) return std::map<std::string, std::string>();
  absl::StatusOr<UriParts> parts = ParseClickHouseUri(it->second);
  if (!parts.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(label, ": ", parts.status().message()));
  }
  return UriComponents(*parts);
}

struct Found {
  std::string value;
  std::string origin;
};

const std::string* NonEmpty(const std::map<std::string, std::string>& m, const std::string& key) {
  auto it = m.find(key);
  if (it == m.end() || it->second.empty()) return nullptr;
  return &it->second;
}

class Layers {
 public:
  Layers(const ConfigSources& sources, std::map<std::string, std::string> flag_uri,
         std::map<std::string, std::string> env_uri)
      : sources_(sources), flag_uri_(std::move(flag_uri)), env_uri_(std::move(env_uri)) {}

  std::optional<Found> Lookup(const std::string& key) const {
    const std::string upper = absl::AsciiStrToUpper(key);
    if (const std::string* v = NonEmpty(sources_.flags, key)) return Found{*v, ValueOrigin(sources_.from, key)};
    if (const std::string* v = NonEmpty(flag_uri_, key)) {
      return Found{*v, ValueOrigin(sources_.from, "uri", /*meltano_core=*/true)};
    }
    const std::string meltano = absl::StrCat(kMeltanoEnvPrefix, upper);
    if (const std::string* v = NonEmpty(sources_.env, meltano)) return Found{*v, meltano};
    if (const std::string* v = NonEmpty(env_uri_, key)) return Found{*v, std::string(kUriEnv)};
    // The generic variables of the settings table chstate was designed from
    // (the connection, and where the state lives). The lowest level: any
    // Meltano-scoped variable or URI part wins over them.
    static constexpr absl::string_view kGeneric[] = {"host",   "port",   "user", "password",
                                                     "database", "secure", "schema", "table"};
    if (std::find(std::begin(kGeneric), std::end(kGeneric), key) != std::end(kGeneric)) {
      const std::string generic = absl::StrCat("CLICKHOUSE_", upper);
      if (const std::string* v = NonEmpty(sources_.env, generic)) return Found{*v, generic};
    }
    return std::nullopt;
  }

 private:
  const ConfigSources& sources_;
  const std::map<std::string, std::string> flag_uri_;
  const std::map<std::string, std::string> env_uri_;
};

absl::Status ValidateHost(const Found& found, std::string* host) {
  absl::string_view h = found.value;
  // A bracketed address is what people copy out of a URI; accept it.
  if (absl::StartsWith(h, "[") && absl::EndsWith(h, "]")) h = h.substr(1, h.size() - 2);
  if (RE2::FullMatch(h, HostNamePattern()) || RE2::FullMatch(h, Ipv6Pattern())) {
    *host = std::string(h);
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(
      absl::StrCat(found.origin, " is ", Shown(found.value),
                   ", which is not a host name or IP address: give only the host (letters, digits, '.', '-', '_', or "
                   "an IPv6 address), and the port separately"));
}

// A host setting that lists several hosts: `h1:8123,h2,[::1]:8124`.
absl::Status ParseHostList(const Found& found, std::vector<std::pair<std::string, std::optional<int>>>* out) {
  for (absl::string_view item : absl::StrSplit(found.value, ',')) {
    item = absl::StripAsciiWhitespace(item);
    UriParts one;
    absl::Status s = item.empty() ? absl::InvalidArgumentError("an entry is empty") : ParseHostPort(item, &one);
    if (!s.ok() || !one.host) {
      return absl::InvalidArgumentError(absl::StrCat(
          found.origin, " is the host list ", Shown(found.value), ", and its entry ", Shown(item),
          " is not host or host:port: write the hosts as h1:8123,h2:8123,h3:8123 (IPv6 in brackets, [::1]:8123)"));
    }
    out->emplace_back(*one.host, one.port);
  }
  return absl::OkStatus();
}

// A setting as a user of that kind of host types it: --cluster,
// state_backend.clickhouse.cluster, the cluster setting.
std::string SettingName(SettingsFrom from, absl::string_view key) {
  switch (from) {
    case SettingsFrom::kMeltano:
      return absl::StrCat("state_backend.clickhouse.", key);
    case SettingsFrom::kApi:
      return absl::StrCat("the ", key, " setting");
    case SettingsFrom::kCli:
      break;
  }
  return absl::StrCat("--", absl::StrReplaceAll(key, {{"_", "-"}}));
}

std::string MissingMessage(SettingsFrom from, absl::string_view what, absl::string_view uri_hint,
                           absl::string_view key) {
  const std::string upper = absl::AsciiStrToUpper(key);
  switch (from) {
    case SettingsFrom::kMeltano:
      // Meltano folds its variables into its settings; CLICKHOUSE_* it never reads.
      return absl::StrCat("ClickHouse ", what, " is not set: give it in state_backend.uri (", uri_hint,
                          ") or as state_backend.clickhouse.", key, " (", kMeltanoEnvPrefix, upper, ")");
    case SettingsFrom::kApi:
      return absl::StrCat("ClickHouse ", what, " is not set: give it in the URI (", uri_hint, "), as the ", key,
                          " setting, or in ", kMeltanoEnvPrefix, upper, " or CLICKHOUSE_", upper);
    case SettingsFrom::kCli:
      break;
  }
  return absl::StrCat("ClickHouse ", what, " is not set: give it in the URI (", uri_hint, "), with --", key, ", ",
                      kMeltanoEnvPrefix, upper, " (state_backend.clickhouse.", key, " in meltano.yml) or CLICKHOUSE_",
                      upper);
}

}  // namespace

std::string ValueOrigin(SettingsFrom from, absl::string_view key, bool meltano_core,
                        absl::string_view meltano_namespace) {
  switch (from) {
    case SettingsFrom::kMeltano:
      return meltano_core ? absl::StrCat("state_backend.", key)
                          : absl::StrCat("state_backend.", meltano_namespace, ".", key);
    case SettingsFrom::kApi:
      return absl::StrCat("the ", key, " setting");
    case SettingsFrom::kCli:
      break;
  }
  // Flags are spelled with dashes (--ca-file) where keys use underscores.
  return absl::StrCat("--", absl::StrReplaceAll(key, {{"_", "-"}}), " flag");
}

std::optional<bool> ParseBool(absl::string_view text) {
  const std::string lower = absl::AsciiStrToLower(text);
  if (lower == "true" || lower == "1" || lower == "yes" || lower == "on") return true;
  if (lower == "false" || lower == "0" || lower == "no" || lower == "off") return false;
  return std::nullopt;
}

// The cluster settings are written into DDL (ON CLUSTER name, engine
// arguments): only plain characters are accepted, so no quoting is needed
// and a typo fails here rather than in ClickHouse.
static absl::Status ValidateClusterSettings(const ConnectionConfig& cfg) {
  static const RE2* const kClusterName = new RE2("[A-Za-z0-9_.-]{1,128}");
  static const RE2* const kZooKeeperText = new RE2("[A-Za-z0-9_./{}-]{1,200}");
  if (!cfg.cluster.empty() && !RE2::FullMatch(cfg.cluster, *kClusterName)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the cluster name ", Shown(cfg.cluster), " (set by ", cfg.origin.at("cluster"),
        ") is not valid: use the name of a cluster in the server's remote_servers (letters, digits, '_', '.', '-')"));
  }
  if (!RE2::FullMatch(cfg.zookeeper_path, *kZooKeeperText) || cfg.zookeeper_path[0] != '/' ||
      absl::EndsWith(cfg.zookeeper_path, "/")) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the zookeeper_path ", Shown(cfg.zookeeper_path), " (set by ", cfg.origin.at("zookeeper_path"),
        ") is not valid: give an absolute ZooKeeper path without a trailing '/', made of letters, digits, "
        "'_', '.', '-', '/' and {macros}, such as ", kDefaultZooKeeperPath));
  }
  if (!RE2::FullMatch(cfg.replica, *kZooKeeperText) || absl::StrContains(cfg.replica, '/')) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the replica name ", Shown(cfg.replica), " (set by ", cfg.origin.at("replica"),
        ") is not valid: use letters, digits, '_', '.', '-' and {macros}, such as ", kDefaultReplica));
  }
  return absl::OkStatus();
}

absl::StatusOr<ConnectionConfig> ResolveConfig(const ConfigSources& sources) {
  absl::StatusOr<std::map<std::string, std::string>> flag_uri =
      UriLayer(sources.flags, "uri", ValueOrigin(sources.from, "uri", /*meltano_core=*/true),
               /*skip_other_schemes=*/false);
  if (!flag_uri.ok()) return flag_uri.status();
  absl::StatusOr<std::map<std::string, std::string>> env_uri =
      UriLayer(sources.env, std::string(kUriEnv), kUriEnv, /*skip_other_schemes=*/true);
  if (!env_uri.ok()) return env_uri.status();
  const Layers layers(sources, *std::move(flag_uri), *std::move(env_uri));

  ConnectionConfig cfg;
  const std::pair<const char*, std::string*> text_settings[] = {
      {"user", &cfg.user},     {"password", &cfg.password}, {"database", &cfg.database},
      {"schema", &cfg.schema}, {"table", &cfg.table},       {"ca_file", &cfg.ca_file},
      {"cluster", &cfg.cluster}, {"zookeeper_path", &cfg.zookeeper_path}, {"replica", &cfg.replica},
  };
  for (const auto& [key, target] : text_settings) {
    if (std::optional<Found> found = layers.Lookup(key)) {
      *target = std::move(found->value);
      cfg.origin[key] = std::move(found->origin);
    } else {
      cfg.origin[key] = "default";
    }
  }

  // Each host with its own port, if it gave one (filled in after the port).
  std::vector<std::pair<std::string, std::optional<int>>> host_list;
  if (std::optional<Found> host = layers.Lookup("host")) {
    if (absl::StrContains(host->value, ',')) {
      absl::Status s = ParseHostList(*host, &host_list);
      if (!s.ok()) return s;
      cfg.host = host_list[0].first;
    } else {
      absl::Status s = ValidateHost(*host, &cfg.host);
      if (!s.ok()) return s;
    }
    cfg.origin["host"] = host->origin;
  } else {
    cfg.origin["host"] = "default";
  }

  if (std::optional<Found> secure = layers.Lookup("secure")) {
    std::optional<bool> value = ParseBool(secure->value);
    if (!value.has_value()) {
      return absl::InvalidArgumentError(
          absl::StrCat(secure->origin, " is ", Shown(secure->value),
                       ", which is not a boolean: set it to true or false (1/0, yes/no and on/off also work)"));
    }
    cfg.secure = *value;
    cfg.origin["secure"] = secure->origin;
  } else {
    cfg.origin["secure"] = "default";
  }

  // After secure: the default port depends on it.
  if (std::optional<Found> port = layers.Lookup("port")) {
    std::optional<int> value = ParsePort(port->value);
    if (!value.has_value()) {
      return absl::InvalidArgumentError(absl::StrCat(port->origin, " is ", Shown(port->value),
                                                     ", which is not a port: set it to a number from 1 to 65535"));
    }
    cfg.port = *value;
    cfg.origin["port"] = port->origin;
  } else {
    cfg.port = cfg.secure ? 8443 : 8123;
    cfg.origin["port"] = "default";
  }
  if (host_list.empty()) {
    cfg.hosts = {Endpoint{cfg.host, cfg.port}};
  } else {
    for (const auto& [host, port] : host_list) cfg.hosts.push_back(Endpoint{host, port.value_or(cfg.port)});
    cfg.port = cfg.hosts[0].port;
  }

  if (cfg.user.empty()) {
    return absl::InvalidArgumentError(MissingMessage(sources.from, "user", "clickhouse://USER@host/database", "user"));
  }
  if (cfg.database.empty()) {
    return absl::InvalidArgumentError(MissingMessage(sources.from, "database", "clickhouse://user@host/DATABASE", "database"));
  }
  for (const auto& [what, value] : {std::make_pair("schema", &cfg.schema), std::make_pair("table", &cfg.table)}) {
    absl::Status s = ValidateIdentifier(*value, what);
    if (!s.ok()) return absl::InvalidArgumentError(absl::StrCat(s.message(), " (set by ", cfg.origin[what], ")"));
  }
  if (absl::Status s = ValidateClusterSettings(cfg); !s.ok()) return s;
  if (std::optional<Found> quorum = layers.Lookup("quorum")) {
    static const RE2* const kDigits = new RE2("[0-9]{1,4}");
    int value = 0;
    if (!RE2::FullMatch(quorum->value, *kDigits) || !absl::SimpleAtoi(quorum->value, &value) || value < 2 ||
        value > 1000) {
      return absl::InvalidArgumentError(absl::StrCat(
          quorum->origin, " is ", Shown(quorum->value),
          ", which is not a quorum: give the number of replicas that must confirm each write, at least 2 (a "
          "write confirmed by one replica is no quorum write) and at most the replicas of the cluster"));
    }
    if (cfg.cluster.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "a quorum is given (by ", quorum->origin, "), which needs cluster mode: name the cluster (?cluster=NAME "
          "in the URI, ", SettingName(sources.from, "cluster"), " or ", kMeltanoEnvPrefix,
          "CLUSTER) or leave the quorum out"));
    }
    cfg.quorum = value;
    cfg.origin["quorum"] = quorum->origin;
  } else {
    cfg.origin["quorum"] = "default";
  }
  if (cfg.hosts.size() > 1 && cfg.cluster.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "several hosts are given (by ", cfg.origin["host"],
        "), which needs cluster mode: without it each server keeps its own states and locks. Name the cluster "
        "(?cluster=NAME in the URI, ", SettingName(sources.from, "cluster"), " or ", kMeltanoEnvPrefix,
        "CLUSTER) or give one host"));
  }
  return cfg;
}

std::string ConnectionConfig::RedactedUri() const {
  std::string out = "clickhouse://";
  if (!user.empty() || !password.empty()) {
    absl::StrAppend(&out, PercentEncode(user), password.empty() ? "" : ":***", "@");
  }
  std::vector<std::string> shown;
  for (const Endpoint& e : hosts.empty() ? std::vector<Endpoint>{{host, port}} : hosts) {
    const bool ipv6 = absl::StrContains(e.host, ':');
    shown.push_back(absl::StrCat(ipv6 ? "[" : "", e.host, ipv6 ? "]" : "", ":", e.port));
  }
  absl::StrAppend(&out, absl::StrJoin(shown, ","), "/", PercentEncode(database),
                  "?secure=", secure ? "true" : "false", "&schema=", PercentEncode(schema),
                  "&table=", PercentEncode(table));
  if (!ca_file.empty()) absl::StrAppend(&out, "&ca_file=", PercentEncode(ca_file, "/:"));
  if (!cluster.empty()) absl::StrAppend(&out, "&cluster=", PercentEncode(cluster));
  if (zookeeper_path != kDefaultZooKeeperPath) {
    absl::StrAppend(&out, "&zookeeper_path=", PercentEncode(zookeeper_path, "/{}"));
  }
  if (replica != kDefaultReplica) absl::StrAppend(&out, "&replica=", PercentEncode(replica, "{}"));
  if (quorum != kDefaultQuorum) absl::StrAppend(&out, "&quorum=", quorum);
  return out;
}

}  // namespace chstate