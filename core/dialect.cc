// Server version parsing and the version -> dialect decision.
#include "core/dialect.h"

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "re2/re2.h"

namespace chstate {

absl::StatusOr<ServerVersion> ParseServerVersion(absl::string_view text) {
  static const RE2* const kVersion = new RE2(R"((\d{1,4})\.(\d{1,4})(?:\.(\d{1,6}))?.*)");
  absl::string_view trimmed = text;
  while (!trimmed.empty() && (trimmed.back() == '\n' || trimmed.back() == '\r' || trimmed.back() == ' ')) {
    trimmed.remove_suffix(1);
  }
  ServerVersion v;
  std::string patch;
  if (!RE2::FullMatch(trimmed, *kVersion, &v.major, &v.minor, &patch)) {
    return absl::InvalidArgumentError(
        absl::StrCat("could not read the server version from \"", trimmed.substr(0, 64),
                     "\": is this a ClickHouse HTTP endpoint?"));
  }
  if (!patch.empty() && !absl::SimpleAtoi(patch, &v.patch)) v.patch = 0;
  v.text = std::string(trimmed);
  return v;
}

absl::StatusOr<Dialect> DialectFor(const ServerVersion& v) {
  auto at_least = [&](int major, int minor) { return v.major > major || (v.major == major && v.minor >= minor); };
  if (!at_least(18, 16)) {
    return absl::FailedPreconditionError(absl::StrCat("ClickHouse ", v.text,
                                                      " is not supported: chstate needs 18.16 or later "
                                                      "(23.3 or later for the modern dialect)"));
  }
  // Lightweight DELETE (23.3) is the newest feature the modern dialect uses.
  return at_least(23, 3) ? Dialect::kModern : Dialect::kClickHouse18;
}

const char* DialectName(Dialect d) { return d == Dialect::kModern ? "modern" : "clickhouse18"; }

}  // namespace chstate
