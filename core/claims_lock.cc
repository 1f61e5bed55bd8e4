// The claims lock's transition table (ClaimsLock::kRows) and its
// classifiers: what each answer (or timer, or decision) is, as one event,
// before the table is consulted. Every (state, event) the machine takes is
// one row with one next state; any other input is misuse
// (core/lock_table.h). The effects the rows name are in
// claims_lock_effects.cc, the ones both machines share in lock_machine.cc.
#include "core/claims_lock.h"

#include <utility>

#include "core/clickhouse_errors.h"
#include "core/response.h"
#include "core/task.h"

namespace chstate {

namespace {
using S = ClaimsLockState;
using E = ClaimsLockEvent;
using C = ClaimsLock;
}  // namespace

// clang-format off
const ClaimsLock::Row ClaimsLock::kRows[] = {
    // ---- acquiring: read, claim, read again ----
    {S::kIdle,            E::kAcquire,              S::kToAttempt,       &C::StartAcquiring},
    {S::kIdle,            E::kAcquireWithoutRandom, S::kFailed,          &C::FailWithoutRandom},
    {S::kToAttempt,       E::kReleasePending,       S::kFailed,          &C::Cancel},
    {S::kToAttempt,       E::kGo,                   S::kReading,         &C::ReadClaims},
    {S::kReading,         E::kGarbled,              S::kFailed,          &C::FailGarbled},
    {S::kReading,         E::kOurs,                 S::kToHold,          &C::BecomeHolderFromRead},
    {S::kReading,         E::kCancelled,            S::kToWithdraw,      &C::WithdrawShortly},
    {S::kReading,         E::kFree,                 S::kToClaim,         &C::ClaimAfresh},
    {S::kReading,         E::kStale,                S::kToClaim,         &C::ClaimOverStale},
    {S::kReading,         E::kOursUnseen,           S::kToWithdraw,      &C::WithdrawShortly},
    {S::kReading,         E::kHeldByOther,          S::kToWithdraw,      &C::WithdrawAndWait},
    {S::kReading,         E::kLagging,              S::kToWithdraw,      &C::WithdrawShortly},
    {S::kReading,         E::kErrorWithClaim,       S::kToWithdraw,      &C::FailAfterWithdrawing},
    {S::kReading,         E::kError,                S::kFailed,          &C::FailWithAnswer},
    {S::kReading,         E::kNoAnswer,             S::kToWithdraw,      &C::CountThenWithdrawShortly},
    {S::kReading,         E::kUnreachable,          S::kFailed,          &C::CountThenFailUnreachable},
    {S::kReading,         E::kRelease,              S::kReading,         &C::NoteRelease},
    {S::kToClaim,         E::kNoRandom,             S::kFailed,          &C::FailWithoutRandom},
    {S::kToClaim,         E::kGo,                   S::kClaiming,        &C::Claim},
    {S::kClaiming,        E::kOk,                   S::kReading,         &C::ReadClaims},
    {S::kClaiming,        E::kClaimedTrusted,       S::kToHold,          &C::BecomeHolder},
    {S::kClaiming,        E::kExists,               S::kReading,         &C::ReadClaims},
    {S::kClaiming,        E::kMissing,              S::kCreatingSchema,  &C::MakeSchema},
    {S::kClaiming,        E::kMissingAgain,         S::kFailed,          &C::FailWithAnswer},
    {S::kClaiming,        E::kBusy,                 S::kClaimingBusy,    &C::WaitToResend},
    {S::kClaiming,        E::kNothingWritten,       S::kToBackOff,       &C::GiveUpClaim},
    {S::kClaiming,        E::kError,                S::kFailed,          &C::FailWithAnswer},
    {S::kClaiming,        E::kMaybeLanded,          S::kReading,         &C::ReadAfterUnconfirmedClaim},
    {S::kClaiming,        E::kNoAnswer,             S::kReading,         &C::ReadAfterLostClaim},
    {S::kClaiming,        E::kUnreachable,          S::kFailed,          &C::FailUnreachableClaim},
    {S::kClaiming,        E::kTimer,                S::kClaiming,        nullptr},
    {S::kClaiming,        E::kRelease,              S::kClaiming,        &C::NoteRelease},
    {S::kClaimingBusy,    E::kTimer,                S::kClaiming,        &C::ResendClaim},
    {S::kClaimingBusy,    E::kRelease,              S::kClaimingBusy,    &C::NoteRelease},
    {S::kCreatingSchema,  E::kOk,                   S::kToAttempt,       nullptr},
    {S::kCreatingSchema,  E::kDdlTimedOut,          S::kToAttempt,       nullptr},
    {S::kCreatingSchema,  E::kError,                S::kFailed,          &C::FailWithAnswer},
    {S::kCreatingSchema,  E::kRelease,              S::kCreatingSchema,  &C::NoteRelease},
    {S::kToWithdraw,      E::kClaimOut,             S::kWithdrawing,     &C::EndClaim},
    {S::kToWithdraw,      E::kNoClaim,              S::kToBackOff,       nullptr},
    {S::kWithdrawing,     E::kBusy,                 S::kWithdrawingBusy, &C::WaitToResend},
    {S::kWithdrawing,     E::kWithdrawn,            S::kToBackOff,       &C::Withdrawn},
    {S::kWithdrawing,     E::kCancelled,            S::kFailed,          &C::WithdrawnThenCancel},
    {S::kWithdrawing,     E::kTimer,                S::kWithdrawing,     nullptr},
    {S::kWithdrawing,     E::kRelease,              S::kWithdrawing,     &C::NoteRelease},
    {S::kWithdrawingBusy, E::kTimer,                S::kWithdrawing,     &C::Resend},
    {S::kWithdrawingBusy, E::kRelease,              S::kWithdrawingBusy, &C::NoteRelease},
    {S::kToBackOff,       E::kFailAfterWithdraw,    S::kFailed,          &C::FailAfterWithdraw},
    {S::kToBackOff,       E::kTimeUpUnreachable,    S::kFailed,          &C::FailUnreachable},
    {S::kToBackOff,       E::kTimeUpQuorum,         S::kFailed,          &C::FailQuorumTrouble},
    {S::kToBackOff,       E::kTimeUp,               S::kFailed,          &C::FailTimeUp},
    {S::kToBackOff,       E::kShowHolder,           S::kAnnouncing,      &C::ShowHolder},
    {S::kToBackOff,       E::kWait,                 S::kBackingOff,      &C::WaitThenRetry},
    {S::kAnnouncing,      E::kOk,                   S::kBackingOff,      &C::Shown},
    {S::kAnnouncing,      E::kError,                S::kBackingOff,      &C::NotShown},
    {S::kAnnouncing,      E::kRelease,              S::kAnnouncing,      &C::NoteRelease},
    {S::kBackingOff,      E::kTimer,                S::kToAttempt,       nullptr},
    {S::kBackingOff,      E::kRelease,              S::kFailed,          &C::Cancel},
    // ---- holding ----
    {S::kToHold,          E::kReleasePending,       S::kToRelease,       &C::TakeUpRelease},
    {S::kToHold,          E::kGo,                   S::kHeld,            &C::ArmRenewal},
    {S::kHeld,            E::kTimer,                S::kRenewing,        &C::Renew},
    {S::kHeld,            E::kTimerPastLease,       S::kLost,            &C::LoseExpired},
    {S::kHeld,            E::kRelease,              S::kToRelease,       nullptr},
    {S::kRenewing,        E::kOk,                   S::kConfirming,      &C::ReadClaims},
    {S::kRenewing,        E::kBusy,                 S::kRenewingBusy,    &C::WaitToResend},
    {S::kRenewing,        E::kInconclusive,         S::kToHold,          &C::KeepLease},
    {S::kRenewing,        E::kRanOut,               S::kLost,            &C::LoseRanOutRenewing},
    {S::kRenewing,        E::kMissing,              S::kLost,            &C::LoseTable},
    {S::kRenewing,        E::kExists,               S::kFailed,          &C::FailWithAnswer},
    {S::kRenewing,        E::kTimer,                S::kRenewing,        nullptr},
    {S::kRenewing,        E::kRelease,              S::kRenewing,        &C::NoteRelease},
    {S::kRenewingBusy,    E::kTimer,                S::kRenewing,        &C::ResendRenewal},
    {S::kRenewingBusy,    E::kTimerPastLease,       S::kLost,            &C::LoseRanOutBusyRenewing},
    {S::kRenewingBusy,    E::kRelease,              S::kRenewingBusy,    &C::NoteRelease},
    {S::kConfirming,      E::kConfirmed,            S::kToHold,          &C::ExtendLease},
    {S::kConfirming,      E::kTakenOver,            S::kLost,            &C::LoseTakenOver},
    {S::kConfirming,      E::kConfirmedTooLate,     S::kLost,            &C::LoseConfirmedTooLate},
    {S::kConfirming,      E::kMissing,              S::kLost,            &C::LoseTable},
    {S::kConfirming,      E::kInconclusive,         S::kToHold,          &C::KeepLease},
    {S::kConfirming,      E::kRanOut,               S::kLost,            &C::LoseRanOutRenewing},
    {S::kConfirming,      E::kExists,               S::kFailed,          &C::FailWithAnswer},
    {S::kConfirming,      E::kTimer,                S::kConfirming,      nullptr},
    {S::kConfirming,      E::kRelease,              S::kConfirming,      &C::NoteRelease},
    // ---- releasing: the end row of our own claim only ----
    {S::kToRelease,       E::kLeaseOver,            S::kLost,            &C::LoseHeldPastLease},
    {S::kToRelease,       E::kGo,                   S::kEnding,          &C::EndOwnClaim},
    {S::kEnding,          E::kOk,                   S::kReleased,        &C::Released},
    {S::kEnding,          E::kMissing,              S::kReleased,        &C::Released},
    {S::kEnding,          E::kBusy,                 S::kEndingBusy,      &C::WaitToResend},
    {S::kEnding,          E::kRanOut,               S::kLost,            &C::LoseRanOutEnding},
    {S::kEnding,          E::kError,                S::kLost,            &C::LoseReleaseFailed},
    {S::kEnding,          E::kTimer,                S::kEnding,          nullptr},
    {S::kEnding,          E::kRelease,              S::kEnding,          nullptr},
    {S::kEndingBusy,      E::kTimer,                S::kEnding,          &C::ResendEnd},
    {S::kEndingBusy,      E::kTimerPastLease,       S::kLost,            &C::LoseRanOutBusyEnding},
    {S::kEndingBusy,      E::kRelease,              S::kEndingBusy,      nullptr},
    // ---- after the end: a renewal timer armed while held may still fire ----
    {S::kReleased,        E::kTimer,                S::kReleased,        nullptr},
    {S::kLost,            E::kTimer,                S::kLost,            nullptr},
    {S::kFailed,          E::kTimer,                S::kFailed,          nullptr},
    {S::kReleased,        E::kRelease,              S::kReleased,        nullptr},
};
// clang-format on

absl::Span<const ClaimsLock::Row> ClaimsLock::Rows() { return kRows; }

ClaimsLock::ClaimsLock(const Statements& statements, std::string state_id, LockOptions options,
                       LockMachineOptions machine_options)
    : TableDrivenLock(statements, std::move(state_id), options, machine_options) {}

LockState ClaimsLock::Public(State s) {
  switch (s) {
    case S::kIdle: return LockState::kIdle;
    case S::kReading: return LockState::kInspecting;
    case S::kClaiming:
    case S::kClaimingBusy: return LockState::kCreating;
    case S::kCreatingSchema: return LockState::kCreatingSchema;
    case S::kWithdrawing:
    case S::kWithdrawingBusy: return LockState::kWithdrawing;
    case S::kAnnouncing: return LockState::kAnnouncing;
    case S::kBackingOff: return LockState::kBackingOff;
    case S::kHeld: return LockState::kHeld;
    case S::kRenewing:
    case S::kRenewingBusy: return LockState::kRenewing;
    case S::kConfirming: return LockState::kConfirming;
    case S::kEnding:
    case S::kEndingBusy: return LockState::kDropping;
    case S::kReleased: return LockState::kReleased;
    case S::kFailed: return LockState::kFailed;
    case S::kLost: return LockState::kLost;
    // Decisions are never seen between inputs; the holder's are holding.
    case S::kToAttempt:
    case S::kToClaim:
    case S::kToWithdraw: return LockState::kInspecting;
    case S::kToBackOff: return LockState::kBackingOff;
    case S::kToHold:
    case S::kToRelease: return LockState::kHeld;
  }
  return LockState::kFailed;
}

bool ClaimsLock::IsDecision(State s) {
  return s == S::kToAttempt || s == S::kToClaim || s == S::kToWithdraw || s == S::kToBackOff || s == S::kToHold ||
         s == S::kToRelease;
}

const char* ClaimsLock::StateName(State s) {
  switch (s) {
    case S::kReading: return "reading";
    case S::kClaiming: return "claiming";
    case S::kClaimingBusy: return "claiming-busy";
    case S::kWithdrawingBusy: return "withdrawing-busy";
    case S::kRenewingBusy: return "renewing-busy";
    case S::kEnding: return "ending";
    case S::kEndingBusy: return "ending-busy";
    case S::kToAttempt: return "to-attempt";
    case S::kToClaim: return "to-claim";
    case S::kToWithdraw: return "to-withdraw";
    case S::kToBackOff: return "to-back-off";
    case S::kToHold: return "to-hold";
    case S::kToRelease: return "to-release";
    default: return LockStateName(Public(s));
  }
}

LockInput ClaimsLock::InputOf(Event e) {
  switch (e) {
    case E::kAcquire:
    case E::kAcquireWithoutRandom: return LockInput::kAcquire;
    case E::kRelease: return LockInput::kRelease;
    case E::kTimer:
    case E::kTimerPastLease: return LockInput::kTimer;
    case E::kGo:
    case E::kReleasePending:
    case E::kNoRandom:
    case E::kClaimOut:
    case E::kNoClaim:
    case E::kFailAfterWithdraw:
    case E::kTimeUp:
    case E::kTimeUpUnreachable:
    case E::kTimeUpQuorum:
    case E::kShowHolder:
    case E::kWait:
    case E::kLeaseOver: return LockInput::kDecision;
    default: return LockInput::kAnswer;
  }
}

const char* ClaimsLock::EventName(Event e) {
  switch (e) {
    case E::kAcquire: return "acquire";
    case E::kAcquireWithoutRandom: return "acquire-without-random";
    case E::kRelease: return "release";
    case E::kTimer: return "timer";
    case E::kTimerPastLease: return "timer-past-lease";
    case E::kOk: return "ok";
    case E::kExists: return "exists";
    case E::kMissing: return "missing";
    case E::kMissingAgain: return "missing-again";
    case E::kError: return "error";
    case E::kNoAnswer: return "no-answer";
    case E::kUnreachable: return "unreachable";
    case E::kBusy: return "busy";
    case E::kNothingWritten: return "nothing-written";
    case E::kMaybeLanded: return "maybe-landed";
    case E::kClaimedTrusted: return "claimed-trusted";
    case E::kDdlTimedOut: return "ddl-timed-out";
    case E::kGarbled: return "garbled";
    case E::kOurs: return "ours";
    case E::kFree: return "free";
    case E::kStale: return "stale";
    case E::kOursUnseen: return "ours-unseen";
    case E::kHeldByOther: return "held-by-other";
    case E::kLagging: return "lagging";
    case E::kErrorWithClaim: return "error-with-claim";
    case E::kCancelled: return "cancelled";
    case E::kWithdrawn: return "withdrawn";
    case E::kInconclusive: return "inconclusive";
    case E::kRanOut: return "ran-out";
    case E::kConfirmed: return "confirmed";
    case E::kTakenOver: return "taken-over";
    case E::kConfirmedTooLate: return "confirmed-too-late";
    case E::kGo: return "go";
    case E::kReleasePending: return "release-pending";
    case E::kNoRandom: return "no-random";
    case E::kClaimOut: return "claim-out";
    case E::kNoClaim: return "no-claim";
    case E::kFailAfterWithdraw: return "fail-after-withdraw";
    case E::kTimeUp: return "time-up";
    case E::kTimeUpUnreachable: return "time-up-unreachable";
    case E::kTimeUpQuorum: return "time-up-quorum";
    case E::kShowHolder: return "show-holder";
    case E::kWait: return "wait";
    case E::kLeaseOver: return "lease-over";
  }
  return "?";
}

// ---- classifiers ----

void ClaimsLock::Observe(const SqlResponse& r) {
  sighting_ = LockSighting{};
  // The quorum confirmed our claim (a claim answered 319, or not at all, may
  // be on one replica only: visible there, and held by nobody).
  if (state_ == S::kClaiming && answer_ == LockAnswer::kOk) claim_confirmed_ = true;
  const bool acquiring = state_ == S::kReading;
  if ((!acquiring && state_ != S::kConfirming) || answer_ != LockAnswer::kOk) return;
  // While acquiring, only a claim of ours that may exist is ours, and this
  // acquisition's earlier claims are nobody's; a holder confirms its own.
  absl::StatusOr<LockInspection> insp =
      ParseClaimInspection(r.body, !acquiring || claimed_ ? lock_id_ : std::string(), StaleSeconds(),
                           acquiring ? claim_prefix_ : std::string());
  if (!insp.ok()) {
    sighting_.garbled = insp.status();
    return;
  }
  sighting_.inspected = true;
  sighting_.inspection = *std::move(insp);
  const LockInspection& seen = sighting_.inspection;
  prunable_claims_ = seen.dead;
  const bool live = seen.age_s * 1000 <= std::max(options_.stale_ms, seen.stale_s * 1000);
  if (seen.exists && !seen.holder.empty() && seen.holder != lock_id_ && live) sighting_.live_holder = seen.holder;
}

ClaimsLock::Event ClaimsLock::Classify(LockInput input, const SqlResponse* r, const Inputs& in) const {
  switch (input) {
    case LockInput::kAcquire:
      return in.random.size() < 16 ? E::kAcquireWithoutRandom : E::kAcquire;
    case LockInput::kRelease:
      return E::kRelease;
    case LockInput::kTimer:
      // Acts under the lock go out only within the lease, also when sent again.
      if ((state_ == S::kHeld || state_ == S::kRenewingBusy) && !InLease(in.now_ms)) return E::kTimerPastLease;
      if (state_ == S::kEndingBusy && in.now_ms >= lease_deadline_ms()) return E::kTimerPastLease;
      return E::kTimer;
    case LockInput::kAnswer:
      return ClassifyAnswer(*r, in);
    case LockInput::kDecision:
      break;
  }
  return Decide(in);
}

bool ClaimsLock::SentAgainWhenBusy(const SqlResponse& r, const Inputs& in) const {
  if (!r.transport_ok) return false;
  // 286 wrote nothing; 319 may have written an end row, which is harmless
  // to write again (end rows only; a claim or renewal is settled by reading).
  const std::optional<int> code = ResponseCode(r);
  const bool end_row = outstanding_.purpose == "end_claim";
  const bool again = code == ch::kUnsatisfiedQuorumForPreviousWrite || code == ch::kTooManyParts ||
                     (end_row && (code == ch::kUnknownStatusOfInsert || code == ch::kTooFewLiveReplicas));
  if (!again) return false;
  if (in.now_ms >= busy_until_ms() || outstanding_.sql.empty()) return false;
  return true;
}

ClaimsLock::Event ClaimsLock::ClassifyAnswer(const SqlResponse& r, const Inputs& in) const {
  const LockAnswer a = answer_;
  switch (state_) {
    case S::kReading:
      if (a == LockAnswer::kOk) return ClassifyClaims(in);
      // No claims table yet: the claim meets code 60 and creates it.
      if (a == LockAnswer::kMissing) return claimed_ ? E::kOursUnseen : E::kFree;
      if (a == LockAnswer::kExists) return E::kError;
      if (r.transport_ok) {
        if (ResponseCode(r) == ch::kReplicaIsNotInQuorum) return E::kLagging;  // ask again shortly
        return claimed_ ? E::kErrorWithClaim : E::kError;  // end our claim first, so that it blocks no one
      }
      return no_answer_.WouldGiveUp() ? E::kUnreachable : E::kNoAnswer;
    case S::kClaiming: {
      if (a == LockAnswer::kOk) return defects_.claim_without_second_read ? E::kClaimedTrusted : E::kOk;
      if (a == LockAnswer::kExists) return E::kExists;
      if (a == LockAnswer::kMissing) return schema_made_ ? E::kMissingAgain : E::kMissing;
      if (SentAgainWhenBusy(r, in)) return E::kBusy;
      const std::optional<int> code = ResponseCode(r);  // none without an answer
      if (code == ch::kTooFewLiveReplicas || code == ch::kUnsatisfiedQuorumForPreviousWrite) {
        return E::kNothingWritten;  // refused before anything was written
      }
      if (r.transport_ok && code != ch::kUnknownStatusOfInsert) return E::kError;
      // Code 319 (the quorum not confirmed in time), or no answer: the claim
      // may be in, or may land later. The next read settles it; if it is not
      // ours by then it is ended before anything else.
      if (r.transport_ok) return E::kMaybeLanded;
      return no_answer_.WouldGiveUp() ? E::kUnreachable : E::kNoAnswer;
    }
    case S::kCreatingSchema:
      // An ON CLUSTER CREATE ... IF NOT EXISTS that some host did not run in
      // time (159) ran on the others; the next claim shows whether enough
      // replicas have the table.
      if (a == LockAnswer::kOk) return E::kOk;
      if (a == LockAnswer::kError && ResponseCode(r) == ch::kTimeoutExceeded) return E::kDdlTimedOut;
      return E::kError;
    case S::kWithdrawing:
      if (SentAgainWhenBusy(r, in)) return E::kBusy;
      // Ended (or, if the end row failed, left to go stale: it never held).
      return release_requested_ ? E::kCancelled : E::kWithdrawn;
    case S::kAnnouncing:
      return a == LockAnswer::kOk ? E::kOk : E::kError;
    case S::kRenewing:
    case S::kConfirming:
      if (a == LockAnswer::kOk) {
        if (state_ == S::kRenewing) return E::kOk;
        // Ours while our claim stands and no claim took it over (a live
        // claim of a racer that has yet to see ours and withdraw is no loss).
        switch (JudgeRenewal(sighting_.inspected && sighting_.inspection.ours_held, in)) {
          case Renewal::kConfirmed: return E::kConfirmed;
          case Renewal::kTakenOver: return E::kTakenOver;
          case Renewal::kTooLate: return E::kConfirmedTooLate;
        }
      }
      if (a == LockAnswer::kMissing) return E::kMissing;
      if (a == LockAnswer::kExists) return E::kExists;
      if (state_ == S::kRenewing && SentAgainWhenBusy(r, in)) return E::kBusy;
      return RenewalFailedInTime(in) ? E::kInconclusive : E::kRanOut;
    case S::kEnding:
      if (a == LockAnswer::kOk) return E::kOk;
      if (a == LockAnswer::kMissing) return E::kMissing;
      if (a == LockAnswer::kExists) return E::kError;
      if (SentAgainWhenBusy(r, in)) return E::kBusy;
      if (ReleaseFailedTooLate(in)) return E::kRanOut;
      // No host answered, or every one refused as a replica does while it
      // catches up (164, 242, 225, ...): the task already went round the
      // hosts; an end row is harmless to write again, so it is sent again
      // after a short wait until the lease ends (one replica of three down
      // must not fail a release).
      if (!outstanding_.sql.empty() && (!r.transport_ok || ReplicaLevelError(outstanding_, r))) return E::kBusy;
      return E::kError;
    default:
      return E::kError;  // no request in flight: Takes() refused the answer
  }
}

ClaimsLock::Event ClaimsLock::ClassifyClaims(const Inputs& in) const {
  if (!sighting_.inspected) return E::kGarbled;
  const LockInspection& insp = sighting_.inspection;
  // Ours, only if its insert was confirmed: a claim that may be on one
  // replica is not in every read of enough replicas, so it is ended and a
  // new one made (kOursUnseen).
  if (claimed_ && insp.ours_held && insp.holder == lock_id_) return claim_confirmed_ ? E::kOurs : E::kOursUnseen;
  if (release_requested_) return E::kCancelled;  // ends our claim, then cancels
  // Free. Ours, if written, is not visible (its answer was lost, or a
  // lagging replica): end it first, then claim afresh.
  if (!insp.exists || insp.holder == lock_id_) return claimed_ ? E::kOursUnseen : E::kFree;
  switch (JudgeHolder(insp, in)) {
    case LockVerdict::kTakeOver:
      return claimed_ ? E::kOursUnseen : E::kStale;
    case LockVerdict::kWait:
    case LockVerdict::kGiveUp:  // the back-off fails it, after our claim is ended
      return E::kHeldByOther;
  }
  return E::kHeldByOther;
}

ClaimsLock::Event ClaimsLock::Decide(const Inputs& in) const {
  switch (state_) {
    case S::kToAttempt:
    case S::kToHold:
      return release_requested_ ? E::kReleasePending : E::kGo;
    case S::kToClaim:
      return in.random.size() < 16 ? E::kNoRandom : E::kGo;
    case S::kToWithdraw:
      return claimed_ ? E::kClaimOut : E::kNoClaim;
    case S::kToBackOff:
      if (!fail_after_withdraw_.ok()) return E::kFailAfterWithdraw;
      // Time is up and the last request got no answer: not a busy lock.
      if (in.now_ms >= deadline_ms() && no_answer_.in_a_row() > 0) return E::kTimeUpUnreachable;
      // The replicas, not another process, kept the lock from us.
      if (in.now_ms >= deadline_ms() && !quorum_trouble_.ok() && !saw_live_claim_) return E::kTimeUpQuorum;
      if (in.now_ms >= deadline_ms()) return E::kTimeUp;
      return ShowsHolder() ? E::kShowHolder : E::kWait;
    case S::kToRelease:
      return InLease(in.now_ms) ? E::kGo : E::kLeaseOver;
    default:
      return E::kGo;  // not a decision: Run never asks
  }
}

}  // namespace chstate
