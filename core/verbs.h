// The verbs: everything a user can ask of a store, in one table that says
// for each its arguments, whether it takes the state id's lock, how its input
// is checked, what it returns and what it does (its handler, the task it
// makes); and the one function that turns a verb's document into that task. Every host's API (the chstate command,
// the Meltano adapter, Lua, Node, wasmtime, Extism) is a binding of this
// table in its language's conventions and decides nothing a row decides:
// the same call with the same inputs means the same in every runtime
// (tests/api replays one scenario suite through each of them).
//
//   const chstate::VerbSpec* get = chstate::FindVerb("get");
//   absl::StatusOr<std::unique_ptr<chstate::Task>> task =
//       chstate::TaskForVerb(store, nlohmann::json::parse(R"({"op":"get","state_id_hex":"6465763a61"})"));
//
// A verb document is {"op": NAME, ARG: value, ...}. Arguments of type
// kStateId travel as hex under "<name>_hex" (ids are any bytes); a kPattern
// as "pattern" (text) or "pattern_hex"; the others under their name.
#ifndef CHSTATE_CORE_VERBS_H_
#define CHSTATE_CORE_VERBS_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/store.h"
#include "core/task.h"
#include <nlohmann/json.hpp>

namespace chstate {

enum class ArgType {
  kStateId,  // bytes, not empty (as "<name>_hex")
  kPattern,  // Meltano's glob: * any run, ? one character ("pattern" or "pattern_hex"; absent = every id)
  kObject,   // a JSON object (a state or one side of it)
  kStates,   // import entries: [{"state_id_hex", "completed", "partial"}, ...]
  kText,     // a string
  kCount,    // a positive whole number
  kFlag,     // true or false (absent = false)
};

struct VerbArg {
  const char* name;
  ArgType type;
  bool required;
  const char* meaning;
  // How bindings take it: positional arguments first, in the row's order
  // (required ones, then at most a trailing optional one), the others by
  // name (Python keywords, a trailing JS object or Lua table).
  bool positional;
};

// Which lock a verb takes.
enum class LockRule {
  kNone,   // none (reads; clear_all and import, as Meltano's)
  kId,     // the id's lock: the one this store holds (a lock scope), whose lease
           // must be valid at the write, or taken for the call and released after
  kScope,  // the lock scope itself (acquire, renew, release)
};

// What a verb's "done" document carries, and so what a binding returns.
enum class Returns {
  kNothing,    // success only
  kServer,     // server_version, dialect
  kState,      // state: the state written or restored {completed, partial, merged}
  kMaybeState, // state, or null when the id has none
  kStateIds,   // state_ids_hex, sorted
  kCount,      // count
  kPage,       // states (sorted by id) and more (ask again after the last id); with export's document,
               // document (the entries' text) and state_ids_hex instead of states
  kVersions,   // versions, newest first
  kLocks,      // locks held now
  kLock,       // lock_id (and waited_ms for acquire)
};

// A verb document's arguments, read by its row (core/verbs.cc).
class VerbArgs;
// What a verb does: its task, made from its checked arguments.
using VerbTask = absl::StatusOr<std::unique_ptr<Task>> (*)(Store& store, const VerbArgs& args);

struct VerbSpec {
  const char* name;
  std::vector<VerbArg> args;
  LockRule lock;
  const char* lock_note;  // which id's lock, when it matters
  const char* checks;     // what is refused before anything is sent ("" = the arguments' types only)
  Returns returns;
  const char* summary;
  VerbTask task;
};

// Every verb, in the order docs list them.
const std::vector<VerbSpec>& Verbs();
const VerbSpec* FindVerb(absl::string_view name);

const char* ArgTypeName(ArgType type);
const char* LockRuleName(LockRule rule);
const char* ReturnsName(Returns returns);

// The table as JSON, for bindings that build their methods from it and for
// the docs: {"verbs": [{"name", "args": [{"name", "type", "required",
// "positional", "meaning", "field"}], "lock", "lock_note", "checks",
// "returns", "summary"}]}.
// "field" is the document member the argument travels in.
nlohmann::json VerbTableJson();

// The task for a verb document, its arguments checked by the verb's row
// (kInvalidArgument naming the argument and the fix; nothing is sent). An
// unknown verb is kInvalidArgument listing the verbs.
absl::StatusOr<std::unique_ptr<Task>> TaskForVerb(Store& store, const nlohmann::json& doc);

}  // namespace chstate

#endif  // CHSTATE_CORE_VERBS_H_
