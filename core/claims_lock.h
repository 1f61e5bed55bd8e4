// The claims lock: the lock machine (core/lock_machine.h) for cluster mode
// (Statements::cluster() enabled), where DDL would have to wait for every
// replica (README "Cluster mode"). Its transition table is kRows in
// claims_lock.cc, its effects are in claims_lock_effects.cc. Made by
// MakeLockMachine.
//
// Algorithm (why it is exclusive):
// - Every claim is a row in the replicated `<table>_claims`, written with
//   the insert quorum. A claims read sees every row whose insert was
//   confirmed before the read began: it is asked of replicas - quorum + 1
//   replicas (part::ReadClaims in core/store_lock.cc; one of them has each
//   confirmed row), each read as it is (no select_sequential_consistency:
//   a replica still fetching answers instead of refusing with 289; a row
//   not yet confirmed may show, which only makes a reader wait or see an
//   end). One replica alone is not enough on 18.16: sequential consistency
//   only makes sure of the last quorum insert, and a replica that missed an
//   earlier one answers without it (tests/cluster/test_claims_gap.py).
// - Acquire: read the claims of the id. A claim is live when it has not
//   ended and its newest row is no older than the stale window (judged as
//   for the table lock). With a live claim of another process, back off.
//   Otherwise write a claim under a fresh lock id, naming in `over` the
//   stale claims it takes over, then read again: the claim is held if it is
//   visible and no other live claim is. Else end it (a row with seq 3) and
//   back off, with jitter.
// - Why exclusive: of two claims A and B both confirmed, the later one's
//   read began after the earlier one's insert was confirmed, so it sees the
//   earlier claim, live (its claimant read no later than it wrote); at most
//   one of any set of concurrent claimants sees no other (two may both see
//   each other and both back off: the jitter breaks the tie). A holder's
//   lease and renewals work as for the table lock; a claim judged stale had
//   its lease end before the taker read.
// - A holder's renewal is confirmed while its claim has not ended and no
//   claim names it in `over`; a release is the end row.
// - A claim whose answer was lost (or code 319) may land later: it is ended
//   before the next attempt, so it cannot block anyone once it does. It is
//   never held, even when a read shows it: it may be on one replica only.
// - A quorum insert that met another in flight (code 286: nothing written)
//   is sent again after a short random wait, until quorum_busy_ms (a
//   renewal or end row: until the lease ends); an end row also after 319 or
//   285 (writing it twice is harmless).
#ifndef CHSTATE_CORE_CLAIMS_LOCK_H_
#define CHSTATE_CORE_CLAIMS_LOCK_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "core/lock_table.h"

namespace chstate {

enum class ClaimsLockState {
  kIdle,
  kReading,          // the claims read sent (acquiring)
  kClaiming,         // a claim row sent
  kClaimingBusy,     // ... answered 286: sent again when the kBusyResend timer fires
  kCreatingSchema,   // the claims table (or its database) ON CLUSTER, sent
  kWithdrawing,      // the end row of a claim that did not win, sent
  kWithdrawingBusy,  // ... waiting to send it again
  kAnnouncing,       // the waiter row sent, before backing off
  kBackingOff,       // the back-off timer armed
  kHeld,             // lease valid; renewal timer armed
  kRenewing,         // the renewal row sent
  kRenewingBusy,     // ... waiting to send it again
  kConfirming,       // the claims read sent after a renewal
  kEnding,           // the release's end row sent
  kEndingBusy,       // ... waiting to send it again
  kReleased,         // terminal
  kFailed,           // terminal: never acquired (timeout, error, cancelled)
  kLost,             // terminal: was held, no longer ours
  // Decisions, passed through within one input:
  kToAttempt,   // an attempt starts (with a read): a pending release cancels it
  kToClaim,     // a claim is written under a fresh id (random bytes needed)
  kToWithdraw,  // our claim, if one may exist, is ended before backing off
  kToBackOff,   // time up (and why)? else wait, showing a live holder the waiter row first
  kToHold,      // the holder (again): a pending release starts now
  kToRelease,   // past the lease, the lock is left to expire (the last state: kStateCount)
};

enum class ClaimsLockEvent {
  // Inputs.
  kAcquire,
  kAcquireWithoutRandom,
  kRelease,
  kTimer,
  kTimerPastLease,  // held, or a renewal or end row waiting to go again: the lease ran out
  // Answers, as the classifier names them.
  kOk,
  kExists,          // code 57
  kMissing,         // no claims table or database (60, 81, 218)
  kMissingAgain,    // ... though the schema was just made
  kError,           // any other error answer (a refusal)
  kNoAnswer,        // a transport failure
  kUnreachable,     // ... the NoAnswerCount::kLimit-th in a row
  kBusy,            // code 286 (or, for an end row, 319/285): send it again shortly
  kNothingWritten,  // a claim refused by the quorum (285, 286 past quorum_busy_ms)
  kMaybeLanded,     // a claim answered 319: it may land later
  kClaimedTrusted,  // defect claim_without_second_read: a written claim holds
  kDdlTimedOut,     // code 159: the ON CLUSTER DDL ran on the live hosts
  kGarbled,         // a claims read that does not parse
  kOurs,            // our claim is held: visible, not ended, no other live claim
  kFree,            // no live claim and none of ours: claim afresh
  kStale,           // ... only stale claims of others: claim over them
  kOursUnseen,      // our claim does not hold (not visible yet, or ended): end it first
  kHeldByOther,     // another process's live claim
  kLagging,         // code 289: a replica behind the quorum answered
  kErrorWithClaim,  // a read failed while a claim of ours may stand: end it, then fail
  kCancelled,       // a release was asked for while acquiring
  kWithdrawn,       // the end row of a claim that did not win is in (or failed)
  kInconclusive,    // a renewal (or its read) failed within the lease
  kRanOut,          // ... a renewal or end row failed and the lease ran out
  kConfirmed,       // the renewal's read shows our claim standing
  kTakenOver,       // ... ended or taken over
  kConfirmedTooLate,  // ... standing, but the lease ran out meanwhile
  // Decisions.
  kGo,
  kReleasePending,
  kNoRandom,
  kClaimOut,
  kNoClaim,
  kFailAfterWithdraw,
  kTimeUp,
  kTimeUpUnreachable,
  kTimeUpQuorum,  // ... and the replicas, not another process, kept the lock from us
  kShowHolder,
  kWait,
  kLeaseOver,  // the last event: kEventCount
};

class ClaimsLock final : public TableDrivenLock<ClaimsLock, ClaimsLockState, ClaimsLockEvent> {
 public:
  ClaimsLock(const Statements& statements, std::string state_id, LockOptions options,
             LockMachineOptions machine_options);

  // The table, and what the engine (core/lock_table.h) asks of it.
  static absl::Span<const Row> Rows();
  static LockState Public(State s);
  static const char* StateName(State s);
  static const char* EventName(Event e);
  static LockInput InputOf(Event e);
  static bool IsDecision(State s);
  static constexpr int kStateCount = static_cast<int>(State::kToRelease) + 1;
  static constexpr int kEventCount = static_cast<int>(Event::kLeaseOver) + 1;
  static constexpr State kLostState = State::kLost;
  static constexpr State kFailedState = State::kFailed;

 private:
  friend class TableDrivenLock<ClaimsLock, ClaimsLockState, ClaimsLockEvent>;
  static const Row kRows[];

  // ---- classifiers (claims_lock.cc): the one event an input is ----
  void Observe(const SqlResponse& r);
  Event Classify(LockInput input, const SqlResponse* r, const Inputs& in) const;
  Event ClassifyAnswer(const SqlResponse& r, const Inputs& in) const;
  Event ClassifyClaims(const Inputs& in) const;
  // A quorum insert that met another in flight, sent again shortly.
  bool SentAgainWhenBusy(const SqlResponse& r, const Inputs& in) const;
  Event Decide(const Inputs& in) const;

  // ---- effects (claims_lock_effects.cc) ----
  void ReadClaims(const SqlResponse*, const Inputs&);
  void ClaimAfresh(const SqlResponse*, const Inputs&);
  void ClaimOverStale(const SqlResponse*, const Inputs&);
  void Claim(const SqlResponse*, const Inputs& in);
  void MakeSchema(const SqlResponse* r, const Inputs&);
  void WaitToResend(const SqlResponse*, const Inputs& in);
  void ResendClaim(const SqlResponse*, const Inputs& in);
  void Resend(const SqlResponse*, const Inputs&);
  void GiveUpClaim(const SqlResponse* r, const Inputs&);
  void ReadAfterUnconfirmedClaim(const SqlResponse* r, const Inputs& in);
  void ReadAfterLostClaim(const SqlResponse* r, const Inputs& in);
  void FailUnreachableClaim(const SqlResponse* r, const Inputs& in);
  void WithdrawShortly(const SqlResponse*, const Inputs&);
  void WithdrawAndWait(const SqlResponse*, const Inputs&);
  void FailAfterWithdrawing(const SqlResponse* r, const Inputs&);
  void CountThenWithdrawShortly(const SqlResponse* r, const Inputs& in);
  void EndClaim(const SqlResponse*, const Inputs& in);
  void Withdrawn(const SqlResponse* r, const Inputs&);
  void WithdrawnThenCancel(const SqlResponse* r, const Inputs& in);
  void FailAfterWithdraw(const SqlResponse*, const Inputs&);
  void FailQuorumTrouble(const SqlResponse*, const Inputs&);
  void WaitThenRetry(const SqlResponse*, const Inputs& in);
  void ShowHolder(const SqlResponse*, const Inputs& in);
  void Renew(const SqlResponse*, const Inputs& in);
  void ResendRenewal(const SqlResponse*, const Inputs& in);
  void LoseRanOutBusyRenewing(const SqlResponse*, const Inputs&);
  void EndOwnClaim(const SqlResponse*, const Inputs&);
  void ResendEnd(const SqlResponse*, const Inputs&);
  void LoseRanOutEnding(const SqlResponse* r, const Inputs&);
  void LoseRanOutBusyEnding(const SqlResponse*, const Inputs&);
  // Records a quorum refusal (285, 286, 319) as the cause to report at the
  // deadline instead of "locked by another".
  void NoteQuorumTrouble(const SqlResponse& r);
  int64_t BackOffMs(const Inputs& in);

  // ---- the claims lock's own facts ----
  // A claim of lock_id_ may exist (so it is ended before the next attempt).
  bool claimed_ = false;
  bool claim_confirmed_ = false;  // the quorum confirmed the claim (its insert answered OK)
  // Every claim of this acquisition is claim_prefix_ plus its number in 8
  // hex digits (32 hex digits in all, as any lock id).
  static constexpr size_t kClaimPrefixLen = 24;
  std::string claim_prefix_;
  uint32_t claims_made_ = 0;
  std::string claim_over_;  // the stale claims the next claim takes over
  // The back-off after the end row (or none) comes soon: our own claim was
  // not visible yet, or a replica lagged.
  bool short_back_off_ = false;
  // An error to end with once our claim is withdrawn.
  absl::Status fail_after_withdraw_;
  // The last quorum refusal (285, 286, 319) of this acquisition, and whether
  // a live claim of another process was seen since: at the deadline, the
  // cause to report instead of "locked by another".
  absl::Status quorum_trouble_;
  bool saw_live_claim_ = false;
};

}  // namespace chstate

#endif  // CHSTATE_CORE_CLAIMS_LOCK_H_
