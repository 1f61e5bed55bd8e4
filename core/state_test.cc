// Tests for the Meltano state model: merge semantics, JSON parsing errors and
// positions, `state set` / update() rules and the NULL-for-empty column form.
#include "core/state.h"

#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "core/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace chstate {
namespace {

using ::chstate::testing::IsOk;
using ::chstate::testing::StatusIs;
using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;
using json = nlohmann::json;

// Test literals are trusted, but a typo should fail the test, not throw.
json J(const std::string& text) {
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  EXPECT_FALSE(j.is_discarded()) << "bad test literal: " << text;
  return j;
}

std::string Nested(int depth) {
  std::string s;
  for (int i = 0; i < depth - 1; ++i) s += "{\"a\":";
  s += "{}";
  s += std::string(depth - 1, '}');
  return s;
}

// ---------------------------------------------------------------- DeepMerge

TEST(DeepMergeTest, Table) {
  struct Case {
    const char* name;
    const char* base;
    const char* over;
    const char* want;
  };
  static const Case kCases[] = {
      {"disjoint keys", R"({"a":1})", R"({"b":2})", R"({"a":1,"b":2})"},
      {"scalar from over wins", R"({"a":1})", R"({"a":2})", R"({"a":2})"},
      {"nested dicts recurse", R"({"a":{"x":1,"y":{"p":1}},"b":1})", R"({"a":{"y":{"q":2}}})",
       R"({"a":{"x":1,"y":{"p":1,"q":2}},"b":1})"},
      {"list replaced, not concatenated", R"({"a":[1,2,3]})", R"({"a":[4]})", R"({"a":[4]})"},
      {"empty list replaces", R"({"a":[1,2,3]})", R"({"a":[]})", R"({"a":[]})"},
      {"list over dict", R"({"a":{"x":1}})", R"({"a":[1]})", R"({"a":[1]})"},
      {"scalar over dict", R"({"a":{"x":1}})", R"({"a":5})", R"({"a":5})"},
      {"dict over scalar", R"({"a":5})", R"({"a":{"x":1}})", R"({"a":{"x":1}})"},
      {"dict over list", R"({"a":[1]})", R"({"a":{"x":1}})", R"({"a":{"x":1}})"},
      {"null leaf from over wins", R"({"a":{"x":1},"b":2})", R"({"a":null})", R"({"a":null,"b":2})"},
      {"null in base replaced", R"({"a":null})", R"({"a":{"x":1}})", R"({"a":{"x":1}})"},
      {"empty dict over dict keeps base", R"({"a":{"x":1}})", R"({"a":{}})", R"({"a":{"x":1}})"},
      {"empty over", R"({"a":1})", R"({})", R"({"a":1})"},
      {"empty base", R"({})", R"({"a":{"b":[1]}})", R"({"a":{"b":[1]}})"},
      {"both empty", R"({})", R"({})", R"({})"},
      {"non-object over replaces whole", R"({"a":1})", R"([1,2])", R"([1,2])"},
      {"realistic singer_state bookmarks",
       R"({"singer_state":{"currently_syncing":null,"bookmarks":{
            "orders":{"replication_key":"updated_at","replication_key_value":"2024-01-01T00:00:00Z"},
            "users":{"replication_key":"id","replication_key_value":100,
                     "partitions":[{"context":{"org":1},"replication_key_value":5}]}}}})",
       R"({"singer_state":{"currently_syncing":"users","bookmarks":{
            "orders":{"replication_key_value":"2024-02-01T00:00:00Z"},
            "users":{"partitions":[{"context":{"org":2},"replication_key_value":7}]},
            "events":{"replication_key":"ts","replication_key_value":1.5}}}})",
       R"({"singer_state":{"currently_syncing":"users","bookmarks":{
            "orders":{"replication_key":"updated_at","replication_key_value":"2024-02-01T00:00:00Z"},
            "users":{"replication_key":"id","replication_key_value":100,
                     "partitions":[{"context":{"org":2},"replication_key_value":7}]},
            "events":{"replication_key":"ts","replication_key_value":1.5}}}})"},
  };
  for (const Case& c : kCases) {
    SCOPED_TRACE(c.name);
    const json base = J(c.base);
    const json over = J(c.over);
    json base_copy = base;
    json over_copy = over;
    EXPECT_EQ(DeepMerge(base_copy, over_copy), J(c.want));
    EXPECT_EQ(base_copy, base) << "base changed";
    EXPECT_EQ(over_copy, over) << "over changed";
  }
}

// ------------------------------------------------------------- MeltanoState

TEST(MeltanoStateTest, MergedLaysPartialOverCompleted) {
  MeltanoState s{"dev:tap-x-to-target-y", J(R"({"singer_state":{"bookmarks":{"a":{"v":2}}}})"),
                 J(R"({"singer_state":{"bookmarks":{"a":{"v":1,"k":"id"},"b":{"v":9}}}})")};
  EXPECT_EQ(s.Merged(), J(R"({"singer_state":{"bookmarks":{"a":{"v":2,"k":"id"},"b":{"v":9}}}})"));
  EXPECT_TRUE(s.IsComplete());  // a completed side, whatever the partial holds (Meltano 4.4)
}

TEST(MeltanoStateTest, IsCompleteAndDefaults) {
  // Meltano 4.4: is_complete() is bool(completed_state).
  MeltanoState s;
  EXPECT_FALSE(s.IsComplete());
  EXPECT_TRUE(s.partial.is_object());
  EXPECT_TRUE(s.completed.is_object());
  EXPECT_EQ(s.Merged(), json::object());
  s.partial = J(R"({"singer_state":{}})");
  EXPECT_FALSE(s.IsComplete());
  s.completed = J(R"({"singer_state":{}})");
  EXPECT_TRUE(s.IsComplete());
  s.partial = json::object();
  EXPECT_TRUE(s.IsComplete());
}

TEST(MeltanoStateTest, ToJsonShape) {
  struct Case {
    const char* name;
    json partial;
    json completed;
    const char* want;
  };
  const Case kCases[] = {
      {"both empty", json::object(), json::object(), R"({"completed":{},"partial":{}})"},
      {"completed only", json::object(), J(R"({"singer_state":{"x":1}})"),
       R"({"completed":{"singer_state":{"x":1}},"partial":{}})"},
      {"both", J(R"({"singer_state":{"y":2}})"), J(R"({"singer_state":{"x":1}})"),
       R"({"completed":{"singer_state":{"x":1}},"partial":{"singer_state":{"y":2}}})"},
      {"null sides become {}", json(nullptr), json(nullptr), R"({"completed":{},"partial":{}})"},
  };
  for (const Case& c : kCases) {
    SCOPED_TRACE(c.name);
    MeltanoState s{"id", c.partial, c.completed};
    EXPECT_EQ(s.ToJson(), J(c.want));
    EXPECT_EQ(DumpJson(s.ToJson()), DumpJson(J(c.want)));
  }
}

// ----------------------------------------------------------- ParseStateJson

TEST(ParseStateJsonTest, ValidObjects) {
  struct Case {
    const char* name;
    std::string text;
    const char* want;
  };
  const Case kCases[] = {
      {"simple", R"({"singer_state":{"bookmarks":{}}})", R"({"singer_state":{"bookmarks":{}}})"},
      {"empty object", "{}", "{}"},
      {"surrounding whitespace", " \n\t{\"a\": [1, 2.5, \"x\", null, true]}\r\n ",
       R"({"a":[1,2.5,"x",null,true]})"},
      {"utf-8 text and escapes", "{\"name\":\"caf\xC3\xA9 \\u00e9 \\ud83d\\ude00\"}",
       "{\"name\":\"caf\xC3\xA9 \xC3\xA9 \xF0\x9F\x98\x80\"}"},
      {"brackets inside strings do not count as nesting", "{\"a\":\"" + std::string(2000, '[') + "\"}",
       nullptr},
      {"escaped quote inside string", R"({"a":"x\"[[[","b":1})", R"({"a":"x\"[[[","b":1})"},
      {"utf-8 BOM is skipped", "\xEF\xBB\xBF{\"a\":1}", R"({"a":1})"},
      {"nesting at the limit", Nested(512), nullptr},
  };
  for (const Case& c : kCases) {
    SCOPED_TRACE(c.name);
    ASSERT_OK_AND_ASSIGN(json got, ParseStateJson(c.text));
    EXPECT_TRUE(got.is_object());
    if (c.want != nullptr) {
      EXPECT_EQ(got, J(c.want));
    }
  }
}

TEST(ParseStateJsonTest, NonObjectTopLevel) {
  struct Case {
    const char* name;
    const char* text;
    const char* kind;
  };
  static const Case kCases[] = {
      {"array", "[1,2]", "the top level is an array"},
      {"string", "\"singer_state\"", "the top level is a string"},
      {"number", "42", "the top level is a number"},
      {"float", "-0.5e3", "the top level is a number"},
      {"boolean", "true", "the top level is a boolean"},
      {"null", "null", "the top level is null"},
  };
  for (const Case& c : kCases) {
    SCOPED_TRACE(c.name);
    EXPECT_THAT(ParseStateJson(c.text), StatusIs(absl::StatusCode::kInvalidArgument,
                                                 AllOf(HasSubstr("must be a JSON object"), HasSubstr(c.kind))));
  }
}

TEST(ParseStateJsonTest, InvalidJsonReportsPosition) {
  struct Case {
    const char* name;
    std::string text;
    const char* where;   // exact "line L, column C (byte B)"
    const char* detail;  // part of nlohmann's description
  };
  const Case kCases[] = {
      {"missing value", "{\n  \"a\": ,}", "line 2, column 8 (byte 9)", "unexpected ','"},
      {"trailing comma in object", "{\"a\": 1,}", "line 1, column 9 (byte 8)", "unexpected '}'"},
      {"unterminated array", "{\"a\": [1, 2", "line 1, column 12 (byte 11)", "unexpected end of input"},
      {"bad literal", "{\"a\": tru}", "line 1, column 10 (byte 9)", "invalid literal"},
      {"third line", "{\n  \"a\": 1,\n  \"b\": [1 2]\n}", "line 3, column 11 (byte 22)",
       "unexpected number literal"},
      {"single quotes", "{'a': 1}", "line 1, column 2 (byte 1)", "invalid literal"},
      {"unterminated string", "{\"a\": \"abc", "line 1, column 11 (byte 10)", "missing closing quote"},
      {"trailing garbage", "{\"a\":1} x", "line 1, column 9 (byte 8)", "expected end of input"},
      {"second document", "{}{}", "line 1, column 3 (byte 2)", "expected end of input"},
      // nlohmann alone would stop at the NUL and accept the document.
      {"NUL after document", std::string("{\"a\":1}\0", 8), "line 1, column 8 (byte 7)", "NUL byte"},
      {"NUL then garbage", std::string("{\"a\":1}\0garbage", 15), "line 1, column 8 (byte 7)", "NUL byte"},
      {"NUL first", std::string("\0{}", 3), "line 1, column 1 (byte 0)", "NUL byte"},
      {"NUL in string", std::string("{\"a\":\"x\0\"}", 10), "line 1, column 8 (byte 7)", "NUL byte"},
      {"NUL after backslash", std::string("{\"a\":\"\\\0\"}", 10), "line 1, column 8 (byte 7)", "NUL byte"},
      {"control character in string", "{\"a\":\"x\ty\"}", "line 1, column 8 (byte 7)", "control character"},
      {"invalid UTF-8 in string", "{\"a\":\"\xff\"}", "line 1, column 7 (byte 6)", "ill-formed UTF-8 byte"},
      {"invalid UTF-8 in key", "{\"\xC3\x28\":1}", "line 1, column 4 (byte 3)", "ill-formed UTF-8 byte"},
      {"truncated UTF-8 sequence", "{\"a\":\"\xE2\x82\"}", "line 1, column 9 (byte 8)", "ill-formed UTF-8 byte"},
      {"invalid UTF-8 outside string", "{\xff}", "line 1, column 2 (byte 1)", "invalid literal"},
      {"unpaired surrogate", "{\"a\":\"\\ud800\"}", "line 1, column", "surrogate"},
      {"number overflow", "{\"a\":1e400}", "line 1, column", "number overflow"},
  };
  for (const Case& c : kCases) {
    SCOPED_TRACE(c.name);
    absl::StatusOr<json> got = ParseStateJson(c.text);
    EXPECT_THAT(got, StatusIs(absl::StatusCode::kInvalidArgument,
                              AllOf(HasSubstr(absl::StrCat("invalid JSON at ", c.where)), HasSubstr(c.detail),
                                    Not(HasSubstr("json.exception")), Not(HasSubstr("parse error at")))));
    // The message must stay printable ASCII whatever bytes the input held.
    for (char ch : got.status().message()) {
      EXPECT_TRUE(ch >= 0x20 && ch <= 0x7E) << "byte " << static_cast<int>(static_cast<unsigned char>(ch));
    }
  }
}

TEST(ParseStateJsonTest, InvalidUtf8IsEscapedInMessage) {
  EXPECT_THAT(ParseStateJson("{\"a\":\"\xff\"}"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("\\xff")));
}

TEST(ParseStateJsonTest, EmptyInput) {
  for (const char* text : {"", " ", "\n\t\r\n"}) {
    SCOPED_TRACE(absl::StrCat("input of ", std::string(text).size(), " bytes"));
    EXPECT_THAT(ParseStateJson(text),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         AllOf(HasSubstr("invalid JSON"), HasSubstr("empty"), HasSubstr("singer_state"))));
  }
}

TEST(ParseStateJsonTest, DeepNestingIsRejectedBeforeParsing) {
  struct Case {
    const char* name;
    std::string text;
    const char* where;
  };
  const Case kCases[] = {
      {"10000 arrays", std::string(10000, '[') + std::string(10000, ']'), "line 1, column 513 (byte 512)"},
      {"10000 arrays, unclosed", std::string(10000, '['), "line 1, column 513 (byte 512)"},
      {"10000 objects", Nested(10000), "line 1, column 2561 (byte 2560)"},
      {"one past the limit", Nested(513), "line 1, column 2561 (byte 2560)"},
      {"inside an object on line 2", "{\"a\":\n" + std::string(600, '['), "line 2, column 512 (byte 517)"},
  };
  for (const Case& c : kCases) {
    SCOPED_TRACE(c.name);
    EXPECT_THAT(ParseStateJson(c.text),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         AllOf(HasSubstr(absl::StrCat("invalid JSON at ", c.where)),
                               HasSubstr("deeper than 512 levels"))));
  }
}

std::string BigState(int streams) {
  std::string s = "{\"singer_state\":{\"bookmarks\":{";
  for (int i = 0; i < streams; ++i) {
    if (i > 0) s += ",";
    absl::StrAppend(&s, "\"stream_", i,
                    "\":{\"replication_key\":\"updated_at\",\"replication_key_value\":\"2024-01-01T00:00:00Z\","
                    "\"rows\":",
                    i, "}");
  }
  s += "}}}";
  return s;
}

TEST(ParseStateJsonTest, FiveMegabyteDocumentParses) {
  const std::string text = BigState(60000);
  ASSERT_GE(text.size(), 5u * 1024 * 1024);
  ASSERT_OK_AND_ASSIGN(json got, ParseStateJson(text));
  EXPECT_EQ(got["singer_state"]["bookmarks"].size(), 60000u);
  EXPECT_EQ(got["singer_state"]["bookmarks"]["stream_59999"]["rows"], 59999);
}

TEST(ParseStateJsonTest, HugeInvalidDocumentGivesShortMessage) {
  // A bad byte at the end of a 5 MB string: nlohmann quotes the whole token.
  const std::string text = "{\"a\":\"" + std::string(5 * 1024 * 1024, 'x') + "\x01\"}";
  absl::StatusOr<json> got = ParseStateJson(text);
  EXPECT_THAT(got, StatusIs(absl::StatusCode::kInvalidArgument,
                            HasSubstr(absl::StrCat("line 1, column ", 5 * 1024 * 1024 + 7, " (byte ",
                                                   5 * 1024 * 1024 + 6, ")"))));
  EXPECT_LT(got.status().message().size(), 1000u);
}

TEST(ParseStateJsonTest, NumbersKeepTheirKind) {
  ASSERT_OK_AND_ASSIGN(json got,
                       ParseStateJson(R"({"u":18446744073709551615,"i":-9223372036854775808,"f":0.1,"one":1.0})"));
  EXPECT_TRUE(got["u"].is_number_unsigned());
  EXPECT_EQ(got["u"].get<std::uint64_t>(), std::numeric_limits<std::uint64_t>::max());
  EXPECT_TRUE(got["i"].is_number_integer());
  EXPECT_FALSE(got["i"].is_number_unsigned());
  EXPECT_EQ(got["i"].get<std::int64_t>(), std::numeric_limits<std::int64_t>::min());
  EXPECT_TRUE(got["f"].is_number_float());
  EXPECT_EQ(got["f"].get<double>(), 0.1);
  EXPECT_TRUE(got["one"].is_number_float());
}

// ---------------------------------------------------- ParseMeltanoStateJson

TEST(ParseMeltanoStateJsonTest, Valid) {
  struct Case {
    const char* name;
    const char* text;
    const char* completed;
    const char* partial;
  };
  static const Case kCases[] = {
      {"both keys", R"({"completed":{"singer_state":{"a":1}},"partial":{"singer_state":{"b":2}}})",
       R"({"singer_state":{"a":1}})", R"({"singer_state":{"b":2}})"},
      {"completed only", R"({"completed":{"singer_state":{"a":1}}})", R"({"singer_state":{"a":1}})", "{}"},
      {"partial only", R"({"partial":{"singer_state":{"b":2}}})", "{}", R"({"singer_state":{"b":2}})"},
      {"null values", R"({"completed":null,"partial":null})", "{}", "{}"},
      {"empty sides", R"({"completed":{},"partial":{}})", "{}", "{}"},
      {"no keys", "{}", "{}", "{}"},
  };
  for (const Case& c : kCases) {
    SCOPED_TRACE(c.name);
    ASSERT_OK_AND_ASSIGN(MeltanoState s, ParseMeltanoStateJson("dev:tap-a-to-target-b", c.text));
    EXPECT_EQ(s.state_id, "dev:tap-a-to-target-b");
    EXPECT_EQ(s.completed, J(c.completed));
    EXPECT_EQ(s.partial, J(c.partial));
    EXPECT_TRUE(s.completed.is_object());
    EXPECT_TRUE(s.partial.is_object());
  }
}

TEST(ParseMeltanoStateJsonTest, Errors) {
  struct Case {
    const char* name;
    const char* text;
    const char* message;
  };
  static const Case kCases[] = {
      {"unknown key", R"({"completed":{},"singer_state":{}})",
       "unknown top-level key \"singer_state\" in the state; only \"completed\" and \"partial\" are allowed"},
      {"misspelt key", R"({"complete":{}})", "unknown top-level key \"complete\""},
      {"completed is an array", R"({"completed":[]})",
       "\"completed\" must be a JSON object or null, but it is an array"},
      {"partial is a string", R"({"partial":"x"})", "\"partial\" must be a JSON object or null, but it is a string"},
      {"partial is a number", R"({"partial":0})", "\"partial\" must be a JSON object or null, but it is a number"},
      {"top level array", R"([{"completed":{}}])", "must be a JSON object"},
      {"invalid JSON", R"({"completed":{)", "invalid JSON at line 1, column 15 (byte 14)"},
  };
  for (const Case& c : kCases) {
    SCOPED_TRACE(c.name);
    EXPECT_THAT(ParseMeltanoStateJson("id", c.text),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(c.message)));
  }
}

// --------------------------------------------------- CompleteStateFromInput

TEST(CompleteStateFromInputTest, Table) {
  struct Case {
    const char* name;
    const char* text;
    bool require_singer_state;
    const char* error;  // nullptr: success, completed == text
  };
  static const Case kCases[] = {
      {"singer_state present", R"({"singer_state":{"bookmarks":{}}})", true, nullptr},
      {"singer_state missing", R"({"bookmarks":{}})", true, "no top-level \"singer_state\" key"},
      {"singer_state only nested", R"({"x":{"singer_state":{}}})", true, "\"singer_state\""},
      {"empty object", "{}", true, "\"singer_state\""},
      {"missing but not required", R"({"bookmarks":{}})", false, nullptr},
      {"empty object not required", "{}", false, nullptr},
      {"invalid JSON even when not required", "{", false, "invalid JSON at line 1, column 2 (byte 1)"},
      {"non-object even when not required", "[]", false, "must be a JSON object"},
  };
  for (const Case& c : kCases) {
    SCOPED_TRACE(c.name);
    absl::StatusOr<MeltanoState> got = CompleteStateFromInput("dev:x", c.text, c.require_singer_state);
    if (c.error != nullptr) {
      EXPECT_THAT(got, StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(c.error)));
      continue;
    }
    ASSERT_THAT(got, IsOk());
    EXPECT_EQ(got->state_id, "dev:x");
    EXPECT_EQ(got->completed, J(c.text));
    EXPECT_EQ(got->partial, json::object());
    EXPECT_EQ(got->IsComplete(), !J(c.text).empty());
  }
}

// ------------------------------------------------------------- ApplyUpdate

TEST(ApplyUpdateTest, Table) {
  struct Case {
    const char* name;
    bool has_current;
    const char* current_completed;
    const char* current_partial;
    const char* incoming_completed;
    const char* incoming_partial;
    const char* want_completed;
    const char* want_partial;
  };
  static const Case kCases[] = {
      {"no current, partial incoming", false, "{}", "{}", "{}", R"({"singer_state":{"b":1}})", "{}",
       R"({"singer_state":{"b":1}})"},
      {"no current, complete incoming", false, "{}", "{}", R"({"singer_state":{"a":1}})", "{}",
       R"({"singer_state":{"a":1}})", "{}"},
      {"current, partial incoming merges over current partial", true, R"({"singer_state":{"a":1}})",
       R"({"singer_state":{"b":1,"c":1}})", "{}", R"({"singer_state":{"b":2}})", R"({"singer_state":{"a":1}})",
       R"({"singer_state":{"b":2,"c":1}})"},
      {"current without partial, partial incoming", true, R"({"singer_state":{"a":1}})", "{}", "{}",
       R"({"singer_state":{"b":2}})", R"({"singer_state":{"a":1}})", R"({"singer_state":{"b":2}})"},
      // Meltano 4.4: a completed side makes the state complete, partial or not.
      {"both sides incoming replaces", true, R"({"singer_state":{"a":1}})",
       "{}", R"({"singer_state":{"a":99}})", R"({"singer_state":{"b":2}})", R"({"singer_state":{"a":99}})",
       R"({"singer_state":{"b":2}})"},
      // An empty incoming state is not complete: it merges nothing, and the
      // current state stays (it used to be written over with nothing).
      {"empty incoming keeps current", true, R"({"singer_state":{"a":1}})", R"({"singer_state":{"b":1}})", "{}",
       "{}", R"({"singer_state":{"a":1}})", R"({"singer_state":{"b":1}})"},
      {"current, complete incoming replaces", true, R"({"singer_state":{"a":1}})", R"({"singer_state":{"b":1}})",
       R"({"singer_state":{"z":9}})", "{}", R"({"singer_state":{"z":9}})", "{}"},
      {"nested merge of partial bookmarks", true,
       R"({"singer_state":{"bookmarks":{"orders":{"replication_key_value":"2024-01-01"}}}})",
       R"({"singer_state":{"bookmarks":{"orders":{"replication_key_value":"2024-01-05","replication_key":"ts"},
                                         "users":{"replication_key_value":10,"partitions":[1,2]}}}})",
       "{}",
       R"({"singer_state":{"currently_syncing":"users",
                           "bookmarks":{"users":{"replication_key_value":20,"partitions":[3]}}}})",
       R"({"singer_state":{"bookmarks":{"orders":{"replication_key_value":"2024-01-01"}}}})",
       R"({"singer_state":{"currently_syncing":"users",
                           "bookmarks":{"orders":{"replication_key_value":"2024-01-05","replication_key":"ts"},
                                        "users":{"replication_key_value":20,"partitions":[3]}}}})"},
  };
  for (const Case& c : kCases) {
    SCOPED_TRACE(c.name);
    std::optional<MeltanoState> current;
    if (c.has_current) current = MeltanoState{"dev:x", J(c.current_partial), J(c.current_completed)};
    const MeltanoState incoming{"dev:x", J(c.incoming_partial), J(c.incoming_completed)};
    MeltanoState got = ApplyUpdate(current, incoming);
    EXPECT_EQ(got.state_id, "dev:x");
    EXPECT_EQ(got.completed, J(c.want_completed));
    EXPECT_EQ(got.partial, J(c.want_partial));
    if (c.has_current) {
      EXPECT_EQ(current->partial, J(c.current_partial)) << "current changed";
      EXPECT_EQ(current->completed, J(c.current_completed)) << "current changed";
    }
  }
}

// ------------------------------------------------------ ToColumn/FromColumn

TEST(ColumnTest, EmptySideIsNull) {
  EXPECT_EQ(ToColumn(json::object()), std::nullopt);
  EXPECT_EQ(ToColumn(json(nullptr)), std::nullopt);
  EXPECT_EQ(ToColumn(J(R"({"a":1})")), std::optional<std::string>(R"({"a":1})"));
}

TEST(ColumnTest, NullOrEmptyStringReadsAsEmptyObject) {
  struct Case {
    const char* name;
    std::optional<std::string> column;
  };
  const Case kCases[] = {{"NULL", std::nullopt}, {"empty string", std::string()}};
  for (const Case& c : kCases) {
    SCOPED_TRACE(c.name);
    ASSERT_OK_AND_ASSIGN(json got, FromColumn(c.column, "id", "partial_state"));
    EXPECT_TRUE(got.is_object());
    EXPECT_TRUE(got.empty());
  }
}

TEST(ColumnTest, RoundTrip) {
  struct Case {
    const char* name;
    json side;
  };
  const Case kCases[] = {
      {"empty", json::object()},
      {"singer state", J(R"({"singer_state":{"bookmarks":{"s":{"k":"v","l":[1,null,true]}}}})")},
      {"large uint64", json{{"u", std::numeric_limits<std::uint64_t>::max()}}},
      {"negative int64", json{{"i", std::numeric_limits<std::int64_t>::min()}}},
      {"float 0.1", json{{"f", 0.1}}},
      {"float 1.0 stays float", json{{"f", 1.0}}},
      {"zero", json{{"z", 0}}},
      {"unicode", json{{"s", "caf\xC3\xA9 \xF0\x9F\x98\x80 \"quoted\" \\ \n"}}},
  };
  for (const Case& c : kCases) {
    SCOPED_TRACE(c.name);
    std::optional<std::string> column = ToColumn(c.side);
    ASSERT_OK_AND_ASSIGN(json back, FromColumn(column, "id", "completed_state"));
    EXPECT_EQ(back, c.side);
    // operator== compares numbers across kinds; integer-ness must survive
    // too (nlohmann reads every non-negative integer back as unsigned).
    for (auto it = c.side.begin(); it != c.side.end(); ++it) {
      EXPECT_EQ(back[it.key()].is_number_integer(), it->is_number_integer()) << it.key();
      EXPECT_EQ(back[it.key()].is_number_float(), it->is_number_float()) << it.key();
    }
  }
}

TEST(ColumnTest, NumbersAreStoredExactly) {
  json side = {{"u", std::numeric_limits<std::uint64_t>::max()},
               {"i", std::numeric_limits<std::int64_t>::min()},
               {"f", 0.1}};
  std::optional<std::string> column = ToColumn(side);
  ASSERT_TRUE(column.has_value());
  EXPECT_EQ(*column, R"({"f":0.1,"i":-9223372036854775808,"u":18446744073709551615})");
  ASSERT_OK_AND_ASSIGN(json back, FromColumn(column, "id", "completed_state"));
  EXPECT_TRUE(back["u"].is_number_unsigned());
  EXPECT_EQ(back["u"].get<std::uint64_t>(), 18446744073709551615ULL);
  EXPECT_TRUE(back["i"].is_number_integer());
  EXPECT_EQ(back["i"].get<std::int64_t>(), std::numeric_limits<std::int64_t>::min());
  EXPECT_TRUE(back["f"].is_number_float());
  EXPECT_EQ(back["f"].get<double>(), 0.1);
}

TEST(ColumnTest, CorruptStoredTextIsDataLoss) {
  struct Case {
    const char* name;
    std::string stored;
    const char* problem;
  };
  const Case kCases[] = {
      {"not JSON", "not json", "invalid JSON at line 1, column 2 (byte 1)"},
      {"truncated", R"({"singer_state":{)", "invalid JSON at line 1"},
      {"array", "[1,2]", "holds an array, not a JSON object"},
      {"string", "\"x\"", "holds a string, not a JSON object"},
      {"JSON null text", "null", "holds null, not a JSON object"},
      {"invalid UTF-8", "{\"a\":\"\xff\"}", "ill-formed UTF-8"},
      {"too deep", std::string(1000, '['), "deeper than 512"},
  };
  for (const Case& c : kCases) {
    SCOPED_TRACE(c.name);
    EXPECT_THAT(FromColumn(c.stored, "dev:tap-a-to-target-b", "partial_state"),
                StatusIs(absl::StatusCode::kDataLoss,
                         AllOf(HasSubstr("state \"dev:tap-a-to-target-b\""), HasSubstr("column partial_state"),
                               HasSubstr("corrupt"), HasSubstr(c.problem), HasSubstr("meltano state"))));
  }
}

// ------------------------------------------------------------------ DumpJson

TEST(DumpJsonTest, CompactAndIndented) {
  json j = J(R"({"b":[1,2],"a":{"c":"\u00e9"}})");
  EXPECT_EQ(DumpJson(j), "{\"a\":{\"c\":\"\xC3\xA9\"},\"b\":[1,2]}");
  EXPECT_EQ(DumpJson(j, 2), "{\n  \"a\": {\n    \"c\": \"\xC3\xA9\"\n  },\n  \"b\": [\n    1,\n    2\n  ]\n}");
}

TEST(DumpJsonTest, InvalidUtf8IsReplacedNotThrown) {
  // Only reachable for JSON built in code, never for parsed input.
  json j = {{"a", std::string("x\xffy")}};
  EXPECT_EQ(DumpJson(j), "{\"a\":\"x\xEF\xBF\xBDy\"}");
  EXPECT_EQ(ToColumn(j), std::optional<std::string>("{\"a\":\"x\xEF\xBF\xBDy\"}"));
}

// ---- Meltano's export document (`meltano state export` / import) ----

TEST(ExportDocumentTest, ParsesEveryEntryInOrder) {
  absl::StatusOr<std::vector<MeltanoState>> states = ParseExportDocument(
      R"({"dev:a": {"completed": {"singer_state": {"n": 1}}, "partial": {}},
          "dev:b": {"partial": {"p": [1, 2]}, "completed": null},
          "dev:c": {}})");
  ASSERT_THAT(states, IsOk());
  ASSERT_EQ(states->size(), 3u);
  EXPECT_EQ((*states)[0].state_id, "dev:a");
  EXPECT_EQ((*states)[0].completed, J(R"({"singer_state": {"n": 1}})"));
  EXPECT_EQ((*states)[1].partial, J(R"({"p": [1, 2]})"));
  EXPECT_TRUE((*states)[1].completed.empty());
  EXPECT_TRUE((*states)[2].partial.empty() && (*states)[2].completed.empty());
  ASSERT_THAT(ParseExportDocument("{}"), IsOk());
  EXPECT_TRUE(ParseExportDocument("{}")->empty());
}

TEST(ExportDocumentTest, RefusesNamingTheEntry) {
  struct Case {
    const char* text;
    const char* message;
  };
  static const Case kCases[] = {
      {"not json", "the import is not JSON"},
      {"", "the import is not JSON"},
      {"[1, 2]", "must be a JSON object"},
      {R"({"a": {}, "b": 7})", "import entry for state id \"b\""},
      {R"({"a": {"completed": [1]}})", "import entry for state id \"a\""},
      {R"({"a": {"completed": {}, "extra": {}}})", "import entry for state id \"a\""},
      {R"({"": {}})", "import entry for state id \"\""},
  };
  for (const Case& c : kCases) {
    EXPECT_THAT(ParseExportDocument(c.text),
                StatusIs(absl::StatusCode::kInvalidArgument, AllOf(HasSubstr(c.message), HasSubstr("nothing was written"))))
        << c.text;
  }
  // An id past the length limit is named, cut short.
  std::string doc = absl::StrCat("{\"ok\": {}, \"", std::string(200 * 1024, 'x'), "\": {}}");
  absl::Status st = ParseExportDocument(doc).status();
  EXPECT_THAT(st, StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("import entry for state id \"xxx")));
  EXPECT_LT(st.message().size(), 1000u);
}

TEST(ExportDocumentTest, EntryRoundTripsThroughTheDocument) {
  MeltanoState s{"dev:\xC3\xA9\n\"x\"", J(R"({"p": {"q": 1.5}})"), J(R"({"singer_state": {"b": [true, null]}})")};
  absl::StatusOr<std::string> entry = ExportEntryJson(s);
  ASSERT_THAT(entry, IsOk());
  // Byte for byte what dumping the sides as one object writes.
  EXPECT_EQ(*entry, absl::StrCat(DumpJson(json(s.state_id)), ": ",
                                 DumpJson(json{{"completed", s.completed}, {"partial", s.partial}})));
  absl::StatusOr<std::vector<MeltanoState>> back = ParseExportDocument(absl::StrCat("{", *entry, "}"));
  ASSERT_THAT(back, IsOk());
  ASSERT_EQ(back->size(), 1u);
  EXPECT_EQ((*back)[0].state_id, s.state_id);
  EXPECT_EQ((*back)[0].partial, s.partial);
  EXPECT_EQ((*back)[0].completed, s.completed);
}

TEST(ExportDocumentTest, AnIdJsonCannotCarryIsRefusedNotAltered) {
  for (const char* id : {"x\xff", "\xC0\xAF", "\xED\xA0\x80", "\xF4\x90\x80\x80", "ab\xE2\x82"}) {
    EXPECT_THAT(ExportEntryJson({id, json::object(), json::object()}),
                StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("not valid UTF-8")))
        << id;
  }
  for (const char* id : {"\xE2\x82\xAC", "\xF0\x9F\x98\x80", "\x7F", "\xC2\x80"}) {
    EXPECT_THAT(ExportEntryJson({id, json::object(), json::object()}), IsOk()) << id;
  }
}

// What AppendExportEntry must equal: the entry of the state read from the
// columns (FromColumn), as the page's states gave it before.
absl::StatusOr<std::string> EntryOfParsedColumns(const std::string& id, const std::optional<std::string>& partial,
                                                 const std::optional<std::string>& completed) {
  absl::StatusOr<json> p = FromColumn(partial, id, "partial_state");
  absl::StatusOr<json> c = FromColumn(completed, id, "completed_state");
  if (!c.ok()) return c.status();
  if (!p.ok()) return p.status();
  return ExportEntryJson({id, *p, *c});
}

TEST(ExportDocumentTest, AnEntryFromTheColumnsIsTheEntryOfTheStateReadFromThem) {
  const std::vector<std::optional<std::string>> kSides = {
      std::nullopt, "", "{}", R"({"singer_state":{"bookmarks":{"s":{"id":7,"at":"2026-12-01"}}}})",
      // Not as dump() writes it: spaces, keys out of order or repeated, numbers
      // in other forms, escapes dump() does not use.
      R"({ "a" : 1 })", R"({"b":1,"a":2})", R"({"a":1,"a":2})", R"({"B":1,"a":2,"ab":3,"a\u0000":4})",
      R"({"n":[1,2.50,-0,1e2,1.0,-7,18446744073709551615,18446744073709551616,3.14159e-300]})",
      R"({"s":"x\u00e9\n\"\\\/","t":"\u001f","u":"\ud83d\ude00","v":"\u0000"})", "{\"\xC3\xA9\":\"\xF0\x9F\x98\x80\"}",
      R"({"a":[{"z":{},"y":[]},[],[[true,false,null]]]})", Nested(511), Nested(512)};
  for (const std::optional<std::string>& p : kSides) {
    for (const std::optional<std::string>& c : kSides) {
      for (const std::string& id : {std::string("dev:tap-x-to-y"), std::string("dev:\xC3\xA9\n\"x\"\\")}) {
        absl::StatusOr<std::string> want = EntryOfParsedColumns(id, p, c);
        ASSERT_THAT(want, IsOk());
        std::string got = "keep,";
        ASSERT_THAT(AppendExportEntry(id, p, c, &got), IsOk()) << p.value_or("NULL") << " / " << c.value_or("NULL");
        EXPECT_EQ(got, "keep," + *want) << p.value_or("NULL") << " / " << c.value_or("NULL");
      }
    }
  }
}

TEST(ExportDocumentTest, AnEntryFromABadColumnFailsAsReadingItDoesAndAppendsNothing) {
  for (const std::string& bad : {std::string("[1]"), std::string("\"x\""), std::string("7"), std::string("{\"a\":}"),
                                 std::string("{\"a\":1} x"), std::string("  "), std::string("{\"a\":\"\x01\"}"),
                                 std::string("{\"b\":1,\"a\":[}"), std::string("{\"a\":\"x\xff\"}"), Nested(513)}) {
    for (bool partial : {true, false}) {
      const std::optional<std::string> p = partial ? std::optional<std::string>(bad) : std::nullopt;
      const std::optional<std::string> c = partial ? std::optional<std::string>("{\"a\":1}") : bad;
      absl::StatusOr<std::string> want = EntryOfParsedColumns("dev:x", p, c);
      ASSERT_FALSE(want.ok()) << bad;
      std::string got = "keep";
      absl::Status st = AppendExportEntry("dev:x", p, c, &got);
      EXPECT_EQ(st, want.status()) << bad;
      EXPECT_EQ(got, "keep") << bad;
    }
  }
  std::string got = "keep";
  EXPECT_THAT(AppendExportEntry("x\xff", std::nullopt, std::nullopt, &got),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("not valid UTF-8")));
  EXPECT_EQ(got, "keep");
}

// What ParseExportDocumentRows must give: the rows of the states the tree
// reads (ParseExportDocument), or its error.
absl::StatusOr<std::vector<StoredState>> RowsOfParsedDocument(absl::string_view text) {
  absl::StatusOr<std::vector<MeltanoState>> states = ParseExportDocument(text);
  if (!states.ok()) return states.status();
  std::vector<StoredState> rows;
  for (const MeltanoState& st : *states) rows.push_back({st.state_id, ToColumn(st.partial), ToColumn(st.completed)});
  return rows;
}

void ExpectRowsAsTheTreeReadsThem(absl::string_view text) {
  absl::StatusOr<std::vector<StoredState>> want = RowsOfParsedDocument(text);
  absl::StatusOr<std::vector<StoredState>> got = ParseExportDocumentRows(text);
  const std::string shown(text.substr(0, 300));
  if (!want.ok()) {
    EXPECT_EQ(got.status(), want.status()) << shown;
    return;
  }
  ASSERT_THAT(got, IsOk()) << shown;
  ASSERT_EQ(got->size(), want->size()) << shown;
  for (size_t i = 0; i < want->size(); ++i) {
    EXPECT_EQ((*got)[i].state_id, (*want)[i].state_id) << shown;
    EXPECT_EQ((*got)[i].partial_json, (*want)[i].partial_json) << shown;
    EXPECT_EQ((*got)[i].completed_json, (*want)[i].completed_json) << shown;
  }
}

TEST(ExportDocumentRowsTest, EverySideFormReadsAsTheTreeReadsIt) {
  // Sides as dump() writes them, and not: spaces, keys out of order or
  // repeated, numbers and escapes in other forms, null, empty, deep.
  const std::vector<std::string> kSides = {
      "null", "{}", "{ }", R"({"singer_state":{"bookmarks":{"s":{"id":7,"at":"2026-12-01"}}}})",
      R"({ "a" : 1 })", R"({"b":1,"a":2})", R"({"a":1,"a":2})", R"({"a":{"y":1,"x":2},"b":[{"d":1,"c":2}]})",
      R"({"B":1,"a":2,"ab":3,"a\u0000":4})",
      R"({"n":[1,2.50,-0,1e2,1.0,-7,18446744073709551615,18446744073709551616,3.14159e-300]})",
      R"({"s":"x\u00e9\n\"\\\/","t":"\u001f","u":"\ud83d\ude00","v":"\u0000"})", "{\"\xC3\xA9\":\"\xF0\x9F\x98\x80\"}",
      R"({"a":[{"z":{},"y":[]},[],[[true,false,null]]]})", Nested(509), Nested(510),
      // Out of order, so written again in order: every kind of value, and
      // repeated keys at two levels (the last wins).
      R"({"z":[1,2.50,-0,1e2,1.0,-7,18446744073709551615,3.14159e-300,true,false,null,"x\u00e9\n\"\\\/",)"
      R"("\ud83d\ude00",{},[],{"b":{},"a":[[]]}],"a":"\u0000","\u00e9":{"q":1,"p":2}})",
      R"({"a":{"x":1,"x":{"y":2}},"b":0,"a":{"z":3,"y":[{"d":1,"c":2},{"c":3,"c":4}]}})"};
  for (const std::string& p : kSides) {
    for (const std::string& c : kSides) {
      for (const std::string& id : {std::string("dev:tap-x-to-y"), std::string("dev:\\u00e9\\n\\\"x\\\"\\\\")}) {
        ExpectRowsAsTheTreeReadsThem(absl::StrCat("{\"", id, "\": {\"completed\": ", c, ", \"partial\": ", p, "}}"));
        ExpectRowsAsTheTreeReadsThem(absl::StrCat("{\"", id, "\":{\"partial\":", p, ",\"completed\":", c, "}}"));
      }
    }
    ExpectRowsAsTheTreeReadsThem(absl::StrCat("{\"a\": {\"partial\": ", p, "}, \"b\": {}}"));
  }
}

TEST(ExportDocumentRowsTest, DocumentsReadAsTheTreeReadsThem) {
  for (const std::string& text : std::vector<std::string>{
           "{}", " {} ", "\n{\n  \"dev:a\": {\n    \"completed\": {\"singer_state\": {\"n\": 1}},\n    \"partial\": {}\n  }\n}\n",
           // ids out of order, sorted as the tree's map sorts them (bytes)
           R"({"dev:b": {}, "dev:a": {"completed": {"x": 1}}, "dev:\u00e9": {}, "dev:Z": {}})",
           // an id twice: the last one counts
           R"({"dev:a": {"completed": {"x": 1}}, "dev:b": {}, "dev:a": {"completed": {"x": 2}}})",
           // a side twice in an entry: the last one counts, null included
           R"({"dev:a": {"completed": {"x": 1}, "completed": null}})",
           R"({"dev:a": {"completed": null, "completed": {"x": 2}}})",
           R"({"dev:a": {"partial": {"x": 1}, "partial": {"y": 2}, "completed": {}}})",
           // what the tree refuses, with its words
           "", "   ", "not json", "[1, 2]", "7", "null", R"("dev:a")", R"({"a": {}, "b": 7})", R"({"a": null})",
           R"({"a": []})", R"({"a": {"completed": [1]}})", R"({"a": {"completed": 1}})", R"({"a": {"completed": "x"}})",
           R"({"a": {"completed": {}, "extra": {}}})", R"({"": {}})", R"({"a": {}} x)", R"({"a": {}}, {})",
           R"({"a": {"completed": {"x": }}})", "{\"a\": {\"completed\": {\"x\": \"\x01\"}}}",
           "{\"a\": {\"completed\": {\"x\": \"\xff\"}}}", std::string("{\"a\": {}}\0{\"b\": 1}", 19),
           std::string("{\"a\": {\"completed\": {\"x\": \"\0\"}}}", 32),
           absl::StrCat("{\"ok\": {}, \"", std::string(200 * 1024, 'x'), "\": {}}"),
           absl::StrCat("{\"a\": {\"completed\": ", Nested(510), "}}"),
           absl::StrCat("{\"a\": {\"completed\": ", Nested(511), "}}"),
           absl::StrCat("{\"a\": {\"completed\": {\"l\": ", std::string(509, '['), std::string(509, ']'), "}}}"),
           absl::StrCat("{\"a\": {\"completed\": {\"l\": ", std::string(510, '['), std::string(510, ']'), "}}}")}) {
    ExpectRowsAsTheTreeReadsThem(text);
  }
}

TEST(ExportDocumentRowsTest, AnExportedDocumentReadsBackToItsColumns) {
  // What `chstate export` writes, read back: the rows hold the columns the
  // entries were made from (dump()'s text; NULL for an empty side).
  std::string doc = "{\n  ";
  std::vector<StoredState> want;
  for (int i = 0; i < 300; ++i) {
    StoredState row{absl::StrCat("dev:tap-", 1000 + i), std::nullopt,
                    absl::StrCat(R"({"singer_state":{"bookmarks":{"s":{"id":)", i, R"(,"x":[1.5,"\u00e9"]}}}})")};
    if (i % 3 == 0) row.partial_json = absl::StrCat(R"({"p":)", i, "}");
    if (i > 0) doc.append(",\n  ");
    ASSERT_THAT(AppendExportEntry(row.state_id, row.partial_json, row.completed_json, &doc), IsOk());
    row.completed_json = DumpJson(J(*row.completed_json));
    want.push_back(row);
  }
  doc.append("\n}\n");
  absl::StatusOr<std::vector<StoredState>> got = ParseExportDocumentRows(doc);
  ASSERT_THAT(got, IsOk());
  ASSERT_EQ(got->size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ((*got)[i].state_id, want[i].state_id);
    EXPECT_EQ((*got)[i].partial_json, want[i].partial_json);
    EXPECT_EQ((*got)[i].completed_json, want[i].completed_json);
  }
  ExpectRowsAsTheTreeReadsThem(doc);
}

}  // namespace
}  // namespace chstate
