// The SQL for every operation, per dialect. This is the only file that writes
// SQL text; every name and value in it passes through core/quoting.h.
//
//   absl::StatusOr<chstate::Statements> st =
//       chstate::Statements::Create(chstate::Dialect::kModern, "meltano", "state");
//   chstate::SqlRequest req = st->GetState("dev:tap-a-to-target-b");
//
// Result formats are TabSeparated, decoded by core/response.h.
#ifndef CHSTATE_CORE_STATEMENTS_H_
#define CHSTATE_CORE_STATEMENTS_H_

#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/dialect.h"
#include "core/sql_request.h"

namespace chstate {

class Statements {
 public:
  // kInvalidArgument when schema or table is not a valid identifier.
  static absl::StatusOr<Statements> Create(Dialect dialect, absl::string_view schema, absl::string_view table);

  Dialect dialect() const { return dialect_; }
  const std::string& schema() const { return schema_; }
  const std::string& table() const { return table_; }

  // Dialect-independent: the first request on every connection.
  static SqlRequest SelectVersion();

  SqlRequest CreateDatabase() const;
  SqlRequest CreateStateTable() const;
  // `<table>_lock`, the Python backend's lock table: created so that both
  // tools can share a schema.
  SqlRequest CreateLockTable() const;

  // One row (partial_state, completed_state) or none.
  SqlRequest GetState(absl::string_view state_id) const;
  // Writes a whole state row. NULL for an empty side. `dedup_token` must be
  // unique per write: modern servers deduplicate identical insert blocks.
  SqlRequest InsertState(absl::string_view state_id, const std::optional<std::string>& partial_json,
                         const std::optional<std::string>& completed_json, absl::string_view dedup_token) const;
  SqlRequest DeleteState(absl::string_view state_id) const;
  // kClickHouse18 only: one row, the number of unfinished mutations of the
  // state table. DeleteState is done when it reads 0.
  SqlRequest PendingMutations() const;
  // State ids (one column), sorted; all of them when `glob` is nullopt.
  SqlRequest ListStateIds(const std::optional<std::string>& glob) const;
  // One row: the number of state ids.
  SqlRequest CountStates() const;
  SqlRequest TruncateStates() const;

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
  // A lease renewal row (lock_id, seq 1, now(), stale_s).
  SqlRequest RenewLock(absl::string_view state_id, absl::string_view lock_id, int64_t stale_s) const;
  SqlRequest DropLock(absl::string_view state_id) const;
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

 private:
  Statements(Dialect d, std::string schema, std::string table) : dialect_(d), schema_(schema), table_(table) {}
  std::string StateTable() const;
  // `WHERE state_id = ...` with a literal (18.x) or a {state_id:String}
  // parameter added to `req` (modern).
  std::string StateIdEquals(SqlRequest* req, absl::string_view state_id) const;

  Dialect dialect_;
  std::string schema_;
  std::string table_;
};

// FNV-1a 64: stable across builds and platforms (unlike std::hash).
uint64_t Fnv1a64(absl::string_view bytes);

}  // namespace chstate

#endif  // CHSTATE_CORE_STATEMENTS_H_
