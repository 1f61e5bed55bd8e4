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

// nlohmann's parser is iterative, but dump(), DeepMerge and every consumer of
// the tree recurse; a hostile document could exhaust the stack there. Real
// singer states are a handful of levels deep.
constexpr int kMaxDepth = 512;

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

namespace {

// Well-formed UTF-8 (RFC 3629: no overlongs, no surrogates, at most U+10FFFF).
bool IsUtf8(absl::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    size_t n = 0;
    uint32_t cp = 0;
    if (c < 0x80) {
      ++i;
      continue;
    } else if ((c & 0xE0) == 0xC0) {
      n = 1, cp = c & 0x1F;
    } else if ((c & 0xF0) == 0xE0) {
      n = 2, cp = c & 0x0F;
    } else if ((c & 0xF8) == 0xF0) {
      n = 3, cp = c & 0x07;
    } else {
      return false;
    }
    if (i + n >= s.size()) return false;  // cut short
    for (size_t k = 1; k <= n; ++k) {
      const unsigned char cc = static_cast<unsigned char>(s[i + k]);
      if ((cc & 0xC0) != 0x80) return false;
      cp = (cp << 6) | (cc & 0x3F);
    }
    static constexpr uint32_t kMin[] = {0, 0x80, 0x800, 0x10000};
    if (cp < kMin[n] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return false;
    i += n + 1;
  }
  return true;
}

}  // namespace

namespace {

absl::Status ExportableId(absl::string_view state_id) {
  if (IsUtf8(state_id)) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      "state id ", QuoteForMessage(state_id),
      " is not valid UTF-8, so Meltano's JSON export cannot carry it unchanged; copy it to a UTF-8 id "
      "(chstate copy) or leave it out with --pattern"));
}

// A JSON string as dump() writes it (ensure_ascii off): most need no escape.
void AppendJsonString(absl::string_view s, std::string* out) {
  const bool plain = std::all_of(s.begin(), s.end(), [](char c) {
    return static_cast<unsigned char>(c) >= 0x20 && c != '"' && c != '\\';
  });
  if (!plain) {
    out->append(DumpJson(json(std::string(s))));
    return;
  }
  out->push_back('"');
  out->append(s.data(), s.size());
  out->push_back('"');
}

// Writes a stored side as dump() would write the object parsed from it,
// without building that object, while the text allows it: valid JSON whose
// top level is an object, every object's keys in increasing byte order (the
// order of the parsed object's std::map, so no key repeats), nesting within
// kMaxDepth. Anything else stops it (a handler returns false) and the caller
// takes the parsing path, which also words the errors.
//
// With `unsorted` given, keys out of that order do not stop it: they are
// written in the order read and *unsorted is set (the caller then parses the
// text written, which is valid JSON, and writes it again with dump()).
class CanonicalWriter {
 public:
  explicit CanonicalWriter(std::string* out = nullptr, bool* unsorted = nullptr) : out_(out), unsorted_(unsorted) {}
  // Writes the next side to `out`; the levels' storage (their last keys'
  // buffers) is kept from the sides before, as an export writes millions.
  void Reset(std::string* out, bool* unsorted = nullptr) {
    out_ = out;
    unsorted_ = unsorted;
    depth_ = 0;
    started_ = false;
  }

  bool null() { return Scalar("null"); }
  bool boolean(bool b) { return Scalar(b ? "true" : "false"); }
  bool number_integer(json::number_integer_t v) {
    if (!Element()) return false;
    absl::StrAppend(out_, v);
    return true;
  }
  bool number_unsigned(json::number_unsigned_t v) {
    if (!Element()) return false;
    absl::StrAppend(out_, v);
    return true;
  }
  bool number_float(json::number_float_t v, const std::string& /*raw*/) {
    return Scalar(DumpJson(json(v)));  // dump()'s own form of the double
  }
  bool string(std::string& s) {
    if (!Element()) return false;
    AppendJsonString(s, out_);
    return true;
  }
  bool binary(json::binary_t& /*b*/) { return false; }
  bool start_object(std::size_t /*n*/) { return Open('{', true); }
  bool key(std::string& k) {
    Level& l = levels_[depth_ - 1];
    if (!l.first) {
      if (!(l.last_key < k)) {
        if (unsorted_ == nullptr) return false;
        *unsorted_ = true;
      }
      out_->push_back(',');
    }
    l.first = false;
    l.last_key.assign(k);
    AppendJsonString(k, out_);
    out_->push_back(':');
    return true;
  }
  bool end_object() { return Close('}'); }
  bool start_array(std::size_t /*n*/) { return Open('[', false); }
  bool end_array() { return Close(']'); }
  bool parse_error(std::size_t /*at*/, const std::string& /*token*/, const nlohmann::detail::exception& /*e*/) {
    return false;
  }

 private:
  struct Level {
    bool object = true;
    bool first = true;
    std::string last_key;
  };
  // A value's place: after its key in an object, after a comma in an array;
  // never at the top level (only an object is written there).
  bool Element() {
    if (depth_ == 0) return false;
    Level& l = levels_[depth_ - 1];
    if (!l.object) {
      if (!l.first) out_->push_back(',');
      l.first = false;
    }
    return true;
  }
  bool Scalar(absl::string_view text) {
    if (!Element()) return false;
    out_->append(text.data(), text.size());
    return true;
  }
  bool Open(char c, bool object) {
    if (depth_ == 0) {
      if (started_ || !object) return false;
      started_ = true;
    } else if (!Element()) {
      return false;
    }
    if (depth_ >= static_cast<std::size_t>(kMaxDepth)) return false;
    if (depth_ == levels_.size()) levels_.emplace_back();
    Level& l = levels_[depth_++];
    l.object = object;
    l.first = true;
    l.last_key.clear();
    out_->push_back(c);
    return true;
  }
  bool Close(char c) {
    --depth_;
    out_->push_back(c);
    return true;
  }

  std::string* out_;
  bool* unsorted_;
  std::vector<Level> levels_;  // [0, depth_) open; the rest kept for their buffers
  std::size_t depth_ = 0;
  bool started_ = false;
};

// Reads Meltano's export document into rows as nlohmann's SAX parser hands
// over its tokens: level 1 is the document's object (its keys are state
// ids), level 2 an entry (its keys the sides), level 3 and deeper a side,
// written by a CanonicalWriter into the side's column text. It stops (a
// handler returns false) at anything ParseExportDocument would refuse or
// word: a bad id, an entry that is not an object, a key other than
// "completed" and "partial" or one of them twice, a side that is neither
// an object nor null, nesting past kMaxDepth, and invalid JSON.
class ExportDocumentReader {
 public:
  explicit ExportDocumentReader(std::vector<StoredState>* rows) : rows_(rows) {}

  bool null() {
    if (level_ == 2) {  // an empty side, as the column's NULL
      if (!SideKnown()) return false;
      side_ = nullptr;
      return true;
    }
    return level_ >= 3 && writer_.null();
  }
  bool boolean(bool b) { return level_ >= 3 && writer_.boolean(b); }
  bool number_integer(json::number_integer_t v) { return level_ >= 3 && writer_.number_integer(v); }
  bool number_unsigned(json::number_unsigned_t v) { return level_ >= 3 && writer_.number_unsigned(v); }
  bool number_float(json::number_float_t v, const std::string& raw) {
    return level_ >= 3 && writer_.number_float(v, raw);
  }
  bool string(std::string& v) { return level_ >= 3 && writer_.string(v); }
  bool binary(json::binary_t& /*b*/) { return false; }
  bool start_object(std::size_t n) {
    if (level_ >= kMaxDepth) return false;  // the tree parser's limit, counted from the document's top
    switch (level_++) {
      case 0:
        return true;
      case 1:
        entry_ = StoredState{std::move(id_), std::nullopt, std::nullopt};
        seen_completed_ = seen_partial_ = false;
        return true;
      case 2:
        if (!SideKnown()) return false;
        text_.clear();
        unsorted_ = false;
        writer_.Reset(&text_, &unsorted_);
        return writer_.start_object(n);
      default:
        return writer_.start_object(n);
    }
  }
  bool end_object() {
    switch (--level_) {
      case 0:
        return true;
      case 1:
        if (!rows_->empty() && !(rows_->back().state_id < entry_.state_id)) sorted_ = false;
        rows_->push_back(std::move(entry_));
        return true;
      case 2:
        return writer_.end_object() && EndSide();
      default:
        return writer_.end_object();
    }
  }
  bool start_array(std::size_t n) {
    if (level_ < 3 || level_ >= kMaxDepth) return false;
    ++level_;
    return writer_.start_array(n);
  }
  bool end_array() {
    --level_;
    return writer_.end_array();
  }
  bool key(std::string& k) {
    switch (level_) {
      case 1:
        if (!ValidateStateId(k).ok()) return false;
        id_ = std::move(k);
        return true;
      case 2: {
        bool& seen = k == "completed" ? seen_completed_ : seen_partial_;
        if ((k != "completed" && k != "partial") || seen) return false;
        seen = true;
        side_ = k == "completed" ? &entry_.completed_json : &entry_.partial_json;
        return true;
      }
      default:
        return writer_.key(k);
    }
  }
  bool parse_error(std::size_t /*at*/, const std::string& /*token*/, const nlohmann::detail::exception& /*e*/) {
    return false;
  }

  // The rows came in increasing id order (no id twice).
  bool sorted() const { return sorted_; }

 private:
  // A side's value is about to be read (null, or its object).
  bool SideKnown() { return side_ != nullptr; }
  bool EndSide() {
    if (unsorted_) {
      // Its keys out of dump()'s order (or one twice: the last one counts,
      // as in the parsed tree): the text written is valid JSON, read again.
      json side = json::parse(text_, nullptr, /*allow_exceptions=*/false);
      if (side.is_discarded()) return false;
      text_ = DumpJson(side);
    }
    if (text_ != "{}") *side_ = text_;
    side_ = nullptr;
    return true;
  }

  std::vector<StoredState>* rows_;
  int level_ = 0;
  std::string id_;
  StoredState entry_;
  bool seen_completed_ = false;
  bool seen_partial_ = false;
  std::optional<std::string>* side_ = nullptr;
  std::string text_;
  bool unsorted_ = false;
  CanonicalWriter writer_;  // the side being read (level 3 and deeper)
  bool sorted_ = true;
};

// One side of an export entry: DumpJson(FromColumn(column)), the stored text
// copied when it is already in that form.
absl::Status AppendSide(const std::optional<std::string>& column, absl::string_view state_id,
                        absl::string_view column_name, CanonicalWriter& writer, std::string* out) {
  if (!column.has_value() || column->empty()) {
    out->append("{}");
    return absl::OkStatus();
  }
  const std::size_t mark = out->size();
  writer.Reset(out);
  if (json::sax_parse(column->begin(), column->end(), &writer)) return absl::OkStatus();
  out->resize(mark);
  absl::StatusOr<json> side = FromColumn(column, state_id, column_name);
  if (!side.ok()) return side.status();
  out->append(DumpJson(*side));
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::string> ExportEntryJson(const MeltanoState& state) {
  if (absl::Status st = ExportableId(state.state_id); !st.ok()) return st;
  // {"completed": ..., "partial": ...} as dump() writes that object, without
  // copying both sides into one (an export writes millions of these).
  std::string entry;
  AppendJsonString(state.state_id, &entry);
  absl::StrAppend(&entry, ": {\"completed\":", DumpJson(state.completed), ",\"partial\":", DumpJson(state.partial),
                  "}");
  return entry;
}

struct ExportEntryWriter::Scratch {
  CanonicalWriter side;
};

ExportEntryWriter::ExportEntryWriter() : scratch_(std::make_unique<Scratch>()) {}
ExportEntryWriter::~ExportEntryWriter() = default;

absl::Status AppendExportEntry(absl::string_view state_id, const std::optional<std::string>& partial_column,
                               const std::optional<std::string>& completed_column, std::string* out) {
  return ExportEntryWriter().Append(state_id, partial_column, completed_column, out);
}

absl::Status ExportEntryWriter::Append(absl::string_view state_id, const std::optional<std::string>& partial_column,
                                       const std::optional<std::string>& completed_column, std::string* out) {
  if (absl::Status st = ExportableId(state_id); !st.ok()) return st;
  const std::size_t mark = out->size();
  AppendJsonString(state_id, out);
  out->append(": {\"completed\":");
  absl::Status st = AppendSide(completed_column, state_id, "completed_state", scratch_->side, out);
  if (st.ok()) {
    out->append(",\"partial\":");
    st = AppendSide(partial_column, state_id, "partial_state", scratch_->side, out);
  }
  if (!st.ok()) {
    out->resize(mark);
    return st;
  }
  out->push_back('}');
  return absl::OkStatus();
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

absl::StatusOr<std::vector<StoredState>> ParseExportDocumentRows(absl::string_view text) {
  std::vector<StoredState> rows;
  // A NUL byte ends nlohmann's input early (PreScan), so such a text goes
  // the tree's way, which refuses it.
  if (text.find('\0') == absl::string_view::npos) {
    ExportDocumentReader reader(&rows);
    if (json::sax_parse(text.begin(), text.end(), &reader)) {
      if (reader.sorted()) return rows;
      std::sort(rows.begin(), rows.end(),
                [](const StoredState& a, const StoredState& b) { return a.state_id < b.state_id; });
      const bool repeated = std::adjacent_find(rows.begin(), rows.end(), [](const StoredState& a, const StoredState& b) {
                              return a.state_id == b.state_id;
                            }) != rows.end();
      if (!repeated) return rows;  // an id twice: the tree keeps the last of them
    }
  }
  // Anything the one pass does not take as it is goes the tree's way, which
  // also words the errors.
  rows.clear();
  rows.shrink_to_fit();
  absl::StatusOr<std::vector<MeltanoState>> states = ParseExportDocument(text);
  if (!states.ok()) return states.status();
  rows.reserve(states->size());
  for (MeltanoState& st : *states) {
    rows.push_back(StoredState{std::move(st.state_id), ToColumn(st.partial), ToColumn(st.completed)});
  }
  return rows;
}

}  // namespace chstate
