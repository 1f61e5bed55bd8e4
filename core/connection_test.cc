// The connection pumped as a host would: transmits answered, timeouts fired
// at PollTimeout, events read; scripted answers and a fake clock.
#include "core/connection.h"

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/lock.h"
#include "core/testing/responses.h"
#include "core/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace chstate {
namespace {

using ::chstate::testing::Lost;
using ::chstate::testing::Ok;
using ::chstate::testing::StatusIs;
using ::testing::HasSubstr;

const std::string kRandom(32, '\x22');
const std::string kLockId = MakeLockId(kRandom);
const SqlResponse kVersion = Ok("18.16.1\t1\n");

std::unique_ptr<Connection> MakeConnection(int64_t stale_ms = 30000) {
  StoreOptions o;
  o.lock.stale_ms = stale_ms;
  absl::StatusOr<std::unique_ptr<Store>> s = Store::Create(o);
  EXPECT_TRUE(s.ok()) << s.status();
  return std::make_unique<Connection>(std::move(*s));
}

// The lock table as an inspection reads it: `holder` created it at `created_s`.
SqlResponse Held(const std::string& holder, int64_t created_s, int64_t now_s) {
  return Ok(absl::StrCat(holder, "\t0\t", created_s, "\t", now_s, "\t30\n\t255\t", created_s, "\t", now_s, "\t0\n"));
}

MeltanoState State(const std::string& id) {
  return MeltanoState{id, nlohmann::json::object(), nlohmann::json::parse(R"({"singer_state":{"a":1}})")};
}

// Answers the next transmit, which must be for `op` with `purpose`.
void Answer(Connection& c, uint64_t op, const std::string& purpose, const SqlResponse& r, int64_t now) {
  std::optional<Transmit> t = c.PollTransmit();
  ASSERT_TRUE(t.has_value()) << "expected " << purpose;
  EXPECT_EQ(t->op, op);
  EXPECT_EQ(t->request.purpose, purpose);
  EXPECT_FALSE(c.PollTransmit().has_value()) << "one request at a time";
  EXPECT_TRUE(c.HandleResponse(op, r, {now, kRandom}).ok());
}

// A connection whose store holds "id", taken at 2 ms (window 30 s: the
// renewal is due at 10002 ms).
std::unique_ptr<Connection> Holding() {
  auto c = MakeConnection(30000);
  uint64_t op = c->Start(c->store().AcquireLock("id"), {0, kRandom});
  Answer(*c, op, "select_version", kVersion, 1);
  Answer(*c, op, "foreign_lock_rows", Ok(""), 2);  // no Python backend's row
  Answer(*c, op, "create_lock", Ok(), 2);
  std::optional<OpEvent> e = c->PollEvent();
  EXPECT_TRUE(e.has_value() && e->ok && e->result.lock_id == kLockId);
  return c;
}

TEST(Connection, AnOperationIsOneRequestAtATimeThenOneEvent) {
  auto c = MakeConnection();
  uint64_t op = c->Start(c->store().Get("a"), {1000, kRandom});
  EXPECT_FALSE(c->PollEvent().has_value());
  std::optional<Transmit> t = c->PollTransmit();
  ASSERT_TRUE(t.has_value());
  EXPECT_EQ(t->deadline_ms, 1000 + t->request.timeout_ms);
  ASSERT_TRUE(c->HandleResponse(op, kVersion, {1005, kRandom}).ok());
  Answer(*c, op, "get_state", Ok("{}\t{\"singer_state\":{\"a\":1}}\n"), 1010);
  std::optional<OpEvent> e = c->PollEvent();
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->op, op);
  ASSERT_TRUE(e->ok) << e->status;
  EXPECT_FALSE(e->renewal);
  ASSERT_TRUE(e->result.state.has_value());
  EXPECT_EQ(e->result.state->completed["singer_state"]["a"], 1);
  EXPECT_TRUE(c->idle());
  EXPECT_FALSE(c->PollTimeout().has_value());  // no lock held: nothing to wake for
}

TEST(Connection, OperationsRunInTheOrderStarted) {
  auto c = MakeConnection();
  uint64_t first = c->Start(c->store().Get("a"), {0, kRandom});
  uint64_t second = c->Start(c->store().Set(State("b")), {0, kRandom});
  EXPECT_NE(first, second);
  Answer(*c, first, "select_version", kVersion, 1);
  Answer(*c, first, "get_state", Ok(""), 2);  // the second starts only now
  std::optional<OpEvent> e = c->PollEvent();
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->op, first);
  // A set takes the id's lock around its write.
  Answer(*c, second, "foreign_lock_rows", Ok(""), 3);
  Answer(*c, second, "create_lock", Ok(), 3);
  Answer(*c, second, "insert_state", Ok(), 3);
  Answer(*c, second, "inspect_lock", Held(kLockId, 0, 0), 3);
  Answer(*c, second, "drop_lock", Ok(), 3);
  e = c->PollEvent();
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->op, second);
  EXPECT_TRUE(e->ok) << e->status;
}

TEST(Connection, AResendWaitsForItsTimeout) {
  auto c = MakeConnection();
  uint64_t op = c->Start(c->store().Get("a"), {0, kRandom});
  Answer(*c, op, "select_version", Lost(), 10);
  EXPECT_EQ(c->PollTimeout(), std::optional<int64_t>(110));  // the policy's 100 ms back-off
  c->HandleTimeout({109, kRandom});                           // too early: nothing happens
  EXPECT_FALSE(c->PollTransmit().has_value());
  c->HandleTimeout({110, kRandom});
  std::optional<Transmit> t = c->PollTransmit();
  ASSERT_TRUE(t.has_value());
  EXPECT_EQ(t->request.purpose, "select_version");
  EXPECT_EQ(t->request.attempt, 2);
}

TEST(Connection, AHeldLockIsRenewedByCallingBackAtPollTimeout) {
  auto c = Holding();
  // A third of the window after taking it (at 2 ms), the renewal is due.
  ASSERT_EQ(c->PollTimeout(), std::optional<int64_t>(10002));
  c->HandleTimeout({10001, kRandom});
  EXPECT_FALSE(c->PollTransmit().has_value());
  c->HandleTimeout({10002, kRandom});
  std::optional<Transmit> t = c->PollTransmit();
  ASSERT_TRUE(t.has_value());
  EXPECT_EQ(t->request.purpose, "renew_lock");
  ASSERT_TRUE(c->HandleResponse(t->op, Ok(), {10005, kRandom}).ok());
  Answer(*c, t->op, "inspect_lock", Held(kLockId, 10, 20), 10010);
  EXPECT_FALSE(c->PollEvent().has_value()) << "a renewal that went well is no event";
  EXPECT_EQ(c->PollTimeout(), std::optional<int64_t>(20010));
  EXPECT_TRUE(c->store().LeaseValid("id", 30000));
}

TEST(Connection, ALockFoundLostWhileRenewingIsAnEvent) {
  auto c = Holding();
  c->HandleTimeout({10002, kRandom});
  std::optional<Transmit> t = c->PollTransmit();
  ASSERT_TRUE(t.has_value());
  ASSERT_TRUE(c->HandleResponse(t->op, Ok(), {10005, kRandom}).ok());
  Answer(*c, t->op, "inspect_lock", Held("someone-else", 10, 20), 10010);
  std::optional<OpEvent> e = c->PollEvent();
  ASSERT_TRUE(e.has_value());
  EXPECT_TRUE(e->renewal);
  EXPECT_FALSE(e->ok);
  EXPECT_THAT(e->status, StatusIs(absl::StatusCode::kAborted, HasSubstr("\"id\"")));
  EXPECT_FALSE(c->PollTimeout().has_value());  // never renewed again
  EXPECT_FALSE(c->store().LeaseValid("id", 10011));
}

// Found by the simulation driving whole stores: a release queued behind a
// running renewal. The store now looks at its held locks when a task
// starts, not when it is built.
TEST(Connection, AReleaseQueuedBehindARenewalRunsAfterIt) {
  auto c = Holding();
  c->HandleTimeout({10002, kRandom});
  std::optional<Transmit> renew = c->PollTransmit();
  ASSERT_TRUE(renew.has_value());
  ASSERT_EQ(renew->request.purpose, "renew_lock");
  uint64_t release = c->Start(c->store().ReleaseLock("id", kLockId), {10003, kRandom});
  EXPECT_FALSE(c->PollTransmit().has_value()) << "the release waits for the renewal";
  ASSERT_TRUE(c->HandleResponse(renew->op, Ok(), {10005, kRandom}).ok());
  Answer(*c, renew->op, "inspect_lock", Held(kLockId, 10, 20), 10010);
  Answer(*c, release, "inspect_lock", Held(kLockId, 10, 20), 10012);
  Answer(*c, release, "drop_lock", Ok(), 10014);
  std::optional<OpEvent> e = c->PollEvent();
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->op, release);
  EXPECT_TRUE(e->ok) << e->status;
  EXPECT_FALSE(c->PollTimeout().has_value());  // nothing held, nothing to renew
  EXPECT_FALSE(c->store().LeaseValid("id", 10015));
}

// Found by tests/fuzz/connection_fuzzer: an op abandoned while it renewed
// the lock left the lock waiting for an answer that never came, neither
// renewed nor reported, its lease running out unseen.
TEST(Connection, ARenewalAbandonedMidRequestIsRenewedAgain) {
  auto c = Holding();
  // Reading the held id when its renewal is due renews it first; the host
  // then abandons that read mid-renewal.
  uint64_t get = c->Start(c->store().Get("id"), {10002, kRandom});
  std::optional<Transmit> t = c->PollTransmit();
  ASSERT_TRUE(t.has_value());
  ASSERT_EQ(t->request.purpose, "renew_lock");
  c->Abandon(get, {10003, kRandom});
  EXPECT_TRUE(c->store().LeaseValid("id", 10004));
  // The host is asked to call back at once, and the lock is renewed again.
  std::optional<int64_t> at = c->PollTimeout();
  ASSERT_TRUE(at.has_value());
  EXPECT_LE(*at, 10004);
  c->HandleTimeout({10004, kRandom});
  at = c->PollTimeout();
  ASSERT_TRUE(at.has_value());
  EXPECT_GT(*at, 10004);
  c->HandleTimeout({*at, kRandom});
  t = c->PollTransmit();
  ASSERT_TRUE(t.has_value());
  EXPECT_EQ(t->request.purpose, "renew_lock");
  ASSERT_TRUE(c->HandleResponse(t->op, Ok(), {*at + 1, kRandom}).ok());
  Answer(*c, t->op, "inspect_lock", Held(kLockId, 10, 20), *at + 2);
  EXPECT_FALSE(c->PollEvent().has_value());
  EXPECT_TRUE(c->store().LeaseValid("id", *at + 20000));
}

TEST(Connection, AnAnswerForAnOperationNotWaitingIsRefused) {
  auto c = MakeConnection();
  uint64_t first = c->Start(c->store().Get("a"), {0, kRandom});
  uint64_t second = c->Start(c->store().Get("b"), {0, kRandom});
  ASSERT_TRUE(c->PollTransmit().has_value());
  EXPECT_THAT(c->HandleResponse(second, kVersion, {1, kRandom}), StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("not waiting")));
  c->Abandon(first, {2, kRandom});
  EXPECT_THAT(c->HandleResponse(first, kVersion, {3, kRandom}), StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("not waiting")));
  // The abandoned op leaves no event; the next one has started.
  Answer(*c, second, "select_version", kVersion, 4);
  Answer(*c, second, "get_state", Ok(""), 5);
  std::optional<OpEvent> e = c->PollEvent();
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->op, second);
  EXPECT_FALSE(c->PollEvent().has_value());
}

TEST(Connection, AnOperationThatEndsAtOnceLetsTheNextStart) {
  auto c = MakeConnection();
  uint64_t bad = c->Start(c->store().Get(""), {0, kRandom});  // an empty id: refused, nothing sent
  uint64_t good = c->Start(c->store().Get("a"), {0, kRandom});
  std::optional<OpEvent> e = c->PollEvent();
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->op, bad);
  EXPECT_THAT(e->status, StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("state id")));
  std::optional<Transmit> t = c->PollTransmit();
  ASSERT_TRUE(t.has_value());
  EXPECT_EQ(t->op, good);
}

}  // namespace
}  // namespace chstate
