// The README's "Defaults" table is the core's kDefaults, row for row: a
// default changed in core/defaults.h without the README (or a README row for
// a default that does not exist) fails here.
#include "core/defaults.h"

#include <fstream>
#include <set>
#include <sstream>
#include <string>

#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/match.h"
#include "absl/strings/str_split.h"
#include "core/clickhouse_errors.h"

namespace chstate {
namespace {

std::string Readme() {
  std::ifstream in("README.md");
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string Row(const DefaultSetting& d) {
  std::string value = absl::StrCat(d.value);
  if (std::string(d.unit) != "count") absl::StrAppend(&value, " ", d.unit);
  return absl::StrCat("| `", d.name, "` | ", value, " | ", d.meaning, " |");
}

TEST(Defaults, ReadmeTableIsTheCoresTable) {
  const std::string readme = Readme();
  ASSERT_FALSE(readme.empty()) << "README.md not found in the test's data";
  const size_t start = readme.find("### Defaults");
  ASSERT_NE(start, std::string::npos) << "README has no \"### Defaults\" section";
  std::set<std::string> rows;
  for (absl::string_view line : absl::StrSplit(readme.substr(start), '\n')) {
    if (absl::StartsWith(line, "| `")) rows.insert(std::string(line));
    if (absl::StartsWith(line, "## ")) break;
  }
  std::set<std::string> expected;
  for (const DefaultSetting& d : kDefaults) expected.insert(Row(d));
  EXPECT_EQ(rows, expected);
}

TEST(Defaults, NamesAreUniqueAndValuesPositive) {
  std::set<std::string> names;
  for (const DefaultSetting& d : kDefaults) {
    EXPECT_TRUE(names.insert(d.name).second) << d.name;
    EXPECT_GT(d.value, 0) << d.name;
  }
}

TEST(ClickHouseErrors, EveryInterpretedCodeIsListedOnce) {
  std::set<int> codes;
  for (const ch::ErrorCode& e : ch::kInterpreted) {
    EXPECT_TRUE(codes.insert(e.code).second) << e.code;
    EXPECT_EQ(ch::Find(e.code), &e);
  }
  EXPECT_EQ(ch::Find(1), nullptr);
  EXPECT_STREQ(ch::Find(ch::kUnsatisfiedQuorumForPreviousWrite)->name, "UNSATISFIED_QUORUM_FOR_PREVIOUS_WRITE");
}

}  // namespace
}  // namespace chstate
