// The host choice (core/endpoints.h) and the task's failover across hosts
// (core/task.h): which host each send goes to, and what is reported when
// every host failed.
#include "core/endpoints.h"

#include <memory>
#include <string>
#include <vector>

#include "core/task.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace chstate {
namespace {

using ::testing::HasSubstr;

// The list is an order of preference: every request goes to the first host
// not marked down, whichever host answered last.
TEST(EndpointsTest, EveryRequestGoesToTheFirstHostNotMarkedDown) {
  Endpoints e({{"a", 1}, {"b", 2}, {"c", 3}});
  EXPECT_EQ(e.Pick(0, {}), 0u);
  e.Failed(0, 1000);
  EXPECT_EQ(e.Pick(1000, {}), 1u);
  e.Answered(2);  // c answered (a request b failed too, say): b is still preferred
  EXPECT_EQ(e.Pick(1000, {}), 1u);
  e.Failed(1, 1000);
  EXPECT_EQ(e.Pick(1000, {}), 2u);
  // Within a request: every host once, then none.
  EXPECT_EQ(e.Pick(1000, {2}), 0u);     // a and b are down, untried: the first mark to run out
  EXPECT_EQ(e.Pick(1000, {2, 0}), 1u);
  EXPECT_EQ(e.Pick(1000, {2, 0, 1}), std::nullopt);
  // The marks run out: a is first again.
  EXPECT_EQ(e.Pick(1000 + kDefaultHostDownMs, {}), 0u);
  EXPECT_EQ(e.Describe(), "a:1, b:2 and c:3");
  EXPECT_EQ(Endpoints::Describe({"::1", 8123}), "[::1]:8123");
}

// A host that failed is skipped for host_down_ms, then tried first again
// (the old rule stayed on the host it moved to: host_down_ms changed nothing).
TEST(EndpointsTest, AFailedHostIsTriedFirstAgainAfterHostDownMs) {
  for (const int64_t down_ms : {int64_t{0}, int64_t{100}, kDefaultHostDownMs}) {
    SCOPED_TRACE(down_ms);
    Endpoints e({{"a", 1}, {"b", 2}, {"c", 3}}, down_ms);
    e.Failed(0, 1000);
    e.Answered(1);
    if (down_ms > 0) EXPECT_EQ(e.Pick(1000 + down_ms - 1, {}), 1u);
    EXPECT_EQ(e.Pick(1000 + down_ms, {}), 0u);
  }
}

// An answer from a host marked down (every host was down) clears its mark.
TEST(EndpointsTest, AnAnswerClearsTheMark) {
  Endpoints e({{"a", 1}, {"b", 2}});
  e.Failed(0, 100);
  e.Failed(1, 200);
  EXPECT_EQ(e.Pick(300, {}), 0u);
  e.Answered(0);
  EXPECT_FALSE(e.Down(0, 300));
  EXPECT_TRUE(e.Down(1, 300));
  EXPECT_EQ(e.Pick(300, {}), 0u);
}

TEST(EndpointsTest, TheDownMarkLastsHostDownMs) {
  for (const int64_t down_ms : {int64_t{100}, kDefaultHostDownMs}) {
    SCOPED_TRACE(down_ms);
    Endpoints e({{"a", 1}, {"b", 2}, {"c", 3}}, down_ms);
    e.Failed(1, 1000);
    EXPECT_EQ(e.Pick(1000 + down_ms - 1, {0}), 2u);  // b is still down: c
    EXPECT_EQ(e.Pick(1000 + down_ms, {0}), 1u);      // b is back
  }
}

TEST(EndpointsTest, WhenAllAreDownTheOneMarkedLongestAgoGoesFirst) {
  Endpoints e({{"a", 1}, {"b", 2}});
  e.Failed(1, 100);
  e.Failed(0, 200);
  EXPECT_EQ(e.Pick(300, {}), 1u);
}

// One request, sent once: the task's transport policy does the rest.
class OneRequestOp final : public Op {
 public:
  OneRequestOp(SqlRequest request, SqlResponse* seen) : request_(std::move(request)), seen_(seen) {}
  Next Resume(const Reply& reply) override {
    if (reply.kind == Reply::Kind::kStart) return Next::Send(request_);
    *seen_ = *reply.answer;
    return Next::Done(Result{});
  }
  std::string Where() const override { return "one request"; }

 private:
  SqlRequest request_;
  SqlResponse* seen_;
};

// A one-request task over three hosts.
struct OneRequest {
  std::shared_ptr<Endpoints> hosts = std::make_shared<Endpoints>(std::vector<Endpoint>{{"a", 1}, {"b", 2}, {"c", 3}});
  SqlResponse seen;
  std::unique_ptr<Task> Make(bool idempotent, int64_t send_before_ms = 0, bool one_host = false) {
    TransportPolicy policy;
    if (!one_host) policy.endpoints = hosts;
    policy.attempts = 2;
    SqlRequest r;
    r.sql = "SELECT 1";
    r.idempotent = idempotent;
    r.send_before_ms = send_before_ms;
    auto task = std::make_unique<Task>(policy);
    task->Run(nullptr, std::make_unique<OneRequestOp>(r, &seen));
    return task;
  }
};

SqlResponse Refused(const std::string& who) {
  SqlResponse r;
  r.transport_ok = false;
  r.transport_error = "connection refused (" + who + ")";
  return r;
}

SqlResponse Code(int code) {
  SqlResponse r;
  r.http_status = 500;
  r.exception_code_header = std::to_string(code);
  r.body = "Code: " + std::to_string(code) + ", e.displayText() = DB::Exception: x";
  return r;
}

SqlResponse Ok() {
  SqlResponse r;
  r.http_status = 200;
  r.body = "1\n";
  return r;
}

TEST(FailoverTest, ARefusedHostIsFollowedAtOnceByTheNextAndTheNextRequestStartsThere) {
  OneRequest t;
  std::unique_ptr<Task> task = t.Make(/*idempotent=*/false);
  Action a = task->Start({0, ""});
  ASSERT_EQ(a.kind, Action::Kind::kRunSql);
  EXPECT_EQ(a.request.endpoint, (Endpoint{"a", 1}));
  a = task->OnResponse(Refused("a:1"), {5, ""});  // never delivered: safe to send elsewhere
  ASSERT_EQ(a.kind, Action::Kind::kRunSql);
  EXPECT_EQ(a.request.endpoint, (Endpoint{"b", 2}));
  EXPECT_EQ(a.request.attempt, 1);
  a = task->OnResponse(Ok(), {6, ""});
  EXPECT_EQ(a.kind, Action::Kind::kDone);
  std::unique_ptr<Task> next = t.Make(true);
  EXPECT_EQ(next->Start({7, ""}).request.endpoint, (Endpoint{"b", 2}));
}

// An answer from a host clears its down mark, the first host's too: a
// request that found b and c refusing went to a (marked down), a answered,
// and the next request starts at a again.
TEST(FailoverTest, AnAnswerFromAHostClearsItsMarkTheFirstHostsToo) {
  OneRequest t;
  std::unique_ptr<Task> task = t.Make(/*idempotent=*/true);
  task->Start({0, ""});
  Action a = task->OnResponse(Refused("a:1"), {10, ""});
  ASSERT_EQ(a.request.endpoint, (Endpoint{"b", 2}));
  ASSERT_EQ(task->OnResponse(Ok(), {11, ""}).kind, Action::Kind::kDone);
  EXPECT_TRUE(t.hosts->Down(0, 12));
  std::unique_ptr<Task> next = t.Make(true);
  a = next->Start({20, ""});
  ASSERT_EQ(a.request.endpoint, (Endpoint{"b", 2}));
  a = next->OnResponse(Refused("b:2"), {21, ""});
  ASSERT_EQ(a.request.endpoint, (Endpoint{"c", 3}));
  a = next->OnResponse(Refused("c:3"), {22, ""});
  ASSERT_EQ(a.request.endpoint, (Endpoint{"a", 1}));
  ASSERT_EQ(next->OnResponse(Ok(), {23, ""}).kind, Action::Kind::kDone);
  EXPECT_FALSE(t.hosts->Down(0, 24));
  EXPECT_TRUE(t.hosts->Down(1, 24));
  EXPECT_EQ(t.Make(true)->Start({25, ""}).request.endpoint, (Endpoint{"a", 1}));
}

// Through the task driver: once a's mark runs out (host_down_ms after it
// failed), requests go to a again, though b answered in between.
TEST(FailoverTest, TheFirstHostIsUsedAgainOnceItsMarkRunsOut) {
  OneRequest t;
  std::unique_ptr<Task> task = t.Make(/*idempotent=*/true);
  task->Start({0, ""});
  Action a = task->OnResponse(Refused("a:1"), {10, ""});
  ASSERT_EQ(a.request.endpoint, (Endpoint{"b", 2}));
  ASSERT_EQ(task->OnResponse(Ok(), {11, ""}).kind, Action::Kind::kDone);
  EXPECT_EQ(t.Make(true)->Start({10 + kDefaultHostDownMs - 1, ""}).request.endpoint, (Endpoint{"b", 2}));
  EXPECT_EQ(t.Make(true)->Start({10 + kDefaultHostDownMs, ""}).request.endpoint, (Endpoint{"a", 1}));
}

TEST(FailoverTest, ALaggingReplicaIsSkipped) {
  OneRequest t;
  std::unique_ptr<Task> task = t.Make(true);
  Action a = task->Start({0, ""});
  a = task->OnResponse(Code(289), {1, ""});
  ASSERT_EQ(a.kind, Action::Kind::kRunSql);
  EXPECT_EQ(a.request.endpoint, (Endpoint{"b", 2}));
  a = task->OnResponse(Ok(), {2, ""});
  EXPECT_EQ(a.kind, Action::Kind::kDone);
  EXPECT_EQ(t.seen.body, "1\n");
}

TEST(FailoverTest, AWriteThatMayHaveLandedIsNotSentElsewhere) {
  OneRequest t;
  std::unique_ptr<Task> task = t.Make(/*idempotent=*/false);
  task->Start({0, ""});
  SqlResponse reset = Refused("a:1");
  reset.maybe_delivered = true;
  Action a = task->OnResponse(reset, {1, ""});
  EXPECT_EQ(a.kind, Action::Kind::kDone);  // the step decides (the lock inspects; a write reports)
  EXPECT_FALSE(t.seen.transport_ok);
  // ...but the next request avoids the host.
  EXPECT_EQ(t.Make(true)->Start({2, ""}).request.endpoint, (Endpoint{"b", 2}));
}

TEST(FailoverTest, AnErrorOfTheWholeClusterIsNotRetriedElsewhere) {
  OneRequest t;
  std::unique_ptr<Task> task = t.Make(false);
  task->Start({0, ""});
  EXPECT_EQ(task->OnResponse(Code(285), {1, ""}).kind, Action::Kind::kDone);
  EXPECT_EQ(t.seen.exception_code_header, "285");
}

TEST(FailoverTest, EveryHostDownNamesEveryHostAfterTheLastRound) {
  OneRequest t;
  std::unique_ptr<Task> task = t.Make(true);
  Action a = task->Start({0, ""});
  int sends = 1;
  while (true) {
    std::string who = Endpoints::Describe(a.request.endpoint);
    a = task->OnResponse(Refused(who), {sends, ""});
    if (a.kind == Action::Kind::kWait) a = task->OnTimer({sends + 100, ""});
    if (a.kind != Action::Kind::kRunSql) break;
    ++sends;
  }
  EXPECT_EQ(sends, 6);  // two rounds of three hosts
  EXPECT_EQ(a.kind, Action::Kind::kDone);
  EXPECT_THAT(t.seen.transport_error, HasSubstr("no host answered"));
  for (const char* h : {"a:1", "b:2", "c:3"}) EXPECT_THAT(t.seen.transport_error, HasSubstr(h));
}

// A request acting under a lock (send_before_ms: its lease's end) is sent
// again, to any host and for any reason, only before it.
TEST(LeaseDeadlineTest, ARefusedRequestGoesToTheNextHostOnlyWithinTheLease) {
  OneRequest t;
  std::unique_ptr<Task> task = t.Make(/*idempotent=*/true, /*send_before_ms=*/1000);
  Action a = task->Start({0, ""});
  ASSERT_EQ(a.kind, Action::Kind::kRunSql);
  a = task->OnResponse(Refused("a:1"), {999, ""});
  ASSERT_EQ(a.kind, Action::Kind::kRunSql);
  EXPECT_EQ(a.request.endpoint, (Endpoint{"b", 2}));
  a = task->OnResponse(Code(289), {1000, ""});  // a replica-level error too
  EXPECT_EQ(a.kind, Action::Kind::kDone) << "sent to " << Endpoints::Describe(a.request.endpoint);
  EXPECT_EQ(t.seen.exception_code_header, "289");
}

TEST(LeaseDeadlineTest, ABackOffResendThatWouldGoPastTheLeaseIsNotMade) {
  OneRequest t;
  // One server, back-off 100 ms: refused at 1001, the resend would go at
  // 1101, past the lease's end at 1100.
  std::unique_ptr<Task> task = t.Make(true, 1100, /*one_host=*/true);
  task->Start({0, ""});
  Action a = task->OnResponse(Refused("a:1"), {1001, ""});
  EXPECT_EQ(a.kind, Action::Kind::kDone) << "kind " << static_cast<int>(a.kind);
  EXPECT_FALSE(t.seen.transport_ok);
  // Just in time: it waits and goes.
  std::unique_ptr<Task> in_time = t.Make(true, 1101, true);
  in_time->Start({0, ""});
  a = in_time->OnResponse(Refused("a:1"), {1000, ""});
  ASSERT_EQ(a.kind, Action::Kind::kWait);
  a = in_time->OnTimer({1100, ""});
  EXPECT_EQ(a.kind, Action::Kind::kRunSql);
  EXPECT_EQ(a.request.attempt, 2);
}

TEST(LeaseDeadlineTest, AResendWhoseTimerFiresPastTheLeaseIsNotMade) {
  OneRequest t;
  std::unique_ptr<Task> task = t.Make(true, 1200, true);
  task->Start({0, ""});
  Action a = task->OnResponse(Refused("a:1"), {1000, ""});
  ASSERT_EQ(a.kind, Action::Kind::kWait);
  a = task->OnTimer({1200, ""});  // the host woke late
  EXPECT_EQ(a.kind, Action::Kind::kDone);
  EXPECT_THAT(t.seen.transport_error, HasSubstr("connection refused (a:1)"));
}

TEST(LeaseDeadlineTest, ARequestDueAfterTheLeaseNeverLeaves) {
  OneRequest t;
  std::unique_ptr<Task> task = t.Make(true, 1000);
  Action a = task->Start({1000, ""});
  EXPECT_EQ(a.kind, Action::Kind::kDone);
  EXPECT_FALSE(t.seen.transport_ok);
  EXPECT_FALSE(t.seen.maybe_delivered);
  EXPECT_THAT(t.seen.transport_error, HasSubstr("not sent: the lease of the lock it acts under ran out"));
  // No deadline (0): sent whenever.
  EXPECT_EQ(t.Make(true)->Start({1000000, ""}).kind, Action::Kind::kRunSql);
}

}  // namespace
}  // namespace chstate
