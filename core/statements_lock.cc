// SQL of the locks, per dialect: the lock tables and their tombstones, the
// rows the Python backend's lock shares with ours (`<table>_lock`), the
// waiter rows, and in cluster mode the claims table. Reads follow the rules
// at the top of statements.cc.
#include "core/statements.h"

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "core/quoting.h"

namespace chstate {

std::string Statements::LockTableName(absl::string_view state_id) const {
  return absl::StrFormat("%s_lock_%016x", table_, Fnv1a64(state_id));
}

std::string Statements::TombstoneName(absl::string_view state_id, absl::string_view instance) const {
  return absl::StrFormat("%s_dead_%016x", LockTableName(state_id), Fnv1a64(instance));
}

SqlRequest Statements::CreateLock(absl::string_view state_id, absl::string_view lock_id, int64_t stale_s) const {
  SqlRequest r = Ddl("create_lock", false);
  // Log engine: the lock survives a server restart, with its times, so a
  // holder keeps it and a dead holder's lock still goes stale.
  // Cluster: every host runs the CREATE in the DDL queue's order, so of any
  // number of creators only the first succeeds (the rest get code 57 from
  // every host). The ZooKeeper path names this instance (a taken-over lock
  // keeps its path under its tombstone name); each host inserts its own
  // creation row, and deduplication is off so neither is dropped as equal
  // to the other: both replicas hold a creation row when the CREATE returns.
  std::string engine = "Log";
  if (cluster_.enabled()) {
    engine = absl::StrCat(
        Engine("MergeTree", absl::StrFormat("%s/%016x", LockTableName(state_id), Fnv1a64(lock_id)), ""),
        " ORDER BY tuple() SETTINGS replicated_deduplication_window = 0");
  }
  r.sql = absl::StrCat("CREATE TABLE `", schema_, "`.`", LockTableName(state_id), "`", OnCluster(), " ENGINE = ",
                       engine, " AS SELECT ",
                       QuoteStringLiteral(lock_id), " AS lock_id, toUInt8(0) AS seq, now() AS locked_at, toUInt32(",
                       stale_s, ") AS stale_s");
  return r;
}

SqlRequest Statements::InspectLock(absl::string_view state_id) const {
  return InspectLockTable(LockTableName(state_id));
}

SqlRequest Statements::InspectLockTable(absl::string_view name) const {
  SqlRequest r = Read("inspect_lock");
  // Times come from the server's clock, so client clock skew does not matter.
  // The system.tables row gives the table's age while its creation row is not
  // yet visible. A lock table dropped meanwhile gives code 60, 218 (being
  // dropped) or no rows: all mean "no lock".
  // materialize(): as constants, the two halves' now() can straddle a second
  // and 18.16 then refuses the UNION (code 171).
  r.sql = absl::StrCat("SELECT lock_id, seq, toInt64(locked_at), materialize(toInt64(now())), stale_s FROM `",
                       schema_, "`.`", name,
                       "` UNION ALL SELECT '', toUInt8(255), toInt64(metadata_modification_time), "
                       "materialize(toInt64(now())), toUInt32(0) FROM system.tables WHERE database = ",
                       QuoteStringLiteral(schema_), " AND name = ", QuoteStringLiteral(name), " FORMAT TabSeparated");
  return r;
}

std::string Statements::LockRowsTable() const { return absl::StrCat("`", schema_, "`.`", table_, "_lock`"); }

SqlRequest Statements::InsertLockMarker(absl::string_view state_id, absl::string_view lock_id, int64_t ahead_s) const {
  SqlRequest r = Request("insert_lock_marker", false);
  WriteSettings(&r);
  r.sql = absl::StrCat("INSERT INTO ", LockRowsTable(), " (state_id, lock_id, locked_at) SELECT ",
                       QuoteStringLiteral(state_id), ", ", QuoteStringLiteral(absl::StrCat(kLockMarkerPrefix, lock_id)),
                       ", now() + ", ahead_s);
  return r;
}

SqlRequest Statements::DeleteLockMarker(absl::string_view state_id, absl::string_view lock_id) const {
  // Deleting a row that is gone already is harmless: resendable.
  SqlRequest r = Request("delete_lock_marker", true);
  WriteSettings(&r);
  std::string where = absl::StrCat(StateIdEquals(&r, state_id), " AND lock_id = ",
                                   QuoteStringLiteral(absl::StrCat(kLockMarkerPrefix, lock_id)));
  r.sql = dialect_ == Dialect::kModern ? absl::StrCat("DELETE FROM ", LockRowsTable(), " WHERE ", where)
                                       : absl::StrCat("ALTER TABLE ", LockRowsTable(), " DELETE WHERE ", where);
  return r;
}

namespace {

// Every row, not FINAL: a candidate that lost but is not withdrawn yet
// counts too (it may be about to win on a retry). Markers of either prefix
// are chstate's.
std::string ForeignRowsSql(const std::string& table, const std::string& where) {
  return absl::StrCat("SELECT lock_id, 1 FROM ", table, " WHERE ", where, " AND locked_at >= now() - ",
                      kPythonLockWindowS, " AND NOT startsWith(lock_id, ", QuoteStringLiteral(kLockMarkerPrefix),
                      ") AND NOT startsWith(lock_id, ", QuoteStringLiteral(kOldLockMarkerPrefix), ")");
}

// The active parts of `<table>_lock` in system.parts.
std::string LockRowsTableParts(const std::string& schema, const std::string& table) {
  return absl::StrCat("database = ", QuoteStringLiteral(schema), " AND table = ",
                      QuoteStringLiteral(absl::StrCat(table, "_lock")), " AND active");
}

}  // namespace

SqlRequest Statements::ForeignLockRows(absl::string_view state_id) const {
  SqlRequest r = Read("foreign_lock_rows");
  ReadSettings(&r);
  r.sql = absl::StrCat(ForeignRowsSql(LockRowsTable(), StateIdEquals(&r, state_id)), " FORMAT TabSeparated");
  return r;
}

SqlRequest Statements::PythonLockBlocks() const {
  SqlRequest r = Read("python_lock_blocks");
  r.sql = absl::StrCat("SELECT toString(max(max_block_number)), 2 FROM system.parts WHERE ",
                       LockRowsTableParts(schema_, table_), " FORMAT TabSeparated");
  return r;
}

SqlRequest Statements::ForeignLockRowsAndParts(absl::string_view state_id, int64_t after_block) const {
  SqlRequest r = Read("foreign_lock_rows_and_parts");
  ReadSettings(&r);
  r.sql = absl::StrCat(ForeignRowsSql(LockRowsTable(), StateIdEquals(&r, state_id)),
                       " UNION ALL SELECT toString(count() + countIf(min_block_number != max_block_number)), 2 FROM "
                       "system.parts WHERE ",
                       LockRowsTableParts(schema_, table_), " AND max_block_number > ", after_block,
                       " FORMAT TabSeparated");
  return r;
}

SqlRequest Statements::ListLockTables() const {
  SqlRequest r = Read("list_lock_tables");
  // The table name is an identifier ([A-Za-z_][A-Za-z0-9_]*): safe in the pattern.
  r.sql = absl::StrCat("SELECT name, 1 FROM system.tables WHERE database = ", QuoteStringLiteral(schema_),
                       " AND match(name, ", QuoteStringLiteral(absl::StrCat("^", table_, "_lock_[0-9a-f]{16}$")),
                       ") ORDER BY name FORMAT TabSeparated");
  return r;
}

SqlRequest Statements::RenewLock(absl::string_view state_id, absl::string_view lock_id, int64_t stale_s) const {
  SqlRequest r = Request("renew_lock", false);
  WriteSettings(&r);  // cluster: the renewal is on every replica when confirmed
  r.sql = absl::StrCat("INSERT INTO `", schema_, "`.`", LockTableName(state_id), "` SELECT ",
                       QuoteStringLiteral(lock_id), ", toUInt8(1), now(), toUInt32(", stale_s, ")");
  return r;
}

SqlRequest Statements::AnnounceLockWaiter(absl::string_view state_id, absl::string_view lock_id,
                                          absl::string_view holder) const {
  SqlRequest r = Request("announce_lock_waiter", false);
  WriteSettings(&r);
  if (cluster_.enabled()) {
    r.sql = absl::StrCat("INSERT INTO ", ClaimsTable(), " SELECT ",
                         QuoteStringLiteral(LockTableName(state_id)), ", ", QuoteStringLiteral(lock_id),
                         ", toUInt8(2), now(), toUInt32(0), ", QuoteStringLiteral(holder));
    return r;
  }  // modern: async_insert=0, so the holder's next look sees the row
  // Like every INSERT on a modern server, with a token (a Log table never
  // deduplicates; a waiter's repeated row would be harmless anyway).
  if (dialect_ == Dialect::kModern) {
    r.url_params.emplace_back("insert_deduplication_token", absl::StrCat("waiter-", lock_id));
  }
  r.sql = absl::StrCat("INSERT INTO `", schema_, "`.`", LockTableName(state_id), "` SELECT ",
                       QuoteStringLiteral(lock_id), ", toUInt8(2), now(), toUInt32(0)");
  return r;
}

SqlRequest Statements::LockWaiters(absl::string_view state_id, absl::string_view holder) const {
  SqlRequest r = Read("lock_waiters");
  if (cluster_.enabled()) {
    ReadSettings(&r);
    r.sql = absl::StrCat("SELECT lock_id, 1 FROM ", ClaimsTable(), " WHERE name = ",
                         QuoteStringLiteral(LockTableName(state_id)), " AND seq = 2 AND over = ",
                         QuoteStringLiteral(holder), " LIMIT 1 FORMAT TabSeparated");
    return r;
  }
  r.sql = absl::StrCat("SELECT lock_id, 1 FROM `", schema_, "`.`", LockTableName(state_id),
                       "` WHERE seq = 2 LIMIT 1 FORMAT TabSeparated");
  return r;
}

SqlRequest Statements::DropLock(absl::string_view state_id) const {
  // Not resendable: if the first DROP landed, another process may have
  // created a fresh lock under the same name before a resend would arrive,
  // and the resend would drop theirs. After a lost answer the lock machine
  // looks first (RetryDrop) and drops again only if the lock is still ours.
  SqlRequest r = Ddl("drop_lock", false);
  r.sql = absl::StrCat("DROP TABLE IF EXISTS `", schema_, "`.`", LockTableName(state_id), "`", OnCluster());
  return r;
}

SqlRequest Statements::EntombLock(absl::string_view state_id, absl::string_view instance) const {
  SqlRequest r = Ddl("entomb_lock", false);
  r.sql = absl::StrCat("RENAME TABLE `", schema_, "`.`", LockTableName(state_id), "` TO `", schema_, "`.`",
                       TombstoneName(state_id, instance), "`", OnCluster());
  return r;
}

SqlRequest Statements::ListOldTombstones(int64_t older_than_s) const {
  SqlRequest r = Read("list_tombstones");
  r.sql = absl::StrCat("SELECT name, 1 FROM system.tables WHERE database = ", QuoteStringLiteral(schema_),
                       " AND name LIKE ", QuoteStringLiteral(absl::StrCat(GlobToLike(table_), "\\_lock\\_%\\_dead\\_%")),
                       " AND metadata_modification_time < now() - ", older_than_s, " FORMAT TabSeparated");
  return r;
}

SqlRequest Statements::DropTable(absl::string_view name) const {
  SqlRequest r = Ddl("drop_table", true);
  // The name comes back from the server (tombstones): escaped, so that any
  // table name, even one with a backquote, stays one identifier.
  std::string literal = QuoteStringLiteral(name);  // printable ASCII: \\ \' \xHH
  std::string escaped = absl::StrReplaceAll(absl::string_view(literal).substr(1, literal.size() - 2), {{"`", "\\`"}});
  r.sql = absl::StrCat("DROP TABLE IF EXISTS `", schema_, "`.`", escaped, "`", OnCluster());
  return r;
}

std::string Statements::ClaimsTable() const { return absl::StrCat("`", schema_, "`.`", table_, "_claims`"); }

SqlRequest Statements::CreateClaimsTable() const {
  SqlRequest r = Ddl("create_claims_table", true);
  r.sql = absl::StrCat("CREATE TABLE IF NOT EXISTS ", ClaimsTable(), OnCluster(),
                       " (name String, lock_id String, seq UInt8, at DateTime, stale_s UInt32, over String) ENGINE = ",
                       Engine("MergeTree", absl::StrCat(table_, "_claims"), ""),
                       " PARTITION BY tuple() ORDER BY (name, lock_id, seq, at)");
  return r;
}

namespace {
std::string ClaimRow(absl::string_view name, absl::string_view lock_id, int seq, int64_t stale_s,
                     absl::string_view over) {
  return absl::StrCat(QuoteStringLiteral(name), ", ", QuoteStringLiteral(lock_id), ", toUInt8(", seq,
                      "), now(), toUInt32(", stale_s, "), ", QuoteStringLiteral(over));
}
}  // namespace

SqlRequest Statements::ClaimLock(absl::string_view state_id, absl::string_view lock_id, int64_t stale_s,
                                 absl::string_view over) const {
  SqlRequest r = Request("claim_lock", false);
  WriteSettings(&r);
  r.sql = absl::StrCat("INSERT INTO ", ClaimsTable(), " SELECT ",
                       ClaimRow(LockTableName(state_id), lock_id, 0, stale_s, over));
  return r;
}

SqlRequest Statements::RenewClaim(absl::string_view state_id, absl::string_view lock_id, int64_t stale_s) const {
  SqlRequest r = Request("renew_claim", false);
  WriteSettings(&r);
  r.sql = absl::StrCat("INSERT INTO ", ClaimsTable(), " SELECT ",
                       ClaimRow(LockTableName(state_id), lock_id, 1, stale_s, ""));
  return r;
}

SqlRequest Statements::EndClaim(absl::string_view state_id, absl::string_view lock_id) const {
  SqlRequest r = Request("end_claim", true);
  WriteSettings(&r);
  r.sql = absl::StrCat("INSERT INTO ", ClaimsTable(), " SELECT ", ClaimRow(LockTableName(state_id), lock_id, 3, 0, ""));
  return r;
}

SqlRequest Statements::InspectClaims(absl::string_view state_id) const {
  SqlRequest r = Read("inspect_claims");
  // The last row names the replica that answers and how many the table has
  // (ClaimsReadReplica): a sequentially consistent read on 18.16 only makes
  // sure of the last quorum insert, so the store reads enough replicas that
  // one has every confirmed claim (part::ReadClaims). Not sequentially
  // consistent: each replica read as it is (a row not yet confirmed shows
  // a claim that may hold, or a claim ended: both safe to see).
  r.each_replica = true;
  r.sql = absl::StrCat(
      "SELECT lock_id, countIf(seq = 0), countIf(seq = 3), toInt64(max(at)), toInt64(anyIf(stale_s, seq = 0)), "
      "anyIf(over, seq = 0), materialize(toInt64(now())) FROM ",
      ClaimsTable(), " WHERE name = ", QuoteStringLiteral(LockTableName(state_id)),
      " GROUP BY lock_id ORDER BY lock_id UNION ALL SELECT ", QuoteStringLiteral(kClaimsReplicaRow),
      ", toUInt64(total_replicas), toUInt64(0), toInt64(0), toInt64(0), replica_name, toInt64(now()) "
      "FROM system.replicas WHERE database = ", QuoteStringLiteral(schema_),
      " AND table = ", QuoteStringLiteral(absl::StrCat(table_, "_claims")), " FORMAT TabSeparated");
  return r;
}

SqlRequest Statements::PruneClaims(absl::string_view state_id, const std::vector<std::string>& lock_ids) const {
  SqlRequest r = Request("prune_claims", true);
  std::vector<std::string> ids;
  ids.reserve(lock_ids.size());
  for (const std::string& id : lock_ids) ids.push_back(QuoteStringLiteral(id));
  // A literal list, not a subquery: every replica and every part deletes
  // the same rows, whatever it has seen (a mutation runs part by part).
  r.sql = absl::StrCat("ALTER TABLE ", ClaimsTable(), " DELETE WHERE name = ", QuoteStringLiteral(LockTableName(state_id)),
                       " AND lock_id IN (", absl::StrJoin(ids, ", "), ") AND (seq != 2 OR at < now() - 3600)");
  return r;
}

SqlRequest Statements::ListClaims() const {
  SqlRequest r = Read("list_claims");
  ReadSettings(&r);
  r.sql = absl::StrCat(
      "SELECT name, lock_id, toInt64(minIf(at, seq = 0)), toInt64(max(at)), toInt64(anyIf(stale_s, seq = 0)), "
      "materialize(toInt64(now())), countIf(seq = 3), anyIf(over, seq = 0) FROM ",
      ClaimsTable(), " GROUP BY name, lock_id HAVING countIf(seq = 0) > 0 "
      "ORDER BY name, lock_id FORMAT TabSeparated");
  return r;
}

}  // namespace chstate