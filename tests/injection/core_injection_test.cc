// Regression tests for the two core bugs the fuzzers found (tests/fuzz):
// - Statements::DropTable put a table name read back from the server
//   (`chstate init` removing lock tombstones) between backquotes unescaped,
//   so a table named with a backquote could change the DROP statement;
// - ParseTabSeparated reported the code of the first line starting with
//   "Code: N," when an answer failed mid-way, which can be a row (a state id
//   such as "Code: 57, x") instead of the server's exception;
// - CheckResponse took HTTP 200 for success even when the body ended in an
//   exception (found by tests/faults: a lock CREATE answered that way was
//   taken as acquired, and the state was written without the lock).
#include "core/response.h"
#include "core/statements.h"
#include "core/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace chstate {
namespace {

using ::chstate::testing::StatusIs;
using ::testing::HasSubstr;

TEST(DropTable, HostileNameStaysOneIdentifier) {
  struct Case {
    const char* name;
    std::string table;
    const char* sql;
  };
  static const Case kCases[] = {
      {"plain", "state_lock_00_dead_11", "DROP TABLE IF EXISTS `meltano`.`state_lock_00_dead_11`"},
      {"backquote", "t_dead_x` ; DROP DATABASE `meltano",
       "DROP TABLE IF EXISTS `meltano`.`t_dead_x\\` ; DROP DATABASE \\`meltano`"},
      {"backslash before backquote", "a\\`b", "DROP TABLE IF EXISTS `meltano`.`a\\\\\\`b`"},
      {"quote", "a'b", "DROP TABLE IF EXISTS `meltano`.`a\\'b`"},
      {"bytes", std::string("a\0\n\xff", 4), "DROP TABLE IF EXISTS `meltano`.`a\\x00\\x0a\\xff`"},
  };
  for (Dialect d : {Dialect::kClickHouse18, Dialect::kModern}) {
    Statements st = *Statements::Create(d, "meltano", "state");
    for (const Case& c : kCases) {
      EXPECT_EQ(st.DropTable(c.table).sql, c.sql) << c.name;
    }
  }
}

TEST(ParseTabSeparated, ExceptionCodeComesFromTheLastLineNotFromARow) {
  // A listing whose rows start like exceptions, cut by a real one.
  const std::string body =
      "Code: 57, looks like an exception\t1\n"
      "Code: 60. also a state id\t1\n"
      "Code: 241, e.displayText() = DB::Exception: Memory limit exceeded, e.what() = DB::Exception\n";
  absl::StatusOr<Rows> rows = ParseTabSeparated(body, 2);
  EXPECT_THAT(rows.status(), StatusIs(absl::StatusCode::kInternal, HasSubstr("Memory limit exceeded")));
  EXPECT_EQ(ClickHouseCode(rows.status()), 241);
  // Without an exception at the end, a cut answer is data loss, whatever the
  // rows look like.
  absl::StatusOr<Rows> cut = ParseTabSeparated("Code: 57, x\t1\nCode: 60, y", 2);
  EXPECT_THAT(cut.status(), StatusIs(absl::StatusCode::kInternal, HasSubstr("code 60")));
  EXPECT_EQ(ClickHouseCode(cut.status()), 60);
  absl::StatusOr<Rows> plain = ParseTabSeparated("Code: 57, x\t1\nabc", 2);
  EXPECT_THAT(plain.status(), StatusIs(absl::StatusCode::kDataLoss, HasSubstr("incomplete")));
}

SqlResponse Ok200(std::string body) {
  SqlResponse r;
  r.http_status = 200;
  r.body = std::move(body);
  return r;
}

TEST(CheckResponse, Http200EndingInAnExceptionIsAnError) {
  absl::Status s = CheckResponse(
      Ok200("Code: 241, e.displayText() = DB::Exception: Memory limit exceeded, e.what() = DB::Exception\n"),
      "taking the lock");
  EXPECT_THAT(s, StatusIs(absl::StatusCode::kInternal, HasSubstr("Memory limit exceeded")));
  EXPECT_EQ(ClickHouseCode(s), 241);
  // Modern servers' form, after rows.
  s = CheckResponse(Ok200("a\t1\nCode: 57. DB::Exception: Table m.x already exists. (TABLE_ALREADY_EXISTS)"),
                    "x");
  EXPECT_THAT(s, StatusIs(absl::StatusCode::kAlreadyExists, HasSubstr("already exists")));
  // Success: nothing, or rows (one may begin like an exception).
  EXPECT_TRUE(CheckResponse(Ok200(""), "x").ok());
  EXPECT_TRUE(CheckResponse(Ok200("Code: 57, x\t1\n"), "x").ok());
  EXPECT_TRUE(CheckResponse(Ok200("18.16.1\t1\n"), "x").ok());
}

}  // namespace
}  // namespace chstate
