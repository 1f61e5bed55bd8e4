// The table lock: the lock machine (core/lock_machine.h) for one server, and
// for a Replicated database, whose DDL is serialised through Keeper. Its
// transition table is kRows in table_lock.cc, its effects are in
// table_lock_effects.cc. Made by MakeLockMachine.
//
// Algorithm (why it is exclusive):
// - Acquire is `CREATE TABLE L ENGINE = Log AS SELECT <lock id>, 0, now()` for
//   a name L derived from the state id. A CREATE of an existing name fails
//   with code 57, and of any number of concurrent creators exactly one
//   succeeds: an atomic test-and-set with no settle time.
// - The holder is the lock id of L's creation row (seq 0). A holder renews its
//   lease by inserting (lock id, 1, now()) every stale/3 and confirming it is
//   still the holder. Rows of other ids in L are ignored.
// - Takeover of a stale lock is `RENAME TABLE L TO L_dead_<hash>` where the
//   hash is of the holder's random lock id (or, for a table whose creation
//   row never became visible, of its creation time, and only after twice
//   the window). The tombstone name is unique to that lock instance and
//   stays, so however many takers judged H stale, exactly one rename
//   succeeds and a late taker can never move a newer lock (its rename
//   fails: the tombstone exists). Tombstones are removed by `chstate init`
//   once older than twice the window.
// - A CREATE or RENAME whose answer was lost is resolved by inspecting L: if
//   our id is the holder, we hold it, with the lease counted from the
//   earliest CREATE that may have landed. A DROP whose answer was lost is
//   never sent again blindly: L is inspected first, and dropped again only
//   while it is still ours.
#ifndef CHSTATE_CORE_TABLE_LOCK_H_
#define CHSTATE_CORE_TABLE_LOCK_H_

#include <string>

#include "absl/types/span.h"
#include "core/lock_table.h"

namespace chstate {

enum class TableLockState {
  kIdle,
  kCreating,        // CREATE L sent
  kCreatingSchema,  // CREATE DATABASE sent (the schema was missing)
  kInspecting,      // SELECT of L sent (acquiring)
  kAnnouncing,      // the waiter row sent, before backing off
  kBackingOff,      // the back-off timer armed
  kEntombing,       // RENAME L TO tombstone sent (stale takeover)
  kHeld,            // lease valid; renewal timer armed
  kRenewing,        // renewal INSERT sent
  kConfirming,      // SELECT of L sent after a renewal
  kReleaseInspect,  // SELECT of L sent before DROP
  kDropping,        // DROP L sent
  kReleased,        // terminal
  kFailed,          // terminal: never acquired (timeout, error, cancelled)
  kLost,            // terminal: was held, no longer ours
  // Decisions, passed through within one input:
  kToAttempt,  // an attempt starts: a pending release cancels it
  kToBackOff,  // time up? else wait, showing a live holder the waiter row first
  kToHold,     // the holder (again): a pending release starts now
  kToRelease,  // past the lease, the lock is left to expire (the last state: kStateCount)
};

enum class TableLockEvent {
  // Inputs.
  kAcquire,
  kAcquireWithoutRandom,  // fewer than 16 random bytes for the lock id
  kRelease,
  kTimer,
  kTimerPastLease,  // held: the renewal is due but the lease ran out
  // Answers, as the classifier names them.
  kOk,
  kExists,         // code 57
  kMissing,        // no such table or database (60, 81, 218)
  kMissingAgain,   // ... though the schema was just made
  kError,          // any other error answer (a refusal)
  kNoAnswer,       // a transport failure
  kUnreachable,    // ... the NoAnswerCount::kLimit-th in a row
  kMaybeLanded,    // a CREATE without an answer (or code 159): it may be ours
  kGarbled,        // an inspection that does not parse
  kFree,           // no lock: create again at once
  kFreeAgain,      // ... after three quick retries: back off first
  kOurs,           // the lock's holder is us
  kHeldByOther,    // another holder, live
  kNoHolderYet,    // a lock table whose creation row is not visible yet
  kStale,          // another holder, stale: take it over
  kStaleNoHolder,  // a table without a visible holder for twice the window
  kGiveUp,         // another live holder at our deadline
  kCancelled,      // another holder, and a release was asked for
  kInconclusive,   // a renewal (or its read) failed within the lease
  kRanOut,         // ... a renewal or DROP failed and the lease ran out
  kConfirmed,      // the renewal's read shows the lock still ours
  kTakenOver,      // ... shows another holder
  kConfirmedTooLate,  // ... ours, but the lease ran out meanwhile
  kStillOurs,      // the read before DROP shows it ours, within the lease
  kOursPastLease,  // ... ours, but the lease ran out
  kNotOurs,        // ... someone else's, or gone
  kDropLanded,     // ... our earlier DROP landed (its answer was lost)
  kRetry,          // the read before DROP failed: read again
  kLookAgain,      // the DROP got no answer: read before dropping again
  // Decisions.
  kGo,
  kReleasePending,
  kTimeUp,
  kTimeUpUnreachable,  // ... and the last request got no answer
  kShowHolder,
  kWait,
  kLeaseOver,  // the last event: kEventCount
};

class TableLock final : public TableDrivenLock<TableLock, TableLockState, TableLockEvent> {
 public:
  TableLock(const Statements& statements, std::string state_id, LockOptions options,
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
  friend class TableDrivenLock<TableLock, TableLockState, TableLockEvent>;
  static const Row kRows[];

  // ---- classifiers (table_lock.cc): the one event an input is ----
  void Observe(const SqlResponse& r);
  Event Classify(LockInput input, const SqlResponse* r, const Inputs& in) const;
  Event ClassifyAnswer(const SqlResponse& r, const Inputs& in) const;
  Event ClassifyInspection(const Inputs& in) const;
  Event ClassifyReleaseRead(const Inputs& in) const;
  Event NoLockFound() const;
  Event Decide(const Inputs& in) const;

  // ---- effects (table_lock_effects.cc) ----
  void SendCreate(const SqlResponse*, const Inputs& in);
  void MakeSchema(const SqlResponse*, const Inputs&);
  void SendInspect(const SqlResponse*, const Inputs&);
  void InspectUncertainCreate(const SqlResponse* r, const Inputs&);
  void FailUnreachableCreate(const SqlResponse* r, const Inputs& in);
  void QuickRetry(const SqlResponse*, const Inputs&);
  void SettleNoCreate(const SqlResponse*, const Inputs&);
  void Entomb(const SqlResponse*, const Inputs&);
  void EntombHolder(const SqlResponse*, const Inputs&);
  void FailLocked(const SqlResponse*, const Inputs& in);
  void WaitThenRetry(const SqlResponse*, const Inputs& in);
  void ShowHolder(const SqlResponse*, const Inputs& in);
  void Renew(const SqlResponse*, const Inputs& in);
  void Drop(const SqlResponse*, const Inputs&);
  void RetryReleaseInspect(const SqlResponse*, const Inputs&);
  void LookBeforeDropAgain(const SqlResponse*, const Inputs&);
  void LoseNotOurs(const SqlResponse*, const Inputs&);
  void LoseRanPastLeaseInRelease(const SqlResponse*, const Inputs&);
  void LoseRanOutDropping(const SqlResponse* r, const Inputs&);
  int64_t BackOffMs(const Inputs& in) const;

  // ---- the table lock's own facts ----
  int quick_retries_ = 0;         // CREATEs again at once after finding no lock
  int release_retries_ = 0;       // reads before DROP (and DROPs) tried again
  bool drop_uncertain_ = false;   // our DROP may have landed unseen
};

}  // namespace chstate

#endif  // CHSTATE_CORE_TABLE_LOCK_H_
