// An operation's lock: driving the lock machine (core/lock_machine.h) with
// SQL steps, acquiring (and, in cluster mode, pruning dead claims) and
// releasing.
#include "core/store.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/lock_machine.h"
#include "core/quoting.h"
#include "core/response.h"
#include "core/store_steps.h"

namespace chstate {

// Turns a LockMachine's actions into steps until it reports an outcome
// (acquired, released, failed, lost): it sends what the machine sends (its
// waiter rows included) and waits what it says. Renewal timers armed while
// held are not run inside a task: the lease is checked before every write
// instead.
Step StoreSteps::DriveLock(const LockPtr& m, LockOutcome on_outcome) {
  while (std::optional<LockAction> a = m->Poll()) {
    switch (a->kind) {
      case LockAction::Kind::kRunSql:
        return Step::Run(std::move(a->request), [this, m, on_outcome](const SqlResponse& r) {
          const bool waiter_row = m->state() == LockState::kAnnouncing;
          m->OnResponse(r, *in_);
          // A waiter row's answer is no read: the holder seen before stands.
          if (!waiter_row) NoteHolder(*m);
          return DriveLock(m, on_outcome);
        });
      case LockAction::Kind::kArmTimer:
        if (a->timer == LockTimer::kRenewal) {
          // A renewal that finished arms the next one: that is its outcome.
          if (m->state() == LockState::kHeld) return on_outcome(*a);
          continue;  // armed as it became the holder, released since
        }
        // The back-off before the next attempt, or (cluster mode) a quorum
        // insert answered 286 sent again after a moment.
        if (a->timer == LockTimer::kBackOff && !waiting_for_.empty()) TellWaiting(*m, a->delay_ms);
        return Step::Wait(a->delay_ms, [this, m, on_outcome] {
          m->OnTimer(*in_);
          return DriveLock(m, on_outcome);
        });
      default:
        return on_outcome(*a);
    }
  }
  return Step::Fail(absl::InternalError(
      absl::StrCat("the lock stopped in state ", LockStateName(m->state()), " without an outcome")));
}

void StoreSteps::NoteHolder(const LockMachine& m) {
  const LockSighting& seen = m.sighting();
  waiting_for_ = seen.live_holder;
  if (waiting_for_.empty()) return;
  waiting_age_s_ = seen.inspection.age_s;
  waiting_window_s_ = std::max((m.options().stale_ms + 999) / 1000, seen.inspection.stale_s);
}

void StoreSteps::TellWaiting(const LockMachine& m, int64_t next_try_ms) {
  const int64_t validity_left_s = std::max<int64_t>(waiting_window_s_ - waiting_age_s_, 0);
  const int64_t gives_up_in_ms = std::max<int64_t>(m.acquire_deadline_ms() - in_->now_ms, 0);
  Tell(DiagnosticKind::kLockWaiting, DiagnosticLevel::kInfo, m.state_id(),
       absl::StrCat("waiting for the lock on \"", PrintableId(m.state_id()), "\": another process (lock ",
                    waiting_for_, ") renewed it ", waiting_age_s_, " s ago and it stays valid up to ",
                    validity_left_s, " s more; next try in ", next_try_ms, " ms, giving up in ", gives_up_in_ms,
                    " ms"),
       {{"renewed_s_ago", waiting_age_s_},
        {"validity_left_s", validity_left_s},
        {"next_try_ms", next_try_ms},
        {"gives_up_in_ms", gives_up_in_ms}},
       {{"holder", waiting_for_}});
}

// `deadline_ms`: when waiting ends (the lock timeout from the first
// attempt); a retry after yielding to the Python backend keeps it.
Step StoreSteps::Acquire(const std::string& id, std::function<Step(LockPtr)> then, OnFailure fail,
                         std::optional<int64_t> deadline_ms) {
  const int64_t deadline = deadline_ms.value_or(in_->now_ms + s_->options_.lock.timeout_ms);
  if (std::optional<int64_t> away = s_->timers_.At(TimerKind::kYield, id)) {
    // This store just gave the id's lingering lock up to a waiting
    // process: stay away until that process has had its next attempt.
    if (in_->now_ms < *away && *away < deadline) {
      return Step::Wait(*away - in_->now_ms,
                        [this, id, then, fail, deadline] { return Acquire(id, then, fail, deadline); });
    }
    s_->timers_.Clear(TimerKind::kYield, id);
  }
  // A mixed fleet is safe by default: a live row of the Python backend in
  // <table>_lock is waited for whatever python_locks says (that setting
  // decides whether this store also shows itself there, and looks again
  // after taking its own lock). Looked at before taking the lock, so that
  // a failed look leaves nothing to release. The Python backend knows no
  // clusters.
  if (!s_->options_.python_locks && !st().cluster().enabled()) {
    return Query(
        st().ForeignLockRows(id), "looking for the Python backend's lock rows", 2,
        [this, id, then, fail, deadline](const Rows& rows) -> Step {
          if (rows.empty()) return TakeLock(id, then, fail, deadline);
          return WaitForPython(id, rows[0][0].value_or(""), then, fail, deadline);
        },
        [this, id, then, fail, deadline](absl::Status st) -> Step {
          // No such table: no Python process ever ran on this schema.
          if (st.code() == absl::StatusCode::kNotFound) return TakeLock(id, then, fail, deadline);
          return fail(std::move(st));
        });
  }
  return TakeLock(id, then, fail, deadline);
}

Step StoreSteps::TakeLock(const std::string& id, std::function<Step(LockPtr)> then, OnFailure fail, int64_t deadline) {
  LockOptions options = s_->options_.lock;
  options.timeout_ms = std::max<int64_t>(deadline - in_->now_ms, 0);
  // Waiting for a live holder, the machine shows itself to it (a waiter
  // row, once per holder) so that a lingering holder elsewhere yields.
  LockMachineOptions machine_options;
  machine_options.write_waiter_rows = true;
  LockPtr m = MakeLockMachine(st(), id, options, machine_options);
  m->Acquire(*in_);
  return DriveLock(m, [this, m, id, deadline, then, fail](const LockAction& a) -> Step {
    if (a.kind != LockAction::Kind::kAcquired) return fail(ExplainCluster(a.status));
    if (!s_->options_.python_locks) return PruneClaims(m, [this, m, then] { return then(m); });
    return ClaimFromPython(id, m, deadline, then, fail);
  });
}

// Cluster mode, just acquired by `m`: when its winning claims read held
// kClaimsPruneAt claims of the id that no reader counts any more, they
// are removed (kClaimsPruneAt). A failure changes nothing: they are
// removed by a later acquisition.
Step StoreSteps::PruneClaims(const LockPtr& m, Then then) {
  const std::string& id = m->state_id();
  if (!st().cluster().enabled() || static_cast<int64_t>(m->prunable_claims().size()) < kClaimsPruneAt) return then();
  std::vector<std::string> dead = m->prunable_claims();
  // A backlog (claims from before pruning existed) goes kClaimsPruneMax
  // at a time, a slice at a random offset, at every acquisition until it
  // is gone (a statement must stay below max_query_size, 256 KiB).
  const bool backlog = static_cast<int64_t>(dead.size()) > kClaimsPruneMax;
  auto last = s_->claims_pruned_ms_.find(id);
  if (!backlog && last != s_->claims_pruned_ms_.end() && in_->now_ms - last->second < kClaimsPruneEveryMs) {
    return then();
  }
  s_->claims_pruned_ms_[id] = in_->now_ms;
  if (backlog) {
    uint64_t r = 0;
    for (size_t i = 0; i < in_->random.size() && i < 8; ++i) r = (r << 8) | static_cast<unsigned char>(in_->random[i]);
    const size_t from = static_cast<size_t>(r % (dead.size() - kClaimsPruneMax + 1));
    dead = std::vector<std::string>(dead.begin() + from, dead.begin() + from + kClaimsPruneMax);
  }
  return Sql(
      st().PruneClaims(id, dead), "removing ended lock claims", [then](const std::string&) { return then(); },
      [then](absl::Status) { return then(); });
}

Step StoreSteps::Release(const LockPtr& m, Then then, OnFailure fail) {
  auto drop = [this, m, then, fail] {
    m->Release(*in_);
    return DriveLock(m, [this, then, fail](const LockAction& a) -> Step {
      if (a.kind == LockAction::Kind::kReleased) return then();
      return fail(ExplainCluster(a.status));
    });
  };
  if (!s_->options_.python_locks || m->state() != LockState::kHeld) return drop();
  // The marker first: while it stands, Python processes wait.
  return Sql(
      st().DeleteLockMarker(m->state_id(), m->lock_id()), "withdrawing the lock marker",
      [drop](const std::string&) { return drop(); },
      // Dropped anyway; the marker then ends with the Python backend's window.
      [drop](absl::Status) { return drop(); });
}

}  // namespace chstate
