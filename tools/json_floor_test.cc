#include "tools/json_floor.h"

#include <optional>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace chstate::tools {
namespace {

using ::testing::ElementsAre;

TEST(StoredSides, TheNonEmptySidesOfEachEntryAsStored) {
  const std::string document =
      "{\n"
      "  \"dev:a\": {\"completed\":{\"singer_state\":{\"b\":1,\"a\":[1,2]}},\"partial\":{}},\n"
      "  \"dev:b\": {\"completed\":{},\"partial\":{\"x\":null}}\n"
      "}\n";
  std::optional<std::vector<std::string>> sides = StoredSides(document);
  ASSERT_TRUE(sides.has_value());
  // dump()'s text: keys in order, no spaces; the empty sides are left out.
  EXPECT_THAT(*sides, ElementsAre("{\"singer_state\":{\"a\":[1,2],\"b\":1}}", "{\"x\":null}"));
}

TEST(StoredSides, NothingForTextThatIsNotAnExportDocument) {
  EXPECT_FALSE(StoredSides("{\n  \"dev:a\": [1]\n}\n").has_value());
  EXPECT_FALSE(StoredSides("{\n  \"dev:a\": {\"completed\":\n}\n").has_value());
  EXPECT_FALSE(StoredSides("{\"a\": {}, \"b\": {}}\n").has_value());  // two entries on a line
}

TEST(Pass, WhetherTheTextIsJson) {
  EXPECT_TRUE(Pass("{\"a\":[1,2.5,\"x\",true,null]}"));
  EXPECT_FALSE(Pass("{\"a\":}"));
  EXPECT_FALSE(Pass(""));
}

}  // namespace
}  // namespace chstate::tools
