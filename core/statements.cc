// SQL text per dialect. Reads ask for TabSeparated and, over HTTP, for
// wait_end_of_query=1 so that an error arrives as an HTTP error instead of
// after a 200 and part of a result. Every read returns at least two columns
// (a constant 1 where one would do): an exception appended to a streamed
// result is a line without a tab, so it can never pass for a row.
#include "core/statements.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/quoting.h"

namespace chstate {
namespace {

SqlRequest Request(std::string purpose, bool idempotent) {
  SqlRequest r;
  r.purpose = std::move(purpose);
  r.idempotent = idempotent;
  return r;
}

SqlRequest Read(std::string purpose) {
  SqlRequest r = Request(std::move(purpose), true);
  r.url_params.emplace_back("wait_end_of_query", "1");
  return r;
}

}  // namespace

uint64_t Fnv1a64(absl::string_view bytes) {
  uint64_t h = 14695981039346656037ull;
  for (unsigned char c : bytes) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

absl::StatusOr<Statements> Statements::Create(Dialect dialect, absl::string_view schema, absl::string_view table) {
  if (absl::Status s = ValidateIdentifier(schema, "schema"); !s.ok()) return s;
  if (absl::Status s = ValidateIdentifier(table, "table"); !s.ok()) return s;
  return Statements(dialect, std::string(schema), std::string(table));
}

std::string Statements::StateTable() const { return absl::StrCat("`", schema_, "`.`", table_, "`"); }

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
  SqlRequest r = Request("create_database", true);
  r.sql = absl::StrCat("CREATE DATABASE IF NOT EXISTS `", schema_, "`");
  return r;
}

SqlRequest Statements::CreateStateTable() const {
  SqlRequest r = Request("create_state_table", true);
  // Same columns and engine as the Python ClickHouse backend, so either tool
  // reads what the other wrote. 18.x has no DateTime64: one-second versions,
  // and ReplacingMergeTree keeps the last inserted row among equal versions.
  const char* version_column = dialect_ == Dialect::kModern ? "updated_at DateTime64(3) DEFAULT now64(3)"
                                                            : "updated_at DateTime DEFAULT now()";
  r.sql = absl::StrCat("CREATE TABLE IF NOT EXISTS ", StateTable(),
                       " (state_id String, partial_state Nullable(String), completed_state Nullable(String), ",
                       version_column, ") ENGINE = ReplacingMergeTree(updated_at) ORDER BY state_id");
  return r;
}

SqlRequest Statements::CreateLockTable() const {
  SqlRequest r = Request("create_lock_table", true);
  std::string ttl = dialect_ == Dialect::kModern ? " TTL locked_at + INTERVAL 300 SECOND" : "";
  r.sql = absl::StrCat("CREATE TABLE IF NOT EXISTS `", schema_, "`.`", table_,
                       "_lock` (state_id String, lock_id String, locked_at DateTime DEFAULT now()) "
                       "ENGINE = ReplacingMergeTree(locked_at) ORDER BY state_id",
                       ttl);
  return r;
}

SqlRequest Statements::GetState(absl::string_view state_id) const {
  SqlRequest r = Read("get_state");
  std::string where = StateIdEquals(&r, state_id);
  r.sql = absl::StrCat("SELECT partial_state, completed_state FROM ", StateTable(), " FINAL WHERE ", where,
                       " LIMIT 1 FORMAT TabSeparated");
  return r;
}

SqlRequest Statements::InsertState(absl::string_view state_id, const std::optional<std::string>& partial_json,
                                   const std::optional<std::string>& completed_json,
                                   absl::string_view dedup_token) const {
  SqlRequest r = Request("insert_state", false);
  auto value = [](const std::optional<std::string>& v) { return v ? QuoteStringLiteral(*v) : std::string("NULL"); };
  std::string values = absl::StrCat("(", QuoteStringLiteral(state_id), ", ", value(partial_json), ", ",
                                    value(completed_json), ")");
  if (dialect_ == Dialect::kModern) {
    // async_insert is on by default from 26.2: a buffered insert could be
    // invisible to the next read. A unique token stops block deduplication
    // from dropping a write that repeats an earlier one (A, B, A).
    r.url_params.emplace_back("async_insert", "0");
    r.url_params.emplace_back("insert_deduplication_token", std::string(dedup_token));
  }
  r.sql = absl::StrCat("INSERT INTO ", StateTable(), " (state_id, partial_state, completed_state) VALUES ", values);
  return r;
}

SqlRequest Statements::DeleteState(absl::string_view state_id) const {
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
  std::string where;
  if (glob && *glob != "*") {
    std::string like = GlobToLike(*glob);
    if (dialect_ == Dialect::kModern) {
      r.url_params.emplace_back("param_pattern", EscapeParamValue(like));
      where = " WHERE state_id LIKE {pattern:String}";
    } else {
      where = absl::StrCat(" WHERE state_id LIKE ", QuoteStringLiteral(like));
    }
  }
  r.sql = absl::StrCat("SELECT state_id, 1 FROM ", StateTable(), " FINAL", where, " ORDER BY state_id FORMAT TabSeparated");
  return r;
}

SqlRequest Statements::CountStates() const {
  SqlRequest r = Read("count_states");
  r.sql = absl::StrCat("SELECT count(), 1 FROM ", StateTable(), " FINAL FORMAT TabSeparated");
  return r;
}

SqlRequest Statements::TruncateStates() const {
  SqlRequest r = Request("truncate_states", true);
  r.sql = absl::StrCat("TRUNCATE TABLE ", StateTable());
  return r;
}

std::string Statements::LockTableName(absl::string_view state_id) const {
  return absl::StrFormat("%s_lock_%016x", table_, Fnv1a64(state_id));
}

std::string Statements::TombstoneName(absl::string_view state_id, absl::string_view instance) const {
  return absl::StrFormat("%s_dead_%016x", LockTableName(state_id), Fnv1a64(instance));
}

SqlRequest Statements::CreateLock(absl::string_view state_id, absl::string_view lock_id, int64_t stale_s) const {
  SqlRequest r = Request("create_lock", false);
  // Log engine: the lock survives a server restart, with its times, so a
  // holder keeps it and a dead holder's lock still goes stale.
  r.sql = absl::StrCat("CREATE TABLE `", schema_, "`.`", LockTableName(state_id), "` ENGINE = Log AS SELECT ",
                       QuoteStringLiteral(lock_id), " AS lock_id, toUInt8(0) AS seq, now() AS locked_at, toUInt32(",
                       stale_s, ") AS stale_s");
  return r;
}

SqlRequest Statements::InspectLock(absl::string_view state_id) const {
  SqlRequest r = Read("inspect_lock");
  std::string name = LockTableName(state_id);
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

SqlRequest Statements::RenewLock(absl::string_view state_id, absl::string_view lock_id, int64_t stale_s) const {
  SqlRequest r = Request("renew_lock", false);
  if (dialect_ == Dialect::kModern) r.url_params.emplace_back("async_insert", "0");
  r.sql = absl::StrCat("INSERT INTO `", schema_, "`.`", LockTableName(state_id), "` SELECT ",
                       QuoteStringLiteral(lock_id), ", toUInt8(1), now(), toUInt32(", stale_s, ")");
  return r;
}

SqlRequest Statements::DropLock(absl::string_view state_id) const {
  SqlRequest r = Request("drop_lock", true);
  r.sql = absl::StrCat("DROP TABLE IF EXISTS `", schema_, "`.`", LockTableName(state_id), "`");
  return r;
}

SqlRequest Statements::EntombLock(absl::string_view state_id, absl::string_view instance) const {
  SqlRequest r = Request("entomb_lock", false);
  r.sql = absl::StrCat("RENAME TABLE `", schema_, "`.`", LockTableName(state_id), "` TO `", schema_, "`.`",
                       TombstoneName(state_id, instance), "`");
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
  SqlRequest r = Request("drop_table", true);
  r.sql = absl::StrCat("DROP TABLE IF EXISTS `", schema_, "`.`", name, "`");
  return r;
}

}  // namespace chstate
