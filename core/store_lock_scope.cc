// A lock scope, as the store's operations: acquire (AcquireLock) keeps an
// id's lock in the store until release (ReleaseLock), renew (RenewLock)
// renews it now, Tick runs the held locks' timers (renewal, lingering, the
// look for waiters), and Close releases everything. Built from the lock
// registry's parts (core/store_lock_registry.cc).
#include "core/store.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/lock_machine.h"
#include "core/quoting.h"
#include "core/response.h"
#include "core/store_steps.h"

namespace chstate {

namespace {

// acquire: the id's lock, kept by the store until ReleaseLock (a lock
// scope). A lock lingering since its last release (and within its lease:
// the task's start forgot it otherwise) is taken back with no request.
struct AcquireLockSteps {
  StoreSteps& s;
  std::string id;
  int64_t started_ms = 0;
  int64_t renew_in_ms = 0;
  StoreSteps::LockPtr m;
  bool waited = false;  // for another process
  Next Start(const Reply&) {
    started_ms = s.inputs().now_ms;
    auto it = s.held().find(id);
    if (it != s.held().end() && !it->second.lingering && it->second.Live()) {
      // Waiting for a lock this store holds would wait for itself.
      return Next::Fail(absl::FailedPreconditionError(absl::StrCat(
          "this store already holds the lock on state id \"", PrintableId(id),
          "\": lock scopes on one id do not nest (writes inside the scope already run under it)")));
    }
    if (it != s.held().end() && it->second.lingering) {
      it->second.lingering = false;
      s.ClearTimer(TimerKind::kLinger, id);
      Result r = s.Base();
      r.lock_id = it->second.machine->lock_id();
      r.waited_ms = 0;
      return Next::Done(std::move(r));
    }
    return Next::Call(part::Connect(s));
  }
  Next Acquire(const Reply&) { return Next::Call(part::Acquire(s, id, &m, &waited, &renew_in_ms)); }
  Next Hold(const Reply&) {
    const Inputs& in = s.inputs();
    // The machine's renewal timer, armed as it became the holder.
    s.Hold(id, m, in.now_ms + renew_in_ms);
    Result r = s.Base();
    r.lock_id = m->lock_id();
    r.waited_ms = in.now_ms - started_ms;
    s.TellAcquired(*m, r.waited_ms, waited);
    return Next::Done(std::move(r));
  }
  std::string Where(size_t) const { return absl::StrCat("acquire \"", PrintableId(id), "\""); }
};

// renew: the lease of a lock this store holds, now. What the store holds is
// looked at when the task starts, not when it is built: a host may queue
// tasks (core/connection.h) and the ones before this may take or release
// locks.
struct RenewLockSteps {
  StoreSteps& s;
  std::string id;
  std::string lock_id;
  bool lost = false;
  Next Renew(const Reply&) {
    auto it = s.held().find(id);
    if (it == s.held().end()) {
      return Next::Fail(absl::FailedPreconditionError(
          absl::StrCat("cannot renew the lock on state id \"", PrintableId(id), "\": this store does not hold it")));
    }
    lock_id = it->second.machine->lock_id();
    return Next::Call(part::Renew(s, id, &lost));
  }
  Next Done(const Reply&) {
    Result out = s.Base();
    out.lock_id = lock_id;
    return Next::Done(std::move(out));
  }
  std::string Where(size_t) const { return absl::StrCat("renew \"", PrintableId(id), "\""); }
};

// The store's timers while no operation runs: renewals that are due, then
// lingering locks that idled out or that another process waits for.
struct TickSteps {
  StoreSteps& s;
  Next Renew(const Reply&) { return Next::Call(part::RenewAllDue(s)); }
  Next Release(const Reply&) { return Next::Call(part::ReleaseIdleLingering(s)); }
  Next Done(const Reply&) { return Next::Done(s.Base()); }
  std::string Where(size_t) const { return "tick"; }
};

// Releases for real every lingering lock (ReleaseLingering), or every lock
// this store holds or keeps lingering (Close: best effort, a failed release
// is forgotten and the lock expires; a lost lock is not ours to drop).
class ReleaseAllOp final : public StorePart {
 public:
  ReleaseAllOp(StoreSteps& s, bool all) : StorePart(s), all_(all) {}
  std::string Where() const override { return all_ ? "close" : "releasing lingering locks"; }

  Next Resume(const Reply&) override {
    auto& held = s_.held();
    for (auto it = held.begin(); it != held.end();) {
      if (!all_) {
        if (!it->second.lingering) {
          ++it;
          continue;
        }
        ++count_;
        return Next::Call(part::ReleaseLingeringLock(s_, it->first));
      }
      if (!it->second.Live()) {
        it = s_.ForgetHeld(it);
        continue;
      }
      ++count_;
      return Next::Try(part::ReleaseAndForget(s_, it->first, it->second.machine));
    }
    Result r = s_.Base();
    r.count = count_;
    return Next::Done(std::move(r));
  }

 private:
  bool all_;
  int64_t count_ = 0;
};

// release: the lock of a scope. With linger_locks (and its lease valid) it
// is kept lingering for the next acquisition, unless it is time to look for
// waiting processes and one waits: then it is released for real.
class ReleaseLockOp final : public StorePart {
 public:
  ReleaseLockOp(StoreSteps& s, std::string id, std::string lock_id)
      : StorePart(s), id_(std::move(id)), lock_id_(std::move(lock_id)) {}
  std::string Where() const override { return absl::StrCat("release \"", PrintableId(id_), "\""); }

  Next Resume(const Reply& r) override {
    switch (stage_) {
      case Stage::kStart:
        return Start();
      case Stage::kLooking:
        if (waiter_) return Release();
        return Linger(looked_at_ms_ + s_.WaiterCheckEveryMs());
      case Stage::kReleasing:
        return Next::Done(s_.Base());
    }
    return Next::Fail(absl::InternalError("release: no such stage"));
  }

 private:
  Next Start() {
    auto it = s_.held().find(id_);
    if (it == s_.held().end() || it->second.machine->lock_id() != lock_id_) {
      // Releasing needs the machine that acquired: only the holder can release.
      return Next::Fail(absl::FailedPreconditionError(
          absl::StrCat("cannot release the lock on state id \"", PrintableId(id_),
                       "\": this store does not hold it with that lock id (only the process that acquired a lock "
                       "releases it)")));
    }
    m_ = it->second.machine;
    if (m_->state() != LockState::kHeld) {
      // Lost earlier (a renewal found another holder or the lease ran out):
      // it is not ours to drop, so forgetting it is the whole release; but
      // the scope it guarded was not exclusive, which its user must hear.
      s_.ForgetHeld(it);
      return Next::Fail(absl::AbortedError(absl::StrCat(
          "the lock on state id \"", PrintableId(id_), "\" was lost while held (its lease of ",
          s_.options().lock.stale_ms / 1000.0, " s, lock_timeout_seconds, could not be renewed in time, and another "
          "process may have taken it): what was done under it was not exclusive. Check the work, then run it "
          "again")));
    }
    if (it->second.lingering) return Next::Done(s_.Base());  // released already; lingering
    const int64_t now = s_.inputs().now_ms;
    if (!s_.Lingers() || !m_->LeaseValid(now)) return Release();
    if (now < s_.TimerAt(TimerKind::kWaiterLook, id_)) return Linger(s_.TimerAt(TimerKind::kWaiterLook, id_));
    // Time to look whether another process waits: if one does, the lock is
    // released for real.
    looked_at_ms_ = now;
    stage_ = Stage::kLooking;
    return Next::Call(part::LookForWaiters(s_, id_, &waiter_));
  }
  Next Release() {
    stage_ = Stage::kReleasing;
    return Next::Call(part::ReleaseAndForget(s_, id_, m_));
  }
  // `next_look_ms`: when the next look for waiters is due.
  Next Linger(int64_t next_look_ms) {
    auto held = s_.held().find(id_);
    if (held != s_.held().end() && held->second.machine == m_ && m_->state() == LockState::kHeld) {
      held->second.lingering = true;
      s_.SetTimer(TimerKind::kLinger, id_, s_.inputs().now_ms + kDefaultLockLingerMs);
      s_.SetTimer(TimerKind::kWaiterLook, id_, next_look_ms);
    }
    return Next::Done(s_.Base());
  }

  enum class Stage { kStart, kLooking, kReleasing };
  Stage stage_ = Stage::kStart;
  std::string id_;
  std::string lock_id_;
  StoreSteps::LockPtr m_;
  int64_t looked_at_ms_ = 0;
  bool waiter_ = false;
};

}  // namespace

std::unique_ptr<Task> Store::AcquireLock(std::string state_id) {
  if (absl::Status st = ValidateStateId(state_id); !st.ok()) return Invalid(st);
  return MakeOpTask(this, [&](StoreSteps& s) {
    using A = AcquireLockSteps;
    return Steps<A>({&A::Start, &A::Acquire, &A::Hold}, s, state_id);
  });
}

std::unique_ptr<Task> Store::RenewLock(std::string state_id) {
  return MakeOpTask(this, [&](StoreSteps& s) {
    return Steps<RenewLockSteps>({&RenewLockSteps::Renew, &RenewLockSteps::Done}, s, state_id);
  });
}

std::unique_ptr<Task> Store::Tick() {
  return MakeOpTask(this, [&](StoreSteps& s) {
    return Steps<TickSteps>({&TickSteps::Renew, &TickSteps::Release, &TickSteps::Done}, s);
  });
}

std::unique_ptr<Task> Store::ReleaseLingering() {
  return MakeOpTask(this, [&](StoreSteps& s) { return std::make_unique<ReleaseAllOp>(s, /*all=*/false); });
}

std::unique_ptr<Task> Store::Close() {
  return MakeOpTask(this, [&](StoreSteps& s) { return std::make_unique<ReleaseAllOp>(s, /*all=*/true); });
}

std::optional<int64_t> Store::NextTimeoutMs() const {
  std::optional<int64_t> next;
  for (const auto& [id, held] : held_) {
    // A renewal left waiting by an abandoned task is due at once (the next
    // task settles it; see SettleAbandonedRenewals).
    if (held.Live() || held.AbandonedRenewal()) {
      const int64_t at = TimerAt(TimerKind::kRenewal, id);
      if (!next || at < *next) next = at;
    }
    if (held.lingering) {
      const int64_t at = std::min(TimerAt(TimerKind::kLinger, id), TimerAt(TimerKind::kWaiterLook, id));
      if (!next || at < *next) next = at;
    }
  }
  return next;
}

std::unique_ptr<Task> Store::ReleaseLock(std::string state_id, std::string lock_id) {
  if (absl::Status st = ValidateStateId(state_id); !st.ok()) return Invalid(st);
  // Looked up when the task starts (see RenewLock).
  return MakeOpTask(this, [&](StoreSteps& s) {
    return std::make_unique<ReleaseLockOp>(s, state_id, lock_id);
  });
}

}  // namespace chstate
