// The claims lock's own effects: what its rows (claims_lock.cc) send, arm
// and report. An effect never picks the next state (its row did) and never
// decides anything: it does the one thing its name says. The effects both
// machines share are in lock_machine.cc.
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "core/claims_lock.h"
#include "core/clickhouse_errors.h"
#include "core/quoting.h"
#include "core/response.h"

namespace chstate {

// ---- acquiring ----

void ClaimsLock::ReadClaims(const SqlResponse*, const Inputs&) { Send(st_.InspectClaims(state_id_)); }

void ClaimsLock::ClaimAfresh(const SqlResponse*, const Inputs&) { claim_over_.clear(); }

void ClaimsLock::ClaimOverStale(const SqlResponse*, const Inputs&) { claim_over_ = sighting_.inspection.over; }

void ClaimsLock::Claim(const SqlResponse*, const Inputs& in) {
  // A fresh id per claim (an ended claim stays ended): this acquisition's
  // random prefix and the claim's number, so that its earlier claims, should
  // they land late, are known as its own and never taken for another's.
  if (claim_prefix_.empty()) claim_prefix_ = MakeLockId(in.random).substr(0, kClaimPrefixLen);
  lock_id_ = absl::StrCat(claim_prefix_, absl::Hex(++claims_made_, absl::kZeroPad8));
  claimed_ = true;
  claim_confirmed_ = false;
  create_unresolved_ = false;
  create_sent_at_ms_ = in.now_ms;
  busy_until_ms_ = in.now_ms + st_.cluster().quorum_busy_ms;
  Send(st_.ClaimLock(state_id_, lock_id_, StaleSeconds(), claim_over_));
}

void ClaimsLock::MakeSchema(const SqlResponse* r, const Inputs&) {
  // The claims table (and its database) ON CLUSTER; IF NOT EXISTS, so a
  // creator that lost the race is as good as one that won. The table was
  // missing: no claim was written. After the database, the table may still
  // be missing once.
  claimed_ = false;
  const bool no_database = ResponseCode(*r) == kCodeUnknownDatabase;
  schema_made_ = !no_database;
  Send(no_database ? st_.CreateDatabase() : st_.CreateClaimsTable());
}

void ClaimsLock::WaitToResend(const SqlResponse*, const Inputs& in) {
  ArmTimer(LockTimer::kBusyResend, Jitter(in.random, 60));
}

void ClaimsLock::ResendClaim(const SqlResponse* r, const Inputs& in) {
  create_sent_at_ms_ = in.now_ms;
  Resend(r, in);
}

void ClaimsLock::Resend(const SqlResponse*, const Inputs&) { Send(outstanding_); }

void ClaimsLock::NoteQuorumTrouble(const SqlResponse& r) {
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

void ClaimsLock::GiveUpClaim(const SqlResponse* r, const Inputs&) {
  NoteQuorumTrouble(*r);
  claimed_ = false;  // refused before anything was written; at the deadline the back-off reports why
}

void ClaimsLock::ReadAfterUnconfirmedClaim(const SqlResponse* r, const Inputs& in) {
  NoteQuorumTrouble(*r);
  NoteUnresolvedCreate();
  ReadClaims(r, in);
}

void ClaimsLock::ReadAfterLostClaim(const SqlResponse* r, const Inputs& in) {
  quorum_trouble_ = absl::UnavailableError(absl::StrCat(
      "the lock on state id \"", PrintableId(state_id_), "\" could not be taken: its claim got no answer (",
      r->transport_error, "); replicas may be down or hung. If the claim landed, it blocks the id for ",
      options_.stale_ms / 1000, " s at most"));
  saw_live_claim_ = false;
  NoteUnresolvedCreate();
  CountNoAnswer(r, in);
  ReadClaims(r, in);
}

void ClaimsLock::FailUnreachableClaim(const SqlResponse* r, const Inputs& in) {
  NoteUnresolvedCreate();
  CountThenFailUnreachable(r, in);
}

void ClaimsLock::WithdrawShortly(const SqlResponse*, const Inputs&) { short_back_off_ = true; }

void ClaimsLock::WithdrawAndWait(const SqlResponse*, const Inputs&) {
  saw_live_claim_ = true;
  short_back_off_ = false;
}

void ClaimsLock::FailAfterWithdrawing(const SqlResponse* r, const Inputs& in) {
  fail_after_withdraw_ = CheckResponse(*r, "taking the lock");
  WithdrawShortly(r, in);
}

void ClaimsLock::CountThenWithdrawShortly(const SqlResponse* r, const Inputs& in) {
  CountNoAnswer(r, in);
  WithdrawShortly(r, in);
}

void ClaimsLock::EndClaim(const SqlResponse*, const Inputs& in) {
  busy_until_ms_ = in.now_ms + st_.cluster().quorum_busy_ms;
  Send(st_.EndClaim(state_id_, lock_id_));
}

void ClaimsLock::Withdrawn(const SqlResponse* r, const Inputs&) {
  if (r->transport_ok) NoteQuorumTrouble(*r);
  claimed_ = false;
}

void ClaimsLock::WithdrawnThenCancel(const SqlResponse* r, const Inputs& in) {
  Withdrawn(r, in);
  Cancel(r, in);
}

void ClaimsLock::FailAfterWithdraw(const SqlResponse*, const Inputs&) { EmitFailed(fail_after_withdraw_); }

void ClaimsLock::FailQuorumTrouble(const SqlResponse*, const Inputs&) { EmitFailed(quorum_trouble_); }

int64_t ClaimsLock::BackOffMs(const Inputs& in) {
  // Two claimants that saw each other both back off: the jitter breaks the
  // tie. One whose own claim was not visible yet comes back soon.
  const int64_t wait = std::min(short_back_off_ ? Jitter(in.random, 100) : Jitter(in.random, options_.retry_ms),
                                deadline_ms() - in.now_ms);
  short_back_off_ = false;
  return wait;
}

void ClaimsLock::WaitThenRetry(const SqlResponse*, const Inputs& in) { ArmTimer(LockTimer::kBackOff, BackOffMs(in)); }

void ClaimsLock::ShowHolder(const SqlResponse*, const Inputs& in) {
  back_off_ms_ = BackOffMs(in);
  SendWaiterRow();
}

// ---- holding ----

void ClaimsLock::Renew(const SqlResponse*, const Inputs& in) {
  renew_sent_at_ms_ = in.now_ms;
  busy_until_ms_ = lease_deadline_ms();
  SendRenewal(st_.RenewClaim(state_id_, lock_id_, StaleSeconds()));
}

void ClaimsLock::ResendRenewal(const SqlResponse*, const Inputs& in) {
  renew_sent_at_ms_ = in.now_ms;
  SendRenewal(outstanding_);
}

void ClaimsLock::LoseRanOutBusyRenewing(const SqlResponse*, const Inputs&) {
  EmitLost(LeaseRanOut(state_id_, "its renewal", kBusyCause, /*releasing=*/false));
}

// ---- releasing ----

void ClaimsLock::EndOwnClaim(const SqlResponse*, const Inputs&) {
  // The end row: only our own claim's, so it cannot touch another's lock.
  busy_until_ms_ = lease_deadline_ms();
  SendRelease(st_.EndClaim(state_id_, lock_id_));
}

void ClaimsLock::ResendEnd(const SqlResponse*, const Inputs&) { SendRelease(outstanding_); }

void ClaimsLock::LoseRanOutEnding(const SqlResponse* r, const Inputs&) {
  EmitLost(LeaseRanOut(state_id_, "its release's end row", WaitedOut(r, "releasing the lock"), /*releasing=*/true));
}

void ClaimsLock::LoseRanOutBusyEnding(const SqlResponse*, const Inputs&) {
  EmitLost(LeaseRanOut(state_id_, "its release's end row", kBusyCause, /*releasing=*/true));
}

}  // namespace chstate
