// Meltano's export document, `{"<state id>": {"completed": {...}, "partial":
// {...}}, ...}`, written and read without a tree of the whole: its entries
// written from the stored columns (chstate export, get_all), and the
// document read in one pass into rows (chstate import, set_all). The tree
// readers and the state model are core/state.cc.
#include "core/state.h"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
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
