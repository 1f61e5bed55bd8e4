// The "core's defaults" table of docs/settings.md is the core's kDefaults,
// row for row: a default changed in core/defaults.h without the docs (or a
// row for a default that does not exist) fails here. Its "settings" table is
// the core's kSettings the same way. (tools/gendocs writes both tables, and
// //docs:generated_docs_test checks every generated table of the docs.)
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
#include "core/settings.h"

namespace chstate {
namespace {

std::string SettingsPage() {
  std::ifstream in("docs/settings.md");
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string Row(const DefaultSetting& d) {
  std::string value = absl::StrCat(d.value);
  if (std::string(d.unit) != "count") absl::StrAppend(&value, " ", d.unit);
  return absl::StrCat("| `", d.name, "` | ", value, " | ", d.meaning, " |");
}

// The table rows ("| `...") of the docs/settings.md section `heading`, up to
// the next section.
std::set<std::string> PageRows(const std::string& heading) {
  const std::string readme = SettingsPage();
  EXPECT_FALSE(readme.empty()) << "docs/settings.md not found in the test's data";
  const size_t start = readme.find(heading + "\n");
  EXPECT_NE(start, std::string::npos) << "docs/settings.md has no \"" << heading << "\" section";
  std::set<std::string> rows;
  if (start == std::string::npos) return rows;
  for (absl::string_view line : absl::StrSplit(readme.substr(start + heading.size() + 1), '\n')) {
    if (absl::StartsWith(line, "#")) break;
    if (absl::StartsWith(line, "| `")) rows.insert(std::string(line));
  }
  return rows;
}

TEST(Defaults, ReadmeTableIsTheCoresTable) {
  std::set<std::string> expected;
  for (const DefaultSetting& d : kDefaults) expected.insert(Row(d));
  EXPECT_EQ(PageRows("## The core's defaults"), expected);
}

// A setting's row: its key, default, variable, Meltano name, meaning.
std::string SettingRow(const SettingSpec& s) {
  std::string def = DefaultText(s);
  if (def.empty()) def = "-";
  if (s.type == SettingType::kSeconds && s.default_number != kNoNumber) absl::StrAppend(&def, " s");
  const std::string meltano = absl::StrCat("state_backend.", s.meltano_core ? "" : "clickhouse.", s.key);
  return absl::StrCat("| `", s.key, "` | ", def, " | `", s.env, "` | `", meltano, "` | ", s.meaning, " |");
}

TEST(Settings, ReadmeTableIsTheCoresTable) {
  std::set<std::string> expected;
  for (size_t i = 0; i < kSettingsCount; ++i) expected.insert(SettingRow(kSettings[i]));
  const std::set<std::string> rows = PageRows("## The settings");
  EXPECT_EQ(rows, expected);
  for (const std::string& e : expected) {
    if (!rows.count(e)) ADD_FAILURE() << "docs/settings.md \"## The settings\" lacks:\n" << e;
  }
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
