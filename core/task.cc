// The host-facing driver of one operation: its stack of parts (core/op.h)
// and the transport policy for every request they send.
#include "core/task.h"

#include <algorithm>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/clickhouse_errors.h"
#include "core/response.h"

namespace chstate {

Next Next::GoOn() {
  Next n;
  n.kind = Kind::kGoOn;
  return n;
}

Next Next::Send(SqlRequest request) {
  Next n;
  n.kind = Kind::kSend;
  n.request = std::move(request);
  return n;
}

Next Next::Wait(TimerKind timer, int64_t ms) {
  Next n;
  n.kind = Kind::kWait;
  n.timer = timer;
  n.wait_ms = ms < 0 ? 0 : ms;
  return n;
}

Next Next::Call(std::unique_ptr<Op> part) {
  Next n;
  n.kind = Kind::kCall;
  n.part = std::move(part);
  return n;
}

Next Next::Try(std::unique_ptr<Op> part) {
  Next n;
  n.kind = Kind::kTry;
  n.part = std::move(part);
  return n;
}

Next Next::Done() {
  Next n;
  n.kind = Kind::kDone;
  return n;
}

Next Next::Done(Result result) {
  Next n;
  n.kind = Kind::kDone;
  n.result = std::make_shared<Result>(std::move(result));
  return n;
}

Next Next::Fail(absl::Status status) {
  Next n;
  n.kind = Kind::kFail;
  n.status = std::move(status);
  return n;
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
    case ch::kReadonly:
      // A quorum write on a replica whose ZooKeeper session is being
      // restored: refused before anything is written, as 242 is.
      return ReplicaNotActive(response.body);
    case ch::kKeeperException:
    case ch::kNetworkError:
      return request.idempotent;
    default:
      return false;
  }
}

Task::Task(TransportPolicy policy) : policy_(policy) { timer_id_ = timers().NewId("task"); }

void Task::Run(std::shared_ptr<void> context, std::unique_ptr<Op> root) {
  context_ = std::move(context);
  stack_.clear();
  stack_.push_back(Frame{std::move(root), false});
}

Task::~Task() {
  stack_.clear();  // the operations first: they may use the context
  EndWait();
}

void Task::Wait(TimerKind kind, int64_t ms) {
  EndWait();
  waiting_for_ = kind;
  wait_ms_ = ms;
  timers().Set(kind, timer_id_, inputs_.now_ms + std::max<int64_t>(ms, 0));
}

void Task::EndWait() {
  if (phase_ == Phase::kTimer || phase_ == Phase::kResend) timers().Clear(waiting_for_, timer_id_);
}

std::optional<int64_t> Task::WakeAt() const {
  if (phase_ != Phase::kTimer && phase_ != Phase::kResend) return std::nullopt;
  return timers().At(waiting_for_, timer_id_);
}

void Task::NewRound() {
  tried_.clear();
  failures_.clear();
  if (!policy_.endpoints || pending_.not_to.empty()) return;
  // Hosts that already answered this read count as tried, unless no other
  // host is left.
  std::vector<size_t> answered;
  for (size_t i = 0; i < policy_.endpoints->size(); ++i) {
    for (const Endpoint& e : pending_.not_to) {
      if (policy_.endpoints->at(i) == e) answered.push_back(i);
    }
  }
  if (policy_.endpoints->Pick(inputs_.now_ms, answered)) tried_ = std::move(answered);
}

bool Task::ChooseHost() {
  if (!policy_.endpoints) return true;
  std::optional<size_t> i = policy_.endpoints->Pick(inputs_.now_ms, tried_);
  if (!i) return false;
  tried_.push_back(*i);
  pending_.endpoint = policy_.endpoints->at(*i);
  return true;
}

Action Task::SendPending() {
  phase_ = Phase::kSql;
  sent_at_ms_ = inputs_.now_ms;
  Action a;
  a.kind = Action::Kind::kRunSql;
  a.request = pending_;
  return a;
}

Action Task::Advance(Next next) {
  for (;;) {
    switch (next.kind) {
      case Next::Kind::kCall:
      case Next::Kind::kTry:
        stack_.push_back(Frame{std::move(next.part), next.kind == Next::Kind::kTry});
        next = stack_.back().op->Resume(Reply{});
        continue;
      case Next::Kind::kGoOn: {
        Reply r;
        r.kind = Reply::Kind::kPart;
        next = stack_.back().op->Resume(r);
        continue;
      }
      case Next::Kind::kDone:
      case Next::Kind::kFail: {
        const bool ok = next.kind == Next::Kind::kDone;
        if (stack_.size() <= 1) {
          stack_.clear();
          phase_ = Phase::kFinished;
          Action a;
          a.kind = ok ? Action::Kind::kDone : Action::Kind::kFailed;
          if (ok && next.result) a.result = std::move(*next.result);
          if (!ok) a.status = std::move(next.status);
          return a;
        }
        const bool tried = stack_.back().tried;
        stack_.pop_back();
        // A part called (not tried) that failed fails its caller too.
        if (!ok && !tried) continue;
        Reply r;
        r.kind = Reply::Kind::kPart;
        if (!ok) r.status = std::move(next.status);
        r.result = std::move(next.result);
        next = stack_.back().op->Resume(r);
        continue;
      }
      case Next::Kind::kSend:
        pending_ = std::move(next.request);
        pending_.attempt = 1;
        pending_.timeout_ms = policy_.request_timeout_ms;
        NewRound();
        if (PastSendBefore(pending_, inputs_.now_ms)) {
          // The lease of the lock it acts under ran out before it left: it
          // never goes, and its op hears so.
          SqlResponse never;
          never.transport_ok = false;
          never.transport_error =
              absl::StrCat("not sent: the lease of the lock it acts under ran out ",
                           inputs_.now_ms - pending_.send_before_ms, " ms before it was to go");
          return Deliver(never);
        }
        ChooseHost();
        return SendPending();
      case Next::Kind::kWait: {
        Wait(next.timer, next.wait_ms);
        phase_ = Phase::kTimer;
        Action a;
        a.kind = Action::Kind::kWait;
        a.wait_ms = next.wait_ms;
        return a;
      }
    }
  }
}

Action Task::Misuse(const char* what) {
  EndWait();
  phase_ = Phase::kFinished;
  stack_.clear();
  Action a;
  a.kind = Action::Kind::kFailed;
  a.status = absl::FailedPreconditionError(absl::StrCat("task misuse: ", what));
  return a;
}

Action Task::Start(const Inputs& in) {
  if (phase_ != Phase::kNew) return Misuse("Start called twice");
  if (stack_.empty()) return Misuse("Start called before Run");
  inputs_ = in;
  return Advance(stack_.back().op->Resume(Reply{}));
}

Action Task::OnResponse(const SqlResponse& response, const Inputs& in) {
  if (phase_ != Phase::kSql) return Misuse("OnResponse called when the task was not waiting for SQL");
  inputs_ = in;
  TellStatement(response);
  const bool resendable = MayResend(pending_, response);
  // A request acting under a lock goes again (anywhere) only within its
  // lease: past it another process may hold the lock and have written.
  const bool in_lease = !PastSendBefore(pending_, in.now_ms);
  if (policy_.endpoints && !tried_.empty()) {
    const size_t host = tried_.back();
    const bool replica_error = ReplicaLevelError(pending_, response);
    // A write whose quorum was not confirmed there (319) may hold up that
    // replica's next writes too: the next requests go elsewhere.
    const bool unconfirmed = ResponseCode(response) == ch::kUnknownStatusOfInsert;
    const bool failed =
        resendable || replica_error || unconfirmed || (!response.transport_ok && response.maybe_delivered);
    if (failed) {
      // This host failed; the next request of any task avoids it for a while.
      policy_.endpoints->Failed(host, in.now_ms);
      std::optional<int> code = ResponseCode(response);
      failures_.push_back(absl::StrCat(Endpoints::Describe(policy_.endpoints->at(host)), ": ",
                                       response.transport_ok ? absl::StrCat("code ", code.value_or(0))
                                                             : response.transport_error));
    } else {
      policy_.endpoints->Answered(host);
    }
    const bool next_host = (resendable || replica_error) && in_lease && ChooseHost();
    if (failed) {
      const std::string down = Endpoints::Describe(policy_.endpoints->at(host));
      const std::string next = next_host ? Endpoints::Describe(policy_.endpoints->at(tried_.back())) : "";
      Tell(DiagnosticKind::kHostDown, DiagnosticLevel::kInfo,
           absl::StrCat("host ", down, " marked down for ", policy_.endpoints->down_ms(), " ms (", failures_.back(),
                        ")", next_host ? absl::StrCat("; ", pending_.purpose, " goes to ", next, " now") : ""),
           {{"down_ms", policy_.endpoints->down_ms()}}, {{"host", down}, {"next_host", next}});
    }
    if (next_host) return SendPending();
  }
  // A replica that is behind the last quorum write (289) catches up within
  // moments: with no other host left, a read asks it again after the
  // back-off, for up to twice the attempts.
  const bool replica_retry = !resendable && ResponseCode(response) == ch::kReplicaIsNotInQuorum &&
                             pending_.idempotent && pending_.attempt < 2 * policy_.attempts;
  if ((resendable && pending_.attempt < policy_.attempts) || replica_retry) {
    const int64_t wait_ms =
        std::min<int64_t>(policy_.backoff_ms << (pending_.attempt - 1), 8 * policy_.backoff_ms);
    if (!PastSendBefore(pending_, in.now_ms + wait_ms)) {
      Wait(TimerKind::kResend, wait_ms);
      phase_ = Phase::kResend;
      last_failure_ = response;
      const int of = replica_retry ? 2 * policy_.attempts : policy_.attempts;
      const std::string why = response.transport_ok ? absl::StrCat("code ", ResponseCode(response).value_or(0))
                                                    : response.transport_error;
      Tell(DiagnosticKind::kResent, DiagnosticLevel::kInfo,
           absl::StrCat(pending_.purpose, " is sent again in ", wait_ms, " ms (attempt ", pending_.attempt + 1,
                        " of ", of, "): ", why),
           {{"attempt", pending_.attempt + 1}, {"attempts", of}, {"wait_ms", wait_ms}},
           {{"purpose", pending_.purpose}, {"why", why}});
      Action a;
      a.kind = Action::Kind::kWait;
      a.wait_ms = wait_ms;
      return a;
    }
  }
  return Deliver(response);
}

Action Task::Deliver(const SqlResponse& response) {
  Reply r;
  r.kind = Reply::Kind::kAnswer;
  r.sent = &pending_;
  if (policy_.endpoints && !response.transport_ok && failures_.size() > 1) {
    // Every host was tried: say what each one did.
    SqlResponse all = response;
    all.transport_error = absl::StrCat("no host answered (", absl::StrJoin(failures_, "; "), ")");
    r.answer = &all;
    return Advance(stack_.back().op->Resume(r));
  }
  r.answer = &response;
  return Advance(stack_.back().op->Resume(r));
}

Action Task::OnTimer(const Inputs& in) {
  if (phase_ == Phase::kResend) {
    EndWait();
    inputs_ = in;
    // A timer that fired late: past the lease the op gets the last answer.
    if (PastSendBefore(pending_, in.now_ms)) return Deliver(last_failure_);
    ++pending_.attempt;
    // A new round: every host may be tried again.
    NewRound();
    ChooseHost();
    return SendPending();
  }
  if (phase_ != Phase::kTimer) return Misuse("OnTimer called when the task was not waiting for a timer");
  EndWait();
  inputs_ = in;
  Reply r;
  r.kind = Reply::Kind::kTimer;
  return Advance(stack_.back().op->Resume(r));
}

void Task::Tell(DiagnosticKind kind, DiagnosticLevel level, std::string message,
                std::vector<std::pair<std::string, int64_t>> numbers,
                std::vector<std::pair<std::string, std::string>> texts) {
  if (policy_.diagnostics == nullptr || !policy_.diagnostics->Wants(level)) return;
  Diagnostic d;
  d.kind = kind;
  d.level = level;
  d.at_ms = inputs_.now_ms;
  d.message = std::move(message);
  d.numbers = std::move(numbers);
  d.texts = std::move(texts);
  policy_.diagnostics->Emit(std::move(d));
}

void Task::TellStatement(const SqlResponse& response) {
  if (policy_.diagnostics == nullptr || !policy_.diagnostics->Wants(DiagnosticLevel::kDebug)) return;
  const int64_t took = inputs_.now_ms - sent_at_ms_;
  std::string outcome = "ok";
  if (!response.transport_ok) {
    outcome = absl::StrCat("no answer: ", response.transport_error);
  } else if (std::optional<int> code = ResponseCode(response)) {
    outcome = absl::StrCat("code ", *code);
  } else if (response.http_status != 200) {
    outcome = absl::StrCat("HTTP ", response.http_status);
  }
  const std::string host = pending_.endpoint.port != 0 ? Endpoints::Describe(pending_.endpoint) : "";
  const std::string sql = policy_.diagnostics->redact_states() ? RedactStates(pending_.sql) : pending_.sql;
  Tell(DiagnosticKind::kStatement, DiagnosticLevel::kDebug,
       absl::StrCat(pending_.purpose, " (attempt ", pending_.attempt, host.empty() ? "" : absl::StrCat(", ", host),
                    "): ", outcome, " in ", took, " ms"),
       {{"took_ms", took}, {"attempt", pending_.attempt}}, {{"purpose", pending_.purpose}, {"host", host},
                                                            {"outcome", outcome}, {"sql", sql}});
}

std::string Task::Where() const {
  std::vector<std::string> parts;
  for (const Frame& f : stack_) {
    std::string where = f.op->Where();
    if (!where.empty()) parts.push_back(std::move(where));
  }
  std::string out = absl::StrJoin(parts, " > ");
  switch (phase_) {
    case Phase::kNew: absl::StrAppend(&out, " (not started)"); break;
    case Phase::kSql: absl::StrAppend(&out, " (", pending_.purpose, " sent, attempt ", pending_.attempt, ")"); break;
    case Phase::kTimer: absl::StrAppend(&out, " (waiting ", wait_ms_, " ms: ", TimerKindName(waiting_for_), ")"); break;
    case Phase::kResend:
      absl::StrAppend(&out, " (", pending_.purpose, " failed; sent again in ", wait_ms_, " ms)");
      break;
    case Phase::kFinished: out = "finished"; break;
  }
  return out;
}

}  // namespace chstate
