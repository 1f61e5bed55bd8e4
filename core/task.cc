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

Task::Task(std::function<Body(const Inputs*)> make_body) { body_ = make_body(&inputs_); }

Action Task::Take(Step step) {
  pending_ = std::move(step);
  Action a;
  a.kind = pending_.kind;
  switch (pending_.kind) {
    case Action::Kind::kRunSql: a.request = pending_.request; break;
    case Action::Kind::kWait: a.wait_ms = pending_.wait_ms; break;
    case Action::Kind::kDone:
      a.result = std::move(pending_.result);
      finished_ = true;
      break;
    case Action::Kind::kFailed:
      a.status = pending_.status;
      finished_ = true;
      break;
  }
  return a;
}

Action Task::Misuse(const char* what) {
  finished_ = true;
  Action a;
  a.kind = Action::Kind::kFailed;
  a.status = absl::FailedPreconditionError(absl::StrCat("task misuse: ", what));
  return a;
}

Action Task::Start(const Inputs& in) {
  if (started_) return Misuse("Start called twice");
  started_ = true;
  inputs_ = in;
  return Take(body_());
}

Action Task::OnResponse(const SqlResponse& response, const Inputs& in) {
  if (!started_ || finished_ || pending_.kind != Action::Kind::kRunSql) {
    return Misuse("OnResponse called when the task was not waiting for SQL");
  }
  inputs_ = in;
  ResponseHandler handler = std::move(pending_.on_response);
  return Take(handler(response));
}

Action Task::OnTimer(const Inputs& in) {
  if (!started_ || finished_ || pending_.kind != Action::Kind::kWait) {
    return Misuse("OnTimer called when the task was not waiting for a timer");
  }
  inputs_ = in;
  TimerHandler handler = std::move(pending_.on_timer);
  return Take(handler());
}

}  // namespace chstate
