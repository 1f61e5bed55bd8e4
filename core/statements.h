// The SQL for every operation, per dialect. This is the only file that writes
// SQL text; every name and value in it passes through core/quoting.h.
//
//   absl::StatusOr<chstate::Statements> st =
//       chstate::Statements::Create(chstate::Dialect::kModern, "meltano", "state");
//   chstate::SqlRequest req = st->GetState("dev:tap-a-to-target-b");
//
// Result formats are TabSeparated, decoded by core/response.h.
//
// Cluster mode (ClusterOptions::name set; docs/cluster.md):
// - every DDL is `... ON CLUSTER <name>` (serialised through the distributed
//   DDL queue in ZooKeeper; it returns when every host ran it), with
//   wait_end_of_query=1 and a bounded distributed_ddl_task_timeout;
// - the state table is ReplicatedReplacingMergeTree at
//   <zookeeper_path>/<schema>/<table>, replica <replica>;
// - writes carry insert_quorum (and insert_quorum_timeout; modern servers
//   also insert_quorum_parallel=0), reads select_sequential_consistency=1;
//   18.x writes send insert_deduplicate=0 so that A, B, A and two equal
//   writes in a row all land (18.16 has no insert_deduplication_token);
// - a delete is a tombstone row (completed_state = kTombstone) written with
//   the quorum, and reads skip tombstones: 18.16 mutations are asynchronous
//   and never touch the part of the last quorum insert, and TRUNCATE breaks
//   sequentially consistent reads (code 289) until the next quorum insert;
// - a lock table is created ON CLUSTER as a ReplicatedMergeTree whose
//   ZooKeeper path is unique to the lock instance, so CREATE (code 57 for
//   every creator but the first in the DDL queue) stays the test-and-set
//   across replicas; renewals are quorum inserts.
// The settings travel as URL parameters (18.16 has no SETTINGS clause on
// INSERT and no session here).
#ifndef CHSTATE_CORE_STATEMENTS_H_
#define CHSTATE_CORE_STATEMENTS_H_

#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/defaults.h"
#include "core/dialect.h"
#include "core/sql_request.h"
#include "core/state.h"

namespace chstate {

// Cluster mode settings (empty name: one server, no replication).
struct ClusterOptions {
  std::string name;
  std::string zookeeper_path = "/clickhouse/tables/{shard}";
  std::string replica = "{replica}";
  // Replicas that must confirm a write (at least 2; kDefaultQuorum).
  int quorum = kDefaultQuorum;
  // How long a quorum write waits for the other replicas (code 319 after).
  int64_t quorum_timeout_ms = kDefaultQuorumTimeoutMs;
  // How long a write refused with code 286 is retried.
  int64_t quorum_busy_ms = kDefaultQuorumBusyMs;
  // How long ON CLUSTER DDL waits for every host (code 159 after).
  int64_t ddl_timeout_s = kDefaultDdlTimeoutS;

  bool enabled() const { return !name.empty(); }
};

// How long the Python ClickHouse backend counts a lock row as live (its
// STALE_LOCK_SECONDS, and the TTL of `<table>_lock`).
inline constexpr int64_t kPythonLockWindowS = 300;
// The prefix of chstate's marker rows in `<table>_lock`. '!' sorts before
// every character of a uuid4 (bytewise in ClickHouse, by code point in
// Python), so a visible marker is the min() the Python backend computes.
inline constexpr const char* kLockMarkerPrefix = "!chstate:";
// The prefix releases before 2026-12-06 wrote ("chstate:..."); their rows
// are still chstate's markers, never a Python process's.
inline constexpr const char* kOldLockMarkerPrefix = "chstate:";

// Export samples only ids up to this long as page boundaries, so a sample
// of `count` ids stays small whatever ids the table holds.
inline constexpr int64_t kMaxSampledIdBytes = 1024;

// ClickHouse's default max_query_size: the bytes of a query the SQL parser
// takes (rows after VALUES are data, not bound by it).
inline constexpr size_t kDefaultMaxQuerySize = 262144;

// The first field of the row that ends an answer of InspectClaims, naming
// the replica that gave it (no lock id looks like it: they are hex).
inline constexpr const char* kClaimsReplicaRow = "#replica";

// The completed_state of a tombstone row (cluster mode deletes): not JSON, so
// no state written by chstate or Meltano can look like it.
inline constexpr const char* kTombstone = "chstate:deleted";

class Statements {
 public:
  // kInvalidArgument when schema or table is not a valid identifier, or the
  // cluster settings hold characters that cannot go into DDL.
  static absl::StatusOr<Statements> Create(Dialect dialect, absl::string_view schema, absl::string_view table,
                                           ClusterOptions cluster = {});

  Dialect dialect() const { return dialect_; }
  const std::string& schema() const { return schema_; }
  const std::string& table() const { return table_; }
  const ClusterOptions& cluster() const { return cluster_; }

  // Dialect-independent: the first request on every connection.
  static SqlRequest SelectVersion();

  SqlRequest CreateDatabase() const;
  SqlRequest CreateStateTable() const;
  // `<table>_lock`, the Python backend's lock table: created so that both
  // tools can share a schema.
  SqlRequest CreateLockTable() const;

  // ---- history: every version of every state (docs/cli.md "History and rollback") ----
  // `<table>_history`: the state table's columns, a MergeTree ordered by
  // (state_id, updated_at), partitioned by month; on modern servers with a
  // TTL of `days`. Fed by CreateHistoryView on every insert into the state
  // table, by chstate or the Python backend alike: no request of its own.
  SqlRequest CreateHistoryTable(int64_t days) const;
  // One server: `<table>_history_buffer`, a Buffer in front of the history
  // table, so that the view's rows collect in the server's memory and reach
  // the table as one part per flush instead of one per write (a write of
  // the state then costs about one plain INSERT; docs/operations.md). Not in
  // cluster mode (HistoryBuffered): a read through another replica would
  // not see a buffer's rows.
  bool HistoryBuffered() const;
  SqlRequest CreateHistoryBuffer() const;
  // The materialized view from the state table: `<table>_history_buffer_mv`
  // into the buffer on one server, `<table>_history_mv` into the table in
  // cluster mode.
  SqlRequest CreateHistoryView() const;
  // One server: drops `<table>_history_mv`, the view that schemas made
  // before the buffer have (after the buffered one exists).
  SqlRequest DropUnbufferedHistoryView() const;
  // One server: writes the buffer's rows into the history table (OPTIMIZE
  // TABLE of the buffer), so that the reads below see every version; a
  // schema without a buffer answers code 60, harmless.
  SqlRequest FlushHistory() const;
  // Removes versions older than `days` (an ALTER ... DELETE: 18.x has no TTL).
  SqlRequest ExpireHistory(int64_t days) const;
  // Removes all but the newest `keep` versions of each state id (several
  // written in one second of 18.x count as one).
  SqlRequest TrimHistory(int64_t keep) const;
  // One row (versions of `state_id`, how many are older than `days`, unix ms
  // of its newest version beyond the newest `keep`, 0 when none or keep is 0).
  SqlRequest HistoryOverLimits(absl::string_view state_id, int64_t keep, int64_t days) const;
  // Removes `state_id`'s versions written at or before `cutoff_ms` (0: none
  // by count) and those older than `days`: an ALTER ... DELETE on both
  // dialects (asynchronous, so the write it follows does not wait for it).
  SqlRequest TrimHistoryOf(absl::string_view state_id, int64_t cutoff_ms, int64_t days) const;
  // Rows (unix ms, hash8, updated_at as UTC text, partial_state,
  // completed_state) of `state_id`'s versions, newest first, at most `limit`.
  // A version's name is "<unix ms>-<hash8>": its write time and the first 8
  // hex digits of cityHash64 of its two sides, stable across reads.
  SqlRequest ListHistory(absl::string_view state_id, int64_t limit) const;
  // The same rows for the one version named by (ms, hash8): none or more.
  SqlRequest GetHistoryVersion(absl::string_view state_id, int64_t unix_ms, absl::string_view hash8) const;

  // One row (partial_state, completed_state) or none.
  SqlRequest GetState(absl::string_view state_id) const;
  // Writes a whole state row. NULL for an empty side. `dedup_token` must be
  // unique per write: modern servers deduplicate identical insert blocks.
  // With `fence_lock_id` (the id's table lock, held by the writer) the row is
  // fenced: the server writes it only if that lock is the one its lock table
  // holds when the INSERT runs, and answers code 395 (FUNCTION_THROW_IF_VALUE_
  // IS_NON_ZERO), or 60 naming the lock table, when it is not. A request run
  // late (after a takeover, or after the release) then writes nothing.
  // Cluster mode has no lock table (the claims lock): never fenced.
  SqlRequest InsertState(absl::string_view state_id, const std::optional<std::string>& partial_json,
                         const std::optional<std::string>& completed_json, absl::string_view dedup_token,
                         absl::string_view fence_lock_id = "") const;
  // Many whole state rows in one INSERT (import), NULL for an empty side.
  using StateRow = StoredState;
  SqlRequest InsertStates(const std::vector<StateRow>& rows, absl::string_view dedup_token) const;
  // One row of such an INSERT as its SQL text, ('id', NULL, '{...}'): its
  // size plus 2 (the ", " between rows) is what it adds to the statement.
  static std::string StateRowSql(const StateRow& row);
  // The INSERT of rows given as StateRowSql's texts (import counts their
  // exact size as it builds a batch).
  SqlRequest InsertStateRows(const std::vector<std::string>& rows_sql, absl::string_view dedup_token) const;
  // Export: up to `limit` rows (state_id, partial_state, completed_state),
  // sorted by id, of the ids matching `glob` (all when nullopt) that sort
  // after `after` (from the first when nullopt) and not after `upto` (to the
  // last when nullopt): one page, a range of the primary key.
  SqlRequest ExportStates(const std::optional<std::string>& glob, const std::optional<std::string>& after,
                          const std::optional<std::string>& upto, int64_t limit) const;
  // Export's page boundaries: rows (state_id, 1), sorted, at most `count`, of
  // about one id in `every` among those matching `glob` that sort after
  // `after`, read from the id column alone (one cheap scan).
  SqlRequest SampleStateIds(const std::optional<std::string>& glob, const std::optional<std::string>& after,
                            int64_t every, int64_t count) const;
  SqlRequest DeleteState(absl::string_view state_id) const;
  // kClickHouse18 only: one row, the number of unfinished mutations of the
  // state table. DeleteState is done when it reads 0.
  SqlRequest PendingMutations() const;
  // State ids (one column), sorted; all of them when `glob` is nullopt.
  SqlRequest ListStateIds(const std::optional<std::string>& glob) const;
  // One row: the number of state ids.
  SqlRequest CountStates() const;
  SqlRequest TruncateStates() const;
  // One row (engine name) when the state table exists, none otherwise. Cluster
  // mode refuses a state table that is not replicated.
  SqlRequest StateTableEngine() const;
  // What `clear --all` runs: TruncateStates on one server; in cluster mode one
  // quorum INSERT ... SELECT of a tombstone for every live state.
  SqlRequest ClearStates() const;

  // ---- per-id lock: a table whose name is derived from the state id ----
  // (core/lock_machine.h explains the algorithm.)
  // The name: `<table>_lock_<16 hex digits of FNV-1a 64 of the id>`. Two ids
  // that collide share a lock, which only costs concurrency.
  std::string LockTableName(absl::string_view state_id) const;
  // Creates the lock table with its creation row (lock_id, seq 0, now(),
  // the holder's stale window in seconds). Fails with code 57 when the lock
  // table exists: the atomic test-and-set.
  SqlRequest CreateLock(absl::string_view state_id, absl::string_view lock_id, int64_t stale_s) const;
  // Rows (lock_id, seq, unix time, server now, stale_s): the lock's rows, plus
  // one row ("", 255, table creation time, now, 0) from system.tables. Code
  // 60, or zero rows, when the lock table does not exist.
  SqlRequest InspectLock(absl::string_view state_id) const;
  // The same for a lock table named `name` (`chstate locks`, which finds
  // tables before it knows their ids).
  SqlRequest InspectLockTable(absl::string_view name) const;
  // ---- a mixed fleet with the Python ClickHouse backend (docs/lock.md) ----
  // That backend locks by rows in `<table>_lock` (state_id, lock_id,
  // locked_at), a ReplacingMergeTree(locked_at) ORDER BY state_id: a
  // holder's row is live for kPythonLockWindowS. chstate's holder shows
  // itself there with a marker row, lock_id kLockMarkerPrefix + its lock id
  // (it wins every min() of lock ids), stamped `ahead_s` seconds in the
  // future: a merge keeps the row with the greatest locked_at, so no Python
  // row written while the marker stands can merge it away, and a FINAL read
  // picks it. The holder renews it, `ahead_s` ahead again, before each
  // renewal of its lock.
  SqlRequest InsertLockMarker(absl::string_view state_id, absl::string_view lock_id, int64_t ahead_s) const;
  SqlRequest DeleteLockMarker(absl::string_view state_id, absl::string_view lock_id) const;
  // Rows (lock_id, 1) of live rows for `state_id` that are not chstate's
  // markers: a Python backend process holds the lock, or is trying to.
  SqlRequest ForeignLockRows(absl::string_view state_id) const;
  // One row (n, 2): the greatest block number of `<table>_lock`'s active
  // parts. A MergeTree numbers a part's block as it commits it, so every
  // insert committed after this read is in a part whose greatest block
  // number is greater.
  SqlRequest PythonLockBlocks() const;
  // ForeignLockRows and, after them, one row (n, 2): the active parts of
  // `<table>_lock` with a block after `after_block`, a merged one (several
  // blocks) counted twice. 1: the marker's own insert is the only part
  // committed since PythonLockBlocks read `after_block`.
  SqlRequest ForeignLockRowsAndParts(absl::string_view state_id, int64_t after_block) const;

  // The names of the live lock tables (one column, plus the constant), sorted:
  // not the Python backend's `<table>_lock`, not tombstones.
  SqlRequest ListLockTables() const;
  // A lease renewal row (lock_id, seq 1, now(), stale_s).
  SqlRequest RenewLock(absl::string_view state_id, absl::string_view lock_id, int64_t stale_s) const;
  SqlRequest DropLock(absl::string_view state_id) const;
  // An acquirer backing off from a held lock shows itself to the holder: a
  // row with seq 2 in the lock table (inspections only read the holder's
  // rows). Fails harmlessly (code 60) when the table is gone meanwhile.
  // Cluster mode: a quorum row with seq 2 in the claims, naming the holder
  // it waits for in `over`.
  SqlRequest AnnounceLockWaiter(absl::string_view state_id, absl::string_view lock_id,
                                absl::string_view holder = "") const;
  // A lingering holder's look for such rows: a row per waiter (at most one).
  // Cluster mode: rows naming `holder`.
  SqlRequest LockWaiters(absl::string_view state_id, absl::string_view holder = "") const;
  // Moves a stale lock instance to its tombstone `<lock>_dead_<16 hex>`; the
  // suffix hashes `instance` (holder id and creation time), so exactly one
  // taker of that instance succeeds and the rename of any later instance to
  // the same name fails (code 57).
  SqlRequest EntombLock(absl::string_view state_id, absl::string_view instance) const;
  std::string TombstoneName(absl::string_view state_id, absl::string_view instance) const;
  // Tombstones (one column: name, plus the constant) created before
  // `older_than_s` seconds ago, and the DROP for one of them.
  SqlRequest ListOldTombstones(int64_t older_than_s) const;
  SqlRequest DropTable(absl::string_view name) const;

  // ---- cluster mode: the lock as claims (core/lock_machine.h) ----
  // `<table>_claims`, one ReplicatedMergeTree for every id's lock: rows
  // (name, lock_id, seq, at, stale_s, over), name = LockTableName(id); seq 0
  // a claim (with the claimant's stale window and the comma-separated lock
  // ids it takes over as stale), 1 a renewal, 3 the end of a claim (its
  // release, its withdrawal after losing a race, or `unlock --force`). Every
  // row is a quorum insert. A claims read sees every row whose insert was
  // confirmed before it began because it reaches replicas - quorum + 1
  // replicas (part::ReadClaims), each read as it is: 18.16's sequential
  // consistency would only add that a replica behind the last quorum insert
  // answers 289 instead, which makes the lock wait while it catches up.
  std::string ClaimsTable() const;
  SqlRequest CreateClaimsTable() const;
  SqlRequest ClaimLock(absl::string_view state_id, absl::string_view lock_id, int64_t stale_s,
                       absl::string_view over) const;
  SqlRequest RenewClaim(absl::string_view state_id, absl::string_view lock_id, int64_t stale_s) const;
  // Idempotent: ending a claim twice changes nothing.
  SqlRequest EndClaim(absl::string_view state_id, absl::string_view lock_id) const;
  // Rows per lock id of the name: (lock_id, claims, ends, newest row's unix
  // time, the claim's stale_s, the claim's `over`, server now). No rows: no
  // claim at all. Code 60 without the table.
  SqlRequest InspectClaims(absl::string_view state_id) const;
  // Removes the rows of the claims `lock_ids` of the id (ParseClaimInspection's
  // dead ones): an ALTER ... DELETE, asynchronous and replicated by the table;
  // removing them twice is harmless. A waiter's row (seq 2) goes only after
  // an hour, so that a holder still sees a process that waits.
  SqlRequest PruneClaims(absl::string_view state_id, const std::vector<std::string>& lock_ids) const;
  // `chstate locks` in cluster mode: per (name, lock_id) of every claim,
  // (name, lock_id, claimed at, newest row, stale_s, now, end rows, over).
  SqlRequest ListClaims() const;

 private:
  Statements(Dialect d, std::string schema, std::string table, ClusterOptions cluster)
      : dialect_(d), schema_(std::move(schema)), table_(std::move(table)), cluster_(std::move(cluster)) {}
  std::string StateTable() const;
  std::string HistoryTable() const;
  std::string HistoryBuffer() const;
  std::string LockRowsTable() const;  // `<table>_lock`, the Python backend's
  // The SELECT and FROM that ListHistory and GetHistoryVersion share.
  std::string HistoryRows() const;
  // " ON CLUSTER `name`" in cluster mode, else "".
  std::string OnCluster() const;
  // A request named `purpose` (what logs and the transport policy call it).
  static SqlRequest Request(std::string purpose, bool idempotent);
  // A read: idempotent, and wait_end_of_query=1 (see statements.cc).
  static SqlRequest Read(std::string purpose);
  // DDL settings (cluster mode: wait for the end, bounded DDL timeout).
  SqlRequest Ddl(std::string purpose, bool idempotent) const;
  // Settings of a write (quorum in cluster mode) and of a read (sequential
  // consistency in cluster mode).
  void WriteSettings(SqlRequest* r) const;
  void ReadSettings(SqlRequest* r) const;
  // "ReplacingMergeTree(v)" or "ReplicatedReplacingMergeTree('<path>', '<replica>', v)".
  std::string Engine(absl::string_view kind, absl::string_view zk_leaf, absl::string_view args) const;
  // Cluster mode: "(SELECT <columns>, completed_state FROM t FINAL <where>)
  // WHERE <not a tombstone>", to read FROM.
  std::string LiveStates(absl::string_view columns, absl::string_view where) const;
  // `WHERE state_id = ...` with a literal (18.x) or a {state_id:String}
  // parameter added to `req` (modern).
  std::string StateIdEquals(SqlRequest* req, absl::string_view state_id) const;

  Dialect dialect_;
  std::string schema_;
  std::string table_;
  ClusterOptions cluster_;
};

// FNV-1a 64: stable across builds and platforms (unlike std::hash).
uint64_t Fnv1a64(absl::string_view bytes);

}  // namespace chstate

#endif  // CHSTATE_CORE_STATEMENTS_H_
