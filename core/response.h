// Reading what ClickHouse answered: errors (status, header, body) and
// TabSeparated result rows.
//
//   absl::Status s = chstate::CheckResponse(resp, "get state");
//   if (s.ok()) {
//     absl::StatusOr<chstate::Rows> rows = chstate::ParseTabSeparated(resp.body, 2);
//   }
//   std::optional<int> code = chstate::ClickHouseCode(s);   // e.g. 57, 60
//
// An exception can follow HTTP 200 when the server streams a result: the body
// then ends in "Code: N, ..." instead of a complete row. Requests set
// wait_end_of_query=1 to make that rare, and ParseTabSeparated treats an
// incomplete last row as an error, looking for the exception text.
#ifndef CHSTATE_CORE_RESPONSE_H_
#define CHSTATE_CORE_RESPONSE_H_

#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/clickhouse_errors.h"
#include "core/sql_request.h"

namespace chstate {

// Short names of the codes the lock acts on; core/clickhouse_errors.h lists
// every code the core interprets.
inline constexpr int kCodeUnknownTable = ch::kUnknownTable;
inline constexpr int kCodeTableAlreadyExists = ch::kTableAlreadyExists;
inline constexpr int kCodeUnknownDatabase = ch::kUnknownDatabase;
inline constexpr int kCodeTableIsDropped = ch::kTableIsDropped;

using Row = std::vector<std::optional<std::string>>;  // nullopt = SQL NULL
using Rows = std::vector<Row>;

// OK for a successful response. Otherwise a Status whose code says what a
// caller may do (abseil's guide):
//   kUnavailable       no response, or the server is overloaded/restarting: retry
//   kUnauthenticated   wrong user or password (codes 192, 193, 516)
//   kPermissionDenied  the user lacks a grant (code 497)
//   kNotFound          unknown table/database (60, 81): run `chstate init`
//   kAlreadyExists     code 57
//   kInternal          any other server exception, with its code and message
// The ClickHouse code, when known, is attached as a payload (ClickHouseCode).
// `what` names the operation in the message ("reading state").
absl::Status CheckResponse(const SqlResponse& response, absl::string_view what);

// The ClickHouse error code carried by a Status from CheckResponse.
std::optional<int> ClickHouseCode(const absl::Status& status);

// The ClickHouse error code of an answer, without building a Status: the
// same code ClickHouseCode(CheckResponse(response, ...)) gives, for callers
// that only branch on it (failover, the lock's retries).
std::optional<int> ResponseCode(const SqlResponse& response);

// Finds "Code: N" (18.x "Code: N, e.displayText() = ..." and modern
// "Code: N. DB::Exception: ...") in an error body.
std::optional<int> ParseExceptionCode(absl::string_view body);

// Parses TabSeparated output with exactly `columns` fields per row. `\N` is
// NULL; escapes (\\ \t \n \0 \b \f \r \' \xHH ...) are decoded to bytes.
// kDataLoss for a truncated or malformed body (a row without its final
// newline, a wrong field count), with the server's exception when the body
// contains one.
absl::StatusOr<Rows> ParseTabSeparated(absl::string_view body, size_t columns);

// Whether an error's text is code 164 (READONLY) as a replicated table's
// quorum write words it while the replica's ZooKeeper session is being
// restored ("Replica is not active right now"): not the user's profile, and
// nothing was written. For an error whose code is 164.
bool ReplicaNotActive(absl::string_view text);

// Decodes one TabSeparated-escaped field.
std::string UnescapeTsvField(absl::string_view field);

}  // namespace chstate

#endif  // CHSTATE_CORE_RESPONSE_H_
