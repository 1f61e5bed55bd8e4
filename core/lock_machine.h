// The per-state-id advisory lock as a deterministic state machine: events in
// (SQL answers, timers, the time, random bytes), actions out (run SQL, arm a
// timer, acquired, released, failed, lost). It never reads a clock or sends
// anything itself. Every rule is one row of the transition table in
// lock_machine.cc.
//
//   chstate::LockMachine lock(statements, "dev:tap-a-to-target-b", options);
//   lock.Acquire({now_ms, random});
//   while (std::optional<chstate::LockAction> a = lock.Poll()) {
//     // kRunSql: run a->request, then lock.OnResponse(resp, {now_ms, random})
//     // kArmTimer: call lock.OnTimer(...) after a->delay_ms (replaces any earlier timer)
//     // kAcquired / kReleased / kFailed / kLost: tell the user
//   }
//
// Algorithm (why it is exclusive):
// - Acquire is `CREATE TABLE L ENGINE = Log AS SELECT <lock id>, 0, now()` for
//   a name L derived from the state id. On one server (and in a Replicated
//   database, whose DDL is serialised through Keeper) a CREATE of an existing
//   name fails with code 57, and of any number of concurrent creators exactly
//   one succeeds: an atomic test-and-set with no settle time.
// - The holder is the lock id of L's creation row (seq 0). A holder renews its
//   lease by inserting (lock id, 1, now()) every stale/3 and confirming it is
//   still the holder. Rows of other ids in L are ignored.
// - A lock is stale when the newest of its holder's rows is older than the
//   stale window (the larger of the taker's and the one the holder wrote in
//   its creation row, so contenders with different settings stay safe) by
//   the server's clock (now() - locked_at, whole seconds,
//   taken over only once the whole-second age exceeds the window, so the real
//   age is always above it). Client clocks never enter the decision.
// - A holder trusts its lock only until lease_deadline = (time it sent its
//   last confirmed create/renewal, by its own monotonic clock) + stale window
//   - margin. The server stamped that row no earlier than it was sent, so a
//   takeover happens strictly after the holder stopped trusting the lock,
//   provided clocks run at the same rate (offsets do not matter) and no
//   request is delayed by more than the margin. Writes under the lock and the
//   release's DROP are only sent while the lease is valid.
// - Takeover of a stale lock is `RENAME TABLE L TO L_dead_<hash>` where the
//   hash is of the holder's random lock id (or, for a table whose creation
//   row never became visible, of its creation time, and only after twice
//   the window). The tombstone name is unique to that lock instance and stays, so however
//   many takers judged H stale, exactly one rename succeeds and a late taker
//   can never move a newer lock (its rename fails: the tombstone exists).
//   Tombstones are removed by `chstate init` once older than twice the window.
// - Transport failures of non-idempotent requests (CREATE, RENAME) are
//   resolved by inspecting L: if our id is the holder, we hold it, with the
//   lease counted from the earliest CREATE that may have landed. A renewal
//   whose answer was lost never extends the lease.
//
// Cluster mode (Statements::cluster() enabled) takes the lock by claims
// instead (docs/cluster.md): DDL would have to wait for every replica.
// - Every claim is a row in the replicated `<table>_claims`, written with the
//   insert quorum; a read with select_sequential_consistency sees every row
//   whose insert was confirmed before the read began (any live replica that
//   is behind answers code 289 and the read goes to another one).
// - Acquire: read the claims of the id. A claim is live when it has not
//   ended and its newest row is no older than the stale window (judged as
//   above). With a live claim of another process, back off. Otherwise write
//   a claim under a fresh lock id, naming in `over` the stale claims it takes
//   over, then read again: the claim is held if it is visible and no other
//   live claim is. Else end it (a row with seq 3) and back off, with jitter.
// - Why exclusive: of two claims A and B both confirmed, the later one's
//   read began after the earlier one's insert was confirmed, so it sees the
//   earlier claim, live (its claimant read no later than it wrote); at most
//   one of any set of concurrent claimants sees no other (two may both see
//   each other and both back off: the jitter breaks the tie). A holder's
//   lease and renewals work as above; a claim judged stale had its lease end
//   before the taker read.
// - A holder's renewal is confirmed while its claim has not ended and no
//   claim names it in `over`; a release is the end row.
// - A claim whose answer was lost (or code 319) may land later: it is ended
//   before the next attempt, so it cannot block anyone once it does.
#ifndef CHSTATE_CORE_LOCK_MACHINE_H_
#define CHSTATE_CORE_LOCK_MACHINE_H_

#include <cstdint>
#include <deque>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "core/lock.h"
#include "core/sql_request.h"
#include "core/statements.h"
#include "core/task.h"

namespace chstate {

enum class LockState {
  kIdle,
  kCreating,        // CREATE L sent
  kCreatingSchema,  // CREATE DATABASE sent (the schema was missing)
  kInspecting,      // SELECT of L sent (acquiring)
  kBackingOff,      // waiting retry_ms before the next CREATE
  kEntombing,       // RENAME L TO tombstone sent (stale takeover)
  kHeld,            // lease valid; renewal timer armed
  kRenewing,        // renewal INSERT sent
  kConfirming,      // SELECT of L sent after a renewal
  kReleaseInspect,  // SELECT of L sent before DROP
  kDropping,        // DROP L sent (cluster: the claim's end row)
  kWithdrawing,     // cluster: the end row of a claim that did not win, sent
  kReleased,        // terminal
  kFailed,          // terminal: never acquired (timeout, error, cancelled)
  kLost,            // terminal: was held, no longer ours
};

const char* LockStateName(LockState s);

struct LockAction {
  enum class Kind { kRunSql, kArmTimer, kAcquired, kReleased, kFailed, kLost };
  Kind kind;
  SqlRequest request;   // kRunSql
  int64_t delay_ms = 0; // kArmTimer: fire OnTimer after this long
  absl::Status status;  // kFailed, kLost
};

// What a lock table read says. Exposed for the simulation and tests.
struct LockInspection {
  bool exists = false;
  std::string holder;  // "" while the creation row is not visible yet
  int64_t age_s = 0;   // of the holder's newest row (or of the table if no holder yet)
  int64_t created_s = 0;  // server time of the creation row (or of the table): names the instance
  int64_t stale_s = 0;    // the holder's stale window, from its creation row (0: unknown)
  int64_t table_created_s = 0;  // the table's creation time: names the instance for takers
  int64_t now_s = 0;            // the server's clock when it answered
  // Cluster mode (claims): our claim is visible, not ended, and no claim
  // names it as taken over.
  bool ours_held = false;
  // Cluster mode: the lock ids of every claim not ended but our own (all
  // stale when holder is not live): what a claim made now takes over.
  std::string over;
  // Cluster mode: claims (not ours) no reader counts any more, whose rows
  // may be removed (Statements::PruneClaims): ended, taken over by another
  // claim, or stale by their own window (so their holder's lease is over,
  // whoever reads); and rows of a claim never seen, older than a day.
  std::vector<std::string> dead;
};
// What names a lock instance's tombstone (Statements::EntombLock): the
// holder's random id, or the table's creation time while no creation row is
// visible.
std::string LockInstance(const LockInspection& inspection);
// Decodes the 5-column answer of Statements::InspectLock.
absl::StatusOr<LockInspection> ParseLockInspection(const std::string& body);
// Decodes the answer of Statements::InspectClaims for the claimant `ours`
// whose stale window is `stale_s`: exists when a claim of another process
// has not ended; holder is `ours` when ours is visible and no other live
// claim is, else the other live claim with the newest row, else the stale
// one with the newest row.
// Claims whose id starts with `own_prefix` (the claimant's earlier claims in
// the same acquisition) are left out.
absl::StatusOr<LockInspection> ParseClaimInspection(const std::string& body, const std::string& ours,
                                                    int64_t stale_s, const std::string& own_prefix = "");

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

class LockMachine {
 public:
  LockMachine(const Statements& statements, std::string state_id, LockOptions options);

  // Test-only (see LockDefectsForTesting); call before Acquire.
  void SetDefectsForTesting(const LockDefectsForTesting& defects) { defects_ = defects; }

  // Inputs. Each may queue actions; drain them with Poll() after every input.
  void Acquire(const Inputs& in);
  void Release(const Inputs& in);  // while held; while acquiring it cancels
  void OnResponse(const SqlResponse& response, const Inputs& in);
  void OnTimer(const Inputs& in);

  std::optional<LockAction> Poll();

  LockState state() const { return state_; }
  const std::string& lock_id() const { return lock_id_; }
  const std::string& state_id() const { return state_id_; }
  const LockOptions& options() const { return options_; }
  // True while held and `now_ms` is before the lease deadline: only then may
  // the holder act under the lock.
  bool LeaseValid(int64_t now_ms) const;
  int64_t lease_deadline_ms() const { return lease_deadline_ms_; }
  // While acquiring: when it gives up (the lock timeout from Acquire).
  int64_t acquire_deadline_ms() const { return deadline_ms_; }
  int64_t acquired_at_ms() const { return acquired_at_ms_; }
  // Cluster mode: a request that met code 286 waits for its timer.
  bool busy_waiting() const { return busy_resend_.has_value(); }
  // Cluster mode: the prefix of this acquisition's claims (see Claim).
  const std::string& claim_prefix() const { return claim_prefix_; }

  enum class Event { kAcquire, kRelease, kTimer, kOk, kExists, kMissing, kError };

 private:
  struct Transition;
  static const Transition kTable[];

  void Dispatch(Event e, const SqlResponse* response, const Inputs& in);
  void Send(SqlRequest r, const Inputs& in);
  void Fail(absl::Status s);
  void Lose(absl::Status s);

  // Handlers named by the transition table (all share one signature; the
  // response is null for non-SQL events).
  void StartCreate(const SqlResponse*, const Inputs& in);
  void CreateSchema(const SqlResponse* r, const Inputs& in);
  void CreateUncertain(const SqlResponse* r, const Inputs& in);
  void Inspect(const SqlResponse*, const Inputs& in);
  void NoLock(const SqlResponse*, const Inputs& in);
  void InspectFailed(const SqlResponse* r, const Inputs& in);
  // True (and failed) after kUnreachableLimit requests in a row without any answer.
  bool GiveUpUnreachable(const SqlResponse& r);
  void FailUnreachable();
  void Decide(const SqlResponse* r, const Inputs& in);
  void OnCreated(const SqlResponse*, const Inputs& in);
  void NoteRelease(const SqlResponse*, const Inputs& in);
  void Cancel(const SqlResponse*, const Inputs& in);
  void Ignore(const SqlResponse*, const Inputs& in);
  void Renew(const SqlResponse*, const Inputs& in);
  void ConfirmRenewal(const SqlResponse* r, const Inputs& in);
  void Confirmed(const SqlResponse* r, const Inputs& in);
  void RenewalInconclusive(const SqlResponse* r, const Inputs& in);
  void LoseTable(const SqlResponse*, const Inputs& in);
  void StartRelease(const SqlResponse*, const Inputs& in);
  void CheckBeforeDrop(const SqlResponse* r, const Inputs& in);
  void Dropped(const SqlResponse*, const Inputs& in);
  void ReleaseFailed(const SqlResponse* r, const Inputs& in);
  void RetryReleaseInspect(const SqlResponse* r, const Inputs& in);
  void RetryDrop(const SqlResponse* r, const Inputs& in);
  void ReleaseInspectMissing(const SqlResponse* r, const Inputs& in);
  void FailWithResponse(const SqlResponse* r, const Inputs& in);
  // A renewal, or the release's DROP or end row, met `cause` and the lease
  // ran out before it could go again: lost (kAborted), nothing more sent.
  void LeaseRanOut(const std::string& cause, const Inputs& in);
  // What a request under the lock waited out, for LeaseRanOut.
  static std::string Cause(const SqlResponse* r, absl::string_view what);
  static constexpr char kBusyCause[] =
      "code 286 (an earlier quorum write to the lock's claims is not confirmed yet)";
  // Cluster mode (claims).
  bool Claims() const { return st_.cluster().enabled(); }
  void Claim(const std::string& over, const Inputs& in);
  void ClaimDone(const SqlResponse* r, const Inputs& in);
  void DecideClaims(const LockInspection& insp, const Inputs& in);
  // Ends our claim (if one may exist) and then backs off.
  void WithdrawThenBackOff(const Inputs& in, bool short_wait);
  void Withdrawn(const SqlResponse* r, const Inputs& in);
  // A quorum insert that met another in flight (code 286: nothing written):
  // true when it is sent again after a short random wait.
  bool RetryBusy(const SqlResponse* r, const Inputs& in);
  void ResendBusy(const SqlResponse* r, const Inputs& in);
  void SchemaMaybeMade(const SqlResponse* r, const Inputs& in);
  SqlRequest InspectRequest() const;
  int64_t Jitter(const Inputs& in, int64_t base_ms) const;
  void NoteQuorumTrouble(const SqlResponse& r);

  void BackOff(const Inputs& in);
  int64_t StaleSeconds() const;
  int64_t MarginMs() const;
  void BecomeHolder(int64_t sent_at_ms, const Inputs& in);
  void Misuse(Event e);

  const Statements& st_;
  std::string state_id_;
  LockOptions options_;
  LockState state_ = LockState::kIdle;
  std::deque<LockAction> out_;
  std::string lock_id_;
  int64_t start_ms_ = 0;
  int64_t deadline_ms_ = 0;
  int64_t create_sent_at_ms_ = 0;   // when our last CREATE was sent
  int64_t renew_sent_at_ms_ = 0;    // when the renewal in flight was sent
  int64_t earliest_unresolved_create_ms_ = 0;  // first CREATE whose outcome is unknown
  int64_t lease_deadline_ms_ = 0;
  int64_t acquired_at_ms_ = 0;
  int quick_retries_ = 0;
  int unreachable_in_a_row_ = 0;  // lock requests without any answer, in a row
  absl::Status unreachable_;     // what the last of them failed with
  static constexpr int kUnreachableLimit = 3;
  int release_retries_ = 0;
  bool schema_made_ = false;
  // A release asked for while a request was in flight: when it answers, an
  // acquisition is cancelled and a held lock released (the table's rows
  // list both outcomes).
  bool release_requested_ = false;
  bool create_unresolved_ = false;  // our CREATE may have landed unseen
  bool drop_uncertain_ = false;     // our DROP may have landed unseen
  // Cluster mode: a claim of lock_id_ may exist (so it is ended before the
  // next attempt); a request to send again when the busy timer fires; and
  // until when code 286 is retried.
  bool claimed_ = false;
  std::optional<SqlRequest> busy_resend_;
  int64_t busy_until_ms_ = 0;
  bool withdraw_short_ = false;
  // An error to end with once our claim is withdrawn.
  absl::Status fail_after_withdraw_;
  // Cluster mode: the last quorum refusal (285, 286, 319) of this
  // acquisition, and whether a live claim of another process was seen since:
  // at the deadline, the cause to report instead of "locked by another".
  absl::Status quorum_trouble_;
  bool saw_live_claim_ = false;
  // Cluster mode: every claim of this acquisition is this prefix plus its
  // number in 8 hex digits (32 hex digits in all, as any lock id).
  static constexpr size_t kClaimPrefixLen = 24;
  std::string claim_prefix_;
  uint32_t claims_made_ = 0;
  // The request sent last (for a resend after code 286).
  SqlRequest outstanding_;
  LockDefectsForTesting defects_;
};

// Safety margin subtracted from the lease (drift, request delay, and the
// server's whole-second timestamps).
int64_t LeaseMarginMs(const LockOptions& options);

}  // namespace chstate

#endif  // CHSTATE_CORE_LOCK_MACHINE_H_
