// StoreSteps: the steps every store operation is built from. Internal to
// core/store*.cc (not a public header of the core).
#ifndef CHSTATE_CORE_STORE_STEPS_H_
#define CHSTATE_CORE_STORE_STEPS_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/lock_machine.h"
#include "core/op.h"
#include "core/response.h"
#include "core/store.h"
#include "core/task.h"

namespace chstate {

// What one task of a Store works with: the store's options, statements,
// held locks and timers, the task's inputs, and the wording of failures.
// The operations and their parts (below) are built on it.
class StoreSteps {
 public:
  StoreSteps(Store* store, const Inputs* in) : s_(store), in_(in) {}

  const Statements& st() const { return *s_->statements_; }

  // This store holds the id's lock (a lock scope's, or lingering).
  bool HoldsLock(const std::string& id) const { return s_->held_.count(id) != 0; }
  const Inputs& inputs() const { return *in_; }

  using LockPtr = std::shared_ptr<LockMachine>;

  // What one task knows of its store (the parts read and write these).
  const StoreOptions& options() const { return s_->options_; }
  std::optional<Statements>& statements_slot() { return s_->statements_; }
  void set_server_version(std::string v) { s_->server_version_ = std::move(v); }
  const std::string& lease_id() const { return lease_id_; }
  void set_current_lock(LockPtr m) { current_lock_ = std::move(m); }

  // Tells the store's host what happened (core/diagnostics.h), at `level`.
  void Tell(DiagnosticKind kind, DiagnosticLevel level, const std::string& state_id, std::string message,
            std::vector<std::pair<std::string, int64_t>> numbers = {},
            std::vector<std::pair<std::string, std::string>> texts = {});

  // ---- store_task.cc: answers and their wording, leases, diagnostics
  // (SqlPart is in store_steps.cc, HistoryUpkeepPart and FlushHistoryPart in store_bulk.cc) ----

  // The body of the answer to `r` (a Reply::kAnswer), or its failure
  // worded for `what`: a request acting under a lock (UnderLease) whose
  // failure would have been sent again, once the lease ran out, is kAborted
  // naming the failure; cluster trouble is explained (ExplainCluster).
  absl::StatusOr<std::string> Answer(const Reply& r, absl::string_view what) const;
  // Like Answer, decoding `columns`-wide TabSeparated rows.
  absl::StatusOr<Rows> AnswerRows(const Reply& r, absl::string_view what, size_t columns) const;

  // Runs `req` for its success alone (fails with the answer's failure).
  std::unique_ptr<Op> SqlPart(SqlRequest req, std::string what);

  std::unique_ptr<Op> HistoryUpkeepPart(const std::string& id);
  // One server: the history buffer written into its table (Statements::
  // FlushHistory) before a read of the history; meant for Next::Try.
  std::unique_ptr<Op> FlushHistoryPart();

  // A token naming one write (insert deduplication), from the fresh random
  // bytes: kInvalidArgument when the host gave fewer than 16.
  absl::StatusOr<std::string> Token();

  absl::Status ExplainQuorumError(absl::Status st, int code) const;

  // Cluster mode: errors that mean "ZooKeeper is unreachable" say so, and
  // are kUnavailable (retry later) whatever ClickHouse called them.
  absl::Status ExplainCluster(absl::Status st) const;

  // A new message for `st`, keeping its payloads (the ClickHouse code).
  static absl::Status Reworded(const absl::Status& st, absl::StatusCode code, absl::string_view message);

  // The lock a write to `id` acts under: the one this task is taking or took
  // (current_lock_), or one this store holds on `id`; null when none.
  const LockMachine* LockOf(const std::string& id) const;

  // `req` writes to `id`: under its lock, the task sends it (first, again,
  // anywhere) only before the lease ends (SqlRequest::send_before_ms; with
  // several ids, the earliest lease).
  SqlRequest UnderLease(SqlRequest req, const std::string& id);

  // A write under the lock of lease_id_ met `cause` and the lease ran out
  // before it could go again: nothing more is sent.
  absl::Status LeaseRanOut(const std::string& what, const std::string& cause, bool maybe_landed) const;

  // Writes under a lock are sent only while its lease is valid: the lock
  // LockOf(id) finds.
  absl::Status LeaseCheck(const std::string& id) const;

  // Tells that the lock `m` was taken after `waited_ms` (lock_acquired).
  void TellAcquired(const LockMachine& m, int64_t waited_ms, bool waited_for_another);

  // A Result with the server version, the dialect and the store's next
  // timeout filled in, for an operation to complete; with the state it
  // read or wrote, when given.
  Result Base(std::optional<MeltanoState> state = std::nullopt) const;

  // ---- store_lock_registry.cc and store_lock_scope.cc: locks held
  // between operations (renewal, lingering, yielding) ----

  static absl::Status LostLock(const std::string& id);

  // A lingering lock whose lease ran out (the process was paused) or that
  // was found lost is forgotten when a task starts: not ours to drop, and
  // the next acquisition starts afresh.
  void ForgetStaleLingering();

  // Tasks of one store run one at a time, so when one starts, a held lock
  // still waiting for a renewal's answer belongs to a task that was
  // abandoned (a host that lost interest): that answer will never come.
  // Such a renewal counts as inconclusive, as a lost answer would: the lease
  // stands as last confirmed, and the lock is renewed again when due.
  void SettleAbandonedRenewals();

  // Renews the lock this store holds on `id` when its renewal is due (a lock
  // found lost stays known and the operation goes on: reading is harmless).
  std::unique_ptr<Op> RenewIfDuePart(const std::string& id);
  // Renews the lock on `id` now (the store's held lock on it, or the one
  // this task took), so that a write under it can wait longer than the
  // lease left (QuorumWrite).
  std::unique_ptr<Op> RenewForWaitPart(const std::string& id);

  // The store's held locks and marks, for the registry's parts.
  std::map<std::string, Store::HeldLock>& held() { return s_->held_; }
  // The store's deadlines for the held lock on `id` (and its yield mark),
  // in its timer table.
  int64_t TimerAt(TimerKind kind, const std::string& id) const { return s_->TimerAt(kind, id); }
  void SetTimer(TimerKind kind, const std::string& id, int64_t at_ms) { s_->timers_.Set(kind, id, at_ms); }
  void ClearTimer(TimerKind kind, const std::string& id) { s_->timers_.Clear(kind, id); }
  std::map<std::string, Store::HeldLock>::iterator ForgetHeld(std::map<std::string, Store::HeldLock>::iterator it) {
    return s_->ForgetHeld(it);
  }
  const LockPtr& current_lock() const { return current_lock_; }
  // Keeps `m` (just acquired) as held by the store, renewed at renew_at_ms;
  // it may look for waiters once WaiterCheckEveryMs has passed.
  void Hold(const std::string& id, LockPtr m, int64_t renew_at_ms) {
    s_->held_[id] = Store::HeldLock{std::move(m)};
    SetTimer(TimerKind::kRenewal, id, renew_at_ms);
    SetTimer(TimerKind::kWaiterLook, id, in_->now_ms + s_->WaiterCheckEveryMs());
    ClearTimer(TimerKind::kLinger, id);
  }
  bool Lingers() const { return s_->Lingers(); }
  // Cluster mode: when this store last pruned each id's dead claims.
  std::map<std::string, int64_t>& claims_pruned_ms() { return s_->claims_pruned_ms_; }
  // Ids this store stays away from until then (it yielded their lock).
  std::map<std::string, int64_t>& away_until_ms() { return s_->away_until_ms_; }
  int64_t WaiterCheckEveryMs() const { return s_->WaiterCheckEveryMs(); }

  // ---- store_bulk.cc: history and bulk ----

  // Rows of ListHistory / GetHistoryVersion as versions.
  static absl::StatusOr<std::vector<StateVersion>> Versions(const std::string& id, const Rows& rows);
  // The export in progress, kept by the store between its pages.
  using ExportCursor = Store::ExportCursor;
  std::optional<ExportCursor>& export_cursor() { return s_->export_; }

 private:
  Store* s_;
  const Inputs* in_;
  LockPtr current_lock_;
  std::string lease_id_;  // the id whose lease the last UnderLease request keeps to
};

// A part of a store operation (core/op.h): it runs with its task's StoreSteps.
class StorePart : public Op {
 protected:
  explicit StorePart(StoreSteps& s) : s_(s) {}
  StoreSteps& s_;
};

// The parts every operation is built from (store_steps.cc).
namespace part {
// Asks the server's version (once per store unless `force`) and picks the
// dialect; in cluster mode checks that the state table is replicated.
std::unique_ptr<Op> Connect(StoreSteps& s, bool force = false);
// The schema, each CREATE ... IF NOT EXISTS in turn (cluster mode: code 159
// counts as done).
std::unique_ptr<Op> EnsureSchema(StoreSteps& s);
// Reads one state into *out (nullopt when absent or the table is missing).
// Cluster mode: read from enough replicas that one has the newest confirmed
// write; `for_write` (a read-modify-write's read) fails when they cannot be
// reached, other reads take what the replicas reached show.
std::unique_ptr<Op> ReadState(StoreSteps& s, std::string id, std::optional<MeltanoState>* out, bool for_write = false);
// Writes a whole state row under the id's lock if held, making the schema
// once if missing, then keeps its history in bounds.
std::unique_ptr<Op> WriteState(StoreSteps& s, MeltanoState state);
// A write that must reach the quorum in cluster mode (286/252 waited out
// until `deadline_ms`); one send otherwise.
std::unique_ptr<Op> QuorumWrite(StoreSteps& s, SqlRequest req, std::string what, int64_t deadline_ms,
                                int64_t wait_ms);
// Removes one state under its lock if held (18.x: waits for the mutation).
std::unique_ptr<Op> DeleteState(StoreSteps& s, std::string id);
// Runs `body` under the lock for `id`, taken for it and released on every
// exit path; ends with the body's result.
std::unique_ptr<Op> Locked(StoreSteps& s, std::string id, std::unique_ptr<Op> body);

// ---- store_lock.cc: an operation's lock ----

// A cluster claims read (SqlRequest::each_replica, Statements::InspectClaims)
// asked of enough replicas that one of them has every confirmed claim; the
// answers, joined, into *out (a failure as it came, or one that says how few
// replicas answered).
std::unique_ptr<Op> ReadClaims(StoreSteps& s, SqlRequest req, SqlResponse* out);
// The same for any read whose answer ends with the replica row
// (Statements::GetState in cluster mode): `what` is read ("the state"),
// `item` is what a quorum confirms ("a write"); with `fewer_ok`, a read that
// could not reach enough replicas ends with the answers it has instead of
// failing.
std::unique_ptr<Op> ReadEachReplica(StoreSteps& s, SqlRequest req, std::string what, std::string item,
                                    bool fewer_ok, SqlResponse* out);

// The input a DriveLock gives the lock machine first.
enum class LockStart { kAcquire, kRelease, kTimer };
// Gives the lock machine `m` the input `start`, then sends what it sends and
// waits what it says until its outcome, into *out; *waited (when given) is
// set when a back-off followed a read that found another process holding
// the lock.
std::unique_ptr<Op> DriveLock(StoreSteps& s, StoreSteps::LockPtr m, LockStart start, LockOutput* out,
                              bool* waited = nullptr);
// Takes the lock on `id` (waiting up to the lock timeout), into *out;
// *waited says whether it waited for another process; *renew_in_ms (when
// given) is when the machine's first renewal is due, from now.
std::unique_ptr<Op> Acquire(StoreSteps& s, std::string id, StoreSteps::LockPtr* out, bool* waited,
                            int64_t* renew_in_ms = nullptr);
// Releases `m` (with python_locks, its marker first).
std::unique_ptr<Op> Release(StoreSteps& s, StoreSteps::LockPtr m);

// ---- store_lock_registry.cc: the parts that keep held locks ----

// Renews the held lock on `id` now; fails with the reason when it is not
// renewed, *lost saying whether the lock turned out not ours any more.
std::unique_ptr<Op> Renew(StoreSteps& s, std::string id, bool* lost);
// Renews every held lock whose renewal is due (Tick).
std::unique_ptr<Op> RenewAllDue(StoreSteps& s);
// Releases for real every lingering lock idle past its linger time (Tick).
std::unique_ptr<Op> ReleaseIdleLingering(StoreSteps& s);
// Releases for real the lingering lock on `id`; done either way.
std::unique_ptr<Op> ReleaseLingeringLock(StoreSteps& s, std::string id);
// Releases the held lock `m` on `id`, then forgets it however that went.
std::unique_ptr<Op> ReleaseAndForget(StoreSteps& s, std::string id, StoreSteps::LockPtr m);
// Looks for processes waiting for the lingering lock on `id` (*waiter).
std::unique_ptr<Op> LookForWaiters(StoreSteps& s, std::string id, bool* waiter);

// ---- store_python_lock.cc: the Python backend's lock ----

// python_locks, the table lock just taken: claims the id from the Python
// backend (block number, look, marker, look again with the block number);
// *holder names a Python process found holding it, *busy says a block was
// committed to its table between the looks (neither: the id is ours).
std::unique_ptr<Op> ClaimFromPython(StoreSteps& s, StoreSteps::LockPtr m, std::string* holder, bool* busy);
// How far in the future (s) a marker row is stamped (docs/lock.md).
int64_t MarkerAheadS(const StoreOptions& o);
// The failure when a Python backend's process kept the id past the timeout.
absl::Status PythonHolds(const StoreOptions& o, const std::string& id, const std::string& python_lock_id);
}  // namespace part

// A task that runs the operation `make` builds (now, with the task's
// StoreSteps; the op looks at the store only once the task starts: tasks
// queue).
std::unique_ptr<Task> MakeOpTask(Store* store, absl::FunctionRef<std::unique_ptr<Op>(StoreSteps&)> make);
// A task that fails at once with `status` (bad arguments).
std::unique_ptr<Task> Invalid(absl::Status status);

}  // namespace chstate

#endif  // CHSTATE_CORE_STORE_STEPS_H_
