// The lock machines' transition tables themselves (core/table_lock.cc,
// core/claims_lock.cc): each gives exactly one next state per (state, event),
// decisions are taken only in decision states, every state takes the same
// inputs the single machine took before the split (anything else is misuse,
// worded as before), and random walks of both machines through scripted
// answers never meet an event their table has no row for.
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/claims_lock.h"
#include "core/lock_machine.h"
#include "core/statements.h"
#include "core/table_lock.h"
#include "core/testing/responses.h"
#include "core/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace chstate {
namespace {

using ::chstate::testing::Err;
using ::chstate::testing::Lost;
using ::chstate::testing::Ok;
using ::chstate::testing::Refused;
using ::chstate::testing::StatusIs;
using ::testing::HasSubstr;

constexpr char kId[] = "dev:tap-a-to-target-b";

// ---- the tables ----

template <typename M>
void ExpectOneNextStatePerStateAndEvent() {
  std::set<std::pair<int, int>> seen;
  for (const typename M::Row& row : M::Rows()) {
    EXPECT_TRUE(seen.emplace(static_cast<int>(row.from), static_cast<int>(row.event)).second)
        << "two rows for (" << M::StateName(row.from) << ", " << M::EventName(row.event) << ")";
    // Decision states take only decisions, and only they do.
    EXPECT_EQ(M::IsDecision(row.from), M::InputOf(row.event) == LockInput::kDecision)
        << M::StateName(row.from) << ", " << M::EventName(row.event);
  }
}

TEST(LockTable, EachMachineHasExactlyOneNextStatePerStateAndEvent) {
  ExpectOneNextStatePerStateAndEvent<TableLock>();
  ExpectOneNextStatePerStateAndEvent<ClaimsLock>();
}

// Which inputs each state took before the machines were split (the one
// LockMachine's table): any other is misuse, then as now.
bool TookBefore(LockState s, LockInput input) {
  using S = LockState;
  switch (input) {
    case LockInput::kAcquire:
      return s == S::kIdle;
    case LockInput::kRelease:
      return s != S::kIdle && s != S::kLost && s != S::kFailed;
    case LockInput::kTimer:
      return s != S::kIdle && s != S::kCreatingSchema && s != S::kInspecting && s != S::kEntombing;
    case LockInput::kAnswer:
      return s == S::kCreating || s == S::kCreatingSchema || s == S::kInspecting || s == S::kEntombing ||
             s == S::kWithdrawing || s == S::kRenewing || s == S::kConfirming || s == S::kReleaseInspect ||
             s == S::kDropping;
    case LockInput::kDecision:
      break;
  }
  return false;
}

template <typename M>
void ExpectTheSameInputsAsBefore(const std::set<typename M::State>& busy) {
  for (int i = 0; i < M::kStateCount; ++i) {
    const auto s = static_cast<typename M::State>(i);
    if (M::IsDecision(s)) continue;
    for (LockInput input : {LockInput::kAcquire, LockInput::kRelease, LockInput::kTimer, LockInput::kAnswer}) {
      bool expected = TookBefore(M::Public(s), input);
      if (M::Public(s) == LockState::kAnnouncing) {
        // New: the waiter row in flight (LockMachineOptions::write_waiter_rows).
        expected = input == LockInput::kAnswer || input == LockInput::kRelease;
      }
      // A request waiting to be sent again (code 286) has none in flight.
      if (busy.count(s) != 0 && input == LockInput::kAnswer) expected = false;
      EXPECT_EQ(M::Takes(s, input), expected) << M::StateName(s) << " input " << static_cast<int>(input);
    }
  }
}

TEST(LockTable, EveryStateTakesTheInputsItTookBeforeTheSplit) {
  ExpectTheSameInputsAsBefore<TableLock>({});
  ExpectTheSameInputsAsBefore<ClaimsLock>({ClaimsLockState::kClaimingBusy, ClaimsLockState::kWithdrawingBusy,
                                           ClaimsLockState::kRenewingBusy, ClaimsLockState::kEndingBusy});
}

// ---- misuse ----

Statements Plain() { return *Statements::Create(Dialect::kClickHouse18, "meltano", "state"); }
Statements Cluster() {
  ClusterOptions cluster;
  cluster.name = "c";
  return *Statements::Create(Dialect::kClickHouse18, "meltano", "state", cluster);
}

TEST(LockTable, MisuseFailsAsBefore) {
  const std::string random(16, '\x07');
  for (const Statements& st : {Plain(), Cluster()}) {
    // Release before Acquire: failed, the state named.
    std::unique_ptr<LockMachine> m = MakeLockMachine(st, kId, LockOptions{});
    LockOutput out = m->Release({0, random});
    EXPECT_EQ(out.outcome, LockOutput::Outcome::kFailed);
    EXPECT_EQ(out.next, LockOutput::Next::kNone);
    EXPECT_THAT(out.status, StatusIs(absl::StatusCode::kFailedPrecondition,
                                     HasSubstr("lock misuse: event \"release\" in state \"idle\"")));
    EXPECT_EQ(m->state(), LockState::kFailed);

    // An answer with no request outstanding while held: lost, not failed.
    m = MakeLockMachine(st, kId, LockOptions{});
    m->Acquire({0, random});
    const bool cluster = st.cluster().enabled();
    if (cluster) {
      m->OnResponse(Ok(""), {1, random});                 // no claims: claim
      m->OnResponse(Ok(""), {2, random});                 // claimed: read again
      const std::string row = absl::StrCat(m->lock_id(), "\t1\t0\t100\t300\t\t100\n");
      out = m->OnResponse(Ok(row), {3, random});          // ours alone
    } else {
      out = m->OnResponse(Ok(), {1, random});             // created
    }
    // Acquired, and the first renewal armed, in one output.
    EXPECT_EQ(out.outcome, LockOutput::Outcome::kAcquired);
    EXPECT_EQ(out.next, LockOutput::Next::kWait);
    EXPECT_EQ(out.timer, LockTimer::kRenewal);
    ASSERT_EQ(m->state(), LockState::kHeld);
    out = m->OnResponse(Ok(), {4, random});
    EXPECT_EQ(out.outcome, LockOutput::Outcome::kLost);
    EXPECT_EQ(out.next, LockOutput::Next::kNone);
    EXPECT_THAT(out.status, StatusIs(absl::StatusCode::kFailedPrecondition,
                                     HasSubstr("lock misuse: event \"ok\" in state \"held\"")));
    EXPECT_FALSE(m->LeaseValid(5));
    // ... and anything after the end is misuse too.
    out = m->Acquire({6, random});
    EXPECT_THAT(std::string(out.status.message()), HasSubstr("lock misuse: event \"acquire\" in state \"lost\""));
  }
}

// ---- what the machine parsed, kept ----

// An inspection is parsed once, as its answer arrives, and kept: the live
// holder it showed (the one a waiter row names) until the next answer, and
// in cluster mode the claims no reader counts any more (what the store
// prunes after winning).
TEST(LockTable, TheMachineKeepsWhatItParsed) {
  const std::string random(16, '\x07');
  const Statements plain = Plain(), cluster = Cluster();  // outlive the machines
  std::unique_ptr<LockMachine> m = MakeLockMachine(plain, kId, LockOptions{});
  m->Acquire({0, random});
  m->OnResponse(Err(500, 57, "Table already exists"), {10, random});
  EXPECT_FALSE(m->sighting().inspected);
  m->OnResponse(Ok("other\t0\t100\t101\t5\n\t255\t100\t101\t0\n"), {20, random});
  EXPECT_TRUE(m->sighting().inspected);
  EXPECT_EQ(m->sighting().inspection.holder, "other");
  EXPECT_EQ(m->sighting().inspection.age_s, 1);
  EXPECT_EQ(m->sighting().live_holder, "other");
  EXPECT_EQ(m->state(), LockState::kBackingOff);

  // Cluster mode: a claims read with another's live claim and an ended one.
  m = MakeLockMachine(cluster, kId, LockOptions{});
  m->Acquire({0, random});
  m->OnResponse(Ok("live\t1\t0\t1000\t300\t\t1000\nended\t1\t1\t900\t300\t\t1000\n"), {10, random});
  EXPECT_EQ(m->sighting().live_holder, "live");
  EXPECT_EQ(m->prunable_claims(), std::vector<std::string>{"ended"});
  // A stale claim's holder is nobody to show oneself to; nothing is prunable
  // that is not over by its own window, and the last read's list is kept.
  m = MakeLockMachine(cluster, kId, LockOptions{});
  m->Acquire({0, random});
  m->OnResponse(Ok("gone\t1\t0\t100\t300\t\t1000\n"), {10, random});
  EXPECT_EQ(m->sighting().live_holder, "");
  EXPECT_EQ(m->prunable_claims(), std::vector<std::string>{"gone"});
  EXPECT_EQ(m->state(), LockState::kCreating) << "a stale claim is taken over";
  m->OnResponse(Ok(), {20, random});  // the claim is in: not a read
  EXPECT_FALSE(m->sighting().inspected);
  EXPECT_EQ(m->prunable_claims(), std::vector<std::string>{"gone"});
}

// ---- random walks: every event a classifier chooses has its row ----

// Answers a random walk gives, for what the machine sent.
class Answers {
 public:
  Answers(std::mt19937_64& rng, const LockMachine& m) : rng_(rng), m_(m) {}

  SqlResponse For(const SqlRequest& req, int64_t now_ms) {
    const int64_t now_s = now_ms / 1000;
    switch (Pick(12)) {
      case 0: return Lost();
      case 1: return Refused();
      case 2: return Err(500, 57, "Table already exists");
      case 3: return Err(404, 60, "Table doesn't exist");
      case 4: return Err(404, 81, "Database doesn't exist");
      case 5: return Err(500, 286, "Another quorum insert has been already started");
      case 6: return Err(500, 285, "Number of alive replicas is less than requested quorum");
      case 7: return Err(500, 319, "Unknown status, client must retry");
      case 8: return Err(500, Pick(2) ? 289 : 159, "replica is not in quorum / ddl timeout");
      case 9: return Ok("not\ta\tlock\trow\n");
      default: break;
    }
    if (req.purpose == "inspect_lock") return Ok(LockRows(now_s));
    if (req.purpose == "inspect_claims") return Ok(ClaimRows(now_s));
    return Ok();
  }

 private:
  int Pick(int n) { return static_cast<int>(rng_() % static_cast<uint64_t>(n)); }
  std::string Holder() {
    switch (Pick(3)) {
      case 0: return m_.lock_id();
      case 1: return "11111111111111111111111111111111";
      default: return "";
    }
  }
  std::string LockRows(int64_t now_s) {
    if (Pick(4) == 0) return "";  // no table
    std::string body;
    const std::string holder = Holder();
    const int64_t at = now_s - Pick(20);
    if (!holder.empty()) body += absl::StrCat(holder, "\t0\t", at, "\t", now_s, "\t5\n");
    return body + absl::StrCat("\t255\t", at, "\t", now_s, "\t0\n");
  }
  std::string ClaimRows(int64_t now_s) {
    std::string body;
    for (int i = Pick(3); i > 0; --i) {
      const std::string id = Holder();
      if (id.empty()) continue;
      body += absl::StrCat(id, "\t", Pick(2), "\t", Pick(2), "\t", now_s - Pick(20), "\t5\t\t", now_s, "\n");
    }
    return body;
  }

  std::mt19937_64& rng_;
  const LockMachine& m_;
};

void Walk(const Statements& st, uint64_t seed, std::map<std::string, int>* outcomes) {
  std::mt19937_64 rng(seed);
  LockOptions options;
  options.stale_ms = 5000;
  options.retry_ms = 500;
  options.timeout_ms = static_cast<int64_t>(rng() % 20000);
  LockMachineOptions machine_options;
  machine_options.write_waiter_rows = rng() % 2 == 0;
  std::unique_ptr<LockMachine> m = MakeLockMachine(st, kId, options, machine_options);
  Answers answers(rng, *m);
  int64_t now = 1000000;
  auto random = [&] {
    std::string r(16, '\0');
    for (char& ch : r) ch = static_cast<char>(rng() & 0xff);
    return r;
  };
  std::optional<SqlRequest> in_flight;
  std::optional<int64_t> timer_at;
  bool released = false;
  LockOutput o = m->Acquire({now, random()});
  for (int step = 0; step < 200; ++step) {
    switch (o.next) {
      case LockOutput::Next::kRunSql:
        ASSERT_FALSE(in_flight.has_value()) << "two requests in flight";
        in_flight = o.request;
        break;
      case LockOutput::Next::kWait:
        ASSERT_NE(o.timer, LockTimer::kNone);
        timer_at = now + o.wait_ms;
        break;
      case LockOutput::Next::kNone:
        break;
    }
    if (o.outcome == LockOutput::Outcome::kReleased || o.outcome == LockOutput::Outcome::kFailed ||
        o.outcome == LockOutput::Outcome::kLost) {
      ASSERT_THAT(std::string(o.status.message()), ::testing::Not(HasSubstr("no row")));
      ASSERT_THAT(std::string(o.status.message()), ::testing::Not(HasSubstr("two next steps")));
      ASSERT_THAT(std::string(o.status.message()), ::testing::Not(HasSubstr("misuse")));
      ++(*outcomes)[absl::StrCat(LockStateName(m->state()), " ", absl::StatusCodeToString(o.status.code()))];
      return;
    }
    const uint64_t what = rng() % 10;
    now += static_cast<int64_t>(rng() % 3000);
    if (what == 0 && !released) {
      released = true;
      o = m->Release({now, random()});
    } else if (in_flight) {
      const SqlRequest req = *in_flight;
      in_flight.reset();
      o = m->OnResponse(answers.For(req, now), {now, random()});
    } else if (timer_at) {
      now = std::max(now, *timer_at);
      timer_at.reset();
      o = m->OnTimer({now, random()});
    } else if (!released) {
      released = true;
      o = m->Release({now, random()});
    } else {
      FAIL() << "the machine waits for nothing in state " << LockStateName(m->state());
    }
  }
}

TEST(LockTable, RandomWalksNeverMeetAnEventWithoutARow) {
  for (const Statements& st : {Plain(), Cluster()}) {
    std::map<std::string, int> outcomes;
    // The claims lock holds only a claim whose insert answered OK: its
    // walks reach a release less often, so there are more of them.
    const uint64_t walks = st.cluster().enabled() ? 15000 : 3000;
    for (uint64_t seed = 1; seed <= walks; ++seed) {
      Walk(st, seed, &outcomes);
      if (::testing::Test::HasFatalFailure()) {
        ADD_FAILURE() << "seed " << seed << (st.cluster().enabled() ? " (claims)" : " (table)");
        return;
      }
    }
    // The walks reach every kind of end.
    std::string seen;
    for (const auto& [k, n] : outcomes) absl::StrAppend(&seen, k, ": ", n, "; ");
    EXPECT_GT(outcomes["released OK"], 0) << seen;
    EXPECT_GT(outcomes["lost ABORTED"], 0) << seen;
    EXPECT_GT(outcomes["failed CANCELLED"], 0) << seen;
  }
}

}  // namespace
}  // namespace chstate
