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
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/lock_machine.h"
#include "core/response.h"
#include "core/store.h"
#include "core/task.h"

namespace chstate {

// Builders of step chains for one Store. Every function takes a continuation
// (`then`) that produces the step after it; failures short-circuit with
// Step::Fail unless a caller passes a failure continuation.
class StoreSteps {
 public:
  StoreSteps(Store* store, const Inputs* in) : s_(store), in_(in) {}

  using Then = std::function<Step()>;
  using OnFailure = std::function<Step(absl::Status)>;
  static Step Failed(absl::Status st) { return Step::Fail(std::move(st)); }
  const Statements& st() const { return *s_->statements_; }

  // This store holds the id's lock (a lock scope's, or lingering).
  bool HoldsLock(const std::string& id) const { return s_->held_.count(id) != 0; }
  const Inputs& inputs() const { return *in_; }

  // Keeps `p` alive as long as these steps; returns the raw pointer.
  template <typename T>
  T* Keep(std::shared_ptr<T> p) {
    keep_.push_back(p);
    return p.get();
  }

  using LockPtr = std::shared_ptr<LockMachine>;
  using LockOutcome = std::function<Step(const LockAction&)>;
  using Finish = std::function<Step(absl::StatusOr<Result>)>;

  // ---- store_steps.cc: running SQL and wording its failures, the schema,
  // one state, quorum writes, mutations, acting under a lease ----

  // Runs `req`; on success continues with the body, on failure with `fail`.
  // A request acting under a lock (UnderLease) whose failure would have
  // been sent again, once the lease ran out: kAborted, naming the failure.
  Step Sql(SqlRequest req, std::string what, std::function<Step(const std::string& body)> then,
           OnFailure fail);

  // Like Sql, decoding `columns`-wide TabSeparated rows.
  Step Query(SqlRequest req, std::string what, size_t columns, std::function<Step(const Rows& rows)> then,
             OnFailure fail);

  // Asks the server's version once per store and picks the dialect.
  Step Connected(Then then, OnFailure fail, bool force = false);

  // Cluster mode: a state table made earlier without cluster mode is a plain
  // table on one server; writing to it would silently skip replication.
  Step CheckReplicated(Then then, OnFailure fail);

  // CREATE ... IF NOT EXISTS. Cluster mode: code 159 (a host did not run the
  // ON CLUSTER DDL in time: it is down) means the live hosts ran it and the
  // others will when they are back, so the schema is there for the quorum.
  Step Ddl(SqlRequest req, std::string what, Then then, OnFailure fail);

  // The schema, each statement through Ddl in turn: the database, the
  // state, lock (and in cluster mode claims) tables, and with history on the
  // history table and the view that feeds it.
  Step EnsureSchema(Then then, OnFailure fail);
  // Runs ddl[next..] in order, then `then`.
  Step DdlInOrder(std::shared_ptr<const std::vector<std::pair<SqlRequest, std::string>>> ddl, size_t next,
                  Then then, OnFailure fail);

  // Reads one state; a missing table or database reads as "absent".
  Step ReadState(const std::string& id, std::function<Step(std::optional<MeltanoState>)> then, OnFailure fail);

  absl::StatusOr<std::string> Token();

  // Writes a whole state row, creating the schema once if it is missing.
  Step WriteState(const MeltanoState& state, Then then, OnFailure fail, bool schema_made = false);

  // Cluster mode: a write that must reach the quorum. Code 286 (another
  // quorum write to the table is in flight, or the previous one has not
  // reached its quorum yet) wrote nothing, so it is retried until the
  // deadline. Code 319 is explained: the row is on one replica and will
  // appear everywhere once another replica has it; writing again is safe.
  Step QuorumWrite(SqlRequest req, std::string what, int64_t deadline_ms, int64_t wait_ms, Then then,
                   OnFailure fail);

  // QuorumWrite's resend of `req` after `wait_ms` plus `jitter`.
  Step QuorumResend(SqlRequest req, std::string what, int64_t deadline_ms, int64_t wait_ms, int64_t jitter, Then then,
                    OnFailure fail);
  // QuorumWrite's resend when waiting `wait_ms` would outlast the lease of
  // the lock it writes under (lease_id_): the lock is renewed first.
  Step QuorumWaitPastLease(SqlRequest req, std::string what, int64_t deadline_ms, int64_t wait_ms, const char* cause,
                           Then then, OnFailure fail);

  absl::Status ExplainQuorumError(absl::Status st, int code) const;

  // Cluster mode: errors that mean "ZooKeeper is unreachable" say so, and
  // are kUnavailable (retry later) whatever ClickHouse called them.
  absl::Status ExplainCluster(absl::Status st) const;

  // A new message for `st`, keeping its payloads (the ClickHouse code).
  static absl::Status Reworded(const absl::Status& st, absl::StatusCode code, absl::string_view message);

  Step DeleteState(const std::string& id, Then then, OnFailure fail);

  // 18.x: ALTER ... DELETE returns before rows are gone; poll until done.
  Step AwaitMutations(int64_t deadline_ms, int64_t wait_ms, Then then, OnFailure fail);

  // The lock a write to `id` acts under: the one this task took
  // (WithLock), or one this store holds on `id`; null when none.
  const LockMachine* LockOf(const std::string& id) const;

  // `req` writes to `id`: under its lock, the task sends it (first, again,
  // anywhere) only before the lease ends (SqlRequest::send_before_ms; with
  // several ids, the earliest lease).
  SqlRequest UnderLease(SqlRequest req, const std::string& id);

  // A write under the lock of lease_id_ met `cause` and the lease ran out
  // before it could go again: nothing more is sent.
  absl::Status LeaseRanOut(const std::string& what, const std::string& cause, bool maybe_landed) const;

  // Writes under a lock are sent only while its lease is valid: the lock
  // this task took (WithLock), or one this store holds on `id`.
  absl::Status LeaseCheck(const std::string& id) const;

  // Ends the task with `outcome` (WithLock's default `after`).
  static Step Terminal(absl::StatusOr<Result> outcome);

  // Runs `body` under the lock for `id` and releases on every exit path. The
  // body ends by calling `finish` with its result or error; `after` gets that
  // outcome once the lock is released (by default it ends the task).
  Step WithLock(const std::string& id, std::function<Step(Finish)> body, Finish after = Terminal);

  // A Result with the server version, the dialect and the store's next
  // timeout filled in, for an operation to complete.
  Result Base() const;

  // ---- store_lock.cc: an operation's lock ----

  // Turns a LockMachine's actions into steps until it reports an outcome
  // (acquired, released, failed, lost): it sends what the machine sends (its
  // waiter rows included) and waits what it says. Renewal timers armed while
  // held are not run inside a task: the lease is checked before every write
  // instead.
  Step DriveLock(const LockPtr& m, LockOutcome on_outcome);

  // `deadline_ms`: when waiting ends (the lock timeout from the first
  // attempt); a retry after yielding to the Python backend keeps it.
  Step Acquire(const std::string& id, std::function<Step(LockPtr)> then, OnFailure fail,
               std::optional<int64_t> deadline_ms = std::nullopt);

  Step TakeLock(const std::string& id, std::function<Step(LockPtr)> then, OnFailure fail, int64_t deadline);

  // Cluster mode, just acquired by `m`: when its winning claims read held
  // kClaimsPruneAt claims of the id that no reader counts any more, they
  // are removed (kClaimsPruneAt). A failure changes nothing: they are
  // removed by a later acquisition.
  Step PruneClaims(const LockPtr& m, Then then);

  Step Release(const LockPtr& m, Then then, OnFailure fail);

  // ---- store_python_lock.cc: the Python backend's lock ----

  // A Python backend's process holds the id: try again after the retry
  // wait, or give up naming it.
  Step WaitForPython(const std::string& id, const std::string& python_lock_id, std::function<Step(LockPtr)> then,
                     OnFailure fail, int64_t deadline);

  // python_locks: the table lock is ours; now the Python backend's rows.
  // Look (a Python holder: yield), show ourselves with a marker, wait the
  // settle time (a Python process that saw the lock free before the marker
  // has written its row by then), look again. Yielding releases the table
  // lock and tries again until the deadline.
  Step ClaimFromPython(const std::string& id, const LockPtr& m, int64_t deadline, std::function<Step(LockPtr)> then,
                       OnFailure fail);

  // ---- store_lock_registry.cc: locks held between operations (renewal,
  // lingering, yielding) ----

  // Renews the lock this store holds on `id` when its renewal is due. A lock
  // found lost stays known (writes to the id are refused by LeaseCheck until
  // it is released), and the operation goes on: reading is harmless.
  Step RenewIfDue(const std::string& id, Then then, OnFailure fail);

  // Renews the lock this store holds on `id` now. `lost` gets the status
  // when the lock turned out not ours any more; `fail` any other failure.
  Step Renew(const std::string& id, Then then, OnFailure lost, OnFailure fail);

  static absl::Status LostLock(const std::string& id);

  // A lingering lock whose lease ran out (the process was paused) or that
  // was found lost is forgotten when a task starts: not ours to drop, and
  // the next acquisition starts afresh.
  void ForgetStaleLingering();

  // Releases the held lock `m` on `id` (inspection and DROP) and then
  // forgets it. It stays known until the release ends (its machine, no
  // longer holding, is neither renewed nor valid for writes meanwhile), so
  // that its lease deadline stays visible (LeaseDeadlineMs) while the DROP
  // is decided.
  Step ReleaseAndForget(const std::string& id, const LockPtr& m, Then then, OnFailure fail);

  // Releases for real the lingering lock on `id`; `then` either way (a
  // failed release leaves it to expire).
  Step ReleaseLingeringLock(const std::string& id, Then then);

  // linger_locks: looks for processes waiting for the lock on `id`. `none`
  // when there is none; when there is one (or the look fails), this store
  // stays away from the id until that process's next attempt (Acquire
  // waits) and `waiter` runs (the release for real).
  Step LookForWaiters(const std::string& id, Then none, Then waiter);

  // Tick's part for linger_locks: lingering locks idle past their time go,
  // and so do those another process now waits for (looked for every
  // WaiterCheckEveryMs while they linger).
  Step ReleaseIdleLingering(Then then);

  // Tasks of one store run one at a time, so when one starts, a held lock
  // still waiting for a renewal's answer belongs to a task that was
  // abandoned (a host that lost interest): that answer will never come.
  // Such a renewal counts as inconclusive, as a lost answer would: the lease
  // stands as last confirmed, and the lock is renewed again when due.
  void SettleAbandonedRenewals();

  // Renews, one after another, every held lock whose renewal is due; a lost
  // one ends the task with kAborted naming it.
  Step RenewAllDue(Then then, OnFailure fail);

  // Renews the lock on `id` now (the store's held lock on it, or the one
  // this task took), so that a write under it can wait longer than the
  // lease left (QuorumWaitPastLease). `then` once the renewal is confirmed
  // or inconclusive (the caller checks the lease again); `fail` when the
  // lock is not held or was found lost.
  Step RenewForWait(const std::string& id, Then then, OnFailure fail);

  // ---- store_bulk.cc: history and bulk ----

  // Rows of ListHistory / GetHistoryVersion as versions.
  static absl::StatusOr<std::vector<StateVersion>> Versions(const std::string& id, const Rows& rows);

  // After a write of `id`, one time in kHistoryUpkeepEvery (by the fresh
  // random bytes of the write's answer): the id's versions beyond
  // history_versions or older than history_days are removed. The write is
  // done either way; a failure here is left to a later write.
  Step HistoryUpkeep(const std::string& id, Then then);

  // Import: the states from `from` on, in multi-row INSERTs (see
  // Store::Import), creating the schema once if it is missing.
  Step WriteBatches(std::shared_ptr<const std::vector<MeltanoState>> all, size_t from, bool schema_made);

  // Samples the page boundaries beyond `from` into the store's export
  // cursor, then reads the next page.
  Step ExportSample(std::optional<std::string> from, int64_t limit);

  // Reads the states after `from` up to the next boundaries (as many ranges
  // as make about kDefaultExportPageBytes, at most `limit` states).
  Step ExportRange(std::optional<std::string> from, int64_t limit);

  // A failed page forgets the export (the next page samples afresh); a
  // missing table is an export of no states.
  Step ExportFailed(absl::Status st);

 private:
  Store* s_;
  const Inputs* in_;
  LockPtr current_lock_;
  std::string lease_id_;  // the id whose lease the last UnderLease request keeps to
  std::vector<std::shared_ptr<void>> keep_;
};

// A task whose body gets a StoreSteps bound to the task's inputs.
std::unique_ptr<Task> MakeTask(Store* store, std::function<Step(StoreSteps&)> body);
// A task that fails at once with `status` (bad arguments).
std::unique_ptr<Task> Invalid(absl::Status status);

}  // namespace chstate

#endif  // CHSTATE_CORE_STORE_STEPS_H_
