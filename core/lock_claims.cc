// The cluster claims lock (cluster mode): claiming, resending a claim the
// quorum was busy for, withdrawing a claim that did not win, and deciding
// from the claims read. Acquiring's common steps are in lock_acquire.cc.
#include "core/lock_machine.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/clickhouse_errors.h"
#include "core/quoting.h"
#include "core/response.h"

namespace chstate {

// ---- the cluster claims ----

void LockMachine::Claim(const std::string& over, const Inputs& in) {
  if (in.random.size() < 16) {
    Fail(absl::InvalidArgumentError("the host passed fewer than 16 random bytes for a lock id"));
    return;
  }
  // A fresh id per claim (an ended claim stays ended): this acquisition's
  // random prefix and the claim's number, so that its earlier claims, should
  // they land late, are known as its own and never taken for another's.
  if (claim_prefix_.empty()) claim_prefix_ = MakeLockId(in.random).substr(0, kClaimPrefixLen);
  lock_id_ = absl::StrCat(claim_prefix_, absl::Hex(++claims_made_, absl::kZeroPad8));
  claimed_ = true;
  create_unresolved_ = false;
  state_ = LockState::kCreating;
  create_sent_at_ms_ = in.now_ms;
  busy_until_ms_ = in.now_ms + st_.cluster().quorum_busy_ms;
  Send(st_.ClaimLock(state_id_, lock_id_, StaleSeconds(), over), in);
}

bool LockMachine::RetryBusy(const SqlResponse* r, const Inputs& in) {
  if (!Claims() || r == nullptr || !r->transport_ok) return false;
  // 286 wrote nothing; 319 may have written an end row, which is harmless
  // to write again (end rows only; a claim or renewal is settled by reading).
  const std::optional<int> code = ResponseCode(*r);
  const bool end_row = outstanding_.purpose == "end_claim";
  const bool again = code == ch::kUnsatisfiedQuorumForPreviousWrite || code == ch::kTooManyParts ||
                     (end_row && (code == ch::kUnknownStatusOfInsert || code == ch::kTooFewLiveReplicas));
  if (!again) return false;
  if (in.now_ms >= busy_until_ms_ || outstanding_.sql.empty()) return false;
  busy_resend_ = outstanding_;
  out_.push_back(LockAction{LockAction::Kind::kArmTimer, {}, Jitter(in, 60)});
  return true;
}

void LockMachine::ResendBusy(const SqlResponse*, const Inputs& in) {
  if (!busy_resend_) return;  // a renewal timer from before: nothing to do
  SqlRequest again = *std::move(busy_resend_);
  busy_resend_.reset();
  // Acts under the lock go out only within the lease, also when sent again.
  if ((state_ == LockState::kRenewing && !LeaseValid(in.now_ms)) ||
      (state_ == LockState::kDropping && in.now_ms >= lease_deadline_ms_)) {
    LeaseRanOut(kBusyCause, in);
    return;
  }
  if (state_ == LockState::kCreating) create_sent_at_ms_ = in.now_ms;
  if (state_ == LockState::kRenewing) renew_sent_at_ms_ = in.now_ms;
  Send(std::move(again), in);
}

void LockMachine::WithdrawThenBackOff(const Inputs& in, bool short_wait) {
  withdraw_short_ = short_wait;
  if (!claimed_) {
    BackOff(in);
    return;
  }
  state_ = LockState::kWithdrawing;
  busy_until_ms_ = in.now_ms + st_.cluster().quorum_busy_ms;
  Send(st_.EndClaim(state_id_, lock_id_), in);
}

void LockMachine::Withdrawn(const SqlResponse* r, const Inputs& in) {
  if (RetryBusy(r, in)) return;
  if (r && r->transport_ok) NoteQuorumTrouble(*r);
  // Ended (or, if the end row failed, left to go stale: it never held).
  claimed_ = false;
  if (release_requested_) {
    Cancel(nullptr, in);
    return;
  }
  BackOff(in);
}

void LockMachine::NoteQuorumTrouble(const SqlResponse& r) {
  const absl::Status st = CheckResponse(r, "taking the lock");
  const std::optional<int> code = ClickHouseCode(st);
  if (code != ch::kTooFewLiveReplicas && code != ch::kUnsatisfiedQuorumForPreviousWrite &&
      code != ch::kUnknownStatusOfInsert) {
    return;
  }
  const std::string fewer = absl::StrCat("fewer than ", st_.cluster().quorum,
                                         " replicas are alive (code 285); nothing was written");
  const char* why = code == ch::kTooFewLiveReplicas
                        ? fewer.c_str()
                    : code == ch::kUnsatisfiedQuorumForPreviousWrite
                        ? "an earlier write to the lock's claims has not reached its quorum (code 286: a replica that "
                          "holds it is down or lagging)"
                        : "a claim's quorum was not confirmed in time (code 319: a replica is down or hung)";
  quorum_trouble_ = absl::UnavailableError(absl::StrCat("the lock on state id \"", PrintableId(state_id_),
                                                        "\" could not be taken: ", why,
                                                        ". Retry when the replicas are back. ClickHouse said: ",
                                                        st.message()));
  saw_live_claim_ = false;
}

void LockMachine::DecideClaims(const LockInspection& insp, const Inputs& in) {
  if (claimed_ && insp.ours_held && insp.holder == lock_id_) {
    BecomeHolder(create_unresolved_ ? earliest_unresolved_create_ms_ : create_sent_at_ms_, in);
    return;
  }
  if (release_requested_) {
    WithdrawThenBackOff(in, true);  // Withdrawn cancels
    return;
  }
  if (!insp.exists || insp.holder == lock_id_) {
    // Free. Ours, if written, is not visible (its answer was lost, or a
    // lagging replica): end it first, then claim afresh.
    if (claimed_) {
      WithdrawThenBackOff(in, true);
      return;
    }
    Claim("", in);
    return;
  }
  LockOptions judged = options_;
  if (!defects_.ignore_holder_window) judged.stale_ms = std::max(options_.stale_ms, insp.stale_s * 1000);
  switch (DecideOnHeldLock(true, insp.age_s, in.now_ms, deadline_ms_, judged)) {
    case LockVerdict::kRetryNow:
    case LockVerdict::kTakeOver:
      if (claimed_) {
        WithdrawThenBackOff(in, true);
        return;
      }
      Claim(insp.over, in);
      return;
    case LockVerdict::kWait:
    case LockVerdict::kGiveUp:  // BackOff fails it, after our claim is ended
      saw_live_claim_ = true;
      WithdrawThenBackOff(in, false);
      return;
  }
}

}  // namespace chstate
