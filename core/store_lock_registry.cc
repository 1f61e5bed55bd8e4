// Locks held between operations: a lock scope's lock (AcquireLock,
// RenewLock, ReleaseLock) and a lingering one (linger_locks), their
// renewal and lease checks, yielding to a waiter, and the timers Tick runs.
#include "core/store.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/lock_machine.h"
#include "core/quoting.h"
#include "core/response.h"
#include "core/store_steps.h"

namespace chstate {

bool Store::LeaseValid(const std::string& state_id, int64_t now_ms) const {
  auto it = held_.find(state_id);
  return it != held_.end() && it->second.machine->LeaseValid(now_ms);
}

int64_t Store::LeaseDeadlineMs(const std::string& state_id) const {
  auto it = held_.find(state_id);
  return it == held_.end() ? 0 : it->second.machine->lease_deadline_ms();
}

// Renews the lock this store holds on `id` when its renewal is due. A lock
// found lost stays known (writes to the id are refused by LeaseCheck until
// it is released), and the operation goes on: reading is harmless.
Step StoreSteps::RenewIfDue(const std::string& id, Then then, OnFailure fail) {
  auto it = s_->held_.find(id);
  if (it == s_->held_.end() || !it->second.Live() || in_->now_ms < it->second.renew_at_ms) return then();
  return Renew(id, then, [then](absl::Status) { return then(); }, std::move(fail));
}

// Renews the lock this store holds on `id` now. `lost` gets the status
// when the lock turned out not ours any more; `fail` any other failure.
Step StoreSteps::Renew(const std::string& id, Then then, OnFailure lost, OnFailure fail) {
  auto it = s_->held_.find(id);
  if (it == s_->held_.end()) return lost(LostLock(id));
  std::shared_ptr<LockMachine> m = it->second.machine;
  if (m->state() != LockState::kHeld) return lost(LostLock(id));
  m->OnTimer(*in_);
  return DriveLock(m, [this, m, id, then, lost, fail](const LockAction& a) -> Step {
    if (a.kind == LockAction::Kind::kArmTimer) {
      // Confirmed (or inconclusive, to be tried again soon): the machine
      // names when the next renewal is due.
      auto it = s_->held_.find(id);
      if (it != s_->held_.end() && it->second.machine == m) it->second.renew_at_ms = in_->now_ms + a.delay_ms;
      Tell(DiagnosticKind::kLeaseRenewed, DiagnosticLevel::kDebug, id,
           absl::StrCat("the lock on \"", PrintableId(id), "\" was renewed; its lease runs ",
                        m->lease_deadline_ms() - in_->now_ms, " ms more, next renewal in ", a.delay_ms, " ms"),
           {{"lease_left_ms", m->lease_deadline_ms() - in_->now_ms}, {"next_renewal_ms", a.delay_ms}});
      if (!s_->options_.python_locks || m->state() != LockState::kHeld) return then();
      // The marker is renewed with the lock: the Python backend counts a
      // row live for kPythonLockWindowS. A failure here is tried again at
      // the next renewal, well inside that window.
      return Sql(
          st().InsertLockMarker(id, m->lock_id()), "renewing the lock marker",
          [then](const std::string&) { return then(); }, [then](absl::Status) { return then(); });
    }
    if (m->state() == LockState::kLost) {
      absl::Status why = a.status.ok() ? LostLock(id) : a.status;
      Tell(DiagnosticKind::kLeaseLost, DiagnosticLevel::kWarning, id, std::string(why.message()));
      return lost(std::move(why));
    }
    return fail(a.status);
  });
}

Step StoreSteps::RenewForWait(const std::string& id, Then then, OnFailure fail) {
  if (s_->held_.count(id) != 0) return Renew(id, then, fail, fail);
  LockPtr m = current_lock_;
  if (!m || m->state_id() != id || m->state() != LockState::kHeld) return fail(LostLock(id));
  m->OnTimer(*in_);
  return DriveLock(m, [m, id, then, fail](const LockAction& a) -> Step {
    if (a.kind == LockAction::Kind::kArmTimer && m->state() == LockState::kHeld) return then();
    return fail(a.status.ok() ? LostLock(id) : a.status);
  });
}

absl::Status StoreSteps::LostLock(const std::string& id) {
  return absl::AbortedError(
      absl::StrCat("the lock on state id \"", PrintableId(id), "\" was lost: stop acting under it and release it"));
}

// A lingering lock whose lease ran out (the process was paused) or that
// was found lost is forgotten when a task starts: not ours to drop, and
// the next acquisition starts afresh.
void StoreSteps::ForgetStaleLingering() {
  for (auto it = s_->held_.begin(); it != s_->held_.end();) {
    if (it->second.lingering && (!it->second.Live() || !it->second.machine->LeaseValid(in_->now_ms))) {
      it = s_->held_.erase(it);
    } else {
      ++it;
    }
  }
}

// Releases the held lock `m` on `id` (inspection and DROP) and then
// forgets it. It stays known until the release ends (its machine, no
// longer holding, is neither renewed nor valid for writes meanwhile), so
// that its lease deadline stays visible (LeaseDeadlineMs) while the DROP
// is decided.
Step StoreSteps::ReleaseAndForget(const std::string& id, const LockPtr& m, Then then, OnFailure fail) {
  auto forget = [this, id, m] {
    auto held = s_->held_.find(id);
    if (held != s_->held_.end() && held->second.machine == m) s_->held_.erase(held);
  };
  return Release(
      m,
      [forget, then] {
        forget();
        return then();
      },
      [forget, fail](absl::Status st) {
        forget();
        return fail(std::move(st));
      });
}

// Releases for real the lingering lock on `id`; `then` either way (a
// failed release leaves it to expire).
Step StoreSteps::ReleaseLingeringLock(const std::string& id, Then then) {
  auto it = s_->held_.find(id);
  if (it == s_->held_.end() || !it->second.lingering) return then();
  return ReleaseAndForget(id, it->second.machine, then, [then](absl::Status) { return then(); });
}

// linger_locks: looks for processes waiting for the lock on `id`. `none`
// when there is none; when there is one (or the look fails), this store
// stays away from the id until that process's next attempt (Acquire
// waits) and `waiter` runs (the release for real).
Step StoreSteps::LookForWaiters(const std::string& id, Then none, Then waiter) {
  auto yield = [this, id, waiter] {
    s_->yielded_until_[id] = in_->now_ms + s_->options_.lock.retry_ms + kDefaultLockYieldMarginMs;
    Tell(DiagnosticKind::kLockYielded, DiagnosticLevel::kInfo, id,
         absl::StrCat("the lingering lock on \"", PrintableId(id),
                      "\" is released for a process waiting for it; this process stays away for ",
                      s_->options_.lock.retry_ms + kDefaultLockYieldMarginMs, " ms"),
         {{"away_ms", s_->options_.lock.retry_ms + kDefaultLockYieldMarginMs}});
    return waiter();
  };
  auto held = s_->held_.find(id);
  const std::string holder = held == s_->held_.end() ? std::string() : held->second.machine->lock_id();
  return Query(
      st().LockWaiters(id, holder), "looking for processes waiting for the lock", 2,
      [none, yield](const Rows& rows) { return rows.empty() ? none() : yield(); },
      [yield](absl::Status) { return yield(); });
}

// Tick's part for linger_locks: lingering locks idle past their time go,
// and so do those another process now waits for (looked for every
// WaiterCheckEveryMs while they linger).
Step StoreSteps::ReleaseIdleLingering(Then then) {
  for (auto& [id, held] : s_->held_) {
    if (!held.lingering) continue;
    const std::string state_id = id;
    auto next = [this, then] { return ReleaseIdleLingering(then); };
    if (in_->now_ms >= held.linger_until_ms) return ReleaseLingeringLock(state_id, next);
    if (in_->now_ms >= held.waiters_checked_ms + s_->WaiterCheckEveryMs()) {
      held.waiters_checked_ms = in_->now_ms;
      return LookForWaiters(state_id, next,
                            [this, state_id, next] { return ReleaseLingeringLock(state_id, next); });
    }
  }
  return then();
}

// Tasks of one store run one at a time, so when one starts, a held lock
// still waiting for a renewal's answer belongs to a task that was
// abandoned (a host that lost interest): that answer will never come.
// Such a renewal counts as inconclusive, as a lost answer would: the lease
// stands as last confirmed, and the lock is renewed again when due.
void StoreSteps::SettleAbandonedRenewals() {
  for (auto& [id, held] : s_->held_) {
    if (!held.AbandonedRenewal()) continue;
    SqlResponse never;
    never.transport_ok = false;
    never.maybe_delivered = true;
    never.transport_error = "the renewal's task was abandoned before its answer came";
    held.machine->OnResponse(never, *in_);
    while (std::optional<LockAction> a = held.machine->Poll()) {
      if (a->kind == LockAction::Kind::kArmTimer) held.renew_at_ms = in_->now_ms + a->delay_ms;
    }
  }
}

// Renews, one after another, every held lock whose renewal is due; a lost
// one ends the task with kAborted naming it.
Step StoreSteps::RenewAllDue(Then then, OnFailure fail) {
  for (const auto& [id, held] : s_->held_) {
    if (held.Live() && in_->now_ms >= held.renew_at_ms) {
      return Renew(id, [this, then, fail] { return RenewAllDue(then, fail); }, fail, fail);
    }
  }
  return then();
}

std::unique_ptr<Task> Store::AcquireLock(std::string state_id) {
  if (absl::Status st = ValidateStateId(state_id); !st.ok()) return Invalid(st);
  return MakeTask(this, [this, state_id](StoreSteps& s) {
    const int64_t started_ms = s.inputs().now_ms;
    if (auto it = held_.find(state_id); it != held_.end() && !it->second.lingering && it->second.Live()) {
      // Waiting for a lock this store holds would wait for itself.
      return Step::Fail(absl::FailedPreconditionError(absl::StrCat(
          "this store already holds the lock on state id \"", PrintableId(state_id),
          "\": lock scopes on one id do not nest (writes inside the scope already run under it)")));
    }
    if (auto it = held_.find(state_id); it != held_.end() && it->second.lingering) {
      // Lingering since its last release and still within its lease (the
      // task's start forgot it otherwise): taken back, no request.
      it->second.lingering = false;
      Result r = s.Base();
      r.lock_id = it->second.machine->lock_id();
      r.waited_ms = 0;
      return Step::Done(std::move(r));
    }
    return s.Connected(
        [this, &s, state_id, started_ms] {
          return s.Acquire(
              state_id,
              [this, &s, state_id, started_ms](std::shared_ptr<LockMachine> m) {
                // The machine's renewal timer, armed as it became the holder.
                int64_t renew_in_ms = options_.lock.stale_ms / 3;
                while (std::optional<LockAction> a = m->Poll()) {
                  if (a->kind == LockAction::Kind::kArmTimer) renew_in_ms = a->delay_ms;
                }
                HeldLock held{m, s.inputs().now_ms + renew_in_ms};
                held.waiters_checked_ms = s.inputs().now_ms;
                held_[state_id] = held;
                Result r = s.Base();
                r.lock_id = m->lock_id();
                r.waited_ms = s.inputs().now_ms - started_ms;
                s.Tell(DiagnosticKind::kLockAcquired, r.waited_ms > 0 ? DiagnosticLevel::kInfo : DiagnosticLevel::kDebug,
                       state_id,
                       absl::StrCat("acquired the lock on \"", PrintableId(state_id), "\" after ", r.waited_ms, " ms"),
                       {{"waited_ms", r.waited_ms}}, {{"lock_id", m->lock_id()}});
                return Step::Done(std::move(r));
              },
              StoreSteps::Failed);
        },
        StoreSteps::Failed);
  });
}

std::unique_ptr<Task> Store::RenewLock(std::string state_id) {
  // What the store holds is looked at when the task starts, not when it is
  // built: a host may queue tasks (core/connection.h) and the ones before
  // this may take or release locks.
  return MakeTask(this, [this, state_id](StoreSteps& s) {
    auto it = held_.find(state_id);
    if (it == held_.end()) {
      return Step::Fail(absl::FailedPreconditionError(absl::StrCat(
          "cannot renew the lock on state id \"", PrintableId(state_id), "\": this store does not hold it")));
    }
    std::string lock_id = it->second.machine->lock_id();
    return s.Renew(
        state_id,
        [&s, lock_id] {
          Result r = s.Base();
          r.lock_id = lock_id;
          return Step::Done(std::move(r));
        },
        StoreSteps::Failed, StoreSteps::Failed);
  });
}

std::unique_ptr<Task> Store::Tick() {
  return MakeTask(this, [](StoreSteps& s) {
    return s.RenewAllDue([&s] { return s.ReleaseIdleLingering([&s] { return Step::Done(s.Base()); }); },
                         StoreSteps::Failed);
  });
}

std::unique_ptr<Task> Store::ReleaseLingering() {
  return MakeTask(this, [this](StoreSteps& s) {
    auto count = std::make_shared<int64_t>(0);
    // The loop holds itself weakly: only the step waiting on a request owns
    // it, so a task abandoned (or destroyed) mid-release frees it.
    auto next = std::make_shared<std::function<Step()>>();
    *next = [this, &s, count, weak = std::weak_ptr<std::function<Step()>>(next)]() -> Step {
      std::shared_ptr<std::function<Step()>> self = weak.lock();
      for (const auto& [id, held] : held_) {
        if (held.lingering) {
          ++*count;
          return s.ReleaseLingeringLock(id, [self] { return (*self)(); });
        }
      }
      Result r = s.Base();
      r.count = *count;
      return Step::Done(std::move(r));
    };
    return (*next)();
  });
}

std::unique_ptr<Task> Store::Close() {
  return MakeTask(this, [this](StoreSteps& s) {
    auto count = std::make_shared<int64_t>(0);
    // Held weakly by itself, as in ReleaseLingering.
    auto next = std::make_shared<std::function<Step()>>();
    *next = [this, &s, count, weak = std::weak_ptr<std::function<Step()>>(next)]() -> Step {
      std::shared_ptr<std::function<Step()>> self = weak.lock();
      for (auto it = held_.begin(); it != held_.end(); ++it) {
        const std::string id = it->first;
        if (!it->second.Live()) {
          held_.erase(it);  // lost: not ours to drop
          return (*self)();
        }
        ++*count;
        // Best effort: a failed release is forgotten; the lock then expires.
        return s.ReleaseAndForget(id, it->second.machine, [self] { return (*self)(); },
                                  [self](absl::Status) { return (*self)(); });
      }
      Result r = s.Base();
      r.count = *count;
      return Step::Done(std::move(r));
    };
    return (*next)();
  });
}

std::optional<int64_t> Store::NextTimeoutMs() const {
  std::optional<int64_t> next;
  for (const auto& [id, held] : held_) {
    // A renewal left waiting by an abandoned task is due at once (the next
    // task settles it; see SettleAbandonedRenewals).
    if (held.Live() || held.AbandonedRenewal()) {
      if (!next || held.renew_at_ms < *next) next = held.renew_at_ms;
    }
    if (held.lingering) {
      const int64_t at = std::min(held.linger_until_ms, held.waiters_checked_ms + WaiterCheckEveryMs());
      if (!next || at < *next) next = at;
    }
  }
  return next;
}

std::unique_ptr<Task> Store::ReleaseLock(std::string state_id, std::string lock_id) {
  if (absl::Status st = ValidateStateId(state_id); !st.ok()) return Invalid(st);
  // Looked up when the task starts (see RenewLock).
  return MakeTask(this, [this, state_id, lock_id](StoreSteps& s) {
    auto it = held_.find(state_id);
    if (it == held_.end() || it->second.machine->lock_id() != lock_id) {
      // Releasing needs the machine that acquired: only the holder can release.
      return Step::Fail(absl::FailedPreconditionError(
          absl::StrCat("cannot release the lock on state id \"", PrintableId(state_id),
                       "\": this store does not hold it with that lock id (only the process that acquired a lock "
                       "releases it)")));
    }
    std::shared_ptr<LockMachine> m = it->second.machine;
    if (m->state() != LockState::kHeld) {
      // Lost earlier (a renewal found another holder or the lease ran out):
      // it is not ours to drop, so forgetting it is the whole release; but
      // the scope it guarded was not exclusive, which its user must hear.
      held_.erase(it);
      return Step::Fail(absl::AbortedError(absl::StrCat(
          "the lock on state id \"", PrintableId(state_id), "\" was lost while held (its lease of ",
          options_.lock.stale_ms / 1000.0, " s, lock_timeout_seconds, could not be renewed in time, and another "
          "process may have taken it): what was done under it was not exclusive. Check the work, then run it "
          "again")));
    }
    if (it->second.lingering) return Step::Done(s.Base());  // released already; lingering
    auto release = [&s, state_id, m] {
      return s.ReleaseAndForget(state_id, m, [&s] { return Step::Done(s.Base()); }, StoreSteps::Failed);
    };
    if (!Lingers() || !m->LeaseValid(s.inputs().now_ms)) return release();
    const int64_t now = s.inputs().now_ms;
    auto linger = [this, &s, state_id, m](int64_t checked_ms) {
      auto held = held_.find(state_id);
      if (held != held_.end() && held->second.machine == m && m->state() == LockState::kHeld) {
        held->second.lingering = true;
        held->second.linger_until_ms = s.inputs().now_ms + kDefaultLockLingerMs;
        held->second.waiters_checked_ms = checked_ms;
      }
      return Step::Done(s.Base());
    };
    if (now - it->second.waiters_checked_ms < WaiterCheckEveryMs()) return linger(it->second.waiters_checked_ms);
    // Time to look whether another process waits: if one does, the lock is
    // released for real.
    return s.LookForWaiters(state_id, [linger, now] { return linger(now); }, release);
  });
}

}  // namespace chstate
