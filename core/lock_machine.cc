// The lock machines' common ground (lock_machine.h): the factory that picks
// the algorithm, the outputs, the lease, and the effects and judgements both
// machines' tables name (becoming the holder, renewing, backing off with a
// waiter row, and the outcomes' wording). Each algorithm's own table and
// effects are in table_lock.cc and claims_lock.cc.
#include "core/lock_machine.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/claims_lock.h"
#include "core/quoting.h"
#include "core/response.h"
#include "core/table_lock.h"

namespace chstate {

const char* LockStateName(LockState s) {
  switch (s) {
    case LockState::kIdle: return "idle";
    case LockState::kCreating: return "creating";
    case LockState::kCreatingSchema: return "creating-schema";
    case LockState::kInspecting: return "inspecting";
    case LockState::kAnnouncing: return "announcing";
    case LockState::kBackingOff: return "backing-off";
    case LockState::kEntombing: return "entombing";
    case LockState::kHeld: return "held";
    case LockState::kRenewing: return "renewing";
    case LockState::kConfirming: return "confirming";
    case LockState::kReleaseInspect: return "release-inspect";
    case LockState::kDropping: return "dropping";
    case LockState::kWithdrawing: return "withdrawing";
    case LockState::kReleased: return "released";
    case LockState::kFailed: return "failed";
    case LockState::kLost: return "lost";
  }
  return "?";
}

std::unique_ptr<LockMachine> MakeLockMachine(const Statements& statements, std::string state_id,
                                             LockOptions options, LockMachineOptions machine_options) {
  if (statements.cluster().enabled()) {
    return std::make_unique<ClaimsLock>(statements, std::move(state_id), options, machine_options);
  }
  return std::make_unique<TableLock>(statements, std::move(state_id), options, machine_options);
}

LockMachine::LockMachine(const Statements& statements, std::string state_id, LockOptions options,
                         LockMachineOptions machine_options)
    : st_(statements),
      state_id_(std::move(state_id)),
      options_(options),
      machine_options_(machine_options) {}

LockMachine::~LockMachine() = default;

bool LockMachine::Holding() const {
  const LockState s = state();
  return s == LockState::kHeld || s == LockState::kRenewing || s == LockState::kConfirming;
}

bool LockMachine::LeaseValid(int64_t now_ms) const { return Holding() && InLease(now_ms); }

int64_t LockMachine::MarginMs() const { return defects_.zero_margin ? 0 : LeaseMarginMs(options_); }

// ---- outputs ----

void LockMachine::Send(SqlRequest r) {
  if (out_.next != LockOutput::Next::kNone) two_steps_ = true;
  outstanding_ = r;
  out_.next = LockOutput::Next::kRunSql;
  out_.request = std::move(r);
  out_.wait_ms = 0;
}

void LockMachine::SendRenewal(SqlRequest r) {
  r.send_before_ms = lease_deadline_ms();
  Send(std::move(r));
}

void LockMachine::SendRelease(SqlRequest r) {
  r.send_before_ms = lease_deadline_ms();
  Send(std::move(r));
}

void LockMachine::ArmTimer(LockTimer timer, int64_t delay_ms) {
  if (out_.next != LockOutput::Next::kNone) two_steps_ = true;
  out_.next = LockOutput::Next::kWait;
  out_.wait_ms = delay_ms;
  out_.timer = timer;
}

void LockMachine::EmitFailed(absl::Status s) {
  out_.outcome = LockOutput::Outcome::kFailed;
  out_.status = std::move(s);
}

void LockMachine::EmitLost(absl::Status s) {
  lease_deadline_ms_ = 0;
  out_.outcome = LockOutput::Outcome::kLost;
  out_.status = std::move(s);
}

LockOutput LockMachine::TakeOutput() {
  LockOutput out = std::move(out_);
  out_ = LockOutput{};
  return out;
}

// ---- judgements ----

LockVerdict LockMachine::JudgeHolder(const LockInspection& insp, const Inputs& in) const {
  LockOptions judged = options_;
  if (!defects_.ignore_holder_window) judged.stale_ms = std::max(options_.stale_ms, insp.stale_s * 1000);
  // A table whose creation row is not visible is named by its creation
  // time, and only taken over after twice the window, long after any row
  // of a live CREATE would have become visible. (A claim always has a
  // holder.)
  if (insp.holder.empty()) judged.stale_ms *= 2;
  return DecideOnHeldLock(insp.age_s, in.now_ms, deadline_ms(), judged);
}

LockMachine::Renewal LockMachine::JudgeRenewal(bool ours, const Inputs& in) const {
  if (!ours && !defects_.renewal_accepts_any_holder) return Renewal::kTakenOver;
  // The lease ran out while the renewal was in flight: from then on a taker
  // may have judged the lock stale and acted (a renewal row that landed
  // late, beyond the margin, cannot undo that). Never revive it.
  if (!InLease(in.now_ms) && !defects_.revive_expired_lease) return Renewal::kTooLate;
  return Renewal::kConfirmed;
}

bool LockMachine::RenewalFailedInTime(const Inputs& in) const {
  // Not sent again past the lease (the task saw to it): another process may
  // hold the lock by now.
  return InLease(in.now_ms);
}

bool LockMachine::ReleaseFailedTooLate(const Inputs& in) const {
  // Landing after a takeover, a DROP would remove the new holder's lock.
  return in.now_ms >= lease_deadline_ms();
}

bool LockMachine::ShowsHolder() const {
  // Once per holder seen: a row each retry would only fill the table.
  return machine_options_.write_waiter_rows && !sighting_.live_holder.empty() &&
         sighting_.live_holder != announced_to_;
}

// ---- acquiring ----

void LockMachine::StartAcquiring(const SqlResponse*, const Inputs& in) {
  lock_id_ = MakeLockId(in.random);
  start_ms_ = in.now_ms;
  deadline_ms_ = in.now_ms + options_.timeout_ms;
}

void LockMachine::NoteRelease(const SqlResponse*, const Inputs&) { release_requested_ = true; }

void LockMachine::TakeUpRelease(const SqlResponse*, const Inputs&) { release_requested_ = false; }

void LockMachine::NoteUnresolvedCreate() {
  // Should it turn out ours, the lease counts from the earliest CREATE (or
  // claim) that may have landed: the server stamped it no earlier than it
  // was sent.
  if (!create_unresolved_) earliest_unresolved_create_ms_ = create_sent_at_ms_;
  create_unresolved_ = true;
}

void LockMachine::CountNoAnswer(const SqlResponse* r, const Inputs&) { no_answer_.Count(*r); }

void LockMachine::SendWaiterRow() {
  // Shown to the holder, which gives up a lingering lock for it
  // (linger_locks); an error (the table gone meanwhile) is harmless.
  waiter_for_ = sighting_.live_holder;
  Send(st_.AnnounceLockWaiter(state_id_, lock_id_, waiter_for_));
}

void LockMachine::Shown(const SqlResponse*, const Inputs&) {
  announced_to_ = waiter_for_;
  ArmTimer(LockTimer::kBackOff, back_off_ms_);
}

void LockMachine::NotShown(const SqlResponse*, const Inputs&) { ArmTimer(LockTimer::kBackOff, back_off_ms_); }

// ---- holding ----

void LockMachine::BecomeHolder(const SqlResponse*, const Inputs& in) { HoldFrom(create_sent_at_ms_, in); }

void LockMachine::BecomeHolderFromRead(const SqlResponse*, const Inputs& in) {
  // A CREATE (claim) of ours landed, though its answer may have been lost.
  HoldFrom(create_unresolved_ ? earliest_unresolved_create_ms_ : create_sent_at_ms_, in);
}

void LockMachine::HoldFrom(int64_t sent_at_ms, const Inputs& in) {
  create_unresolved_ = false;
  acquired_at_ms_ = in.now_ms;
  lease_deadline_ms_ = sent_at_ms + options_.stale_ms - MarginMs();
  out_.outcome = LockOutput::Outcome::kAcquired;
  out_.wait_ms = options_.stale_ms / 3;  // the first renewal, if it settles as the holder (ArmRenewal)
}

void LockMachine::ExtendLease(const SqlResponse*, const Inputs&) {
  // Only a renewal row known to have landed extends the lease: one whose
  // answer was lost might never have arrived (KeepLease).
  lease_deadline_ms_ = std::max(lease_deadline_ms_, renew_sent_at_ms_ + options_.stale_ms - MarginMs());
  out_.wait_ms = options_.stale_ms / 3;  // the next renewal (ArmRenewal)
}

void LockMachine::KeepLease(const SqlResponse*, const Inputs&) {
  // The lease stands as it was; try again soon.
  out_.wait_ms = std::min(options_.retry_ms, options_.stale_ms / 10);  // (ArmRenewal)
}

// Settled as the holder: the renewal's wait the effect before it chose
// (HoldFrom, ExtendLease or KeepLease, in the same input).
void LockMachine::ArmRenewal(const SqlResponse*, const Inputs&) { ArmTimer(LockTimer::kRenewal, out_.wait_ms); }

void LockMachine::Released(const SqlResponse*, const Inputs&) {
  lease_deadline_ms_ = 0;
  out_.outcome = LockOutput::Outcome::kReleased;
}

// ---- outcomes ----

void LockMachine::FailWithoutRandom(const SqlResponse*, const Inputs&) {
  EmitFailed(absl::InvalidArgumentError("the host passed fewer than 16 random bytes for a lock id"));
}

void LockMachine::Cancel(const SqlResponse*, const Inputs&) {
  EmitFailed(absl::CancelledError(absl::StrCat("gave up waiting for the lock on state id \"", PrintableId(state_id_),
                                               "\": released before it was acquired")));
}

void LockMachine::FailWithAnswer(const SqlResponse* r, const Inputs&) {
  EmitFailed(AnswerError(r, "taking the lock"));
}

void LockMachine::FailGarbled(const SqlResponse*, const Inputs&) { EmitFailed(sighting_.garbled); }

void LockMachine::FailTimeUp(const SqlResponse*, const Inputs& in) {
  EmitFailed(absl::AbortedError(absl::StrCat("state id \"", PrintableId(state_id_),
                                             "\" is locked by another process; gave up after ",
                                             (in.now_ms - start_ms_) / 1000.0,
                                             " s. Retry later or raise the lock timeout")));
}

void LockMachine::FailUnreachable(const SqlResponse*, const Inputs&) {
  EmitFailed(no_answer_.GaveUp(create_unresolved_
                                   ? absl::StrCat("; if a CREATE of ours landed unseen, that lock expires after ",
                                                  options_.stale_ms / 1000, " s")
                                   : std::string()));
}

void LockMachine::CountThenFailUnreachable(const SqlResponse* r, const Inputs& in) {
  CountNoAnswer(r, in);
  FailUnreachable(r, in);
}

void LockMachine::LoseExpired(const SqlResponse*, const Inputs&) {
  EmitLost(absl::AbortedError(absl::StrCat("the lock on state id \"", PrintableId(state_id_),
                                           "\" expired: it could not be renewed within the stale window")));
}

void LockMachine::LoseTakenOver(const SqlResponse*, const Inputs&) {
  EmitLost(absl::AbortedError(absl::StrCat("the lock on state id \"", PrintableId(state_id_),
                                           "\" was taken over by another process while held")));
}

void LockMachine::LoseConfirmedTooLate(const SqlResponse*, const Inputs&) {
  EmitLost(absl::AbortedError(absl::StrCat("the lock on state id \"", PrintableId(state_id_),
                                           "\" ran out while its renewal was in flight")));
}

void LockMachine::LoseHeldPastLease(const SqlResponse*, const Inputs&) {
  // Past the lease another process may hold the lock: dropping could remove
  // theirs. Ours is left to expire.
  EmitLost(absl::AbortedError(absl::StrCat("the lock on state id \"", PrintableId(state_id_),
                                           "\" was held past its lease; it was left to expire instead of being "
                                           "dropped. Keep holds shorter than the stale window or let renewals run")));
}

void LockMachine::LoseTable(const SqlResponse*, const Inputs&) {
  EmitLost(absl::AbortedError(absl::StrCat("the lock on state id \"", PrintableId(state_id_),
                                           "\" is gone: it was taken over as stale while held")));
}

void LockMachine::LoseRanOutRenewing(const SqlResponse* r, const Inputs&) {
  // Not sent again past the lease (the task saw to it): another process may
  // hold the lock by now.
  EmitLost(LeaseRanOut(state_id_, "its renewal", WaitedOut(r, "renewing the lock"), /*releasing=*/false));
}

void LockMachine::LoseReleaseFailed(const SqlResponse* r, const Inputs&) {
  EmitLost(ReleaseFailed(r, state_id_, options_));
}

}  // namespace chstate
