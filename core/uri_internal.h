// Internal to core/config.cc and core/uri.cc: the pieces of URI text
// handling that parsing a URI and resolving settings share.
#ifndef CHSTATE_CORE_URI_INTERNAL_H_
#define CHSTATE_CORE_URI_INTERNAL_H_

#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "core/config.h"
#include "re2/re2.h"

namespace chstate {
namespace uri_internal {

// Values echoed in messages go through this so a stray control byte cannot
// garble a terminal or a log line.
std::string Shown(absl::string_view text);

// A host name: letters, digits, '.', '_' and '-'.
const RE2& HostNamePattern();

// Every IPv6 literal has at least two colons; requiring them keeps a mistyped
// "db:8123" from passing as an address.
const RE2& Ipv6Pattern();

// Digits only, 1 to 65535: SimpleAtoi alone would also take "+80" and " 80".
std::optional<int> ParsePort(absl::string_view text);

// Leaves `extra_safe` readable (like '/' in a ca_file path); everything that
// could change how the URI splits is escaped.
std::string PercentEncode(absl::string_view in, absl::string_view extra_safe = "");

// One host[:port] of a URI (or of the hosts setting) appended to parts->hosts.
absl::Status ParseHostPort(absl::string_view hostport, UriParts* parts);

}  // namespace uri_internal
}  // namespace chstate

#endif  // CHSTATE_CORE_URI_INTERNAL_H_
