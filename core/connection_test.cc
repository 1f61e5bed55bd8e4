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
using ::chstate::testing::Refused;
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

// ---- The connection's invariants (issue 28), one test each ----

// One request in flight at a time: however many ops are queued, and even
// when the host answers before it polled the request, PollTransmit never
// holds two.
TEST(ConnectionInvariant, OneRequestInFlightAtATime) {
  auto c = MakeConnection();
  uint64_t first = c->Start(c->store().Get("a"), {0, kRandom});
  uint64_t second = c->Start(c->store().Get("b"), {0, kRandom});
  uint64_t third = c->Start(c->store().Ping(), {0, kRandom});
  // The host answers the first op's request without polling it: that request
  // is sent no more, and only its next one is there to poll.
  ASSERT_TRUE(c->HandleResponse(first, kVersion, {1, kRandom}).ok());
  std::optional<Transmit> t = c->PollTransmit();
  ASSERT_TRUE(t.has_value());
  EXPECT_EQ(t->op, first);
  EXPECT_EQ(t->request.purpose, "get_state");
  EXPECT_FALSE(c->PollTransmit().has_value()) << "a second request while the first is in flight";
  ASSERT_TRUE(c->HandleResponse(first, Ok(""), {2, kRandom}).ok());
  // The next op's first request, and only it.
  t = c->PollTransmit();
  ASSERT_TRUE(t.has_value());
  EXPECT_EQ(t->op, second);
  EXPECT_FALSE(c->PollTransmit().has_value());
  ASSERT_TRUE(c->HandleResponse(second, Ok(""), {3, kRandom}).ok());  // get_state: absent
  t = c->PollTransmit();
  ASSERT_TRUE(t.has_value());
  EXPECT_EQ(t->op, third);
  EXPECT_FALSE(c->PollTransmit().has_value());
}

// An abandoned op sends nothing more and never ends with an event: whether
// it was queued, had a request not yet polled, or waited for a resend.
TEST(ConnectionInvariant, AnAbandonedOpSendsNothingAndHasNoEvent) {
  auto c = MakeConnection();
  uint64_t running = c->Start(c->store().Get("a"), {0, kRandom});
  uint64_t queued = c->Start(c->store().Get("b"), {0, kRandom});
  uint64_t last = c->Start(c->store().Get("c"), {0, kRandom});
  c->Abandon(queued, {1, kRandom});
  c->Abandon(running, {1, kRandom});  // its select_version was never polled
  // The request there to send is the last op's, never an abandoned one's.
  std::optional<Transmit> t = c->PollTransmit();
  ASSERT_TRUE(t.has_value());
  EXPECT_EQ(t->op, last);
  EXPECT_FALSE(c->PollTransmit().has_value());
  // Its request is lost: it waits to resend, and is abandoned while it waits.
  ASSERT_TRUE(c->HandleResponse(last, Lost(), {2, kRandom}).ok());
  ASSERT_EQ(c->PollTimeout(), std::optional<int64_t>(102));
  c->Abandon(last, {3, kRandom});
  c->HandleTimeout({102, kRandom});
  c->HandleTimeout({100000, kRandom});
  EXPECT_FALSE(c->PollTransmit().has_value()) << "a request sent for an abandoned op";
  EXPECT_FALSE(c->PollEvent().has_value()) << "an event for an abandoned op";
  EXPECT_TRUE(c->idle());
}

// A stale answer, for a request that is no longer the one awaited, is
// refused and changes nothing: a duplicate that arrives while its op waits
// to resend, or after its op ended.
TEST(ConnectionInvariant, AStaleAnswerIsRefusedAndChangesNothing) {
  auto c = MakeConnection();
  uint64_t op = c->Start(c->store().Get("a"), {0, kRandom});
  ASSERT_TRUE(c->PollTransmit().has_value());
  ASSERT_TRUE(c->HandleResponse(op, Lost(), {10, kRandom}).ok());
  ASSERT_EQ(c->PollTimeout(), std::optional<int64_t>(110));
  // The lost request's answer turns up after all, during the back-off.
  EXPECT_THAT(c->HandleResponse(op, kVersion, {20, kRandom}),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("not waiting")));
  EXPECT_FALSE(c->PollTransmit().has_value());
  EXPECT_FALSE(c->PollEvent().has_value());
  EXPECT_EQ(c->PollTimeout(), std::optional<int64_t>(110));
  // The resend goes as planned and the op ends.
  c->HandleTimeout({110, kRandom});
  std::optional<Transmit> t = c->PollTransmit();
  ASSERT_TRUE(t.has_value());
  EXPECT_EQ(t->request.attempt, 2);
  ASSERT_TRUE(c->HandleResponse(op, kVersion, {111, kRandom}).ok());
  Answer(*c, op, "get_state", Ok(""), 112);
  std::optional<OpEvent> e = c->PollEvent();
  ASSERT_TRUE(e.has_value());
  EXPECT_TRUE(e->ok) << e->status;
  // Once it ended, a late duplicate of its last answer is refused too.
  EXPECT_THAT(c->HandleResponse(op, Ok(""), {113, kRandom}),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("not waiting")));
  EXPECT_FALSE(c->PollEvent().has_value());
  EXPECT_FALSE(c->PollTransmit().has_value());
}

// No timer outlives its op: once an op that waited ends (finished, failed
// or abandoned) and the store holds no lock, PollTimeout asks for nothing.
TEST(ConnectionInvariant, NoTimerIsLeftForAFinishedOp) {
  auto c = MakeConnection();
  // Fails after its resends: every send of select_version is lost.
  uint64_t failing = c->Start(c->store().Get("a"), {0, kRandom});
  int64_t now = 0;
  for (int sends = 0; sends < 10; ++sends) {
    std::optional<Transmit> t = c->PollTransmit();
    if (!t) break;
    ASSERT_TRUE(c->HandleResponse(failing, Lost(), {++now, kRandom}).ok());
    if (std::optional<int64_t> at = c->PollTimeout()) {
      now = *at;
      c->HandleTimeout({now, kRandom});
    }
  }
  std::optional<OpEvent> e = c->PollEvent();
  ASSERT_TRUE(e.has_value());
  EXPECT_FALSE(e->ok);
  EXPECT_FALSE(c->PollTimeout().has_value()) << "a timer left for a failed op";
  // One that waited to resend, then finished.
  uint64_t ok = c->Start(c->store().Get("a"), {now, kRandom});
  ASSERT_TRUE(c->PollTransmit().has_value());
  ASSERT_TRUE(c->HandleResponse(ok, Refused(), {now, kRandom}).ok());
  ASSERT_TRUE(c->PollTimeout().has_value());
  c->HandleTimeout({*c->PollTimeout(), kRandom});
  ASSERT_TRUE(c->PollTransmit().has_value());
  ASSERT_TRUE(c->HandleResponse(ok, kVersion, {now + 200, kRandom}).ok());
  Answer(*c, ok, "get_state", Ok(""), now + 201);
  ASSERT_TRUE(c->PollEvent().has_value());
  EXPECT_FALSE(c->PollTimeout().has_value()) << "a timer left for a finished op";
  // One abandoned while it waited.
  uint64_t gone = c->Start(c->store().Get("a"), {now + 300, kRandom});
  ASSERT_TRUE(c->PollTransmit().has_value());
  ASSERT_TRUE(c->HandleResponse(gone, Refused(), {now + 300, kRandom}).ok());
  ASSERT_TRUE(c->PollTimeout().has_value());
  c->Abandon(gone, {now + 301, kRandom});
  EXPECT_FALSE(c->PollTimeout().has_value()) << "a timer left for an abandoned op";
  EXPECT_TRUE(c->idle());
}

}  // namespace
}  // namespace chstate

namespace chstate {
namespace {

TEST(ConnectionPoll, EndedFirstThenTheRequestThenTheWaitThenIdleWithTheRenewal) {
  auto c = MakeConnection(30000);
  ConnectionOutput o = c->Poll();
  EXPECT_EQ(o.kind, ConnectionOutput::Kind::kIdle);
  EXPECT_FALSE(o.at_ms.has_value());  // nothing held: nothing to wake for
  uint64_t op = c->Start(c->store().Ping(), {0, kRandom});
  o = c->Poll();
  ASSERT_EQ(o.kind, ConnectionOutput::Kind::kTransmit);
  EXPECT_EQ(o.transmit.op, op);
  EXPECT_EQ(c->running(), op);
  EXPECT_TRUE(c->awaiting_answer());
  o = c->Poll();
  EXPECT_EQ(o.kind, ConnectionOutput::Kind::kWait);  // taken: now the op waits for its answer
  EXPECT_FALSE(o.at_ms.has_value());
  ASSERT_TRUE(c->HandleResponse(op, Refused(), {10, kRandom}).ok());
  o = c->Poll();
  ASSERT_EQ(o.kind, ConnectionOutput::Kind::kWait);  // the resend's back-off
  ASSERT_TRUE(o.at_ms.has_value());
  EXPECT_GT(*o.at_ms, 10);
  EXPECT_FALSE(c->awaiting_answer());
  c->HandleTimeout({*o.at_ms, kRandom});
  o = c->Poll();
  ASSERT_EQ(o.kind, ConnectionOutput::Kind::kTransmit);
  ASSERT_TRUE(c->HandleResponse(op, kVersion, {*o.at_ms + 1, kRandom}).ok());
  o = c->Poll();
  ASSERT_EQ(o.kind, ConnectionOutput::Kind::kEnded);
  EXPECT_EQ(o.event.op, op);
  EXPECT_TRUE(o.event.ok);
  EXPECT_EQ(c->running(), 0u);
  // Holding a lock: idle, with the renewal as the time to call back.
  auto held = Holding();
  o = held->Poll();
  ASSERT_EQ(o.kind, ConnectionOutput::Kind::kIdle);
  EXPECT_EQ(o.at_ms, held->store().NextTimeoutMs());
}

}  // namespace
}  // namespace chstate
