// Meltano's completed/partial state model: parsing user and stored JSON
// without exceptions, the recursive merge Meltano applies, and the
// NULL-for-empty column form shared with the Python ClickHouse backend.
#include "core/state.h"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "core/quoting.h"

namespace chstate {
namespace {

using json = nlohmann::json;

constexpr int kMaxDepth = kMaxStateDepth;

// nlohmann quotes the offending token in its message; that token can be a
// multi-megabyte string, and it can hold invalid UTF-8 that would poison any
// JSON the message is later embedded in.
constexpr std::size_t kMaxDetailBytes = 200;

constexpr char kHex[] = "0123456789abcdef";

// Keeps error text ASCII so it is safe in logs, terminals and JSON output.
std::string SanitizeDetail(absl::string_view detail) {
  std::string out;
  for (unsigned char c : detail) {
    if (out.size() >= kMaxDetailBytes) {
      out.append("...");
      break;
    }
    if (c < 0x20 || c > 0x7E) {
      out.append("\\x");
      out.push_back(kHex[c >> 4]);
      out.push_back(kHex[c & 0xF]);
    } else {
      out.push_back(static_cast<char>(c));
    }
  }
  return out;
}


// nlohmann prefixes every message with "[json.exception.parse_error.101]
// parse error at line 1, column 2: "; that position is replaced by ours
// (which also carries the byte offset), so only the description is kept.
std::string NlohmannDescription(absl::string_view what) {
  if (!what.empty() && what.front() == '[') {
    std::size_t end = what.find("] ");
    if (end != absl::string_view::npos) what.remove_prefix(end + 2);
  }
  if (what.substr(0, 11) == "parse error") {
    std::size_t colon = what.find(": ");
    if (colon != absl::string_view::npos) what.remove_prefix(colon + 2);
  }
  return SanitizeDetail(what);
}

struct Position {
  std::size_t byte = 0;  // 0-based offset into the text
  std::size_t line = 1;
  std::size_t column = 1;  // 1-based, in bytes
};

Position PositionAt(absl::string_view text, std::size_t byte) {
  Position p;
  p.byte = std::min(byte, text.size());
  std::size_t line_start = 0;
  for (std::size_t i = 0; i < p.byte; ++i) {
    if (text[i] == '\n') {
      ++p.line;
      line_start = i + 1;
    }
  }
  p.column = p.byte - line_start + 1;
  return p;
}

absl::Status InvalidJsonAt(absl::string_view text, std::size_t byte, absl::string_view detail) {
  Position p = PositionAt(text, byte);
  return absl::InvalidArgumentError(absl::StrCat("invalid JSON at line ", p.line, ", column ", p.column,
                                                 " (byte ", p.byte, "): ", detail));
}

// A quick pass before parsing, for two things the parser gets wrong or too
// late: nesting deep enough to exhaust the stack in later recursion (the
// parser itself would accept it), and NUL bytes, which nlohmann's lexer takes
// as end of input, silently dropping whatever follows. Brackets inside
// strings don't count; NUL is never valid JSON, inside a string or not.
absl::Status PreScan(absl::string_view text) {
  int depth = 0;
  bool in_string = false;
  for (std::size_t i = 0; i < text.size(); ++i) {
    char c = text[i];
    if (c == '\0') {
      return InvalidJsonAt(text, i,
                           "NUL byte; JSON text never contains one (inside a string write \\u0000), so "
                           "check that the input is text, not binary");
    }
    if (in_string) {
      if (c == '\\') {
        // Skipping the escaped byte must not skip a NUL check.
        if (i + 1 < text.size() && text[i + 1] != '\0') ++i;
      } else if (c == '"') {
        in_string = false;
      }
      continue;
    }
    switch (c) {
      case '"':
        in_string = true;
        break;
      case '[':
      case '{':
        if (++depth > kMaxDepth) {
          return InvalidJsonAt(text, i,
                               absl::StrCat("nesting is deeper than ", kMaxDepth,
                                            " levels; a Meltano state is a few levels deep, so check that "
                                            "this is the intended document"));
        }
        break;
      case ']':
      case '}':
        // Unbalanced closers are the parser's to report; don't let them
        // hide deep nesting that follows.
        if (depth > 0) --depth;
        break;
      default:
        break;
    }
  }
  return absl::OkStatus();
}

// Second pass, only after a failed parse: the non-throwing DOM parse says
// *that* the text is invalid but not where.
class ErrorLocator {
 public:
  bool null() { return true; }
  bool boolean(bool) { return true; }
  bool number_integer(json::number_integer_t) { return true; }
  bool number_unsigned(json::number_unsigned_t) { return true; }
  bool number_float(json::number_float_t, const json::string_t&) { return true; }
  bool string(json::string_t&) { return true; }
  bool binary(json::binary_t&) { return true; }
  bool start_object(std::size_t) { return true; }
  bool key(json::string_t&) { return true; }
  bool end_object() { return true; }
  bool start_array(std::size_t) { return true; }
  bool end_array() { return true; }
  bool parse_error(std::size_t position, const std::string&, const nlohmann::detail::exception& ex) {
    failed_ = true;
    position_ = position;
    detail_ = NlohmannDescription(ex.what());
    return false;
  }

  bool failed() const { return failed_; }
  // nlohmann reports how many bytes it had read, i.e. one past the byte that
  // failed.
  std::size_t offset() const { return position_ == 0 ? 0 : position_ - 1; }
  const std::string& detail() const { return detail_; }

 private:
  bool failed_ = false;
  std::size_t position_ = 0;
  std::string detail_;
};

bool IsBlank(absl::string_view text) {
  return std::all_of(text.begin(), text.end(),
                     [](char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; });
}

// Any JSON value, with a positioned error on failure.
absl::StatusOr<json> ParseAnyJson(absl::string_view text) {
  if (IsBlank(text)) {
    return absl::InvalidArgumentError(
        "invalid JSON: the input is empty; pass a JSON object such as {\"singer_state\": {}}");
  }
  absl::Status scanned = PreScan(text);
  if (!scanned.ok()) return scanned;

  json j = json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
  if (!j.is_discarded()) return j;

  ErrorLocator locator;
  json::sax_parse(text.begin(), text.end(), &locator);
  if (!locator.failed()) {
    // Both passes run the same lexer, so this should be unreachable; still
    // an error rather than a silent success.
    return absl::InvalidArgumentError("invalid JSON: the parser rejected the input without a position");
  }
  return InvalidJsonAt(text, locator.offset(), locator.detail());
}

std::string DescribeType(const json& j) {
  switch (j.type()) {
    case json::value_t::array:
      return "an array";
    case json::value_t::string:
      return "a string";
    case json::value_t::boolean:
      return "a boolean";
    case json::value_t::null:
      return "null";
    case json::value_t::number_integer:
    case json::value_t::number_unsigned:
    case json::value_t::number_float:
      return "a number";
    default:
      return j.type_name();
  }
}

// Mutating form of DeepMerge so nested objects are not copied once per level.
void MergeInto(json& target, const json& over) {
  for (auto it = over.begin(); it != over.end(); ++it) {
    auto existing = target.find(it.key());
    if (existing != target.end() && existing->is_object() && it->is_object()) {
      MergeInto(*existing, *it);
    } else {
      target[it.key()] = *it;
    }
  }
}

json EmptyIfNull(const json& side) { return side.is_null() ? json::object() : side; }

}  // namespace

std::string QuoteForMessage(absl::string_view s) { return absl::StrCat("\"", SanitizeDetail(s), "\""); }

json MeltanoState::Merged() const { return DeepMerge(completed, partial); }

json MeltanoState::ToJson() const {
  return json{{"completed", EmptyIfNull(completed)}, {"partial", EmptyIfNull(partial)}};
}

json DeepMerge(const json& base, const json& over) {
  if (!base.is_object() || !over.is_object()) return over;
  json result = base;
  MergeInto(result, over);
  return result;
}

absl::StatusOr<json> ParseStateJson(absl::string_view text) {
  absl::StatusOr<json> j = ParseAnyJson(text);
  if (!j.ok()) return j.status();
  if (!j->is_object()) {
    return absl::InvalidArgumentError(absl::StrCat("the state must be a JSON object such as {\"singer_state\": {...}}, "
                                                   "but the top level is ",
                                                   DescribeType(*j)));
  }
  return j;
}

absl::StatusOr<MeltanoState> MeltanoStateFromJson(std::string state_id, json j) {
  if (!j.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the state must be a JSON object {\"completed\": {...}, \"partial\": {...}}, but it is ", DescribeType(j)));
  }
  MeltanoState state;
  state.state_id = std::move(state_id);
  for (auto it = j.begin(); it != j.end(); ++it) {
    json* side = nullptr;
    if (it.key() == "completed") {
      side = &state.completed;
    } else if (it.key() == "partial") {
      side = &state.partial;
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat("unknown top-level key ", QuoteForMessage(it.key()),
                       " in the state; only \"completed\" and \"partial\" are allowed"));
    }
    // null is how an empty side looks after a trip through a NULL column.
    if (it->is_null()) continue;
    if (!it->is_object()) {
      return absl::InvalidArgumentError(absl::StrCat("\"", it.key(), "\" must be a JSON object or null, but it is ",
                                                     DescribeType(*it)));
    }
    *side = std::move(*it);
  }
  return state;
}

absl::StatusOr<MeltanoState> ParseMeltanoStateJson(std::string state_id, absl::string_view text) {
  absl::StatusOr<json> j = ParseStateJson(text);
  if (!j.ok()) return j.status();
  return MeltanoStateFromJson(std::move(state_id), *std::move(j));
}

absl::StatusOr<std::vector<MeltanoState>> ParseExportDocument(absl::string_view text) {
  absl::StatusOr<json> doc = ParseAnyJson(text);
  if (!doc.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("the import is not JSON: ", doc.status().message(),
                                                   "; nothing was written"));
  }
  if (!doc->is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the import must be a JSON object {\"<state id>\": {\"completed\": {...}, \"partial\": {...}}, ...} "
        "as `meltano state export` and `chstate export` write it, but it is ",
        DescribeType(*doc), "; nothing was written"));
  }
  std::vector<MeltanoState> states;
  states.reserve(doc->size());
  for (auto it = doc->begin(); it != doc->end(); ++it) {
    // Named by its id: the parsed object no longer knows the file's order.
    std::string where = absl::StrCat("import entry for state id ", QuoteForMessage(it.key()), ": ");
    if (absl::Status st = ValidateStateId(it.key()); !st.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(where, st.message(), "; nothing was written"));
    }
    absl::StatusOr<MeltanoState> state = MeltanoStateFromJson(it.key(), std::move(it.value()));
    if (!state.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(where, state.status().message(), "; nothing was written"));
    }
    states.push_back(*std::move(state));
  }
  return states;
}

absl::StatusOr<MeltanoState> CompleteStateFromInput(std::string state_id, absl::string_view text,
                                                    bool require_singer_state) {
  absl::StatusOr<json> j = ParseStateJson(text);
  if (!j.ok()) return j.status();
  if (require_singer_state && !j->contains("singer_state")) {
    return absl::InvalidArgumentError(
        "the state has no top-level \"singer_state\" key; wrap it as {\"singer_state\": {...}}, "
        "or set it with --force if the tap really expects another shape");
  }
  MeltanoState state;
  state.state_id = std::move(state_id);
  state.completed = *std::move(j);
  return state;
}

MeltanoState ApplyUpdate(const std::optional<MeltanoState>& current, const MeltanoState& incoming) {
  if (!current.has_value() || incoming.IsComplete()) return incoming;
  MeltanoState result;
  result.state_id = incoming.state_id;
  result.completed = current->completed;
  result.partial = DeepMerge(EmptyIfNull(current->partial), incoming.partial);
  return result;
}

std::optional<std::string> ToColumn(const json& side) {
  // empty() is also true for null, which is the same "nothing stored".
  if (side.empty()) return std::nullopt;
  return DumpJson(side);
}

absl::StatusOr<json> FromColumn(const std::optional<std::string>& column, absl::string_view state_id,
                                absl::string_view column_name) {
  if (!column.has_value() || column->empty()) return json::object();
  absl::StatusOr<json> j = ParseAnyJson(*column);
  std::string problem;
  if (!j.ok()) {
    problem = std::string(j.status().message());
  } else if (!j->is_object()) {
    problem = absl::StrCat("holds ", DescribeType(*j), ", not a JSON object");
  } else {
    return j;
  }
  return absl::DataLossError(absl::StrCat("the row for state ", QuoteForMessage(state_id), " is corrupt: column ",
                                          column_name, ": ", problem,
                                          "; overwrite it with `meltano state set --force` or remove it with "
                                          "`meltano state clear`"));
}

std::string DumpJson(const json& j, int indent) {
  return j.dump(indent, ' ', /*ensure_ascii=*/false, json::error_handler_t::replace);
}

}  // namespace chstate
