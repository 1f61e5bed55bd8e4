// The host-facing driver of a task's continuation chain.
#include "core/task.h"

#include <utility>

#include "absl/strings/str_cat.h"

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

Task::Task(std::function<Body(const Inputs*)> make_body, TransportPolicy policy) : policy_(policy) {
  body_ = make_body(&inputs_);
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
  if (MayResend(pending_.request, response) && pending_.request.attempt < policy_.attempts) {
    phase_ = Phase::kResend;
    Action a;
    a.kind = Action::Kind::kWait;
    a.wait_ms = policy_.backoff_ms << (pending_.request.attempt - 1);
    return a;
  }
  ResponseHandler handler = std::move(pending_.on_response);
  return Take(handler(response));
}

Action Task::OnTimer(const Inputs& in) {
  if (phase_ == Phase::kResend) {
    inputs_ = in;
    ++pending_.request.attempt;
    return SendPending();
  }
  if (phase_ != Phase::kTimer) return Misuse("OnTimer called when the task was not waiting for a timer");
  inputs_ = in;
  TimerHandler handler = std::move(pending_.on_timer);
  return Take(handler());
}

}  // namespace chstate
