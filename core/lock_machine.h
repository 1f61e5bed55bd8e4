// The per-state-id advisory lock as a deterministic state machine: events in
// (SQL answers, timers, the time, random bytes), actions out (run SQL, arm a
// timer, acquired, released, failed, lost). It never reads a clock or sends
// anything itself. This header is the one interface the store, the
// simulation and the fuzzers drive; MakeLockMachine picks the algorithm:
//
// - one server (and a Replicated database): the table lock, TableLock in
//   core/table_lock.h: CREATE TABLE L is the test-and-set, a stale lock is
//   RENAMEd to a tombstone, release is DROP;
// - cluster mode (Statements::cluster() enabled): the claims lock,
//   ClaimsLock in core/claims_lock.h: rows in `<table>_claims` written with
//   the insert quorum, read back with sequential consistency.
//
// Each machine's file holds its transition table: exactly one next state per
// (state, event), the answer already classified into an event before the
// table is consulted, and the effects (the SQL to send, timers, outcomes)
// outside it. What both share (lease margin, jitter, inspections, counting
// requests without an answer, the wording of outcomes) is core/lock_common.h.
//
//   std::unique_ptr<chstate::LockMachine> lock =
//       chstate::MakeLockMachine(statements, "dev:tap-a-to-target-b", options);
//   chstate::LockOutput out = lock->Acquire({now_ms, random});
//   // Every input gives one LockOutput, as a Task's input gives one Action:
//   // out.outcome: kAcquired / kReleased / kFailed / kLost: tell the user;
//   // out.next: kRunSql: run out.request, then
//   //             out = lock->OnResponse(resp, {now_ms, random});
//   //           kWait: out = lock->OnTimer(...) after out.wait_ms (replaces
//   //             any earlier wait; out.timer says which kind it is);
//   //           kNone: nothing until the awaited answer (or a Release).
//
// Why either algorithm is exclusive, and what a holder may trust:
// - A holder trusts its lock only until lease_deadline = (time it sent its
//   last confirmed create, claim or renewal, by its own monotonic clock) +
//   stale window - margin. The server stamped that row no earlier than it
//   was sent, so a takeover (which needs the holder's newest row older than
//   the window by the server's clock) happens strictly after the holder
//   stopped trusting the lock, provided clocks run at the same rate (offsets
//   do not matter) and no request is delayed by more than the margin. Writes
//   under the lock, renewals and the release's DROP or end row are only sent
//   while the lease is valid.
// - A lock is stale when the newest of its holder's rows is older than the
//   stale window: the larger of the taker's and the holder's own (written
//   with its lock), so contenders with different settings stay safe. Whole
//   seconds of the server's clock; taken over only once the age exceeds the
//   window. Client clocks never enter the decision.
// - Transport failures of requests that may have landed are resolved by
//   reading the lock again; a renewal whose answer was lost never extends
//   the lease.
// Each machine's header explains its own algorithm.
#ifndef CHSTATE_CORE_LOCK_MACHINE_H_
#define CHSTATE_CORE_LOCK_MACHINE_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "core/lock.h"
#include "core/lock_common.h"
#include "core/sql_request.h"
#include "core/statements.h"
#include "core/task.h"
#include "core/timers.h"

namespace chstate {

// Where a lock machine is, as its driver sees it (the store's registry, the
// simulation's traces, misuse messages). Each machine has finer states of
// its own, in its table; each maps onto one of these.
enum class LockState {
  kIdle,
  kCreating,        // CREATE L sent (cluster: a claim row sent, or waiting to send it again)
  kCreatingSchema,  // CREATE DATABASE sent (cluster: or the claims table)
  kInspecting,      // SELECT of L sent (cluster: the claims read) while acquiring
  kAnnouncing,      // the waiter row sent (LockMachineOptions::write_waiter_rows), before backing off
  kBackingOff,      // waiting retry_ms before the next attempt
  kEntombing,       // RENAME L TO tombstone sent (stale takeover)
  kHeld,            // lease valid; renewal timer armed
  kRenewing,        // renewal INSERT sent (or waiting to send it again)
  kConfirming,      // SELECT of L sent after a renewal
  kReleaseInspect,  // SELECT of L sent before DROP
  kDropping,        // DROP L sent (cluster: the claim's end row, sent or waiting)
  kWithdrawing,     // cluster: the end row of a claim that did not win, sent or waiting
  kReleased,        // terminal
  kFailed,          // terminal: never acquired (timeout, error, cancelled)
  kLost,            // terminal: was held, no longer ours
};

const char* LockStateName(LockState s);

// What a timer a lock machine arms is for. OnTimer takes any of them; a
// driver that runs timers itself (the store's registry renews held locks on
// its own clock) tells them apart by this.
enum class LockTimer {
  kNone,
  kBackOff,     // the wait before the next attempt (retry_ms, or less near the deadline)
  kRenewal,     // held: the next renewal is due
  kBusyResend,  // cluster: a quorum insert answered 286 (or an end row 319) is sent again
};

// What a lock machine gives for each input: what happened, if anything, and
// what its driver does next. The same shape as a Task's Action (one output
// per input: a request to run or a wait in ms), with the lock's outcomes
// beside it, since a lock lives on after it is acquired: the input that
// acquires it also arms its first renewal (or, when a release was asked for
// meanwhile, sends the release's first request).
struct LockOutput {
  enum class Outcome { kNone, kAcquired, kReleased, kFailed, kLost };
  enum class Next { kNone, kRunSql, kWait };
  Outcome outcome = Outcome::kNone;
  absl::Status status;                 // kFailed, kLost
  Next next = Next::kNone;             // kNone: nothing until the awaited answer or an input
  SqlRequest request;                  // kRunSql
  int64_t wait_ms = 0;                 // kWait: call OnTimer after this long
  LockTimer timer = LockTimer::kNone;  // kWait: what the wait is for

  // A held lock's renewal went well (or was inconclusive, to be tried again
  // soon): nothing happened but the next renewal's wait.
  bool renewed() const { return outcome == Outcome::kNone && next == Next::kWait && timer == LockTimer::kRenewal; }
};

// Test-only: deliberately removes one defence, so that the simulation's
// negative controls (tests/sim) can show they would catch its absence. Never
// set outside tests; the default (all false) is the production machine.
struct LockDefectsForTesting {
  bool zero_margin = false;                 // lease = stale window, no margin
  bool renewal_accepts_any_holder = false;  // a renewal confirms whoever holds L
  bool ignore_holder_window = false;        // judge staleness by our window only
  bool revive_expired_lease = false;        // a renewal confirmed after the lease ran out revives it
  bool claim_without_second_read = false;   // cluster: a written claim holds, without reading again
};

// How a driver wants the machine to behave beyond the lock settings.
struct LockMachineOptions {
  // Before each back-off that follows a look at a live holder, write a
  // waiter row (Statements::AnnounceLockWaiter) naming that holder, once per
  // holder: a lingering holder in another store gives the lock up for it
  // (linger_locks). The store turns it on; the simulation's bare machines
  // keep it off.
  bool write_waiter_rows = false;
};

class LockMachine {
 public:
  virtual ~LockMachine();
  LockMachine(const LockMachine&) = delete;
  LockMachine& operator=(const LockMachine&) = delete;

  // Test-only (see LockDefectsForTesting); call before Acquire.
  void SetDefectsForTesting(const LockDefectsForTesting& defects) { defects_ = defects; }

  // Inputs, each giving one output. An input the current state does not
  // take (a response with no request outstanding, Acquire twice, Release
  // before Acquire) is misuse: kFailed (kLost while held) with
  // kFailedPrecondition.
  virtual LockOutput Acquire(const Inputs& in) = 0;
  virtual LockOutput Release(const Inputs& in) = 0;  // while held; while acquiring it cancels
  virtual LockOutput OnResponse(const SqlResponse& response, const Inputs& in) = 0;
  virtual LockOutput OnTimer(const Inputs& in) = 0;

  virtual LockState state() const = 0;
  const std::string& lock_id() const { return lock_id_; }
  const std::string& state_id() const { return state_id_; }
  const LockOptions& options() const { return options_; }
  // True while held and `now_ms` is before the lease deadline: only then may
  // the holder act under the lock.
  bool LeaseValid(int64_t now_ms) const;
  int64_t lease_deadline_ms() const { return lease_deadline_ms_; }
  // Acquiring: when the lock timeout ends.
  int64_t acquire_deadline_ms() const { return deadline_ms(); }
  int64_t acquired_at_ms() const { return acquired_at_ms_; }
  // What the answer given last showed, parsed once as it arrived: for a read
  // of the lock, the inspection, and another process holding it live (the
  // holder a waiter row names).
  const LockSighting& sighting() const { return sighting_; }
  // Cluster mode: the claims the last claims read found that no reader
  // counts any more (LockInspection::dead); after an acquisition, those its
  // winning read found, for Statements::PruneClaims.
  const std::vector<std::string>& prunable_claims() const { return prunable_claims_; }

 protected:
  LockMachine(const Statements& statements, std::string state_id, LockOptions options,
              LockMachineOptions machine_options);

  // ---- what both machines do: effects their rows name (never a change of
  // state: the row names the next state), and helpers for them ----
  void StartAcquiring(const SqlResponse*, const Inputs& in);  // lock id, deadline
  void NoteRelease(const SqlResponse*, const Inputs&);        // carried out once the answer is in
  void TakeUpRelease(const SqlResponse*, const Inputs&);      // the noted release starts
  // The holder from now, the lease counted from the CREATE (or claim) just
  // answered; ...FromRead: from the earliest one that may have landed.
  void BecomeHolder(const SqlResponse*, const Inputs& in);
  void BecomeHolderFromRead(const SqlResponse*, const Inputs& in);
  void ExtendLease(const SqlResponse*, const Inputs& in);  // a confirmed renewal
  void KeepLease(const SqlResponse*, const Inputs& in);    // an inconclusive one: try again soon
  void ArmRenewal(const SqlResponse*, const Inputs& in);
  void Shown(const SqlResponse*, const Inputs& in);        // the waiter row is in: back off
  void NotShown(const SqlResponse*, const Inputs& in);     // it failed (harmless): back off
  void CountNoAnswer(const SqlResponse* r, const Inputs&);
  void Released(const SqlResponse*, const Inputs&);
  // Outcomes.
  void FailWithoutRandom(const SqlResponse*, const Inputs&);
  void Cancel(const SqlResponse*, const Inputs&);
  void FailWithAnswer(const SqlResponse* r, const Inputs&);
  void FailGarbled(const SqlResponse*, const Inputs&);
  void FailTimeUp(const SqlResponse*, const Inputs& in);
  void FailUnreachable(const SqlResponse*, const Inputs&);
  void CountThenFailUnreachable(const SqlResponse* r, const Inputs& in);
  void LoseExpired(const SqlResponse*, const Inputs&);
  void LoseTakenOver(const SqlResponse*, const Inputs&);
  void LoseConfirmedTooLate(const SqlResponse*, const Inputs&);
  void LoseHeldPastLease(const SqlResponse*, const Inputs&);
  void LoseTable(const SqlResponse*, const Inputs&);
  void LoseRanOutRenewing(const SqlResponse* r, const Inputs&);
  void LoseReleaseFailed(const SqlResponse* r, const Inputs&);

  // The output being made for the input at hand (TakeOutput hands it over
  // at the end of the input): at most one next step and one outcome.
  void Send(SqlRequest r);
  // The two requests that act under the lock, a renewal row and the
  // release's DROP (or end row): the task sends them, first or again, only
  // within the lease (SqlRequest::send_before_ms).
  void SendRenewal(SqlRequest r);
  void SendRelease(SqlRequest r);
  void SendWaiterRow();  // names sighting_.live_holder
  void ArmTimer(LockTimer timer, int64_t delay_ms);
  void EmitFailed(absl::Status s);
  void EmitLost(absl::Status s);  // and the lease is over
  LockOutput TakeOutput();
  void NoteUnresolvedCreate();
  void HoldFrom(int64_t sent_at_ms, const Inputs& in);

  // ---- what both machines judge ----
  bool Holding() const;
  // Before the lease deadline (holding is the caller's to know).
  bool InLease(int64_t now_ms) const { return now_ms < lease_deadline_ms(); }
  int64_t StaleSeconds() const { return StaleWindowSeconds(options_); }
  int64_t MarginMs() const;
  // Another's lock as an inspection shows it: stale (take it over), live
  // (wait), or live at our deadline (give up). The holder's lease was
  // computed from its own window: never judged by a shorter one.
  LockVerdict JudgeHolder(const LockInspection& inspection, const Inputs& in) const;
  // A renewal's confirming read showed `ours` (the lock still ours or not).
  enum class Renewal { kConfirmed, kTakenOver, kTooLate };
  Renewal JudgeRenewal(bool ours, const Inputs& in) const;
  // A renewal (or its read) that failed is tried again soon while the lease
  // lasts; past it, it is not sent again and the lock is lost.
  bool RenewalFailedInTime(const Inputs& in) const;
  // The release's DROP (or end row) failed past the lease: not sent again,
  // the lock is left to expire (and said so, kAborted).
  bool ReleaseFailedTooLate(const Inputs& in) const;
  // Back off now with a waiter row first: the answer just read showed a
  // live holder this acquisition has not shown itself to yet.
  bool ShowsHolder() const;

  const Statements& st_;
  const std::string state_id_;
  const LockOptions options_;
  const LockMachineOptions machine_options_;
  LockDefectsForTesting defects_;
  LockOutput out_;  // the output of the input being handled
  bool two_steps_ = false;  // an effect chose a next step after another had (a bug: see TableDrivenLock::Run)
  std::string lock_id_;

  // ---- deadlines (on the host's clock; 0 when not set) ----
  int64_t deadline_ms_ = 0;        // acquiring: the lock timeout ends
  int64_t lease_deadline_ms_ = 0;  // held: the lease ends
  int64_t busy_until_ms_ = 0;      // cluster: 286 is resent until
  int64_t deadline_ms() const { return deadline_ms_; }
  int64_t busy_until_ms() const { return busy_until_ms_; }
  // A delay, not a deadline: the back-off decided when a live holder was
  // seen, waited once the waiter row naming it is answered (from then).
  int64_t back_off_ms_ = 0;

  // ---- facts both machines' tables consult ----
  int64_t start_ms_ = 0;                       // when Acquire came
  int64_t acquired_at_ms_ = 0;
  int64_t create_sent_at_ms_ = 0;              // our last CREATE (claim) was sent
  int64_t renew_sent_at_ms_ = 0;               // the renewal in flight was sent
  bool create_unresolved_ = false;             // our CREATE (claim) may have landed unseen
  int64_t earliest_unresolved_create_ms_ = 0;  // ... the first one whose outcome is unknown
  bool schema_made_ = false;                   // the schema was created once already
  // A release asked for while a request was in flight: when it answers, an
  // acquisition is cancelled (or ends its claim first) and a held lock is
  // released.
  bool release_requested_ = false;
  NoAnswerCount no_answer_;
  LockAnswer answer_ = LockAnswer::kOk;  // the kind of the answer being handled
  // What the last answer showed (parsed once), and the holder whom this
  // acquisition's waiter row named last (and is naming now).
  LockSighting sighting_;
  std::string announced_to_;
  std::string waiter_for_;
  // Cluster mode: the dead claims the last claims read found.
  std::vector<std::string> prunable_claims_;
  // The request sent last (the one whose answer is awaited, or is sent
  // again after code 286).
  SqlRequest outstanding_;
};

// The machine for `statements`' mode: a ClaimsLock in cluster mode, else a
// TableLock.
std::unique_ptr<LockMachine> MakeLockMachine(const Statements& statements, std::string state_id,
                                             LockOptions options, LockMachineOptions machine_options = {});

}  // namespace chstate

#endif  // CHSTATE_CORE_LOCK_MACHINE_H_
