// Parsing clickhouse:// URIs (ParseClickHouseUri) and the percent-encoding
// and host:port text they share with the settings (uri_internal.h).
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
namespace uri_internal {

std::string Shown(absl::string_view text) { return absl::StrCat("\"", absl::CHexEscape(text), "\""); }

const RE2& HostNamePattern() {
  static const RE2* const kHostName = new RE2("[A-Za-z0-9._-]+");
  return *kHostName;
}

const RE2& Ipv6Pattern() {
  static const RE2* const kIpv6 = new RE2("[0-9A-Fa-f.]*:[0-9A-Fa-f.]*:[0-9A-Fa-f:.]*");
  return *kIpv6;
}

std::optional<int> ParsePort(absl::string_view text) {
  static const RE2* const kDigits = new RE2("[0-9]{1,5}");
  int port = 0;
  if (!RE2::FullMatch(text, *kDigits) || !absl::SimpleAtoi(text, &port)) return std::nullopt;
  if (port < 1 || port > 65535) return std::nullopt;
  return port;
}

std::string PercentEncode(absl::string_view in, absl::string_view extra_safe) {
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

}  // namespace uri_internal

using uri_internal::HostNamePattern;
using uri_internal::Ipv6Pattern;
using uri_internal::ParseHostPort;
using uri_internal::ParsePort;
using uri_internal::Shown;

namespace {

constexpr absl::string_view kExpectedForm = "clickhouse://user:password@host:port/database";

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

}  // namespace chstate
