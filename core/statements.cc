// SQL text per dialect. Reads ask for TabSeparated and, over HTTP, for
// wait_end_of_query=1 so that an error arrives as an HTTP error instead of
// after a 200 and part of a result. Every read returns at least two columns
// (a constant 1 where one would do): an exception appended to a streamed
// result is a line without a tab, so it can never pass for a row.
#include "core/statements.h"

#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/defaults.h"
#include "core/quoting.h"
#include "re2/re2.h"

namespace chstate {

SqlRequest Statements::Request(std::string purpose, bool idempotent) {
  SqlRequest r;
  r.purpose = std::move(purpose);
  r.idempotent = idempotent;
  return r;
}

SqlRequest Statements::Read(std::string purpose) {
  SqlRequest r = Request(std::move(purpose), true);
  r.url_params.emplace_back("wait_end_of_query", "1");
  return r;
}

uint64_t Fnv1a64(absl::string_view bytes) {
  uint64_t h = 14695981039346656037ull;
  for (unsigned char c : bytes) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

absl::StatusOr<Statements> Statements::Create(Dialect dialect, absl::string_view schema, absl::string_view table,
                                              ClusterOptions cluster) {
  if (absl::Status s = ValidateIdentifier(schema, "schema"); !s.ok()) return s;
  if (absl::Status s = ValidateIdentifier(table, "table"); !s.ok()) return s;
  if (cluster.enabled()) {
    // config.cc checked these for users; hosts that build options themselves
    // get the same guard, since the values go into DDL unescaped.
    static const RE2* const kName = new RE2("[A-Za-z0-9_.-]{1,128}");
    static const RE2* const kZooKeeperText = new RE2("[A-Za-z0-9_./{}-]{1,200}");
    if (!RE2::FullMatch(cluster.name, *kName)) {
      return absl::InvalidArgumentError("the cluster name may hold only letters, digits, '_', '.' and '-'");
    }
    if (!RE2::FullMatch(cluster.zookeeper_path, *kZooKeeperText) || cluster.zookeeper_path[0] != '/' ||
        !RE2::FullMatch(cluster.replica, *kZooKeeperText)) {
      return absl::InvalidArgumentError(
          "the zookeeper_path (absolute) and replica may hold only letters, digits, '_', '.', '-', '/' and {macros}");
    }
    if (cluster.quorum < 2) {
      return absl::InvalidArgumentError(absl::StrCat(
          "the cluster quorum is ", cluster.quorum, ", and it must be at least 2: with fewer ClickHouse makes no "
          "quorum writes, and neither reads nor the lock stay consistent across replicas"));
    }
    if (cluster.quorum_timeout_ms < 1 || cluster.ddl_timeout_s < 1) {
      return absl::InvalidArgumentError("the cluster quorum timeout and DDL timeout must be positive");
    }
  }
  return Statements(dialect, std::string(schema), std::string(table), std::move(cluster));
}

namespace {
// The second half of a version's name: 8 hex digits of a hash of both sides.
constexpr const char* kHistoryHash =
    "substring(lower(hex(cityHash64(ifNull(partial_state, ''), ifNull(completed_state, '')))), 1, 8)";
}  // namespace

std::string Statements::StateTable() const { return absl::StrCat("`", schema_, "`.`", table_, "`"); }

std::string Statements::OnCluster() const {
  return cluster_.enabled() ? absl::StrCat(" ON CLUSTER `", cluster_.name, "`") : std::string();
}

SqlRequest Statements::Ddl(std::string purpose, bool idempotent) const {
  SqlRequest r = Request(std::move(purpose), idempotent);
  if (cluster_.enabled()) {
    // The answer of ON CLUSTER is a per-host status stream; a host's error
    // must arrive as an HTTP error, not after a 200.
    r.url_params.emplace_back("wait_end_of_query", "1");
    r.url_params.emplace_back("distributed_ddl_task_timeout", absl::StrCat(cluster_.ddl_timeout_s));
  }
  return r;
}

void Statements::WriteSettings(SqlRequest* r) const {
  if (dialect_ == Dialect::kModern) r->url_params.emplace_back("async_insert", "0");
  if (!cluster_.enabled()) return;
  r->url_params.emplace_back("insert_quorum", absl::StrCat(cluster_.quorum));
  r->url_params.emplace_back("insert_quorum_timeout", absl::StrCat(cluster_.quorum_timeout_ms));
  // Replicated tables drop a block equal to a recent one (A, B, A would
  // lose the last A). Every write here is meant, and a repeated row is
  // harmless to ReplacingMergeTree.
  r->url_params.emplace_back("insert_deduplicate", "0");
  // Modern servers may run quorum inserts in parallel, and then a read with
  // sequential consistency is not guaranteed to see every one of them.
  if (dialect_ == Dialect::kModern) r->url_params.emplace_back("insert_quorum_parallel", "0");
}

void Statements::ReadSettings(SqlRequest* r) const {
  if (cluster_.enabled()) r->url_params.emplace_back("select_sequential_consistency", "1");
}

std::string Statements::Engine(absl::string_view kind, absl::string_view zk_leaf, absl::string_view args) const {
  if (!cluster_.enabled()) return absl::StrCat(kind, "(", args, ")");
  return absl::StrCat("Replicated", kind, "(",
                      QuoteStringLiteral(absl::StrCat(cluster_.zookeeper_path, "/", schema_, "/", zk_leaf)), ", ",
                      QuoteStringLiteral(cluster_.replica), args.empty() ? "" : ", ", args, ")");
}

std::string Statements::LiveStates(absl::string_view columns, absl::string_view where) const {
  // FINAL first, then the tombstone filter: a filter inside FINAL could
  // hide the tombstone and resurrect the row it replaced.
  return absl::StrCat("(SELECT ", columns, columns.empty() ? "" : ", ", "completed_state FROM ", StateTable(),
                      " FINAL", where, ") WHERE ifNull(completed_state, '') != ", QuoteStringLiteral(kTombstone));
}

std::string Statements::StateIdEquals(SqlRequest* req, absl::string_view state_id) const {
  if (dialect_ == Dialect::kModern) {
    req->url_params.emplace_back("param_state_id", EscapeParamValue(state_id));
    return "state_id = {state_id:String}";
  }
  return absl::StrCat("state_id = ", QuoteStringLiteral(state_id));
}

SqlRequest Statements::SelectVersion() {
  SqlRequest r = Read("select_version");
  r.sql = "SELECT version(), 1 FORMAT TabSeparated";
  return r;
}

SqlRequest Statements::CreateDatabase() const {
  SqlRequest r = Ddl("create_database", true);
  r.sql = absl::StrCat("CREATE DATABASE IF NOT EXISTS `", schema_, "`", OnCluster());
  return r;
}

SqlRequest Statements::CreateStateTable() const {
  SqlRequest r = Ddl("create_state_table", true);
  // Same columns and engine as the Python ClickHouse backend, so either tool
  // reads what the other wrote. 18.x has no DateTime64: one-second versions,
  // and ReplacingMergeTree keeps the last inserted row among equal versions.
  const char* version_column = dialect_ == Dialect::kModern ? "updated_at DateTime64(3) DEFAULT now64(3)"
                                                            : "updated_at DateTime DEFAULT now()";
  r.sql = absl::StrCat("CREATE TABLE IF NOT EXISTS ", StateTable(), OnCluster(),
                       " (state_id String, partial_state Nullable(String), completed_state Nullable(String), ",
                       version_column, ") ENGINE = ", Engine("ReplacingMergeTree", table_, "updated_at"),
                       " ORDER BY state_id");
  return r;
}

SqlRequest Statements::CreateLockTable() const {
  SqlRequest r = Ddl("create_lock_table", true);
  std::string ttl = dialect_ == Dialect::kModern ? " TTL locked_at + INTERVAL 300 SECOND" : "";
  r.sql = absl::StrCat("CREATE TABLE IF NOT EXISTS `", schema_, "`.`", table_, "_lock`", OnCluster(),
                       " (state_id String, lock_id String, locked_at DateTime DEFAULT now()) ENGINE = ",
                       Engine("ReplacingMergeTree", absl::StrCat(table_, "_lock"), "locked_at"),
                       " ORDER BY state_id", ttl);
  return r;
}

std::string Statements::HistoryTable() const { return absl::StrCat("`", schema_, "`.`", table_, "_history`"); }

SqlRequest Statements::CreateHistoryTable(int64_t days) const {
  SqlRequest r = Ddl("create_history_table", true);
  const bool modern = dialect_ == Dialect::kModern;
  const char* version_column = modern ? "updated_at DateTime64(3)" : "updated_at DateTime";
  std::string ttl = modern ? absl::StrCat(" TTL toDateTime(updated_at) + INTERVAL ", days, " DAY") : "";
  r.sql = absl::StrCat("CREATE TABLE IF NOT EXISTS ", HistoryTable(), OnCluster(),
                       " (state_id String, partial_state Nullable(String), completed_state Nullable(String), ",
                       version_column, ") ENGINE = ", Engine("MergeTree", absl::StrCat(table_, "_history"), ""),
                       " PARTITION BY toYYYYMM(updated_at) ORDER BY (state_id, updated_at)", ttl);
  return r;
}

bool Statements::HistoryBuffered() const { return !cluster_.enabled(); }

std::string Statements::HistoryBuffer() const {
  return absl::StrCat("`", schema_, "`.`", table_, "_history_buffer`");
}

SqlRequest Statements::CreateHistoryBuffer() const {
  SqlRequest r = Ddl("create_history_buffer", true);
  // One layer; flushed kHistoryFlushSeconds after its first row, or at
  // kHistoryBufferRows rows or kHistoryBufferBytes bytes, whichever comes
  // first (Buffer flushes when every min or any max is reached: here they
  // are equal); a block larger than those goes to the table at once.
  r.sql = absl::StrCat("CREATE TABLE IF NOT EXISTS ", HistoryBuffer(), " AS ", HistoryTable(), " ENGINE = Buffer(",
                       QuoteStringLiteral(schema_), ", ", QuoteStringLiteral(absl::StrCat(table_, "_history")),
                       ", 1, ", kHistoryFlushSeconds, ", ", kHistoryFlushSeconds, ", ", kHistoryBufferRows, ", ",
                       kHistoryBufferRows, ", ", kHistoryBufferBytes, ", ", kHistoryBufferBytes, ")");
  return r;
}

SqlRequest Statements::CreateHistoryView() const {
  SqlRequest r = Ddl("create_history_view", true);
  // One server: into the buffer, so that a write of the state costs one
  // part, not two. Cluster mode: every replica runs the view on the inserts
  // it receives, into the replicated table; the rows it writes replicate
  // like any other (a fetched part runs no view twice).
  const bool buffered = HistoryBuffered();
  r.sql = absl::StrCat("CREATE MATERIALIZED VIEW IF NOT EXISTS `", schema_, "`.`", table_,
                       buffered ? "_history_buffer_mv`" : "_history_mv`", OnCluster(), " TO ",
                       buffered ? HistoryBuffer() : HistoryTable(),
                       " AS SELECT state_id, partial_state, completed_state, updated_at FROM ", StateTable());
  return r;
}

SqlRequest Statements::DropUnbufferedHistoryView() const {
  // Made after the buffered view, so that no write between the two goes
  // unrecorded (one in that moment is recorded twice, as one version).
  SqlRequest r = Ddl("drop_unbuffered_history_view", true);
  r.sql = absl::StrCat("DROP TABLE IF EXISTS `", schema_, "`.`", table_, "_history_mv`");
  return r;
}

SqlRequest Statements::FlushHistory() const {
  // OPTIMIZE of a Buffer table writes its rows to the table under it.
  SqlRequest r = Request("flush_history", true);
  r.sql = absl::StrCat("OPTIMIZE TABLE ", HistoryBuffer());
  return r;
}

SqlRequest Statements::ExpireHistory(int64_t days) const {
  // A mutation, replicated by the table itself in cluster mode; it runs in
  // the background and removing old versions twice is harmless.
  SqlRequest r = Ddl("expire_history", true);
  const std::string where = absl::StrCat(" WHERE updated_at < now() - INTERVAL ", days, " DAY");
  // Modern servers: a lightweight DELETE (their TTL also applies; this one
  // follows a history_days changed since the table was made).
  r.sql = dialect_ == Dialect::kModern ? absl::StrCat("DELETE FROM ", HistoryTable(), where)
                                       : absl::StrCat("ALTER TABLE ", HistoryTable(), " DELETE", where);
  return r;
}

SqlRequest Statements::TrimHistory(int64_t keep) const {
  SqlRequest r = Ddl("trim_history", true);
  // Each id's times beyond its newest `keep` (18.x has no LIMIT n, m BY).
  const std::string where =
      absl::StrCat(" WHERE (state_id, updated_at) IN (SELECT state_id, arrayJoin(arraySlice(arrayReverseSort("
                   "groupArray(updated_at)), ", keep + 1, ")) FROM ", HistoryTable(), " GROUP BY state_id)");
  r.sql = dialect_ == Dialect::kModern ? absl::StrCat("DELETE FROM ", HistoryTable(), where)
                                       : absl::StrCat("ALTER TABLE ", HistoryTable(), " DELETE", where);
  return r;
}

SqlRequest Statements::HistoryOverLimits(absl::string_view state_id, int64_t keep, int64_t days) const {
  SqlRequest r = Read("history_over_limits");
  std::string where = StateIdEquals(&r, state_id);
  const std::string beyond =
      absl::StrCat("arrayElement(arrayReverseSort(groupArray(updated_at)), ", std::max<int64_t>(keep, 0) + 1, ")");
  // An index past the array's end gives 1970-01-01, read as "none".
  std::string cutoff = "toUInt64(0)";
  if (keep > 0) {
    cutoff = dialect_ == Dialect::kModern ? absl::StrCat("toUnixTimestamp64Milli(", beyond, ")")
                                          : absl::StrCat("toUInt64(toUnixTimestamp(", beyond, ")) * 1000");
  }
  r.sql = absl::StrCat("SELECT count(), countIf(updated_at < now() - INTERVAL ", days, " DAY), ", cutoff, " FROM ",
                       HistoryTable(), " WHERE ", where, " FORMAT TabSeparated");
  return r;
}

SqlRequest Statements::TrimHistoryOf(absl::string_view state_id, int64_t cutoff_ms, int64_t days) const {
  SqlRequest r = Request("trim_history_of", true);
  std::string older = absl::StrCat("updated_at < now() - INTERVAL ", days, " DAY");
  if (cutoff_ms > 0) {
    const std::string at = dialect_ == Dialect::kModern
                               ? absl::StrCat("fromUnixTimestamp64Milli(toInt64(", cutoff_ms, "))")
                               : absl::StrCat("toDateTime(", cutoff_ms / 1000, ")");
    older = absl::StrCat("updated_at <= ", at, " OR ", older);
  }
  // A literal, not a parameter, on every server: a mutation runs later,
  // from its text alone.
  r.sql = absl::StrCat("ALTER TABLE ", HistoryTable(), " DELETE WHERE state_id = ", QuoteStringLiteral(state_id),
                       " AND (", older, ")");
  return r;
}

std::string Statements::HistoryRows() const {
  const char* ms = dialect_ == Dialect::kModern ? "toUnixTimestamp64Milli(updated_at)"
                                                : "toUInt64(toUnixTimestamp(updated_at)) * 1000";
  return absl::StrCat("SELECT ", ms, " AS ms, ", kHistoryHash,
                      " AS hash8, toString(updated_at, 'UTC'), partial_state, completed_state FROM ", HistoryTable());
}

SqlRequest Statements::ListHistory(absl::string_view state_id, int64_t limit) const {
  SqlRequest r = Read("list_history");
  ReadSettings(&r);
  std::string where = StateIdEquals(&r, state_id);
  r.sql = absl::StrCat(HistoryRows(), " WHERE ", where, " AND ifNull(completed_state, '') != ",
                       QuoteStringLiteral(kTombstone), " ORDER BY updated_at DESC, hash8 LIMIT ",
                       std::max<int64_t>(limit, 1), " FORMAT TabSeparated");
  return r;
}

SqlRequest Statements::GetHistoryVersion(absl::string_view state_id, int64_t unix_ms, absl::string_view hash8) const {
  SqlRequest r = Read("get_history_version");
  ReadSettings(&r);
  std::string where = StateIdEquals(&r, state_id);
  std::string at = dialect_ == Dialect::kModern ? absl::StrCat("fromUnixTimestamp64Milli(toInt64(", unix_ms, "))")
                                                : absl::StrCat("toDateTime(", unix_ms / 1000, ")");
  r.sql = absl::StrCat("SELECT * FROM (", HistoryRows(), " WHERE ", where, " AND updated_at = ", at, ") WHERE hash8 = ",
                       QuoteStringLiteral(hash8), " LIMIT 1 FORMAT TabSeparated");
  return r;
}

SqlRequest Statements::GetState(absl::string_view state_id) const {
  SqlRequest r = Read("get_state");
  ReadSettings(&r);
  std::string where = StateIdEquals(&r, state_id);
  if (cluster_.enabled()) {
    // Asked of enough replicas that one has the newest confirmed write
    // (part::ReadEachReplica): on 18.16 a sequentially consistent read only
    // makes sure of the table's last quorum insert. Each answers with its
    // newest row, a tombstone too, with its version and the last block
    // number of its part, and a row naming the replica (ClaimsReadReplica);
    // the newest by (version, block) is the state (NewestStateRow). Parts
    // nest or follow each other (every replica runs the same log), so the
    // later block holds the later row, as FINAL on a replica with every
    // part would pick.
    r.each_replica = true;
    const char* version = dialect_ == Dialect::kModern ? "toUnixTimestamp64Milli(updated_at)"
                                                       : "toUInt64(toUnixTimestamp(updated_at)) * 1000";
    r.sql = absl::StrCat("SELECT partial_state, completed_state, toString(", version,
                         "), toString(toUInt64(splitByChar('_', _part)[3])), '', '', '' FROM ", StateTable(),
                         " FINAL WHERE ", where, " LIMIT 1 UNION ALL SELECT toNullable(",
                         QuoteStringLiteral(kClaimsReplicaRow), "), toNullable(toString(total_replicas)), '', '', '', "
                         "replica_name, '' FROM system.replicas WHERE database = ", QuoteStringLiteral(schema_),
                         " AND table = ", QuoteStringLiteral(table_), " FORMAT TabSeparated");
    return r;
  }
  r.sql = absl::StrCat("SELECT partial_state, completed_state FROM ", StateTable(), " FINAL WHERE ", where,
                       " LIMIT 1 FORMAT TabSeparated");
  return r;
}

SqlRequest Statements::InsertState(absl::string_view state_id, const std::optional<std::string>& partial_json,
                                   const std::optional<std::string>& completed_json,
                                   absl::string_view dedup_token, absl::string_view fence_lock_id) const {
  const StateRow row{std::string(state_id), partial_json, completed_json};
  SqlRequest r = InsertStates({row}, dedup_token);
  r.purpose = "insert_state";
  if (fence_lock_id.empty() || cluster_.enabled()) return r;
  // The row as a SELECT from the lock table: on 18.x the INSERT holds that
  // table's structure lock until its part is written, so a DROP or RENAME of
  // the lock (a release or a takeover) runs before the check or after the
  // write, never between (docs/lock.md, "Fenced writes"). throwIf takes one
  // argument on 18.16, so the refusal is known by its code.
  const std::string values = StateRowSql(row);  // "(id, partial, completed)"
  r.sql = absl::StrCat("INSERT INTO ", StateTable(), " (state_id, partial_state, completed_state) SELECT ",
                       absl::string_view(values).substr(1, values.size() - 2),
                       " FROM (SELECT countIf(seq = 0 AND lock_id = ",
                       QuoteStringLiteral(fence_lock_id), ") AS ours FROM `", schema_, "`.`",
                       LockTableName(state_id), "`) WHERE throwIf(ours = 0) = 0");
  // Literals in a SELECT are parsed as the query, which max_query_size bounds
  // (256 KiB by default); the rows after VALUES were not.
  if (r.sql.size() >= kDefaultMaxQuerySize) {
    r.url_params.emplace_back("max_query_size", std::to_string(r.sql.size() + 1));
  }
  return r;
}

SqlRequest Statements::InsertStates(const std::vector<StateRow>& rows, absl::string_view dedup_token) const {
  std::vector<std::string> rows_sql;
  rows_sql.reserve(rows.size());
  for (const StateRow& row : rows) rows_sql.push_back(StateRowSql(row));
  return InsertStateRows(rows_sql, dedup_token);
}

std::string Statements::StateRowSql(const StateRow& row) {
  auto value = [](const std::optional<std::string>& v) { return v ? QuoteStringLiteral(*v) : std::string("NULL"); };
  return absl::StrCat("(", QuoteStringLiteral(row.state_id), ", ", value(row.partial_json), ", ",
                      value(row.completed_json), ")");
}

SqlRequest Statements::InsertStateRows(const std::vector<std::string>& rows_sql, absl::string_view dedup_token) const {
  // Cluster mode: a state row may be written again (the error contract's
  // "writing the same state again is safe"), so one whose answer was lost
  // goes to another replica: the first, if it landed, was numbered before it.
  SqlRequest r = Request("insert_states", cluster_.enabled());
  // async_insert is on by default from 26.2: a buffered insert could be
  // invisible to the next read (WriteSettings turns it off). A unique token
  // stops block deduplication from dropping a write that repeats an earlier
  // one (A, B, A).
  WriteSettings(&r);
  if (dialect_ == Dialect::kModern) r.url_params.emplace_back("insert_deduplication_token", std::string(dedup_token));
  const std::string head =
      absl::StrCat("INSERT INTO ", StateTable(), " (state_id, partial_state, completed_state) VALUES ");
  size_t size = head.size();
  for (const std::string& row : rows_sql) size += row.size() + 2;
  r.sql = head;
  r.sql.reserve(size);  // an import's batch is megabytes: built in place, once
  for (size_t i = 0; i < rows_sql.size(); ++i) absl::StrAppend(&r.sql, i == 0 ? "" : ", ", rows_sql[i]);
  return r;
}

namespace {
// A glob as a condition on state_id (none for "all"), with a modern
// server's parameter added to `r`.
std::optional<std::string> GlobCondition(Dialect dialect, SqlRequest* r, const std::optional<std::string>& glob) {
  if (!glob || *glob == "*") return std::nullopt;
  std::string like = GlobToLike(*glob);
  if (dialect == Dialect::kModern) {
    r->url_params.emplace_back("param_pattern", EscapeParamValue(like));
    return std::string("state_id LIKE {pattern:String}");
  }
  return absl::StrCat("state_id LIKE ", QuoteStringLiteral(like));
}

// `state_id <op> <id>` with a literal (18.x) or a parameter named `name`.
std::string CompareId(Dialect dialect, SqlRequest* r, const char* op, const char* name, absl::string_view id) {
  if (dialect == Dialect::kModern) {
    r->url_params.emplace_back(absl::StrCat("param_", name), EscapeParamValue(id));
    return absl::StrCat("state_id ", op, " {", name, ":String}");
  }
  return absl::StrCat("state_id ", op, " ", QuoteStringLiteral(id));
}
}  // namespace

SqlRequest Statements::ExportStates(const std::optional<std::string>& glob, const std::optional<std::string>& after,
                                    const std::optional<std::string>& upto, int64_t limit) const {
  SqlRequest r = Read("export_states");
  ReadSettings(&r);
  std::vector<std::string> conditions;
  if (std::optional<std::string> like = GlobCondition(dialect_, &r, glob)) conditions.push_back(*std::move(like));
  if (after) conditions.push_back(CompareId(dialect_, &r, ">", "after", *after));
  // The upper end bounds the primary key range FINAL reads and merges: without
  // it 18.16 merges everything after `after` for every page.
  if (upto) conditions.push_back(CompareId(dialect_, &r, "<=", "upto", *upto));
  std::string where = conditions.empty() ? "" : absl::StrCat(" WHERE ", absl::StrJoin(conditions, " AND "));
  std::string tail = absl::StrCat(" ORDER BY state_id LIMIT ", std::max<int64_t>(limit, 1), " FORMAT TabSeparated");
  if (cluster_.enabled()) {
    r.sql = absl::StrCat("SELECT state_id, partial_state, completed_state FROM ",
                         LiveStates("state_id, partial_state", where), tail);
    return r;
  }
  r.sql = absl::StrCat("SELECT state_id, partial_state, completed_state FROM ", StateTable(), " FINAL", where, tail);
  return r;
}

SqlRequest Statements::SampleStateIds(const std::optional<std::string>& glob, const std::optional<std::string>& after,
                                      int64_t every, int64_t count) const {
  SqlRequest r = Read("sample_state_ids");
  ReadSettings(&r);
  // The id column alone and no FINAL: a sample needs neither the states nor
  // their newest versions, and any id (even a deleted one) bounds a range.
  // The hash picks about one id in `every` whatever order the server reads
  // in; ids longer than kMaxSampledIdBytes are skipped so that the sample's
  // size stays bounded by `count`.
  std::vector<std::string> conditions = {
      absl::StrCat("cityHash64(state_id) % ", std::max<int64_t>(every, 1), " = 0"),
      absl::StrCat("length(state_id) <= ", kMaxSampledIdBytes)};
  if (std::optional<std::string> like = GlobCondition(dialect_, &r, glob)) conditions.push_back(*std::move(like));
  if (after) conditions.push_back(CompareId(dialect_, &r, ">", "after", *after));
  r.sql = absl::StrCat("SELECT state_id, 1 FROM ", StateTable(), " WHERE ", absl::StrJoin(conditions, " AND "),
                       " GROUP BY state_id ORDER BY state_id LIMIT ", std::max<int64_t>(count, 1),
                       " FORMAT TabSeparated");
  return r;
}

SqlRequest Statements::DeleteState(absl::string_view state_id) const {
  if (cluster_.enabled()) {
    // A tombstone written with the quorum: visible on every replica at once
    // (see the header for why not a mutation). Not idempotent: resent late,
    // it could delete a newer state.
    SqlRequest r = Request("delete_state", true);  // a tombstone: writing it twice is writing it once
    WriteSettings(&r);
    r.sql = absl::StrCat("INSERT INTO ", StateTable(), " (state_id, partial_state, completed_state) VALUES (",
                         QuoteStringLiteral(state_id), ", NULL, ", QuoteStringLiteral(kTombstone), ")");
    return r;
  }
  SqlRequest r = Request("delete_state", true);
  std::string where = StateIdEquals(&r, state_id);
  if (dialect_ == Dialect::kModern) {
    // Lightweight DELETE; mutations_sync makes it wait on servers (before
    // 24.4) where it would otherwise return before rows are hidden.
    r.url_params.emplace_back("mutations_sync", "2");
    r.sql = absl::StrCat("DELETE FROM ", StateTable(), " WHERE ", where);
  } else {
    r.sql = absl::StrCat("ALTER TABLE ", StateTable(), " DELETE WHERE ", where);
  }
  return r;
}

SqlRequest Statements::PendingMutations() const {
  SqlRequest r = Read("pending_mutations");
  r.sql = absl::StrCat("SELECT count(), 1 FROM system.mutations WHERE database = ", QuoteStringLiteral(schema_),
                       " AND table = ", QuoteStringLiteral(table_), " AND is_done = 0 FORMAT TabSeparated");
  return r;
}

SqlRequest Statements::ListStateIds(const std::optional<std::string>& glob) const {
  SqlRequest r = Read("list_state_ids");
  ReadSettings(&r);
  std::string where;
  if (std::optional<std::string> like = GlobCondition(dialect_, &r, glob)) where = absl::StrCat(" WHERE ", *like);
  if (cluster_.enabled()) {
    r.sql = absl::StrCat("SELECT state_id, 1 FROM ", LiveStates("state_id", where),
                         " ORDER BY state_id FORMAT TabSeparated");
    return r;
  }
  r.sql = absl::StrCat("SELECT state_id, 1 FROM ", StateTable(), " FINAL", where, " ORDER BY state_id FORMAT TabSeparated");
  return r;
}

SqlRequest Statements::CountStates() const {
  SqlRequest r = Read("count_states");
  ReadSettings(&r);
  if (cluster_.enabled()) {
    r.sql = absl::StrCat("SELECT count(), 1 FROM ", LiveStates("", ""), " FORMAT TabSeparated");
    return r;
  }
  r.sql = absl::StrCat("SELECT count(), 1 FROM ", StateTable(), " FINAL FORMAT TabSeparated");
  return r;
}

SqlRequest Statements::TruncateStates() const {
  SqlRequest r = Request("truncate_states", true);
  r.sql = absl::StrCat("TRUNCATE TABLE ", StateTable());
  return r;
}

SqlRequest Statements::StateTableEngine() const {
  SqlRequest r = Read("state_table_engine");
  // The second column: whether the servers know the cluster (cluster mode;
  // 1 otherwise), as the lock no longer runs DDL that would find out.
  const std::string known = cluster_.enabled()
                                ? absl::StrCat("(SELECT count() > 0 FROM system.clusters WHERE cluster = ",
                                               QuoteStringLiteral(cluster_.name), ")")
                                : std::string("1");
  r.sql = absl::StrCat("SELECT engine, ", known, " FROM system.tables WHERE database = ", QuoteStringLiteral(schema_),
                       " AND name = ", QuoteStringLiteral(table_), " FORMAT TabSeparated");
  return r;
}

SqlRequest Statements::ClearStates() const {
  if (!cluster_.enabled()) return TruncateStates();
  SqlRequest r = Request("clear_states", true);  // tombstones again for what is still live
  WriteSettings(&r);
  ReadSettings(&r);  // tombstone what the last quorum write left, not an older view
  r.sql = absl::StrCat("INSERT INTO ", StateTable(), " (state_id, partial_state, completed_state) SELECT state_id, ",
                       "CAST(NULL AS Nullable(String)), ", QuoteStringLiteral(kTombstone), " FROM ",
                       LiveStates("state_id", ""));
  return r;
}

}  // namespace chstate
