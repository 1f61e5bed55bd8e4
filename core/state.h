// Meltano's state model: a state id has a "completed" and a "partial" side,
// both JSON objects. Mirrors meltano.core.state_store.base.MeltanoState.
//
//   absl::StatusOr<nlohmann::json> in = chstate::ParseStateJson(text);
//   chstate::MeltanoState s{"dev:tap-x-to-target-y", /*partial=*/{}, /*completed=*/*in};
//   nlohmann::json view = s.Merged();  // partial laid over completed
//
// Empty sides are `{}`, never null. Storage keeps an empty side as SQL NULL
// (what the Python ClickHouse backend writes), so ToColumn/FromColumn convert.
#ifndef CHSTATE_CORE_STATE_H_
#define CHSTATE_CORE_STATE_H_

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include <nlohmann/json.hpp>

namespace chstate {

// How deep a state's JSON may nest. nlohmann's parser is iterative, but
// dump(), DeepMerge and every consumer of the tree recurse; a hostile
// document could exhaust the stack there. Real singer states are a handful
// of levels deep.
inline constexpr int kMaxStateDepth = 512;

struct MeltanoState {
  std::string state_id;
  nlohmann::json partial = nlohmann::json::object();
  nlohmann::json completed = nlohmann::json::object();

  // The merged view Meltano hands to a tap: DeepMerge(completed, partial).
  nlohmann::json Merged() const;
  // Meltano 4.4's `MeltanoState.is_complete()`: the completed side is not
  // empty (whatever the partial side holds). An update with an empty
  // completed side merges its partial over the current state's, so an empty
  // incoming state leaves the current one as it was.
  bool IsComplete() const { return !completed.empty(); }
  // {"completed": {...}, "partial": {...}} (Meltano's JSON form).
  nlohmann::json ToJson() const;
};

// Recursive dict merge: keys of `over` win; where both sides hold an object
// the merge recurses; lists and scalars from `over` replace. Neither input is
// changed.
nlohmann::json DeepMerge(const nlohmann::json& base, const nlohmann::json& over);

// Parses a JSON document that must be an object. Errors (kInvalidArgument):
// invalid JSON, with the byte offset, line and column of the problem
// ("invalid JSON at line 3, column 7 (byte 41): ..."); a non-object top level;
// invalid UTF-8; a NUL byte (nlohmann would stop reading there); nesting
// deeper than 512 (rejected before parsing, so no stack exhaustion); empty
// input. Never throws.
absl::StatusOr<nlohmann::json> ParseStateJson(absl::string_view text);

// Parses Meltano's whole-state form {"completed": {...}, "partial": {...}}
// (either key may be missing or null -> {}). Other top-level keys are an error.
absl::StatusOr<MeltanoState> ParseMeltanoStateJson(std::string state_id, absl::string_view text);

// The same from parsed JSON.
absl::StatusOr<MeltanoState> MeltanoStateFromJson(std::string state_id, nlohmann::json j);

// Meltano's export document (`meltano state export`, `chstate export`):
// {"<state id>": {"completed": {...}, "partial": {...}}, ...}, a side null or
// missing when empty. Every entry is checked (its id, its shape); the first
// bad one is named ("import entry for state id \"x\": ...").
absl::StatusOr<std::vector<MeltanoState>> ParseExportDocument(absl::string_view text);

// A state as its row holds it: each side's column (ToColumn: nullopt, SQL
// NULL, for an empty side; else the compact JSON text).
struct StoredState {
  std::string state_id;
  std::optional<std::string> partial_json;
  std::optional<std::string> completed_json;
};

// The same document read straight into rows, sorted by id: the rows
// ParseExportDocument's states make (the same checks, errors and words),
// read in one pass with no tree of the document. An entry whose side is
// not in dump()'s key order is put in it, and a document this pass cannot
// take as it is (an error, a repeated id) is read by ParseExportDocument.
absl::StatusOr<std::vector<StoredState>> ParseExportDocumentRows(absl::string_view text);

// One entry of that document, `"<state id>": {"completed": {...}, "partial":
// {...}}` (compact), as `chstate export` writes it between the braces.
// kFailedPrecondition when the id is not valid UTF-8: JSON cannot carry it
// unchanged, and an export must never alter an id.
absl::StatusOr<std::string> ExportEntryJson(const MeltanoState& state);
// The same entry made from the stored columns (as FromColumn reads them),
// appended to `out`: the bytes ExportEntryJson writes for the state read from
// them, and its errors (FromColumn's for a bad side, then nothing appended),
// but a side already stored as dump() writes it is copied, not parsed into a
// tree and written again (an export's cost is mostly that).
absl::Status AppendExportEntry(absl::string_view state_id, const std::optional<std::string>& partial_column,
                               const std::optional<std::string>& completed_column, std::string* out);
// AppendExportEntry for many entries, one after another: the scratch its
// parse of each side needs is kept from one entry to the next (an export
// writes millions of entries).
class ExportEntryWriter {
 public:
  ExportEntryWriter();
  ~ExportEntryWriter();
  absl::Status Append(absl::string_view state_id, const std::optional<std::string>& partial_column,
                      const std::optional<std::string>& completed_column, std::string* out);

 private:
  struct Scratch;
  std::unique_ptr<Scratch> scratch_;
};

// What `meltano state set` writes: completed = input, partial = {}.
// With `require_singer_state`, the input must have a top-level
// "singer_state" key (kInvalidArgument naming the key otherwise), as
// `meltano state set` checks; `chstate set --force` skips the check.
absl::StatusOr<MeltanoState> CompleteStateFromInput(std::string state_id, absl::string_view text,
                                                    bool require_singer_state);

// Meltano's StateStoreManager.update(): if `incoming` is not complete and a
// current state exists, the result keeps current.completed and has partial =
// DeepMerge(current.partial, incoming.partial); otherwise it is `incoming`.
MeltanoState ApplyUpdate(const std::optional<MeltanoState>& current, const MeltanoState& incoming);

// Storage form of one side: nullopt (SQL NULL) for an empty object, else the
// compact JSON text. Parsed input is valid UTF-8, so dumping cannot fail.
std::optional<std::string> ToColumn(const nlohmann::json& side);
// Reverse of ToColumn. NULL or "" -> {}. Errors: stored text is not a JSON
// object (kDataLoss, naming the state id and column).
absl::StatusOr<nlohmann::json> FromColumn(const std::optional<std::string>& column,
                                          absl::string_view state_id, absl::string_view column_name);

// A user-supplied name (state id, JSON key) for a one-line error message:
// quoted, control and non-ASCII bytes escaped, cut short when long.
std::string QuoteForMessage(absl::string_view s);

// Serialises JSON for output; never throws: invalid UTF-8 (impossible for
// parsed input) is replaced with U+FFFD.
std::string DumpJson(const nlohmann::json& j, int indent = -1);

}  // namespace chstate

#endif  // CHSTATE_CORE_STATE_H_
