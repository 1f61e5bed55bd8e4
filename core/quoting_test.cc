// Escaping is the injection boundary: every case here is a value a user could
// pass as a state id, pattern, schema or table.
#include "core/quoting.h"

#include <string>

#include "core/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace chstate {
namespace {

using ::chstate::testing::IsOk;
using ::chstate::testing::StatusIs;
using ::testing::HasSubstr;

struct LiteralCase {
  const char* name;
  std::string input;
  std::string literal;
};

TEST(QuoteStringLiteral, EscapesEverythingOutsidePrintableAscii) {
  static const LiteralCase kCases[] = {
      {"plain", "dev:tap-a-to-target-b", "'dev:tap-a-to-target-b'"},
      {"single quote", "it's", R"('it\'s')"},
      {"backslash", R"(a\b)", R"('a\\b')"},
      {"quote after backslash", R"(\')", R"('\\\'')"},
      {"nul", std::string("a\0b", 3), R"('a\x00b')"},
      {"newline and tab", "a\nb\tc\r", R"('a\x0ab\x09c\x0d')"},
      {"invalid utf-8", "\xff\xfe", R"('\xff\xfe')"},
      {"utf-8 is bytes too", "\xc3\xa9", R"('\xc3\xa9')"},
      {"like wildcards are not special here", "%_*?", "'%_*?'"},
      {"backtick and semicolon", "`; DROP TABLE x; --", "'`; DROP TABLE x; --'"},
      {"double quote", "\"x\"", "'\"x\"'"},
      {"del byte", "\x7f", R"('\x7f')"},
      {"empty", "", "''"},
  };
  for (const LiteralCase& c : kCases) {
    SCOPED_TRACE(c.name);
    EXPECT_EQ(QuoteStringLiteral(c.input), c.literal);
    EXPECT_EQ(EscapeParamValue(c.input), c.literal.substr(1, c.literal.size() - 2));
  }
}

TEST(QuoteStringLiteral, OutputIsPrintableAsciiAndClosesOnce) {
  std::string all;
  for (int i = 0; i < 256; ++i) all.push_back(static_cast<char>(i));
  std::string lit = QuoteStringLiteral(all + all);
  for (char c : lit) {
    EXPECT_GE(static_cast<unsigned char>(c), 0x20);
    EXPECT_LE(static_cast<unsigned char>(c), 0x7E);
  }
  // The only unescaped quotes are the two delimiters.
  int unescaped = 0;
  for (size_t i = 0; i < lit.size(); ++i) {
    if (lit[i] == '\\') {
      ++i;
      continue;
    }
    if (lit[i] == '\'') ++unescaped;
  }
  EXPECT_EQ(unescaped, 2);
}

TEST(QuoteStringLiteral, HundredKilobyteIdStaysOneLiteral) {
  std::string id(100 * 1024, 'x');
  id[500] = '\'';
  std::string lit = QuoteStringLiteral(id);
  EXPECT_EQ(lit.size(), id.size() + 3);
  EXPECT_EQ(lit.front(), '\'');
  EXPECT_EQ(lit.back(), '\'');
}

struct GlobCase {
  const char* name;
  const char* glob;
  const char* like;
};

TEST(GlobToLike, MapsWildcardsAndEscapesLikeSyntax) {
  static const GlobCase kCases[] = {
      {"star", "dev:*", "dev:%"},
      {"question", "a?c", "a_c"},
      {"percent is literal", "100%*", R"(100\%%)"},
      {"underscore is literal", "tap_x*", R"(tap\_x%)"},
      {"backslash is literal", R"(a\b*)", R"(a\\b%)"},
      {"all together", R"(*_%\?)", R"(%\_\%\\_)"},
      {"no wildcards", "exact", "exact"},
      {"empty", "", ""},
  };
  for (const GlobCase& c : kCases) {
    SCOPED_TRACE(c.name);
    EXPECT_EQ(GlobToLike(c.glob), c.like);
  }
}

struct IdentifierCase {
  const char* name;
  std::string input;
  bool ok;
};

TEST(QuoteIdentifier, AcceptsOnlyPlainNames) {
  static const IdentifierCase kCases[] = {
      {"default schema", "meltano", true},
      {"underscore start", "_state_2", true},
      {"max length", std::string(kMaxIdentifierLength, 'a'), true},
      {"too long", std::string(kMaxIdentifierLength + 1, 'a'), false},
      {"empty", "", false},
      {"digit first", "1abc", false},
      {"backtick", "a`b", false},
      {"dot", "a.b", false},
      {"semicolon", "x;drop", false},
      {"space", "a b", false},
      {"dash", "a-b", false},
      {"nul", std::string("a\0b", 3), false},
      {"non-ascii", "\xc3\xa9t\xc3\xa9", false},
  };
  for (const IdentifierCase& c : kCases) {
    SCOPED_TRACE(c.name);
    absl::StatusOr<std::string> q = QuoteIdentifier(c.input, "table");
    if (c.ok) {
      ASSERT_THAT(q, IsOk());
      EXPECT_EQ(*q, "`" + c.input + "`");
    } else {
      EXPECT_THAT(q, StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("table")));
    }
  }
}

TEST(ValidateStateId, BoundsLength) {
  EXPECT_THAT(ValidateStateId(""), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("empty")));
  EXPECT_THAT(ValidateStateId(std::string(kMaxStateIdLength, 'x')), IsOk());
  EXPECT_THAT(ValidateStateId(std::string(kMaxStateIdLength + 1, 'x')),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("limit")));
  EXPECT_THAT(ValidateStateId(std::string("\0", 1)), IsOk());
}

TEST(HexEncode, LowerCase) { EXPECT_EQ(HexEncode(std::string("\x00\xab\xff", 3)), "00abff"); }

}  // namespace
}  // namespace chstate
