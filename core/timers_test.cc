// The one table of every deadline the core keeps (core/timers.h): the table
// itself, and that a store's waits, held locks and hosts' down marks are in
// it (and nowhere else: the connection reads its wake-up from it).
#include "core/timers.h"

#include <algorithm>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "core/connection.h"
#include "core/endpoints.h"
#include "core/lock.h"
#include "core/store.h"
#include "core/testing/responses.h"
#include "core/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace chstate {
namespace {

using ::chstate::testing::Err;
using ::chstate::testing::IsOk;
using ::chstate::testing::Ok;
using ::chstate::testing::Refused;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using Key = TimerTable::Key;

TEST(TimerTable, SetMovesClearRemovesAndEarliestIsTheMinimumOfTheKindsAsked) {
  TimerTable t;
  EXPECT_FALSE(t.Earliest(kIdleTimers).has_value());
  t.Set(TimerKind::kRenewal, "a", 300);
  t.Set(TimerKind::kLinger, "b", 200);
  t.Set(TimerKind::kMutationPoll, "task 2", 100);  // a task kind: never an idle timeout
  t.Set(TimerKind::kResend, "task 1", 50);
  EXPECT_EQ(t.Earliest(kIdleTimers), 200);
  EXPECT_EQ(t.Earliest(kTaskTimers), 50);
  t.Set(TimerKind::kLinger, "b", 400);  // moved, not added
  EXPECT_EQ(t.Earliest(kIdleTimers), 300);
  t.Clear(TimerKind::kRenewal, "a");
  EXPECT_EQ(t.Earliest(kIdleTimers), 400);
  EXPECT_EQ(t.At(TimerKind::kRenewal, "a"), std::nullopt);
  EXPECT_EQ(t.Due(100, TimerKinds{TimerKind::kMutationPoll}).size(), 1u);
  EXPECT_TRUE(t.Due(99, TimerKinds{TimerKind::kMutationPoll}).empty());
  EXPECT_TRUE(t.Due(1000, TimerKinds{TimerKind::kRenewal}).empty());  // not set: never due
}

TEST(TimerTable, DueListsTheEntriesWhoseTimeCameEarliestFirst) {
  TimerTable t;
  t.Set(TimerKind::kRenewal, "z", 30);
  t.Set(TimerKind::kRenewal, "a", 20);
  t.Set(TimerKind::kWaiterLook, "a", 10);
  t.Set(TimerKind::kLinger, "a", 99);
  EXPECT_THAT(t.Due(30, kIdleTimers), ElementsAre(Key(TimerKind::kWaiterLook, "a"), Key(TimerKind::kRenewal, "a"),
                                                  Key(TimerKind::kRenewal, "z")));
  t.Clear(TimerKind::kWaiterLook, "a");
  t.Clear(TimerKind::kRenewal, "a");
  EXPECT_THAT(t.Due(1000, kIdleTimers), ElementsAre(Key(TimerKind::kRenewal, "z"), Key(TimerKind::kLinger, "a")));
}

TEST(TimerTable, IdsAreFreshAndTheTableDescribesItself) {
  TimerTable t;
  EXPECT_EQ(t.NewId("task"), "task 1");
  EXPECT_EQ(t.NewId("task"), "task 2");
  t.Set(TimerKind::kQuorumBusy, "task 2", 1234);
  EXPECT_THAT(t.Describe(), HasSubstr("quorum-busy task 2 @1234"));
}

const std::string kRandom(32, '\x33');

std::unique_ptr<Store> MakeStore(StoreOptions o = {}) {
  o.lock.stale_ms = 300000;
  o.lock.timeout_ms = 10000;
  absl::StatusOr<std::unique_ptr<Store>> s = Store::Create(std::move(o));
  EXPECT_THAT(s, IsOk());
  return std::move(*s);
}

TEST(StoreTimers, ATasksResendWaitIsInTheStoresTableAndTheConnectionWakesAtIt) {
  std::unique_ptr<Store> store = MakeStore();
  Connection conn(store.get());
  conn.Start(store->Ping(), {1000, kRandom});
  std::optional<Transmit> tx = conn.PollTransmit();
  ASSERT_TRUE(tx.has_value());
  ASSERT_THAT(conn.HandleResponse(tx->op, Refused(), {1010, kRandom}), IsOk());
  std::optional<int64_t> at = store->timers().Earliest(kTaskTimers);
  ASSERT_TRUE(at.has_value()) << store->timers().Describe();
  EXPECT_EQ(conn.PollTimeout(), at);
  EXPECT_THAT(store->timers().Describe(), HasSubstr("resend task"));
  // Early: nothing happens; at the time: the request goes again and the
  // entry is gone.
  conn.HandleTimeout({*at - 1, kRandom});
  EXPECT_FALSE(conn.PollTransmit().has_value());
  conn.HandleTimeout({*at, kRandom});
  EXPECT_TRUE(conn.PollTransmit().has_value());
  EXPECT_FALSE(store->timers().Earliest(kTaskTimers).has_value()) << store->timers().Describe();
}

TEST(StoreTimers, AnAbandonedTaskLeavesNoTimer) {
  std::unique_ptr<Store> store = MakeStore();
  Connection conn(store.get());
  uint64_t op = conn.Start(store->Ping(), {0, kRandom});
  std::optional<Transmit> tx = conn.PollTransmit();
  ASSERT_TRUE(tx.has_value());
  ASSERT_THAT(conn.HandleResponse(op, Refused(), {5, kRandom}), IsOk());
  ASSERT_TRUE(store->timers().Earliest(kTaskTimers).has_value());
  conn.Abandon(op, {6, kRandom});
  EXPECT_TRUE(store->timers().empty()) << store->timers().Describe();
}

// An acquisition waiting for another holder: the table holds only what
// wakes the task (its retry); its deadline is the operation's own field.
TEST(StoreTimers, AnAcquisitionWaitingForAnotherHolderIsWokenForItsRetryAlone) {
  std::unique_ptr<Store> store = MakeStore();  // lock timeout 10 s
  Connection conn(store.get());
  int64_t now = 1000;
  const std::string other = MakeLockId(std::string(32, '\x44'));  // not this store's (kRandom)
  uint64_t op = conn.Start(store->AcquireLock("dev:a"), {now, kRandom});
  std::vector<std::string> sent;
  while (std::optional<Transmit> tx = conn.PollTransmit()) {
    SqlResponse answer = Ok("");
    if (tx->request.purpose == "select_version") answer = Ok("18.16.1\t0\n");
    if (tx->request.purpose == "create_lock") answer = Err(500, 57, "Table meltano.state_lock_x already exists");
    if (tx->request.purpose == "inspect_lock") {
      answer = Ok(absl::StrCat(other, "\t0\t1\t1\t300\n\t255\t1\t1\t0\n"));  // another process, live
    }
    sent.push_back(tx->request.purpose);
    ASSERT_THAT(conn.HandleResponse(tx->op, answer, {now += 10, kRandom}), IsOk());
  }
  std::optional<OpEvent> ended = conn.PollEvent();
  ASSERT_FALSE(ended.has_value()) << "the acquisition waits for the other holder: " << ended->status
                                    << ::testing::PrintToString(sent);
  // The task is woken for its retry, never for the deadline (11010: 10 s
  // from its start, connected at 1010).
  const std::string described = store->timers().Describe();
  EXPECT_THAT(described, ::testing::StartsWith("lock-retry task 1 @")) << described;
  EXPECT_EQ(std::count(described.begin(), described.end(), '\n'), 1) << described;
  EXPECT_NE(store->timers().Earliest(kTaskTimers), std::optional<int64_t>(11010));
  conn.Abandon(op, {now, kRandom});
  EXPECT_TRUE(store->timers().empty()) << store->timers().Describe();
}

TEST(StoreTimers, AHeldLocksRenewalIsInTheTableAndIsTheIdleTimeout) {
  std::unique_ptr<Store> store = MakeStore();
  Connection conn(store.get());
  int64_t now = 0;
  conn.Start(store->AcquireLock("dev:a"), {now, kRandom});
  while (std::optional<Transmit> tx = conn.PollTransmit()) {
    std::string body;
    if (tx->request.purpose == "select_version") body = "18.16.1\t0\n";
    if (tx->request.purpose == "inspect_lock") {
      body = absl::StrCat(MakeLockId(kRandom), "\t0\t100\t100\t300\n\t255\t100\t100\t0\n");
    }
    ASSERT_THAT(conn.HandleResponse(tx->op, Ok(body), {now += 10, kRandom}), IsOk());
  }
  std::optional<OpEvent> e = conn.PollEvent();
  ASSERT_TRUE(e.has_value());
  ASSERT_TRUE(e->ok) << e->status;
  std::optional<int64_t> renewal = store->timers().At(TimerKind::kRenewal, "dev:a");
  ASSERT_TRUE(renewal.has_value()) << store->timers().Describe();
  // Its lease's end wakes nothing: the machine keeps it, and the table
  // holds only the renewal and the look for waiters.
  EXPECT_EQ(store->timers().Describe(),
            absl::StrCat("renewal dev:a @", *renewal, "\nwaiter-look dev:a @",
                         *store->timers().At(TimerKind::kWaiterLook, "dev:a"), "\n"));
  EXPECT_GT(store->LeaseDeadlineMs("dev:a"), *renewal);
  EXPECT_EQ(conn.PollTimeout(), renewal);
  EXPECT_EQ(store->NextTimeoutMs(), renewal);
  // Released: nothing of it is left in the table, and the idle store has
  // nothing to wake for.
  conn.Start(store->ReleaseLock("dev:a", MakeLockId(kRandom)), {now, kRandom});
  while (std::optional<Transmit> tx = conn.PollTransmit()) {
    std::string body;
    if (tx->request.purpose == "inspect_lock") {
      body = absl::StrCat(MakeLockId(kRandom), "\t0\t100\t100\t300\n\t255\t100\t100\t0\n");
    }
    ASSERT_THAT(conn.HandleResponse(tx->op, Ok(body), {now += 10, kRandom}), IsOk());
  }
  e = conn.PollEvent();
  ASSERT_TRUE(e.has_value());
  ASSERT_TRUE(e->ok) << e->status;
  EXPECT_TRUE(store->timers().empty()) << store->timers().Describe();
  EXPECT_EQ(conn.PollTimeout(), std::nullopt);
}

TEST(StoreTimers, AHostMarkedDownIsMarkedForHostDownMs) {
  StoreOptions o;
  o.hosts = {{"h1", 8123}, {"h2", 8123}};
  o.cluster.name = "c";
  std::unique_ptr<Store> store = MakeStore(o);
  Connection conn(store.get());
  conn.Start(store->Ping(), {1000, kRandom});
  std::optional<Transmit> tx = conn.PollTransmit();
  ASSERT_TRUE(tx.has_value());
  ASSERT_EQ(tx->request.endpoint.host, "h1");
  ASSERT_THAT(conn.HandleResponse(tx->op, Refused(), {1010, kRandom}), IsOk());
  EXPECT_EQ(store->options().transport.endpoints->DownUntil(0), 1010 + o.host_down_ms);
  EXPECT_TRUE(store->timers().empty()) << store->timers().Describe();  // a mark wakes nothing
}

}  // namespace
}  // namespace chstate
