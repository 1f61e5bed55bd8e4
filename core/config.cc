// Parsing clickhouse:// URIs and resolving connection settings from flags,
// environment variables and defaults in the precedence order of config.h.
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
#include "re2/re2.h"

namespace chstate {
namespace {

constexpr absl::string_view kExpectedForm = "clickhouse://user:password@host:port/database";
constexpr absl::string_view kUriEnv = "MELTANO_STATE_BACKEND_URI";
constexpr absl::string_view kMeltanoEnvPrefix = "MELTANO_STATE_BACKEND_CLICKHOUSE_";

// Values echoed in messages go through this so a stray control byte cannot
// garble a terminal or a log line.
std::string Shown(absl::string_view text) { return absl::StrCat("\"", absl::CHexEscape(text), "\""); }

const RE2& HostNamePattern() {
  static const RE2* const kHostName = new RE2("[A-Za-z0-9._-]+");
  return *kHostName;
}

// Every IPv6 literal has at least two colons; requiring them keeps a mistyped
// "db:8123" from passing as an address.
const RE2& Ipv6Pattern() {
  static const RE2* const kIpv6 = new RE2("[0-9A-Fa-f.]*:[0-9A-Fa-f.]*:[0-9A-Fa-f:.]*");
  return *kIpv6;
}

// Digits only: SimpleAtoi alone would also take "+80" and " 80".
std::optional<int> ParsePort(absl::string_view text) {
  static const RE2* const kDigits = new RE2("[0-9]{1,5}");
  int port = 0;
  if (!RE2::FullMatch(text, *kDigits) || !absl::SimpleAtoi(text, &port)) return std::nullopt;
  if (port < 1 || port > 65535) return std::nullopt;
  return port;
}

}  // namespace

std::optional<std::string> PercentDecodeText(absl::string_view in) {
  std::string out;
  out.reserve(in.size());
  for (size_t i = 0; i < in.size(); ++i) {
    if (in[i] != '%') {
      out.push_back(in[i]);
      continue;
    }
    // Checked before HexStringToBytes because this abseil version indexes its
    // hex table with a sign-extended char, which bytes >= 0x80 would overrun.
    std::string byte;
    if (in.size() - i < 3 || !absl::ascii_isxdigit(static_cast<unsigned char>(in[i + 1])) ||
        !absl::ascii_isxdigit(static_cast<unsigned char>(in[i + 2])) ||
        !absl::HexStringToBytes(in.substr(i + 1, 2), &byte)) {
      return std::nullopt;
    }
    out += byte;
    i += 2;
  }
  return out;
}

namespace {

// Leaves `extra_safe` readable (like '/' in a ca_file path); everything that
// could change how the URI splits is escaped.
std::string PercentEncode(absl::string_view in, absl::string_view extra_safe = "") {
  static constexpr char kHex[] = "0123456789ABCDEF";
  std::string out;
  for (unsigned char c : in) {
    if (absl::ascii_isalnum(c) || c == '-' || c == '.' || c == '_' || c == '~' ||
        extra_safe.find(static_cast<char>(c)) != absl::string_view::npos) {
      out.push_back(static_cast<char>(c));
    } else {
      out.push_back('%');
      out.push_back(kHex[c >> 4]);
      out.push_back(kHex[c & 0xF]);
    }
  }
  return out;
}

absl::Status BadEscape(absl::string_view part) {
  return absl::InvalidArgumentError(
      absl::StrCat("the ", part, " in the URI has an invalid percent-escape: write each escaped byte as % and two ",
                   "hex digits (%40 for '@'), and a literal '%' as %25"));
}

// Empty decoded text counts as absent, the same rule ResolveConfig applies to
// every other source.
absl::Status DecodeInto(absl::string_view raw, absl::string_view part, std::optional<std::string>* out) {
  std::optional<std::string> decoded = PercentDecodeText(raw);
  if (!decoded.has_value()) return BadEscape(part);
  if (!decoded->empty()) *out = std::move(*decoded);
  return absl::OkStatus();
}

absl::Status ParseHostPort(absl::string_view hostport, UriParts* parts) {
  absl::string_view host = hostport;
  std::optional<absl::string_view> port_text;
  if (absl::StartsWith(hostport, "[")) {
    size_t close = hostport.find(']');
    if (close == absl::string_view::npos) {
      return absl::InvalidArgumentError(
          "the IPv6 address in the URI has no closing ']': write it as clickhouse://user@[::1]:8123/database");
    }
    host = hostport.substr(1, close - 1);
    if (!RE2::FullMatch(host, Ipv6Pattern())) {
      return absl::InvalidArgumentError(
          absl::StrCat("the bracketed host ", Shown(host),
                       " in the URI is not an IPv6 address: use brackets only around IPv6 addresses, as in "
                       "clickhouse://user@[::1]:8123/database"));
    }
    absl::string_view after = hostport.substr(close + 1);
    if (absl::ConsumePrefix(&after, ":")) {
      port_text = after;
    } else if (!after.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("the URI has ", Shown(after), " after the IPv6 address where only :port may follow, as in ",
                       "clickhouse://user@[::1]:8123/database"));
    }
  } else {
    size_t colon = hostport.find(':');
    if (colon != absl::string_view::npos) {
      if (hostport.find(':', colon + 1) != absl::string_view::npos) {
        return absl::InvalidArgumentError(
            "the host in the URI has several ':'; put an IPv6 address in brackets, as in "
            "clickhouse://user@[::1]:8123/database");
      }
      host = hostport.substr(0, colon);
      port_text = hostport.substr(colon + 1);
    }
    if (!host.empty() && !RE2::FullMatch(host, HostNamePattern())) {
      return absl::InvalidArgumentError(
          absl::StrCat("the host ", Shown(host),
                       " in the URI may contain only letters, digits, '.', '-' and '_'; put an IPv6 address in "
                       "brackets, as in clickhouse://user@[::1]:8123/database"));
    }
  }
  if (!host.empty()) parts->host = std::string(host);
  if (port_text.has_value()) {
    std::optional<int> port = ParsePort(*port_text);
    if (!port.has_value()) {
      return absl::InvalidArgumentError(
          absl::StrCat("the port ", Shown(*port_text),
                       " in the URI is not a number from 1 to 65535: write it as host:8123, or leave it out to use "
                       "8123 (8443 when secure)"));
    }
    parts->port = *port;
  }
  return absl::OkStatus();
}

absl::Status ParseQuery(absl::string_view query, UriParts* parts) {
  std::set<std::string> seen;
  for (absl::string_view item : absl::StrSplit(query, '&', absl::SkipEmpty())) {
    std::pair<absl::string_view, absl::string_view> kv = absl::StrSplit(item, absl::MaxSplits('=', 1));
    std::optional<std::string> key = PercentDecodeText(kv.first);
    if (!key.has_value()) return BadEscape("query parameter name");
    std::optional<std::string>* target = nullptr;
    if (*key == "schema") {
      target = &parts->schema;
    } else if (*key == "table") {
      target = &parts->table;
    } else if (*key == "ca_file") {
      target = &parts->ca_file;
    } else if (*key == "cluster") {
      target = &parts->cluster;
    } else if (*key == "zookeeper_path") {
      target = &parts->zookeeper_path;
    } else if (*key == "replica") {
      target = &parts->replica;
    } else if (*key == "quorum") {
      target = &parts->quorum;
    } else if (*key != "secure") {
      return absl::InvalidArgumentError(
          absl::StrCat("the URI query parameter ", Shown(*key),
                       " is not supported: the allowed ones are secure, schema, table, ca_file, cluster, "
                       "zookeeper_path, replica and quorum, as in ",
                       kExpectedForm, "?secure=true&schema=meltano&table=state"));
    }
    if (!seen.insert(*key).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("the URI query parameter ", Shown(*key), " is given more than once: keep one"));
    }
    if (target != nullptr) {
      absl::Status s = DecodeInto(kv.second, absl::StrCat("value of ", *key), target);
      if (!s.ok()) return s;
      continue;
    }
    std::optional<std::string> value = PercentDecodeText(kv.second);
    if (!value.has_value()) return BadEscape("value of secure");
    if (value->empty()) continue;
    std::optional<bool> secure = ParseBool(*value);
    if (!secure.has_value()) {
      return absl::InvalidArgumentError(
          absl::StrCat("the URI has secure=", Shown(*value), ", which is not a boolean: use secure=true or secure=false"));
    }
    // The scheme already chose (clickhouses://, http://, https://); silently
    // letting one win would hide a typo in the other.
    if (parts->secure.has_value() && *parts->secure != *secure) {
      return absl::InvalidArgumentError(
          absl::StrCat("the URI scheme says secure=", *parts->secure ? "true" : "false", " but its query says secure=",
                       *secure ? "true" : "false", ": drop ?secure or use the clickhouse:// scheme"));
    }
    parts->secure = *secure;
  }
  return absl::OkStatus();
}

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

absl::StatusOr<UriParts> ParseClickHouseUri(absl::string_view uri) {
  // Error messages quote pieces of the URI only after the userinfo has been
  // split off; the password must never be among them.
  uri = absl::StripAsciiWhitespace(uri);
  const size_t sep = uri.find("://");
  if (sep == absl::string_view::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat("the URI has no \"://\": write it as ", kExpectedForm, " (optionally ?secure=true)"));
  }
  UriParts parts;
  const std::string scheme = absl::AsciiStrToLower(uri.substr(0, sep));
  if (scheme == "clickhouses" || scheme == "https") {
    parts.secure = true;
  } else if (scheme == "http") {
    parts.secure = false;
  } else if (scheme != "clickhouse") {
    // Text before "://" that is not a well-formed scheme may be a user and
    // password typed without one, so it is only quoted when it is a scheme.
    static const RE2* const kScheme = new RE2("[a-z][a-z0-9+.-]*");
    const std::string shown = RE2::FullMatch(scheme, *kScheme) ? absl::StrCat(" \"", scheme, "\"") : "";
    return absl::InvalidArgumentError(
        absl::StrCat("the URI scheme", shown, " is not supported: start it with clickhouse:// (or clickhouses://, ",
                     "http://, https://), as in ", kExpectedForm));
  }

  const absl::string_view rest = uri.substr(sep + 3);
  // RFC 3986 appendix B; every part is optional, so this always matches.
  static const RE2* const kSplit = new RE2("([^/?#]*)([^?#]*)(?:\\?([^#]*))?(#.*)?");
  absl::string_view authority, path, query, fragment;
  RE2::FullMatch(rest, *kSplit, &authority, &path, &query, &fragment);

  // A password holding a raw '/', '?' or '#' ends the authority early and
  // leaves its tail, and the '@' after it, in the path or query. Quoting those
  // parts or guessing at them could expose the password, so refuse instead.
  if (rest.find('@', authority.size()) != absl::string_view::npos) {
    return absl::InvalidArgumentError(
        "the URI has an '@' after the host: percent-encode '/', '?', '#' and '@' in the user or password (%2F, %3F, "
        "%23, %40), and write '@' in the database or query as %40");
  }
  if (!fragment.empty()) {
    return absl::InvalidArgumentError(
        "the URI has a '#' fragment, which means nothing here: remove it, or write a literal '#' as %23");
  }

  // The last '@' so that a password with a raw '@' still parses.
  absl::string_view hostport = authority;
  const size_t at = authority.rfind('@');
  if (at != absl::string_view::npos) {
    const absl::string_view userinfo = authority.substr(0, at);
    hostport = authority.substr(at + 1);
    const size_t colon = userinfo.find(':');
    absl::Status s = DecodeInto(userinfo.substr(0, colon), "user", &parts.user);
    if (!s.ok()) return s;
    if (colon != absl::string_view::npos) {
      s = DecodeInto(userinfo.substr(colon + 1), "password", &parts.password);
      if (!s.ok()) return s;
    }
  }
  absl::Status s;
  if (absl::StrContains(hostport, ',')) {
    for (absl::string_view item : absl::StrSplit(hostport, ',')) {
      UriParts one;
      if (item.empty()) {
        return absl::InvalidArgumentError(
            "the URI's host list has an empty entry: write it as clickhouse://user@h1:8123,h2:8123,h3:8123/database");
      }
      s = ParseHostPort(item, &one);
      if (!s.ok()) return s;
      if (!one.host) {
        return absl::InvalidArgumentError(
            absl::StrCat("the URI's host list entry ", Shown(item),
                         " has no host: write each entry as host or host:port, as in "
                         "clickhouse://user@h1:8123,h2:8123,h3:8123/database"));
      }
      parts.hosts.emplace_back(*one.host, one.port);
    }
    parts.host = parts.hosts[0].first;
    parts.port = parts.hosts[0].second;
  } else {
    s = ParseHostPort(hostport, &parts);
    if (!s.ok()) return s;
  }

  if (path.size() > 1) {
    const absl::string_view database = path.substr(1);
    if (absl::StrContains(database, '/')) {
      return absl::InvalidArgumentError(
          absl::StrCat("the URI path must be a single database name, as in ", kExpectedForm,
                       ": remove the extra '/', or write a '/' inside the name as %2F"));
    }
    s = DecodeInto(database, "database", &parts.database);
    if (!s.ok()) return s;
  }
  s = ParseQuery(query, &parts);
  if (!s.ok()) return s;
  return parts;
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
