// A simulated single ClickHouse server for the lock simulation
// (tests/sim/lock_sim.h). It runs exactly the statements the lock code sends,
// recognised by their SQL text, against an in-memory model of the tables:
//
//   chstate::sim::SimServer server(options, &rng);
//   chstate::sim::Execution e = server.Execute(request, true_now_ms);
//   // e.response is what the client receives; e.done_ms is when it leaves.
//
// Every statement takes effect atomically at the true time it is executed
// (the caller executes statements in arrival order). The server's clock is the
// simulation's true clock: now() = floor(true_ms / 1000).
//
// Modelled: Log lock tables (CreateLock, InspectLock, RenewLock, DropLock,
// EntombLock, CreateDatabase from core/statements.h) and the Python backend's
// ReplacingMergeTree lock table (CreateLockTable plus the few statements of the
// naive lock in tests/sim/naive_lock.h: INSERT VALUES, SELECT ... FINAL, ALTER
// DELETE), with 18.16 or modern error bodies. A statement that is not
// recognised is answered with a syntax error AND recorded in unrecognized(),
// which the simulation reports as a failure: new SQL cannot pass unnoticed.
//
// Adversarial knobs (ServerOptions): the creation row of CREATE ... AS SELECT
// can become visible later than the table (others get code 57 meanwhile and
// an inspection shows only the system.tables row); inserts into a
// ReplacingMergeTree table can become visible late; UNION ALL parts come back
// in random order; a read of a missing lock table can give zero rows instead
// of code 60 (as some server versions do), or code 218 shortly after a DROP;
// the two halves of the inspection's UNION can read now() a second apart.
#ifndef CHSTATE_TESTS_SIM_SIM_SERVER_H_
#define CHSTATE_TESTS_SIM_SIM_SERVER_H_

#include <cstdint>
#include <climits>
#include <functional>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "core/dialect.h"
#include "core/sql_request.h"

namespace chstate::sim {

struct ServerOptions {
  std::string schema = "meltano";
  // Only the error format differs: 18.16 "Code: 57, e.displayText() = ..."
  // bodies without a code header; modern "Code: 57. DB::Exception: ..." bodies
  // with X-ClickHouse-Exception-Code.
  Dialect dialect = Dialect::kClickHouse18;
  bool database_exists = true;
  // CREATE TABLE ... AS SELECT: with this probability the creation row becomes
  // visible up to create_visibility_max_ms after the table exists. The
  // creator's answer leaves only once the row is in (the CREATE finishes
  // after its INSERT), so only other clients can see the gap.
  double create_visibility_prob = 0;
  int64_t create_visibility_max_ms = 0;
  // Inserts into ReplacingMergeTree tables are acknowledged at once but read
  // only up to this much later (async insert, a lagging replica).
  int64_t insert_visibility_max_ms = 0;
  // Probability that a read of a missing Log lock table answers zero rows
  // instead of code 60.
  double missing_table_empty_prob = 0;
  // A read of, or insert into, a table dropped less than this long ago may
  // meet it still being dropped: code 218 (half of the time).
  int64_t dropped_race_ms = 0;
  // One half of the inspection's UNION evaluates now() up to this much
  // earlier than the other (the query takes that long), so the two can
  // straddle a second.
  int64_t union_now_spread_ms = 0;

  // Cluster mode (the lock as claims in `<table>_claims`, core/claims_lock.h),
  // with what a lost or lagging replica does to a quorum insert and to a
  // sequentially consistent read. A confirmed claim row is visible to every
  // read that begins after it ran; nothing else is promised.
  // - 286: another quorum insert in flight; nothing written.
  double quorum_busy_prob = 0;
  // - 285: too few live replicas; nothing written.
  double too_few_replicas_prob = 0;
  // - 319: the quorum was not confirmed in time; the row becomes visible up
  //   to quorum_unknown_max_ms later (its replica comes back), or never.
  double quorum_unknown_prob = 0;
  int64_t quorum_unknown_max_ms = 0;
  // - 289: the replica read lags behind the last quorum insert.
  double lagging_read_prob = 0;
  //   and in periods: one starting up to lag_every_max_ms after the last one
  //   ended, lasting 1..lag_max_ms, every claims read answered 289 (0: none).
  int64_t lag_every_max_ms = 0;
  int64_t lag_max_ms = 0;
  // A prune of claims (ALTER ... DELETE, a mutation) removes each row it
  // matches up to this long after it ran, row by row in any order (a mutation
  // rewrites one part after another; rows written before it that become
  // visible later go too).
  int64_t prune_lag_max_ms = 0;
  // Replicas of the claims table (0: one that has every visible row). With
  // host lists, host i ("replica-i") is replica i. A claims row is on the
  // replica it was inserted into at once, on `replica_quorum` replicas when
  // it is confirmed (visible), and on each other live replica up to
  // replica_fetch_max_ms later (a fetch that failed and is retried). A
  // claims read of replica i sees the rows replica i has; with
  // select_sequential_consistency=1 only the confirmed ones, and it answers
  // 289 while it lacks the last confirmed row: what 18.16 makes sure of, and
  // no more (tests/cluster/test_claims_gap.py).
  int replicas = 0;
  int replica_quorum = 2;
  int64_t replica_fetch_max_ms = 0;
  int dead_replica = -1;  // never receives a row
  // Negative control: the claims read says the table has one replica (so a
  // client reads one, which may lack a confirmed claim).
  bool replicas_understated = false;
  // Negative control for the mixed fleet: chstate's marker as releases
  // before 2026-12-06 wrote it (lock_id "chstate:...", locked_at now() - 2)
  // and no block check (the parts' block number read as the same every
  // time, so the look after the marker never sees a write between).
  bool old_marker = false;
};

// A row of the claims table.
struct ClaimRow {
  std::string name;
  std::string lock_id;
  int seq = 0;              // 0 claim, 1 renewal, 2 a waiter naming the holder (over), 3 end
  int64_t at_s = 0;         // now() when it ran
  int64_t stale_s = 0;
  std::string over;
  int64_t stamped_ms = 0;   // true time it ran
  int64_t visible_ms = 0;   // reads see it from then on (INT64_MAX: never)
  int64_t gone_ms = INT64_MAX;  // removed by a prune (Statements::PruneClaims) from then on
  // ServerOptions::replicas: when the row is on each replica (INT64_MAX: never).
  std::vector<int64_t> on_replica_ms;
};

struct Row {
  std::string state_id;       // ReplacingMergeTree tables only
  std::string lock_id;
  int seq = 0;                // Log lock tables: 0 creation row, 1 renewal
  int64_t stale_s = 0;        // Log lock tables: the writer's stale window
  int64_t locked_at_s = 0;    // the server's now() when the statement ran
  int64_t stamped_ms = 0;     // true time the statement ran (for checkers)
  int64_t visible_ms = 0;     // reads see the row from this true time on
  uint64_t insert_order = 0;  // ties in ReplacingMergeTree: the later insert wins
  // ReplacingMergeTree: the least and greatest block numbers of the part the
  // row is in (its insert's block, or a merge's range).
  int64_t part_min_block = 0;
  int64_t part_max_block = 0;
};

struct Table {
  enum class Engine { kLog, kReplacingMergeTree };
  Engine engine = Engine::kLog;
  uint64_t instance = 0;    // unique per CREATE: follows the table through RENAME
  int64_t created_s = 0;    // metadata_modification_time
  int64_t created_ms = 0;
  std::vector<Row> rows;
  // ReplacingMergeTree: the last block number given. A MergeTree numbers an
  // insert's part as it commits it, and a mutation takes a number too.
  int64_t last_block = 0;
};

// The outcome of one statement.
struct Execution {
  SqlResponse response;
  int64_t done_ms = 0;    // true time the answer leaves the server
  std::string summary;    // what it did, for traces ("created", "code 57", ...)
};

class SimServer {
 public:
  // `rng` drives the adversarial choices; it must outlive the server.
  SimServer(ServerOptions options, std::mt19937_64* rng);

  Execution Execute(const SqlRequest& request, int64_t now_ms);
  // ServerOptions::replicas and dead_replica, once the host list is drawn.
  void SetReplicas(int replicas, int dead_replica) {
    options_.replicas = replicas;
    options_.dead_replica = dead_replica;
  }

  // A background merge of every ReplacingMergeTree table: rows of the same
  // state_id visible at `now_ms` collapse to the one with the greatest
  // locked_at (the later insert among equals). Rows still invisible are
  // separate parts and take no part.
  void Merge(int64_t now_ms);

  // ReplacingMergeTree: a row a merge collapsed into another of its id,
  // by its lock id: when, and the survivor's lock id.
  struct MergedAway {
    int64_t at_ms = 0;
    std::string survivor;
  };
  const std::map<std::string, MergedAway>& merged_away() const { return merged_away_; }

  const Table* Find(const std::string& name) const;
  const std::map<std::string, Table>& tables() const { return tables_; }
  // Statements the server did not recognise (each also got a syntax error).
  const std::vector<std::string>& unrecognized() const { return unrecognized_; }

  const std::vector<ClaimRow>& claims() const { return claims_; }
  // Called when a claim that takes over `over` (comma-separated lock ids)
  // runs, with the claims table as it is then (the stale-takeover check).
  std::function<void(const std::string& over, int64_t now_ms)> on_claim_over;

  // Called after every successful RENAME with the moved table (for the
  // simulation's stale-takeover check).
  std::function<void(const std::string& from, const std::string& to, const Table& moved, int64_t now_ms)>
      on_rename;

 private:
  Execution Ok(std::string body, int64_t now_ms, std::string summary) const;
  Execution Error(int code, const std::string& message, int64_t now_ms) const;
  Execution UnknownTable(const std::string& name, int64_t now_ms) const;
  Execution BeingDropped(const std::string& db, const std::string& name, int64_t now_ms) const;
  bool JustDropped(const std::string& name, int64_t now_ms);
  Execution Unrecognized(const SqlRequest& request, const std::string& why, int64_t now_ms);
  bool Chance(double p);
  int64_t Upto(int64_t max);  // uniform in [0, max]
  // ReplacingMergeTree: removes the visible rows of (state_id, lock_id).
  Execution DeleteRows(const SqlRequest& request, const std::string& db, const std::string& name,
                       const std::string& state_id, const std::string& lock_id, int64_t now_ms);
  // old_marker: the marker's lock id as releases before 2026-12-06 wrote it.
  std::string MarkerId(const std::string& lock_id) const;
  // What a read of system.parts' greatest block number of `t` answers.
  int64_t BlocksRead(const Table& t) const;
  // The row a FINAL read of `state_id` gives at `now_ms` (null: none).
  static const Row* FinalRow(const Table& t, const std::string& state_id, int64_t now_ms);
  // The active parts of `t` with a block after `after`, merged ones twice.
  int64_t PartsAfter(const Table& t, int64_t after) const;
  // ServerOptions::replicas: the replica a request reaches, and where a new
  // claims row is when.
  int ReplicaOf(const SqlRequest& request) const;
  void PlaceOnReplicas(ClaimRow* r, int inserted_into);

  // False (with `*error` set) when `db` is not the schema or it is missing.
  bool CheckDatabase(const std::string& db, int64_t now_ms, Execution* error) const;

  ServerOptions options_;
  std::mt19937_64* rng_;
  bool database_exists_;
  std::map<std::string, Table> tables_;
  std::map<std::string, int64_t> dropped_ms_;  // name -> when it was last dropped
  uint64_t next_instance_ = 1;
  uint64_t next_insert_ = 1;
  std::vector<std::string> unrecognized_;
  int64_t lag_from_ms_ = -1;  // the current or next lag period (lag_every_max_ms)
  int64_t lag_until_ms_ = 0;
  bool claims_table_ = false;
  std::map<std::string, MergedAway> merged_away_;
  std::vector<ClaimRow> claims_;
};

// TabSeparated escaping of one field (\\, \t, \n).
std::string TsvEscape(const std::string& field);

}  // namespace chstate::sim

#endif  // CHSTATE_TESTS_SIM_SIM_SERVER_H_
