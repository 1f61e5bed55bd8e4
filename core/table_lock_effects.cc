// The table lock's own effects: what its rows (table_lock.cc) send, arm and
// report. An effect never picks the next state (its row did) and never
// decides anything: it does the one thing its name says. The effects both
// machines share are in lock_machine.cc.
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "core/quoting.h"
#include "core/table_lock.h"

namespace chstate {

// ---- acquiring ----

void TableLock::SendCreate(const SqlResponse*, const Inputs& in) {
  create_sent_at_ms_ = in.now_ms;
  Send(st_.CreateLock(state_id_, lock_id_, StaleSeconds()));
}

void TableLock::MakeSchema(const SqlResponse*, const Inputs&) {
  schema_made_ = true;
  Send(st_.CreateDatabase());
}

void TableLock::SendInspect(const SqlResponse*, const Inputs&) { Send(st_.InspectLock(state_id_)); }

void TableLock::InspectUncertainCreate(const SqlResponse* r, const Inputs& in) {
  NoteUnresolvedCreate();
  CountNoAnswer(r, in);
  SendInspect(r, in);
}

void TableLock::FailUnreachableCreate(const SqlResponse* r, const Inputs& in) {
  NoteUnresolvedCreate();
  CountThenFailUnreachable(r, in);
}

void TableLock::QuickRetry(const SqlResponse* r, const Inputs& in) {
  SettleNoCreate(r, in);
  ++quick_retries_;
}

void TableLock::SettleNoCreate(const SqlResponse*, const Inputs&) {
  // No lock, or a known other holder: no CREATE of ours is left to land.
  create_unresolved_ = false;
}

void TableLock::Entomb(const SqlResponse*, const Inputs&) {
  // Named after the holder's random id, unique to this lock instance (or,
  // with no visible creation row, after the table's creation time).
  Send(st_.EntombLock(state_id_, LockInstance(sighting_.inspection)));
}

void TableLock::EntombHolder(const SqlResponse* r, const Inputs& in) {
  SettleNoCreate(r, in);
  Entomb(r, in);
}

void TableLock::FailLocked(const SqlResponse*, const Inputs& in) {
  EmitFailed(absl::AbortedError(absl::StrCat(
      "state id \"", PrintableId(state_id_), "\" is locked by another process (its lock was last renewed ",
      sighting_.inspection.age_s, " s ago); gave up after ", (in.now_ms - start_ms_) / 1000.0,
      " s. Retry later or raise the lock timeout; a dead holder's lock is taken over after ",
      options_.stale_ms / 1000, " s")));
}

int64_t TableLock::BackOffMs(const Inputs& in) const { return std::min(options_.retry_ms, deadline_ms() - in.now_ms); }

void TableLock::WaitThenRetry(const SqlResponse*, const Inputs& in) {
  quick_retries_ = 0;
  ArmTimer(LockTimer::kBackOff, BackOffMs(in));
}

void TableLock::ShowHolder(const SqlResponse*, const Inputs& in) {
  quick_retries_ = 0;
  back_off_ms_ = BackOffMs(in);
  SendWaiterRow();
}

// ---- holding ----

void TableLock::Renew(const SqlResponse*, const Inputs& in) {
  renew_sent_at_ms_ = in.now_ms;
  SendRenewal(st_.RenewLock(state_id_, lock_id_, StaleSeconds()));
}

// ---- releasing ----

void TableLock::Drop(const SqlResponse*, const Inputs&) { SendRelease(st_.DropLock(state_id_)); }

void TableLock::RetryReleaseInspect(const SqlResponse* r, const Inputs& in) {
  ++release_retries_;
  SendInspect(r, in);
}

void TableLock::LookBeforeDropAgain(const SqlResponse* r, const Inputs& in) {
  ++release_retries_;
  drop_uncertain_ = true;
  SendInspect(r, in);
}

void TableLock::LoseNotOurs(const SqlResponse*, const Inputs&) {
  EmitLost(absl::AbortedError(absl::StrCat("the lock on state id \"", PrintableId(state_id_),
                                           "\" was no longer ours at release: it was taken over while held")));
}

void TableLock::LoseRanPastLeaseInRelease(const SqlResponse*, const Inputs&) {
  EmitLost(absl::AbortedError(absl::StrCat("the lock on state id \"", PrintableId(state_id_),
                                           "\" ran past its lease during release; it was left to expire instead of "
                                           "being dropped")));
}

void TableLock::LoseRanOutDropping(const SqlResponse* r, const Inputs&) {
  EmitLost(LeaseRanOut(state_id_, "its release's DROP", WaitedOut(r, "releasing the lock"), /*releasing=*/true));
}

}  // namespace chstate
