// The verb table: every row has a task, arguments are checked by the row
// before anything is sent, and the rules a row states (the id's lock, an
// empty merge refused, singer_state unless forced) hold when driven with
// scripted server answers.
#include "core/verbs.h"

#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/defaults.h"
#include "core/lock.h"
#include "core/quoting.h"
#include "core/testing/responses.h"
#include "core/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace chstate {
namespace {

using ::chstate::testing::IsOk;
using ::chstate::testing::Ok;
using ::chstate::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using json = nlohmann::json;

const std::string kRandom(32, '\x22');
const std::string kLockId = MakeLockId(kRandom);

std::unique_ptr<Store> MakeStore() {
  absl::StatusOr<std::unique_ptr<Store>> s = Store::Create(StoreOptions{});
  EXPECT_THAT(s, IsOk());
  return std::move(*s);
}

std::string Hex(const std::string& s) { return HexEncode(s); }

// Runs a task answering each request by its purpose (the first answer of a
// purpose's list, then the next, the last repeating); timers fire at once.
// Returns the purposes sent and the final action.
struct Ran {
  std::vector<std::string> purposes;
  Action last;
};
Ran Drive(Task& task, std::map<std::string, std::vector<SqlResponse>> answers, int64_t* clock) {
  Ran out;
  std::map<std::string, size_t> used;
  Action a = task.Start({*clock, kRandom});
  for (int i = 0; i < 60; ++i) {
    if (a.kind == Action::Kind::kWait) {
      *clock += a.wait_ms;
      a = task.OnTimer({*clock, kRandom});
      continue;
    }
    if (a.kind != Action::Kind::kRunSql) break;
    const std::string& p = a.request.purpose;
    out.purposes.push_back(p);
    auto it = answers.find(p);
    if (it == answers.end()) {
      ADD_FAILURE() << "no scripted answer for " << p;
      break;
    }
    const size_t n = used[p]++;
    *clock += 2;
    a = task.OnResponse(it->second[std::min(n, it->second.size() - 1)], {*clock, kRandom});
  }
  out.last = a;
  return out;
}

// The lock table's inspection answer: this store's lock, taken at 100 s.
SqlResponse Mine() {
  return Ok(kLockId + "\t0\t100\t100\t10\n\t255\t100\t100\t0\n");
}

const std::map<std::string, std::vector<SqlResponse>> kLockAnswers = {
    {"select_version", {Ok("18.16.1\t1\n")}}, {"create_lock", {Ok()}}, {"foreign_lock_rows", {Ok()}},
    {"inspect_lock", {Mine()}},                {"drop_lock", {Ok()}},  {"insert_state", {Ok()}},
    {"get_state", {Ok()}},                     {"delete_state", {Ok()}}, {"pending_mutations", {Ok("0\t1\n")}},
};

TEST(Verbs, TheTableNamesEveryVerbOnceAndEachHasATask) {
  std::set<std::string> names;
  for (const VerbSpec& v : Verbs()) EXPECT_TRUE(names.insert(v.name).second) << v.name;
  EXPECT_THAT(names, ::testing::UnorderedElementsAre("get", "set", "merge", "delete", "list", "clear_all", "copy",
                                                     "move", "export", "import", "import_document", "history", "rollback", "locks",
                                                     "unlock", "init", "compact", "ping", "acquire", "renew",
                                                     "release"));
  // Every row has its handler, and a document with every required argument
  // gives a task.
  for (const VerbSpec& v : Verbs()) {
    SCOPED_TRACE(v.name);
    ASSERT_NE(v.task, nullptr);
    json doc = {{"op", v.name}};
    for (const VerbArg& a : v.args) {
      if (!a.required) continue;
      const std::string field = a.type == ArgType::kStateId ? absl::StrCat(a.name, "_hex") : a.name;
      switch (a.type) {
        case ArgType::kStateId: doc[field] = Hex(absl::StrCat("dev:", a.name)); break;
        case ArgType::kObject: doc[field] = {{"singer_state", json::object()}}; break;
        case ArgType::kStates: doc[field] = json::array(); break;
        case ArgType::kText:
          doc[field] = std::string(a.name) == "version"    ? "1796155032000-9f3a2b1c"
                       : std::string(a.name) == "document" ? "{}"
                                                           : kLockId;
          break;
        default: break;
      }
    }
    if (std::string(v.name) == "merge") doc["partial"] = {{"singer_state", {{"a", 1}}}};
    auto store = MakeStore();
    EXPECT_THAT(TaskForVerb(*store, doc), IsOk());
  }
}

TEST(Verbs, ArgumentsAreCheckedByTheRow) {
  struct Case {
    const char* name;
    const char* doc;
    const char* error;
  };
  static const Case kCases[] = {
      {"unknown verb", R"({"op":"update"})", "unknown verb \"update\"; the verbs are get, set, merge"},
      {"no op", R"({"state_id_hex":"61"})", "missing string field \"op\""},
      {"missing id", R"({"op":"get"})", "get needs state_id (the state id): give it as \"state_id_hex\""},
      {"unknown argument", R"({"op":"get","state_id_hex":"61","limit":3})",
       "get takes no argument \"limit\"; its arguments are state_id_hex"},
      {"argument of a verb that takes none", R"({"op":"ping","force":true})", "it takes none"},
      {"id not hex", R"({"op":"get","state_id_hex":"zz"})", "\"state_id_hex\" is not hex"},
      {"empty id", R"({"op":"get","state_id_hex":""})", "state_id: "},
      {"state not an object", R"({"op":"set","state_id_hex":"61","state":[1]})", "set: state must be a JSON object"},
      {"limit not positive", R"({"op":"history","state_id_hex":"61","limit":0})", "limit must be a positive"},
      {"force not a flag", R"({"op":"set","state_id_hex":"61","state":{"singer_state":{}},"force":"yes"})",
       "force must be true or false"},
      {"set without singer_state", R"({"op":"set","state_id_hex":"61","state":{"bookmarks":{}}})",
       "has no top-level \"singer_state\" key"},
      {"merge of nothing", R"({"op":"merge","state_id_hex":"61","partial":{}})",
       "the partial state is empty, so there is nothing to merge"},
      {"merge of nothing, forced", R"({"op":"merge","state_id_hex":"61","partial":{},"force":true})",
       "nothing to merge"},
      {"merge without singer_state", R"({"op":"merge","state_id_hex":"61","partial":{"x":1}})",
       "has no top-level \"singer_state\" key"},
      {"merge with both inputs", R"({"op":"merge","state_id_hex":"61","partial":{"singer_state":{}},"from_hex":"62"})",
       "one of them"},
      {"merge with no input", R"({"op":"merge","state_id_hex":"61"})", "one of them"},
      {"import entry not an object", R"({"op":"import","states":[1]})", "import entry 1: an entry must be"},
      {"import entry with a stray member", R"({"op":"import","states":[{"state_id_hex":"61","colour":1}]})",
       "unknown member \"colour\""},
      {"import document not text", R"({"op":"import_document","document":{"a":{}}})", "document must be"},
      {"import document not an object", R"({"op":"import_document","document":"[1]"})",
       "the import must be a JSON object"},
      {"import document with a bad entry", R"({"op":"import_document","document":"{\"a\": {\"colour\": 1}}"})",
       "import entry for state id \"a\""},
      {"rollback of a bad version", R"({"op":"rollback","state_id_hex":"61","version":"yesterday"})", nullptr},
  };
  for (const Case& c : kCases) {
    SCOPED_TRACE(c.name);
    auto store = MakeStore();
    absl::StatusOr<std::unique_ptr<Task>> task = TaskForVerb(*store, json::parse(c.doc));
    if (c.error == nullptr) {
      // Refused by the store's own check, still before anything is sent.
      ASSERT_THAT(task, IsOk());
      Action a = (*task)->Start({0, kRandom});
      EXPECT_EQ(a.kind, Action::Kind::kFailed);
      EXPECT_EQ(a.status.code(), absl::StatusCode::kInvalidArgument);
      continue;
    }
    EXPECT_THAT(task, StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(c.error)));
  }
}

// A state nested deeper than a state read back may be (512 levels) would be
// written and then fail every read: set, merge and import refuse it before
// anything is sent, as the protocol did before the verb table.
TEST(Verbs, StatesTooDeepToReadBackAreRefused) {
  std::string deep = "{\"singer_state\":{\"a\":" + std::string(515, '[') + std::string(515, ']') + "}}";
  struct Case {
    const char* name;
    std::string doc;
  };
  const Case cases[] = {
      {"set", R"({"op":"set","state_id_hex":"61","state":)" + deep + "}"},
      {"set, partial", R"({"op":"set","state_id_hex":"61","state":{"singer_state":{}},"partial":)" + deep + "}"},
      {"merge", R"({"op":"merge","state_id_hex":"61","partial":)" + deep + "}"},
      {"import", R"({"op":"import","states":[{"state_id_hex":"61","completed":)" + deep + "}]}"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    auto store = MakeStore();
    EXPECT_THAT(TaskForVerb(*store, json::parse(c.doc)),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("nesting is deeper than 512")));
  }
}

TEST(Verbs, ImportDocumentWritesEveryEntryOfTheDocumentInOneInsert) {
  auto store = MakeStore();
  int64_t clock = 1000;
  json doc = {{"op", "import_document"},
              {"document", R"({"dev:b": {"completed": {"y": 1, "x": [2]}}, "dev:a": {"partial": {"p": 1}}})"}};
  auto task = TaskForVerb(*store, doc);
  ASSERT_THAT(task, IsOk());
  Ran r = Drive(**task, {{"select_version", {Ok("18.16.1\t1\n")}}, {"insert_states", {Ok()}}}, &clock);
  ASSERT_EQ(r.last.kind, Action::Kind::kDone) << r.last.status;
  EXPECT_EQ(r.last.result.count, 2);
  EXPECT_THAT(r.purposes, ElementsAre("select_version", "insert_states"));
}

TEST(Verbs, ForcedStatesAreWrittenAsTheyAre) {
  auto store = MakeStore();
  int64_t clock = 1000;
  auto task = TaskForVerb(*store, json::parse(R"({"op":"set","state_id_hex":"61","state":{"x":1},"force":true})"));
  ASSERT_THAT(task, IsOk());
  Ran r = Drive(**task, kLockAnswers, &clock);
  ASSERT_EQ(r.last.kind, Action::Kind::kDone) << r.last.status;
  EXPECT_EQ(r.last.result.state->completed, json::parse(R"({"x":1})"));
}

TEST(Verbs, SetAndDeleteTakeTheIdsLockOutsideAScopeAndUseTheScopesInside) {
  for (const char* verb : {"set", "delete", "merge"}) {
    SCOPED_TRACE(verb);
    json doc = {{"op", verb}, {"state_id_hex", Hex("dev:a")}};
    if (std::string(verb) == "set") doc["state"] = {{"singer_state", {{"a", 1}}}};
    if (std::string(verb) == "merge") doc["partial"] = {{"singer_state", {{"b", 2}}}};
    auto store = MakeStore();
    int64_t clock = 1000;
    // Outside a scope: the lock is taken for the write and released after.
    Ran outside = Drive(**TaskForVerb(*store, doc), kLockAnswers, &clock);
    ASSERT_EQ(outside.last.kind, Action::Kind::kDone) << outside.last.status;
    EXPECT_EQ(outside.purposes.front(), "select_version");
    EXPECT_EQ(outside.purposes[1], "foreign_lock_rows");  // a Python backend's holder is waited for
    EXPECT_EQ(outside.purposes[2], "create_lock");
    EXPECT_EQ(outside.purposes.back(), "drop_lock");
    // Inside a scope: no lock request at all, the write under the scope's lock.
    Ran acquired =
        Drive(**TaskForVerb(*store, {{"op", "acquire"}, {"state_id_hex", Hex("dev:a")}}), kLockAnswers, &clock);
    ASSERT_EQ(acquired.last.kind, Action::Kind::kDone) << acquired.last.status;
    Ran inside = Drive(**TaskForVerb(*store, doc), kLockAnswers, &clock);
    ASSERT_EQ(inside.last.kind, Action::Kind::kDone) << inside.last.status;
    for (const std::string& p : inside.purposes) {
      EXPECT_NE(p, "create_lock");
      EXPECT_NE(p, "drop_lock");
    }
    // After the scope's lease ran out (no renewal: 10 s validity), the
    // write is refused and nothing is sent.
    clock += 20000;
    Ran late = Drive(**TaskForVerb(*store, doc), kLockAnswers, &clock);
    EXPECT_EQ(late.last.kind, Action::Kind::kFailed);
    EXPECT_EQ(late.last.status.code(), absl::StatusCode::kAborted) << late.last.status;
  }
}

TEST(Verbs, LockScopesOnOneIdDoNotNest) {
  auto store = MakeStore();
  int64_t clock = 1000;
  json acquire = {{"op", "acquire"}, {"state_id_hex", Hex("dev:a")}};
  ASSERT_EQ(Drive(**TaskForVerb(*store, acquire), kLockAnswers, &clock).last.kind, Action::Kind::kDone);
  Ran again = Drive(**TaskForVerb(*store, acquire), kLockAnswers, &clock);
  EXPECT_EQ(again.last.status.code(), absl::StatusCode::kFailedPrecondition) << again.last.status;
  EXPECT_THAT(std::string(again.last.status.message()), HasSubstr("do not nest"));
  EXPECT_TRUE(again.purposes.empty());
}

TEST(Verbs, AMixedFleetIsSafeByDefault) {
  // Without python_locks, a live row of the Python backend in <table>_lock
  // still keeps an acquirer waiting (and giving up, naming it), looked at
  // before the lock is taken: no lock table is created meanwhile.
  StoreOptions o;
  o.lock.timeout_ms = 1500;
  auto store = *Store::Create(o);
  int64_t clock = 1000;
  auto answers = kLockAnswers;
  answers["foreign_lock_rows"] = {Ok("python-holder-1\t1\n")};
  Ran r = Drive(**TaskForVerb(*store, {{"op", "acquire"}, {"state_id_hex", Hex("dev:a")}}), answers, &clock);
  EXPECT_EQ(r.last.kind, Action::Kind::kFailed);
  EXPECT_THAT(std::string(r.last.status.message()), HasSubstr("locked by a process of the Python ClickHouse backend"));
  EXPECT_EQ(r.last.status.code(), absl::StatusCode::kAborted);
  for (const std::string& p : r.purposes) EXPECT_NE(p, "create_lock");
  // No such table (no Python process ever ran here): taken as usual.
  answers["foreign_lock_rows"] = {testing::Err(404, 60, "Table meltano.state_lock doesn't exist.")};
  auto store2 = *Store::Create(o);
  Ran ok = Drive(**TaskForVerb(*store2, {{"op", "acquire"}, {"state_id_hex", Hex("dev:a")}}), answers, &clock);
  EXPECT_EQ(ok.last.kind, Action::Kind::kDone) << ok.last.status;
  EXPECT_THAT(ok.purposes, ElementsAre("select_version", "foreign_lock_rows", "create_lock"));
}

TEST(Verbs, MergeFromReadsTheSourcesMergedView) {
  auto store = MakeStore();
  int64_t clock = 1000;
  auto answers = kLockAnswers;
  answers["get_state"] = {
      Ok("{\\\"singer_state\\\":{\\\"b\\\":2}}\t{\\\"singer_state\\\":{\\\"a\\\":1}}\n"),  // src: partial, completed
      Ok("")};                                                                              // dst: none yet
  Ran r = Drive(**TaskForVerb(*store, {{"op", "merge"}, {"state_id_hex", Hex("dst")}, {"from_hex", Hex("src")}}),
                answers, &clock);
  ASSERT_EQ(r.last.kind, Action::Kind::kDone) << r.last.status;
  EXPECT_EQ(r.last.result.state->partial, json::parse(R"({"singer_state":{"a":1,"b":2}})"));
  // An empty source merges nothing: refused, nothing written.
  answers["get_state"] = {Ok("\\N\t\\N\n")};
  Ran empty = Drive(**TaskForVerb(*store, {{"op", "merge"}, {"state_id_hex", Hex("dst")}, {"from_hex", Hex("src")}}),
                    answers, &clock);
  EXPECT_EQ(empty.last.status.code(), absl::StatusCode::kInvalidArgument);
  for (const std::string& p : empty.purposes) EXPECT_NE(p, "insert_state");
}

// A default a row's text names is the one the verb uses (the export page's
// said 1000 after the default became 10000).
TEST(Verbs, TheDefaultsTheTableNamesAreTheCoresOwn) {
  const struct {
    const char* verb;
    int64_t value;
  } kCases[] = {{"export", kDefaultExportPageStates}, {"history", kDefaultHistoryLimit}};
  for (const auto& c : kCases) {
    const VerbSpec* v = FindVerb(c.verb);
    ASSERT_NE(v, nullptr) << c.verb;
    bool found = false;
    for (const VerbArg& a : v->args) {
      if (std::string(a.name) != "limit") continue;
      found = true;
      EXPECT_THAT(std::string(a.meaning), HasSubstr(absl::StrCat("(default ", c.value, ")"))) << c.verb;
    }
    EXPECT_TRUE(found) << c.verb;
  }
}

TEST(Verbs, TheTableAsJsonNamesEachArgumentsField) {
  json t = VerbTableJson();
  ASSERT_TRUE(t["verbs"].is_array());
  for (const json& v : t["verbs"]) {
    if (v["name"] == "copy") {
      EXPECT_EQ(v["args"][0]["field"], "src_hex");
      EXPECT_EQ(v["lock"], "id");
      EXPECT_EQ(v["returns"], "nothing");
    }
    if (v["name"] == "acquire") EXPECT_EQ(v["lock"], "scope");
  }
}

}  // namespace
}  // namespace chstate
