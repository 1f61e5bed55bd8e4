// Store tasks driven with scripted server answers and a fake clock: the
// sequence of statements each operation sends, and what it makes of answers.
#include "core/store.h"

#include <functional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/endpoints.h"
#include "core/lock.h"
#include "core/response.h"
#include "core/state.h"
#include "core/statements.h"
#include "core/testing/responses.h"
#include "core/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace chstate {
namespace {

using ::chstate::testing::IsOk;
using ::chstate::testing::Err;
using ::chstate::testing::Lost;
using ::chstate::testing::Ok;
using ::chstate::testing::Refused;
using ::chstate::testing::StatusIs;
using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;

const std::string kRandom(32, '\x11');
const std::string kLockId = MakeLockId(kRandom);

// One expected request (by purpose, optionally checking the SQL) and the
// answer to give, or a timer to fire after advancing the fake clock.
struct Exchange {
  std::string purpose;  // "" = expect a wait instead
  SqlResponse response;
  std::string sql_contains;
  int64_t wait_ms = -1;  // for waits: the expected wait
};

Exchange Q(std::string purpose, SqlResponse r, std::string sql_contains = "") {
  return Exchange{std::move(purpose), std::move(r), std::move(sql_contains)};
}
Exchange W(int64_t ms) { return Exchange{"", {}, "", ms}; }

struct Outcome {
  Action last;
  std::vector<std::string> purposes;
};

// Runs `task` through `script`, failing the test on any deviation.
Outcome Drive(Task& task, const std::vector<Exchange>& script, int64_t* clock, const std::string& random = kRandom) {
  Outcome out;
  const std::string& kRandom = random;  // every input carries these bytes
  Action a = task.Start({*clock, kRandom});
  for (const Exchange& e : script) {
    if (e.purpose.empty()) {
      EXPECT_EQ(a.kind, Action::Kind::kWait) << "expected a wait after " << ::testing::PrintToString(out.purposes);
      if (a.kind != Action::Kind::kWait) break;
      if (e.wait_ms >= 0) EXPECT_EQ(a.wait_ms, e.wait_ms);
      *clock += a.wait_ms;
      a = task.OnTimer({*clock, kRandom});
      continue;
    }
    EXPECT_EQ(a.kind, Action::Kind::kRunSql) << "expected " << e.purpose << ", status " << a.status;
    if (a.kind != Action::Kind::kRunSql) break;
    // Every acquisition looks for the Python backend's lock rows (a mixed
    // fleet is safe by default; verbs_test pins it): scripts that are about
    // something else get "none" without naming it.
    while (a.kind == Action::Kind::kRunSql && a.request.purpose == "foreign_lock_rows" &&
           e.purpose != "foreign_lock_rows") {
      *clock += 3;
      a = task.OnResponse(Ok(""), {*clock, kRandom});
    }
    if (a.kind != Action::Kind::kRunSql) {
      ADD_FAILURE() << "expected " << e.purpose << ", status " << a.status;
      break;
    }
    out.purposes.push_back(a.request.purpose);
    EXPECT_EQ(a.request.purpose, e.purpose);
    if (!e.sql_contains.empty()) EXPECT_THAT(a.request.sql, HasSubstr(e.sql_contains));
    *clock += 3;  // each round trip takes a little time
    a = task.OnResponse(e.response, {*clock, kRandom});
  }
  // An acquisition that ended the script still looks for Python rows.
  while (a.kind == Action::Kind::kRunSql && a.request.purpose == "foreign_lock_rows") {
    *clock += 3;
    a = task.OnResponse(Ok(""), {*clock, kRandom});
  }
  out.last = a;
  return out;
}

// The lock timing these scripts were written for: a 300 s validity and a
// 10 s wait (the defaults are Meltano's 10 s and twice that plus a retry).
LockOptions ScriptLock() {
  LockOptions lock;
  lock.stale_ms = 300000;
  lock.timeout_ms = 10000;
  return lock;
}

std::unique_ptr<Store> MakeStore(LockOptions lock = ScriptLock(), TransportPolicy transport = {}) {
  StoreOptions o;
  o.lock = ScriptLock();
  o.lock = lock;
  o.transport = transport;
  absl::StatusOr<std::unique_ptr<Store>> s = Store::Create(o);
  EXPECT_THAT(s, IsOk());
  return std::move(*s);
}

// The inspect answer: the holder's creation row (seq 0) at `created`, and the
// table's own row; times in server seconds.
SqlResponse Held(const std::string& holder, int64_t created, int64_t now) {
  return Ok(holder + "\t0\t" + std::to_string(created) + "\t" + std::to_string(now) + "\t300\n\t255\t" +
            std::to_string(created) + "\t" + std::to_string(now) + "\t0\n");
}
SqlResponse Mine() { return Held(kLockId, 100, 100); }

const Exchange kVersion18 = Q("select_version", Ok("18.16.1\t1\n"));
const Exchange kVersionModern = Q("select_version", Ok("26.9.2.1\t1\n"));

// Takes `id`'s lock first, so that a test of a write's own requests sees
// only them: a write to an id whose lock this store holds sends no lock
// request (verbs_test covers the lock taken for a single write).
void HoldLock(Store& store, const std::string& id, int64_t* clock, const Exchange& version) {
  auto t = store.AcquireLock(id);
  Outcome o = Drive(*t, {version, Q("create_lock", Ok())}, clock);
  ASSERT_EQ(o.last.kind, Action::Kind::kDone) << o.last.status;
}

TEST(Store, RefusesAStaleWindowBelowTheFloor) {
  StoreOptions o;
  o.lock = ScriptLock();
  o.lock.stale_ms = kMinStaleLockMs - 1;
  EXPECT_THAT(Store::Create(o).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("999 ms"), HasSubstr("at least 1 s"), HasSubstr("lock_timeout_seconds"))));
  o.lock.stale_ms = kMinStaleLockMs;
  EXPECT_THAT(Store::Create(o), IsOk());
}

TEST(Store, GetReadsStateAndRemembersTheDialect) {
  auto store = MakeStore();
  int64_t clock = 1000;
  auto t = store->Get("dev:a");
  Outcome o = Drive(*t,
                    {kVersion18, Q("get_state", Ok("{\"p\":1}\t{\"singer_state\":{\"x\":2}}\n"),
                                   "WHERE state_id = 'dev:a'")},
                    &clock);
  ASSERT_EQ(o.last.kind, Action::Kind::kDone) << o.last.status;
  ASSERT_TRUE(o.last.result.state.has_value());
  EXPECT_EQ(o.last.result.state->partial, nlohmann::json::parse("{\"p\":1}"));
  EXPECT_EQ(o.last.result.state->completed["singer_state"]["x"], 2);
  EXPECT_EQ(o.last.result.server_version, "18.16.1");
  EXPECT_EQ(store->dialect(), Dialect::kClickHouse18);

  // The second task does not ask for the version again.
  auto t2 = store->Get("dev:b");
  Outcome o2 = Drive(*t2, {Q("get_state", Ok(""))}, &clock);
  ASSERT_EQ(o2.last.kind, Action::Kind::kDone);
  EXPECT_FALSE(o2.last.result.state.has_value());
}

TEST(Store, NullColumnsReadAsEmptyObjects) {
  auto store = MakeStore();
  int64_t clock = 0;
  auto t = store->Get("x");
  Outcome o = Drive(*t, {kVersionModern, Q("get_state", Ok("\\N\t{\"a\":1}\n"))}, &clock);
  ASSERT_EQ(o.last.kind, Action::Kind::kDone);
  EXPECT_EQ(o.last.result.state->partial, nlohmann::json::object());
  EXPECT_TRUE(o.last.result.state->IsComplete());
}

TEST(Store, MissingTableReadsAsAbsentAndEmptyList) {
  auto store = MakeStore();
  int64_t clock = 0;
  auto t = store->Get("x");
  Outcome o = Drive(*t, {kVersion18, Q("get_state", Err(404, 60, "Table meltano.state doesn't exist."))}, &clock);
  ASSERT_EQ(o.last.kind, Action::Kind::kDone);
  EXPECT_FALSE(o.last.result.state.has_value());
  auto l = store->List(std::nullopt);
  Outcome ol = Drive(*l, {Q("list_state_ids", Err(404, 81, "Database meltano doesn't exist"))}, &clock);
  ASSERT_EQ(ol.last.kind, Action::Kind::kDone);
  EXPECT_TRUE(ol.last.result.state_ids.empty());
}

TEST(Store, CorruptStoredJsonIsDataLoss) {
  auto store = MakeStore();
  int64_t clock = 0;
  auto t = store->Get("bad");
  Outcome o = Drive(*t, {kVersion18, Q("get_state", Ok("\\N\t{not json\n"))}, &clock);
  ASSERT_EQ(o.last.kind, Action::Kind::kFailed);
  EXPECT_THAT(o.last.status, StatusIs(absl::StatusCode::kDataLoss, HasSubstr("completed_state")));
}

TEST(Store, WriteCreatesTheSchemaOnceWhenMissing) {
  auto store = MakeStore();
  int64_t clock = 0;
  MeltanoState s{"id", nlohmann::json::object(), nlohmann::json::parse("{\"singer_state\":{}}")};
  HoldLock(*store, "id", &clock, kVersionModern);
  auto t = store->Set(s);
  Outcome o = Drive(*t,
                    {Q("insert_state", Err(404, 81, "Database meltano doesn't exist")),
                     Q("create_database", Ok()), Q("create_state_table", Ok(), "DateTime64(3)"),
                     Q("create_lock_table", Ok(), "TTL"),
                     Q("create_history_table", Ok(), "TTL toDateTime(updated_at) + INTERVAL 30 DAY"),
                     Q("create_history_buffer", Ok(), "AS `meltano`.`state_history` ENGINE = Buffer('meltano', 'state_history', 1, 10, 10, "),
                     Q("create_history_view", Ok(), "`meltano`.`state_history_buffer_mv` TO `meltano`.`state_history_buffer` AS SELECT"),
                     Q("drop_unbuffered_history_view", Ok(), "DROP TABLE IF EXISTS `meltano`.`state_history_mv`"),
                     Q("insert_state", Ok(), "SELECT 'id', NULL, '{\"singer_state\":{}}' FROM")},
                    &clock);
  EXPECT_EQ(o.last.kind, Action::Kind::kDone) << o.last.status;

  // A second failure is reported, not looped on.
  auto t2 = store->Set(s);
  Outcome o2 = Drive(*t2,
                     {Q("insert_state", Err(404, 81, "x")), Q("create_database", Ok()), Q("create_state_table", Ok()),
                      Q("create_lock_table", Ok()), Q("create_history_table", Ok()), Q("create_history_buffer", Ok()), Q("create_history_view", Ok()),
                     Q("drop_unbuffered_history_view", Ok()),
                      Q("insert_state", Err(404, 81, "still missing"))},
                     &clock);
  EXPECT_THAT(o2.last.status, StatusIs(absl::StatusCode::kNotFound, HasSubstr("still missing")));
}

TEST(Store, ModernWritesCarryAUniqueDedupTokenAndNoAsyncInsert) {
  auto store = MakeStore();
  int64_t clock = 0;
  MeltanoState s{"id", nlohmann::json::object(), nlohmann::json::parse("{\"a\":1}")};
  std::vector<std::string> tokens;
  HoldLock(*store, "id", &clock, kVersionModern);
  for (int i = 0; i < 3; ++i) {
    auto t = store->Set(s);
    Action a = t->Start({clock, kRandom});  // the same random bytes every time
    ASSERT_EQ(a.kind, Action::Kind::kRunSql);
    bool async_off = false;
    for (const auto& [k, v] : a.request.url_params) {
      if (k == "insert_deduplication_token") tokens.push_back(v);
      if (k == "async_insert" && v == "0") async_off = true;
    }
    EXPECT_TRUE(async_off);
    a = t->OnResponse(Ok(), {clock, kRandom});
    EXPECT_EQ(a.kind, Action::Kind::kDone);
  }
  ASSERT_EQ(tokens.size(), 3u);
  EXPECT_NE(tokens[0], tokens[1]);
  EXPECT_NE(tokens[1], tokens[2]);
}

TEST(Store, UpdateMergesPartialUnderTheLock) {
  auto store = MakeStore();
  int64_t clock = 0;
  MeltanoState incoming{"id", nlohmann::json::parse(R"({"singer_state":{"b":{"x":2}}})"), nlohmann::json::object()};
  auto t = store->Update(incoming);
  Outcome o = Drive(*t,
                    {kVersion18, Q("create_lock", Ok(), "'" + kLockId + "' AS lock_id, toUInt8(0) AS seq"),
                     Q("get_state", Ok("{\"singer_state\":{\"a\":1,\"b\":{\"y\":3}}}\t{\"c\":true}\n")),
                     Q("insert_state", Ok(),
                       R"(SELECT 'id', '{"singer_state":{"a":1,"b":{"x":2,"y":3}}}', '{"c":true}' FROM)"),
                     Q("inspect_lock", Mine()), Q("drop_lock", Ok())},
                    &clock);
  ASSERT_EQ(o.last.kind, Action::Kind::kDone) << o.last.status;
  EXPECT_EQ(o.last.result.state->completed, nlohmann::json::parse(R"({"c":true})"));
}

// A write under a held lock is fenced on that lock's id (statements_test
// pins the SQL); a server that finds the lock table holding another lock, or
// none, refuses it, and the write fails as nothing written: no schema made,
// nothing sent again.
TEST(Store, AFencedWriteRefusedByTheServerFailsAsNothingWritten) {
  const std::string lock_table = "meltano.state_lock_08b72e07b55c3ac0";
  struct Case {
    const char* name;
    SqlResponse answer;
    std::vector<Exchange> renewal;  // what finds the lock lost for the machine
  };
  const SqlResponse missing = Err(404, 60, "Table " + lock_table + " doesn't exist.");
  const Case kCases[] = {
      {"another lock", Err(500, 395, "Value passed to 'throwIf' function is non zero"),
       {Q("renew_lock", Ok()), Q("inspect_lock", Held("other", 100, 101))}},
      {"no lock table", missing, {Q("renew_lock", missing)}},
  };
  for (const Case& c : kCases) {
    SCOPED_TRACE(c.name);
    auto store = MakeStore();
    int64_t clock = 0;
    MeltanoState s{"id", nlohmann::json::object(), nlohmann::json::parse("{\"a\":1}")};
    HoldLock(*store, "id", &clock, kVersion18);
    auto t = store->Set(s);
    std::vector<Exchange> script = {
        Q("insert_state", c.answer, "lock_id = '" + kLockId + "') AS ours FROM `meltano`.`state_lock_08b72e07b55c3ac0`")};
    script.insert(script.end(), c.renewal.begin(), c.renewal.end());
    Outcome o = Drive(*t, script, &clock);
    EXPECT_EQ(o.last.kind, Action::Kind::kFailed);
    EXPECT_THAT(o.last.status, StatusIs(absl::StatusCode::kAborted,
                                        AllOf(HasSubstr("was not this process's any more"),
                                              HasSubstr("nothing was written"))));
    // The lock is known lost now: the next write is refused before anything is sent.
    auto again = store->Set(s);
    Action a = again->Start({clock, kRandom});
    EXPECT_EQ(a.kind, Action::Kind::kFailed);
    EXPECT_THAT(a.status, StatusIs(absl::StatusCode::kAborted, HasSubstr("state id \"id\"")));
  }
  // The state table itself missing is still the first write's schema to make.
  auto store = MakeStore();
  int64_t clock = 0;
  MeltanoState s{"id", nlohmann::json::object(), nlohmann::json::parse("{\"a\":1}")};
  HoldLock(*store, "id", &clock, kVersion18);
  auto t = store->Set(s);
  Outcome o = Drive(*t,
                    {Q("insert_state", Err(404, 60, "Table meltano.state doesn't exist.")), Q("create_database", Ok()),
                     Q("create_state_table", Ok()), Q("create_lock_table", Ok()), Q("create_history_table", Ok()),
                     Q("create_history_buffer", Ok()), Q("create_history_view", Ok()),
                     Q("drop_unbuffered_history_view", Ok()), Q("insert_state", Ok())},
                    &clock);
  EXPECT_EQ(o.last.kind, Action::Kind::kDone);
  EXPECT_THAT(o.last.status, IsOk());
}

// ---- python_locks: a mixed fleet with the Python ClickHouse backend ----

std::unique_ptr<Store> MakePythonLocksStore() {
  StoreOptions o;
  o.lock = ScriptLock();
  o.python_locks = true;
  absl::StatusOr<std::unique_ptr<Store>> s = Store::Create(o);
  EXPECT_THAT(s, IsOk());
  return std::move(*s);
}

TEST(Store, PythonLocksReadTheBlocksLookMarkAndLookAgainBeforeWriting) {
  auto store = MakePythonLocksStore();
  int64_t clock = 0;
  MeltanoState incoming{"id", nlohmann::json::object(), nlohmann::json::parse(R"({"singer_state":{}})")};
  auto t = store->Set(incoming);
  // No wait anywhere: the block number read first, then the marker's own
  // part the only one after it.
  Outcome o = Drive(*t,
                    {kVersion18, Q("create_lock", Ok()),
                     Q("python_lock_blocks", Ok("41\t2\n"), "max(max_block_number)"),
                     Q("foreign_lock_rows", Ok(""), "NOT startsWith(lock_id, '!chstate:') AND NOT startsWith(lock_id, 'chstate:')"),
                     // Twice the 300 s window ahead: no Python row written meanwhile outlives it in a merge.
                     Q("insert_lock_marker", Ok(), "'!chstate:" + kLockId + "', now() + 600"),
                     Q("foreign_lock_rows_and_parts", Ok("1\t2\n"), "AND active AND max_block_number > 41"),
                     Q("insert_state", Ok()),
                     // The marker goes before the lock table: Python processes wait while it stands.
                     Q("delete_lock_marker", Ok(), "lock_id = '!chstate:" + kLockId + "'"), Q("inspect_lock", Mine()),
                     Q("drop_lock", Ok())},
                    &clock);
  ASSERT_EQ(o.last.kind, Action::Kind::kDone) << o.last.status;
  EXPECT_LT(clock, 1000) << "the claim waited for time to pass";
}

TEST(Store, PythonLocksYieldWhenAnyBlockCameBetweenTheLooks) {
  LockOptions lock = ScriptLock();
  lock.timeout_ms = 900;  // shorter than one retry wait (1 s): the first yield gives up
  StoreOptions opts;
  opts.lock = lock;
  opts.python_locks = true;
  auto store = *Store::Create(opts);
  int64_t clock = 0;
  auto t = store->AcquireLock("id");
  // No Python row in either look, but two parts came after block 41 (the
  // marker's and another): a Python candidate the marker may have merged
  // away. Yield, and give up saying so once the timeout has come.
  Outcome o = Drive(*t,
                    {kVersion18, Q("create_lock", Ok()), Q("python_lock_blocks", Ok("41\t2\n")),
                     Q("foreign_lock_rows", Ok("")), Q("insert_lock_marker", Ok()),
                     Q("foreign_lock_rows_and_parts", Ok("2\t2\n")), Q("delete_lock_marker", Ok()),
                     Q("inspect_lock", Mine()), Q("drop_lock", Ok())},
                    &clock);
  ASSERT_EQ(o.last.kind, Action::Kind::kFailed);
  EXPECT_THAT(o.last.status, StatusIs(absl::StatusCode::kAborted, HasSubstr("written to between chstate's two looks")));
  EXPECT_FALSE(store->LeaseValid("id", clock));
}

TEST(Store, PythonLocksYieldToAPythonHolderAndGiveUpNamingIt) {
  LockOptions lock = ScriptLock();
  lock.timeout_ms = 1500;  // room for one retry after the first attempt's wait (1 s)
  StoreOptions opts;
  opts.lock = lock;
  opts.python_locks = true;
  auto store = *Store::Create(opts);
  int64_t clock = 0;
  auto t = store->AcquireLock("id");
  // A Python row shows in the look after the marker: withdraw, release, wait,
  // try again; the second time a Python holder is there at once and the
  // timeout has come.
  Outcome o = Drive(*t,
                    {kVersion18, Q("create_lock", Ok()), Q("python_lock_blocks", Ok("7\t2\n")),
                     Q("foreign_lock_rows", Ok("")), Q("insert_lock_marker", Ok()),
                     Q("foreign_lock_rows_and_parts", Ok("6f1c-python\t1\n1\t2\n")),
                     Q("delete_lock_marker", Ok()), Q("inspect_lock", Mine()), Q("drop_lock", Ok()),
                     W(kDefaultLockRetryMs), Q("create_lock", Ok()), Q("python_lock_blocks", Ok("9\t2\n")),
                     Q("foreign_lock_rows", Ok("6f1c-python\t1\n")),
                     Q("delete_lock_marker", Ok()), Q("inspect_lock", Mine()), Q("drop_lock", Ok())},
                    &clock);
  ASSERT_EQ(o.last.kind, Action::Kind::kFailed);
  EXPECT_THAT(o.last.status, StatusIs(absl::StatusCode::kAborted,
                                      AllOf(HasSubstr("Python ClickHouse backend"), HasSubstr("6f1c-python"))));
  EXPECT_FALSE(store->LeaseValid("id", clock));
}

TEST(Store, PythonLocksAreRefusedInClusterMode) {
  StoreOptions o;
  o.lock = ScriptLock();
  o.python_locks = true;
  o.cluster.name = "c";
  EXPECT_THAT(Store::Create(o).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("python_locks needs one server")));
  o.python_locks = false;
  EXPECT_THAT(Store::Create(o).status(), IsOk());
}

TEST(Store, PythonLocksNeedAWindowTheirRowCanBeRenewedIn) {
  StoreOptions o;
  o.lock = ScriptLock();
  o.python_locks = true;
  o.lock.stale_ms = 601 * 1000;
  EXPECT_THAT(Store::Create(o).status(), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("at most 600 s")));
  o.python_locks = false;
  EXPECT_THAT(Store::Create(o).status(), IsOk());
}

TEST(Store, LockIsReleasedWhenTheBodyFails) {
  auto store = MakeStore();
  int64_t clock = 0;
  MeltanoState incoming{"id", nlohmann::json::parse(R"({"a":1})"), nlohmann::json::object()};
  auto t = store->Update(incoming);
  Outcome o = Drive(*t,
                    {kVersion18, Q("create_lock", Ok()), Q("get_state", Ok("")),
                     Q("insert_state", Err(500, 241, "Memory limit exceeded")),
                     Q("inspect_lock", Mine()), Q("drop_lock", Ok())},
                    &clock);
  ASSERT_EQ(o.last.kind, Action::Kind::kFailed);
  EXPECT_THAT(o.last.status, StatusIs(absl::StatusCode::kInternal, HasSubstr("Memory limit")));
}

TEST(Store, ContendedLockRetriesThenGivesUpWithTheId) {
  LockOptions lock = ScriptLock();
  lock.timeout_ms = 2500;
  lock.retry_ms = 1000;
  auto store = MakeStore(lock);
  int64_t clock = 0;
  auto t = store->AcquireLock("dev:busy");
  SqlResponse exists = Err(500, 57, "Table meltano.x already exists.");
  Outcome o = Drive(*t,
                    {kVersion18, Q("create_lock", exists), Q("inspect_lock", Held("other", 100, 105)),
                     // A failed announcement is harmless, and made again...
                     Q("announce_lock_waiter", Err(404, 60, "Table meltano.x doesn't exist."), "toUInt8(2)"),
                     W(1000), Q("create_lock", exists), Q("inspect_lock", Held("other", 100, 106)),
                     Q("announce_lock_waiter", Ok()), W(1000),
                     // ...but one that landed is not repeated to the same holder.
                     Q("create_lock", exists), Q("inspect_lock", Held("other", 100, 107)), W(-1),
                     Q("create_lock", exists), Q("inspect_lock", Held("other", 100, 108))},
                    &clock);
  ASSERT_EQ(o.last.kind, Action::Kind::kFailed);
  EXPECT_THAT(o.last.status, StatusIs(absl::StatusCode::kAborted, HasSubstr("dev:busy")));
  EXPECT_GE(clock, 2500);
}

// The lock's own rule for requests without an answer, seen alone: with one
// send per request (no resends by the task, core/task.h).
TransportPolicy SendOnce() {
  TransportPolicy p;
  p.attempts = 1;
  return p;
}

TEST(Store, UnreachableServerWhileLockingIsUnavailableNotBusy) {
  auto store = MakeStore({}, SendOnce());
  int64_t clock = 0;
  auto t = store->AcquireLock("dev:down");
  // The CREATE's fate is unknown, the look that would settle it gets no
  // answer, and neither does the next CREATE: the server is down.
  Outcome o = Drive(*t,
                    {kVersion18, Q("create_lock", Refused()), Q("inspect_lock", Refused()), W(1000),
                     Q("create_lock", Refused())},
                    &clock);
  ASSERT_EQ(o.last.kind, Action::Kind::kFailed);
  EXPECT_THAT(o.last.status, StatusIs(absl::StatusCode::kUnavailable, HasSubstr("connection refused")));
  EXPECT_THAT(o.last.status, StatusIs(absl::StatusCode::kUnavailable, HasSubstr("the lock was not taken")));
  EXPECT_THAT(o.last.status, StatusIs(absl::StatusCode::kUnavailable, HasSubstr("expires after")));
}

TEST(Store, TimeoutRightAfterALostRequestIsUnavailableNotBusy) {
  LockOptions lock = ScriptLock();
  lock.timeout_ms = 500;
  auto store = MakeStore(lock, SendOnce());
  int64_t clock = 0;
  auto t = store->AcquireLock("a");
  Action a = t->Start({clock, kRandom});
  a = t->OnResponse(Ok("18.16.1\t1\n"), {clock, kRandom});
  ASSERT_EQ(a.request.purpose, "foreign_lock_rows");
  a = t->OnResponse(Ok(""), {clock, kRandom});
  ASSERT_EQ(a.request.purpose, "create_lock");
  a = t->OnResponse(Refused(), {clock, kRandom});
  ASSERT_EQ(a.request.purpose, "inspect_lock");
  clock += 600;  // the refusals took longer than the whole timeout
  a = t->OnResponse(Refused(), {clock, kRandom});
  ASSERT_EQ(a.kind, Action::Kind::kFailed);
  EXPECT_THAT(a.status, StatusIs(absl::StatusCode::kUnavailable, HasSubstr("2 lock requests in a row")));
}

TEST(Store, AnswerBetweenLostRequestsKeepsTheLockAttemptGoing) {
  LockOptions lock = ScriptLock();
  lock.timeout_ms = 60000;
  auto store = MakeStore(lock, SendOnce());
  int64_t clock = 0;
  auto t = store->AcquireLock("a");
  SqlResponse exists = Err(500, 57, "exists");
  // Two lost requests, an answer, two more lost: never three in a row.
  Outcome o = Drive(*t,
                    {kVersion18, Q("create_lock", Refused()), Q("inspect_lock", Refused()), W(1000),
                     Q("create_lock", exists), Q("inspect_lock", Refused()), W(1000), Q("create_lock", Refused()),
                     Q("inspect_lock", Held("other", 100, 101)), Q("announce_lock_waiter", Ok()), W(1000),
                     Q("create_lock", Ok())},
                    &clock);
  ASSERT_EQ(o.last.kind, Action::Kind::kDone) << o.last.status;
}

TEST(Store, LockThatVanishedIsRetriedAtOnce) {
  auto store = MakeStore();
  int64_t clock = 0;
  auto t = store->AcquireLock("a");
  Outcome o = Drive(*t,
                    {kVersion18, Q("create_lock", Err(500, 57, "exists")), Q("inspect_lock", Ok("")),
                     Q("create_lock", Ok())},
                    &clock);
  ASSERT_EQ(o.last.kind, Action::Kind::kDone);
  EXPECT_EQ(o.last.result.lock_id, kLockId);
}

TEST(Store, LockTableGoneAtInspectionIsLikeNoLock) {
  auto store = MakeStore();
  int64_t clock = 0;
  auto t = store->AcquireLock("a");
  SqlResponse exists = Err(500, 57, "exists");
  SqlResponse gone = Err(404, 60, "Unknown table expression identifier");
  // Three quick retries, then an ordinary wait instead of an error.
  Outcome o = Drive(*t,
                    {kVersionModern, Q("create_lock", exists), Q("inspect_lock", gone), Q("create_lock", exists),
                     Q("inspect_lock", gone), Q("create_lock", exists), Q("inspect_lock", gone),
                     Q("create_lock", exists), Q("inspect_lock", gone), W(1000), Q("create_lock", Ok())},
                    &clock);
  ASSERT_EQ(o.last.kind, Action::Kind::kDone) << o.last.status;
}

TEST(Store, LockTableBeingDroppedIsLikeNoLock) {
  auto store = MakeStore();
  int64_t clock = 0;
  auto t = store->AcquireLock("a");
  Outcome o = Drive(*t,
                    {kVersion18, Q("create_lock", Err(500, 57, "exists")),
                     Q("inspect_lock", Err(500, 218, "Table is dropped")), Q("create_lock", Ok())},
                    &clock);
  ASSERT_EQ(o.last.kind, Action::Kind::kDone) << o.last.status;
}

TEST(Store, InconclusiveLookBeforeReleaseIsRetried) {
  auto store = MakeStore();
  int64_t clock = 0;
  auto t = store->AcquireLock("a");
  Outcome o = Drive(*t, {kVersion18, Q("create_lock", Ok())}, &clock);
  ASSERT_EQ(o.last.kind, Action::Kind::kDone);
  auto r = store->ReleaseLock("a", o.last.result.lock_id);
  Outcome o2 = Drive(*r,
                     {Q("inspect_lock", Err(500, 171, "Block structure mismatch in UNION stream")),
                      Q("inspect_lock", Mine()), Q("drop_lock", Ok())},
                     &clock);
  EXPECT_EQ(o2.last.kind, Action::Kind::kDone) << o2.last.status;
}

TEST(Store, StaleLockIsTakenOverOnlyAfterTheWindow) {
  LockOptions lock = ScriptLock();
  lock.stale_ms = 300000;
  auto store = MakeStore(lock);
  int64_t clock = 0;
  // Last renewed 300 s ago by the server's clock: not yet stale, wait.
  auto t = store->AcquireLock("a");
  Outcome o = Drive(
      *t, {kVersion18, Q("create_lock", Err(500, 57, "exists")), Q("inspect_lock", Held("dead", 1000, 1300)),
          Q("announce_lock_waiter", Ok()), W(-1)},
      &clock);
  // 301 s: entombed under a name unique to that instance, then created.
  auto t2 = store->AcquireLock("a");
  Outcome o2 = Drive(*t2,
                     {Q("create_lock", Err(500, 57, "exists")), Q("inspect_lock", Held("dead", 1000, 1301)),
                      Q("entomb_lock", Ok(), "_dead_"), Q("create_lock", Ok())},
                     &clock);
  ASSERT_EQ(o2.last.kind, Action::Kind::kDone) << o2.last.status;
}

TEST(Store, TakerUsesTheHoldersLongerStaleWindow) {
  LockOptions lock = ScriptLock();
  lock.stale_ms = 1000;  // this contender is configured with a short window...
  auto store = MakeStore(lock);
  int64_t clock = 0;
  auto t = store->AcquireLock("a");
  // ...but the holder wrote 300 s into its lock: 5 s old is not stale.
  Outcome o = Drive(*t,
                    {kVersion18, Q("create_lock", Err(500, 57, "exists")), Q("inspect_lock", Held("h", 100, 105)),
                     Q("announce_lock_waiter", Ok())},
                    &clock);
  EXPECT_EQ(o.last.kind, Action::Kind::kWait);
}

TEST(Store, LateTakerCannotEntombANewerLock) {
  auto store = MakeStore();
  int64_t clock = 0;
  auto t = store->AcquireLock("a");
  // The tombstone for that instance exists: another taker won; look again.
  Outcome o = Drive(*t,
                    {kVersion18, Q("create_lock", Err(500, 57, "exists")), Q("inspect_lock", Held("dead", 1, 999)),
                     Q("entomb_lock", Err(500, 57, "Table ..._dead_... already exists.")),
                     Q("inspect_lock", Held("fresh", 999, 999)), Q("announce_lock_waiter", Ok()), W(1000)},
                    &clock);
  EXPECT_EQ(o.last.kind, Action::Kind::kRunSql);
}

TEST(Store, ReleaseByANonHolderSendsNothing) {
  auto store = MakeStore();
  auto t = store->ReleaseLock("a", "never-acquired");
  Action a = t->Start({0, kRandom});
  EXPECT_THAT(a.status, StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("only the process that acquired")));
}

TEST(Store, ReleaseOfALockTakenOverReportsTheLoss) {
  auto store = MakeStore();
  int64_t clock = 0;
  auto t = store->AcquireLock("a");
  Outcome o = Drive(*t, {kVersion18, Q("create_lock", Ok())}, &clock);
  ASSERT_EQ(o.last.kind, Action::Kind::kDone);
  auto r = store->ReleaseLock("a", o.last.result.lock_id);
  Outcome o2 = Drive(*r, {Q("inspect_lock", Held("someone-else", 5, 6))}, &clock);
  EXPECT_THAT(o2.last.status, StatusIs(absl::StatusCode::kAborted, HasSubstr("no longer ours")));
}

TEST(Store, WriteAfterTheLeaseRanOutIsNotSent) {
  LockOptions lock = ScriptLock();
  lock.stale_ms = 3000;
  auto store = MakeStore(lock);
  int64_t clock = 0;
  MeltanoState incoming{"id", nlohmann::json::parse(R"({"a":1})"), nlohmann::json::object()};
  auto t = store->Update(incoming);
  Action a = t->Start({clock, kRandom});
  a = t->OnResponse(Ok("18.16.1\t1\n"), {clock, kRandom});
  ASSERT_EQ(a.request.purpose, "foreign_lock_rows");
  a = t->OnResponse(Ok(), {clock, kRandom});
  ASSERT_EQ(a.request.purpose, "create_lock");
  a = t->OnResponse(Ok(), {clock, kRandom});
  ASSERT_EQ(a.request.purpose, "get_state");
  clock += 5000;  // the read took longer than the lease
  a = t->OnResponse(Ok(""), {clock, kRandom});
  // No insert: the release notices the lease is gone and leaves the lock.
  ASSERT_EQ(a.kind, Action::Kind::kFailed);
  EXPECT_THAT(a.status, StatusIs(absl::StatusCode::kAborted, HasSubstr("nothing was written")));
}

TEST(Store, PlainWritesToAnIdWhoseLockThisStoreHoldsRespectTheLease) {
  // Meltano's update() is acquire_lock, then get and set as separate calls.
  LockOptions lock = ScriptLock();
  lock.stale_ms = 3000;
  auto store = MakeStore(lock);
  int64_t clock = 0;
  auto acquire = store->AcquireLock("id");
  ASSERT_EQ(Drive(*acquire, {kVersion18, Q("create_lock", Ok())}, &clock).last.kind, Action::Kind::kDone);
  MeltanoState state{"id", nlohmann::json::object(), nlohmann::json::parse(R"({"a":1})")};
  // Within the lease the write goes out.
  auto inside = store->Set(state);
  EXPECT_EQ(Drive(*inside, {Q("insert_state", Ok())}, &clock).last.kind, Action::Kind::kDone);
  // Another id is not concerned by the lease: its write takes its own lock.
  clock += 5000;
  MeltanoState other{"other", nlohmann::json::object(), nlohmann::json::parse(R"({"b":1})")};
  auto unrelated = store->Set(other);
  EXPECT_EQ(Drive(*unrelated,
                  {Q("create_lock", Ok()), Q("insert_state", Ok()), Q("inspect_lock", Held(kLockId, 105, 105)),
                   Q("drop_lock", Ok())},
                  &clock)
                .last.kind,
            Action::Kind::kDone);
  // After it, neither a set nor a delete of the held id is sent.
  auto late = store->Set(state);
  Action a = late->Start({clock, kRandom});
  ASSERT_EQ(a.kind, Action::Kind::kFailed);
  EXPECT_THAT(a.status, StatusIs(absl::StatusCode::kAborted, HasSubstr("nothing was written")));
  auto late_delete = store->Delete("id");
  a = late_delete->Start({clock, kRandom});
  ASSERT_EQ(a.kind, Action::Kind::kFailed);
  EXPECT_THAT(a.status, StatusIs(absl::StatusCode::kAborted, HasSubstr("ran out before the write")));
}

// ---- linger_locks: the lock off the hot path ----

std::unique_ptr<Store> MakeLingeringStore(LockOptions lock = {}) {
  StoreOptions o;
  o.lock = ScriptLock();
  o.lock = lock;
  o.linger_locks = true;
  absl::StatusOr<std::unique_ptr<Store>> s = Store::Create(o);
  EXPECT_THAT(s, IsOk());
  return std::move(*s);
}

std::string Acquired(Store& store, int64_t* clock, std::vector<Exchange> script) {
  auto t = store.AcquireLock("id");
  Outcome o = Drive(*t, script, clock);
  EXPECT_EQ(o.last.kind, Action::Kind::kDone) << o.last.status;
  return o.last.result.lock_id;
}

TEST(LingeringStore, AReleasedLockIsTakenBackWithNoRequest) {
  auto store = MakeLingeringStore();
  int64_t clock = 0;
  const std::string lock_id = Acquired(*store, &clock, {kVersion18, Q("create_lock", Ok())});
  MeltanoState state{"id", nlohmann::json::object(), nlohmann::json::parse(R"({"a":1})")};
  for (int i = 0; i < 3; ++i) {
    auto set = store->Set(state);
    ASSERT_EQ(Drive(*set, {Q("insert_state", Ok())}, &clock).last.kind, Action::Kind::kDone);
    auto release = store->ReleaseLock("id", lock_id);
    Outcome released = Drive(*release, {}, &clock);  // no request
    ASSERT_EQ(released.last.kind, Action::Kind::kDone) << released.last.status;
    // The host is told to call back by the time the lingering lock is due to go.
    ASSERT_TRUE(released.last.result.next_timeout_ms.has_value());
    EXPECT_LE(*released.last.result.next_timeout_ms, clock + kDefaultLockLingerMs);
    EXPECT_EQ(Acquired(*store, &clock, {}), lock_id);  // the same lock, no request
  }
  // Held by its user again: a release that is not the last stays lingering.
  EXPECT_TRUE(store->LeaseValid("id", clock));
}

TEST(LingeringStore, AnIdleLingeringLockGoesAtATickAndAtReleaseLingering) {
  auto store = MakeLingeringStore();
  int64_t clock = 0;
  std::string lock_id = Acquired(*store, &clock, {kVersion18, Q("create_lock", Ok())});
  ASSERT_EQ(Drive(*store->ReleaseLock("id", lock_id), {}, &clock).last.kind, Action::Kind::kDone);
  auto early = store->Tick();
  EXPECT_EQ(Drive(*early, {}, &clock).last.kind, Action::Kind::kDone);  // not idle long enough: nothing sent
  clock += kDefaultLockLingerMs;
  auto tick = store->Tick();
  Outcome o = Drive(*tick, {Q("inspect_lock", Mine()), Q("drop_lock", Ok())}, &clock);
  ASSERT_EQ(o.last.kind, Action::Kind::kDone) << o.last.status;
  EXPECT_FALSE(o.last.result.next_timeout_ms.has_value());
  // Gone: the next acquisition creates the lock again.
  lock_id = Acquired(*store, &clock, {Q("create_lock", Ok())});
  ASSERT_EQ(Drive(*store->ReleaseLock("id", lock_id), {}, &clock).last.kind, Action::Kind::kDone);
  auto all = store->ReleaseLingering();
  o = Drive(*all, {Q("inspect_lock", Mine()), Q("drop_lock", Ok())}, &clock);
  ASSERT_EQ(o.last.kind, Action::Kind::kDone) << o.last.status;
  EXPECT_EQ(o.last.result.count, 1);
}

TEST(LingeringStore, AHolderThatSeesAWaiterYieldsAndStaysAway) {
  LockOptions lock = ScriptLock();
  lock.retry_ms = 1000;
  auto store = MakeLingeringStore(lock);
  int64_t clock = 0;
  const std::string lock_id = Acquired(*store, &clock, {kVersion18, Q("create_lock", Ok())});
  clock += kDefaultLockWaiterCheckMs;  // time for a look
  const int64_t looked = clock + 3;    // when the look's answer came (3 ms a round trip)
  SqlResponse waiter = Ok("waiter-lock-id\t1\n");
  auto release = store->ReleaseLock("id", lock_id);
  Outcome o = Drive(*release,
                    {Q("lock_waiters", waiter, "WHERE seq = 2"), Q("inspect_lock", Mine()), Q("drop_lock", Ok())},
                    &clock);
  ASSERT_EQ(o.last.kind, Action::Kind::kDone) << o.last.status;
  // The next acquisition waits out the waiter's next attempt before trying.
  auto again = store->AcquireLock("id");
  Outcome o2 = Drive(*again, {W(-1), Q("create_lock", Ok())}, &clock);
  ASSERT_EQ(o2.last.kind, Action::Kind::kDone) << o2.last.status;
  EXPECT_GE(clock, looked + lock.retry_ms + kDefaultLockYieldMarginMs);
}

TEST(LingeringStore, AnIdleLingeringLockIsGivenUpToAWaiterAtTheNextLook) {
  auto store = MakeLingeringStore();
  int64_t clock = 0;
  const std::string lock_id = Acquired(*store, &clock, {kVersion18, Q("create_lock", Ok())});
  Outcome released = Drive(*store->ReleaseLock("id", lock_id), {}, &clock);
  ASSERT_EQ(released.last.kind, Action::Kind::kDone);
  // The host is called back for a look before the lingering time is over.
  ASSERT_TRUE(released.last.result.next_timeout_ms.has_value());
  EXPECT_LE(*released.last.result.next_timeout_ms, clock + kDefaultLockWaiterCheckMs);
  clock = *released.last.result.next_timeout_ms;
  Outcome nobody = Drive(*store->Tick(), {Q("lock_waiters", Ok(""))}, &clock);
  ASSERT_EQ(nobody.last.kind, Action::Kind::kDone) << nobody.last.status;
  clock = *nobody.last.result.next_timeout_ms;
  Outcome o = Drive(*store->Tick(),
                    {Q("lock_waiters", Ok("w\t1\n")), Q("inspect_lock", Mine()), Q("drop_lock", Ok())}, &clock);
  ASSERT_EQ(o.last.kind, Action::Kind::kDone) << o.last.status;
  EXPECT_FALSE(o.last.result.next_timeout_ms.has_value());
  // And it stays away while the waiter takes it.
  auto again = store->AcquireLock("id");
  Action a = again->Start({clock, kRandom});
  EXPECT_EQ(a.kind, Action::Kind::kWait);
}

TEST(LingeringStore, NoWaiterKeepsItLingeringAndTheNextLookWaits) {
  auto store = MakeLingeringStore();
  int64_t clock = 0;
  const std::string lock_id = Acquired(*store, &clock, {kVersion18, Q("create_lock", Ok())});
  clock += kDefaultLockWaiterCheckMs;
  ASSERT_EQ(Drive(*store->ReleaseLock("id", lock_id), {Q("lock_waiters", Ok(""))}, &clock).last.kind,
            Action::Kind::kDone);
  // Taken back and released again at once: no second look yet.
  EXPECT_EQ(Acquired(*store, &clock, {}), lock_id);
  ASSERT_EQ(Drive(*store->ReleaseLock("id", lock_id), {}, &clock).last.kind, Action::Kind::kDone);
  // A failed look counts as a waiter: the lock is released for real.
  clock += kDefaultLockWaiterCheckMs;
  EXPECT_EQ(Acquired(*store, &clock, {}), lock_id);
  Outcome o = Drive(*store->ReleaseLock("id", lock_id),
                    {Q("lock_waiters", Err(500, 159, "Timeout exceeded")), Q("inspect_lock", Mine()),
                     Q("drop_lock", Ok())},
                    &clock);
  EXPECT_EQ(o.last.kind, Action::Kind::kDone) << o.last.status;
}

TEST(LingeringStore, ALingeringLockPastItsLeaseIsForgottenNotUsed) {
  LockOptions lock = ScriptLock();
  lock.stale_ms = 3000;
  auto store = MakeLingeringStore(lock);
  int64_t clock = 0;
  const std::string lock_id = Acquired(*store, &clock, {kVersion18, Q("create_lock", Ok())});
  ASSERT_EQ(Drive(*store->ReleaseLock("id", lock_id), {}, &clock).last.kind, Action::Kind::kDone);
  clock += 5000;  // the process was paused past the lease, no tick ran
  // Not taken back: a fresh acquisition (the old table is someone's to take over).
  auto t = store->AcquireLock("id");
  Action a = t->Start({clock, kRandom});
  ASSERT_EQ(a.kind, Action::Kind::kRunSql);
  EXPECT_EQ(a.request.purpose, "foreign_lock_rows");
  // And a write does not go out under it.
  MeltanoState state{"id", nlohmann::json::object(), nlohmann::json::parse(R"({"a":1})")};
  auto set = store->Set(state);
  a = set->Start({clock, kRandom});
  ASSERT_EQ(a.kind, Action::Kind::kRunSql);
  EXPECT_EQ(a.request.purpose, "foreign_lock_rows");  // a lock of its own, as with no lock held
}

TEST(Store, LegacyDeleteWaitsForItsMutation) {
  auto store = MakeStore();
  int64_t clock = 0;
  HoldLock(*store, "a", &clock, kVersion18);
  auto t = store->Delete("a");
  Outcome o = Drive(*t,
                    {Q("delete_state", Ok(), "ALTER TABLE"), Q("pending_mutations", Ok("1\t1\n")), W(5),
                     Q("pending_mutations", Ok("1\t1\n")), W(10), Q("pending_mutations", Ok("0\t1\n"))},
                    &clock);
  EXPECT_EQ(o.last.kind, Action::Kind::kDone) << o.last.status;
}

TEST(Store, InitCreatesTheSchemaAndDropsOldTombstones) {
  auto store = MakeStore();
  int64_t clock = 0;
  auto t = store->Init();
  Outcome o = Drive(*t,
                    {kVersion18, Q("create_database", Ok()), Q("create_state_table", Ok()), Q("create_lock_table", Ok()),
                     Q("create_history_table", Ok()), Q("create_history_buffer", Ok()), Q("create_history_view", Ok()),
                     Q("drop_unbuffered_history_view", Ok()),
                     Q("expire_history", Ok(), "DELETE WHERE updated_at < now() - INTERVAL 30 DAY"),
                     Q("trim_history", Ok(), "arraySlice(arrayReverseSort(groupArray(updated_at)), 1001)"),
                     Q("list_tombstones", Ok("state_lock_0000000000000001_dead_0000000000000002\t1\n"), "now() - 600"),
                     Q("drop_table", Ok(), "DROP TABLE IF EXISTS `meltano`.`state_lock_0000000000000001_dead_")},
                    &clock);
  ASSERT_EQ(o.last.kind, Action::Kind::kDone) << o.last.status;
  EXPECT_EQ(o.last.result.count, 1);
}

TEST(Store, ModernDeleteIsOneStatement) {
  auto store = MakeStore();
  int64_t clock = 0;
  HoldLock(*store, "a", &clock, kVersionModern);
  auto t = store->Delete("a");
  Outcome o = Drive(*t, {Q("delete_state", Ok(), "DELETE FROM")}, &clock);
  EXPECT_EQ(o.last.kind, Action::Kind::kDone);
}

TEST(Store, ClearAllCountsThenTruncates) {
  auto store = MakeStore();
  int64_t clock = 0;
  auto t = store->ClearAll();
  Outcome o = Drive(*t, {kVersion18, Q("count_states", Ok("7\t1\n")), Q("truncate_states", Ok())}, &clock);
  ASSERT_EQ(o.last.kind, Action::Kind::kDone);
  EXPECT_EQ(o.last.result.count, 7);
}

// ---- the state history kept within its limits as writes go ----

// Random bytes whose byte 15 picks a write for the history's upkeep.
std::string UpkeepRandom() {
  std::string r = kRandom;
  r[15] = static_cast<char>(kHistoryUpkeepEvery);  // a multiple: this write looks
  return r;
}

TEST(Store, OneWriteInSoManyTrimsItsIdsVersionsBeyondTheLimits) {
  auto store = MakeStore();
  int64_t clock = 0;
  MeltanoState state{"dev:a", nlohmann::json::object(), nlohmann::json{{"singer_state", 1}}};
  HoldLock(*store, "dev:a", &clock, kVersion18);  // the writes' own requests alone
  // Most writes (the random byte not a multiple of kHistoryUpkeepEvery) are
  // one INSERT.
  auto t = store->Set(state);
  Outcome o = Drive(*t, {Q("insert_state", Ok())}, &clock);
  ASSERT_EQ(o.last.kind, Action::Kind::kDone) << o.last.status;
  // The one in so many counts the id's versions; beyond the limit, the
  // versions up to the newest one beyond it go, and those past the days.
  t = store->Set(state);
  o = Drive(*t,
            {Q("insert_state", Ok()),
             Q("history_over_limits", Ok("1064\t0\t1796155031000\n"),
               "SELECT count(), countIf(updated_at < now() - INTERVAL 30 DAY), toUInt64(toUnixTimestamp("
               "arrayElement(arrayReverseSort(groupArray(updated_at)), 1001))) * 1000 FROM `meltano`.`state_history` "
               "WHERE state_id = 'dev:a'"),
             Q("trim_history_of", Ok(),
               "ALTER TABLE `meltano`.`state_history` DELETE WHERE state_id = 'dev:a' AND (updated_at <= "
               "toDateTime(1796155031) OR updated_at < now() - INTERVAL 30 DAY)")},
            &clock, UpkeepRandom());
  ASSERT_EQ(o.last.kind, Action::Kind::kDone) << o.last.status;
  // Within both limits: nothing removed.
  t = store->Set(state);
  o = Drive(*t, {Q("insert_state", Ok()), Q("history_over_limits", Ok("999\t0\t0\n"))}, &clock, UpkeepRandom());
  ASSERT_EQ(o.last.kind, Action::Kind::kDone) << o.last.status;
  // Versions past the days alone.
  t = store->Set(state);
  o = Drive(*t,
            {Q("insert_state", Ok()), Q("history_over_limits", Ok("12\t3\t0\n")),
             Q("trim_history_of", Ok(), "state_id = 'dev:a' AND (updated_at < now() - INTERVAL 30 DAY)")},
            &clock, UpkeepRandom());
  ASSERT_EQ(o.last.kind, Action::Kind::kDone) << o.last.status;
  // A failed look or trim leaves the write done.
  t = store->Set(state);
  o = Drive(*t,
            {Q("insert_state", Ok()), Q("history_over_limits", Ok("2000\t0\t1796155031000\n")),
             Q("trim_history_of", Err(500, 241, "Memory limit exceeded"))},
            &clock, UpkeepRandom());
  EXPECT_EQ(o.last.kind, Action::Kind::kDone) << o.last.status;
  t = store->Set(state);
  o = Drive(*t, {Q("insert_state", Ok()), Q("history_over_limits", Err(404, 60, "Table doesn't exist."))}, &clock,
            UpkeepRandom());
  EXPECT_EQ(o.last.kind, Action::Kind::kDone) << o.last.status;
}

// One server: the history view writes into a Buffer, so a read of the
// history first writes the buffer into its table; a schema from before the
// buffer (code 60) or a user who may not OPTIMIZE reads the table as it is.
TEST(Store, AHistoryReadFlushesTheBufferFirstAndGoesOnWithoutIt) {
  for (const Exchange& flush : {Q("flush_history", Ok(), "OPTIMIZE TABLE `meltano`.`state_history_buffer`"),
                                Q("flush_history", Err(404, 60, "Table meltano.state_history_buffer doesn't exist.")),
                                Q("flush_history", Err(500, 164, "Cannot execute query in readonly mode"))}) {
    auto store = MakeStore();
    int64_t clock = 0;
    auto t = store->History("dev:a", 5);
    Outcome o = Drive(*t,
                      {kVersion18, flush,
                       Q("list_history", Ok("1796155031000\teaab4add\t2026-12-01 19:57:11\t\\N\t{\"n\":1}\n"),
                         "FROM `meltano`.`state_history` WHERE"),
                       Q("get_state", Ok("\\N\t{\"n\":1}\n"))},
                      &clock);
    ASSERT_EQ(o.last.kind, Action::Kind::kDone) << o.last.status;
    ASSERT_TRUE(o.last.result.versions.has_value());
    ASSERT_EQ(o.last.result.versions->size(), 1u);
    EXPECT_TRUE((*o.last.result.versions)[0].current);
  }
}

TEST(Store, ARollbackFlushesTheHistoryBufferBeforeReadingTheVersion) {
  auto store = MakeStore();
  int64_t clock = 0;
  auto t = store->Rollback("dev:a", "1796155031000-eaab4add");
  Outcome o = Drive(*t,
                    {kVersion18, Q("create_lock", Ok()), Q("flush_history", Err(404, 60, "Table meltano.state_history_buffer doesn't exist.")),
                     Q("get_history_version", Ok("1796155031000\teaab4add\t2026-12-01 19:57:11\t\\N\t{\\\"n\\\":1}\n")),
                     Q("insert_state", Ok(), "'{\"n\":1}'"), Q("inspect_lock", Held(MakeLockId(kRandom), 100, 100)),
                     Q("drop_lock", Ok())},
                    &clock);
  ASSERT_EQ(o.last.kind, Action::Kind::kDone) << o.last.status;
}

TEST(Store, HistoryUpkeepFollowsTheSettings) {
  StoreOptions opts;
  opts.history_versions = 0;  // no limit by count: only the days
  opts.history_days = 7;
  absl::StatusOr<std::unique_ptr<Store>> store = Store::Create(opts);
  ASSERT_THAT(store, IsOk());
  int64_t clock = 0;
  MeltanoState state{"dev:a", nlohmann::json::object(), nlohmann::json{{"singer_state", 1}}};
  auto t = (*store)->Update(state);
  Outcome o = Drive(*t,
                    {kVersionModern, Q("create_lock", Ok()), Q("get_state", Ok("")), Q("insert_state", Ok()),
                     Q("history_over_limits", Ok("9000\t1\t0\n"), "INTERVAL 7 DAY), toUInt64(0) FROM"),
                     Q("trim_history_of", Ok(), "ALTER TABLE `meltano`.`state_history` DELETE WHERE state_id = "
                                                "'dev:a' AND (updated_at < now() - INTERVAL 7 DAY)"),
                     Q("inspect_lock", Held(MakeLockId(UpkeepRandom()), 100, 100)), Q("drop_lock", Ok())},
                    &clock, UpkeepRandom());
  ASSERT_EQ(o.last.kind, Action::Kind::kDone) << o.last.status;
  // Without a history, no look.
  opts.history_days = 0;
  store = Store::Create(opts);
  ASSERT_THAT(store, IsOk());
  HoldLock(**store, "dev:a", &clock, kVersionModern);
  t = (*store)->Set(state);
  o = Drive(*t, {Q("insert_state", Ok())}, &clock, UpkeepRandom());
  EXPECT_EQ(o.last.kind, Action::Kind::kDone) << o.last.status;
}

// ---- export and import (Meltano's get_all / set_all) ----

// Ids of a page, for comparing.
std::vector<std::string> Ids(const Result& r) {
  std::vector<std::string> ids;
  for (const MeltanoState& s : r.states.value_or(std::vector<MeltanoState>{})) ids.push_back(s.state_id);
  return ids;
}

TEST(Store, ExportReadsPagesAsRangesOfASampleOfTheIds) {
  auto store = MakeStore();
  int64_t clock = 0;
  // The first page samples the id column for boundaries, then reads up to
  // the first boundary.
  auto t = store->ExportPage(std::string("dev:*"), std::nullopt, 2);
  Outcome o = Drive(*t,
                    {kVersion18,
                     Q("sample_state_ids", Ok("dev:c\t1\ndev:e\t1\n"),
                       "FROM `meltano`.`state` WHERE cityHash64(state_id) % 1000 = 0 AND length(state_id) <= 1024 AND "
                       "state_id LIKE 'dev:%' GROUP BY state_id ORDER BY state_id LIMIT 10000"),
                     Q("export_states", Ok("dev:a\t{\"p\":1}\t\\N\ndev:b\t\\N\t{\"singer_state\":{}}\n"),
                       "FINAL WHERE state_id LIKE 'dev:%' AND state_id <= 'dev:c' ORDER BY state_id LIMIT 2")},
                    &clock);
  ASSERT_EQ(o.last.kind, Action::Kind::kDone) << o.last.status;
  ASSERT_TRUE(o.last.result.states.has_value());
  ASSERT_EQ(Ids(o.last.result), (std::vector<std::string>{"dev:a", "dev:b"}));
  EXPECT_EQ((*o.last.result.states)[0].partial, nlohmann::json::parse("{\"p\":1}"));
  EXPECT_TRUE((*o.last.result.states)[0].completed.empty());
  EXPECT_EQ((*o.last.result.states)[1].completed, nlohmann::json::parse("{\"singer_state\":{}}"));
  EXPECT_TRUE(o.last.result.more);
  // Full: the next page goes on inside the same range, with no new sample.
  auto next = store->ExportPage(std::string("dev:*"), std::string("dev:b"), 2);
  o = Drive(*next, {Q("export_states", Ok("dev:c\t\\N\t{}\n"), "state_id > 'dev:b' AND state_id <= 'dev:c' ORDER")},
            &clock);
  ASSERT_EQ(o.last.kind, Action::Kind::kDone) << o.last.status;
  EXPECT_EQ(Ids(o.last.result), std::vector<std::string>{"dev:c"});
  EXPECT_TRUE(o.last.result.more) << "a short page of a range that is not the last";
  // Then the next range, and past the last boundary the rest to the end.
  next = store->ExportPage(std::string("dev:*"), std::string("dev:c"), 2);
  o = Drive(*next, {Q("export_states", Ok("dev:d\t\\N\t{}\n"), "state_id > 'dev:c' AND state_id <= 'dev:e' ORDER")},
            &clock);
  ASSERT_EQ(o.last.kind, Action::Kind::kDone) << o.last.status;
  EXPECT_TRUE(o.last.result.more);
  next = store->ExportPage(std::string("dev:*"), std::string("dev:d"), 2);
  o = Drive(*next, {Q("export_states", Ok("dev:f\t\\N\t{}\n"), "state_id > 'dev:d' ORDER BY state_id LIMIT 2")},
            &clock);
  ASSERT_EQ(o.last.kind, Action::Kind::kDone) << o.last.status;
  EXPECT_EQ(Ids(o.last.result), std::vector<std::string>{"dev:f"});
  EXPECT_FALSE(o.last.result.more) << "a short page to the end is the last";
}

TEST(Store, ExportNeverReturnsAnEmptyPageWhileMoreFollow) {
  auto store = MakeStore();
  int64_t clock = 0;
  auto t = store->ExportPage(std::nullopt, std::nullopt, 5);
  Outcome o = Drive(*t,
                    {kVersion18, Q("sample_state_ids", Ok("b\t1\nd\t1\n")),
                     Q("export_states", Ok(""), "WHERE state_id <= 'b' ORDER"),  // deleted since the sample
                     Q("export_states", Ok("c\t\\N\t{}\n"), "WHERE state_id > 'b' AND state_id <= 'd' ORDER")},
                    &clock);
  ASSERT_EQ(o.last.kind, Action::Kind::kDone) << o.last.status;
  EXPECT_EQ(Ids(o.last.result), std::vector<std::string>{"c"});
  EXPECT_TRUE(o.last.result.more);
  // Every range empty to the end: an empty last page.
  auto next = store->ExportPage(std::nullopt, std::string("c"), 5);
  o = Drive(*next, {Q("export_states", Ok(""), "WHERE state_id > 'c' ORDER BY")}, &clock);
  ASSERT_EQ(o.last.kind, Action::Kind::kDone) << o.last.status;
  EXPECT_TRUE(Ids(o.last.result).empty());
  EXPECT_FALSE(o.last.result.more);
}

TEST(Store, ExportSamplesAgainForAnotherExportAndWhenItsBoundariesRunOut) {
  auto store = MakeStore();
  int64_t clock = 0;
  auto t = store->ExportPage(std::nullopt, std::nullopt, 1);
  Outcome o = Drive(*t, {kVersion18, Q("sample_state_ids", Ok("b\t1\n")), Q("export_states", Ok("a\t\\N\t{}\n"))},
                    &clock);
  ASSERT_EQ(o.last.kind, Action::Kind::kDone) << o.last.status;
  // A page after an id that is not where this export stands: a new sample
  // from there.
  auto other = store->ExportPage(std::nullopt, std::string("x"), 1);
  o = Drive(*other,
            {Q("sample_state_ids", Ok(""), "AND state_id > 'x' GROUP BY"),
             Q("export_states", Ok("y\t\\N\t{}\n"), "WHERE state_id > 'x' ORDER BY")},
            &clock);
  ASSERT_EQ(o.last.kind, Action::Kind::kDone) << o.last.status;
  EXPECT_TRUE(o.last.result.more) << "a full page";
  // A glob other than the export's: afresh too.
  other = store->ExportPage(std::string("y*"), std::string("y"), 1);
  o = Drive(*other, {Q("sample_state_ids", Ok(""), "LIKE 'y%' AND state_id > 'y'"), Q("export_states", Ok(""))},
            &clock);
  ASSERT_EQ(o.last.kind, Action::Kind::kDone) << o.last.status;
  EXPECT_FALSE(o.last.result.more);
  // A sample of kExportSampleCount ids may not reach the end: once they are
  // read, the export samples again from where it stands.
  std::string many;
  for (int i = 0; i < kExportSampleCount; ++i) absl::StrAppend(&many, absl::StrFormat("k%05d\t1\n", i));
  auto big = store->ExportPage(std::nullopt, std::nullopt, kDefaultExportPageStates);
  o = Drive(*big, {Q("sample_state_ids", Ok(many)), Q("export_states", Ok("k00000\t\\N\t{}\n"), "<= 'k00000'")},
            &clock);
  ASSERT_EQ(o.last.kind, Action::Kind::kDone) << o.last.status;
  std::string after = "k00000";
  int pages = 0;
  while (true) {
    auto page = store->ExportPage(std::nullopt, after, kDefaultExportPageStates);
    Action a = page->Start({clock, kRandom});
    ASSERT_EQ(a.kind, Action::Kind::kRunSql);
    if (a.request.purpose == "sample_state_ids") {
      EXPECT_THAT(a.request.sql, HasSubstr(absl::StrCat("state_id > '", after, "'")));
      EXPECT_EQ(after, absl::StrFormat("k%05d", kExportSampleCount - 1)) << "sampled again only at the last boundary";
      break;
    }
    ASSERT_EQ(a.request.purpose, "export_states");
    ASSERT_LT(++pages, kExportSampleCount) << "never sampled again";
    // One state per range: the last boundary the page asked for.
    std::string upto = a.request.sql.substr(a.request.sql.find("<= '") + 4, 6);
    a = page->OnResponse(Ok(absl::StrCat(upto, "\t\\N\t{}\n")), {clock, kRandom});
    ASSERT_EQ(a.kind, Action::Kind::kDone) << a.status;
    after = upto;
  }
}

TEST(Store, ExportPagesHoldAboutTheByteBudget) {
  auto store = MakeStore();
  int64_t clock = 0;
  std::string bounds;
  for (int i = 1; i <= 40; ++i) absl::StrAppend(&bounds, absl::StrFormat("b%02d\t1\n", i));
  auto t = store->ExportPage(std::nullopt, std::nullopt, 20 * kExportSampleEvery);
  // Small states: the next page takes as many ranges as the state limit allows.
  Outcome o = Drive(*t, {kVersion18, Q("sample_state_ids", Ok(bounds)),
                         Q("export_states", Ok("a\t\\N\t{}\nb01\t\\N\t{}\n"), "WHERE state_id <= 'b01' ORDER")},
                    &clock);
  ASSERT_EQ(o.last.kind, Action::Kind::kDone) << o.last.status;
  auto next = store->ExportPage(std::nullopt, std::string("b01"), 20 * kExportSampleEvery);
  const std::string big(kDefaultExportPageBytes / 4, 'x');
  o = Drive(*next, {Q("export_states", Ok(absl::StrCat("b02\t\\N\t{\"k\":\"", big, "\"}\n")),
                      "state_id > 'b01' AND state_id <= 'b21' ORDER")},
            &clock);
  ASSERT_EQ(o.last.kind, Action::Kind::kDone) << o.last.status;
  // A quarter of the budget per state: one range, the least a page reads.
  next = store->ExportPage(std::nullopt, std::string("b02"), 20 * kExportSampleEvery);
  o = Drive(*next, {Q("export_states", Ok("b22\t\\N\t{}\n"), "state_id > 'b02' AND state_id <= 'b22' ORDER")}, &clock);
  ASSERT_EQ(o.last.kind, Action::Kind::kDone) << o.last.status;
}

TEST(Store, ExportOfAMissingTableIsEmptyAndACorruptRowIsDataLoss) {
  auto store = MakeStore();
  int64_t clock = 0;
  auto t = store->ExportPage(std::nullopt, std::nullopt);
  Outcome o =
      Drive(*t, {kVersion18, Q("sample_state_ids", Err(404, 60, "Table meltano.state doesn't exist."))}, &clock);
  ASSERT_EQ(o.last.kind, Action::Kind::kDone) << o.last.status;
  ASSERT_TRUE(o.last.result.states.has_value());
  EXPECT_TRUE(o.last.result.states->empty());
  EXPECT_FALSE(o.last.result.more);
  auto bad = store->ExportPage(std::nullopt, std::nullopt);
  o = Drive(*bad, {Q("sample_state_ids", Ok("")), Q("export_states", Ok("dev:a\t{oops\t\\N\n"))}, &clock);
  ASSERT_EQ(o.last.kind, Action::Kind::kFailed);
  EXPECT_THAT(o.last.status, StatusIs(absl::StatusCode::kDataLoss, HasSubstr("dev:a")));
  // A failed export is forgotten: the same page again samples afresh.
  auto again = store->ExportPage(std::nullopt, std::nullopt);
  o = Drive(*again, {Q("sample_state_ids", Ok("")), Q("export_states", Ok(""))}, &clock);
  EXPECT_EQ(o.last.kind, Action::Kind::kDone) << o.last.status;
}

TEST(Store, AnExportPageAsTheDocumentsEntriesReadsAsAPageOfStatesDoes) {
  auto store = MakeStore();
  int64_t clock = 0;
  auto t = store->ExportPage(std::string("dev:*"), std::nullopt, 2, /*document=*/true);
  Outcome o = Drive(*t,
                    {kVersion18, Q("sample_state_ids", Ok("dev:c\t1\ndev:e\t1\n")),
                     Q("export_states", Ok("dev:a\t{\"p\":1}\t\\N\ndev:b\t\\N\t{\"z\": 1, \"a\": [1.50]}\n"),
                       "FINAL WHERE state_id LIKE 'dev:%' AND state_id <= 'dev:c' ORDER BY state_id LIMIT 2")},
                    &clock);
  ASSERT_EQ(o.last.kind, Action::Kind::kDone) << o.last.status;
  EXPECT_FALSE(o.last.result.states.has_value()) << "the page is text, not states";
  ASSERT_TRUE(o.last.result.document.has_value());
  // Each entry as ExportEntryJson writes the state read from the row (the
  // second side stored with spaces and its keys out of order).
  EXPECT_EQ(*o.last.result.document,
            "\"dev:a\": {\"completed\":{},\"partial\":{\"p\":1}},\n  "
            "\"dev:b\": {\"completed\":{\"a\":[1.5],\"z\":1},\"partial\":{}}");
  EXPECT_EQ(o.last.result.state_ids, (std::vector<std::string>{"dev:a", "dev:b"}));
  EXPECT_TRUE(o.last.result.more);
  // The cursor goes on from the page's last id, as for states; an empty
  // range is passed over.
  auto next = store->ExportPage(std::string("dev:*"), std::string("dev:b"), 2, true);
  o = Drive(*next,
            {Q("export_states", Ok(""), "state_id > 'dev:b' AND state_id <= 'dev:c' ORDER"),
             Q("export_states", Ok("dev:d\t\\N\t\\N\n"), "state_id > 'dev:c' AND state_id <= 'dev:e' ORDER")},
            &clock);
  ASSERT_EQ(o.last.kind, Action::Kind::kDone) << o.last.status;
  EXPECT_EQ(o.last.result.document, std::optional<std::string>("\"dev:d\": {\"completed\":{},\"partial\":{}}"));
  EXPECT_EQ(o.last.result.state_ids, std::vector<std::string>{"dev:d"});
  EXPECT_TRUE(o.last.result.more);
  next = store->ExportPage(std::string("dev:*"), std::string("dev:d"), 2, true);
  o = Drive(*next, {Q("export_states", Ok(""), "state_id > 'dev:d' ORDER BY state_id LIMIT 2")}, &clock);
  ASSERT_EQ(o.last.kind, Action::Kind::kDone) << o.last.status;
  EXPECT_EQ(o.last.result.document, std::optional<std::string>(""));
  EXPECT_TRUE(o.last.result.state_ids.empty());
  EXPECT_FALSE(o.last.result.more);
}

TEST(Store, AnExportPageAsTextRefusesWhatThePageOfStatesRefuses) {
  auto store = MakeStore();
  int64_t clock = 0;
  auto t = store->ExportPage(std::nullopt, std::nullopt, kDefaultExportPageStates, true);
  Outcome o =
      Drive(*t, {kVersion18, Q("sample_state_ids", Err(404, 60, "Table meltano.state doesn't exist."))}, &clock);
  ASSERT_EQ(o.last.kind, Action::Kind::kDone) << o.last.status;
  EXPECT_EQ(o.last.result.document, std::optional<std::string>("")) << "a missing table: no states";
  EXPECT_FALSE(o.last.result.states.has_value());
  auto bad = store->ExportPage(std::nullopt, std::nullopt, kDefaultExportPageStates, true);
  o = Drive(*bad, {Q("sample_state_ids", Ok("")), Q("export_states", Ok("dev:a\t\\N\t{}\ndev:b\t{oops\t\\N\n"))},
            &clock);
  ASSERT_EQ(o.last.kind, Action::Kind::kFailed);
  EXPECT_THAT(o.last.status, StatusIs(absl::StatusCode::kDataLoss, HasSubstr("dev:b")));
  auto utf = store->ExportPage(std::nullopt, std::nullopt, kDefaultExportPageStates, true);
  o = Drive(*utf, {Q("sample_state_ids", Ok("")), Q("export_states", Ok("x\xff\t\\N\t{}\n"))}, &clock);
  ASSERT_EQ(o.last.kind, Action::Kind::kFailed);
  EXPECT_THAT(o.last.status, StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("not valid UTF-8")));
}

TEST(Store, ModernExportPassesIdsAsParameters) {
  auto store = MakeStore();
  int64_t clock = 0;
  auto t = store->ExportPage(std::nullopt, std::string("a'b"), 3);
  Outcome o = Drive(*t,
                    {kVersionModern, Q("sample_state_ids", Ok("c\t1\n"), "state_id > {after:String}"),
                     Q("export_states", Ok(""), "state_id > {after:String} AND state_id <= {upto:String} ORDER"),
                     Q("export_states", Ok(""), "WHERE state_id > {after:String} ORDER")},
                    &clock);
  ASSERT_EQ(o.last.kind, Action::Kind::kDone) << o.last.status;
  EXPECT_FALSE(o.last.result.more);
}

std::vector<MeltanoState> Numbered(int n) {
  std::vector<MeltanoState> states;
  for (int i = 0; i < n; ++i) {
    states.push_back({absl::StrCat("id", i), nlohmann::json::object(),
                      nlohmann::json{{"singer_state", {{"n", i}}}}});
  }
  return states;
}

TEST(Store, ImportWritesInBatchesOfAtMostTheDefault) {
  auto store = MakeStore();
  int64_t clock = 0;
  const int n = static_cast<int>(kDefaultImportBatchStates) + 1;
  auto t = store->Import(Numbered(n));
  Outcome o = Drive(*t, {kVersion18, Q("insert_states", Ok(), "('id0', NULL, '{\"singer_state\":{\"n\":0}}'), ('id1'"),
                         Q("insert_states", Ok(), absl::StrCat("VALUES ('id", n - 1, "'"))},
                    &clock);
  ASSERT_EQ(o.last.kind, Action::Kind::kDone) << o.last.status;
  EXPECT_EQ(o.last.result.count, n);
}

TEST(Store, ImportRefusesABadEntryBeforeSendingAnything) {
  auto store = MakeStore();
  int64_t clock = 0;
  std::vector<MeltanoState> states = Numbered(3);
  states[1].state_id = "";
  auto t = store->Import(states);
  Outcome o = Drive(*t, {}, &clock);
  ASSERT_EQ(o.last.kind, Action::Kind::kFailed);
  EXPECT_THAT(o.last.status, StatusIs(absl::StatusCode::kInvalidArgument,
                                      AllOf(HasSubstr("import entry 2 of 3"), HasSubstr("nothing was written"))));
  states[1].state_id = "id0";
  auto dup = store->Import(states);
  o = Drive(*dup, {}, &clock);
  EXPECT_THAT(o.last.status, StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("entries 1 and 2")));
}

// import_document's rows (ParseExportDocumentRows): their columns go into
// the INSERT as they are; rows not in increasing id order (or an id twice,
// or a bad id) are refused before anything is sent.
TEST(Store, ImportRowsWritesTheColumnsAsTheyAreAndRefusesRowsOutOfOrder) {
  auto store = MakeStore();
  int64_t clock = 0;
  auto t = store->ImportRows({{"a", std::nullopt, R"({"x":1})"}, {"b", R"({"p":2})", std::nullopt}});
  Outcome o = Drive(*t, {kVersion18, Q("insert_states", Ok(), R"(('a', NULL, '{"x":1}'), ('b', '{"p":2}', NULL))")},
                    &clock);
  ASSERT_EQ(o.last.kind, Action::Kind::kDone) << o.last.status;
  EXPECT_EQ(o.last.result.count, 2);
  const std::vector<std::vector<StoredState>> kBad = {
      {{"b", std::nullopt, std::nullopt}, {"a", std::nullopt, std::nullopt}},
      {{"a", std::nullopt, std::nullopt}, {"a", std::nullopt, std::nullopt}},
      {{"a", std::nullopt, std::nullopt}, {"", std::nullopt, std::nullopt}}};
  for (const std::vector<StoredState>& rows : kBad) {
    auto bad = store->ImportRows(rows);
    Outcome refused = Drive(*bad, {}, &clock);
    ASSERT_EQ(refused.last.kind, Action::Kind::kFailed) << rows[1].state_id;
    EXPECT_THAT(refused.last.status, StatusIs(absl::StatusCode::kInvalidArgument,
                                              AllOf(HasSubstr("import row"), HasSubstr("nothing was written"))));
  }
}

TEST(Store, ImportCreatesTheSchemaAndNamesWhereAFailureStopped) {
  auto store = MakeStore();
  int64_t clock = 0;
  const int n = static_cast<int>(kDefaultImportBatchStates) + 5;
  auto t = store->Import(Numbered(n));
  Outcome o = Drive(*t,
                    {kVersion18, Q("insert_states", Err(404, 81, "Database meltano doesn't exist")),
                     Q("create_database", Ok()), Q("create_state_table", Ok()), Q("create_lock_table", Ok()),
                     Q("create_history_table", Ok()), Q("create_history_buffer", Ok()), Q("create_history_view", Ok()),
                     Q("drop_unbuffered_history_view", Ok()),
                     Q("insert_states", Ok()), Q("insert_states", Err(500, 241, "Memory limit exceeded"))},
                    &clock);
  ASSERT_EQ(o.last.kind, Action::Kind::kFailed);
  EXPECT_THAT(o.last.status,
              StatusIs(absl::StatusCode::kInternal,
                       AllOf(HasSubstr(absl::StrCat("after ", kDefaultImportBatchStates, " of ", n)),
                             HasSubstr("again is safe"))));
}

// Tens of thousands of states go in one INSERT: each INSERT is a part the
// server merges again and again (tools/scale_bench.py: INSERTs of 1,000
// states made an import of 1,000,000 six times slower than 50,000 did).
TEST(Store, ImportWritesTensOfThousandsOfStatesPerInsert) {
  auto store = MakeStore();
  int64_t clock = 0;
  auto t = store->Import(Numbered(30000));
  Outcome o = Drive(*t, {kVersion18, Q("insert_states", Ok(), "('id29999', NULL, ")}, &clock);
  ASSERT_EQ(o.last.kind, Action::Kind::kDone) << o.last.status;
  EXPECT_EQ(o.last.result.count, 30000);
}

// A batch's bytes are its VALUES list exactly as sent, quoting included:
// two states filling kDefaultImportBatchBytes to the byte go in one INSERT,
// a byte more in two.
TEST(Store, ImportSplitsByTheExactSizeOfTheRows) {
  auto row_size = [](const MeltanoState& s) {
    return static_cast<int64_t>(
        Statements::StateRowSql({s.state_id, ToColumn(s.partial), ToColumn(s.completed)}).size());
  };
  std::vector<MeltanoState> base = Numbered(2);
  // Apostrophes: two bytes each once quoted (\'); 'x' one byte in JSON and SQL.
  base[0].completed["singer_state"]["blob"] = std::string(1000, '\'');
  base[1].completed["singer_state"]["blob"] = "";
  const int64_t rest = kDefaultImportBatchBytes - row_size(base[0]) - 2 - row_size(base[1]);
  ASSERT_GT(rest, 0);
  for (int64_t over : {0, 1}) {
    std::vector<MeltanoState> states = base;
    states[1].completed["singer_state"]["blob"] = std::string(rest + over, 'x');
    auto store = MakeStore();
    int64_t clock = 0;
    auto t = store->Import(states);
    std::vector<Exchange> script = {kVersion18, Q("insert_states", Ok(), "('id0', NULL, '{")};
    if (over > 0) script.push_back(Q("insert_states", Ok(), "VALUES ('id1', NULL, '{"));
    Outcome o = Drive(*t, script, &clock);
    ASSERT_EQ(o.last.kind, Action::Kind::kDone) << "over by " << over << ": " << o.last.status;
    EXPECT_EQ(o.last.result.count, 2);
  }
}

TEST(Store, InitTrimsTheHistoryToTheVersionsKept) {
  StoreOptions opts;
  opts.lock = ScriptLock();
  opts.history_versions = 5;
  auto store = *Store::Create(opts);
  int64_t clock = 0;
  auto t = store->Init();
  Outcome o = Drive(*t,
                    {kVersion18, Q("create_database", Ok()), Q("create_state_table", Ok()), Q("create_lock_table", Ok()),
                     Q("create_history_table", Ok()), Q("create_history_buffer", Ok()), Q("create_history_view", Ok()),
                     Q("drop_unbuffered_history_view", Ok()), Q("expire_history", Ok()),
                     Q("trim_history", Ok(), "arraySlice(arrayReverseSort(groupArray(updated_at)), 6)"),
                     Q("list_tombstones", Ok(""))},
                    &clock);
  ASSERT_EQ(o.last.kind, Action::Kind::kDone) << o.last.status;
  opts.history_versions = -1;
  EXPECT_THAT(Store::Create(opts).status(), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("negative")));
}

// ---- locks held now (`chstate locks`, `chstate unlock --force`) ----

TEST(Store, LocksMapsLockTablesToIdsAndJudgesStaleness) {
  auto store = MakeStore();
  int64_t clock = 0;
  // Build names the way the store does (statements of the same schema and table).
  absl::StatusOr<Statements> st = Statements::Create(Dialect::kClickHouse18, "meltano", "state");
  ASSERT_TRUE(st.ok());
  const std::string a = st->LockTableName("dev:a"), b = st->LockTableName("dev:b");
  const std::string unknown = "state_lock_00000000000000ff";
  auto t = store->Locks(std::nullopt);
  Outcome o = Drive(*t,
                    {kVersion18, Q("list_state_ids", Ok("dev:a\t1\ndev:b\t1\ndev:c\t1\n")),
                     Q("list_lock_tables", Ok(absl::StrCat(unknown, "\t1\n", a, "\t1\n", b, "\t1\n")),
                       "match(name, '^state_lock_[0-9a-f]{16}$')"),
                     Q("inspect_lock", Ok("x1\t0\t100\t400\t300\n\t255\t100\t400\t0\n"), unknown),
                     // dev:a: taken at 1000, renewed at 1190, now 1200, window 300: live.
                     Q("inspect_lock", Ok("h1\t0\t1000\t1200\t300\nh1\t1\t1190\t1200\t300\n\t255\t1000\t1200\t0\n"), a),
                     Q("inspect_lock", Err(404, 60, "Table meltano.x doesn't exist."), b)},
                    &clock);
  ASSERT_EQ(o.last.kind, Action::Kind::kDone) << o.last.status;
  ASSERT_TRUE(o.last.result.locks.has_value());
  ASSERT_EQ(o.last.result.locks->size(), 2u);  // dev:b was released meanwhile
  const HeldLockInfo& u = (*o.last.result.locks)[0];
  EXPECT_FALSE(u.state_id.has_value());
  EXPECT_EQ(u.table, unknown);
  EXPECT_TRUE(u.stale);  // renewed 300 s ago with a 300 s window
  const HeldLockInfo& la = (*o.last.result.locks)[1];
  EXPECT_EQ(la.state_id, std::optional<std::string>("dev:a"));
  EXPECT_EQ(la.holder, "h1");
  EXPECT_EQ(la.held_s, 200);
  EXPECT_EQ(la.renewed_s, 10);
  EXPECT_EQ(la.validity_s, 300);
  EXPECT_FALSE(la.stale);
  // With a pattern, a table whose id is not known is left out.
  auto some = store->Locks(std::string("dev:*"));
  o = Drive(*some, {Q("list_state_ids", Ok("dev:a\t1\n")), Q("list_lock_tables", Ok(absl::StrCat(unknown, "\t1\n"))) },
            &clock);
  ASSERT_EQ(o.last.kind, Action::Kind::kDone) << o.last.status;
  EXPECT_TRUE(o.last.result.locks->empty());
  // No state table yet (a lock can come first): its tables still count; no database: none.
  auto early = store->Locks(std::nullopt);
  o = Drive(*early, {Q("list_state_ids", Err(404, 60, "Table meltano.state doesn't exist")),
                     Q("list_lock_tables", Ok(absl::StrCat(unknown, "\t1\n"))),
                     Q("inspect_lock", Ok("x1\t0\t100\t101\t300\n\t255\t100\t101\t0\n"))},
            &clock);
  ASSERT_EQ(o.last.kind, Action::Kind::kDone) << o.last.status;
  EXPECT_EQ(o.last.result.locks->size(), 1u);
  auto none = store->Locks(std::nullopt);
  o = Drive(*none, {Q("list_state_ids", Err(404, 81, "Database meltano doesn't exist")),
                    Q("list_lock_tables", Ok(""))}, &clock);
  ASSERT_EQ(o.last.kind, Action::Kind::kDone) << o.last.status;
  EXPECT_TRUE(o.last.result.locks->empty());
}

TEST(Store, ForceUnlockEntombsTheInstanceAndSaysWhoseItWas) {
  auto store = MakeStore();
  int64_t clock = 0;
  // The tombstone is the one a takeover of that instance would make.
  absl::StatusOr<Statements> st = Statements::Create(Dialect::kClickHouse18, "meltano", "state");
  ASSERT_TRUE(st.ok());
  auto t = store->ForceUnlock("dev:a");
  Outcome o = Drive(*t,
                    {kVersion18, Q("inspect_lock", Ok("h1\t0\t1000\t1200\t10\n\t255\t1000\t1200\t0\n")),
                     Q("entomb_lock", Ok(), st->TombstoneName("dev:a", "holder:h1"))},
                    &clock);
  ASSERT_EQ(o.last.kind, Action::Kind::kDone) << o.last.status;
  ASSERT_EQ(o.last.result.locks->size(), 1u);
  EXPECT_EQ((*o.last.result.locks)[0].holder, "h1");
  EXPECT_TRUE((*o.last.result.locks)[0].stale);
  auto free = store->ForceUnlock("dev:b");
  o = Drive(*free, {Q("inspect_lock", Ok(""))}, &clock);
  EXPECT_THAT(o.last.status, StatusIs(absl::StatusCode::kNotFound, HasSubstr("is not locked")));
  auto raced = store->ForceUnlock("dev:c");
  o = Drive(*raced, {Q("inspect_lock", Ok("h2\t0\t1000\t1200\t10\n\t255\t1000\t1200\t0\n")),
                     Q("entomb_lock", Err(404, 60, "Table doesn't exist."))},
            &clock);
  EXPECT_THAT(o.last.status, StatusIs(absl::StatusCode::kAborted, HasSubstr("changed hands")));
}

// ---- cluster mode (core/statements.h) ----

std::unique_ptr<Store> MakeClusterStore() {
  StoreOptions o;
  o.lock = ScriptLock();
  o.cluster.name = "prod";
  o.cluster.quorum_timeout_ms = 1000;
  o.cluster.quorum_busy_ms = 1000;
  absl::StatusOr<std::unique_ptr<Store>> s = Store::Create(o);
  EXPECT_THAT(s, IsOk());
  return std::move(*s);
}

// Cluster stores check the state table's engine once, after the version.
const Exchange kEngine = Q("state_table_engine", Ok("ReplicatedReplacingMergeTree\t1\n"));

// HoldLock for cluster mode: the claims lock taken first (version and
// engine included), so that a write's own requests come alone.
void HoldClusterLock(Store& store, const std::string& id, int64_t* clock);

TEST(ClusterStore, RefusesAStateTableThatIsNotReplicated) {
  auto store = MakeClusterStore();
  int64_t clock = 0;
  auto t = store->Get("id");
  Outcome o = Drive(*t, {kVersion18, Q("state_table_engine", Ok("ReplacingMergeTree\t1\n"), "system.tables")},
                    &clock);
  ASSERT_EQ(o.last.kind, Action::Kind::kFailed);
  EXPECT_THAT(o.last.status, StatusIs(absl::StatusCode::kFailedPrecondition,
                                      HasSubstr("meltano.state on this server is a ReplacingMergeTree")));
  // A missing table is fine (it is created replicated on first use).
  auto again = store->Get("id");
  o = Drive(*again, {kVersion18, Q("state_table_engine", Ok("")), Q("get_state", Ok(""))}, &clock);
  EXPECT_EQ(o.last.kind, Action::Kind::kDone) << o.last.status;
}

TEST(ClusterStore, QuorumWriteMeetingAnotherIsRetriedUntilItLands) {
  auto store = MakeClusterStore();
  int64_t clock = 0;
  HoldClusterLock(*store, "id", &clock);
  auto t = store->Set(MeltanoState{"id", nlohmann::json::object(), nlohmann::json::parse(R"({"a":1})")});
  SqlResponse busy = Err(500, 286, "Another quorum insert has been already started");
  Outcome o = Drive(*t, {Q("insert_state", busy), W(-1), Q("insert_state", busy), W(-1),
                         Q("insert_state", Ok())},
                    &clock);
  ASSERT_EQ(o.last.kind, Action::Kind::kDone) << o.last.status;
}

TEST(ClusterStore, QuorumWriteGivesUpWithTheCauseAfterTheQuorumTimeout) {
  auto store = MakeClusterStore();
  int64_t clock = 0;
  HoldClusterLock(*store, "id", &clock);
  const int64_t start = clock;
  auto t = store->Set(MeltanoState{"id", nlohmann::json::object(), nlohmann::json::parse(R"({"a":1})")});
  SqlResponse busy = Err(500, 286, "Quorum for previous write has not been satisfied yet");
  Action a = t->Start({clock, kRandom});
  int sends = 0;
  while (a.kind == Action::Kind::kRunSql || a.kind == Action::Kind::kWait) {
    if (a.kind == Action::Kind::kWait) {
      clock += a.wait_ms;
      a = t->OnTimer({clock, kRandom});
      continue;
    }
    ASSERT_EQ(a.request.purpose, "insert_state");
    ASSERT_LT(++sends, 100);
    clock += 3;
    a = t->OnResponse(busy, {clock, kRandom});
  }
  ASSERT_EQ(a.kind, Action::Kind::kFailed);
  EXPECT_GT(sends, 3);
  EXPECT_GE(clock - start, 1000);
  EXPECT_THAT(a.status, StatusIs(absl::StatusCode::kUnavailable, HasSubstr("not reached its quorum of 2")));
  EXPECT_EQ(ClickHouseCode(a.status), 286);
}

// Code 319 (core/replica_answers_test.cc has the host lists): the state
// write replaces itself, so it is sent again once; a second 319 fails
// with the outcome explained.
TEST(ClusterStore, UnknownQuorumOutcomeIsSentAgainOnceThenExplained) {
  auto store = MakeClusterStore();
  int64_t clock = 0;
  HoldClusterLock(*store, "id", &clock);
  auto t = store->Set(MeltanoState{"id", nlohmann::json::object(), nlohmann::json::parse(R"({"a":1})")});
  Outcome o = Drive(*t,
                    {Q("insert_state", Err(500, 319, "Unknown status, client must retry")), W(-1),
                     Q("insert_state", Err(500, 319, "Unknown status, client must retry"))},
                    &clock);
  ASSERT_EQ(o.last.kind, Action::Kind::kFailed);
  EXPECT_THAT(o.last.status, StatusIs(absl::StatusCode::kUnavailable, HasSubstr("code 319")));
  EXPECT_THAT(o.last.status.message(), HasSubstr("becomes readable on every replica"));
}

TEST(ClusterStore, TooFewReplicasNamesTheCause) {
  auto store = MakeClusterStore();
  int64_t clock = 0;
  HoldClusterLock(*store, "id", &clock);
  auto t = store->Delete("id");
  Outcome o = Drive(
      *t, {Q("delete_state", Err(500, 285, "Number of alive replicas (1) is less than requested quorum (2)"),
                         "'chstate:deleted'")},
      &clock);
  ASSERT_EQ(o.last.kind, Action::Kind::kFailed);
  EXPECT_THAT(o.last.status, StatusIs(absl::StatusCode::kUnavailable, HasSubstr("fewer than 2 replicas are alive")));
}

TEST(ClusterStore, ZooKeeperUnreachableIsUnavailableAndSaysSo) {
  auto store = MakeClusterStore();
  int64_t clock = 0;
  auto get = store->Get("id");
  Outcome o = Drive(*get, {kVersion18, kEngine, Q("get_state", Err(500, 999, "Coordination::Exception: Session expired"))},
                    &clock);
  ASSERT_EQ(o.last.kind, Action::Kind::kFailed);
  EXPECT_THAT(o.last.status, StatusIs(absl::StatusCode::kUnavailable, HasSubstr("cannot reach ZooKeeper")));
  auto lock = store->AcquireLock("id");
  o = Drive(*lock, {Q("inspect_claims", Err(500, 999, "Coordination::Exception: Session expired"))}, &clock);
  ASSERT_EQ(o.last.kind, Action::Kind::kFailed);
  EXPECT_THAT(o.last.status, StatusIs(absl::StatusCode::kUnavailable, HasSubstr("cannot reach ZooKeeper")));
  // A write takes the claims lock first: the same error, the same words.
  auto set = store->Set(MeltanoState{"id", nlohmann::json::object(), nlohmann::json::parse(R"({"a":1})")});
  o = Drive(*set, {Q("inspect_claims", Err(500, 242, "Table is in readonly mode"))}, &clock);
  ASSERT_EQ(o.last.kind, Action::Kind::kFailed);
  EXPECT_THAT(o.last.status, StatusIs(absl::StatusCode::kUnavailable, HasSubstr("code 242")));
}

TEST(ClusterStore, UnknownClusterNameIsAConfigurationError) {
  auto store = MakeClusterStore();
  int64_t clock = 0;
  auto t = store->AcquireLock("id");
  Outcome o = Drive(*t,
                    {kVersion18, kEngine, Q("inspect_claims", Err(404, 60, "Table meltano.state_claims doesn't exist.")),
                     Q("claim_lock", Err(404, 60, "Table meltano.state_claims doesn't exist.")),
                     Q("create_claims_table", Err(500, 170, "Requested cluster 'prod' not found"), "ON CLUSTER `prod`")},
                    &clock);
  ASSERT_EQ(o.last.kind, Action::Kind::kFailed);
  EXPECT_THAT(o.last.status, StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("know no cluster \"prod\"")));
}

TEST(ClusterStore, DeleteIsATombstoneWithoutMutationWait) {
  auto store = MakeClusterStore();
  int64_t clock = 0;
  HoldClusterLock(*store, "id", &clock);
  auto t = store->Delete("id");
  Outcome o = Drive(*t, {Q("delete_state", Ok(), "VALUES ('id', NULL, 'chstate:deleted')")}, &clock);
  EXPECT_EQ(o.last.kind, Action::Kind::kDone) << o.last.status;
}

TEST(ClusterStore, ClearAllTombstonesInsteadOfTruncating) {
  auto store = MakeClusterStore();
  int64_t clock = 0;
  auto t = store->ClearAll();
  Outcome o = Drive(*t, {kVersion18, kEngine, Q("count_states", Ok("3\t1\n")), Q("clear_states", Ok(), "SELECT state_id")},
                    &clock);
  ASSERT_EQ(o.last.kind, Action::Kind::kDone) << o.last.status;
  EXPECT_EQ(o.last.result.count, 3);
}

// Cluster mode: an acquisition's claims are its random prefix and a number.
const std::string kClaimId = kLockId.substr(0, 24) + "00000001";
const std::string kClaimId2 = kLockId.substr(0, 24) + "00000002";

// A claims answer row: lock id, claim rows, end rows, newest row, stale_s, over, now.
std::string ClaimRow(const std::string& id, int ends, int64_t newest, int64_t now, const std::string& over = "") {
  return absl::StrCat(id, "\t1\t", ends, "\t", newest, "\t300\t", over, "\t", now, "\n");
}

void HoldClusterLock(Store& store, const std::string& id, int64_t* clock) {
  auto t = store.AcquireLock(id);
  Outcome o = Drive(*t,
                    {kVersion18, kEngine, Q("inspect_claims", Ok("")), Q("claim_lock", Ok()),
                     Q("inspect_claims", Ok(ClaimRow(kClaimId, 0, 100, 100)))},
                    clock);
  ASSERT_EQ(o.last.kind, Action::Kind::kDone) << o.last.status;
}

absl::StatusOr<std::unique_ptr<Store>> LingeringClusterStore() {
  StoreOptions o;
  o.lock = ScriptLock();
  o.cluster.name = "prod";
  o.linger_locks = true;
  return Store::Create(o);
}

TEST(ClusterStore, AnAcquisitionThatReadManyOverClaimsRemovesThemOnceInAWhile) {
  auto store = MakeClusterStore();
  int64_t clock = 0;
  // The id's old claims: kClaimsPruneAt - 1 ended, one stale by its window,
  // and one live one of a process that is still within its window.
  std::string old;
  for (int i = 0; i < kClaimsPruneAt - 1; ++i) old += ClaimRow(absl::StrCat("ended", i), 1, 50, 1000);
  old += ClaimRow("stale", 0, 698, 1000);
  auto t = store->AcquireLock("id");
  Outcome o = Drive(*t,
                    {kVersion18, kEngine, Q("inspect_claims", Ok(old)), Q("claim_lock", Ok()),
                     Q("inspect_claims", Ok(old + ClaimRow(kClaimId, 0, 1000, 1000))),
                     Q("prune_claims", Ok(),
                       absl::StrCat("ALTER TABLE `meltano`.`state_claims` DELETE WHERE name = 'state_lock_",
                                    absl::StrFormat("%016x", Fnv1a64("id")), "' AND lock_id IN ('ended0', 'ended1', ",
                                    "'ended10', ")),
                     },
                    &clock);
  ASSERT_EQ(o.last.kind, Action::Kind::kDone) << o.last.status;
  EXPECT_EQ(o.last.result.lock_id, kClaimId);
  auto r = store->ReleaseLock("id", kClaimId);
  ASSERT_EQ(Drive(*r, {Q("end_claim", Ok())}, &clock).last.kind, Action::Kind::kDone);
  // Within kClaimsPruneEveryMs the same store does not ask again.
  clock += kClaimsPruneEveryMs / 2;
  auto again = store->AcquireLock("id");
  o = Drive(*again,
            {Q("inspect_claims", Ok(old)), Q("claim_lock", Ok()),
             Q("inspect_claims", Ok(old + ClaimRow(kClaimId, 0, 1001, 1001)))},
            &clock);
  ASSERT_EQ(o.last.kind, Action::Kind::kDone) << o.last.status << " " << o.last.request.purpose;
  EXPECT_EQ(o.purposes.back(), "inspect_claims");
}

TEST(ClusterStore, ABacklogOfOverClaimsGoesASliceAtEveryAcquisition) {
  auto store = MakeClusterStore();
  int64_t clock = 0;
  std::string old;
  for (int i = 0; i < kClaimsPruneMax + 10; ++i) old += ClaimRow(absl::StrFormat("ended%05d", i), 1, 50, 1000);
  for (int round = 0; round < 2; ++round) {  // no 10 s wait between them
    auto t = store->AcquireLock("id");
    std::vector<Exchange> script;
    if (round == 0) script = {kVersion18, kEngine};
    script.push_back(Q("inspect_claims", Ok(old)));
    script.push_back(Q("claim_lock", Ok()));
    script.push_back(Q("inspect_claims", Ok(old + ClaimRow(kClaimId, 0, 1000, 1000))));
    script.push_back(Q("prune_claims", Ok(), "('ended0"));
    Outcome o = Drive(*t, script, &clock);
    ASSERT_EQ(o.last.kind, Action::Kind::kDone) << o.last.status;
    auto r = store->ReleaseLock("id", kClaimId);
    ASSERT_EQ(Drive(*r, {Q("end_claim", Ok())}, &clock).last.kind, Action::Kind::kDone);
  }
}

TEST(ClusterStore, FewerOverClaimsThanThePruneCountAreLeftAlone) {
  auto store = MakeClusterStore();
  int64_t clock = 0;
  std::string old;
  for (int i = 0; i < kClaimsPruneAt - 1; ++i) old += ClaimRow(absl::StrCat("ended", i), 1, 50, 1000);
  auto t = store->AcquireLock("id");
  Outcome o = Drive(*t,
                    {kVersion18, kEngine, Q("inspect_claims", Ok(old)), Q("claim_lock", Ok()),
                     Q("inspect_claims", Ok(old + ClaimRow(kClaimId, 0, 1000, 1000)))},
                    &clock);
  ASSERT_EQ(o.last.kind, Action::Kind::kDone) << o.last.status << " " << o.last.request.purpose;
  EXPECT_EQ(o.purposes.back(), "inspect_claims") << "one prunable claim fewer than the count: nothing removed";
}

TEST(ClusterStore, LocksAreClaimsAndLinger) {
  absl::StatusOr<std::unique_ptr<Store>> store = LingeringClusterStore();
  ASSERT_THAT(store, IsOk());
  int64_t clock = 0;
  auto t = (*store)->AcquireLock("id");
  // Read, claim with the quorum, read again: ours is the only live claim.
  Outcome o1 = Drive(*t,
                     {kVersion18, kEngine, Q("inspect_claims", Ok("")),
                      Q("claim_lock", Ok(), "'" + kClaimId + "', toUInt8(0)"),
                      Q("inspect_claims", Ok(ClaimRow(kClaimId, 0, 100, 100)))},
                     &clock);
  ASSERT_EQ(o1.last.kind, Action::Kind::kDone) << o1.last.status;
  EXPECT_EQ(o1.last.result.lock_id, kClaimId);
  // Released, it lingers, and taking it back costs no request.
  auto r = (*store)->ReleaseLock("id", o1.last.result.lock_id);
  Outcome o2 = Drive(*r, {}, &clock);
  EXPECT_EQ(o2.last.kind, Action::Kind::kDone) << o2.last.status;
  EXPECT_TRUE(o2.purposes.empty());
  auto again = (*store)->AcquireLock("id");
  Outcome o3 = Drive(*again, {}, &clock);
  EXPECT_EQ(o3.last.kind, Action::Kind::kDone) << o3.last.status;
  EXPECT_TRUE(o3.purposes.empty());
  // A later release looks for waiters: rows naming this holder.
  clock += 1000;
  auto r2 = (*store)->ReleaseLock("id", kClaimId);
  Drive(*r2, {Q("lock_waiters", Ok(""), "seq = 2 AND over = '" + kClaimId + "'")}, &clock);
  // Released for real: the end row.
  auto all = (*store)->ReleaseLingering();
  Outcome o4 = Drive(*all, {Q("end_claim", Ok(), "toUInt8(3)")}, &clock);
  EXPECT_EQ(o4.last.kind, Action::Kind::kDone) << o4.last.status;
  EXPECT_EQ(o4.last.result.count, 1);
}

TEST(ClusterStore, AWaiterShowsItselfToTheHolderItSaw) {
  absl::StatusOr<std::unique_ptr<Store>> store = LingeringClusterStore();
  ASSERT_THAT(store, IsOk());
  int64_t clock = 0;
  auto t = (*store)->AcquireLock("id");
  Outcome o1 = Drive(*t,
                     {kVersion18, kEngine, Q("inspect_claims", Ok(ClaimRow("holder1", 0, 100, 100))),
                      Q("announce_lock_waiter", Ok(), "toUInt8(2), now(), toUInt32(0), 'holder1'"), W(-1),
                      Q("inspect_claims", Ok(ClaimRow("holder1", 1, 100, 101)))},
                     &clock);
  EXPECT_EQ(o1.last.kind, Action::Kind::kRunSql);
  EXPECT_EQ(o1.last.request.purpose, "claim_lock");
}

TEST(ClusterStore, AClaimThatSeesAnotherLiveClaimEndsItselfAndBacksOff) {
  auto store = MakeClusterStore();
  int64_t clock = 0;
  auto t = store->AcquireLock("id");
  Outcome o = Drive(*t,
                    {kVersion18, kEngine, Q("inspect_claims", Ok("")), Q("claim_lock", Ok()),
                     Q("inspect_claims", Ok(ClaimRow("other", 0, 100, 100) + ClaimRow(kClaimId, 0, 100, 100))),
                     Q("end_claim", Ok(), "'" + kClaimId + "', toUInt8(3)"), W(-1),
                     // The racer holds on: a live claim, so no new claim is
                     // written; the waiter shows itself to it instead.
                     Q("inspect_claims", Ok(ClaimRow("other", 0, 101, 101) + ClaimRow(kClaimId, 1, 100, 101))),
                     Q("announce_lock_waiter", Ok(), "'other'")},
                    &clock);
  EXPECT_EQ(o.last.kind, Action::Kind::kWait);
  EXPECT_EQ(o.purposes.back(), "announce_lock_waiter");
}

TEST(ClusterStore, AStaleClaimIsTakenOverByNamingIt) {
  auto store = MakeClusterStore();
  int64_t clock = 0;
  auto t = store->AcquireLock("id");
  // The holder's newest row is 400 s old: past its 300 s window.
  Outcome o = Drive(*t,
                    {kVersion18, kEngine, Q("inspect_claims", Ok(ClaimRow("dead", 0, 100, 500))),
                     Q("claim_lock", Ok(), "toUInt8(0), now(), toUInt32(300), 'dead'"),
                     Q("inspect_claims", Ok(ClaimRow("dead", 0, 100, 500) + ClaimRow(kClaimId, 0, 500, 500)))},
                    &clock);
  ASSERT_EQ(o.last.kind, Action::Kind::kDone) << o.last.status;
}

TEST(ClusterStore, AClaimWhoseOutcomeIsUnknownIsSettledByReading) {
  // Code 319: the quorum was not confirmed in time. Visible, it is still
  // not held (it may be on one replica only): ended, then claimed afresh.
  auto store = MakeClusterStore();
  int64_t clock = 0;
  auto t = store->AcquireLock("id");
  Outcome o = Drive(*t,
                    {kVersion18, kEngine, Q("inspect_claims", Ok("")),
                     Q("claim_lock", Err(500, 319, "Unknown status, client must retry")),
                     Q("inspect_claims", Ok(ClaimRow(kClaimId, 0, 100, 100))),
                     Q("end_claim", Ok(), "'" + kClaimId + "'")},
                    &clock);
  ASSERT_NE(o.last.kind, Action::Kind::kDone) << "held a claim the quorum did not confirm";
  // Not visible: ended before anything else, then claimed afresh.
  auto store2 = MakeClusterStore();
  auto t2 = store2->AcquireLock("id");
  o = Drive(*t2,
            {kVersion18, kEngine, Q("inspect_claims", Ok("")),
             Q("claim_lock", Err(500, 319, "Unknown status, client must retry")), Q("inspect_claims", Ok("")),
             Q("end_claim", Ok(), "'" + kClaimId + "'"), W(-1), Q("inspect_claims", Ok(ClaimRow(kClaimId, 1, 100, 100))),
             Q("claim_lock", Ok())},
            &clock);
  EXPECT_EQ(o.last.kind, Action::Kind::kRunSql);
  EXPECT_EQ(o.last.request.purpose, "inspect_claims");
}

TEST(ClusterStore, AnEarlierClaimOfTheSameAcquisitionIsNotAnotherProcess) {
  // Its end row not visible yet, the first claim shows as live: the next claim
  // (a new number, same prefix) is written all the same.
  auto store = MakeClusterStore();
  int64_t clock = 0;
  auto t = store->AcquireLock("id");
  Outcome o = Drive(*t,
                    {kVersion18, kEngine, Q("inspect_claims", Ok("")),
                     Q("claim_lock", Err(500, 319, "Unknown status, client must retry"), "'" + kClaimId + "'"),
                     Q("inspect_claims", Ok("")), Q("end_claim", Ok()), W(-1),
                     Q("inspect_claims", Ok(ClaimRow(kClaimId, 0, 100, 100))),
                     Q("claim_lock", Ok(), "'" + kClaimId2 + "'"),
                     Q("inspect_claims", Ok(ClaimRow(kClaimId, 0, 100, 100) + ClaimRow(kClaimId2, 0, 100, 100)))},
                    &clock);
  ASSERT_EQ(o.last.kind, Action::Kind::kDone) << o.last.status;
  EXPECT_EQ(o.last.result.lock_id, kClaimId2);
}

TEST(ClusterStore, TooFewReplicasForTheLockIsUnavailableAndSaysSo) {
  LockOptions lock = ScriptLock();
  lock.timeout_ms = 0;  // one attempt
  StoreOptions opts;
  opts.lock = ScriptLock();
  opts.cluster.name = "prod";
  opts.lock = lock;
  absl::StatusOr<std::unique_ptr<Store>> store = Store::Create(opts);
  ASSERT_THAT(store, IsOk());
  int64_t clock = 0;
  auto t = (*store)->AcquireLock("id");
  SqlResponse few = Err(500, 285, "Number of alive replicas (1) is less than requested quorum (2).");
  Outcome o = Drive(*t, {kVersion18, kEngine, Q("inspect_claims", Ok("")), Q("claim_lock", few)}, &clock);
  ASSERT_EQ(o.last.kind, Action::Kind::kFailed);
  // Not "locked by another process": the replicas kept the lock from us.
  EXPECT_THAT(o.last.status, StatusIs(absl::StatusCode::kUnavailable, HasSubstr("fewer than 2 replicas are alive")));
}

TEST(ClusterStore, AClaimTakenOverIsGoneWhateverTheReadersWindow) {
  // "short" had a 3 s validity and was taken over by "taker" (ended since):
  // a reader with a 300 s window does not wait for it.
  auto store = MakeClusterStore();
  int64_t clock = 0;
  auto t = store->AcquireLock("id");
  const std::string short_claim = "short\t1\t0\t100\t3\t\t110\n";
  Outcome o = Drive(*t,
                    {kVersion18, kEngine, Q("inspect_claims", Ok(short_claim + ClaimRow("taker", 1, 105, 110, "short"))),
                     Q("claim_lock", Ok())},
                    &clock);
  EXPECT_EQ(o.last.kind, Action::Kind::kRunSql);
  EXPECT_EQ(o.last.request.purpose, "inspect_claims");
}

TEST(ClusterStore, AClaimMeetingAnotherQuorumInsertIsSentAgain) {
  auto store = MakeClusterStore();
  int64_t clock = 0;
  auto t = store->AcquireLock("id");
  Outcome o = Drive(*t,
                    {kVersion18, kEngine, Q("inspect_claims", Ok("")),
                     Q("claim_lock", Err(500, 286, "Another quorum insert has been already started")), W(-1),
                     Q("claim_lock", Ok()), Q("inspect_claims", Ok(ClaimRow(kClaimId, 0, 100, 100)))},
                    &clock);
  ASSERT_EQ(o.last.kind, Action::Kind::kDone) << o.last.status;
}

TEST(ClusterStore, ARenewalIsLostOnlyWhenAClaimTookItOver) {
  auto store = MakeClusterStore();
  int64_t clock = 0;
  auto t = store->AcquireLock("id");
  Outcome o = Drive(*t,
                    {kVersion18, kEngine, Q("inspect_claims", Ok("")), Q("claim_lock", Ok()),
                     Q("inspect_claims", Ok(ClaimRow(kClaimId, 0, 100, 100)))},
                    &clock);
  ASSERT_EQ(o.last.kind, Action::Kind::kDone) << o.last.status;
  // A racer that has not yet seen ours and withdrawn is no loss.
  clock += 10000;
  auto renew = store->RenewLock("id");
  o = Drive(*renew,
            {Q("renew_claim", Ok(), "toUInt8(1)"),
             Q("inspect_claims", Ok(ClaimRow("racer", 0, 110, 110) + ClaimRow(kClaimId, 0, 110, 110)))},
            &clock);
  ASSERT_EQ(o.last.kind, Action::Kind::kDone) << o.last.status;
  // A claim naming ours in `over` took it over.
  clock += 10000;
  auto again = store->RenewLock("id");
  o = Drive(*again,
            {Q("renew_claim", Ok()),
             Q("inspect_claims", Ok(ClaimRow("taker", 0, 120, 120, "x," + kClaimId) + ClaimRow(kClaimId, 0, 120, 120)))},
            &clock);
  EXPECT_THAT(o.last.status, StatusIs(absl::StatusCode::kAborted, HasSubstr("taken over")));
}

// ---- acts under a lock go out only within its lease ----

// Cluster mode with Meltano's 10 s lock validity and a 30 s quorum_busy: a
// write refused with code 286 would be sent again long after the lease.
std::unique_ptr<Store> ShortLeaseClusterStore(std::vector<Endpoint> hosts = {}) {
  StoreOptions o;
  o.lock = ScriptLock();
  o.lock.stale_ms = 10000;
  o.cluster.name = "prod";
  o.cluster.quorum_timeout_ms = 10000;
  o.cluster.quorum_busy_ms = 30000;
  o.hosts = std::move(hosts);
  absl::StatusOr<std::unique_ptr<Store>> s = Store::Create(o);
  EXPECT_THAT(s, IsOk());
  return std::move(*s);
}

// Found last session: the lease was checked only before the first send; a
// resend could land ~20 s after it ended, when another process may hold the
// id and have written (a lost update).
TEST(ClusterStore, AWriteRefusedAsBusyIsNotSentAgainPastTheLease) {
  const MeltanoState state{"id", nlohmann::json::object(), nlohmann::json::parse(R"({"a":1})")};
  const MeltanoState other{"other", nlohmann::json::object(), nlohmann::json::parse(R"({"b":2})")};
  struct Case {
    const char* name;
    std::function<std::unique_ptr<Task>(Store&)> make;
    const char* purpose;
  };
  const std::vector<Case> cases = {
      {"set", [&](Store& s) { return s.Set(state); }, "insert_state"},
      {"delete", [](Store& s) { return s.Delete("id"); }, "delete_state"},
      // An import writes no lock of its own, but keeps to those held.
      {"import", [&](Store& s) { return s.Import({other, state}); }, "insert_states"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    auto store = ShortLeaseClusterStore();
    int64_t clock = 0;
    HoldClusterLock(*store, "id", &clock);
    const int64_t lease_end = store->LeaseDeadlineMs("id");
    ASSERT_GT(lease_end, clock + 5000);
    auto t = c.make(*store);
    SqlResponse busy = Err(500, 286, "Quorum for previous write has not been satisfied yet");
    Action a = t->Start({clock, kRandom});
    int sends = 0;
    while (a.kind == Action::Kind::kRunSql || a.kind == Action::Kind::kWait) {
      if (a.kind == Action::Kind::kWait) {
        clock += a.wait_ms;
        a = t->OnTimer({clock, kRandom});
        continue;
      }
      // The write, or the renewal it asks for to wait longer (refused as busy too).
      ASSERT_TRUE(a.request.purpose == c.purpose || a.request.purpose == "renew_claim") << a.request.purpose;
      EXPECT_LT(clock, lease_end) << "sent past the lease, send " << sends + 1;
      EXPECT_EQ(a.request.send_before_ms, lease_end);
      ASSERT_LT(++sends, 1000);
      clock += 250;  // each refusal takes a while
      a = t->OnResponse(busy, {clock, kRandom});
    }
    ASSERT_EQ(a.kind, Action::Kind::kFailed);
    EXPECT_GT(sends, 3);
    EXPECT_THAT(a.status, StatusIs(absl::StatusCode::kAborted,
                                   AllOf(HasSubstr("\"id\" ran out while"), HasSubstr("waited out code 286"))));
  }
}

// Code 286 for three stale windows (a replica killed in the middle of a
// quorum write, restarted slowly): the write renews its lock a third of the
// window ahead while it waits, as the lock's own cadence would, and lands.
TEST(ClusterStore, AWriteWaitingOutBusyLongerThanTheLeaseRenewsItsLockAndLands) {
  auto store = ShortLeaseClusterStore();
  int64_t clock = 0;
  HoldClusterLock(*store, "id", &clock);
  const int64_t busy_until = clock + 30000;
  auto t = store->Set(MeltanoState{"id", nlohmann::json::object(), nlohmann::json::parse(R"({"a":1})")});
  const SqlResponse busy = Err(500, 286, "Quorum for previous write has not been satisfied yet");
  Action a = t->Start({clock, kRandom});
  int renewals = 0, writes = 0;
  for (int i = 0; i < 5000 && (a.kind == Action::Kind::kRunSql || a.kind == Action::Kind::kWait); ++i) {
    if (a.kind == Action::Kind::kWait) {
      clock += a.wait_ms;
      a = t->OnTimer({clock, kRandom});
      continue;
    }
    if (a.request.send_before_ms > 0) EXPECT_LT(clock, a.request.send_before_ms) << a.request.purpose << " past the lease";
    SqlResponse response = Ok();
    if (a.request.purpose == "insert_state") {
      ++writes;
      clock += 250;  // each refusal takes a while
      response = clock < busy_until ? busy : Ok();
    } else if (a.request.purpose == "renew_claim") {
      ++renewals;
      clock += 2;
    } else if (a.request.purpose == "inspect_claims") {
      clock += 2;
      const int64_t now_s = 100 + clock / 1000;
      response = Ok(ClaimRow(kClaimId, 0, now_s, now_s));
    } else {
      clock += 2;
    }
    a = t->OnResponse(response, {clock, kRandom});
  }
  ASSERT_EQ(a.kind, Action::Kind::kDone) << a.status;
  EXPECT_GE(renewals, 3);
  EXPECT_GT(writes, 30);
  EXPECT_TRUE(store->LeaseValid("id", clock));
}

// The renewal that would let a write wait out 286 past the lease fails: the
// write ends as a lease that ran out, and says why the renewal failed.
TEST(ClusterStore, AWriteWhoseRenewalToWaitFailsSaysWhy) {
  auto store = ShortLeaseClusterStore();
  int64_t clock = 0;
  HoldClusterLock(*store, "id", &clock);
  auto t = store->Set(MeltanoState{"id", nlohmann::json::object(), nlohmann::json::parse(R"({"a":1})")});
  const SqlResponse busy = Err(500, 286, "Quorum for previous write has not been satisfied yet");
  const SqlResponse memory = Err(500, 241, "Memory limit (total) exceeded");
  Action a = t->Start({clock, kRandom});
  std::vector<std::string> purposes;
  for (int i = 0; i < 2000 && (a.kind == Action::Kind::kRunSql || a.kind == Action::Kind::kWait); ++i) {
    if (a.kind == Action::Kind::kWait) {
      clock += a.wait_ms;
      a = t->OnTimer({clock, kRandom});
      continue;
    }
    purposes.push_back(a.request.purpose);
    clock += 250;
    a = t->OnResponse(a.request.purpose == "insert_state" ? busy : memory, {clock, kRandom});
  }
  ASSERT_EQ(a.kind, Action::Kind::kFailed);
  EXPECT_NE(std::find(purposes.begin(), purposes.end(), "renew_claim"), purposes.end())
      << ::testing::PrintToString(purposes);
  EXPECT_THAT(a.status, StatusIs(absl::StatusCode::kAborted,
                                 AllOf(HasSubstr("ran out while writing state waited out code 286"),
                                       HasSubstr("Renewing the lock to wait longer failed"),
                                       HasSubstr("Memory limit"))));
}

// A write with no lock held carries no deadline: it waits out 286 until
// quorum_busy as before.
TEST(ClusterStore, AWriteOfAnIdNotHeldHasNoLeaseToKeepTo) {
  auto store = ShortLeaseClusterStore();
  int64_t clock = 0;
  HoldClusterLock(*store, "id", &clock);
  auto t = store->Import({MeltanoState{"other", nlohmann::json::object(), nlohmann::json::parse(R"({"b":2})")}});
  Outcome o = Drive(*t, {Q("insert_states", Ok())}, &clock);
  ASSERT_EQ(o.last.kind, Action::Kind::kDone) << o.last.status;
  auto again = store->Import({MeltanoState{"other", nlohmann::json::object(), nlohmann::json::parse(R"({"b":2})")}});
  Action a = again->Start({clock, kRandom});
  ASSERT_EQ(a.kind, Action::Kind::kRunSql);
  EXPECT_EQ(a.request.send_before_ms, 0);
}

// With several hosts, a request refused by one goes to the next at once:
// not past the lease (host 1 took its time to refuse).
TEST(ClusterStore, AWriteRefusedByOneHostIsNotSentToTheNextPastTheLease) {
  auto store = ShortLeaseClusterStore({{"a", 1}, {"b", 2}});
  int64_t clock = 0;
  HoldClusterLock(*store, "id", &clock);
  const int64_t lease_end = store->LeaseDeadlineMs("id");
  auto t = store->Set(MeltanoState{"id", nlohmann::json::object(), nlohmann::json::parse(R"({"a":1})")});
  Action a = t->Start({clock, kRandom});
  ASSERT_EQ(a.kind, Action::Kind::kRunSql);
  ASSERT_EQ(a.request.purpose, "insert_state");
  a = t->OnResponse(Refused(), {lease_end, kRandom});
  ASSERT_EQ(a.kind, Action::Kind::kFailed) << "sent to " << Endpoints::Describe(a.request.endpoint);
  EXPECT_THAT(a.status, StatusIs(absl::StatusCode::kAborted,
                                 AllOf(HasSubstr("ran out while writing state waited out"),
                                       HasSubstr("connection refused"), HasSubstr("it was not written"))));
  // Within the lease it goes to the next host, as before.
  auto store2 = ShortLeaseClusterStore({{"a", 1}, {"b", 2}});
  clock = 0;
  HoldClusterLock(*store2, "id", &clock);
  auto t2 = store2->Set(MeltanoState{"id", nlohmann::json::object(), nlohmann::json::parse(R"({"a":1})")});
  a = t2->Start({clock, kRandom});
  a = t2->OnResponse(Refused(), {store2->LeaseDeadlineMs("id") - 1, kRandom});
  ASSERT_EQ(a.kind, Action::Kind::kRunSql);
  EXPECT_EQ(a.request.purpose, "insert_state");
}

TEST(ClusterStore, ARenewalRefusedByOneHostIsNotSentToTheNextPastTheLease) {
  auto store = ShortLeaseClusterStore({{"a", 1}, {"b", 2}});
  int64_t clock = 0;
  HoldClusterLock(*store, "id", &clock);
  const int64_t lease_end = store->LeaseDeadlineMs("id");
  clock = lease_end - 10;
  auto renew = store->RenewLock("id");
  Action a = renew->Start({clock, kRandom});
  ASSERT_EQ(a.kind, Action::Kind::kRunSql);
  ASSERT_EQ(a.request.purpose, "renew_claim");
  EXPECT_EQ(a.request.send_before_ms, lease_end);
  a = renew->OnResponse(Refused(), {lease_end, kRandom});
  ASSERT_EQ(a.kind, Action::Kind::kFailed) << "sent to " << Endpoints::Describe(a.request.endpoint);
  EXPECT_THAT(a.status, StatusIs(absl::StatusCode::kAborted, HasSubstr("ran out while its renewal waited out")));
  EXPECT_FALSE(store->LeaseValid("id", lease_end - 1));
}

TEST(ClusterStore, AReleaseRefusedByOneHostIsNotSentToTheNextPastTheLease) {
  auto store = ShortLeaseClusterStore({{"a", 1}, {"b", 2}});
  int64_t clock = 0;
  HoldClusterLock(*store, "id", &clock);
  const int64_t lease_end = store->LeaseDeadlineMs("id");
  auto release = store->ReleaseLock("id", kClaimId);
  Action a = release->Start({lease_end - 10, kRandom});
  ASSERT_EQ(a.kind, Action::Kind::kRunSql);
  ASSERT_EQ(a.request.purpose, "end_claim");
  a = release->OnResponse(Refused(), {lease_end, kRandom});
  ASSERT_EQ(a.kind, Action::Kind::kFailed) << "sent to " << Endpoints::Describe(a.request.endpoint);
  EXPECT_THAT(a.status, StatusIs(absl::StatusCode::kAborted,
                                 AllOf(HasSubstr("release's end row waited out"), HasSubstr("left to expire"))));
}

// The same with one server: the back-off resend of a refused DROP would go
// out past the lease (and, after a takeover, drop the new holder's lock).
TEST(TransportPolicy, ARefusedDropIsNotResentPastTheLease) {
  for (const int64_t refused_before_end : {40, 0}) {
    SCOPED_TRACE(refused_before_end);
    StoreOptions o;
    o.lock = ScriptLock();
    o.lock.stale_ms = 10000;
    absl::StatusOr<std::unique_ptr<Store>> store = Store::Create(o);
    ASSERT_THAT(store, IsOk());
    int64_t clock = 0;
    HoldLock(**store, "a", &clock, kVersion18);
    const int64_t lease_end = (*store)->LeaseDeadlineMs("a");
    auto release = (*store)->ReleaseLock("a", kLockId);
    Action a = release->Start({lease_end - 60, kRandom});
    ASSERT_EQ(a.request.purpose, "inspect_lock");
    a = release->OnResponse(Mine(), {lease_end - 50, kRandom});
    ASSERT_EQ(a.kind, Action::Kind::kRunSql);
    ASSERT_EQ(a.request.purpose, "drop_lock");
    EXPECT_EQ(a.request.send_before_ms, lease_end);
    // Refused: the resend after the 100 ms back-off would be past the lease.
    a = release->OnResponse(Refused(), {lease_end - refused_before_end, kRandom});
    if (refused_before_end > 0) {
      // Still within the lease, the release looks (a read) before any DROP.
      ASSERT_EQ(a.kind, Action::Kind::kRunSql) << "kind " << static_cast<int>(a.kind);
      ASSERT_EQ(a.request.purpose, "inspect_lock");
      a = release->OnResponse(Mine(), {lease_end, kRandom});
      ASSERT_EQ(a.kind, Action::Kind::kFailed) << a.request.purpose;
      EXPECT_THAT(a.status, StatusIs(absl::StatusCode::kAborted, HasSubstr("ran past its lease during release")));
      continue;
    }
    ASSERT_EQ(a.kind, Action::Kind::kFailed) << "kind " << static_cast<int>(a.kind);
    EXPECT_THAT(a.status, StatusIs(absl::StatusCode::kAborted,
                                   AllOf(HasSubstr("release's DROP waited out"), HasSubstr("left to expire"))));
  }
}

TEST(Store, MoveWritesTheCopyBeforeDeletingTheSource) {
  auto store = MakeStore();
  int64_t clock = 0;
  auto t = store->Move("src", "dst");
  Outcome o = Drive(*t,
                    {kVersionModern, Q("get_state", Ok("\\N\t{\"a\":1}\n")), Q("create_lock", Ok()),
                     Q("insert_state", Ok(), "SELECT 'dst', NULL, '{\"a\":1}' FROM"), Q("inspect_lock", Mine()),
                     Q("drop_lock", Ok()), Q("create_lock", Ok()), Q("delete_state", Ok()),
                     Q("inspect_lock", Mine()), Q("drop_lock", Ok())},
                    &clock);
  EXPECT_EQ(o.last.kind, Action::Kind::kDone) << o.last.status;
}

TEST(Store, CopyOfAnAbsentIdIsNotFound) {
  auto store = MakeStore();
  int64_t clock = 0;
  auto t = store->Copy("nope", "dst");
  Outcome o = Drive(*t, {kVersionModern, Q("get_state", Ok(""))}, &clock);
  EXPECT_THAT(o.last.status, StatusIs(absl::StatusCode::kNotFound, HasSubstr("nope")));
}

TEST(Store, ErrorsNameTheCause) {
  struct Case {
    const char* name;
    SqlResponse version_answer;
    absl::StatusCode code;
    const char* part;
  };
  static const Case kCases[] = {
      {"unreachable", Refused(), absl::StatusCode::kUnavailable, "connection refused"},
      {"too old", Ok("18.14.19\t1\n"), absl::StatusCode::kFailedPrecondition, "18.16 or later"},
      {"not clickhouse", Ok("<html>\t1\n"), absl::StatusCode::kInvalidArgument, "version"},
      {"wrong password", Err(500, 193, "Wrong password for user chstate"), absl::StatusCode::kUnauthenticated,
       "password"},
      {"truncated answer", Ok("18.16"), absl::StatusCode::kDataLoss, "incomplete"},
  };
  for (const Case& c : kCases) {
    SCOPED_TRACE(c.name);
    auto store = MakeStore({}, SendOnce());
    int64_t clock = 0;
    auto t = store->Ping();
    Outcome o = Drive(*t, {Q("select_version", c.version_answer)}, &clock);
    EXPECT_THAT(o.last.status, StatusIs(c.code, HasSubstr(c.part)));
  }
}

// ---- the transport policy (core/task.h): resends are the core's, not the host's ----

TEST(TransportPolicy, AReadIsResentWithBackOffThenReportedUnavailable) {
  auto store = MakeStore();
  int64_t clock = 0;
  auto t = store->Get("a");
  Outcome o = Drive(*t,
                    {kVersion18, Q("get_state", Refused()), W(100), Q("get_state", Lost()), W(200),
                     Q("get_state", Refused())},
                    &clock);
  ASSERT_EQ(o.last.kind, Action::Kind::kFailed);
  EXPECT_THAT(o.last.status, StatusIs(absl::StatusCode::kUnavailable, HasSubstr("connection refused")));
}

TEST(TransportPolicy, ResendsCarryTheAttemptAndEveryRequestTheTimeout) {
  TransportPolicy p;
  p.request_timeout_ms = 1234;
  auto store = MakeStore({}, p);
  auto t = store->Get("a");
  Action a = t->Start({0, kRandom});
  ASSERT_EQ(a.kind, Action::Kind::kRunSql);
  EXPECT_EQ(a.request.attempt, 1);
  EXPECT_EQ(a.request.timeout_ms, 1234);
  a = t->OnResponse(Ok("18.16.1\t1\n"), {1, kRandom});
  ASSERT_EQ(a.request.purpose, "get_state");
  a = t->OnResponse(Lost(), {2, kRandom});
  ASSERT_EQ(a.kind, Action::Kind::kWait);
  EXPECT_EQ(a.wait_ms, 100);
  a = t->OnTimer({102, kRandom});
  ASSERT_EQ(a.kind, Action::Kind::kRunSql);
  EXPECT_EQ(a.request.purpose, "get_state");
  EXPECT_EQ(a.request.attempt, 2);
  EXPECT_EQ(a.request.timeout_ms, 1234);
  a = t->OnResponse(Ok(""), {103, kRandom});
  ASSERT_EQ(a.kind, Action::Kind::kDone) << a.status;
  EXPECT_FALSE(a.result.state.has_value());
}

TEST(TransportPolicy, AWriteThatMayHaveLandedIsNeverResent) {
  auto store = MakeStore();
  int64_t clock = 0;
  MeltanoState s;
  s.state_id = "a";
  s.completed = nlohmann::json::parse(R"({"singer_state":{}})");
  HoldLock(*store, "a", &clock, kVersion18);
  auto t = store->Set(s);
  Outcome o = Drive(*t, {Q("insert_state", Lost())}, &clock);
  ASSERT_EQ(o.last.kind, Action::Kind::kFailed);
  EXPECT_THAT(o.last.status, StatusIs(absl::StatusCode::kUnavailable, HasSubstr("connection reset")));
  EXPECT_EQ(o.purposes, (std::vector<std::string>{"insert_state"}));
}

TEST(TransportPolicy, AWriteThatNeverLeftIsResent) {
  auto store = MakeStore();
  int64_t clock = 0;
  MeltanoState s;
  s.state_id = "a";
  s.completed = nlohmann::json::parse(R"({"singer_state":{}})");
  HoldLock(*store, "a", &clock, kVersion18);
  auto t = store->Set(s);
  Outcome o = Drive(*t, {Q("insert_state", Refused()), W(100), Q("insert_state", Ok())}, &clock);
  ASSERT_EQ(o.last.kind, Action::Kind::kDone) << o.last.status;
}

TEST(TransportPolicy, ALockCreateThatMayHaveLandedIsInspectedNotResent) {
  auto store = MakeStore();
  int64_t clock = 0;
  auto t = store->AcquireLock("a");
  // The CREATE's answer was lost: the lock looks at its table and finds
  // itself the holder.
  Outcome o = Drive(*t, {kVersion18, Q("create_lock", Lost()), Q("inspect_lock", Mine())}, &clock);
  ASSERT_EQ(o.last.kind, Action::Kind::kDone) << o.last.status;
  EXPECT_EQ(o.last.result.lock_id, kLockId);
}

// A store (default settings) that has taken the lock on "a".
std::unique_ptr<Store> HoldingA(int64_t* clock) {
  auto store = MakeStore();
  auto acquire = store->AcquireLock("a");
  Outcome o = Drive(*acquire, {kVersion18, Q("create_lock", Ok())}, clock);
  EXPECT_EQ(o.last.kind, Action::Kind::kDone) << o.last.status;
  return store;
}

// Found by tests/faults (two holders at once): a DROP whose answer was lost
// had been resent by the transport policy. If the first DROP landed, B may
// have created its lock since; a resend would drop B's lock and let C in
// beside B. The release looks instead, and leaves a lock that is not ours.
TEST(TransportPolicy, ALockDropThatMayHaveLandedIsInspectedNotResent) {
  int64_t clock = 0;
  auto store = HoldingA(&clock);
  auto release = store->ReleaseLock("a", kLockId);
  Outcome o = Drive(*release,
            {Q("inspect_lock", Mine()), Q("drop_lock", Lost()), Q("inspect_lock", Held("someone-else", 101, 101))},
            &clock);
  ASSERT_EQ(o.last.kind, Action::Kind::kDone) << o.last.status;
  EXPECT_EQ(o.purposes, (std::vector<std::string>{"inspect_lock", "drop_lock", "inspect_lock"}));
}

// A DROP that never left (connection refused) cannot have landed: resending
// it is safe, and the release completes.
TEST(TransportPolicy, ALockDropThatNeverLeftIsResent) {
  int64_t clock = 0;
  auto store = HoldingA(&clock);
  auto release = store->ReleaseLock("a", kLockId);
  Outcome o = Drive(*release, {Q("inspect_lock", Mine()), Q("drop_lock", Refused()), W(100), Q("drop_lock", Ok())}, &clock);
  ASSERT_EQ(o.last.kind, Action::Kind::kDone) << o.last.status;
}

TEST(TransportPolicy, AnUnreachableServerFailsTheLockAfterEveryResend) {
  auto store = MakeStore();
  int64_t clock = 0;
  auto t = store->AcquireLock("a");
  // Each lock request is sent three times; three lock requests in a row
  // without any answer make the server unreachable.
  Outcome o = Drive(*t,
                    {kVersion18, Q("create_lock", Refused()), W(100), Q("create_lock", Refused()), W(200),
                     Q("create_lock", Refused()), Q("inspect_lock", Refused()), W(100), Q("inspect_lock", Refused()),
                     W(200), Q("inspect_lock", Refused()), W(1000), Q("create_lock", Refused()), W(100),
                     Q("create_lock", Refused()), W(200), Q("create_lock", Refused())},
                    &clock);
  ASSERT_EQ(o.last.kind, Action::Kind::kFailed);
  EXPECT_THAT(o.last.status, StatusIs(absl::StatusCode::kUnavailable, HasSubstr("connection refused")));
}

TEST(TransportPolicy, WaitsAndResendsAreRefusedOutOfOrder) {
  auto store = MakeStore();
  auto t = store->Get("a");
  Action a = t->Start({0, kRandom});
  a = t->OnResponse(Refused(), {1, kRandom});
  ASSERT_EQ(a.kind, Action::Kind::kWait);
  // An answer while the task waits to resend is a host bug.
  a = t->OnResponse(Ok("18.16.1\t1\n"), {2, kRandom});
  EXPECT_THAT(a.status, StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("misuse")));
  EXPECT_TRUE(t->finished());
}

// ---- the store's timers (Store::Tick, next_timeout_ms) ----

// A store holding "id" (stale window 30 s: renewal due 10 s after taking it).
std::unique_ptr<Store> HoldingStore(int64_t* clock) {
  LockOptions lock = ScriptLock();
  lock.stale_ms = 30000;
  auto store = MakeStore(lock);
  auto acquire = store->AcquireLock("id");
  Outcome o = Drive(*acquire, {kVersion18, Q("create_lock", Ok())}, clock);
  EXPECT_EQ(o.last.kind, Action::Kind::kDone) << o.last.status;
  EXPECT_EQ(o.last.result.next_timeout_ms, std::optional<int64_t>(*clock + 10000));
  return store;
}

// The holder's row as the renewal's confirmation reads it.
SqlResponse MineRenewed(int64_t now_s) {
  return Ok(absl::StrCat(kLockId, "\t0\t", now_s, "\t", now_s, "\t30\n\t255\t100\t", now_s, "\t0\n"));
}

TEST(StoreTimers, TickBeforeTheRenewalIsDueSendsNothing) {
  int64_t clock = 0;
  auto store = HoldingStore(&clock);
  clock += 9000;
  auto tick = store->Tick();
  Action a = tick->Start({clock, kRandom});
  ASSERT_EQ(a.kind, Action::Kind::kDone) << a.status;
  EXPECT_EQ(a.result.next_timeout_ms, store->NextTimeoutMs());
  EXPECT_GT(*a.result.next_timeout_ms, clock);
}

TEST(StoreTimers, TickRenewsWhenDueAndNamesTheNextRenewal) {
  int64_t clock = 0;
  auto store = HoldingStore(&clock);
  clock = *store->NextTimeoutMs();
  auto tick = store->Tick();
  Outcome o = Drive(*tick, {Q("renew_lock", Ok()), Q("inspect_lock", MineRenewed(110))}, &clock);
  ASSERT_EQ(o.last.kind, Action::Kind::kDone) << o.last.status;
  ASSERT_TRUE(o.last.result.next_timeout_ms.has_value());
  EXPECT_EQ(*o.last.result.next_timeout_ms, clock + 10000);
  EXPECT_TRUE(store->LeaseValid("id", clock + 20000));
}

// python_locks: the marker is renewed before the lock, and the lease is
// extended only after it was confirmed (docs/lock.md): a failed marker
// leaves the lease where it was and tries again after the retry wait.
TEST(StoreTimers, PythonLocksRenewTheMarkerFirstAndOnlyThenTheLease) {
  int64_t clock = 0;
  StoreOptions o;
  o.lock = ScriptLock();
  o.lock.stale_ms = 30000;
  o.python_locks = true;
  auto store = *Store::Create(o);
  auto acquire = store->AcquireLock("id");
  Outcome got = Drive(*acquire,
                      {kVersion18, Q("create_lock", Ok()), Q("python_lock_blocks", Ok("3\t2\n")),
                       Q("foreign_lock_rows", Ok("")), Q("insert_lock_marker", Ok(), "now() + 60"),
                       Q("foreign_lock_rows_and_parts", Ok("1\t2\n"))},
                      &clock);
  ASSERT_EQ(got.last.kind, Action::Kind::kDone) << got.last.status;
  const int64_t lease = store->LeaseDeadlineMs("id");
  clock = *store->NextTimeoutMs();
  auto tick = store->Tick();
  Outcome failed = Drive(*tick, {Q("insert_lock_marker", Err(500, 252, "Too many parts"))}, &clock);
  EXPECT_EQ(failed.purposes, (std::vector<std::string>{"insert_lock_marker"})) << "the lock renewed without its marker";
  EXPECT_EQ(store->LeaseDeadlineMs("id"), lease);
  clock = *store->NextTimeoutMs();
  auto again = store->Tick();
  Outcome renewed = Drive(*again, {Q("insert_lock_marker", Ok(), "now() + 60"), Q("renew_lock", Ok()),
                                   Q("inspect_lock", MineRenewed(110))},
                          &clock);
  ASSERT_EQ(renewed.last.kind, Action::Kind::kDone) << renewed.last.status;
  EXPECT_GT(store->LeaseDeadlineMs("id"), lease);
}

TEST(StoreTimers, UsingAHeldIdRenewsItFirstWhenDue) {
  int64_t clock = 0;
  auto store = HoldingStore(&clock);
  clock += 15000;
  MeltanoState state{"id", nlohmann::json::object(), nlohmann::json::parse(R"({"a":1})")};
  auto set = store->Set(state);
  Outcome o = Drive(*set, {Q("renew_lock", Ok()), Q("inspect_lock", MineRenewed(115)), Q("insert_state", Ok())},
                    &clock);
  ASSERT_EQ(o.last.kind, Action::Kind::kDone) << o.last.status;
  EXPECT_EQ(o.purposes, (std::vector<std::string>{"renew_lock", "inspect_lock", "insert_state"}));
}

TEST(StoreTimers, ALostLockEndsTheTickAndRefusesWritesUntilReleased) {
  int64_t clock = 0;
  auto store = HoldingStore(&clock);
  clock += 10000;
  auto tick = store->Tick();
  Outcome o = Drive(*tick, {Q("renew_lock", Ok()), Q("inspect_lock", Held("other", 100, 110))}, &clock);
  ASSERT_EQ(o.last.kind, Action::Kind::kFailed);
  EXPECT_THAT(o.last.status, StatusIs(absl::StatusCode::kAborted, HasSubstr("\"id\"")));
  EXPECT_FALSE(store->NextTimeoutMs().has_value());  // a lost lock is never renewed again
  // Neither a write nor a delete of the id goes out while the lost lock is known.
  MeltanoState state{"id", nlohmann::json::object(), nlohmann::json::parse(R"({"a":1})")};
  auto set = store->Set(state);
  Action a = set->Start({clock, kRandom});
  ASSERT_EQ(a.kind, Action::Kind::kFailed);
  EXPECT_THAT(a.status, StatusIs(absl::StatusCode::kAborted, HasSubstr("nothing was written")));
  // Releasing it sends nothing (it is not ours to drop) and forgets it, and
  // says that what ran under it was not exclusive.
  auto release = store->ReleaseLock("id", kLockId);
  a = release->Start({clock, kRandom});
  ASSERT_EQ(a.kind, Action::Kind::kFailed);
  EXPECT_THAT(a.status, StatusIs(absl::StatusCode::kAborted, HasSubstr("lost while held")));
  auto plain = store->Set(state);
  EXPECT_EQ(Drive(*plain, {Q("create_lock", Ok()), Q("insert_state", Ok()), Q("inspect_lock", Mine()),
                           Q("drop_lock", Ok())},
                  &clock)
                .last.kind,
            Action::Kind::kDone);
}

TEST(StoreTimers, UpdateOfAHeldIdUsesThatLock) {
  int64_t clock = 0;
  auto store = HoldingStore(&clock);
  MeltanoState incoming{"id", nlohmann::json::parse(R"({"p":2})"), nlohmann::json::object()};
  auto update = store->Update(incoming);
  Outcome o = Drive(*update, {Q("get_state", Ok("{\"p\":1}\t{}\n")), Q("insert_state", Ok())}, &clock);
  ASSERT_EQ(o.last.kind, Action::Kind::kDone) << o.last.status;
  // No lock taken or dropped: the held one serves, and stays held.
  EXPECT_EQ(o.purposes, (std::vector<std::string>{"get_state", "insert_state"}));
  EXPECT_TRUE(store->LeaseValid("id", clock));
  ASSERT_TRUE(o.last.result.state.has_value());
  EXPECT_EQ(o.last.result.state->partial, nlohmann::json::parse(R"({"p":2})"));
}

TEST(StoreTimers, UpdateOfAHeldIdAfterItsLeaseWritesNothing) {
  int64_t clock = 0;
  auto store = HoldingStore(&clock);
  clock += 31000;
  MeltanoState incoming{"id", nlohmann::json::parse(R"({"p":2})"), nlohmann::json::object()};
  auto update = store->Update(incoming);
  Outcome o = Drive(*update, {Q("get_state", Ok("{\"p\":1}\t{}\n"))}, &clock);
  ASSERT_EQ(o.last.kind, Action::Kind::kFailed);
  EXPECT_THAT(o.last.status, StatusIs(absl::StatusCode::kAborted, HasSubstr("nothing was written")));
}

TEST(Store, InvalidInputIsRejectedBeforeAnyRequest) {
  auto store = MakeStore();
  auto t = store->Get("");
  Action a = t->Start({0, kRandom});
  EXPECT_THAT(a.status, StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("empty")));
  auto m = store->Move("a", "a");
  EXPECT_THAT(m->Start({0, kRandom}).status, StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("different")));
  EXPECT_THAT(Store::Create(StoreOptions{"bad name", "state"}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("schema")));
}

TEST(Store, MissingRandomnessIsAnError) {
  auto store = MakeStore();
  auto t = store->AcquireLock("a");
  Action a = t->Start({0, "short"});
  a = t->OnResponse(Ok("18.16.1\t1\n"), {0, "short"});
  ASSERT_EQ(a.request.purpose, "foreign_lock_rows");
  a = t->OnResponse(Ok(""), {0, "short"});
  EXPECT_THAT(a.status, StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("random")));
}

TEST(Task, InputsOutOfOrderAreMisuse) {
  auto store = MakeStore();
  auto t = store->Get("a");
  EXPECT_THAT(t->OnTimer({0, kRandom}).status, StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("misuse")));
  auto t2 = store->Get("a");
  Action a = t2->Start({0, kRandom});
  ASSERT_EQ(a.kind, Action::Kind::kRunSql);
  EXPECT_THAT(t2->OnTimer({0, kRandom}).status, StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("misuse")));
  EXPECT_TRUE(t2->finished());
  EXPECT_THAT(t2->OnResponse(Ok(), {0, kRandom}).status, StatusIs(absl::StatusCode::kFailedPrecondition, Not(HasSubstr("x\ny"))));
  EXPECT_THAT(t2->Start({0, kRandom}).status, StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("twice")));
}

// A loop over held locks (Close, ReleaseLingering) whose task ends mid-release
// (abandoned by its host, or the store closed under it) leaves nothing
// allocated behind: store_lsan_test runs these under LeakSanitizer.
TEST(Store, CloseEndedMidReleaseLeavesNothingBehind) {
  auto store = MakeStore();
  int64_t clock = 0;
  HoldLock(*store, "a", &clock, kVersion18);
  auto close = store->Close();
  Action a = close->Start({clock, kRandom});
  ASSERT_EQ(a.kind, Action::Kind::kRunSql) << a.status;
  close.reset();
}

TEST(LingeringStore, ReleaseLingeringEndedMidReleaseLeavesNothingBehind) {
  auto store = MakeLingeringStore();
  int64_t clock = 0;
  const std::string lock_id = Acquired(*store, &clock, {kVersion18, Q("create_lock", Ok())});
  auto release = store->ReleaseLock("id", lock_id);
  ASSERT_EQ(Drive(*release, {}, &clock).last.kind, Action::Kind::kDone);
  auto lingering = store->ReleaseLingering();
  Action a = lingering->Start({clock, kRandom});
  ASSERT_EQ(a.kind, Action::Kind::kRunSql) << a.status;
  lingering.reset();
}

}  // namespace
}  // namespace chstate
