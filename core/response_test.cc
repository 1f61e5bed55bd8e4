// How server answers become results or errors the caller can act on.
#include "core/response.h"

#include "absl/strings/str_cat.h"
#include "core/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace chstate {
namespace {

using ::chstate::testing::IsOk;
using ::chstate::testing::StatusIs;
using ::testing::HasSubstr;
using ::testing::Not;

SqlResponse Http(int status, std::string body, std::string header = "") {
  SqlResponse r;
  r.http_status = status;
  r.body = std::move(body);
  r.exception_code_header = std::move(header);
  return r;
}

struct ErrorCase {
  const char* name;
  SqlResponse response;
  absl::StatusCode code;
  const char* message_part;
  std::optional<int> clickhouse_code;
};

TEST(CheckResponse, ClassifiesServerAnswers) {
  SqlResponse refused;
  refused.transport_ok = false;
  refused.transport_error = "connection refused (127.0.0.1:1)";
  static const ErrorCase kCases[] = {
      {"transport failure", refused, absl::StatusCode::kUnavailable, "connection refused", std::nullopt},
      {"18.x unknown table",
       Http(404, "Code: 60, e.displayText() = DB::Exception: Table m.state doesn't exist., e.what() = DB::Exception\n"),
       absl::StatusCode::kNotFound, "chstate init", 60},
      {"modern unknown database",
       Http(404, "Code: 81. DB::Exception: Database m does not exist. (UNKNOWN_DATABASE) (version 26.9.2.1)\n"),
       absl::StatusCode::kNotFound, "Database m does not exist", 81},
      {"wrong password 18.x",
       Http(500, "Code: 193, e.displayText() = DB::Exception: Wrong password for user chstate, e.what() = "
                 "DB::Exception\n"),
       absl::StatusCode::kUnauthenticated, "user and password", 193},
      {"auth failed modern", Http(516, "Code: 516. DB::Exception: u: Authentication failed. (AUTHENTICATION_FAILED)"),
       absl::StatusCode::kUnauthenticated, "Authentication failed", 516},
      {"access denied", Http(500, "Code: 497. DB::Exception: u: Not enough privileges. (ACCESS_DENIED)"),
       absl::StatusCode::kPermissionDenied, "Grant", 497},
      // 18.16's users.xml rights, words as that server gives them.
      {"read-only profile 18.x",
       Http(500, "Code: 164, e.displayText() = DB::Exception: Cannot create database in readonly mode, e.what() = "
                 "DB::Exception\n"),
       absl::StatusCode::kPermissionDenied, "readonly = 0", 164},
      // The same code from a replicated table's quorum write while the
      // replica's ZooKeeper session is being restored: no profile to change.
      {"replica not active 18.x",
       Http(500, "Code: 164, e.displayText() = DB::Exception: Replica is not active right now, e.what() = "
                 "DB::Exception\n"),
       absl::StatusCode::kUnavailable, "ZooKeeper session is being restored", 164},
      {"database not allowed 18.x",
       Http(500, "Code: 291, e.displayText() = DB::Exception: Access denied to database meltano for user chstate, "
                 "e.what() = DB::Exception\n"),
       absl::StatusCode::kPermissionDenied, "allow_databases", 291},
      {"DDL prohibited 18.x",
       Http(500, "Code: 392, e.displayText() = DB::Exception: Cannot create database. DDL queries are prohibited "
                 "for the user, e.what() = DB::Exception\n"),
       absl::StatusCode::kPermissionDenied, "allow_ddl = 1", 392},
      {"table exists", Http(500, "Code: 57, e.displayText() = DB::Exception: Table m.x already exists., e.what()"),
       absl::StatusCode::kAlreadyExists, "already exists", 57},
      {"header code wins over 200", Http(200, "partial output", "241"), absl::StatusCode::kInternal, "241", 241},
      {"syntax error", Http(400, "Code: 62. DB::Exception: Syntax error: failed at position 1"),
       absl::StatusCode::kInternal, "Syntax error", 62},
      {"overloaded", Http(500, "Code: 202. DB::Exception: Too many simultaneous queries."),
       absl::StatusCode::kUnavailable, "Retry later", 202},
      {"proxy 503 without code", Http(503, "<html>bad gateway</html>"), absl::StatusCode::kUnavailable, "503",
       std::nullopt},
      {"401 without code", Http(401, ""), absl::StatusCode::kUnauthenticated, "credentials", std::nullopt},
      {"500 without code", Http(500, "something broke"), absl::StatusCode::kInternal, "something broke",
       std::nullopt},
  };
  for (const ErrorCase& c : kCases) {
    SCOPED_TRACE(c.name);
    absl::Status s = CheckResponse(c.response, "reading state");
    EXPECT_THAT(s, StatusIs(c.code, HasSubstr(c.message_part)));
    EXPECT_EQ(ClickHouseCode(s), c.clickhouse_code);
    EXPECT_EQ(ResponseCode(c.response), c.clickhouse_code);
  }
}

TEST(ResponseCode, AgreesWithCheckResponseAfterHttp200) {
  EXPECT_EQ(ResponseCode(Http(200, "1\n")), std::nullopt);
  const SqlResponse failed_late = Http(200, "k\tv\nCode: 241, e.displayText() = DB::Exception: Memory limit\n");
  EXPECT_EQ(ResponseCode(failed_late), 241);
  EXPECT_EQ(ClickHouseCode(CheckResponse(failed_late, "x")), 241);
  // A row that merely starts like an exception is not one.
  EXPECT_EQ(ResponseCode(Http(200, "Code: 5, id\tv\n")), std::nullopt);
}

TEST(CheckResponse, SuccessIsOk) { EXPECT_THAT(CheckResponse(Http(200, "1\n"), "x"), IsOk()); }

TEST(CheckResponse, LongMessagesAreCut) {
  absl::Status s = CheckResponse(Http(500, "Code: 1. DB::Exception: " + std::string(100000, 'x')), "x");
  EXPECT_LT(s.message().size(), 1000u);
}

struct TsvCase {
  const char* name;
  std::string body;
  size_t columns;
  Rows rows;
};

TEST(ParseTabSeparated, DecodesRowsNullsAndEscapes) {
  static const TsvCase kCases[] = {
      {"empty", "", 1, {}},
      {"one row", "a\tb\n", 2, {{"a", "b"}}},
      {"null vs backslash-N text", "\\N\t\\\\N\n", 2, {{std::nullopt, "\\N"}}},
      {"escapes", "a\\tb\\nc\\\\d\\0e\\'f\n", 1, {{std::string("a\tb\nc\\d\0e'f", 11)}}},
      {"hex escape", "\\xff\\x41\n", 1, {{"\xff" "A"}}},
      {"raw high bytes pass through", "\xc3\xa9\xff\n", 1, {{"\xc3\xa9\xff"}}},
      {"empty string field", "\t\n", 2, {{"", ""}}},
      {"several rows", "a\nb\nc\n", 1, {{"a"}, {"b"}, {"c"}}},
  };
  for (const TsvCase& c : kCases) {
    SCOPED_TRACE(c.name);
    absl::StatusOr<Rows> rows = ParseTabSeparated(c.body, c.columns);
    ASSERT_THAT(rows, IsOk());
    EXPECT_EQ(*rows, c.rows);
  }
}

TEST(ParseTabSeparated, TruncatedOrMalformedIsAnError) {
  EXPECT_THAT(ParseTabSeparated("a\tb", 2), StatusIs(absl::StatusCode::kDataLoss, HasSubstr("line end")));
  EXPECT_THAT(ParseTabSeparated("a\n", 2), StatusIs(absl::StatusCode::kDataLoss, HasSubstr("expected 2")));
  // An exception that arrived after HTTP 200 and part of the rows.
  // Reads always have two or more columns, so the exception line cannot parse
  // as a row.
  absl::StatusOr<Rows> mid = ParseTabSeparated(
      "a\t1\nb\t1\nCode: 241, e.displayText() = DB::Exception: Memory limit exceeded, e.what() = DB::Exception\n",
      2);
  EXPECT_THAT(mid, StatusIs(absl::StatusCode::kInternal, HasSubstr("Memory limit")));
  EXPECT_EQ(ClickHouseCode(mid.status()), 241);
}

// A row is never taken for an exception: a state id may well read
// "Code: 60, x", but a row has tabs and an exception line has none.
TEST(CheckResponse, ARowThatLooksLikeAnExceptionIsARow) {
  EXPECT_THAT(CheckResponse(Http(200, "a\t1\nCode: 60, x\t1\n"), "x"), IsOk());
  EXPECT_THAT(CheckResponse(Http(200, "Code: 60, x\t1\n"), "x"), IsOk());
  EXPECT_THAT(CheckResponse(Http(200, "a\t1\nCode: 60, x\t1\nb\t2\n"), "x"), IsOk());
  // The exception after the last row is found however many rows come before it.
  std::string page;
  for (int i = 0; i < 1000; ++i) absl::StrAppend(&page, "id", i, "\t{}\n");
  EXPECT_THAT(CheckResponse(Http(200, page), "x"), IsOk());
  EXPECT_EQ(ResponseCode(Http(200, page + "Code: 241, e.displayText() = DB::Exception: Memory limit\n")), 241);
  absl::StatusOr<Rows> rows = ParseTabSeparated("Code: 60, x\t1\n", 2);
  ASSERT_THAT(rows, IsOk());
  ASSERT_EQ(rows->size(), 1u);
  EXPECT_EQ((*rows)[0][0], std::optional<std::string>("Code: 60, x"));
}

TEST(ParseTabSeparated, ExtraFieldsAreAnError) {
  EXPECT_THAT(ParseTabSeparated("a\tb\tc\n", 2), StatusIs(absl::StatusCode::kDataLoss, HasSubstr("expected 2")));
}

TEST(ParseExceptionCode, BothFormats) {
  EXPECT_EQ(ParseExceptionCode("Code: 60, e.displayText() = x"), 60);
  EXPECT_EQ(ParseExceptionCode("Code: 81. DB::Exception: x"), 81);
  EXPECT_EQ(ParseExceptionCode("no code here"), std::nullopt);
  EXPECT_EQ(ParseExceptionCode("Code: x"), std::nullopt);
}

TEST(UnescapeTsvField, TrailingBackslashAndBadHexStayLiteral) {
  EXPECT_EQ(UnescapeTsvField("a\\"), "a\\");
  EXPECT_EQ(UnescapeTsvField("\\xZZ"), "xZZ");
  EXPECT_EQ(UnescapeTsvField("\\x4"), "x4");
}

// Runs of plain bytes between escapes, escapes side by side, at either end.
TEST(UnescapeTsvField, PlainRunsAroundEscapes) {
  EXPECT_EQ(UnescapeTsvField(""), "");
  EXPECT_EQ(UnescapeTsvField("{\"k\":\"v\"}"), "{\"k\":\"v\"}");
  EXPECT_EQ(UnescapeTsvField("\\ta\\\\b\\n"), "\ta\\b\n");
  EXPECT_EQ(UnescapeTsvField("{\"p\":\"C:\\\\\\\\x\"}"), "{\"p\":\"C:\\\\x\"}");
  EXPECT_EQ(UnescapeTsvField("\\x41\\x42c\\0d\\"), std::string("ABc\0d\\", 6));
  EXPECT_EQ(UnescapeTsvField("ab\\q"), "abq");
}

}  // namespace
}  // namespace chstate
