// The connection's queue of operations and its timers (see connection.h).
#include "core/connection.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"

namespace chstate {

uint64_t Connection::Start(std::unique_ptr<Task> task, const Inputs& in) {
  const uint64_t id = next_id_++;
  queue_.push_back(Op{id, std::move(task), false});
  StartNext(in);
  return id;
}

void Connection::StartNext(const Inputs& in) {
  // A task may end at once (bad input, a release of a lock not held): keep
  // going until one waits for something or the queue is empty.
  while (!current_ && !queue_.empty()) {
    current_ = std::move(queue_.front());
    queue_.pop_front();
    Take(current_->task->Start(in), in);
  }
}

void Connection::Take(Action action, const Inputs& in) {
  switch (action.kind) {
    case Action::Kind::kRunSql: {
      const int64_t deadline_ms = in.now_ms + action.request.timeout_ms;
      transmits_.push_back(Transmit{current_->id, std::move(action.request), deadline_ms});
      return;
    }
    case Action::Kind::kWait:
      // Its deadline is in the store's timer table (Task::WakeAt).
      return;
    case Action::Kind::kDone:
    case Action::Kind::kFailed: {
      const bool ok = action.kind == Action::Kind::kDone;
      // A renewal that went well is nobody's business; a lock it found lost is.
      if (!current_->renewal || !ok) {
        // Moved, not copied: an export page's result holds thousands of states.
        events_.push_back(OpEvent{current_->id, ok, ok ? std::move(action.result) : Result{}, action.status,
                                  current_->renewal});
      }
      current_.reset();
      return;
    }
  }
}

absl::Status Connection::HandleResponse(uint64_t op, const SqlResponse& response, const Inputs& in) {
  if (!current_ || current_->id != op || !current_->task->awaiting_answer()) {
    return absl::FailedPreconditionError(
        absl::StrCat("an answer for operation ", op, ", which is not waiting for one (abandoned, or answered twice)"));
  }
  // Should the host answer before polling the request, it is sent no more.
  transmits_.erase(std::remove_if(transmits_.begin(), transmits_.end(),
                                  [op](const Transmit& t) { return t.op == op; }),
                   transmits_.end());
  Take(current_->task->OnResponse(response, in), in);
  StartNext(in);
  return absl::OkStatus();
}

void Connection::HandleTimeout(const Inputs& in) {
  if (current_ && current_->task->waiting() && in.now_ms >= current_->task->WakeAt().value_or(0)) {
    Take(current_->task->OnTimer(in), in);
    StartNext(in);
    return;
  }
  if (!idle()) return;
  std::optional<int64_t> renew_at = store_->NextTimeoutMs();
  if (renew_at && in.now_ms >= *renew_at) {
    queue_.push_back(Op{next_id_++, store_->Tick(), true});
    StartNext(in);
  }
}

void Connection::Abandon(uint64_t op, const Inputs& in) {
  queue_.erase(std::remove_if(queue_.begin(), queue_.end(), [op](const Op& o) { return o.id == op; }), queue_.end());
  transmits_.erase(std::remove_if(transmits_.begin(), transmits_.end(),
                                  [op](const Transmit& t) { return t.op == op; }),
                   transmits_.end());
  if (current_ && current_->id == op) {
    current_.reset();
    StartNext(in);
  }
}

std::optional<Transmit> Connection::PollTransmit() {
  if (transmits_.empty()) return std::nullopt;
  Transmit t = std::move(transmits_.front());
  transmits_.pop_front();
  return t;
}

std::optional<int64_t> Connection::PollTimeout() const {
  if (current_) return current_->task->WakeAt();  // none while it awaits an answer
  if (!queue_.empty()) return std::nullopt;
  return store_->NextTimeoutMs();
}

ConnectionOutput Connection::Poll() {
  ConnectionOutput out;
  if (std::optional<OpEvent> e = PollEvent()) {
    out.kind = ConnectionOutput::Kind::kEnded;
    out.event = std::move(*e);
  } else if (std::optional<Transmit> t = PollTransmit()) {
    out.kind = ConnectionOutput::Kind::kTransmit;
    out.transmit = std::move(*t);
  } else {
    out.kind = idle() ? ConnectionOutput::Kind::kIdle : ConnectionOutput::Kind::kWait;
    out.at_ms = PollTimeout();
  }
  return out;
}

std::optional<OpEvent> Connection::PollEvent() {
  if (events_.empty()) return std::nullopt;
  OpEvent e = std::move(events_.front());
  events_.pop_front();
  return e;
}

}  // namespace chstate
