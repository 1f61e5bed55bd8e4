// The table lock's transition table (TableLock::kRows) and its classifiers:
// what each answer (or timer, or decision) is, as one event, before the
// table is consulted. Every (state, event) the machine takes is one row with
// one next state; any other input is misuse (core/lock_table.h). The effects
// the rows name are in table_lock_effects.cc, the ones both machines share
// in lock_machine.cc.
#include "core/table_lock.h"

#include <utility>

#include "core/clickhouse_errors.h"
#include "core/response.h"

namespace chstate {

namespace {
using S = TableLockState;
using E = TableLockEvent;
using L = TableLock;
}  // namespace

// clang-format off
const TableLock::Row TableLock::kRows[] = {
    // ---- acquiring ----
    {S::kIdle,           E::kAcquire,              S::kToAttempt,      &L::StartAcquiring},
    {S::kIdle,           E::kAcquireWithoutRandom, S::kFailed,         &L::FailWithoutRandom},
    {S::kToAttempt,      E::kReleasePending,       S::kFailed,         &L::Cancel},
    {S::kToAttempt,      E::kGo,                   S::kCreating,       &L::SendCreate},
    {S::kCreating,       E::kOk,                   S::kToHold,         &L::BecomeHolder},
    {S::kCreating,       E::kExists,               S::kInspecting,     &L::SendInspect},
    {S::kCreating,       E::kMissing,              S::kCreatingSchema, &L::MakeSchema},
    {S::kCreating,       E::kMissingAgain,         S::kFailed,         &L::FailWithAnswer},
    {S::kCreating,       E::kError,                S::kFailed,         &L::FailWithAnswer},
    {S::kCreating,       E::kMaybeLanded,          S::kInspecting,     &L::InspectUncertainCreate},
    {S::kCreating,       E::kUnreachable,          S::kFailed,         &L::FailUnreachableCreate},
    {S::kCreating,       E::kTimer,                S::kCreating,       nullptr},
    {S::kCreating,       E::kRelease,              S::kCreating,       &L::NoteRelease},
    {S::kCreatingSchema, E::kOk,                   S::kToAttempt,      nullptr},
    {S::kCreatingSchema, E::kError,                S::kFailed,         &L::FailWithAnswer},
    {S::kCreatingSchema, E::kRelease,              S::kCreatingSchema, &L::NoteRelease},
    {S::kInspecting,     E::kGarbled,              S::kFailed,         &L::FailGarbled},
    {S::kInspecting,     E::kFree,                 S::kToAttempt,      &L::QuickRetry},
    {S::kInspecting,     E::kFreeAgain,            S::kToBackOff,      &L::SettleNoCreate},
    {S::kInspecting,     E::kOurs,                 S::kToHold,         &L::BecomeHolderFromRead},
    {S::kInspecting,     E::kCancelled,            S::kFailed,         &L::Cancel},
    {S::kInspecting,     E::kHeldByOther,          S::kToBackOff,      &L::SettleNoCreate},
    {S::kInspecting,     E::kNoHolderYet,          S::kToBackOff,      nullptr},
    {S::kInspecting,     E::kStale,                S::kEntombing,      &L::EntombHolder},
    {S::kInspecting,     E::kStaleNoHolder,        S::kEntombing,      &L::Entomb},
    {S::kInspecting,     E::kGiveUp,               S::kFailed,         &L::FailLocked},
    {S::kInspecting,     E::kError,                S::kFailed,         &L::FailWithAnswer},
    {S::kInspecting,     E::kNoAnswer,             S::kToBackOff,      &L::CountNoAnswer},
    {S::kInspecting,     E::kUnreachable,          S::kFailed,         &L::CountThenFailUnreachable},
    {S::kInspecting,     E::kRelease,              S::kInspecting,     &L::NoteRelease},
    {S::kEntombing,      E::kOk,                   S::kToAttempt,      nullptr},
    {S::kEntombing,      E::kMissing,              S::kToAttempt,      nullptr},
    {S::kEntombing,      E::kExists,               S::kInspecting,     &L::SendInspect},
    {S::kEntombing,      E::kError,                S::kFailed,         &L::FailWithAnswer},
    {S::kEntombing,      E::kNoAnswer,             S::kToBackOff,      &L::CountNoAnswer},
    {S::kEntombing,      E::kUnreachable,          S::kFailed,         &L::CountThenFailUnreachable},
    {S::kEntombing,      E::kRelease,              S::kEntombing,      &L::NoteRelease},
    {S::kToBackOff,      E::kTimeUpUnreachable,    S::kFailed,         &L::FailUnreachable},
    {S::kToBackOff,      E::kTimeUp,               S::kFailed,         &L::FailTimeUp},
    {S::kToBackOff,      E::kShowHolder,           S::kAnnouncing,     &L::ShowHolder},
    {S::kToBackOff,      E::kWait,                 S::kBackingOff,     &L::WaitThenRetry},
    {S::kAnnouncing,     E::kOk,                   S::kBackingOff,     &L::Shown},
    {S::kAnnouncing,     E::kError,                S::kBackingOff,     &L::NotShown},
    {S::kAnnouncing,     E::kRelease,              S::kAnnouncing,     &L::NoteRelease},
    {S::kBackingOff,     E::kTimer,                S::kToAttempt,      nullptr},
    {S::kBackingOff,     E::kRelease,              S::kFailed,         &L::Cancel},
    // ---- holding ----
    {S::kToHold,         E::kReleasePending,       S::kToRelease,      &L::TakeUpRelease},
    {S::kToHold,         E::kGo,                   S::kHeld,           &L::ArmRenewal},
    {S::kHeld,           E::kTimer,                S::kRenewing,       &L::Renew},
    {S::kHeld,           E::kTimerPastLease,       S::kLost,           &L::LoseExpired},
    {S::kHeld,           E::kRelease,              S::kToRelease,      nullptr},
    {S::kRenewing,       E::kOk,                   S::kConfirming,     &L::SendInspect},
    {S::kRenewing,       E::kInconclusive,         S::kToHold,         &L::KeepLease},
    {S::kRenewing,       E::kRanOut,               S::kLost,           &L::LoseRanOutRenewing},
    {S::kRenewing,       E::kMissing,              S::kLost,           &L::LoseTable},
    {S::kRenewing,       E::kExists,               S::kFailed,         &L::FailWithAnswer},
    {S::kRenewing,       E::kTimer,                S::kRenewing,       nullptr},
    {S::kRenewing,       E::kRelease,              S::kRenewing,       &L::NoteRelease},
    {S::kConfirming,     E::kConfirmed,            S::kToHold,         &L::ExtendLease},
    {S::kConfirming,     E::kTakenOver,            S::kLost,           &L::LoseTakenOver},
    {S::kConfirming,     E::kConfirmedTooLate,     S::kLost,           &L::LoseConfirmedTooLate},
    {S::kConfirming,     E::kMissing,              S::kLost,           &L::LoseTable},
    {S::kConfirming,     E::kInconclusive,         S::kToHold,         &L::KeepLease},
    {S::kConfirming,     E::kRanOut,               S::kLost,           &L::LoseRanOutRenewing},
    {S::kConfirming,     E::kExists,               S::kFailed,         &L::FailWithAnswer},
    {S::kConfirming,     E::kTimer,                S::kConfirming,     nullptr},
    {S::kConfirming,     E::kRelease,              S::kConfirming,     &L::NoteRelease},
    // ---- releasing ----
    {S::kToRelease,      E::kLeaseOver,            S::kLost,           &L::LoseHeldPastLease},
    {S::kToRelease,      E::kGo,                   S::kReleaseInspect, &L::SendInspect},
    {S::kReleaseInspect, E::kStillOurs,            S::kDropping,       &L::Drop},
    {S::kReleaseInspect, E::kOursPastLease,        S::kLost,           &L::LoseRanPastLeaseInRelease},
    {S::kReleaseInspect, E::kNotOurs,              S::kLost,           &L::LoseNotOurs},
    {S::kReleaseInspect, E::kDropLanded,           S::kReleased,       &L::Released},
    {S::kReleaseInspect, E::kMissing,              S::kLost,           &L::LoseTable},
    {S::kReleaseInspect, E::kRetry,                S::kReleaseInspect, &L::RetryReleaseInspect},
    {S::kReleaseInspect, E::kError,                S::kLost,           &L::LoseReleaseFailed},
    {S::kReleaseInspect, E::kTimer,                S::kReleaseInspect, nullptr},
    {S::kReleaseInspect, E::kRelease,              S::kReleaseInspect, nullptr},
    {S::kDropping,       E::kOk,                   S::kReleased,       &L::Released},
    {S::kDropping,       E::kMissing,              S::kReleased,       &L::Released},
    {S::kDropping,       E::kRanOut,               S::kLost,           &L::LoseRanOutDropping},
    {S::kDropping,       E::kLookAgain,            S::kReleaseInspect, &L::LookBeforeDropAgain},
    {S::kDropping,       E::kError,                S::kLost,           &L::LoseReleaseFailed},
    {S::kDropping,       E::kTimer,                S::kDropping,       nullptr},
    {S::kDropping,       E::kRelease,              S::kDropping,       nullptr},
    // ---- after the end: a renewal timer armed while held may still fire ----
    {S::kReleased,       E::kTimer,                S::kReleased,       nullptr},
    {S::kLost,           E::kTimer,                S::kLost,           nullptr},
    {S::kFailed,         E::kTimer,                S::kFailed,         nullptr},
    {S::kReleased,       E::kRelease,              S::kReleased,       nullptr},
};
// clang-format on

absl::Span<const TableLock::Row> TableLock::Rows() { return kRows; }

TableLock::TableLock(const Statements& statements, std::string state_id, LockOptions options,
                     LockMachineOptions machine_options)
    : TableDrivenLock(statements, std::move(state_id), options, machine_options) {}

LockState TableLock::Public(State s) {
  switch (s) {
    case S::kIdle: return LockState::kIdle;
    case S::kCreating: return LockState::kCreating;
    case S::kCreatingSchema: return LockState::kCreatingSchema;
    case S::kInspecting: return LockState::kInspecting;
    case S::kAnnouncing: return LockState::kAnnouncing;
    case S::kBackingOff: return LockState::kBackingOff;
    case S::kEntombing: return LockState::kEntombing;
    case S::kHeld: return LockState::kHeld;
    case S::kRenewing: return LockState::kRenewing;
    case S::kConfirming: return LockState::kConfirming;
    case S::kReleaseInspect: return LockState::kReleaseInspect;
    case S::kDropping: return LockState::kDropping;
    case S::kReleased: return LockState::kReleased;
    case S::kFailed: return LockState::kFailed;
    case S::kLost: return LockState::kLost;
    // Decisions are never seen between inputs; the holder's are holding.
    case S::kToAttempt: return LockState::kInspecting;
    case S::kToBackOff: return LockState::kBackingOff;
    case S::kToHold: return LockState::kHeld;
    case S::kToRelease: return LockState::kHeld;
  }
  return LockState::kFailed;
}

bool TableLock::IsDecision(State s) {
  return s == S::kToAttempt || s == S::kToBackOff || s == S::kToHold || s == S::kToRelease;
}

const char* TableLock::StateName(State s) {
  switch (s) {
    case S::kToAttempt: return "to-attempt";
    case S::kToBackOff: return "to-back-off";
    case S::kToHold: return "to-hold";
    case S::kToRelease: return "to-release";
    default: return LockStateName(Public(s));
  }
}

LockInput TableLock::InputOf(Event e) {
  switch (e) {
    case E::kAcquire:
    case E::kAcquireWithoutRandom: return LockInput::kAcquire;
    case E::kRelease: return LockInput::kRelease;
    case E::kTimer:
    case E::kTimerPastLease: return LockInput::kTimer;
    case E::kGo:
    case E::kReleasePending:
    case E::kTimeUp:
    case E::kTimeUpUnreachable:
    case E::kShowHolder:
    case E::kWait:
    case E::kLeaseOver: return LockInput::kDecision;
    default: return LockInput::kAnswer;
  }
}

const char* TableLock::EventName(Event e) {
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
    case E::kMaybeLanded: return "maybe-landed";
    case E::kGarbled: return "garbled";
    case E::kFree: return "free";
    case E::kFreeAgain: return "free-again";
    case E::kOurs: return "ours";
    case E::kHeldByOther: return "held-by-other";
    case E::kNoHolderYet: return "no-holder-yet";
    case E::kStale: return "stale";
    case E::kStaleNoHolder: return "stale-no-holder";
    case E::kGiveUp: return "give-up";
    case E::kCancelled: return "cancelled";
    case E::kInconclusive: return "inconclusive";
    case E::kRanOut: return "ran-out";
    case E::kConfirmed: return "confirmed";
    case E::kTakenOver: return "taken-over";
    case E::kConfirmedTooLate: return "confirmed-too-late";
    case E::kStillOurs: return "still-ours";
    case E::kOursPastLease: return "ours-past-lease";
    case E::kNotOurs: return "not-ours";
    case E::kDropLanded: return "drop-landed";
    case E::kRetry: return "retry";
    case E::kLookAgain: return "look-again";
    case E::kGo: return "go";
    case E::kReleasePending: return "release-pending";
    case E::kTimeUp: return "time-up";
    case E::kTimeUpUnreachable: return "time-up-unreachable";
    case E::kShowHolder: return "show-holder";
    case E::kWait: return "wait";
    case E::kLeaseOver: return "lease-over";
  }
  return "?";
}

// ---- classifiers ----

void TableLock::Observe(const SqlResponse& r) {
  sighting_ = LockSighting{};
  const bool read = state_ == S::kInspecting || state_ == S::kConfirming || state_ == S::kReleaseInspect;
  if (!read || answer_ != LockAnswer::kOk) return;
  absl::StatusOr<LockInspection> insp = ParseLockInspection(r.body);
  if (!insp.ok()) {
    sighting_.garbled = insp.status();
    return;
  }
  sighting_.inspected = true;
  sighting_.inspection = *std::move(insp);
  const LockInspection& seen = sighting_.inspection;
  if (seen.exists && !seen.holder.empty() && seen.holder != lock_id_) sighting_.live_holder = seen.holder;
}

TableLock::Event TableLock::Classify(LockInput input, const SqlResponse* r, const Inputs& in) const {
  switch (input) {
    case LockInput::kAcquire:
      return in.random.size() < 16 ? E::kAcquireWithoutRandom : E::kAcquire;
    case LockInput::kRelease:
      return E::kRelease;
    case LockInput::kTimer:
      return state_ == S::kHeld && !InLease(in.now_ms) ? E::kTimerPastLease : E::kTimer;
    case LockInput::kAnswer:
      return ClassifyAnswer(*r, in);
    case LockInput::kDecision:
      break;
  }
  return Decide(in);
}

TableLock::Event TableLock::ClassifyAnswer(const SqlResponse& r, const Inputs& in) const {
  const LockAnswer a = answer_;
  switch (state_) {
    case S::kCreating:
      if (a == LockAnswer::kOk) return E::kOk;
      if (a == LockAnswer::kExists) return E::kExists;
      if (a == LockAnswer::kMissing) return schema_made_ ? E::kMissingAgain : E::kMissing;
      // No answer, or code 159 (a DDL that some host did not run in time
      // ran on the others): the CREATE may have landed. Inspecting settles it.
      if (r.transport_ok && ResponseCode(r) != ch::kTimeoutExceeded) return E::kError;
      return no_answer_.WouldGiveUp() ? E::kUnreachable : E::kMaybeLanded;
    case S::kCreatingSchema:
      return a == LockAnswer::kOk ? E::kOk : E::kError;
    case S::kInspecting:
      if (a == LockAnswer::kOk) return ClassifyInspection(in);
      if (a == LockAnswer::kMissing) return NoLockFound();
      if (a == LockAnswer::kExists || r.transport_ok) return E::kError;
      return no_answer_.WouldGiveUp() ? E::kUnreachable : E::kNoAnswer;
    case S::kAnnouncing:
      return a == LockAnswer::kOk ? E::kOk : E::kError;
    case S::kEntombing:
      if (a == LockAnswer::kOk) return E::kOk;
      if (a == LockAnswer::kMissing) return E::kMissing;
      if (a == LockAnswer::kExists) return E::kExists;  // a racer's tombstone: look again
      if (r.transport_ok) return E::kError;
      return no_answer_.WouldGiveUp() ? E::kUnreachable : E::kNoAnswer;
    case S::kRenewing:
    case S::kConfirming:
      if (a == LockAnswer::kOk) {
        if (state_ == S::kRenewing) return E::kOk;
        const LockInspection& seen = sighting_.inspection;
        const bool ours = sighting_.inspected && seen.exists && seen.holder == lock_id_;
        switch (JudgeRenewal(ours, in)) {
          case Renewal::kConfirmed: return E::kConfirmed;
          case Renewal::kTakenOver: return E::kTakenOver;
          case Renewal::kTooLate: return E::kConfirmedTooLate;
        }
      }
      if (a == LockAnswer::kMissing) return E::kMissing;
      if (a == LockAnswer::kExists) return E::kExists;
      return RenewalFailedInTime(in) ? E::kInconclusive : E::kRanOut;
    case S::kReleaseInspect:
      if (a == LockAnswer::kOk) return ClassifyReleaseRead(in);
      if (a == LockAnswer::kMissing) return drop_uncertain_ ? E::kDropLanded : E::kMissing;
      if (a == LockAnswer::kExists) return E::kError;
      // An inconclusive look before the DROP is worth repeating while the
      // lease lasts: giving up leaves the lock in place for a whole window.
      return release_retries_ < 3 && in.now_ms < lease_deadline_ms() ? E::kRetry : E::kError;
    case S::kDropping:
      if (a == LockAnswer::kOk) return E::kOk;
      if (a == LockAnswer::kMissing) return E::kMissing;
      if (a == LockAnswer::kExists) return E::kError;
      if (ReleaseFailedTooLate(in)) return E::kRanOut;
      // Never resent blindly: if the first one landed, another process may
      // have created a fresh lock under the same name since. Look first.
      if (!r.transport_ok && release_retries_ < 3 && in.now_ms < lease_deadline_ms()) return E::kLookAgain;
      return E::kError;
    default:
      return E::kError;  // no request in flight: Takes() refused the answer
  }
}

TableLock::Event TableLock::NoLockFound() const {
  // No table at all: our CREATE did not land (or was long taken over).
  return quick_retries_ < 3 ? E::kFree : E::kFreeAgain;
}

TableLock::Event TableLock::ClassifyInspection(const Inputs& in) const {
  if (!sighting_.inspected) return E::kGarbled;
  const LockInspection& insp = sighting_.inspection;
  if (!insp.exists) return NoLockFound();
  if (insp.holder == lock_id_) return E::kOurs;
  if (release_requested_) return E::kCancelled;
  // Another holder, or none visible yet: ours may still be the one whose
  // creation row is not visible, so only a known other holder settles it.
  switch (JudgeHolder(insp, in)) {
    case LockVerdict::kTakeOver:
      return insp.holder.empty() ? E::kStaleNoHolder : E::kStale;
    case LockVerdict::kWait:
      return insp.holder.empty() ? E::kNoHolderYet : E::kHeldByOther;
    case LockVerdict::kGiveUp:
      return E::kGiveUp;
  }
  return E::kGiveUp;
}

TableLock::Event TableLock::ClassifyReleaseRead(const Inputs& in) const {
  const LockInspection& insp = sighting_.inspection;
  const bool ours = sighting_.inspected && insp.exists && insp.holder == lock_id_;
  // Our earlier DROP landed; the lock there now is someone else's.
  if (sighting_.inspected && drop_uncertain_ && !ours) return E::kDropLanded;
  if (!ours) return E::kNotOurs;
  if (in.now_ms >= lease_deadline_ms()) return E::kOursPastLease;
  return E::kStillOurs;
}

TableLock::Event TableLock::Decide(const Inputs& in) const {
  switch (state_) {
    case S::kToAttempt:
    case S::kToHold:
      return release_requested_ ? E::kReleasePending : E::kGo;
    case S::kToBackOff:
      if (in.now_ms >= deadline_ms() && no_answer_.in_a_row() > 0) return E::kTimeUpUnreachable;
      if (in.now_ms >= deadline_ms()) return E::kTimeUp;
      return ShowsHolder() ? E::kShowHolder : E::kWait;
    case S::kToRelease:
      return InLease(in.now_ms) ? E::kGo : E::kLeaseOver;
    default:
      return E::kGo;  // not a decision: Run never asks
  }
}

}  // namespace chstate
