// Scripted replica answers for a cluster-mode store over three hosts (a, b,
// c): what ClickHouse replicas say when they lag, lose ZooKeeper, miss their
// quorum or drop the connection, and what the core does with it. Each
// exchange names the host the request must go to and the answer that host
// gives, so a test pins what is resent, to which host, and what fails with
// which status, for reads, quorum writes and the cluster claims lock
// (docs/cluster.md; core/task.h's TransportPolicy).
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/clickhouse_errors.h"
#include "core/lock.h"
#include "core/response.h"
#include "core/store.h"
#include "core/testing/responses.h"
#include "core/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace chstate {
namespace {

using ::chstate::testing::Err;
using ::chstate::testing::IsOk;
using ::chstate::testing::Lost;
using ::chstate::testing::Ok;
using ::chstate::testing::Refused;
using ::chstate::testing::StatusIs;
using ::testing::HasSubstr;
using ::testing::Not;

const std::string kRandom(32, '\x11');
const std::string kLockId = MakeLockId(kRandom);
// An acquisition's first claim: its random prefix and a number.
const std::string kClaimId = kLockId.substr(0, 24) + "00000001";
const std::string kClaimId2 = kLockId.substr(0, 24) + "00000002";
// A claim of another process (another random prefix).
const std::string kOtherProcessClaim = MakeLockId(std::string(32, '\x22')).substr(0, 24) + "00000001";

// One step of a script: a request to `host` ("a", "b", "c") for `purpose`,
// answered with `response`; or (purpose "") a wait the task asks for.
struct Exchange {
  std::string host;
  std::string purpose;
  SqlResponse response;
};
Exchange At(std::string host, std::string purpose, SqlResponse r) {
  return Exchange{std::move(host), std::move(purpose), std::move(r)};
}
Exchange Wait() { return Exchange{}; }

// What ClickHouse 18.16 answers with `code`.
SqlResponse Code(int code) { return Err(500, code, absl::StrCat("replica says ", code)); }

struct Script {
  Action last;
  std::vector<std::string> sent;  // "host purpose", in order
  int waits = 0;
};

// Drives `task` through `script`, failing the test on any deviation: every
// request must go to the host and be for the purpose the script says.
Script Drive(Task& task, const std::vector<Exchange>& script, int64_t* clock) {
  Script out;
  Action a = task.Start({*clock, kRandom});
  auto skip_foreign = [&] {  // every acquisition first looks for Python backend rows: none here
    while (a.kind == Action::Kind::kRunSql && a.request.purpose == "foreign_lock_rows") {
      *clock += 2;
      a = task.OnResponse(Ok(""), {*clock, kRandom});
    }
  };
  for (const Exchange& e : script) {
    skip_foreign();
    if (e.purpose.empty()) {
      EXPECT_EQ(a.kind, Action::Kind::kWait) << "expected a wait after " << ::testing::PrintToString(out.sent);
      if (a.kind != Action::Kind::kWait) break;
      ++out.waits;
      *clock += a.wait_ms;
      a = task.OnTimer({*clock, kRandom});
      continue;
    }
    EXPECT_EQ(a.kind, Action::Kind::kRunSql) << "expected " << e.host << " " << e.purpose << " after "
                                             << ::testing::PrintToString(out.sent) << "; status " << a.status;
    if (a.kind != Action::Kind::kRunSql) break;
    out.sent.push_back(absl::StrCat(a.request.endpoint.host, " ", a.request.purpose));
    EXPECT_EQ(out.sent.back(), absl::StrCat(e.host, " ", e.purpose)) << "after " << ::testing::PrintToString(out.sent);
    *clock += 2;
    a = task.OnResponse(e.response, {*clock, kRandom});
  }
  skip_foreign();
  out.last = a;
  return out;
}

// The host the next request of a fresh read goes to.
std::string NextHost(Store& store, int64_t now) {
  std::unique_ptr<Task> t = store.Ping();
  Action a = t->Start({now, kRandom});
  return a.kind == Action::Kind::kRunSql ? a.request.endpoint.host : "(none)";
}

std::unique_ptr<Store> ClusterStore() {
  StoreOptions o;
  o.lock.stale_ms = 300000;
  o.lock.timeout_ms = 10000;
  o.cluster.name = "prod";
  o.cluster.quorum_timeout_ms = 1000;
  o.cluster.quorum_busy_ms = 1000;
  o.hosts = {{"a", 8123}, {"b", 8123}, {"c", 8123}};
  absl::StatusOr<std::unique_ptr<Store>> s = Store::Create(o);
  EXPECT_THAT(s, IsOk());
  return std::move(*s);
}

const SqlResponse kVersion = Ok("18.16.1\t1\n");
const SqlResponse kReplicated = Ok("ReplicatedReplacingMergeTree\t1\n");
// A cluster state read's answer from `replica` (Statements::GetState): its
// newest row, completed `completed`, version `ms`, in a part whose last
// block is `block` (none when `completed` is empty), and the row naming it.
SqlResponse StateAt(const std::string& replica, const std::string& completed = R"({"singer_state":{"a":1}})",
                    int64_t ms = 1000, int64_t block = 1) {
  const std::string row = completed.empty() ? "" : absl::StrCat("{}\t", completed, "\t", ms, "\t", block, "\t\t\t\n");
  return Ok(absl::StrCat(row, "#replica\t3\t\t\t\t", replica, "\t\n"));
}
const SqlResponse kStateRow = StateAt("rb");

// A claims answer row: lock id, claim rows, end rows (`ends`), newest row,
// stale_s, over, now; Claim: the answer of that row alone, not ended.
std::string ClaimRow(const std::string& id, int ends, int64_t now_s) {
  return absl::StrCat(id, "\t1\t", ends, "\t", now_s, "\t300\t\t", now_s, "\n");
}
SqlResponse Claim(const std::string& id, int64_t now_s) { return Ok(ClaimRow(id, 0, now_s)); }

MeltanoState State() {
  return MeltanoState{"id", nlohmann::json::object(), nlohmann::json::parse(R"({"singer_state":{"a":1}})")};
}

// The store (connected, its table checked) holds the claims lock on "id",
// all on host a.
void HoldLock(Store& store, int64_t* clock) {
  std::unique_ptr<Task> t = store.AcquireLock("id");
  Script r = Drive(*t,
                {At("a", "select_version", kVersion), At("a", "state_table_engine", kReplicated),
                 At("a", "inspect_claims", Ok("")), At("a", "claim_lock", Ok()),
                 At("a", "inspect_claims", Claim(kClaimId, 100))},
                clock);
  ASSERT_EQ(r.last.kind, Action::Kind::kDone) << r.last.status;
}

// Drives `task` to its end, each request answered by `answer(purpose,
// clock)`; waits are waited. Stops after `max_steps` (a task that never
// ends). `waits` collects the waits' lengths.
Action RunToEnd(Task& task, int64_t* clock, const std::function<SqlResponse(const std::string&, int64_t)>& answer,
                std::vector<int64_t>* waits = nullptr, int max_steps = 5000, const std::string& random = kRandom) {
  Action a = task.Start({*clock, random});
  for (int i = 0; i < max_steps && (a.kind == Action::Kind::kRunSql || a.kind == Action::Kind::kWait); ++i) {
    if (a.kind == Action::Kind::kWait) {
      if (waits) waits->push_back(a.wait_ms);
      *clock += a.wait_ms;
      a = task.OnTimer({*clock, random});
      continue;
    }
    *clock += 2;
    // Answered first: an answer may move the clock on (a server that took long).
    const SqlResponse response = answer(a.request.purpose, *clock);
    a = task.OnResponse(response, {*clock, random});
  }
  return a;
}

// ---- reads: replica-level errors and lost answers go to the next host at once ----

TEST(ReplicaReads, ALaggingReplicaIs289AndTheReadGoesToTheNextHostAtOnce) {
  auto store = ClusterStore();
  int64_t clock = 0;
  std::unique_ptr<Task> get = store->Get("id");
  Script r = Drive(*get,
                {At("a", "select_version", kVersion), At("a", "state_table_engine", kReplicated),
                 At("a", "get_state", Code(ch::kReplicaIsNotInQuorum)), At("b", "get_state", kStateRow),
                 At("c", "get_state", StateAt("rc"))},
                &clock);
  ASSERT_EQ(r.last.kind, Action::Kind::kDone) << r.last.status;
  EXPECT_EQ(r.waits, 0) << "another host is asked at once, without the back-off";
  ASSERT_TRUE(r.last.result.state.has_value());
  EXPECT_EQ(NextHost(*store, clock), "b");  // a is marked down
}

TEST(ReplicaReads, ZooKeeperAndNetworkErrorsOnAReadGoToEachOtherHost) {
  auto store = ClusterStore();
  int64_t clock = 0;
  std::unique_ptr<Task> get = store->Get("id");
  Script r = Drive(*get,
                {At("a", "select_version", kVersion), At("a", "state_table_engine", kReplicated),
                 At("a", "get_state", Code(ch::kKeeperException)), At("b", "get_state", Code(ch::kNetworkError)),
                 At("c", "get_state", StateAt("rc")), At("a", "get_state", StateAt("ra"))},
                &clock);
  ASSERT_EQ(r.last.kind, Action::Kind::kDone) << r.last.status;
  EXPECT_EQ(r.waits, 0);
}

TEST(ReplicaReads, ALostOrRefusedReadGoesToTheNextHost) {
  auto store = ClusterStore();
  int64_t clock = 0;
  std::unique_ptr<Task> get = store->Get("id");
  Script r = Drive(*get,
                {At("a", "select_version", Refused()), At("b", "select_version", kVersion),
                 At("b", "state_table_engine", kReplicated), At("b", "get_state", Lost()),
                 At("c", "get_state", StateAt("rc")), At("a", "get_state", StateAt("ra"))},
                &clock);
  ASSERT_EQ(r.last.kind, Action::Kind::kDone) << r.last.status;
}

TEST(ReplicaReads, EveryReplicaLaggingRetriesAfterTheBackOffThenFailsUnavailable) {
  auto store = ClusterStore();
  int64_t clock = 0;
  std::unique_ptr<Task> get = store->Get("id");
  Action a = get->Start({clock, kRandom});
  int sends = 0, waits = 0;
  std::vector<std::string> hosts;
  while (a.kind == Action::Kind::kRunSql || a.kind == Action::Kind::kWait) {
    ASSERT_LT(sends, 100);
    if (a.kind == Action::Kind::kWait) {
      ++waits;
      clock += a.wait_ms;
      a = get->OnTimer({clock, kRandom});
      continue;
    }
    clock += 2;
    if (a.request.purpose != "get_state") {
      a = get->OnResponse(a.request.purpose == "select_version" ? kVersion : kReplicated, {clock, kRandom});
      continue;
    }
    ++sends;
    hosts.push_back(a.request.endpoint.host);
    a = get->OnResponse(Code(ch::kReplicaIsNotInQuorum), {clock, kRandom});
  }
  ASSERT_EQ(a.kind, Action::Kind::kFailed);
  // Each round asks every host, then waits; a lagging replica catches up
  // within moments, so a read gets twice the attempts (2 x 3 rounds).
  EXPECT_EQ(sends, 18);
  EXPECT_EQ(waits, 5);
  EXPECT_EQ((std::vector<std::string>(hosts.begin(), hosts.begin() + 3)), (std::vector<std::string>{"a", "b", "c"}));
  EXPECT_THAT(a.status, StatusIs(absl::StatusCode::kUnavailable, ::testing::_));
  EXPECT_EQ(ClickHouseCode(a.status), ch::kReplicaIsNotInQuorum);
}

TEST(ReplicaReads, EveryHostRefusingFailsUnavailableNamingEachHost) {
  auto store = ClusterStore();
  int64_t clock = 0;
  std::unique_ptr<Task> get = store->Get("id");
  Script r = Drive(*get,
                {At("a", "select_version", Refused()), At("b", "select_version", Refused()),
                 At("c", "select_version", Refused()), Wait(), At("a", "select_version", Refused()),
                 At("b", "select_version", Refused()), At("c", "select_version", Refused()), Wait(),
                 At("a", "select_version", Refused()), At("b", "select_version", Refused()),
                 At("c", "select_version", Refused())},
                &clock);
  ASSERT_EQ(r.last.kind, Action::Kind::kFailed);
  EXPECT_THAT(r.last.status, StatusIs(absl::StatusCode::kUnavailable, HasSubstr("no host answered")));
  for (const char* h : {"a:8123", "b:8123", "c:8123"}) EXPECT_THAT(r.last.status.message(), HasSubstr(h));
}

// ---- quorum writes: what is resent, where, and what fails how ----

TEST(ReplicaWrites, Code286IsRetriedOnTheSameHostAfterAPauseUntilItLands) {
  auto store = ClusterStore();
  int64_t clock = 0;
  HoldLock(*store, &clock);
  std::unique_ptr<Task> set = store->Set(State());
  Script r = Drive(*set,
                {At("a", "insert_state", Code(ch::kUnsatisfiedQuorumForPreviousWrite)), Wait(),
                 At("a", "insert_state", Code(ch::kUnsatisfiedQuorumForPreviousWrite)), Wait(),
                 At("a", "insert_state", Ok())},
                &clock);
  EXPECT_EQ(r.last.kind, Action::Kind::kDone) << r.last.status;
}

TEST(ReplicaWrites, Code252TooManyPartsIsRetriedLike286) {
  auto store = ClusterStore();
  int64_t clock = 0;
  HoldLock(*store, &clock);
  std::unique_ptr<Task> set = store->Set(State());
  Script r = Drive(*set, {At("a", "insert_state", Code(ch::kTooManyParts)), Wait(), At("a", "insert_state", Ok())},
                &clock);
  EXPECT_EQ(r.last.kind, Action::Kind::kDone) << r.last.status;
}

TEST(ReplicaWrites, Code286PastTheQuorumBusyTimeFailsUnavailableWithTheCause) {
  auto store = ClusterStore();
  int64_t clock = 0;
  HoldLock(*store, &clock);
  std::unique_ptr<Task> set = store->Set(State());
  const int64_t start = clock;
  Action a = set->Start({clock, kRandom});
  int sends = 0;
  while (a.kind == Action::Kind::kRunSql || a.kind == Action::Kind::kWait) {
    ASSERT_LT(sends, 200);
    if (a.kind == Action::Kind::kWait) {
      clock += a.wait_ms;
      a = set->OnTimer({clock, kRandom});
      continue;
    }
    ASSERT_EQ(a.request.purpose, "insert_state");
    EXPECT_EQ(a.request.endpoint.host, "a") << "286 is the table's state, not the replica's: no other host";
    ++sends;
    clock += 2;
    a = set->OnResponse(Code(ch::kUnsatisfiedQuorumForPreviousWrite), {clock, kRandom});
  }
  ASSERT_EQ(a.kind, Action::Kind::kFailed);
  EXPECT_GE(clock - start, 1000);  // quorum_busy_ms
  EXPECT_THAT(a.status, StatusIs(absl::StatusCode::kUnavailable, HasSubstr("not reached its quorum of 2")));
  EXPECT_EQ(ClickHouseCode(a.status), ch::kUnsatisfiedQuorumForPreviousWrite);
}

// A state write under a held lock answered 286 for longer than the lease:
// the store renews the lock during the wait (nothing was written, so the
// lock is still its own) and keeps trying until quorum_busy_ms, as Meltano's
// run does while a killed replica restarts. `renewal_claims` answers each
// inspection after a renewal row; returns the final action and the number
// of renewals sent.
struct LongBusyWrite {
  Action last;
  int renewals = 0;
  int writes = 0;
};
LongBusyWrite WriteBusyFor(int64_t busy_ms, const std::function<SqlResponse(int64_t now_s)>& renewal_claims,
                           bool held = true) {
  StoreOptions o;
  o.lock.stale_ms = 3000;  // a lease of 2.7 s
  o.lock.timeout_ms = 10000;
  o.cluster.name = "prod";
  o.cluster.quorum_timeout_ms = 1000;
  o.cluster.quorum_busy_ms = 20000;
  o.hosts = {{"a", 8123}, {"b", 8123}, {"c", 8123}};
  auto store = Store::Create(o);
  EXPECT_THAT(store, IsOk());
  int64_t clock = 0;
  if (held) HoldLock(**store, &clock);
  std::unique_ptr<Task> set = (*store)->Set(State());
  int64_t start = clock;
  bool claimed = false;
  LongBusyWrite out;
  Action a = set->Start({clock, kRandom});
  while (a.kind == Action::Kind::kRunSql || a.kind == Action::Kind::kWait) {
    if (out.writes + out.renewals > 2000) break;
    if (a.kind == Action::Kind::kWait) {
      clock += a.wait_ms;
      a = set->OnTimer({clock, kRandom});
      continue;
    }
    const std::string purpose = a.request.purpose;
    clock += 2;
    if (!held && out.writes == 0 && purpose != "insert_state") {
      // Set taking the lock itself: connecting, then claiming it.
      SqlResponse answer = Ok("");
      if (purpose == "select_version") answer = kVersion;
      if (purpose == "state_table_engine") answer = kReplicated;
      // The claims before ours (none), then ours after the claim row.
      if (purpose == "inspect_claims" && claimed) answer = Claim(kClaimId, 100 + clock / 1000);
      if (purpose == "claim_lock") claimed = true;
      a = set->OnResponse(answer, {clock, kRandom});
      start = clock;
      continue;
    }
    if (purpose == "insert_state") {
      ++out.writes;
      EXPECT_GT(a.request.send_before_ms, clock - 2) << "a write sent past its lease";
      a = set->OnResponse(clock - start < busy_ms ? Code(ch::kUnsatisfiedQuorumForPreviousWrite) : Ok(),
                          {clock, kRandom});
    } else if (purpose == "renew_claim") {
      ++out.renewals;
      a = set->OnResponse(Ok(), {clock, kRandom});
    } else if (purpose == "inspect_claims") {
      a = set->OnResponse(renewal_claims(100 + clock / 1000), {clock, kRandom});
    } else if (!held && purpose == "end_claim") {  // Set releasing its own lock
      a = set->OnResponse(Ok(), {clock, kRandom});
    } else {
      ADD_FAILURE() << "unexpected request " << purpose;
      break;
    }
  }
  out.last = a;
  return out;
}

TEST(ReplicaWrites, Code286LongerThanTheLeaseRenewsTheHeldLockAndTheWriteLands) {
  LongBusyWrite r = WriteBusyFor(8000, [](int64_t now_s) { return Claim(kClaimId, now_s); });
  EXPECT_EQ(r.last.kind, Action::Kind::kDone) << r.last.status;
  // 8 s of 286 against a 2.7 s lease: a renewal at each lease's end.
  EXPECT_GE(r.renewals, 2);
  EXPECT_LE(r.renewals, 8);
  EXPECT_GT(r.writes, r.renewals);
}

TEST(ReplicaWrites, Code286LongerThanTheLeaseRenewsTheLockTheWritesOwnTaskTook) {
  LongBusyWrite r = WriteBusyFor(8000, [](int64_t now_s) { return Claim(kClaimId, now_s); }, /*held=*/false);
  EXPECT_EQ(r.last.kind, Action::Kind::kDone) << r.last.status;
  EXPECT_GE(r.renewals, 2);
  EXPECT_LE(r.renewals, 8);
}

TEST(ReplicaWrites, Code286LongerThanTheLeaseWithTheLockFoundLostFailsAbortedNothingResent) {
  // The renewal's inspection shows another holder's claim only: lost.
  LongBusyWrite r = WriteBusyFor(8000, [](int64_t now_s) { return Claim(kOtherProcessClaim, now_s); });
  ASSERT_EQ(r.last.kind, Action::Kind::kFailed);
  EXPECT_THAT(r.last.status, StatusIs(absl::StatusCode::kAborted, HasSubstr("waited out code 286")));
  EXPECT_EQ(r.renewals, 1);
}

TEST(ReplicaWrites, AnOnClusterCreateTimingOutOnADownHost159StillWritesTheState) {
  // The first write finds no database: the schema is made ON CLUSTER, and a
  // host that is down does not run it in time (159). The live hosts did, so
  // the write goes on.
  auto store = ClusterStore();
  int64_t clock = 0;
  HoldLock(*store, &clock);
  std::unique_ptr<Task> set = store->Set(State());
  int writes = 0;
  std::vector<std::string> ddl;
  Action a = RunToEnd(*set, &clock, [&](const std::string& purpose, int64_t) {
    if (purpose == "insert_state") return ++writes == 1 ? Code(ch::kUnknownDatabase) : Ok();
    if (purpose.rfind("create_", 0) == 0) {
      ddl.push_back(purpose);
      return Code(ch::kTimeoutExceeded);
    }
    return Ok("");
  });
  EXPECT_EQ(a.kind, Action::Kind::kDone) << a.status;
  EXPECT_EQ(writes, 2);
  EXPECT_GE(ddl.size(), 3u) << ::testing::PrintToString(ddl);
}

TEST(ReplicaWrites, Code285FailsAtOnceUnavailableAndIsNotSentElsewhere) {
  auto store = ClusterStore();
  int64_t clock = 0;
  HoldLock(*store, &clock);
  std::unique_ptr<Task> set = store->Set(State());
  Script r = Drive(*set, {At("a", "insert_state", Code(ch::kTooFewLiveReplicas))}, &clock);
  ASSERT_EQ(r.last.kind, Action::Kind::kFailed);
  EXPECT_THAT(r.last.status, StatusIs(absl::StatusCode::kUnavailable, HasSubstr("fewer than 2 replicas are alive")));
  EXPECT_EQ(ClickHouseCode(r.last.status), ch::kTooFewLiveReplicas);
  EXPECT_EQ(NextHost(*store, clock), "a") << "285 is the cluster's state: the host is not marked down";
}

// Code 319: the row is on host a, its quorum not confirmed in time. The
// state write replaces itself, so it goes again to the next host, where the
// first row's pending quorum answers 286 until it is confirmed.
TEST(ReplicaWrites, Code319IsSentAgainOnTheNextHostWhere286IsWaitedOutUntilItLands) {
  auto store = ClusterStore();
  int64_t clock = 0;
  HoldLock(*store, &clock);
  std::unique_ptr<Task> set = store->Set(State());
  Script r = Drive(*set,
                {At("a", "insert_state", Code(ch::kUnknownStatusOfInsert)), Wait(),
                 At("b", "insert_state", Code(ch::kUnsatisfiedQuorumForPreviousWrite)), Wait(),
                 At("b", "insert_state", Ok())},
                &clock);
  EXPECT_EQ(r.last.kind, Action::Kind::kDone) << r.last.status;
  EXPECT_EQ(NextHost(*store, clock), "b") << "a replica with an unconfirmed write holds up its next writes";
}

// The 319 itself takes the quorum timeout, which may be longer than
// quorum_busy_ms: the resend still gets quorum_busy_ms from the 319.
TEST(ReplicaWrites, Code319ArrivingPastTheQuorumBusyTimeStillGetsThatTimeToLand) {
  auto store = ClusterStore();  // quorum_busy_ms 1000
  int64_t clock = 0;
  HoldLock(*store, &clock);
  std::unique_ptr<Task> set = store->Set(State());
  int writes = 0;
  int64_t answered_319 = 0;
  Action a = RunToEnd(*set, &clock, [&](const std::string& purpose, int64_t now) {
    if (purpose != "insert_state") return Ok("");
    if (++writes == 1) {
      clock += 1500;  // the server waited its quorum timeout
      answered_319 = clock;
      return Code(ch::kUnknownStatusOfInsert);
    }
    return now - answered_319 < 600 ? Code(ch::kUnsatisfiedQuorumForPreviousWrite) : Ok();
  });
  EXPECT_EQ(a.kind, Action::Kind::kDone) << a.status;
  EXPECT_GT(writes, 2);
}

// A write whose 319 was not settled: kUnavailable, the outcome explained,
// ClickHouse's code kept.
void ExpectUnknownOutcome(const Action& a) {
  ASSERT_EQ(a.kind, Action::Kind::kFailed);
  EXPECT_THAT(a.status, StatusIs(absl::StatusCode::kUnavailable, HasSubstr("unknown outcome of the write")));
  EXPECT_EQ(ClickHouseCode(a.status), ch::kUnknownStatusOfInsert);
}

// Still unconfirmed when the time is up: the caller learns the first
// write's unknown outcome (not the 286's "nothing was written").
TEST(ReplicaWrites, Code319Then286UntilTheQuorumBusyTimeFailsNamingTheUnknownOutcome) {
  auto store = ClusterStore();
  int64_t clock = 0;
  HoldLock(*store, &clock);
  std::unique_ptr<Task> set = store->Set(State());
  int writes = 0;
  Action a = RunToEnd(*set, &clock, [&](const std::string& purpose, int64_t) {
    if (purpose != "insert_state") return Ok("");
    return ++writes == 1 ? Code(ch::kUnknownStatusOfInsert) : Code(ch::kUnsatisfiedQuorumForPreviousWrite);
  });
  ExpectUnknownOutcome(a);
  EXPECT_THAT(a.status.message(), HasSubstr("sent again for 1000 ms"));
  EXPECT_THAT(a.status.message(), HasSubstr("replica says 286"));
  EXPECT_GT(writes, 2);
}

// A second 319 is not resent again: the outcome is explained.
TEST(ReplicaWrites, ASecondCode319FailsWithTheOutcomeExplained) {
  auto store = ClusterStore();
  int64_t clock = 0;
  HoldLock(*store, &clock);
  std::unique_ptr<Task> set = store->Set(State());
  Script r = Drive(*set,
                {At("a", "insert_state", Code(ch::kUnknownStatusOfInsert)), Wait(),
                 At("b", "insert_state", Code(ch::kUnknownStatusOfInsert))},
                &clock);
  ExpectUnknownOutcome(r.last);
}

// A state write under the lock is idempotent (the whole state, replacing
// itself; nobody else writes the id meanwhile): a ZooKeeper or network error
// on that replica, or a lost answer, sends it to the next host at once.
TEST(ReplicaWrites, AStateWriteWithAZooKeeperErrorOrLostAnswerGoesToTheNextHost) {
  for (const SqlResponse& failure : {Code(ch::kKeeperException), Code(ch::kNetworkError), Lost()}) {
    SCOPED_TRACE(failure.body + failure.transport_error);
    auto store = ClusterStore();
    int64_t clock = 0;
    HoldLock(*store, &clock);
    std::unique_ptr<Task> set = store->Set(State());
    Script r = Drive(*set, {At("a", "insert_state", failure), At("b", "insert_state", Ok())}, &clock);
    EXPECT_EQ(r.last.kind, Action::Kind::kDone) << r.last.status;
    EXPECT_EQ(r.waits, 0);
  }
}

// A write of the state, under the lock, that every replica answers with
// `answer` (waits waited out): its last action, and how many times it was sent.
Action WriteAnsweredEverywhere(const SqlResponse& answer, int* sends) {
  auto store = ClusterStore();
  int64_t clock = 0;
  HoldLock(*store, &clock);
  std::unique_ptr<Task> set = store->Set(State());
  Action a = set->Start({clock, kRandom});
  *sends = 0;
  while ((a.kind == Action::Kind::kRunSql || a.kind == Action::Kind::kWait) && *sends < 100) {
    if (a.kind == Action::Kind::kWait) {
      clock += a.wait_ms;
      a = set->OnTimer({clock, kRandom});
      continue;
    }
    EXPECT_EQ(a.request.purpose, "insert_state");
    ++*sends;
    clock += 2;
    a = set->OnResponse(answer, {clock, kRandom});
  }
  return a;
}

// Every replica failing a write with a ZooKeeper error: kUnavailable, saying so.
TEST(ReplicaWrites, ZooKeeperErrorOnEveryHostIsUnavailableAndSaysSo) {
  int sends = 0;
  Action a = WriteAnsweredEverywhere(Code(ch::kKeeperException), &sends);
  ASSERT_LT(sends, 100);
  ASSERT_EQ(a.kind, Action::Kind::kFailed);
  EXPECT_EQ(sends, 3) << "one round of the hosts: a ClickHouse error is no transport failure to back off from";
  EXPECT_THAT(a.status, StatusIs(absl::StatusCode::kUnavailable, HasSubstr("cannot reach ZooKeeper")));
  EXPECT_EQ(ClickHouseCode(a.status), ch::kKeeperException);
}

// 164 "Replica is not active right now": a quorum write on a replica whose
// ZooKeeper session is being restored, refused before anything is written.
SqlResponse NotActive() { return Err(500, ch::kReadonly, "Replica is not active right now"); }

TEST(ReplicaWrites, AReplicaNotActiveOnEveryHostIsUnavailableAndSaysSo) {
  int sends = 0;
  Action a = WriteAnsweredEverywhere(NotActive(), &sends);
  ASSERT_LT(sends, 100);
  ASSERT_EQ(a.kind, Action::Kind::kFailed);
  EXPECT_EQ(sends, 3) << "each replica once, as for a ZooKeeper error";
  EXPECT_THAT(a.status, StatusIs(absl::StatusCode::kUnavailable, HasSubstr("cannot reach ZooKeeper")));
  EXPECT_THAT(a.status.message(), Not(HasSubstr("profile")));
  EXPECT_EQ(ClickHouseCode(a.status), ch::kReadonly);
}

// 164 that is not a replica restoring its session (a read-only profile):
// the same on every replica, so the write fails at once, not after going
// round them.
TEST(ReplicaWrites, A164ReadOnlyProfileFailsAtOnceAndIsNotSentElsewhere) {
  int sends = 0;
  Action a = WriteAnsweredEverywhere(Err(500, ch::kReadonly, "Cannot execute query in readonly mode"), &sends);
  ASSERT_EQ(a.kind, Action::Kind::kFailed);
  EXPECT_EQ(sends, 1);
  EXPECT_THAT(a.status, StatusIs(absl::StatusCode::kPermissionDenied, HasSubstr("read")));
}

// Nothing was written, so even a claim (not idempotent) goes to the next
// replica at once.
TEST(ReplicaClaims, AClaimRefusedByAReplicaNotActiveGoesToTheNextReplica) {
  auto store = ClusterStore();
  int64_t clock = 0;
  std::unique_ptr<Task> t = store->AcquireLock("id");
  Script r = Drive(*t,
                {At("a", "select_version", kVersion), At("a", "state_table_engine", kReplicated),
                 At("a", "inspect_claims", Ok("")), At("a", "claim_lock", NotActive()), At("b", "claim_lock", Ok()),
                 At("b", "inspect_claims", Claim(kClaimId, 100))},
                &clock);
  ASSERT_EQ(r.last.kind, Action::Kind::kDone) << r.last.status;
  EXPECT_EQ(r.last.result.lock_id, kClaimId);
  EXPECT_EQ(r.waits, 0);
}

// A claim is not idempotent (a second claim row is a second claim): a
// ZooKeeper error on it is not sent elsewhere.
TEST(ReplicaClaims, AClaimFailingWithAZooKeeperErrorIsNotSentElsewhere) {
  auto store = ClusterStore();
  int64_t clock = 0;
  std::unique_ptr<Task> t = store->AcquireLock("id");
  Script r = Drive(*t,
                {At("a", "select_version", kVersion), At("a", "state_table_engine", kReplicated),
                 At("a", "inspect_claims", Ok("")), At("a", "claim_lock", Code(ch::kKeeperException))},
                &clock);
  ASSERT_EQ(r.last.kind, Action::Kind::kFailed) << r.last.request.endpoint.host << " " << r.last.request.purpose;
  EXPECT_THAT(r.last.status, StatusIs(absl::StatusCode::kUnavailable, HasSubstr("cannot reach ZooKeeper")));
}

TEST(ReplicaWrites, ARefusedWriteGoesToTheNextHostAtOnce) {
  auto store = ClusterStore();
  int64_t clock = 0;
  HoldLock(*store, &clock);
  std::unique_ptr<Task> set = store->Set(State());
  Script r = Drive(*set, {At("a", "insert_state", Refused()), At("b", "insert_state", Ok())}, &clock);
  EXPECT_EQ(r.last.kind, Action::Kind::kDone) << r.last.status;
  EXPECT_EQ(r.waits, 0);
}

// ---- the cluster claims lock ----

TEST(ReplicaClaims, ALaggingReplicaAnsweringTheClaimsReadIsLeftForTheNext) {
  auto store = ClusterStore();
  int64_t clock = 0;
  std::unique_ptr<Task> t = store->AcquireLock("id");
  Script r = Drive(*t,
                {At("a", "select_version", kVersion), At("a", "state_table_engine", kReplicated),
                 At("a", "inspect_claims", Ok("")), At("a", "claim_lock", Ok()),
                 At("a", "inspect_claims", Code(ch::kReplicaIsNotInQuorum)), At("b", "inspect_claims", Claim(kClaimId, 100))},
                &clock);
  ASSERT_EQ(r.last.kind, Action::Kind::kDone) << r.last.status;
  EXPECT_EQ(r.last.result.lock_id, kClaimId);
}

TEST(ReplicaClaims, AClaimRefusedWith286IsSentAgainAfterAPause) {
  auto store = ClusterStore();
  int64_t clock = 0;
  std::unique_ptr<Task> t = store->AcquireLock("id");
  Script r = Drive(*t,
                {At("a", "select_version", kVersion), At("a", "state_table_engine", kReplicated),
                 At("a", "inspect_claims", Ok("")), At("a", "claim_lock", Code(ch::kUnsatisfiedQuorumForPreviousWrite)),
                 Wait(), At("a", "claim_lock", Ok()), At("a", "inspect_claims", Claim(kClaimId, 100))},
                &clock);
  ASSERT_EQ(r.last.kind, Action::Kind::kDone) << r.last.status;
  EXPECT_EQ(r.last.result.lock_id, kClaimId);
}

// 252 (too many parts) wrote nothing, as 286: the claim goes again after a
// pause instead of the acquisition backing off a whole retry.
TEST(ReplicaClaims, AClaimRefusedWith252IsSentAgainAfterAPause) {
  auto store = ClusterStore();
  int64_t clock = 0;
  std::unique_ptr<Task> t = store->AcquireLock("id");
  Script r = Drive(*t,
                {At("a", "select_version", kVersion), At("a", "state_table_engine", kReplicated),
                 At("a", "inspect_claims", Ok("")), At("a", "claim_lock", Code(ch::kTooManyParts)), Wait(),
                 At("a", "claim_lock", Ok()), At("a", "inspect_claims", Claim(kClaimId, 100))},
                &clock);
  ASSERT_EQ(r.last.kind, Action::Kind::kDone) << r.last.status;
  EXPECT_EQ(r.last.result.lock_id, kClaimId);
}

TEST(ReplicaClaims, AClaimAnswered286AgainAndAgainIsResentOnlyWithinQuorumBusyTime) {
  // Every claim row is refused with 286: each claim is resent for
  // quorum_busy_ms (1 s) at most, then the acquisition backs off, and at the
  // lock timeout (10 s) it fails as the replicas' trouble.
  auto store = ClusterStore();
  int64_t clock = 0;
  std::unique_ptr<Task> t = store->AcquireLock("id");
  int claims = 0;
  Action a = RunToEnd(*t, &clock, [&](const std::string& purpose, int64_t) {
    if (purpose == "select_version") return kVersion;
    if (purpose == "state_table_engine") return kReplicated;
    if (purpose == "claim_lock") {
      ++claims;
      return Code(ch::kUnsatisfiedQuorumForPreviousWrite);
    }
    return Ok("");
  });
  ASSERT_EQ(a.kind, Action::Kind::kFailed) << "still running after " << claims << " claim rows, at " << clock;
  EXPECT_THAT(a.status, StatusIs(absl::StatusCode::kUnavailable, HasSubstr("code 286")));
  EXPECT_LE(clock, 15000);
}

TEST(ReplicaClaims, ALiveHolderSeenAfterQuorumTroubleTimesOutAsLockedByAnotherProcess) {
  // One claim meets 285 (quorum trouble); from then on the claims show
  // another process's live claim until the lock timeout: the lock was busy,
  // not the replicas.
  auto store = ClusterStore();
  int64_t clock = 0;
  std::unique_ptr<Task> t = store->AcquireLock("id");
  int claims = 0;
  std::vector<std::string> seen;
  Action a = RunToEnd(*t, &clock, [&](const std::string& purpose, int64_t now) {
    if (purpose == "select_version") return kVersion;
    if (purpose == "state_table_engine") return kReplicated;
    seen.push_back(purpose);
    if (purpose == "claim_lock") return ++claims == 1 ? Code(ch::kTooFewLiveReplicas) : Ok();
    if (purpose == "inspect_claims" && claims > 0) return Claim(kOtherProcessClaim, 100 + now / 1000);
    return Ok("");
  });
  SCOPED_TRACE(::testing::PrintToString(seen));
  ASSERT_EQ(a.kind, Action::Kind::kFailed);
  EXPECT_THAT(a.status, StatusIs(absl::StatusCode::kAborted, HasSubstr("locked by another process")));
}

TEST(ReplicaClaims, ClaimantsThatSawALiveHolderBackOffForTimesTheirRandomBytesPick) {
  // Two claimants with different random bytes, both seeing a live holder,
  // wait different times before trying again, each within the retry time's
  // half to one and a half (no lockstep).
  auto waits_with = [](const std::string& random) {
    auto store = ClusterStore();
    int64_t clock = 0;
    std::unique_ptr<Task> t = store->AcquireLock("id");
    std::vector<int64_t> waits;
    RunToEnd(
        *t, &clock,
        [&](const std::string& purpose, int64_t now) {
          if (purpose == "select_version") return kVersion;
          if (purpose == "state_table_engine") return kReplicated;
          if (purpose == "inspect_claims") return Claim(kOtherProcessClaim, 100 + now / 1000);
          return Ok("");
        },
        &waits, 40, random);
    return waits;
  };
  std::vector<int64_t> a = waits_with(std::string(32, '\x11'));
  std::vector<int64_t> b = waits_with(std::string(32, '\x5a'));
  ASSERT_FALSE(a.empty());
  ASSERT_FALSE(b.empty());
  EXPECT_NE(a.front(), b.front());
  for (int64_t w : {a.front(), b.front()}) {
    EXPECT_GE(w, 500);   // retry_ms / 2
    EXPECT_LT(w, 1500);  // 3 * retry_ms / 2
  }
}

TEST(ReplicaClaims, AClaimWhoseAnswerWasLostIsReadOnTheNextHostAndEndedIfItLanded) {
  // It landed, but the quorum may not have confirmed it: it is ended (on the
  // next host) instead of held, and a new claim is made after a moment.
  auto store = ClusterStore();
  int64_t clock = 0;
  std::unique_ptr<Task> t = store->AcquireLock("id");
  Script r = Drive(*t,
                {At("a", "select_version", kVersion), At("a", "state_table_engine", kReplicated),
                 At("a", "inspect_claims", Ok("")), At("a", "claim_lock", Lost()),
                 At("b", "inspect_claims", Claim(kClaimId, 100)), At("b", "end_claim", Ok())},
                &clock);
  ASSERT_NE(r.last.kind, Action::Kind::kDone) << "held a claim whose answer was lost";
  EXPECT_EQ(r.sent.back(), "b end_claim") << ::testing::PrintToString(r.sent);
}

TEST(ReplicaClaims, TooFewReplicasForTheClaimFailsUnavailableAfterTheWait) {
  auto store = ClusterStore();
  int64_t clock = 0;
  std::unique_ptr<Task> t = store->AcquireLock("id");
  Action a = t->Start({clock, kRandom});
  int claims = 0;
  while (a.kind == Action::Kind::kRunSql || a.kind == Action::Kind::kWait) {
    ASSERT_LT(claims, 500);
    if (a.kind == Action::Kind::kWait) {
      clock += a.wait_ms;
      a = t->OnTimer({clock, kRandom});
      continue;
    }
    clock += 2;
    const std::string& p = a.request.purpose;
    SqlResponse answer = p == "select_version" ? kVersion : p == "state_table_engine" ? kReplicated : Ok("");
    if (p == "claim_lock") {
      ++claims;
      answer = Code(ch::kTooFewLiveReplicas);
    }
    a = t->OnResponse(answer, {clock, kRandom});
  }
  ASSERT_EQ(a.kind, Action::Kind::kFailed);
  EXPECT_GE(claims, 2) << "a claim refused before anything was written is tried again until the wait ends";
  EXPECT_GE(clock, 10000);  // lock.timeout_ms
  EXPECT_THAT(a.status, StatusIs(absl::StatusCode::kUnavailable, HasSubstr("fewer than 2 replicas are alive")));
}

TEST(ReplicaClaims, AnEndRowWith319IsWrittenAgain) {
  auto store = ClusterStore();
  int64_t clock = 0;
  HoldLock(*store, &clock);
  std::unique_ptr<Task> t = store->ReleaseLock("id", kClaimId);
  Script r = Drive(*t, {At("a", "end_claim", Code(ch::kUnknownStatusOfInsert)), Wait(), At("b", "end_claim", Ok())},
                &clock);
  EXPECT_EQ(r.last.kind, Action::Kind::kDone) << r.last.status;
}

// One replica of three killed while the others catch up (164 "not active"):
// every host of three rounds fails the end row. The task gives up its
// rounds, and the lock machine writes the end row again after a short wait,
// within the lease, instead of failing the release.
TEST(ReplicaClaims, AnEndRowNoHostTookIsWrittenAgainWithinTheLease) {
  auto store = ClusterStore();
  int64_t clock = 0;
  HoldLock(*store, &clock);
  std::unique_ptr<Task> t = store->ReleaseLock("id", kClaimId);
  int ends = 0;
  Action a = RunToEnd(*t, &clock, [&](const std::string& purpose, int64_t) {
    if (purpose != "end_claim") return Ok("");
    ++ends;
    if (ends > 12) return Ok();
    return ends % 3 == 0 ? Refused() : NotActive();
  });
  EXPECT_EQ(a.kind, Action::Kind::kDone) << a.status;
  EXPECT_EQ(ends, 13);
}

// ... and when no host takes it until the lease ends, the release fails as
// one left to expire, not as a server that never answered.
TEST(ReplicaClaims, AnEndRowNoHostTakesUntilTheLeaseEndsIsLeftToExpire) {
  StoreOptions o;
  o.lock.stale_ms = 2000;
  o.lock.timeout_ms = 10000;
  o.cluster.name = "prod";
  o.hosts = {{"a", 8123}, {"b", 8123}, {"c", 8123}};
  auto store = *Store::Create(o);
  int64_t clock = 0;
  HoldLock(*store, &clock);
  std::unique_ptr<Task> t = store->ReleaseLock("id", kClaimId);
  int ends = 0;
  Action a = RunToEnd(*t, &clock, [&](const std::string& purpose, int64_t) {
    if (purpose == "end_claim") ++ends;
    return NotActive();
  });
  ASSERT_EQ(a.kind, Action::Kind::kFailed);
  EXPECT_GT(ends, 3) << "the end row was not written again after the task's rounds";
  EXPECT_THAT(a.status.message(), HasSubstr("expire"));
  EXPECT_THAT(std::string(a.status.message()), Not(HasSubstr("no answer from ClickHouse while releasing")));
}

TEST(ReplicaClaims, AClaimsTableDdlTimingOutOnSomeHost159StillTakesTheLock) {
  auto store = ClusterStore();
  int64_t clock = 0;
  std::unique_ptr<Task> t = store->AcquireLock("id");
  Script r = Drive(*t,
                {At("a", "select_version", kVersion), At("a", "state_table_engine", kReplicated),
                 At("a", "inspect_claims", Err(404, 60, "Table meltano.state_claims doesn't exist.")),
                 At("a", "claim_lock", Err(404, 60, "Table meltano.state_claims doesn't exist.")),
                 At("a", "create_claims_table", Code(ch::kTimeoutExceeded)), At("a", "inspect_claims", Ok("")),
                 At("a", "claim_lock", Ok()),
                 At("a", "inspect_claims", Claim(kClaimId2, 100))},
                &clock);
  ASSERT_EQ(r.last.kind, Action::Kind::kDone) << r.last.status;
  EXPECT_EQ(r.last.result.lock_id, kClaimId2);  // the second claim: the first met no table
}

// ---- claims reads reach enough replicas that one has every confirmed claim ----
//
// On 18.16 a sequentially consistent read only makes sure of the last quorum
// insert: a replica that missed an earlier claim answers without it
// (tests/cluster/test_claims_gap.py). With 3 replicas and a quorum of 2, a
// claims read is asked of 2 replicas (part::ReadClaims).

// The row that ends a claims answer: the replica that gave it, of `replicas`.
std::string ReplicaRow(const std::string& name, int replicas = 3) {
  return absl::StrCat("#replica\t", replicas, "\t0\t0\t0\t", name, "\t100\n");
}
SqlResponse Claims(const std::string& rows, const std::string& replica, int replicas = 3) {
  return Ok(rows + ReplicaRow(replica, replicas));
}
TEST(ReplicaClaimsReads, AClaimOnlyTheSecondReplicaHasKeepsTheLockFromUs) {
  // Host a's replica lacks the other process's claim; b's has it. Read from a
  // alone, the lock would look free and be claimed.
  auto store = ClusterStore();
  int64_t clock = 0;
  std::unique_ptr<Task> t = store->AcquireLock("id");
  Script r = Drive(*t,
                   {At("a", "select_version", kVersion), At("a", "state_table_engine", kReplicated),
                    At("a", "inspect_claims", Claims("", "r1")),
                    At("b", "inspect_claims", Claims(ClaimRow(kOtherProcessClaim, 0, 100), "r2"))},
                   &clock);
  // Held by another process: the acquisition shows itself as a waiter and
  // backs off; it claims nothing.
  ASSERT_EQ(r.last.kind, Action::Kind::kRunSql);
  EXPECT_EQ(r.last.request.purpose, "announce_lock_waiter");
}

TEST(ReplicaClaimsReads, ASecondReadThatFindsAnotherClaimOnOneReplicaWithdrawsOurs) {
  auto store = ClusterStore();
  int64_t clock = 0;
  std::unique_ptr<Task> t = store->AcquireLock("id");
  Script r = Drive(*t,
                   {At("a", "select_version", kVersion), At("a", "state_table_engine", kReplicated),
                    At("a", "inspect_claims", Claims("", "r1")), At("b", "inspect_claims", Claims("", "r2")),
                    At("a", "claim_lock", Ok()),
                    At("a", "inspect_claims", Claims(ClaimRow(kClaimId, 0, 100), "r1")),
                    At("b", "inspect_claims",
                       Claims(ClaimRow(kClaimId, 0, 100) + ClaimRow(kOtherProcessClaim, 0, 100), "r2")),
                    At("a", "end_claim", Ok())},
                   &clock);
  EXPECT_NE(r.last.kind, Action::Kind::kDone) << "took the lock another process holds on replica r2";
}

TEST(ReplicaClaimsReads, AnEndRowOnOneReplicaEndsTheClaimItsRowsShowOnAnother) {
  auto store = ClusterStore();
  int64_t clock = 0;
  std::unique_ptr<Task> t = store->AcquireLock("id");
  Script r = Drive(*t,
                   {At("a", "select_version", kVersion), At("a", "state_table_engine", kReplicated),
                    At("a", "inspect_claims", Claims(ClaimRow(kOtherProcessClaim, 1, 100), "r1")),
                    At("b", "inspect_claims", Claims(ClaimRow(kOtherProcessClaim, 0, 100), "r2")),
                    At("a", "claim_lock", Ok()),
                    At("a", "inspect_claims", Claims(ClaimRow(kClaimId, 0, 100), "r1")),
                    At("b", "inspect_claims", Claims(ClaimRow(kClaimId, 0, 100), "r2"))},
                   &clock);
  ASSERT_EQ(r.last.kind, Action::Kind::kDone) << r.last.status;
  EXPECT_EQ(r.last.result.lock_id, kClaimId);
}

TEST(ReplicaClaimsReads, ADownHostIsPassedOverAndTwoHostsOfOneReplicaCountOnce) {
  // The first read: b is refused, c answers. The second: c answers as the
  // replica a did, so b (marked down, the only host left) is asked too.
  auto store = ClusterStore();
  int64_t clock = 0;
  std::unique_ptr<Task> t = store->AcquireLock("id");
  Script r = Drive(*t,
                   {At("a", "select_version", kVersion), At("a", "state_table_engine", kReplicated),
                    At("a", "inspect_claims", Claims("", "r1")), At("b", "inspect_claims", Refused()),
                    At("c", "inspect_claims", Claims("", "r3")), At("a", "claim_lock", Ok()),
                    At("a", "inspect_claims", Claims(ClaimRow(kClaimId, 0, 100), "r1")),
                    At("c", "inspect_claims", Claims(ClaimRow(kClaimId, 0, 100), "r1")),
                    At("b", "inspect_claims", Claims(ClaimRow(kClaimId, 0, 100), "r2"))},
                   &clock);
  ASSERT_EQ(r.last.kind, Action::Kind::kDone) << r.last.status << " " << ::testing::PrintToString(r.sent);
  EXPECT_EQ(r.last.result.lock_id, kClaimId);
}

TEST(ReplicaClaimsReads, UnlockForceEndsAClaimOnlyTheSecondReplicaHas) {
  auto store = ClusterStore();
  int64_t clock = 0;
  std::unique_ptr<Task> t = store->ForceUnlock("id");
  Script r = Drive(*t,
                   {At("a", "select_version", kVersion), At("a", "state_table_engine", kReplicated),
                    At("a", "inspect_claims", Claims("", "r1")),
                    At("b", "inspect_claims", Claims(ClaimRow(kOtherProcessClaim, 0, 100), "r2")),
                    At("a", "end_claim", Ok())},
                   &clock);
  ASSERT_EQ(r.last.kind, Action::Kind::kDone) << r.last.status << " " << ::testing::PrintToString(r.sent);
}

TEST(ReplicaClaimsReads, AClaimTheQuorumDidNotConfirmIsNotHeldEvenWhenAReplicaShowsIt) {
  // 319: the claim is on the replica it went to, maybe on no other. Reads
  // without sequential consistency show it there; another claimant's read
  // of other replicas would not: it is ended, and a new claim made.
  auto store = ClusterStore();
  int64_t clock = 0;
  std::unique_ptr<Task> t = store->AcquireLock("id");
  Script r = Drive(*t,
                   {At("a", "select_version", kVersion), At("a", "state_table_engine", kReplicated),
                    At("a", "inspect_claims", Claims("", "r1")), At("b", "inspect_claims", Claims("", "r2")),
                    At("a", "claim_lock", Code(ch::kUnknownStatusOfInsert)),
                    At("b", "inspect_claims", Claims("", "r2")),
                    At("c", "inspect_claims", Claims(ClaimRow(kClaimId, 0, 100), "r3")), At("b", "end_claim", Ok())},
                   &clock);
  EXPECT_NE(r.last.kind, Action::Kind::kDone) << "held a claim the quorum did not confirm";
  EXPECT_EQ(r.sent.back(), "b end_claim") << ::testing::PrintToString(r.sent);
}

TEST(ReplicaClaimsReads, AQuorumOfEveryReplicaNeedsOneReplicaRead) {
  auto store = ClusterStore();
  int64_t clock = 0;
  std::unique_ptr<Task> t = store->AcquireLock("id");
  Script r = Drive(*t,
                   {At("a", "select_version", kVersion), At("a", "state_table_engine", kReplicated),
                    At("a", "inspect_claims", Claims("", "r1", /*replicas=*/2)), At("a", "claim_lock", Ok()),
                    At("a", "inspect_claims", Claims(ClaimRow(kClaimId, 0, 100), "r1", 2))},
                   &clock);
  ASSERT_EQ(r.last.kind, Action::Kind::kDone) << r.last.status;
}

// A cluster store given one address (a replica's, or a load balancer's).
std::unique_ptr<Store> OneAddressStore() {
  StoreOptions o;
  o.lock.stale_ms = 300000;
  o.lock.timeout_ms = 3000;
  o.cluster.name = "prod";
  absl::StatusOr<std::unique_ptr<Store>> store = Store::Create(o);
  EXPECT_THAT(store, IsOk());
  return std::move(*store);
}

TEST(ReplicaClaimsReads, OneHostThatIsAlwaysTheSameReplicaCannotTakeTheLockAndSaysWhatToDo) {
  std::unique_ptr<Store> store = OneAddressStore();
  int64_t clock = 0;
  std::unique_ptr<Task> t = store->AcquireLock("id");
  int reads = 0, claims = 0;
  Action a = RunToEnd(*t, &clock, [&](const std::string& purpose, int64_t) {
    if (purpose == "select_version") return kVersion;
    if (purpose == "state_table_engine") return kReplicated;
    if (purpose == "inspect_claims") {
      ++reads;
      return Claims("", "r1");
    }
    if (purpose == "claim_lock") ++claims;
    return Ok("");
  });
  ASSERT_EQ(a.kind, Action::Kind::kFailed);
  EXPECT_EQ(claims, 0) << "claimed on what one replica showed";
  EXPECT_GE(reads, 3);
  EXPECT_THAT(a.status.message(), HasSubstr("read from 1 of the 2 replicas"));
  EXPECT_THAT(a.status.message(), HasSubstr("name the replicas in the URI"));
}


// A claims answer row of another process's live claim whose newest row (its
// last renewal) is `newest_s`, as a replica whose clock says `now_s` shows it.
std::string RenewedClaimRow(const std::string& id, int64_t newest_s, int64_t now_s) {
  return absl::StrCat(id, "\t2\t0\t", newest_s, "\t300\t\t", now_s, "\n");
}

TEST(ReplicaClaimsReads, AClaimsAgeComesFromTheReplicaThatShowsItsNewestRenewal) {
  // One replica lags: it shows the other process's claim as last renewed 400 s
  // ago (past the 300 s window); the other shows the renewal of 10 s ago.
  // Judged from the lagging one, a live holder would be taken over: two
  // holders. Either order of the answers.
  for (bool lagging_first : {true, false}) {
    SCOPED_TRACE(lagging_first ? "the lagging replica answers first" : "the lagging replica answers second");
    const SqlResponse lagging = Claims(RenewedClaimRow(kOtherProcessClaim, 100, 500), "r1");
    const SqlResponse current = Claims(RenewedClaimRow(kOtherProcessClaim, 490, 500), "r2");
    auto store = ClusterStore();
    int64_t clock = 0;
    std::unique_ptr<Task> t = store->AcquireLock("id");
    Script r = Drive(*t,
                     {At("a", "select_version", kVersion), At("a", "state_table_engine", kReplicated),
                      At("a", "inspect_claims", lagging_first ? lagging : current),
                      At("b", "inspect_claims", lagging_first ? current : lagging)},
                     &clock);
    ASSERT_EQ(r.last.kind, Action::Kind::kRunSql) << r.last.status;
    EXPECT_EQ(r.last.request.purpose, "announce_lock_waiter") << "took over a claim renewed 10 s ago";
  }
  // The control: both replicas showing the old renewal, the claim is stale and taken over.
  auto store = ClusterStore();
  int64_t clock = 0;
  std::unique_ptr<Task> t = store->AcquireLock("id");
  Script r = Drive(*t,
                   {At("a", "select_version", kVersion), At("a", "state_table_engine", kReplicated),
                    At("a", "inspect_claims", Claims(RenewedClaimRow(kOtherProcessClaim, 100, 500), "r1")),
                    At("b", "inspect_claims", Claims(RenewedClaimRow(kOtherProcessClaim, 100, 500), "r2"))},
                   &clock);
  ASSERT_EQ(r.last.kind, Action::Kind::kRunSql) << r.last.status;
  EXPECT_EQ(r.last.request.purpose, "claim_lock");
}

TEST(ReplicaClaimsReads, OneAddressInFrontOfTheReplicasIsAskedAgainUntilEnoughReplicasAnswered) {
  // A load balancer: one host, each answer from whichever replica it picked.
  // The first two asks reach r1; the third reaches r2: two replicas, enough.
  StoreOptions o;
  o.lock.stale_ms = 300000;
  o.lock.timeout_ms = 10000;
  o.cluster.name = "prod";
  o.hosts = {{"lb", 8123}};
  absl::StatusOr<std::unique_ptr<Store>> store = Store::Create(o);
  ASSERT_THAT(store, IsOk());
  const std::string host = "lb";
  int64_t clock = 0;
  std::unique_ptr<Task> t = (*store)->AcquireLock("id");
  Script r = Drive(*t,
                   {At(host, "select_version", kVersion), At(host, "state_table_engine", kReplicated),
                    At(host, "inspect_claims", Claims("", "r1")), At(host, "inspect_claims", Claims("", "r1")),
                    At(host, "inspect_claims", Claims("", "r2")), At(host, "claim_lock", Ok()),
                    At(host, "inspect_claims", Claims(ClaimRow(kClaimId, 0, 100), "r1")),
                    At(host, "inspect_claims", Claims(ClaimRow(kClaimId, 0, 100), "r1")),
                    At(host, "inspect_claims", Claims(ClaimRow(kClaimId, 0, 100), "r3"))},
                   &clock);
  ASSERT_EQ(r.last.kind, Action::Kind::kDone) << r.last.status << " " << ::testing::PrintToString(r.sent);
  EXPECT_EQ(r.last.result.lock_id, kClaimId);
}

TEST(ReplicaClaimsReads, AFailedReadAfterOurClaimEndsTheClaimBeforeTheAcquisitionFails) {
  // Our claim landed; the read that would confirm it fails (a server error
  // on every host). The claim is ended, so that no one waits out its stale
  // window for a process that has already failed.
  auto store = ClusterStore();
  int64_t clock = 0;
  std::unique_ptr<Task> t = store->AcquireLock("id");
  bool claimed = false;
  int reads = 0;
  std::vector<std::string> after_claim;
  Action a = RunToEnd(*t, &clock, [&](const std::string& purpose, int64_t) {
    if (purpose == "select_version") return kVersion;
    if (purpose == "state_table_engine") return kReplicated;
    if (claimed) after_claim.push_back(purpose);
    if (purpose == "claim_lock") {
      claimed = true;
      return Ok();
    }
    if (purpose == "inspect_claims") return claimed ? Code(241) : Claims("", ++reads % 2 ? "r1" : "r2");
    return Ok();
  });
  ASSERT_TRUE(claimed);
  EXPECT_EQ(a.kind, Action::Kind::kFailed) << a.status;
  EXPECT_THAT(after_claim, ::testing::Contains("end_claim")) << ::testing::PrintToString(after_claim);
  EXPECT_NE(after_claim.front(), "end_claim") << "ended before the read failed";
}

TEST(ReplicaClaimsReads, TheClaimsTableMissingAfterOurClaimIsNeverTakenForAHeldLock) {
  // The claim was answered; the read after it finds no claims table (code 60:
  // dropped meanwhile, by `chstate init --drop` or an operator). Our claim is
  // gone with it: the acquisition does not hold on it, and claims afresh
  // (a new lock id) once the table is there again.
  auto store = ClusterStore();
  int64_t clock = 0;
  std::unique_ptr<Task> t = store->AcquireLock("id");
  std::vector<std::string> sent;
  int claims = 0, missing_reads = 0, reads = 0;
  Action a = RunToEnd(*t, &clock, [&](const std::string& purpose, int64_t) {
    sent.push_back(purpose);
    if (purpose == "select_version") return kVersion;
    if (purpose == "state_table_engine") return kReplicated;
    if (purpose == "claim_lock") {
      ++claims;
      return Ok();
    }
    if (purpose == "inspect_claims") {
      if (claims == 1 && missing_reads < 3) {
        ++missing_reads;
        return Code(ch::kUnknownTable);
      }
      const std::string& id = claims == 0 ? std::string() : (claims == 1 ? kClaimId : kClaimId2);
      return Claims(id.empty() ? "" : ClaimRow(id, 0, 100), ++reads % 2 ? "r1" : "r2");
    }
    return Ok();
  });
  ASSERT_GE(missing_reads, 1) << ::testing::PrintToString(sent);
  ASSERT_EQ(a.kind, Action::Kind::kDone) << a.status << " " << ::testing::PrintToString(sent);
  EXPECT_EQ(claims, 2) << "held the lock on a claim whose table was gone: " << ::testing::PrintToString(sent);
  EXPECT_EQ(a.result.lock_id, kClaimId2);
}


// ---- state reads: enough replicas that one has the newest confirmed write ----
// On 18.16 a sequentially consistent read only makes sure of the table's last
// quorum insert: a replica that missed an earlier one (a fetch still queued
// after a restart) answers without it (tests/cluster/test_state_gap.py).

// The state a get returns when host a's replica answers `from_a` and host b's
// `from_b` (each read once, a first).
std::optional<MeltanoState> GetWith(const SqlResponse& from_a, const SqlResponse& from_b) {
  auto store = ClusterStore();
  int64_t clock = 0;
  std::unique_ptr<Task> get = store->Get("id");
  Script r = Drive(*get,
                   {At("a", "select_version", kVersion), At("a", "state_table_engine", kReplicated),
                    At("a", "get_state", from_a), At("b", "get_state", from_b)},
                   &clock);
  EXPECT_EQ(r.last.kind, Action::Kind::kDone) << r.last.status << " " << ::testing::PrintToString(r.sent);
  return r.last.result.state;
}
std::string Keys(const std::optional<MeltanoState>& s) {
  return s ? s->completed.value("singer_state", nlohmann::json::object()).dump() : "(absent)";
}

TEST(ReplicaStateReads, AGetReadsTwoReplicasAndTheLaterBlockWinsAmongEqualVersions) {
  // 18.16 versions are whole seconds: two writes in one second tie, and the
  // later one is in the later block.
  const SqlResponse older = StateAt("ra", R"({"singer_state":{"old":1}})", 5000, 5);
  const SqlResponse newer = StateAt("rb", R"({"singer_state":{"new":1}})", 5000, 7);
  EXPECT_EQ(Keys(GetWith(older, newer)), R"({"new":1})");
  EXPECT_EQ(Keys(GetWith(StateAt("ra", R"({"singer_state":{"new":1}})", 5000, 7),
                         StateAt("rb", R"({"singer_state":{"old":1}})", 5000, 5))),
            R"({"new":1})");
  // A merged part (its last block 9) holds the newest row of every block it covers.
  EXPECT_EQ(Keys(GetWith(StateAt("ra", R"({"singer_state":{"old":1}})", 5000, 6),
                         StateAt("rb", R"({"singer_state":{"new":1}})", 5000, 9))),
            R"({"new":1})");
}

TEST(ReplicaStateReads, TheHigherVersionWinsWhateverItsBlock) {
  EXPECT_EQ(Keys(GetWith(StateAt("ra", R"({"singer_state":{"v2":1}})", 6000, 3),
                         StateAt("rb", R"({"singer_state":{"v1":1}})", 5000, 9))),
            R"({"v2":1})");
}

TEST(ReplicaStateReads, AReplicaWithoutTheRowOrWithAnOlderOneDoesNotHideTheNewest) {
  EXPECT_EQ(Keys(GetWith(StateAt("ra", ""), kStateRow)), R"({"a":1})");
  EXPECT_EQ(Keys(GetWith(StateAt("ra"), StateAt("rb", ""))), R"({"a":1})");
  EXPECT_EQ(Keys(GetWith(StateAt("ra", ""), StateAt("rb", ""))), "(absent)");
}

TEST(ReplicaStateReads, ANewerTombstoneOnOneReplicaDeletesAndAnOlderOneDoesNot) {
  const std::string tomb = kTombstone;
  EXPECT_EQ(Keys(GetWith(StateAt("ra", R"({"singer_state":{"a":1}})", 5000, 4), StateAt("rb", tomb, 5000, 6))),
            "(absent)");
  EXPECT_EQ(Keys(GetWith(StateAt("ra", tomb, 5000, 4), StateAt("rb", R"({"singer_state":{"b":1}})", 5000, 6))),
            R"({"b":1})");
}

TEST(ReplicaStateReads, AnUpdateMergesIntoTheNewestStateNotTheLaggingReplicas) {
  // Host a's replica missed the write that added "b" to the partial state;
  // host b's has it. The update (a partial state: merged in) must write a, b
  // and c, not lose b.
  auto store = ClusterStore();
  int64_t clock = 0;
  MeltanoState incoming{"id", nlohmann::json::parse(R"({"singer_state":{"c":1}})"), nlohmann::json::object()};
  auto partial_at = [](const std::string& replica, const std::string& partial, int64_t block) {
    return Ok(absl::StrCat(partial, "\t{}\t5000\t", block, "\t\t\t\n#replica\t3\t\t\t\t", replica, "\t\n"));
  };
  std::unique_ptr<Task> t = store->Update(incoming);
  int claims_reads = 0, state_reads = 0;
  std::string insert_sql;
  Action a = t->Start({clock, kRandom});
  for (int i = 0; i < 200 && (a.kind == Action::Kind::kRunSql || a.kind == Action::Kind::kWait); ++i) {
    if (a.kind == Action::Kind::kWait) {
      clock += a.wait_ms;
      a = t->OnTimer({clock, kRandom});
      continue;
    }
    const std::string& purpose = a.request.purpose;
    SqlResponse response = Ok("");
    if (purpose == "select_version") response = kVersion;
    if (purpose == "state_table_engine") response = kReplicated;
    if (purpose == "inspect_claims") {
      response = Claims(claims_reads >= 2 ? ClaimRow(kClaimId, 0, 100) : "", claims_reads % 2 == 0 ? "r1" : "r2");
      ++claims_reads;
    }
    if (purpose == "get_state") {
      response = ++state_reads == 1 ? partial_at("ra", R"({"singer_state":{"a":1}})", 4)
                                    : partial_at("rb", R"({"singer_state":{"a":1,"b":1}})", 6);
    }
    if (purpose == "insert_state") insert_sql = a.request.sql;
    clock += 2;
    a = t->OnResponse(response, {clock, kRandom});
  }
  ASSERT_EQ(a.kind, Action::Kind::kDone) << a.status;
  EXPECT_EQ(state_reads, 2);
  EXPECT_THAT(insert_sql, HasSubstr(R"({"singer_state":{"a":1,"b":1,"c":1}})"));
}

TEST(ReplicaStateReads, AnUpdateThroughOneAddressThatReachesOneReplicaFailsAndAGetTakesWhatItHas) {
  std::unique_ptr<Store> store = OneAddressStore();
  int64_t clock = 0;
  // A load balancer: claims reads land on r1 and r2 in turn, state reads always on r1.
  int claims_reads = 0, inserts = 0;
  auto answer = [&](const std::string& purpose, int64_t) {
    if (purpose == "select_version") return kVersion;
    if (purpose == "state_table_engine") return kReplicated;
    if (purpose == "inspect_claims") {
      const std::string replica = ++claims_reads % 2 == 1 ? "r1" : "r2";
      return Claims(claims_reads > 3 ? ClaimRow(kClaimId, 0, 100) : "", replica);
    }
    if (purpose == "get_state") return StateAt("r1");
    if (purpose == "insert_state") ++inserts;
    return Ok("");
  };
  MeltanoState incoming{"id", nlohmann::json::object(), nlohmann::json::parse(R"({"singer_state":{"c":1}})")};
  std::unique_ptr<Task> update = store->Update(incoming);
  Action a = RunToEnd(*update, &clock, answer);
  ASSERT_EQ(a.kind, Action::Kind::kFailed);
  EXPECT_EQ(inserts, 0) << "merged into what one replica showed";
  EXPECT_THAT(a.status.message(), HasSubstr("the state was read from 1 of the 2 replicas"));
  std::unique_ptr<Task> get = store->Get("id");
  a = RunToEnd(*get, &clock, answer);
  ASSERT_EQ(a.kind, Action::Kind::kDone) << a.status;
  EXPECT_EQ(Keys(a.result.state), R"({"a":1})");
}

TEST(ReplicaStateReads, AGetWithTheOtherReplicasDownAnswersWithTheOneThatIsUpAndAnUpdateDoesNot) {
  auto store = ClusterStore();
  int64_t clock = 0;
  auto answer = [](const std::string& host, const std::string& purpose) {
    if (host != "a") return Refused();
    if (purpose == "select_version") return kVersion;
    if (purpose == "state_table_engine") return kReplicated;
    if (purpose == "get_state") return StateAt("ra");
    if (purpose == "inspect_claims") return Claims("", "r1");
    return Ok("");
  };
  auto run = [&](Task& t) {
    Action a = t.Start({clock, kRandom});
    for (int i = 0; i < 500 && (a.kind == Action::Kind::kRunSql || a.kind == Action::Kind::kWait); ++i) {
      if (a.kind == Action::Kind::kWait) {
        clock += a.wait_ms;
        a = t.OnTimer({clock, kRandom});
        continue;
      }
      clock += 2;
      a = t.OnResponse(answer(a.request.endpoint.host, a.request.purpose), {clock, kRandom});
    }
    return a;
  };
  std::unique_ptr<Task> get = store->Get("id");
  Action a = run(*get);
  ASSERT_EQ(a.kind, Action::Kind::kDone) << a.status;
  EXPECT_EQ(Keys(a.result.state), R"({"a":1})");
  MeltanoState incoming{"id", nlohmann::json::object(), nlohmann::json::parse(R"({"singer_state":{"c":1}})")};
  std::unique_ptr<Task> update = store->Update(incoming);
  EXPECT_EQ(run(*update).kind, Action::Kind::kFailed);
}
}  // namespace
}  // namespace chstate
