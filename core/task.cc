// The host-facing driver of a task's continuation chain.
#include "core/task.h"

#include <algorithm>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/clickhouse_errors.h"
#include "core/response.h"

namespace chstate {

Step Step::Run(SqlRequest request, ResponseHandler then) {
  Step s;
  s.kind = Action::Kind::kRunSql;
  s.request = std::move(request);
  s.on_response = std::move(then);
  return s;
}

Step Step::Wait(int64_t ms, TimerHandler then) {
  Step s;
  s.kind = Action::Kind::kWait;
  s.wait_ms = ms < 0 ? 0 : ms;
  s.on_timer = std::move(then);
  return s;
}

Step Step::Done(Result result) {
  Step s;
  s.kind = Action::Kind::kDone;
  s.result = std::move(result);
  return s;
}

Step Step::Fail(absl::Status status) {
  Step s;
  s.kind = Action::Kind::kFailed;
  s.status = std::move(status);
  return s;
}

bool MayResend(const SqlRequest& request, const SqlResponse& response) {
  return !response.transport_ok && (request.idempotent || !response.maybe_delivered);
}

bool PastSendBefore(const SqlRequest& request, int64_t now_ms) {
  return request.send_before_ms > 0 && now_ms >= request.send_before_ms;
}

bool ReplicaLevelError(const SqlRequest& request, const SqlResponse& response) {
  std::optional<int> code = ResponseCode(response);
  if (!code) return false;
  switch (*code) {
    case ch::kReplicaIsNotInQuorum:
    case ch::kNoZooKeeper:
    case ch::kTableIsReadOnly:
    case ch::kTooManySimultaneousQueries:
      return true;
    case ch::kKeeperException:
    case ch::kNetworkError:
      return request.idempotent;
    default:
      return false;
  }
}

Task::Task(std::function<Body(const Inputs*)> make_body, TransportPolicy policy) : policy_(policy) {
  body_ = make_body(&inputs_);
}

bool Task::ChooseHost() {
  if (!policy_.endpoints) return true;
  std::optional<size_t> i = policy_.endpoints->Pick(inputs_.now_ms, tried_);
  if (!i) return false;
  tried_.push_back(*i);
  pending_.request.endpoint = policy_.endpoints->at(*i);
  return true;
}

Action Task::SendPending() {
  phase_ = Phase::kSql;
  Action a;
  a.kind = Action::Kind::kRunSql;
  a.request = pending_.request;
  return a;
}

Action Task::Take(Step step) {
  pending_ = std::move(step);
  Action a;
  a.kind = pending_.kind;
  switch (pending_.kind) {
    case Action::Kind::kRunSql:
      pending_.request.attempt = 1;
      pending_.request.timeout_ms = policy_.request_timeout_ms;
      tried_.clear();
      failures_.clear();
      if (PastSendBefore(pending_.request, inputs_.now_ms)) {
        // The lease of the lock it acts under ran out before it left: it
        // never goes, and its step hears so.
        SqlResponse never;
        never.transport_ok = false;
        never.transport_error =
            absl::StrCat("not sent: the lease of the lock it acts under ran out ",
                         inputs_.now_ms - pending_.request.send_before_ms, " ms before it was to go");
        return Deliver(never);
      }
      ChooseHost();
      return SendPending();
    case Action::Kind::kWait:
      phase_ = Phase::kTimer;
      a.wait_ms = pending_.wait_ms;
      break;
    case Action::Kind::kDone:
      phase_ = Phase::kFinished;
      a.result = std::move(pending_.result);
      break;
    case Action::Kind::kFailed:
      phase_ = Phase::kFinished;
      a.status = pending_.status;
      break;
  }
  return a;
}

Action Task::Misuse(const char* what) {
  phase_ = Phase::kFinished;
  Action a;
  a.kind = Action::Kind::kFailed;
  a.status = absl::FailedPreconditionError(absl::StrCat("task misuse: ", what));
  return a;
}

Action Task::Start(const Inputs& in) {
  if (phase_ != Phase::kNew) return Misuse("Start called twice");
  inputs_ = in;
  return Take(body_());
}

Action Task::OnResponse(const SqlResponse& response, const Inputs& in) {
  if (phase_ != Phase::kSql) return Misuse("OnResponse called when the task was not waiting for SQL");
  inputs_ = in;
  const bool resendable = MayResend(pending_.request, response);
  // A request acting under a lock goes again (anywhere) only within its
  // lease: past it another process may hold the lock and have written.
  const bool in_lease = !PastSendBefore(pending_.request, in.now_ms);
  if (policy_.endpoints && !tried_.empty()) {
    const size_t host = tried_.back();
    const bool replica_error = ReplicaLevelError(pending_.request, response);
    // A write whose quorum was not confirmed there (319) may hold up that
    // replica's next writes too: the next requests go elsewhere.
    const bool unconfirmed = ResponseCode(response) == ch::kUnknownStatusOfInsert;
    if (resendable || replica_error || unconfirmed || (!response.transport_ok && response.maybe_delivered)) {
      // This host failed; the next request of any task avoids it for a while.
      policy_.endpoints->Failed(host, in.now_ms);
      std::optional<int> code = ResponseCode(response);
      failures_.push_back(absl::StrCat(Endpoints::Describe(policy_.endpoints->at(host)), ": ",
                                       response.transport_ok ? absl::StrCat("code ", code.value_or(0))
                                                             : response.transport_error));
    } else {
      policy_.endpoints->Answered(host);
    }
    if ((resendable || replica_error) && in_lease && ChooseHost()) return SendPending();
  }
  // A replica that is behind the last quorum write (289) catches up within
  // moments: with no other host left, a read asks it again after the
  // back-off, for up to twice the attempts.
  const bool replica_retry = !resendable && ResponseCode(response) == ch::kReplicaIsNotInQuorum &&
                             pending_.request.idempotent && pending_.request.attempt < 2 * policy_.attempts;
  if ((resendable && pending_.request.attempt < policy_.attempts) || replica_retry) {
    const int64_t wait_ms =
        std::min<int64_t>(policy_.backoff_ms << (pending_.request.attempt - 1), 8 * policy_.backoff_ms);
    if (!PastSendBefore(pending_.request, in.now_ms + wait_ms)) {
      phase_ = Phase::kResend;
      last_failure_ = response;
      Action a;
      a.kind = Action::Kind::kWait;
      a.wait_ms = wait_ms;
      return a;
    }
  }
  return Deliver(response);
}

Action Task::Deliver(const SqlResponse& response) {
  ResponseHandler handler = std::move(pending_.on_response);
  if (policy_.endpoints && !response.transport_ok && failures_.size() > 1) {
    // Every host was tried: say what each one did.
    SqlResponse all = response;
    all.transport_error = absl::StrCat("no host answered (", absl::StrJoin(failures_, "; "), ")");
    return Take(handler(all));
  }
  return Take(handler(response));
}

Action Task::OnTimer(const Inputs& in) {
  if (phase_ == Phase::kResend) {
    inputs_ = in;
    // A timer that fired late: past the lease the step gets the last answer.
    if (PastSendBefore(pending_.request, in.now_ms)) return Deliver(last_failure_);
    ++pending_.request.attempt;
    // A new round: every host may be tried again.
    tried_.clear();
    failures_.clear();
    ChooseHost();
    return SendPending();
  }
  if (phase_ != Phase::kTimer) return Misuse("OnTimer called when the task was not waiting for a timer");
  inputs_ = in;
  TimerHandler handler = std::move(pending_.on_timer);
  return Take(handler());
}

}  // namespace chstate
