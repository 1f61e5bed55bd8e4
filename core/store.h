// The state store: every operation Meltano (and the `chstate` tool) performs
// on ClickHouse, as Tasks a host drives (see core/task.h).
//
//   chstate::StoreOptions opts;
//   opts.schema = "meltano"; opts.table = "state"; opts.endpoint = "127.0.0.1:8123";
//   absl::StatusOr<std::unique_ptr<chstate::Store>> store = chstate::Store::Create(opts);
//   std::unique_ptr<chstate::Task> t = (*store)->Update(incoming_state);   // lock, get, merge, set, unlock
//
// The store remembers the server's dialect after the first task asks for
// `SELECT version()`. It must outlive its tasks; tasks of one store run one at
// a time (the store is not thread-safe).
//
// The error contract. Every task ends in kDone or kFailed with one of these
// codes (abseil's guide for what the caller does); the message names the
// cause, the endpoint or state id, and the fix, never the password.
//   kInvalidArgument     bad input: a state id (empty, too long, ...), store
//                        options, a glob, a malformed document. Fix the input;
//                        nothing was sent. Also: an unknown cluster name.
//   kUnavailable         no answer from ClickHouse, or a server-side condition
//                        that passes (overloaded, code 159/202/209/210/425, no
//                        ZooKeeper, too few live replicas). The core already
//                        resent what was safe to resend (core/task.h); retry
//                        the operation later. For a write whose answer was
//                        lost (or code 319, after one resend: docs/cluster.md)
//                        the outcome is unknown: writing the same state again
//                        is safe (a state is one row).
//   kUnauthenticated     wrong user or password: fix the settings.
//   kPermissionDenied    the user lacks a right on the state schema (a
//                        grant; on 18.x its allow_databases, allow_ddl or
//                        readonly profile): docs/operations.md lists them.
//   kNotFound            Copy/Move/MergeFrom: the source id has no state;
//                        Rollback: the history holds no such version;
//                        ForceUnlock: the id is not locked. (A missing table
//                        reads as "absent", never as this.)
//   kAborted             retry at a higher level: AcquireLock and every locked
//                        operation (Set, Update, Delete, MergeFrom, Copy,
//                        Move) when another holder kept the lock past the lock
//                        timeout; a write, Tick or RenewLock when this store's
//                        lock ran out or was taken over (nothing was written
//                        under it): release it and start again.
//   kCancelled           AcquireLock: released before it was acquired.
//   kFailedPrecondition  don't retry until fixed: ReleaseLock/RenewLock of a
//                        lock this store does not hold; a server older than
//                        18.16; cluster mode over a state table that is not
//                        replicated; a host calling a task out of order.
//   kDeadlineExceeded    Delete/Move on 18.x: the delete's
//                        mutation was accepted but still runs after
//                        mutation_timeout_ms (it finishes on the server).
//   kDataLoss            ClickHouse sent a truncated or malformed answer, or a
//                        stored row is not valid JSON; nothing was changed by
//                        reading it. Retry; a corrupt row needs `chstate set`.
//   kInternal            any other ClickHouse exception (its code and text are
//                        in the message), or a bug in the lock machine.
//                        (kAlreadyExists and kUnknown only reach a caller for
//                        an answer the lock did not expect: treat as kInternal.)
#ifndef CHSTATE_CORE_STORE_H_
#define CHSTATE_CORE_STORE_H_

#include <algorithm>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/defaults.h"
#include "core/diagnostics.h"
#include "core/dialect.h"
#include "core/lock.h"
#include "core/lock_machine.h"
#include "core/state.h"
#include "core/statements.h"
#include "core/task.h"

namespace chstate {

struct StoreOptions {
  std::string schema = "meltano";
  std::string table = "state";
  // "host:port", only used in messages (with `hosts` and no endpoint, the
  // list of hosts).
  std::string endpoint;
  // The servers to talk to (docs/cluster.md). Empty: the host's one
  // server, and requests carry no endpoint. Given: every request names the
  // one it goes to, chosen by the core (core/endpoints.h): the host that
  // answered last while it is well, each other host in turn after a failure.
  // More than one needs cluster mode (different servers are different data).
  std::vector<Endpoint> hosts;
  // With hosts: a host that failed is skipped this long.
  int64_t host_down_ms = kDefaultHostDownMs;
  LockOptions lock;
  // How long a legacy (18.x) delete may take to finish its mutation.
  int64_t mutation_timeout_ms = kDefaultMutationTimeoutMs;
  // Resends after transport failures, and every request's timeout.
  TransportPolicy transport;
  // Cluster mode when cluster.name is set (core/statements.h): writes wait
  // for cluster.quorum replicas, at most cluster.quorum_timeout_ms; a write
  // refused because an earlier one is unconfirmed (code 286) is retried for
  // cluster.quorum_busy_ms.
  ClusterOptions cluster;
  // State history (docs/cli.md "History and rollback"): versions are kept this many
  // days; 0 creates no history table (an existing one is still fed).
  int64_t history_days = kDefaultHistoryDays;
  // ... and at most this many versions per id (0: no limit). Both are kept
  // as writes go (kHistoryUpkeepEvery) and by Init.
  int64_t history_versions = kDefaultHistoryVersions;
  // A mixed fleet with the Python ClickHouse backend on one schema (README
  // "Migrating from the Python backend"): a holder also shows itself in
  // `<table>_lock` the way that backend does, and yields to its rows.
  bool python_locks = false;
  // The lock off the hot path (docs/lock.md): ReleaseLock keeps the
  // lock held by this store (lingering) for kDefaultLockLingerMs, renewed as
  // usual, and the next AcquireLock of the id takes it back with no request.
  // A lingering lock is released for real when it was idle that long (at a
  // Tick: the host must call back at NextTimeoutMs even while idle), by
  // ReleaseLingering, or when another process waits for it (acquirers show
  // themselves with a row in the lock table as they back off; the holder
  // looks at most every kDefaultLockWaiterCheckMs as it releases; in
  // cluster mode those rows are claims rows naming the holder). Ignored with
  // python_locks.
  bool linger_locks = false;
  // What the store tells its host (core/diagnostics.h): the level it starts
  // with (the host may change it: Store::diagnostics), and whether
  // statements shown at debug level keep states' contents.
  DiagnosticLevel diagnostics = DiagnosticLevel::kNone;
  bool diagnostics_show_states = false;
};

class Store {
 public:
  static absl::StatusOr<std::unique_ptr<Store>> Create(StoreOptions options);

  // Server version and dialect; always asks the server (a round trip).
  std::unique_ptr<Task> Ping();
  // CREATE DATABASE / state table / lock table (and, with history_days, the
  // history table and its view) IF NOT EXISTS; removal of history older than
  // history_days and of lock tombstones older than twice the stale window
  // (Result.count: how many tombstones). `chstate init` and `chstate compact`.
  std::unique_ptr<Task> Init();
  // Result.state: nullopt when absent. A missing table reads as absent.
  std::unique_ptr<Task> Get(std::string state_id);
  // Overwrites both sides under the id's lock: the one this store holds (a
  // lock scope: written only within its lease, else kAborted and nothing is
  // written), or taken for the write and released after. Result.state: what
  // was written.
  std::unique_ptr<Task> Set(MeltanoState state);
  // Meltano's update(): under the lock, ApplyUpdate(current, incoming), set.
  // When this store already holds the id's lock (AcquireLock), it reads,
  // merges and writes under that lock (within its lease) without taking it
  // again.
  std::unique_ptr<Task> Update(MeltanoState incoming);
  // Removes the id's state under its lock, as Set takes it.
  std::unique_ptr<Task> Delete(std::string state_id);
  // Merges the merged view of `src`'s state into `dst` as Update does
  // (`meltano state merge --from-state-id`). kNotFound when src has none;
  // kInvalidArgument (nothing written) when that view is empty, or lacks a
  // top-level "singer_state" key and `force` is false.
  std::unique_ptr<Task> MergeFrom(std::string src, std::string dst, bool force);
  // Result.state_ids, sorted; `glob` uses Meltano's * and ?.
  std::unique_ptr<Task> List(std::optional<std::string> glob);
  // Result.count: states removed.
  std::unique_ptr<Task> ClearAll();
  // One page of an export (Meltano's get_all, `chstate export`): up to
  // `limit` states matching `glob` (all when nullopt), sorted by id, after
  // the id `after` (from the first when nullopt), in Result.states.
  // Result.more: more may follow, so ask for the next page after this one's
  // last id; a page is never empty while more follow. A missing table reads
  // as no states.
  // Each page is one SELECT ... FINAL of a range of ids, so the server reads
  // each row about once in the whole export: the ranges come from a sample
  // of the id column taken by the first page (after nullopt, or an `after`
  // other than the last id of the page this store returned last), and about
  // kDefaultExportPageBytes of states, by the size of those read so far.
  // With `document`, the page is the text of the export document's entries
  // (Result::document, AppendExportEntry) and its ids (Result::state_ids),
  // not states: what `chstate export` writes, made without parsing the states.
  std::unique_ptr<Task> ExportPage(std::optional<std::string> glob, std::optional<std::string> after,
                                   int64_t limit = kDefaultExportPageStates, bool document = false);
  // Writes every state, overwriting (Meltano's set_all, `chstate import`):
  // all are validated first (kInvalidArgument naming the entry, nothing
  // sent), then written by multi-row INSERTs of at most import_batch_states
  // states and import_batch_bytes of SQL. Takes no lock. Result.count:
  // states written. A failure part-way names how many were written;
  // importing the same states again is safe.
  std::unique_ptr<Task> Import(std::vector<MeltanoState> states);
  // The same for rows as ParseExportDocumentRows reads them from an export
  // document's text (the `import_document` verb): sorted by id, no id twice
  // (kInvalidArgument otherwise, nothing sent); written as they are.
  std::unique_ptr<Task> ImportRows(std::vector<StoredState> rows);
  // The state's versions, newest first, at most `limit` (Result.versions);
  // the one the state table holds now is marked current and listed first
  // among versions written in the same second. A missing history reads as
  // no versions.
  std::unique_ptr<Task> History(std::string state_id, int64_t limit = kDefaultHistoryLimit);
  // Restores `version` (as History names it) under the id's lock: the
  // restored state is written as a new version (Result.state). kNotFound
  // when the history holds no such version; kInvalidArgument for a name
  // that is not "<unix ms>-<8 hex digits>".
  std::unique_ptr<Task> Rollback(std::string state_id, std::string version);
  // Every lock held now (Result.locks), sorted by table; with `glob`, only
  // those of ids matching it. Ids are found through the state table (a lock
  // table is named by a hash of its id): a lock on an id with no state yet
  // is listed without its id, and only when no glob is given.
  std::unique_ptr<Task> Locks(std::optional<std::string> glob);
  // Removes the id's lock whoever holds it (`chstate unlock --force`): the
  // lock table is moved to its tombstone as a takeover does, so its holder
  // finds it lost at its next renewal. Result.locks: the lock removed.
  // kNotFound when the id is not locked.
  std::unique_ptr<Task> ForceUnlock(std::string state_id);
  // dst := src (under dst's lock). kNotFound when src is absent.
  std::unique_ptr<Task> Copy(std::string src, std::string dst);
  // Copy, then delete src under src's lock.
  std::unique_ptr<Task> Move(std::string src, std::string dst);
  // Result.lock_id. kAborted (naming the id) when the timeout passes. The
  // store keeps the held lock until ReleaseLock.
  std::unique_ptr<Task> AcquireLock(std::string state_id);
  // kFailedPrecondition without a request when this store does not hold the
  // lock with that id (a release by a process that never acquired). kAborted
  // when the lock was lost while held (a renewal found it taken over) or its
  // lease ran out before the release: the lock is forgotten, and the error
  // says that what was done under it was not exclusive.
  std::unique_ptr<Task> ReleaseLock(std::string state_id, std::string lock_id);
  // Renews the lease of a lock this store holds (hosts holding a lock for
  // long call it every stale/3). kAborted when the lock was lost: the holder
  // must stop acting under it. Result.lock_id is set.
  std::unique_ptr<Task> RenewLock(std::string state_id);
  // True while this store holds the lock and its lease is valid at now_ms.
  bool LeaseValid(const std::string& state_id, int64_t now_ms) const;
  // The held lock's lease deadline on the host's clock, also while it is
  // being released (0 when not held).
  int64_t LeaseDeadlineMs(const std::string& state_id) const;

  // The store's timers. A lock this store holds is renewed a third of the
  // stale window after it was taken or last renewed; any operation on that
  // id renews it first when due, and a host that holds a lock without using
  // it (waiting on a child process, a long computation) calls Tick at
  // NextTimeoutMs(), which every Result also carries as next_timeout_ms.
  // Tick renews every held lock that is due; kAborted, naming the id, when
  // one turned out lost (it is then no longer held: stop acting under it).
  std::unique_ptr<Task> Tick();
  // Releases for real every lock lingering after ReleaseLock (linger_locks):
  // a host calls it before it goes away. Result.count: how many.
  std::unique_ptr<Task> ReleaseLingering();
  // Releases every lock this store holds or keeps lingering (the end of a
  // store: a host closing it). Best effort: a lock whose release fails is
  // forgotten and expires after its validity. Result.count: how many.
  std::unique_ptr<Task> Close();
  // The earliest time (on the host's clock) Tick has work, or nullopt.
  std::optional<int64_t> NextTimeoutMs() const;

  const StoreOptions& options() const { return options_; }
  // What the store tells a person watching it (core/diagnostics.h); a host
  // sets the level it wants and takes them (Connection::PollDiagnostic).
  Diagnostics& diagnostics() { return diagnostics_; }
  // Every deadline the store keeps: its tasks' waits, its held locks'
  // renewals and lingering, yields, hosts marked down (core/timers.h).
  const TimerTable& timers() const { return timers_; }
  // Known after the first task connected.
  std::optional<Dialect> dialect() const;
  const std::string& server_version() const { return server_version_; }

 private:
  explicit Store(StoreOptions options) : options_(std::move(options)) {
    options_.transport.diagnostics = &diagnostics_;
    options_.transport.timers = &timers_;
    diagnostics_.set_level(options_.diagnostics);
    diagnostics_.set_redact_states(!options_.diagnostics_show_states);
  }
  friend class StoreSteps;

  Diagnostics diagnostics_;
  // Every deadline the store and its tasks keep (core/timers.h).
  TimerTable timers_;
  StoreOptions options_;
  std::optional<Statements> statements_;
  // Locks taken by AcquireLock and not yet released. Their deadlines are in
  // timers_, keyed by the state id: kRenewal (the next renewal: the lock
  // machine's own timer, on the host's clock), kWaiterLook (when this holder
  // may next look for processes waiting for the lock) and, while lingering,
  // kLinger (when it is released for real if not taken back).
  struct HeldLock {
    std::shared_ptr<LockMachine> machine;
    // linger_locks: released by its user but kept (and renewed) until its
    // kLinger deadline, for the next AcquireLock of the id.
    bool lingering = false;
    // False once the lock was found lost: kept until ReleaseLock so that
    // writes to the id stay refused, but never renewed again.
    bool Live() const { return machine->state() == LockState::kHeld; }
    // Between tasks: a renewal whose task was abandoned mid-request.
    bool AbandonedRenewal() const {
      return machine->state() == LockState::kRenewing || machine->state() == LockState::kConfirming;
    }
  };
  std::map<std::string, HeldLock> held_;
  // The deadline of (kind, id) in timers_ (0 when none).
  int64_t TimerAt(TimerKind kind, const std::string& id) const { return timers_.At(kind, id).value_or(0); }
  // Forgets the held lock `it` and its deadlines.
  std::map<std::string, HeldLock>::iterator ForgetHeld(std::map<std::string, HeldLock>::iterator it) {
    for (TimerKind k : {TimerKind::kRenewal, TimerKind::kWaiterLook, TimerKind::kLinger}) timers_.Clear(k, it->first);
    return held_.erase(it);
  }
  // Cluster mode: when this store last removed each id's old claims (on the
  // host's clock; see kClaimsPruneAt).
  std::map<std::string, int64_t> claims_pruned_ms_;
  // Ids this store stays away from until then (it yielded their lingering
  // lock to a waiting process), on the host's clock.
  std::map<std::string, int64_t> away_until_ms_;
  bool Lingers() const { return options_.linger_locks && !options_.python_locks; }
  // How often a lingering holder looks for waiting processes.
  int64_t WaiterCheckEveryMs() const { return std::min(kDefaultLockWaiterCheckMs, options_.lock.retry_ms / 2); }
  std::string server_version_;
  uint64_t writes_ = 0;
  // The export in progress (ExportPage), kept between its pages.
  struct ExportCursor {
    std::optional<std::string> glob;
    // The last id of the page returned last: a page asked for after it
    // continues this export; any other starts afresh.
    std::optional<std::string> after;
    // Sampled ids beyond `after`, ascending: the pages' upper ends.
    std::deque<std::string> bounds;
    // The sample reached the last id: nothing beyond bounds.back() was left
    // unsampled (else it is sampled again once bounds run out).
    bool sampled_to_end = false;
    // Bytes of a state in the answers so far (0: none read yet).
    int64_t bytes_per_state = 0;
  };
  std::optional<ExportCursor> export_;
};

}  // namespace chstate

#endif  // CHSTATE_CORE_STORE_H_
