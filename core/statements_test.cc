// The exact SQL per dialect. A change here changes what runs on users'
// servers, so every statement is spelled out.
#include "core/statements.h"

#include "absl/strings/str_cat.h"
#include "core/dialect.h"
#include "core/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace chstate {
namespace {

using ::chstate::testing::IsOk;
using ::chstate::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Pair;

using Params = std::vector<std::pair<std::string, std::string>>;

struct Case {
  const char* name;
  Dialect dialect;
  SqlRequest (*make)(const Statements&);
  const char* sql;
  Params params;
  bool idempotent;
};

const Params kRead = {{"wait_end_of_query", "1"}};

TEST(Statements, ExactSqlPerDialect) {
  static const Case kCases[] = {
      {"create database", Dialect::kClickHouse18, [](const Statements& s) { return s.CreateDatabase(); },
       "CREATE DATABASE IF NOT EXISTS `meltano`", {}, true},
      {"state table 18", Dialect::kClickHouse18, [](const Statements& s) { return s.CreateStateTable(); },
       "CREATE TABLE IF NOT EXISTS `meltano`.`state` (state_id String, partial_state Nullable(String), "
       "completed_state Nullable(String), updated_at DateTime DEFAULT now()) ENGINE = "
       "ReplacingMergeTree(updated_at) ORDER BY state_id",
       {}, true},
      {"state table modern", Dialect::kModern, [](const Statements& s) { return s.CreateStateTable(); },
       "CREATE TABLE IF NOT EXISTS `meltano`.`state` (state_id String, partial_state Nullable(String), "
       "completed_state Nullable(String), updated_at DateTime64(3) DEFAULT now64(3)) ENGINE = "
       "ReplacingMergeTree(updated_at) ORDER BY state_id",
       {}, true},
      {"lock table 18 has no TTL", Dialect::kClickHouse18, [](const Statements& s) { return s.CreateLockTable(); },
       "CREATE TABLE IF NOT EXISTS `meltano`.`state_lock` (state_id String, lock_id String, locked_at DateTime "
       "DEFAULT now()) ENGINE = ReplacingMergeTree(locked_at) ORDER BY state_id",
       {}, true},
      {"lock table modern has TTL", Dialect::kModern, [](const Statements& s) { return s.CreateLockTable(); },
       "CREATE TABLE IF NOT EXISTS `meltano`.`state_lock` (state_id String, lock_id String, locked_at DateTime "
       "DEFAULT now()) ENGINE = ReplacingMergeTree(locked_at) ORDER BY state_id TTL locked_at + INTERVAL 300 "
       "SECOND",
       {}, true},
      {"get 18 uses a literal", Dialect::kClickHouse18, [](const Statements& s) { return s.GetState("it's"); },
       "SELECT partial_state, completed_state FROM `meltano`.`state` FINAL WHERE state_id = 'it\\'s' LIMIT 1 "
       "FORMAT TabSeparated",
       kRead, true},
      {"get modern uses a parameter", Dialect::kModern, [](const Statements& s) { return s.GetState("it's\n"); },
       "SELECT partial_state, completed_state FROM `meltano`.`state` FINAL WHERE state_id = {state_id:String} "
       "LIMIT 1 FORMAT TabSeparated",
       {{"wait_end_of_query", "1"}, {"param_state_id", "it\\'s\\x0a"}}, true},
      {"insert 18", Dialect::kClickHouse18,
       [](const Statements& s) { return s.InsertState("a", std::nullopt, std::string("{\"x\":\"'\"}"), "tok"); },
       "INSERT INTO `meltano`.`state` (state_id, partial_state, completed_state) VALUES ('a', NULL, "
       "'{\"x\":\"\\'\"}')",
       {}, false},
      {"insert modern disables async insert and dedups by token", Dialect::kModern,
       [](const Statements& s) { return s.InsertState("a", std::string("{}"), std::nullopt, "tok-1"); },
       "INSERT INTO `meltano`.`state` (state_id, partial_state, completed_state) VALUES ('a', '{}', NULL)",
       {{"async_insert", "0"}, {"insert_deduplication_token", "tok-1"}}, false},
      {"delete 18 is a mutation", Dialect::kClickHouse18, [](const Statements& s) { return s.DeleteState("a"); },
       "ALTER TABLE `meltano`.`state` DELETE WHERE state_id = 'a'", {}, true},
      {"delete modern is lightweight and synchronous", Dialect::kModern,
       [](const Statements& s) { return s.DeleteState("a"); },
       "DELETE FROM `meltano`.`state` WHERE state_id = {state_id:String}",
       {{"param_state_id", "a"}, {"mutations_sync", "2"}}, true},
      {"pending mutations", Dialect::kClickHouse18, [](const Statements& s) { return s.PendingMutations(); },
       "SELECT count(), 1 FROM system.mutations WHERE database = 'meltano' AND table = 'state' AND is_done = 0 FORMAT "
       "TabSeparated",
       kRead, true},
      {"history over its limits, modern: milliseconds", Dialect::kModern,
       [](const Statements& s) { return s.HistoryOverLimits("a", 5, 30); },
       "SELECT count(), countIf(updated_at < now() - INTERVAL 30 DAY), toUnixTimestamp64Milli(arrayElement("
       "arrayReverseSort(groupArray(updated_at)), 6)) FROM `meltano`.`state_history` WHERE state_id = "
       "{state_id:String} FORMAT TabSeparated",
       {{"wait_end_of_query", "1"}, {"param_state_id", "a"}}, true},
      {"history buffer: the history table's columns, flushed within 10 s", Dialect::kClickHouse18,
       [](const Statements& s) { return s.CreateHistoryBuffer(); },
       "CREATE TABLE IF NOT EXISTS `meltano`.`state_history_buffer` AS `meltano`.`state_history` ENGINE = "
       "Buffer('meltano', 'state_history', 1, 10, 10, 10000, 10000, 67108864, 67108864)",
       {}, true},
      {"history view, one server: into the buffer", Dialect::kClickHouse18,
       [](const Statements& s) { return s.CreateHistoryView(); },
       "CREATE MATERIALIZED VIEW IF NOT EXISTS `meltano`.`state_history_buffer_mv` TO "
       "`meltano`.`state_history_buffer` AS SELECT state_id, partial_state, completed_state, updated_at FROM "
       "`meltano`.`state`",
       {}, true},
      {"the view of a schema from before the buffer goes", Dialect::kClickHouse18,
       [](const Statements& s) { return s.DropUnbufferedHistoryView(); },
       "DROP TABLE IF EXISTS `meltano`.`state_history_mv`", {}, true},
      {"flush the history buffer before reading the history", Dialect::kModern,
       [](const Statements& s) { return s.FlushHistory(); }, "OPTIMIZE TABLE `meltano`.`state_history_buffer`", {},
       true},
      {"trim one id's history, modern: a mutation with a literal", Dialect::kModern,
       [](const Statements& s) { return s.TrimHistoryOf("a'", 1796155031123, 30); },
       "ALTER TABLE `meltano`.`state_history` DELETE WHERE state_id = 'a\\'' AND (updated_at <= "
       "fromUnixTimestamp64Milli(toInt64(1796155031123)) OR updated_at < now() - INTERVAL 30 DAY)",
       {}, true},
      {"export page 18: a range of the key", Dialect::kClickHouse18,
       [](const Statements& s) { return s.ExportStates(std::string("dev:*"), std::string("a"), std::string("b"), 5); },
       "SELECT state_id, partial_state, completed_state FROM `meltano`.`state` FINAL WHERE state_id LIKE 'dev:%' AND "
       "state_id > 'a' AND state_id <= 'b' ORDER BY state_id LIMIT 5 FORMAT TabSeparated",
       kRead, true},
      {"export page modern: the ends as parameters", Dialect::kModern,
       [](const Statements& s) { return s.ExportStates(std::nullopt, std::string("a"), std::string("b"), 5); },
       "SELECT state_id, partial_state, completed_state FROM `meltano`.`state` FINAL WHERE state_id > {after:String} "
       "AND state_id <= {upto:String} ORDER BY state_id LIMIT 5 FORMAT TabSeparated",
       {{"wait_end_of_query", "1"}, {"param_after", "a"}, {"param_upto", "b"}}, true},
      {"export sample: the id column, one in `every`", Dialect::kClickHouse18,
       [](const Statements& s) { return s.SampleStateIds(std::nullopt, std::nullopt, 1000, 7); },
       "SELECT state_id, 1 FROM `meltano`.`state` WHERE cityHash64(state_id) % 1000 = 0 AND length(state_id) <= "
       "1024 GROUP BY state_id ORDER BY state_id LIMIT 7 FORMAT TabSeparated",
       kRead, true},
      {"list all", Dialect::kModern, [](const Statements& s) { return s.ListStateIds(std::nullopt); },
       "SELECT state_id, 1 FROM `meltano`.`state` FINAL ORDER BY state_id FORMAT TabSeparated", kRead, true},
      {"list star is all", Dialect::kClickHouse18, [](const Statements& s) { return s.ListStateIds("*"); },
       "SELECT state_id, 1 FROM `meltano`.`state` FINAL ORDER BY state_id FORMAT TabSeparated", kRead, true},
      {"list glob 18", Dialect::kClickHouse18, [](const Statements& s) { return s.ListStateIds("dev:tap_a*"); },
       "SELECT state_id, 1 FROM `meltano`.`state` FINAL WHERE state_id LIKE 'dev:tap\\\\_a%' ORDER BY state_id FORMAT "
       "TabSeparated",
       kRead, true},
      {"list glob modern", Dialect::kModern, [](const Statements& s) { return s.ListStateIds("a_?"); },
       "SELECT state_id, 1 FROM `meltano`.`state` FINAL WHERE state_id LIKE {pattern:String} ORDER BY state_id FORMAT "
       "TabSeparated",
       {{"wait_end_of_query", "1"}, {"param_pattern", "a\\\\__"}}, true},
      {"count", Dialect::kModern, [](const Statements& s) { return s.CountStates(); },
       "SELECT count(), 1 FROM `meltano`.`state` FINAL FORMAT TabSeparated", kRead, true},
      {"truncate", Dialect::kModern, [](const Statements& s) { return s.TruncateStates(); },
       "TRUNCATE TABLE `meltano`.`state`", {}, true},
      {"create lock", Dialect::kClickHouse18, [](const Statements& s) { return s.CreateLock("a", "00ff", 300); },
       "CREATE TABLE `meltano`.`state_lock_af63dc4c8601ec8c` ENGINE = Log AS SELECT '00ff' AS lock_id, toUInt8(0) "
       "AS seq, now() AS locked_at, toUInt32(300) AS stale_s",
       {}, false},
      {"inspect lock", Dialect::kModern, [](const Statements& s) { return s.InspectLock("a"); },
       "SELECT lock_id, seq, toInt64(locked_at), materialize(toInt64(now())), stale_s FROM "
       "`meltano`.`state_lock_af63dc4c8601ec8c` UNION ALL SELECT '', toUInt8(255), "
       "toInt64(metadata_modification_time), materialize(toInt64(now())), toUInt32(0) FROM system.tables WHERE "
       "database = 'meltano' AND name = 'state_lock_af63dc4c8601ec8c' FORMAT TabSeparated",
       kRead, true},
      {"renew lock modern", Dialect::kModern, [](const Statements& s) { return s.RenewLock("a", "00ff", 300); },
       "INSERT INTO `meltano`.`state_lock_af63dc4c8601ec8c` SELECT '00ff', toUInt8(1), now(), toUInt32(300)",
       {{"async_insert", "0"}}, false},
      {"old tombstones", Dialect::kClickHouse18, [](const Statements& s) { return s.ListOldTombstones(600); },
       "SELECT name, 1 FROM system.tables WHERE database = 'meltano' AND name LIKE 'state\\\\_lock\\\\_%\\\\_dead\\\\_%' "
       "AND metadata_modification_time < now() - 600 FORMAT TabSeparated",
       kRead, true},
      {"drop lock", Dialect::kModern, [](const Statements& s) { return s.DropLock("a"); },
       "DROP TABLE IF EXISTS `meltano`.`state_lock_af63dc4c8601ec8c`", {}, false},
  };
  for (const Case& c : kCases) {
    SCOPED_TRACE(c.name);
    absl::StatusOr<Statements> st = Statements::Create(c.dialect, "meltano", "state");
    ASSERT_THAT(st, IsOk());
    SqlRequest r = c.make(*st);
    EXPECT_EQ(r.sql, c.sql);
    EXPECT_EQ(r.url_params, c.params);
    EXPECT_EQ(r.idempotent, c.idempotent);
    EXPECT_FALSE(r.purpose.empty());
  }
}

TEST(Statements, HostileIdsNeverLeaveTheLiteral) {
  static const std::string kIds[] = {
      "'; DROP TABLE meltano.state; --", "\\'", std::string("a\0b", 3), "\n\r\t", "`x`", "{state_id:String}",
      "\xff\xfe", std::string(100 * 1024, '\''),
  };
  absl::StatusOr<Statements> st = Statements::Create(Dialect::kClickHouse18, "meltano", "state");
  ASSERT_THAT(st, IsOk());
  for (const std::string& id : kIds) {
    SCOPED_TRACE(id.substr(0, 40));
    std::string sql = st->GetState(id).sql;
    std::string prefix = "SELECT partial_state, completed_state FROM `meltano`.`state` FINAL WHERE state_id = '";
    std::string suffix = "' LIMIT 1 FORMAT TabSeparated";
    ASSERT_EQ(sql.substr(0, prefix.size()), prefix);
    ASSERT_EQ(sql.substr(sql.size() - suffix.size()), suffix);
    std::string inner = sql.substr(prefix.size(), sql.size() - prefix.size() - suffix.size());
    // Inside the literal every quote is escaped and nothing is a raw control byte.
    for (size_t i = 0; i < inner.size(); ++i) {
      if (inner[i] == '\\') {
        ++i;
        continue;
      }
      EXPECT_NE(inner[i], '\'') << "unescaped quote at " << i;
      EXPECT_GE(static_cast<unsigned char>(inner[i]), 0x20);
    }
  }
}

TEST(Statements, LockNamesAreIdentifiersForAnyId) {
  absl::StatusOr<Statements> st = Statements::Create(Dialect::kModern, "meltano", "state");
  ASSERT_THAT(st, IsOk());
  EXPECT_EQ(st->LockTableName("a"), "state_lock_af63dc4c8601ec8c");
  EXPECT_NE(st->LockTableName("a"), st->LockTableName("b"));
  EXPECT_THAT(st->LockTableName(std::string(100000, '`')), ::testing::MatchesRegex("state_lock_[0-9a-f]{16}"));
  EXPECT_THAT(st->EntombLock("a", "'; DROP@5").sql,
              ::testing::MatchesRegex("RENAME TABLE `meltano`.`state_lock_af63dc4c8601ec8c` TO "
                                      "`meltano`.`state_lock_af63dc4c8601ec8c_dead_[0-9a-f]{16}`"));
  EXPECT_NE(st->TombstoneName("a", "h@1"), st->TombstoneName("a", "h@2"));
}

TEST(Statements, AWriteUnderATableLockIsFencedOnThatLock) {
  absl::StatusOr<Statements> st = Statements::Create(Dialect::kClickHouse18, "meltano", "state");
  ASSERT_THAT(st, IsOk());
  EXPECT_EQ(st->InsertState("a", std::nullopt, std::string("{}"), "t", "l1").sql,
            "INSERT INTO `meltano`.`state` (state_id, partial_state, completed_state) SELECT 'a', NULL, '{}' FROM "
            "(SELECT countIf(seq = 0 AND lock_id = 'l1') AS ours FROM `meltano`.`state_lock_af63dc4c8601ec8c`) "
            "WHERE throwIf(ours = 0) = 0");
  // No lock: the plain row.
  EXPECT_THAT(st->InsertState("a", std::nullopt, std::string("{}"), "t").sql, HasSubstr("VALUES ('a', NULL, '{}')"));
  // A state larger than the parser's default bound raises the bound for this query alone.
  const std::string big = absl::StrCat("{\"k\":\"", std::string(kDefaultMaxQuerySize, 'x'), "\"}");
  SqlRequest r = st->InsertState("a", std::nullopt, big, "t", "l1");
  EXPECT_THAT(r.url_params, ::testing::Contains(std::make_pair(std::string("max_query_size"),
                                                                std::to_string(r.sql.size() + 1))));
  for (const auto& [k, v] : st->InsertState("a", std::nullopt, std::string("{}"), "t", "l1").url_params) {
    EXPECT_NE(k, "max_query_size");
  }
  // Cluster mode holds claims, not a lock table: nothing to fence on.
  ClusterOptions c;
  c.name = "prod";
  absl::StatusOr<Statements> cl = Statements::Create(Dialect::kClickHouse18, "meltano", "state", c);
  ASSERT_THAT(cl, IsOk());
  EXPECT_THAT(cl->InsertState("a", std::nullopt, std::string("{}"), "t", "l1").sql, HasSubstr("VALUES ('a', NULL"));
}

const Params kDdl = {{"wait_end_of_query", "1"}, {"distributed_ddl_task_timeout", "10"}};
const Params kQuorum18 = {{"insert_quorum", "2"}, {"insert_quorum_timeout", "10000"}, {"insert_deduplicate", "0"}};
const Params kSequential = {{"wait_end_of_query", "1"}, {"select_sequential_consistency", "1"}};

ClusterOptions Cluster() {
  ClusterOptions c;
  c.name = "prod";
  return c;
}

TEST(Statements, ClusterModeSql) {
  static const Case kCases[] = {
      {"create database", Dialect::kClickHouse18, [](const Statements& s) { return s.CreateDatabase(); },
       "CREATE DATABASE IF NOT EXISTS `meltano` ON CLUSTER `prod`", kDdl, true},
      {"state table 18", Dialect::kClickHouse18, [](const Statements& s) { return s.CreateStateTable(); },
       "CREATE TABLE IF NOT EXISTS `meltano`.`state` ON CLUSTER `prod` (state_id String, partial_state "
       "Nullable(String), completed_state Nullable(String), updated_at DateTime DEFAULT now()) ENGINE = "
       "ReplicatedReplacingMergeTree('/clickhouse/tables/{shard}/meltano/state', '{replica}', updated_at) "
       "ORDER BY state_id",
       kDdl, true},
      {"python lock table", Dialect::kClickHouse18, [](const Statements& s) { return s.CreateLockTable(); },
       "CREATE TABLE IF NOT EXISTS `meltano`.`state_lock` ON CLUSTER `prod` (state_id String, lock_id String, "
       "locked_at DateTime DEFAULT now()) ENGINE = ReplicatedReplacingMergeTree("
       "'/clickhouse/tables/{shard}/meltano/state_lock', '{replica}', locked_at) ORDER BY state_id",
       kDdl, true},
      {"get 18: each replica's newest row (a tombstone too), its version and part, and the replica",
       Dialect::kClickHouse18, [](const Statements& s) { return s.GetState("a"); },
       "SELECT partial_state, completed_state, toString(toUInt64(toUnixTimestamp(updated_at)) * 1000), "
       "toString(toUInt64(splitByChar('_', _part)[3])), '', '', '' FROM `meltano`.`state` FINAL WHERE state_id = 'a' "
       "LIMIT 1 UNION ALL SELECT toNullable('#replica'), toNullable(toString(total_replicas)), '', '', '', "
       "replica_name, '' FROM system.replicas WHERE database = 'meltano' AND table = 'state' FORMAT TabSeparated",
       kSequential, true},
      {"get modern: milliseconds", Dialect::kModern, [](const Statements& s) { return s.GetState("a"); },
       "SELECT partial_state, completed_state, toString(toUnixTimestamp64Milli(updated_at)), "
       "toString(toUInt64(splitByChar('_', _part)[3])), '', '', '' FROM `meltano`.`state` FINAL WHERE "
       "state_id = {state_id:String} LIMIT 1 UNION ALL SELECT toNullable('#replica'), "
       "toNullable(toString(total_replicas)), '', '', '', replica_name, '' FROM system.replicas WHERE "
       "database = 'meltano' AND table = 'state' FORMAT TabSeparated",
       {{"wait_end_of_query", "1"}, {"select_sequential_consistency", "1"}, {"param_state_id", "a"}}, true},
      {"insert 18: quorum, no deduplication", Dialect::kClickHouse18,
       [](const Statements& s) { return s.InsertState("a", std::nullopt, std::string("{}"), "tok"); },
       "INSERT INTO `meltano`.`state` (state_id, partial_state, completed_state) VALUES ('a', NULL, '{}')",
       kQuorum18, true},
      {"insert modern: quorum, not parallel, token", Dialect::kModern,
       [](const Statements& s) { return s.InsertState("a", std::nullopt, std::string("{}"), "tok"); },
       "INSERT INTO `meltano`.`state` (state_id, partial_state, completed_state) VALUES ('a', NULL, '{}')",
       {{"async_insert", "0"}, {"insert_quorum", "2"}, {"insert_quorum_timeout", "10000"},
        {"insert_deduplicate", "0"}, {"insert_quorum_parallel", "0"}, {"insert_deduplication_token", "tok"}},
       true},
      {"claims table", Dialect::kClickHouse18, [](const Statements& s) { return s.CreateClaimsTable(); },
       "CREATE TABLE IF NOT EXISTS `meltano`.`state_claims` ON CLUSTER `prod` (name String, lock_id String, seq "
       "UInt8, at DateTime, stale_s UInt32, over String) ENGINE = ReplicatedMergeTree("
       "'/clickhouse/tables/{shard}/meltano/state_claims', '{replica}') PARTITION BY tuple() ORDER BY (name, "
       "lock_id, seq, at)",
       kDdl, true},
      {"a claim is a quorum insert", Dialect::kClickHouse18,
       [](const Statements& s) { return s.ClaimLock("a", "L1", 30, "L0"); },
       "INSERT INTO `meltano`.`state_claims` SELECT 'state_lock_af63dc4c8601ec8c', 'L1', toUInt8(0), now(), "
       "toUInt32(30), 'L0'",
       kQuorum18, false},
      {"ending a claim may be resent", Dialect::kClickHouse18, [](const Statements& s) { return s.EndClaim("a", "L1"); },
       "INSERT INTO `meltano`.`state_claims` SELECT 'state_lock_af63dc4c8601ec8c', 'L1', toUInt8(3), now(), "
       "toUInt32(0), ''",
       kQuorum18, true},
      {"claims are read from each replica as it is, naming it", Dialect::kClickHouse18,
       [](const Statements& s) { return s.InspectClaims("a"); },
       "SELECT lock_id, countIf(seq = 0), countIf(seq = 3), toInt64(max(at)), toInt64(anyIf(stale_s, seq = 0)), "
       "anyIf(over, seq = 0), materialize(toInt64(now())) FROM `meltano`.`state_claims` WHERE name = "
       "'state_lock_af63dc4c8601ec8c' GROUP BY lock_id ORDER BY lock_id UNION ALL SELECT '#replica', "
       "toUInt64(total_replicas), toUInt64(0), toInt64(0), toInt64(0), replica_name, toInt64(now()) FROM "
       "system.replicas WHERE database = 'meltano' AND table = 'state_claims' FORMAT TabSeparated",
       kRead, true},
      {"old claims are removed by a literal list, waiters' rows after an hour", Dialect::kClickHouse18,
       [](const Statements& s) { return s.PruneClaims("a", {"L1", "L'2"}); },
       "ALTER TABLE `meltano`.`state_claims` DELETE WHERE name = 'state_lock_af63dc4c8601ec8c' AND lock_id IN "
       "('L1', 'L\\'2') AND (seq != 2 OR at < now() - 3600)",
       {}, true},
      {"an export page: a range of live states", Dialect::kClickHouse18,
       [](const Statements& s) { return s.ExportStates(std::nullopt, std::string("a"), std::string("b"), 10); },
       "SELECT state_id, partial_state, completed_state FROM (SELECT state_id, partial_state, completed_state FROM "
       "`meltano`.`state` FINAL WHERE state_id > 'a' AND state_id <= 'b') WHERE ifNull(completed_state, '') != "
       "'chstate:deleted' ORDER BY state_id LIMIT 10 FORMAT TabSeparated",
       kSequential, true},
      {"delete is a tombstone", Dialect::kClickHouse18, [](const Statements& s) { return s.DeleteState("a"); },
       "INSERT INTO `meltano`.`state` (state_id, partial_state, completed_state) VALUES ('a', NULL, "
       "'chstate:deleted')",
       kQuorum18, true},
      {"list", Dialect::kClickHouse18, [](const Statements& s) { return s.ListStateIds(std::string("dev:*")); },
       "SELECT state_id, 1 FROM (SELECT state_id, completed_state FROM `meltano`.`state` FINAL WHERE state_id "
       "LIKE 'dev:%') WHERE ifNull(completed_state, '') != 'chstate:deleted' ORDER BY state_id FORMAT TabSeparated",
       kSequential, true},
      {"count", Dialect::kClickHouse18, [](const Statements& s) { return s.CountStates(); },
       "SELECT count(), 1 FROM (SELECT completed_state FROM `meltano`.`state` FINAL) WHERE "
       "ifNull(completed_state, '') != 'chstate:deleted' FORMAT TabSeparated",
       kSequential, true},
      {"clear all tombstones every live state", Dialect::kClickHouse18,
       [](const Statements& s) { return s.ClearStates(); },
       "INSERT INTO `meltano`.`state` (state_id, partial_state, completed_state) SELECT state_id, CAST(NULL AS "
       "Nullable(String)), 'chstate:deleted' FROM (SELECT state_id, completed_state FROM `meltano`.`state` FINAL) "
       "WHERE ifNull(completed_state, '') != 'chstate:deleted'",
       {{"insert_quorum", "2"}, {"insert_quorum_timeout", "10000"}, {"insert_deduplicate", "0"},
        {"select_sequential_consistency", "1"}},
       true},
      {"create lock: ON CLUSTER, replicated, path per instance", Dialect::kClickHouse18,
       [](const Statements& s) { return s.CreateLock("a", "00ff", 300); },
       "CREATE TABLE `meltano`.`state_lock_af63dc4c8601ec8c` ON CLUSTER `prod` ENGINE = ReplicatedMergeTree("
       "'/clickhouse/tables/{shard}/meltano/state_lock_af63dc4c8601ec8c/c3489ff9ec486615', '{replica}') ORDER BY "
       "tuple() SETTINGS replicated_deduplication_window = 0 AS SELECT '00ff' AS lock_id, toUInt8(0) AS seq, "
       "now() AS locked_at, toUInt32(300) AS stale_s",
       kDdl, false},
      {"renew lock with the quorum", Dialect::kClickHouse18,
       [](const Statements& s) { return s.RenewLock("a", "00ff", 300); },
       "INSERT INTO `meltano`.`state_lock_af63dc4c8601ec8c` SELECT '00ff', toUInt8(1), now(), toUInt32(300)",
       kQuorum18, false},
      {"drop lock", Dialect::kClickHouse18, [](const Statements& s) { return s.DropLock("a"); },
       "DROP TABLE IF EXISTS `meltano`.`state_lock_af63dc4c8601ec8c` ON CLUSTER `prod`", kDdl, false},
      {"history view, cluster mode: into the replicated table (no buffer: another replica would not see it)",
       Dialect::kClickHouse18, [](const Statements& s) { return s.CreateHistoryView(); },
       "CREATE MATERIALIZED VIEW IF NOT EXISTS `meltano`.`state_history_mv` ON CLUSTER `prod` TO "
       "`meltano`.`state_history` AS SELECT state_id, partial_state, completed_state, updated_at FROM "
       "`meltano`.`state`",
       kDdl, true},
      {"engine check, and whether the servers know the cluster", Dialect::kClickHouse18,
       [](const Statements& s) { return s.StateTableEngine(); },
       "SELECT engine, (SELECT count() > 0 FROM system.clusters WHERE cluster = 'prod') FROM system.tables WHERE "
       "database = 'meltano' AND name = 'state' FORMAT TabSeparated",
       kRead, true},
      {"drop tombstone", Dialect::kClickHouse18, [](const Statements& s) { return s.DropTable("t_dead_1"); },
       "DROP TABLE IF EXISTS `meltano`.`t_dead_1` ON CLUSTER `prod`", kDdl, true},
  };
  for (const Case& c : kCases) {
    SCOPED_TRACE(c.name);
    absl::StatusOr<Statements> st = Statements::Create(c.dialect, "meltano", "state", Cluster());
    ASSERT_THAT(st, IsOk());
    SqlRequest r = c.make(*st);
    EXPECT_EQ(r.sql, c.sql);
    EXPECT_EQ(r.url_params, c.params);
    EXPECT_EQ(r.idempotent, c.idempotent);
  }
  absl::StatusOr<Statements> st = Statements::Create(Dialect::kClickHouse18, "meltano", "state", Cluster());
  ASSERT_THAT(st, IsOk());
  EXPECT_THAT(st->EntombLock("a", "h@1").sql,
              ::testing::MatchesRegex("RENAME TABLE `meltano`.`state_lock_af63dc4c8601ec8c` TO "
                                      "`meltano`.`state_lock_af63dc4c8601ec8c_dead_[0-9a-f]{16}` ON CLUSTER `prod`"));
  // Two instances of one lock never share a ZooKeeper path.
  EXPECT_NE(st->CreateLock("a", "00ff", 300).sql, st->CreateLock("a", "00fe", 300).sql);
  // Without a cluster name nothing changes.
  absl::StatusOr<Statements> single = Statements::Create(Dialect::kClickHouse18, "meltano", "state");
  ASSERT_THAT(single, IsOk());
  EXPECT_EQ(single->ClearStates().sql, "TRUNCATE TABLE `meltano`.`state`");
}

TEST(Statements, ClusterPathsAndReplicaAreOverridable) {
  ClusterOptions c = Cluster();
  c.zookeeper_path = "/ch/{cluster}";
  c.replica = "{host}";
  c.quorum = 3;
  absl::StatusOr<Statements> st = Statements::Create(Dialect::kClickHouse18, "m", "s", c);
  ASSERT_THAT(st, IsOk());
  EXPECT_THAT(st->CreateStateTable().sql, HasSubstr("ReplicatedReplacingMergeTree('/ch/{cluster}/m/s', '{host}', "));
  EXPECT_THAT(st->InsertState("a", std::nullopt, std::nullopt, "t").url_params,
              ::testing::Contains(Pair("insert_quorum", "3")));
}

TEST(Statements, RejectsClusterSettingsThatCannotGoIntoDdl) {
  for (auto mutate : std::vector<void (*)(ClusterOptions*)>{
           [](ClusterOptions* c) { c->name = "a`b"; },
           [](ClusterOptions* c) { c->zookeeper_path = "relative/x"; },
           [](ClusterOptions* c) { c->zookeeper_path = "/a'b"; },
           [](ClusterOptions* c) { c->replica = "r'"; },
           [](ClusterOptions* c) { c->quorum = 0; },
           [](ClusterOptions* c) { c->quorum = 1; },
       }) {
    ClusterOptions c = Cluster();
    mutate(&c);
    EXPECT_THAT(Statements::Create(Dialect::kClickHouse18, "m", "s", c),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("")));
  }
}

TEST(Statements, AQuorumBelowTwoIsRefusedWithTheReason) {
  ClusterOptions c = Cluster();
  c.quorum = 1;
  EXPECT_THAT(Statements::Create(Dialect::kClickHouse18, "m", "s", c),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("quorum is 1, and it must be at least 2")));
}

TEST(Statements, RejectsBadNames) {
  EXPECT_THAT(Statements::Create(Dialect::kModern, "a`b", "state"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("schema")));
  EXPECT_THAT(Statements::Create(Dialect::kModern, "meltano", "x;drop"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("table")));
}

TEST(Fnv1a64, KnownValues) {
  // Published FNV-1a 64 test values.
  EXPECT_EQ(Fnv1a64(""), 0xcbf29ce484222325ull);
  EXPECT_EQ(Fnv1a64("a"), 0xaf63dc4c8601ec8cull);
  EXPECT_EQ(Fnv1a64("foobar"), 0x85944171f73967e8ull);
}

struct VersionCase {
  const char* text;
  bool parses;
  absl::StatusCode dialect_code;
  Dialect dialect;
};

TEST(Dialect, ChosenFromVersion) {
  static const VersionCase kCases[] = {
      {"18.16.1", true, absl::StatusCode::kOk, Dialect::kClickHouse18},
      {"18.16.1\n", true, absl::StatusCode::kOk, Dialect::kClickHouse18},
      {"19.17.4.11", true, absl::StatusCode::kOk, Dialect::kClickHouse18},
      {"23.2.7.32", true, absl::StatusCode::kOk, Dialect::kClickHouse18},
      {"23.3.1.2823", true, absl::StatusCode::kOk, Dialect::kModern},
      {"24.3.1.2672-lts", true, absl::StatusCode::kOk, Dialect::kModern},
      {"26.9.2.1", true, absl::StatusCode::kOk, Dialect::kModern},
      {"18.14.19", true, absl::StatusCode::kFailedPrecondition, Dialect::kModern},
      {"1.1.54394", true, absl::StatusCode::kFailedPrecondition, Dialect::kModern},
      {"not a version", false, absl::StatusCode::kOk, Dialect::kModern},
      {"", false, absl::StatusCode::kOk, Dialect::kModern},
  };
  for (const VersionCase& c : kCases) {
    SCOPED_TRACE(c.text);
    absl::StatusOr<ServerVersion> v = ParseServerVersion(c.text);
    if (!c.parses) {
      EXPECT_THAT(v, StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("version")));
      continue;
    }
    ASSERT_THAT(v, IsOk());
    absl::StatusOr<Dialect> d = DialectFor(*v);
    if (c.dialect_code != absl::StatusCode::kOk) {
      EXPECT_THAT(d, StatusIs(c.dialect_code, HasSubstr("18.16")));
    } else {
      ASSERT_THAT(d, IsOk());
      EXPECT_EQ(*d, c.dialect);
    }
  }
}

}  // namespace
}  // namespace chstate
