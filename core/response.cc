// Error classification and TabSeparated decoding for ClickHouse HTTP answers.
#include "core/response.h"

#include <algorithm>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "re2/re2.h"

namespace chstate {
namespace {

constexpr char kCodePayload[] = "chstate/clickhouse-code";
constexpr size_t kMaxMessage = 600;

// The human part of a ClickHouse exception body, without the boilerplate.
std::string ExceptionMessage(absl::string_view body) {
  static const RE2* const kMessage = new RE2(R"(DB::Exception: (.*?)(?:, e\.what\(\)|\s\(version|$))");
  std::string message;
  absl::string_view text = absl::StripAsciiWhitespace(body);
  if (!RE2::PartialMatch(text, *kMessage, &message)) message = std::string(text);
  if (message.size() > kMaxMessage) message = absl::StrCat(message.substr(0, kMaxMessage), "...");
  return message;
}

// The exception a server appended to an answer it had begun with HTTP 200:
// the text after the last line start "Code: N", if it holds no tab. A row
// (every read has two or more columns) may itself begin with "Code: N," (a
// state id) and is never taken for it. As the exception holds no tab, only
// the text after the last tab is searched: a page of rows is not read from
// its end to its start on every answer (it was 7% of an export's time).
std::optional<absl::string_view> TrailingException(absl::string_view body) {
  const size_t tab = body.rfind('\t');
  const absl::string_view end = tab == absl::string_view::npos ? body : body.substr(tab);
  const size_t last = end.rfind("\nCode: ");
  const absl::string_view tail = last == absl::string_view::npos ? body : end.substr(last + 1);
  if (tail.find('\t') != absl::string_view::npos || !ParseExceptionCode(tail)) return std::nullopt;
  return tail;
}

// The code in X-ClickHouse-Exception-Code, which wins over the body.
std::optional<int> HeaderCode(const SqlResponse& r) {
  int code = 0;
  if (!r.exception_code_header.empty() && absl::SimpleAtoi(r.exception_code_header, &code)) return code;
  return std::nullopt;
}

absl::Status WithCode(absl::Status s, int code) {
  s.SetPayload(kCodePayload, absl::Cord(absl::StrCat(code)));
  return s;
}

}  // namespace

std::optional<int> ParseExceptionCode(absl::string_view body) {
  static const RE2* const kCode = new RE2(R"((?:^|\n)Code: (\d+)[.,])");
  int code = 0;
  if (RE2::PartialMatch(body, *kCode, &code)) return code;
  return std::nullopt;
}

std::optional<int> ResponseCode(const SqlResponse& r) {
  if (!r.transport_ok) return std::nullopt;
  if (std::optional<int> header = HeaderCode(r)) return header;
  if (r.http_status != 200) return ParseExceptionCode(r.body);
  std::optional<absl::string_view> exception = TrailingException(r.body);
  return exception ? ParseExceptionCode(*exception) : std::nullopt;
}

std::optional<int> ClickHouseCode(const absl::Status& status) {
  std::optional<absl::Cord> p = status.GetPayload(kCodePayload);
  int code = 0;
  if (p && absl::SimpleAtoi(std::string(*p), &code)) return code;
  return std::nullopt;
}

absl::Status CheckResponse(const SqlResponse& r, absl::string_view what) {
  if (!r.transport_ok) {
    return absl::UnavailableError(absl::StrCat("no answer from ClickHouse while ", what, ": ", r.transport_error));
  }
  std::optional<int> code = HeaderCode(r);
  absl::string_view body = r.body;
  if (r.http_status == 200 && !code) {
    // HTTP 200 whose body ends in an exception: the server (or something
    // between) failed after answering 200. Statements without a result
    // answer nothing on success, so this is never success.
    std::optional<absl::string_view> exception = TrailingException(body);
    if (!exception) return absl::OkStatus();
    body = *exception;
  }
  if (!code) code = ParseExceptionCode(body);
  if (!code) {
    if (r.http_status == 503 || r.http_status == 502 || r.http_status == 504) {
      return absl::UnavailableError(absl::StrCat("ClickHouse answered HTTP ", r.http_status, " while ", what,
                                                 "; the server may be restarting or overloaded"));
    }
    if (r.http_status == 401 || r.http_status == 403) {
      return absl::UnauthenticatedError(absl::StrCat("ClickHouse refused the credentials (HTTP ", r.http_status,
                                                     ") while ", what, ": check the user and password"));
    }
    return absl::InternalError(absl::StrCat("ClickHouse answered HTTP ", r.http_status, " while ", what, ": ",
                                            ExceptionMessage(body)));
  }
  std::string message = ExceptionMessage(body);
  switch (*code) {
    case ch::kUnknownUser:
    case ch::kWrongPassword:
    case ch::kRequiredPassword:
    case ch::kAuthenticationFailed:
      return WithCode(absl::UnauthenticatedError(absl::StrCat(
                          "ClickHouse rejected the login while ", what, " (code ", *code, "): ", message,
                          ". Check the user and password settings")),
                      *code);
    case ch::kAccessDenied:
      return WithCode(absl::PermissionDeniedError(absl::StrCat("ClickHouse denied access while ", what, " (code ",
                                                               *code, "): ", message,
                                                               ". Grant the user rights on the state schema")),
                      *code);
    // 18.x has no GRANT: a user's rights are its users.xml entry and profile
    // (docs/operations.md lists what chstate needs).
    case ch::kReadonly:
      if (ReplicaNotActive(body)) {
        return WithCode(absl::UnavailableError(absl::StrCat(
                            "ClickHouse's replica refused a write while ", what, " (code ", *code, "): ", message,
                            ". Its ZooKeeper session is being restored; nothing was written. Retry in a few "
                            "seconds, or check ZooKeeper and the replica")),
                        *code);
      }
      return WithCode(absl::PermissionDeniedError(absl::StrCat(
                          "ClickHouse refused a write while ", what, " (code ", *code, "): ", message,
                          ". The user's profile is read-only: chstate writes states and locks, so give it a "
                          "profile with readonly = 0 (docs/operations.md)")),
                      *code);
    case ch::kDatabaseAccessDenied:
      return WithCode(absl::PermissionDeniedError(absl::StrCat(
                          "ClickHouse denied the database while ", what, " (code ", *code, "): ", message,
                          ". Add the state schema's database to the user's allow_databases (docs/operations.md)")),
                      *code);
    case ch::kQueryIsProhibited:
      return WithCode(absl::PermissionDeniedError(absl::StrCat(
                          "ClickHouse refused DDL while ", what, " (code ", *code, "): ", message,
                          ". chstate creates its tables and each lock's table, so the user needs allow_ddl = 1 "
                          "(docs/operations.md)")),
                      *code);
    case kCodeUnknownTable:
    case kCodeUnknownDatabase:
      return WithCode(absl::NotFoundError(absl::StrCat("ClickHouse error ", *code, " while ", what, ": ", message,
                                                       ". Run `chstate init` to create the tables")),
                      *code);
    case kCodeTableAlreadyExists:
      return WithCode(absl::AlreadyExistsError(message), *code);
    case ch::kTimeoutExceeded:
    case ch::kTooManySimultaneousQueries:
    case ch::kSocketTimeout:
    case ch::kNetworkError:
    case ch::kSystemError:
    case ch::kReplicaIsNotInQuorum:
    case ch::kTooFewLiveReplicas:
    case ch::kUnsatisfiedQuorumForPreviousWrite:
    case ch::kUnknownStatusOfInsert:
      return WithCode(absl::UnavailableError(absl::StrCat("ClickHouse error ", *code, " while ", what, ": ",
                                                          message, ". Retry later")),
                      *code);
    default:
      return WithCode(
          absl::InternalError(absl::StrCat("ClickHouse error ", *code, " while ", what, ": ", message)), *code);
  }
}

std::string UnescapeTsvField(absl::string_view field) {
  std::string out;
  out.reserve(field.size());
  size_t i = 0;
  while (i < field.size()) {
    // The bytes up to the next escape are copied whole (a state's side is
    // mostly such bytes: only its backslashes are escaped).
    const size_t slash = field.find('\\', i);
    if (slash == absl::string_view::npos || slash + 1 == field.size()) {
      out.append(field.data() + i, field.size() - i);
      break;
    }
    out.append(field.data() + i, slash - i);
    i = slash + 1;
    const char e = field[i++];
    switch (e) {
      case 'b': out.push_back('\b'); break;
      case 'f': out.push_back('\f'); break;
      case 'n': out.push_back('\n'); break;
      case 'r': out.push_back('\r'); break;
      case 't': out.push_back('\t'); break;
      case '0': out.push_back('\0'); break;
      case 'a': out.push_back('\a'); break;
      case 'v': out.push_back('\v'); break;
      case 'x': {
        int value = 0;
        if (i + 1 < field.size() && absl::ascii_isxdigit(field[i]) && absl::ascii_isxdigit(field[i + 1]) &&
            absl::SimpleHexAtoi(field.substr(i, 2), &value)) {
          out.push_back(static_cast<char>(value));
          i += 2;
        } else {
          out.push_back('x');
        }
        break;
      }
      default: out.push_back(e);
    }
  }
  return out;
}

bool ReplicaNotActive(absl::string_view text) { return absl::StrContains(text, "Replica is not active"); }

absl::StatusOr<Rows> ParseTabSeparated(absl::string_view body, size_t columns) {
  Rows rows;
  if (body.empty()) return rows;
  auto truncated = [&](absl::string_view why) -> absl::Status {
    if (std::optional<absl::string_view> exception = TrailingException(body)) {
      const int code = *ParseExceptionCode(*exception);
      return WithCode(absl::InternalError(absl::StrCat("ClickHouse failed mid-answer (code ", code,
                                                       "): ", ExceptionMessage(*exception))),
                      code);
    }
    return absl::DataLossError(absl::StrCat("ClickHouse sent an incomplete or malformed answer (", why,
                                            "); nothing was changed by reading it. Retry"));
  };
  if (body.back() != '\n') return truncated("the last row has no line end");
  body.remove_suffix(1);
  rows.reserve(static_cast<size_t>(std::count(body.begin(), body.end(), '\n')) + 1);
  std::vector<absl::string_view> fields;  // one row's, its storage kept for the next
  for (absl::string_view line : absl::StrSplit(body, '\n')) {
    fields.clear();
    for (absl::string_view f : absl::StrSplit(line, '\t')) fields.push_back(f);
    if (fields.size() != columns) {
      return truncated(absl::StrCat("a row has ", fields.size(), " fields, expected ", columns));
    }
    Row row;
    row.reserve(columns);
    for (absl::string_view f : fields) {
      if (f == "\\N") {
        row.push_back(std::nullopt);
      } else {
        row.push_back(UnescapeTsvField(f));
      }
    }
    rows.push_back(std::move(row));
  }
  return rows;
}

}  // namespace chstate
