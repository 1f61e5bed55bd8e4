// The lock registry: the locks a store holds between operations (a lock
// scope's, core/store_lock_scope.cc, and a lingering one, linger_locks),
// their lease checks, and the parts that keep them: renewal, release,
// lingering and its end, the look for waiters and yielding to one. Each
// part is an Op (core/op.h).
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

absl::Status StoreSteps::LostLock(const std::string& id) {
  return absl::AbortedError(
      absl::StrCat("the lock on state id \"", PrintableId(id), "\" was lost: stop acting under it and release it"));
}

void StoreSteps::ForgetStaleLingering() {
  for (auto it = s_->held_.begin(); it != s_->held_.end();) {
    if (it->second.lingering && (!it->second.Live() || !it->second.machine->LeaseValid(in_->now_ms))) {
      it = s_->ForgetHeld(it);
    } else {
      ++it;
    }
  }
}

void StoreSteps::SettleAbandonedRenewals() {
  for (auto& [id, held] : s_->held_) {
    if (!held.AbandonedRenewal()) continue;
    SqlResponse never;
    never.transport_ok = false;
    never.maybe_delivered = true;
    never.transport_error = "the renewal's task was abandoned before its answer came";
    LockOutput o = held.machine->OnResponse(never, *in_);
    if (o.renewed()) s_->timers_.Set(TimerKind::kRenewal, id, in_->now_ms + o.wait_ms);
  }
}

namespace part {
namespace {

// Renews the lock this store holds on `id` now. Fails with the reason when
// it is not renewed; *lost says whether that is because the lock turned out
// not ours any more (or not held at all). With python_locks the marker is
// renewed first, MarkerAheadS ahead of the server's clock, and the lock only
// after it was confirmed: so no lease outlasts the marker that keeps the
// Python backend out (docs/lock.md). A marker that failed leaves the lease
// as it was and tries again after the retry wait.
struct RenewSteps {
  StoreSteps& s;
  std::string id;
  bool* lost;
  bool marker;  // python_locks: the marker is renewed first
  StoreSteps::LockPtr m;
  LockOutput outcome;
  Next FailLost(absl::Status why) {
    *lost = true;
    return Next::Fail(std::move(why));
  }
  Next Check(const Reply&) {
    *lost = false;
    auto it = s.held().find(id);
    if (it == s.held().end() || it->second.machine->state() != LockState::kHeld) return FailLost(StoreSteps::LostLock(id));
    m = it->second.machine;
    if (!marker) return Next::GoOn();
    return Next::Try(s.SqlPart(s.st().InsertLockMarker(id, m->lock_id(), MarkerAheadS(s.options())),
                               "renewing the lock marker"));
  }
  Next Renew(const Reply& r) {
    if (!r.status.ok()) {
      auto it = s.held().find(id);
      if (it != s.held().end() && it->second.machine == m) {
        s.SetTimer(TimerKind::kRenewal, id, s.inputs().now_ms + s.options().lock.retry_ms);
      }
      return Next::Done();  // the lease stays as the last marker allows
    }
    return Next::Call(part::DriveLock(s, m, part::LockStart::kTimer, &outcome));
  }
  Next Renewed(const Reply&) {
    const Inputs& in = s.inputs();
    if (outcome.renewed()) {
      // Confirmed (or inconclusive, to be tried again soon): the machine
      // names when the next renewal is due.
      auto it = s.held().find(id);
      if (it != s.held().end() && it->second.machine == m) s.SetTimer(TimerKind::kRenewal, id, in.now_ms + outcome.wait_ms);
      s.Tell(DiagnosticKind::kLeaseRenewed, DiagnosticLevel::kDebug, id,
             absl::StrCat("the lock on \"", PrintableId(id), "\" was renewed; its lease runs ",
                          m->lease_deadline_ms() - in.now_ms, " ms more, next renewal in ", outcome.wait_ms, " ms"),
             {{"lease_left_ms", m->lease_deadline_ms() - in.now_ms}, {"next_renewal_ms", outcome.wait_ms}});
      return Next::Done();
    }
    if (m->state() == LockState::kLost) {
      absl::Status why = outcome.status.ok() ? StoreSteps::LostLock(id) : outcome.status;
      s.Tell(DiagnosticKind::kLeaseLost, DiagnosticLevel::kWarning, id, std::string(why.message()));
      return FailLost(std::move(why));
    }
    return Next::Fail(outcome.status);
  }
  std::string Where(size_t step) const {
    if (marker && step == 0) return "renewing the lock marker";
    return absl::StrCat("renewing the lock on \"", PrintableId(id), "\"");
  }
};
std::unique_ptr<Op> RenewOp(StoreSteps& s, std::string id, bool* lost) {
  using R = RenewSteps;
  return Steps<R>({&R::Check, &R::Renew, &R::Renewed}, s, std::move(id), lost, s.options().python_locks);
}

// Renews the lock this store holds on `id` when its renewal is due. A lock
// found lost stays known (writes to the id are refused by LeaseCheck until
// it is released), and the operation goes on: reading is harmless.
class RenewIfDueOp final : public StorePart {
 public:
  RenewIfDueOp(StoreSteps& s, std::string id) : StorePart(s), id_(std::move(id)) {}
  std::string Where() const override { return absl::StrCat("renewing the held lock on \"", PrintableId(id_), "\""); }

  Next Resume(const Reply& r) override {
    if (r.kind == Reply::Kind::kStart) {
      auto it = s_.held().find(id_);
      if (it == s_.held().end() || !it->second.Live() || s_.inputs().now_ms < s_.TimerAt(TimerKind::kRenewal, id_)) {
        return Next::Done();
      }
      return Next::Try(RenewOp(s_, id_, &lost_));
    }
    if (r.status.ok() || lost_) return Next::Done();
    return Next::Fail(r.status);
  }

 private:
  std::string id_;
  bool lost_ = false;
};

// Renews the lock on `id` now (the store's held lock on it, or the one this
// task took), so that a write under it can wait longer than the lease left
// (QuorumWrite). Done once the renewal is confirmed or inconclusive (the
// caller checks the lease again); fails when the lock is not held or was
// found lost.
struct RenewForWaitSteps {
  StoreSteps& s;
  std::string id;
  bool held = false;  // the store's held lock, renewed by RenewOp
  bool lost = false;
  StoreSteps::LockPtr m;
  LockOutput outcome;
  Next Renew(const Reply&) {
    held = s.held().count(id) != 0;
    if (held) return Next::Call(RenewOp(s, id, &lost));
    m = s.current_lock();
    if (!m || m->state_id() != id || m->state() != LockState::kHeld) return Next::Fail(StoreSteps::LostLock(id));
    return Next::Call(part::DriveLock(s, m, part::LockStart::kTimer, &outcome));
  }
  Next Done(const Reply&) {
    if (held || (outcome.renewed() && m->state() == LockState::kHeld)) return Next::Done();
    return Next::Fail(outcome.status.ok() ? StoreSteps::LostLock(id) : outcome.status);
  }
  std::string Where(size_t) const { return absl::StrCat("renewing the lock on \"", PrintableId(id), "\" to wait"); }
};
std::unique_ptr<Op> RenewForWaitOp(StoreSteps& s, std::string id) {
  using R = RenewForWaitSteps;
  return Steps<R>({&R::Renew, &R::Done}, s, std::move(id));
}

// Releases the held lock `m` on `id` (inspection and DROP) and then forgets
// it, whether the release went well or not. It stays known until the
// release ends (its machine, no longer holding, is neither renewed nor
// valid for writes meanwhile), so that its lease deadline stays visible
// (LeaseDeadlineMs) while the DROP is decided.
class ReleaseAndForgetOp final : public StorePart {
 public:
  ReleaseAndForgetOp(StoreSteps& s, std::string id, StoreSteps::LockPtr m)
      : StorePart(s), id_(std::move(id)), m_(std::move(m)) {}
  std::string Where() const override { return absl::StrCat("releasing the lock on \"", PrintableId(id_), "\""); }

  Next Resume(const Reply& r) override {
    if (r.kind == Reply::Kind::kStart) return Next::Try(part::Release(s_, m_));
    auto held = s_.held().find(id_);
    if (held != s_.held().end() && held->second.machine == m_) s_.ForgetHeld(held);
    return r.status.ok() ? Next::Done() : Next::Fail(r.status);
  }

 private:
  std::string id_;
  StoreSteps::LockPtr m_;
};

// Releases for real the lingering lock on `id`; done either way (a failed
// release leaves it to expire).
class ReleaseLingeringLockOp final : public StorePart {
 public:
  ReleaseLingeringLockOp(StoreSteps& s, std::string id) : StorePart(s), id_(std::move(id)) {}
  std::string Where() const override {
    return absl::StrCat("releasing the lingering lock on \"", PrintableId(id_), "\"");
  }

  Next Resume(const Reply& r) override {
    if (r.kind != Reply::Kind::kStart) return Next::Done();
    auto it = s_.held().find(id_);
    if (it == s_.held().end() || !it->second.lingering) return Next::Done();
    return Next::Try(std::make_unique<ReleaseAndForgetOp>(s_, id_, it->second.machine));
  }

 private:
  std::string id_;
};

// linger_locks: looks for processes waiting for the lock on `id`. When there
// is one (or the look fails), this store stays away from the id until that
// process's next attempt (Acquire waits) and *waiter is set (the caller
// releases the lock for real).
class LookForWaitersOp final : public StorePart {
 public:
  LookForWaitersOp(StoreSteps& s, std::string id, bool* waiter) : StorePart(s), id_(std::move(id)), waiter_(waiter) {}
  std::string Where() const override {
    return absl::StrCat("looking for processes waiting for the lock on \"", PrintableId(id_), "\"");
  }

  Next Resume(const Reply& r) override {
    if (r.kind == Reply::Kind::kStart) {
      *waiter_ = false;
      auto held = s_.held().find(id_);
      const std::string holder = held == s_.held().end() ? std::string() : held->second.machine->lock_id();
      return Next::Send(s_.st().LockWaiters(id_, holder));
    }
    absl::StatusOr<Rows> rows = s_.AnswerRows(r, "looking for processes waiting for the lock", 2);
    if (rows.ok() && rows->empty()) return Next::Done();
    const int64_t away_ms = s_.options().lock.retry_ms + kDefaultLockYieldMarginMs;
    s_.away_until_ms()[id_] = s_.inputs().now_ms + away_ms;
    s_.Tell(DiagnosticKind::kLockYielded, DiagnosticLevel::kInfo, id_,
            absl::StrCat("the lingering lock on \"", PrintableId(id_),
                         "\" is released for a process waiting for it; this process stays away for ", away_ms, " ms"),
            {{"away_ms", away_ms}});
    *waiter_ = true;
    return Next::Done();
  }

 private:
  std::string id_;
  bool* waiter_;
};

// Tick's part for linger_locks: lingering locks idle past their time go,
// and so do those another process now waits for (looked for every
// WaiterCheckEveryMs while they linger). Each pass looks at the held locks
// afresh, since a release changes them.
class ReleaseIdleLingeringOp final : public StorePart {
 public:
  explicit ReleaseIdleLingeringOp(StoreSteps& s) : StorePart(s) {}
  std::string Where() const override { return "releasing idle lingering locks"; }

  Next Resume(const Reply& r) override {
    if (stage_ == Stage::kLooked && waiter_) {
      stage_ = Stage::kScan;
      return Next::Call(std::make_unique<ReleaseLingeringLockOp>(s_, looked_at_));
    }
    const int64_t now = s_.inputs().now_ms;
    for (auto& [id, held] : s_.held()) {
      if (!held.lingering) continue;
      if (now >= s_.TimerAt(TimerKind::kLinger, id)) {
        stage_ = Stage::kScan;
        return Next::Call(std::make_unique<ReleaseLingeringLockOp>(s_, id));
      }
      if (now >= s_.TimerAt(TimerKind::kWaiterLook, id)) {
        s_.SetTimer(TimerKind::kWaiterLook, id, now + s_.WaiterCheckEveryMs());
        looked_at_ = id;
        stage_ = Stage::kLooked;
        return Next::Call(std::make_unique<LookForWaitersOp>(s_, id, &waiter_));
      }
    }
    return Next::Done();
  }

 private:
  enum class Stage { kScan, kLooked };
  Stage stage_ = Stage::kScan;
  std::string looked_at_;
  bool waiter_ = false;
};

// Renews, one after another, every held lock whose renewal is due; a lost
// one fails the part with kAborted naming it.
class RenewAllDueOp final : public StorePart {
 public:
  explicit RenewAllDueOp(StoreSteps& s) : StorePart(s) {}
  std::string Where() const override { return "renewing held locks"; }

  Next Resume(const Reply&) override {
    for (const auto& [id, held] : s_.held()) {
      if (held.Live() && s_.inputs().now_ms >= s_.TimerAt(TimerKind::kRenewal, id)) {
        return Next::Call(RenewOp(s_, id, &lost_));
      }
    }
    return Next::Done();
  }

 private:
  bool lost_ = false;
};

}  // namespace

std::unique_ptr<Op> Renew(StoreSteps& s, std::string id, bool* lost) {
  return RenewOp(s, std::move(id), lost);
}
std::unique_ptr<Op> RenewAllDue(StoreSteps& s) { return std::make_unique<RenewAllDueOp>(s); }
std::unique_ptr<Op> ReleaseIdleLingering(StoreSteps& s) { return std::make_unique<ReleaseIdleLingeringOp>(s); }
std::unique_ptr<Op> ReleaseLingeringLock(StoreSteps& s, std::string id) {
  return std::make_unique<ReleaseLingeringLockOp>(s, std::move(id));
}
std::unique_ptr<Op> ReleaseAndForget(StoreSteps& s, std::string id, StoreSteps::LockPtr m) {
  return std::make_unique<ReleaseAndForgetOp>(s, std::move(id), std::move(m));
}
std::unique_ptr<Op> LookForWaiters(StoreSteps& s, std::string id, bool* waiter) {
  return std::make_unique<LookForWaitersOp>(s, std::move(id), waiter);
}

}  // namespace part

std::unique_ptr<Op> StoreSteps::RenewIfDuePart(const std::string& id) {
  return std::make_unique<part::RenewIfDueOp>(*this, id);
}

std::unique_ptr<Op> StoreSteps::RenewForWaitPart(const std::string& id) {
  return part::RenewForWaitOp(*this, id);
}

}  // namespace chstate
