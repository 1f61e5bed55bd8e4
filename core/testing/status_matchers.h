// GoogleMock matchers for absl::Status / absl::StatusOr in core tests.
//
//   EXPECT_THAT(ParseClickHouseUri("mysql://x"),
//               StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("scheme")));
//   ASSERT_OK_AND_ASSIGN(auto parts, ParseClickHouseUri("clickhouse://u@h/db"));
#ifndef CHSTATE_CORE_TESTING_STATUS_MATCHERS_H_
#define CHSTATE_CORE_TESTING_STATUS_MATCHERS_H_

#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "gmock/gmock.h"

namespace chstate::testing {

inline const absl::Status& GetStatus(const absl::Status& s) { return s; }
template <typename T>
const absl::Status& GetStatus(const absl::StatusOr<T>& s) {
  return s.status();
}

MATCHER_P2(StatusIs, code, message_matcher,
           std::string("has status code ") + absl::StatusCodeToString(code)) {
  const absl::Status& s = GetStatus(arg);
  if (s.code() != code) {
    *result_listener << "whose status is " << s.ToString();
    return false;
  }
  return ::testing::ExplainMatchResult(message_matcher, std::string(s.message()),
                                       result_listener);
}

MATCHER(IsOk, "is OK") {
  const absl::Status& s = GetStatus(arg);
  if (!s.ok()) *result_listener << "whose status is " << s.ToString();
  return s.ok();
}

}  // namespace chstate::testing

#define CHSTATE_CONCAT_INNER_(a, b) a##b
#define CHSTATE_CONCAT_(a, b) CHSTATE_CONCAT_INNER_(a, b)
#define ASSERT_OK_AND_ASSIGN(lhs, expr)                                   \
  auto CHSTATE_CONCAT_(status_or_, __LINE__) = (expr);                    \
  ASSERT_TRUE(CHSTATE_CONCAT_(status_or_, __LINE__).ok())                 \
      << CHSTATE_CONCAT_(status_or_, __LINE__).status().ToString();       \
  lhs = std::move(CHSTATE_CONCAT_(status_or_, __LINE__)).value()
#define ASSERT_OK(expr)                                                   \
  do {                                                                    \
    absl::Status s_ = ::chstate::testing::GetStatus(expr);                \
    ASSERT_TRUE(s_.ok()) << s_.ToString();                                \
  } while (0)

#endif  // CHSTATE_CORE_TESTING_STATUS_MATCHERS_H_
