// The verb table and verb documents -> store tasks (core/verbs.h).
#include "core/verbs.h"

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/defaults.h"
#include "core/quoting.h"
#include "core/state.h"

namespace chstate {

using json = nlohmann::json;

namespace {

// A state from a verb's arguments, held to the rules of a state read back
// (ParseMeltanoStateJson: nesting depth, the two sides): a state the store
// could write but never read again is refused before anything is sent.
absl::StatusOr<MeltanoState> StateFromArguments(std::string state_id, const json& sides) {
  return ParseMeltanoStateJson(std::move(state_id), sides.dump(-1, ' ', false, json::error_handler_t::replace));
}

VerbArg Id(const char* name, const char* meaning) { return {name, ArgType::kStateId, true, meaning, true}; }
// An argument bindings take by name.
VerbArg Named(const char* name, ArgType type, const char* meaning) { return {name, type, false, meaning, false}; }


// The member an argument travels in.
std::string Field(const VerbArg& arg) {
  if (arg.type == ArgType::kStateId) return absl::StrCat(arg.name, "_hex");
  return arg.name;
}

int HexDigit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

absl::StatusOr<std::string> FromHex(absl::string_view hex, absl::string_view field) {
  if (hex.size() % 2 != 0) {
    return absl::InvalidArgumentError(absl::StrCat("\"", field, "\" has an odd number of hex digits"));
  }
  std::string out;
  out.reserve(hex.size() / 2);
  for (size_t i = 0; i < hex.size(); i += 2) {
    const int hi = HexDigit(hex[i]);
    const int lo = HexDigit(hex[i + 1]);
    if (hi < 0 || lo < 0) {
      return absl::InvalidArgumentError(absl::StrCat("\"", field, "\" is not hex (offset ", i, ")"));
    }
    out.push_back(static_cast<char>(hi * 16 + lo));
  }
  return out;
}

}  // namespace

// The arguments of one verb document, read by the verb's row.
class VerbArgs {
 public:
  VerbArgs(const VerbSpec& verb, const json& doc) : verb_(verb), doc_(doc) {}


  // Every member is an argument of the verb (or "op"/"merged", which the
  // protocol reads), and every required one is there.
  absl::Status Check() const {
    for (const auto& [key, value] : doc_.items()) {
      if (key == "op" || key == "merged" || key == "now_ms" || key == "random_hex") continue;
      bool known = false;
      for (const VerbArg& a : verb_.args) {
        known = known || key == Field(a) || (a.type == ArgType::kPattern && key == "pattern_hex");
      }
      if (!known) {
        std::vector<std::string> fields;
        for (const VerbArg& a : verb_.args) fields.push_back(Field(a));
        return absl::InvalidArgumentError(absl::StrCat(
            verb_.name, " takes no argument \"", key.substr(0, 100), "\"",
            fields.empty() ? std::string("; it takes none")
                           : absl::StrCat("; its arguments are ", absl::StrJoin(fields, ", "))));
      }
    }
    for (const VerbArg& a : verb_.args) {
      if (a.required && (!doc_.contains(Field(a)) || doc_[Field(a)].is_null())) {
        return absl::InvalidArgumentError(
            absl::StrCat(verb_.name, " needs ", a.name, " (", a.meaning, ")", Shape(a)));
      }
    }
    return absl::OkStatus();
  }

  bool Has(const char* name) const {
    const VerbArg* a = Find(name);
    if (a == nullptr) return false;
    if (auto it = doc_.find(Field(*a)); it != doc_.end() && !it->is_null()) return true;
    return a->type == ArgType::kPattern && doc_.contains("pattern_hex") && !doc_["pattern_hex"].is_null();
  }

  absl::StatusOr<std::string> Id(const char* name) const {
    const VerbArg& a = *Find(name);
    const json& v = doc_.at(Field(a));
    if (!v.is_string()) return Wrong(a);
    absl::StatusOr<std::string> id = FromHex(v.get<std::string>(), Field(a));
    if (!id.ok()) return id.status();
    if (absl::Status st = ValidateStateId(*id); !st.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(a.name, ": ", st.message()));
    }
    return id;
  }

  absl::StatusOr<std::optional<std::string>> OptionalId(const char* name) const {
    if (!Has(name)) return std::optional<std::string>();
    absl::StatusOr<std::string> id = Id(name);
    if (!id.ok()) return id.status();
    return std::optional<std::string>(*std::move(id));
  }

  absl::StatusOr<std::optional<std::string>> Pattern() const {
    if (auto it = doc_.find("pattern_hex"); it != doc_.end() && !it->is_null()) {
      if (!it->is_string()) return Wrong(*Find("pattern"));
      absl::StatusOr<std::string> p = FromHex(it->get<std::string>(), "pattern_hex");
      if (!p.ok()) return p.status();
      return std::optional<std::string>(*std::move(p));
    }
    if (auto it = doc_.find("pattern"); it != doc_.end() && !it->is_null()) {
      if (!it->is_string()) return Wrong(*Find("pattern"));
      return std::optional<std::string>(it->get<std::string>());
    }
    return std::optional<std::string>();
  }

  absl::StatusOr<json> Object(const char* name) const {
    if (!Has(name)) return json::object();
    const VerbArg& a = *Find(name);
    const json& v = doc_.at(Field(a));
    if (!v.is_object()) return Wrong(a);
    return v;
  }

  absl::StatusOr<std::string> Text(const char* name) const {
    absl::StatusOr<absl::string_view> v = TextView(name);
    if (!v.ok()) return v.status();
    return std::string(*v);
  }
  // The same without a copy (an import document is megabytes); valid while
  // the verb document is.
  absl::StatusOr<absl::string_view> TextView(const char* name) const {
    const VerbArg& a = *Find(name);
    const json& v = doc_.at(Field(a));
    if (!v.is_string()) return Wrong(a);
    return absl::string_view(v.get_ref<const std::string&>());
  }

  absl::StatusOr<int64_t> Count(const char* name, int64_t fallback) const {
    if (!Has(name)) return fallback;
    const VerbArg& a = *Find(name);
    const json& v = doc_.at(Field(a));
    if (!v.is_number_integer() || v.get<int64_t>() < 1) return Wrong(a);
    return v.get<int64_t>();
  }

  absl::StatusOr<bool> Flag(const char* name) const {
    if (!Has(name)) return false;
    const VerbArg& a = *Find(name);
    const json& v = doc_.at(Field(a));
    if (!v.is_boolean()) return Wrong(a);
    return v.get<bool>();
  }

  const json& Raw(const char* name) const { return doc_.at(Field(*Find(name))); }

 private:
  const VerbArg* Find(const char* name) const {
    for (const VerbArg& a : verb_.args) {
      if (std::string(a.name) == name) return &a;
    }
    return nullptr;
  }

  static std::string Shape(const VerbArg& a) {
    switch (a.type) {
      case ArgType::kStateId: return absl::StrCat(": give it as \"", Field(a), "\", the id's bytes in hex");
      case ArgType::kPattern: return ": a string";
      case ArgType::kObject: return ": a JSON object";
      case ArgType::kStates: return ": a list of {\"state_id_hex\", \"completed\", \"partial\"}";
      case ArgType::kText: return ": a string";
      case ArgType::kCount: return ": a positive whole number";
      case ArgType::kFlag: return ": true or false";
    }
    return "";
  }

  absl::Status Wrong(const VerbArg& a) const {
    return absl::InvalidArgumentError(absl::StrCat(verb_.name, ": ", a.name, " must be", Shape(a).substr(1)));
  }

  const VerbSpec& verb_;
  const json& doc_;
};

namespace {

// Meltano's check of state input (meltano state set, merge): a top-level
// "singer_state" key, unless forced.
absl::Status CheckSingerState(const char* verb, const json& state, bool force, const char* what) {
  if (force || state.contains("singer_state")) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      verb, ": the ", what, " has no top-level \"singer_state\" key, which Meltano's states have; nothing was "
      "written. Wrap it as {\"singer_state\": ...}, or pass force to write it as it is"));
}

absl::StatusOr<std::vector<MeltanoState>> ImportStates(const json& entries) {
  if (!entries.is_array()) {
    return absl::InvalidArgumentError(
        "import: states must be a list of {\"state_id_hex\": ..., \"completed\": {...}, \"partial\": {...}}");
  }
  std::vector<MeltanoState> states;
  states.reserve(entries.size());
  for (size_t i = 0; i < entries.size(); ++i) {
    const json& entry = entries[i];
    std::string where = absl::StrCat("import entry ", i + 1);
    auto named = [&where](const absl::Status& st) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": ", st.message(), "; nothing was written"));
    };
    if (!entry.is_object()) return named(absl::InvalidArgumentError("an entry must be a JSON object"));
    auto hex = entry.find("state_id_hex");
    if (hex == entry.end() || !hex->is_string()) {
      return named(absl::InvalidArgumentError("missing string field \"state_id_hex\""));
    }
    absl::StatusOr<std::string> sid = FromHex(hex->get<std::string>(), "state_id_hex");
    if (!sid.ok()) return named(sid.status());
    absl::StrAppend(&where, " (state id ", QuoteForMessage(*sid), ")");
    json sides = json::object();
    for (const auto& [key, value] : entry.items()) {
      if (key == "state_id_hex") continue;
      if (key != "completed" && key != "partial") {
        return named(absl::InvalidArgumentError(
            absl::StrCat("unknown member \"", key.substr(0, 100), "\"; an entry has state_id_hex, completed and partial")));
      }
      sides[key] = value;
    }
    absl::StatusOr<MeltanoState> state = StateFromArguments(*std::move(sid), sides);
    if (!state.ok()) return named(state.status());
    states.push_back(*std::move(state));
  }
  return states;
}


using MadeTask = absl::StatusOr<std::unique_ptr<Task>>;

}  // namespace

const std::vector<VerbSpec>& Verbs() {
  static const std::vector<VerbSpec>* const kVerbs = new std::vector<VerbSpec>{
      {"get", {Id("state_id", "the state id")}, LockRule::kNone, "", "", Returns::kMaybeState,
       "the state of an id: both sides and the merged view a tap gets; null when the id has none",
       [](Store& s, const VerbArgs& a) -> MadeTask {
         absl::StatusOr<std::string> id = a.Id("state_id");
         if (!id.ok()) return id.status();
         return s.Get(*std::move(id));
       }},
      {"set",
       {Id("state_id", "the state id"),
        {"state", ArgType::kObject, true, "the state to write: the completed side", true},
        Named("partial", ArgType::kObject, "the partial side to write (default: none)"),
        Named("force", ArgType::kFlag, "accept a state without a top-level singer_state key")},
       LockRule::kId, "the id's", "a state without a top-level \"singer_state\" key needs force (meltano state set refuses it too; its bypass is --no-validate)",
       Returns::kState, "replace the state of an id (both sides)",
       [](Store& s, const VerbArgs& a) -> MadeTask {
         absl::StatusOr<std::string> id = a.Id("state_id");
         if (!id.ok()) return id.status();
         absl::StatusOr<bool> force = a.Flag("force");
         if (!force.ok()) return force.status();
         absl::StatusOr<json> completed = a.Object("state");
         if (!completed.ok()) return completed.status();
         absl::StatusOr<json> partial = a.Object("partial");
         if (!partial.ok()) return partial.status();
         if (absl::Status st = CheckSingerState("set", *completed, *force, "state"); !st.ok()) return st;
         absl::StatusOr<MeltanoState> state =
             StateFromArguments(*id, json{{"completed", *std::move(completed)}, {"partial", *std::move(partial)}});
         if (!state.ok()) return state.status();
         return s.Set(*std::move(state));
       }},
      {"merge",
       {Id("state_id", "the state id to merge into"),
        {"partial", ArgType::kObject, false, "the partial state to merge", true},
        Named("from", ArgType::kStateId, "merge the merged view of this id's state instead"),
        Named("force", ArgType::kFlag, "accept input without a top-level singer_state key")},
       LockRule::kId, "the id's (state_id)",
       "exactly one of partial and from; an empty partial is refused (merging nothing would look like a success "
       "and change nothing); input without a top-level \"singer_state\" key needs force",
       Returns::kState,
       "merge a partial state into an id as Meltano does for each STATE message: objects merge recursively, lists "
       "and scalars from the input replace",
       [](Store& s, const VerbArgs& a) -> MadeTask {
         absl::StatusOr<std::string> id = a.Id("state_id");
         if (!id.ok()) return id.status();
         absl::StatusOr<bool> force = a.Flag("force");
         if (!force.ok()) return force.status();
         absl::StatusOr<std::optional<std::string>> from = a.OptionalId("from");
         if (!from.ok()) return from.status();
         if (from->has_value() == a.Has("partial")) {
           return absl::InvalidArgumentError(
               "merge takes the input either as partial (a state) or as from (the id whose state to merge), one of them");
         }
         if (from->has_value()) return s.MergeFrom(**from, *std::move(id), *force);
         absl::StatusOr<json> partial = a.Object("partial");
         if (!partial.ok()) return partial.status();
         if (partial->empty()) {
           return absl::InvalidArgumentError(absl::StrCat(
               "merge: the partial state is empty, so there is nothing to merge into ", QuoteForMessage(*id),
               "; nothing was written (use set to write a whole state)"));
         }
         if (absl::Status st = CheckSingerState("merge", *partial, *force, "partial state"); !st.ok()) return st;
         absl::StatusOr<MeltanoState> incoming =
             StateFromArguments(*id, json{{"completed", json::object()}, {"partial", *std::move(partial)}});
         if (!incoming.ok()) return incoming.status();
         return s.Update(*std::move(incoming));
       }},
      {"delete", {Id("state_id", "the state id")}, LockRule::kId, "the id's", "", Returns::kNothing,
       "remove the state of an id (an id with no state is fine)",
       [](Store& s, const VerbArgs& a) -> MadeTask {
         absl::StatusOr<std::string> id = a.Id("state_id");
         if (!id.ok()) return id.status();
         return s.Delete(*std::move(id));
       }},
      {"list", {{"pattern", ArgType::kPattern, false, "only ids matching this glob", true}}, LockRule::kNone, "", "",
       Returns::kStateIds, "the state ids, sorted",
       [](Store& s, const VerbArgs& a) -> MadeTask {
         absl::StatusOr<std::optional<std::string>> glob = a.Pattern();
         if (!glob.ok()) return glob.status();
         return s.List(*std::move(glob));
       }},
      {"clear_all", {}, LockRule::kNone, "", "", Returns::kCount,
       "remove every state (no locks, as Meltano's clear_all); returns how many",
       [](Store& s, const VerbArgs& a) -> MadeTask {
         return s.ClearAll();
       }},
      {"copy", {Id("src", "the state id to copy"), Id("dst", "the state id to write")}, LockRule::kId, "dst's",
       "src must have a state (NOT_FOUND)", Returns::kNothing, "copy the state of one id to another",
       [](Store& s, const VerbArgs& a) -> MadeTask {
         absl::StatusOr<std::string> src = a.Id("src");
         if (!src.ok()) return src.status();
         absl::StatusOr<std::string> dst = a.Id("dst");
         if (!dst.ok()) return dst.status();
         return s.Copy(*std::move(src), *std::move(dst));
       }},
      {"move", {Id("src", "the state id to move"), Id("dst", "the state id to write")}, LockRule::kId,
       "dst's, then src's", "src and dst differ; src must have a state (NOT_FOUND)", Returns::kNothing,
       "copy, then remove the source: a failure in between leaves both, never neither",
       [](Store& s, const VerbArgs& a) -> MadeTask {
         absl::StatusOr<std::string> src = a.Id("src");
         if (!src.ok()) return src.status();
         absl::StatusOr<std::string> dst = a.Id("dst");
         if (!dst.ok()) return dst.status();
         return s.Move(*std::move(src), *std::move(dst));
       }},
      {"export",
       {{"pattern", ArgType::kPattern, false, "only ids matching this glob", true},
        Named("after", ArgType::kStateId, "the last id of the previous page"),
        Named("limit", ArgType::kCount, "states per page (default 10000)"),
        Named("document", ArgType::kFlag,
              "the page as text instead of states: its entries of Meltano's export document, ids in state_ids")},
       LockRule::kNone, "", "", Returns::kPage,
       "one page of every state (meltano state export), sorted by id; ask again after the page's last id while "
       "more is true",
       [](Store& s, const VerbArgs& a) -> MadeTask {
         absl::StatusOr<std::optional<std::string>> glob = a.Pattern();
         if (!glob.ok()) return glob.status();
         absl::StatusOr<std::optional<std::string>> after = a.OptionalId("after");
         if (!after.ok()) return after.status();
         absl::StatusOr<int64_t> limit = a.Count("limit", kDefaultExportPageStates);
         if (!limit.ok()) return limit.status();
         absl::StatusOr<bool> document = a.Flag("document");
         if (!document.ok()) return document.status();
         return s.ExportPage(*std::move(glob), *std::move(after), *limit, *document);
       }},
      {"import", {{"states", ArgType::kStates, true, "the states to write, each with both sides", true}}, LockRule::kNone,
       "", "every entry is checked before anything is written (one bad entry: nothing written); ids unique",
       Returns::kCount, "write many states at once (meltano state import), in a few multi-row INSERTs",
       [](Store& s, const VerbArgs& a) -> MadeTask {
         absl::StatusOr<std::vector<MeltanoState>> states = ImportStates(a.Raw("states"));
         if (!states.ok()) return states.status();
         return s.Import(*std::move(states));
       }},
      {"import_document",
       {{"document", ArgType::kText, true,
         "the text of an export document, {\"<state id>\": {\"completed\": {...}, \"partial\": {...}}, ...}", true}},
       LockRule::kNone, "",
       "the whole document is checked before anything is written (one bad entry: nothing written, the entry named)",
       Returns::kCount,
       "import as chstate import does: the document read in one pass, without the tree of it import's states make",
       [](Store& s, const VerbArgs& a) -> MadeTask {
         absl::StatusOr<absl::string_view> text = a.TextView("document");
         if (!text.ok()) return text.status();
         absl::StatusOr<std::vector<StoredState>> rows = ParseExportDocumentRows(*text);
         if (!rows.ok()) return rows.status();
         return s.ImportRows(*std::move(rows));
       }},
      {"history",
       {Id("state_id", "the state id"), Named("limit", ArgType::kCount, "versions to list (default 20)")},
       LockRule::kNone, "", "", Returns::kVersions, "the versions of a state kept in its history, newest first",
       [](Store& s, const VerbArgs& a) -> MadeTask {
         absl::StatusOr<std::string> id = a.Id("state_id");
         if (!id.ok()) return id.status();
         absl::StatusOr<int64_t> limit = a.Count("limit", kDefaultHistoryLimit);
         if (!limit.ok()) return limit.status();
         return s.History(*std::move(id), *limit);
       }},
      {"rollback",
       {Id("state_id", "the state id"), {"version", ArgType::kText, true, "a version as history names it", true}},
       LockRule::kId, "the id's", "the version looks like <unix ms>-<8 hex digits>; NOT_FOUND when not kept",
       Returns::kState, "restore a version of a state (itself written as a new version)",
       [](Store& s, const VerbArgs& a) -> MadeTask {
         absl::StatusOr<std::string> id = a.Id("state_id");
         if (!id.ok()) return id.status();
         absl::StatusOr<std::string> version = a.Text("version");
         if (!version.ok()) return version.status();
         return s.Rollback(*std::move(id), *std::move(version));
       }},
      {"locks", {{"pattern", ArgType::kPattern, false, "only locks of ids matching this glob", true}}, LockRule::kNone, "",
       "", Returns::kLocks, "the locks held now: by whom, since when, until when",
       [](Store& s, const VerbArgs& a) -> MadeTask {
         absl::StatusOr<std::optional<std::string>> glob = a.Pattern();
         if (!glob.ok()) return glob.status();
         return s.Locks(*std::move(glob));
       }},
      {"unlock", {Id("state_id", "the state id")}, LockRule::kNone, "",
       "NOT_FOUND when the id is not locked", Returns::kLocks,
       "remove an id's lock whoever holds it (its holder loses it at its next renewal)",
       [](Store& s, const VerbArgs& a) -> MadeTask {
         absl::StatusOr<std::string> id = a.Id("state_id");
         if (!id.ok()) return id.status();
         return s.ForceUnlock(*std::move(id));
       }},
      {"init", {}, LockRule::kNone, "", "", Returns::kServer,
       "create the database and tables when missing, then apply retention",
       [](Store& s, const VerbArgs& a) -> MadeTask {
         return s.Init();
       }},
      {"compact", {}, LockRule::kNone, "", "", Returns::kServer,
       "apply retention: drop history past its days and count, and old lock tombstones",
       [](Store& s, const VerbArgs& a) -> MadeTask {
         return s.Init();
       }},
      {"ping", {}, LockRule::kNone, "", "", Returns::kServer, "the server's version and the SQL dialect chosen",
       [](Store& s, const VerbArgs& a) -> MadeTask {
         return s.Ping();
       }},
      {"acquire", {Id("state_id", "the state id")}, LockRule::kScope, "the id's",
       "ABORTED when another holder keeps it past lock_wait_seconds", Returns::kLock,
       "start a lock scope: take the id's lock (held, and renewed, until release)",
       [](Store& s, const VerbArgs& a) -> MadeTask {
         absl::StatusOr<std::string> id = a.Id("state_id");
         if (!id.ok()) return id.status();
         return s.AcquireLock(*std::move(id));
       }},
      {"renew", {Id("state_id", "the state id")}, LockRule::kScope, "the id's",
       "FAILED_PRECONDITION when this store does not hold it; ABORTED when it was lost", Returns::kLock,
       "renew the lease of a lock this store holds now",
       [](Store& s, const VerbArgs& a) -> MadeTask {
         absl::StatusOr<std::string> id = a.Id("state_id");
         if (!id.ok()) return id.status();
         return s.RenewLock(*std::move(id));
       }},
      {"release",
       {Id("state_id", "the state id"), {"lock_id", ArgType::kText, true, "what acquire returned", true}}, LockRule::kScope,
       "the id's",
       "FAILED_PRECONDITION when this store does not hold it; ABORTED when it was lost or its lease ran out while "
       "held (what the scope did was not exclusive)",
       Returns::kNothing, "end a lock scope",
       [](Store& s, const VerbArgs& a) -> MadeTask {
         absl::StatusOr<std::string> id = a.Id("state_id");
         if (!id.ok()) return id.status();
         absl::StatusOr<std::string> lock_id = a.Text("lock_id");
         if (!lock_id.ok()) return lock_id.status();
         return s.ReleaseLock(*std::move(id), *std::move(lock_id));
       }},
  };
  return *kVerbs;
}

const VerbSpec* FindVerb(absl::string_view name) {
  for (const VerbSpec& v : Verbs()) {
    if (name == v.name) return &v;
  }
  return nullptr;
}

const char* ArgTypeName(ArgType type) {
  switch (type) {
    case ArgType::kStateId: return "state_id";
    case ArgType::kPattern: return "pattern";
    case ArgType::kObject: return "object";
    case ArgType::kStates: return "states";
    case ArgType::kText: return "text";
    case ArgType::kCount: return "count";
    case ArgType::kFlag: return "flag";
  }
  return "?";
}

const char* LockRuleName(LockRule rule) {
  switch (rule) {
    case LockRule::kNone: return "none";
    case LockRule::kId: return "id";
    case LockRule::kScope: return "scope";
  }
  return "?";
}

const char* ReturnsName(Returns returns) {
  switch (returns) {
    case Returns::kNothing: return "nothing";
    case Returns::kServer: return "server";
    case Returns::kState: return "state";
    case Returns::kMaybeState: return "maybe_state";
    case Returns::kStateIds: return "state_ids";
    case Returns::kCount: return "count";
    case Returns::kPage: return "page";
    case Returns::kVersions: return "versions";
    case Returns::kLocks: return "locks";
    case Returns::kLock: return "lock";
  }
  return "?";
}

json VerbTableJson() {
  json verbs = json::array();
  for (const VerbSpec& v : Verbs()) {
    json args = json::array();
    for (const VerbArg& a : v.args) {
      args.push_back({{"name", a.name},
                      {"type", ArgTypeName(a.type)},
                      {"required", a.required},
                      {"positional", a.positional},
                      {"meaning", a.meaning},
                      {"field", Field(a)}});
    }
    verbs.push_back({{"name", v.name},
                     {"args", std::move(args)},
                     {"lock", LockRuleName(v.lock)},
                     {"lock_note", v.lock_note},
                     {"checks", v.checks},
                     {"returns", ReturnsName(v.returns)},
                     {"summary", v.summary}});
  }
  return json{{"verbs", std::move(verbs)}};
}

absl::StatusOr<std::unique_ptr<Task>> TaskForVerb(Store& store, const json& doc) {
  if (!doc.is_object()) return absl::InvalidArgumentError("a verb document must be a JSON object");
  auto op = doc.find("op");
  if (op == doc.end() || !op->is_string()) {
    return absl::InvalidArgumentError("missing string field \"op\" (the verb)");
  }
  const std::string name = op->get<std::string>();
  const VerbSpec* verb = FindVerb(name);
  if (verb == nullptr) {
    std::vector<std::string> names;
    for (const VerbSpec& v : Verbs()) names.push_back(v.name);
    return absl::InvalidArgumentError(absl::StrCat("unknown verb \"", name.substr(0, 100), "\"; the verbs are ",
                                                   absl::StrJoin(names, ", ")));
  }
  const VerbArgs args(*verb, doc);
  if (absl::Status st = args.Check(); !st.ok()) return st;
  return verb->task(store, args);
}

}  // namespace chstate
