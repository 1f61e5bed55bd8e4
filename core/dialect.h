// Which SQL a server gets, chosen from `SELECT version()`.
//
//   absl::StatusOr<chstate::ServerVersion> v = chstate::ParseServerVersion("23.8.2.7");
//   absl::StatusOr<chstate::Dialect> d = chstate::DialectFor(*v);   // Dialect::kModern
//
// kClickHouse18 is for servers from 18.16 up to (not including) 23.3: DateTime
// versions, no TTL, `ALTER TABLE ... DELETE` mutations that are waited for,
// settings in URL parameters, values as escaped literals.
// kModern is for 23.3 and later: DateTime64(3), table TTL, lightweight DELETE,
// `{name:Type}` query parameters, `async_insert=0` and a unique
// insert_deduplication_token on every write.
#ifndef CHSTATE_CORE_DIALECT_H_
#define CHSTATE_CORE_DIALECT_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace chstate {

enum class Dialect { kClickHouse18, kModern };

struct ServerVersion {
  int major = 0;
  int minor = 0;
  int patch = 0;
  std::string text;  // as the server printed it
};

// Parses "18.16.1", "23.8.2.7", "26.9.2.1", "24.3.1.2672-lts". kInvalidArgument
// when it does not start with MAJOR.MINOR.
absl::StatusOr<ServerVersion> ParseServerVersion(absl::string_view text);

// kFailedPrecondition for servers older than 18.16 (names the version and the
// minimum).
absl::StatusOr<Dialect> DialectFor(const ServerVersion& version);

// "clickhouse18" / "modern": used in output and test vectors.
const char* DialectName(Dialect d);

}  // namespace chstate

#endif  // CHSTATE_CORE_DIALECT_H_
