// The simulated ClickHouse server: statement recognition by regular
// expression over the exact SQL text, and the table model it acts on.
#include "tests/sim/sim_server.h"

#include <algorithm>
#include <cstdint>
#include <set>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "re2/re2.h"

namespace chstate::sim {
namespace {

// A ClickHouse string literal as core/quoting.h writes it, captured with its
// escapes; Unquote decodes it.
#define LIT R"('((?:[^'\\]|\\.)*)')"
#define ID "`([A-Za-z0-9_]+)`"

std::string Unquote(const std::string& s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] != '\\' || i + 1 == s.size()) {
      out.push_back(s[i]);
      continue;
    }
    char e = s[++i];
    int v = 0;
    if (e == 'x' && i + 2 < s.size() && absl::SimpleHexAtoi(s.substr(i + 1, 2), &v)) {
      out.push_back(static_cast<char>(v));
      i += 2;
      continue;
    }
    out.push_back(e);  // \\ and \'
  }
  return out;
}

// The statements, each matched against the whole SQL text. Anything else is
// unrecognised.
struct Patterns {
  RE2 select_version{"SELECT version\\(\\), 1 FORMAT TabSeparated"};
  // A cluster store's check of the state table's engine (and that the
  // servers know the cluster), after the version.
  RE2 state_table_engine{"SELECT engine, \\(SELECT count\\(\\) > 0 FROM system\\.clusters WHERE cluster = " LIT
                         "\\) FROM system\\.tables WHERE database = " LIT " AND name = " LIT " FORMAT TabSeparated"};
  RE2 create_database{"CREATE DATABASE IF NOT EXISTS " ID "(?: ON CLUSTER `[A-Za-z0-9_.-]+`)?"};
  // Cluster mode: the claims (Statements::CreateClaimsTable, ClaimLock,
  // RenewClaim, EndClaim, InspectClaims).
  RE2 create_claims{"CREATE TABLE IF NOT EXISTS " ID "\\." ID " ON CLUSTER `[A-Za-z0-9_.-]+` \\(name String, "
                    "lock_id String, seq UInt8, at DateTime, stale_s UInt32, over String\\) ENGINE = "
                    "ReplicatedMergeTree\\('[^']*', '[^']*'\\) PARTITION BY tuple\\(\\) ORDER BY \\(name, lock_id, "
                    "seq, at\\)"};
  // seq 2: a waiter's row naming the holder (a store's lock shows itself while it waits).
  RE2 claim_insert{"INSERT INTO " ID "\\." ID " SELECT " LIT ", " LIT ", toUInt8\\(([0-3])\\), now\\(\\), "
                   "toUInt32\\((\\d+)\\), " LIT};
  RE2 inspect_claims{"SELECT lock_id, countIf\\(seq = 0\\), countIf\\(seq = 3\\), toInt64\\(max\\(at\\)\\), "
                     "toInt64\\(anyIf\\(stale_s, seq = 0\\)\\), anyIf\\(over, seq = 0\\), "
                     "materialize\\(toInt64\\(now\\(\\)\\)\\) FROM " ID "\\." ID " WHERE name = " LIT
                     " GROUP BY lock_id ORDER BY lock_id UNION ALL SELECT '#replica', toUInt64\\(total_replicas\\), "
                     "toUInt64\\(0\\), toInt64\\(0\\), toInt64\\(0\\), replica_name, toInt64\\(now\\(\\)\\) "
                     "FROM system\\.replicas WHERE database = (?:" LIT ") AND table = (?:" LIT ") FORMAT TabSeparated"};
  RE2 prune_claims{"ALTER TABLE " ID "\\." ID " DELETE WHERE name = " LIT " AND lock_id IN \\(((?:" LIT
                   "(?:, )?)+)\\) AND \\(seq != 2 OR at < now\\(\\) - 3600\\)"};
  RE2 one_literal{LIT};
  RE2 create_lock{"CREATE TABLE " ID "\\." ID " ENGINE = Log AS SELECT " LIT
                  " AS lock_id, toUInt8\\(0\\) AS seq, now\\(\\) AS locked_at, toUInt32\\((\\d+)\\) AS stale_s"};
  RE2 inspect_lock{"SELECT lock_id, seq, toInt64\\(locked_at\\), materialize\\(toInt64\\(now\\(\\)\\)\\), stale_s "
                   "FROM " ID "\\." ID " UNION ALL SELECT '', toUInt8\\(255\\), "
                   "toInt64\\(metadata_modification_time\\), materialize\\(toInt64\\(now\\(\\)\\)\\), toUInt32\\(0\\) "
                   "FROM system\\.tables WHERE database = " LIT " AND name = " LIT " FORMAT TabSeparated"};
  RE2 renew_lock{"INSERT INTO " ID "\\." ID " SELECT " LIT ", toUInt8\\(1\\), now\\(\\), toUInt32\\((\\d+)\\)"};
  // A waiter showing itself (linger_locks), and a lingering holder's look for it.
  RE2 announce_waiter{"INSERT INTO " ID "\\." ID " SELECT " LIT ", toUInt8\\(2\\), now\\(\\), toUInt32\\(0\\)"};
  RE2 lock_waiters{"SELECT lock_id, 1 FROM " ID "\\." ID " WHERE seq = 2 LIMIT 1 FORMAT TabSeparated"};
  RE2 drop_table{"DROP TABLE IF EXISTS " ID "\\." ID};
  RE2 rename_table{"RENAME TABLE " ID "\\." ID " TO " ID "\\." ID};
  // The Python backend's lock table (Statements::CreateLockTable).
  RE2 create_rmt{"CREATE TABLE IF NOT EXISTS " ID "\\." ID
                 " \\(state_id String, lock_id String, locked_at DateTime DEFAULT now\\(\\)\\) "
                 "ENGINE = ReplacingMergeTree\\(locked_at\\) ORDER BY state_id(?: TTL locked_at \\+ INTERVAL \\d+ "
                 "SECOND)?"};
  // The naive lock's statements (tests/sim/naive_lock.cc).
  RE2 rmt_insert{"INSERT INTO " ID "\\." ID " \\(state_id, lock_id\\) VALUES \\(" LIT ", " LIT "\\)"};
  RE2 rmt_select_final{"SELECT lock_id, toInt64\\(locked_at\\), toInt64\\(now\\(\\)\\) FROM " ID "\\." ID
                       " FINAL WHERE state_id = " LIT " FORMAT TabSeparated"};
  RE2 rmt_delete{"ALTER TABLE " ID "\\." ID " DELETE WHERE state_id = " LIT " AND lock_id = " LIT};
  // A chstate acquirer looking for the Python backend's live rows (always,
  // since a mixed fleet is safe by default; core/statements.h ForeignLockRows),
  // alone or with the parts' block number after it.
  RE2 foreign_rows{"SELECT lock_id, 1 FROM " ID "\\." ID " WHERE state_id = (?:" LIT "|\\{state_id:String\\}) AND "
                   "locked_at >= now\\(\\) - (\\d+) "
                   "AND NOT startsWith\\(lock_id, '!chstate:'\\) AND NOT startsWith\\(lock_id, 'chstate:'\\)"
                   "( UNION ALL SELECT toString\\(count\\(\\) \\+ countIf\\(min_block_number != max_block_number\\)\\), 2 "
                   "FROM system\\.parts WHERE database = " LIT " AND table = " LIT " AND active AND max_block_number > "
                   "(\\d+))? FORMAT TabSeparated"};
  // python_locks (core/statements.h): the parts' block number, the marker,
  // its removal on a modern server (18.x: rmt_delete).
  RE2 lock_blocks{"SELECT toString\\(max\\(max_block_number\\)\\), 2 FROM system\\.parts WHERE database = " LIT
                  " AND table = " LIT " AND active FORMAT TabSeparated"};
  RE2 marker_insert{"INSERT INTO " ID "\\." ID " \\(state_id, lock_id, locked_at\\) SELECT " LIT ", " LIT
                    ", now\\(\\) \\+ (\\d+)"};
  RE2 modern_delete{"DELETE FROM " ID "\\." ID " WHERE state_id = (?:" LIT "|\\{state_id:String\\}) AND lock_id = " LIT};
  // The Python backend's own statements (tests/sim/python_backend_lock.h).
  RE2 python_first_read{"SELECT lock_id FROM " ID "\\." ID " FINAL WHERE state_id = " LIT
                        " ORDER BY lock_id LIMIT 1 FORMAT TabSeparated"};
  RE2 python_every_row{"SELECT lock_id FROM " ID "\\." ID " WHERE state_id = " LIT " FORMAT TabSeparated"};
  RE2 python_delete_stale{"ALTER TABLE " ID "\\." ID " DELETE WHERE locked_at < now\\(\\) - (\\d+)"};
};

const Patterns& P() {
  static const Patterns* const p = new Patterns();
  return *p;
}

#undef LIT
#undef ID

int64_t Seconds(int64_t ms) { return ms >= 0 ? ms / 1000 : -((-ms + 999) / 1000); }

}  // namespace

std::string TsvEscape(const std::string& field) {
  std::string out;
  for (char c : field) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out.push_back(c);
    }
  }
  return out;
}

SimServer::SimServer(ServerOptions options, std::mt19937_64* rng)
    : options_(std::move(options)), rng_(rng), database_exists_(options_.database_exists) {}

bool SimServer::Chance(double p) {
  if (p <= 0) return false;
  return static_cast<double>((*rng_)() >> 11) * (1.0 / 9007199254740992.0) < p;
}

int64_t SimServer::Upto(int64_t max) {
  if (max <= 0) return 0;
  return static_cast<int64_t>((*rng_)() % static_cast<uint64_t>(max + 1));
}

Execution SimServer::Ok(std::string body, int64_t now_ms, std::string summary) const {
  Execution e;
  e.response.http_status = 200;
  e.response.body = std::move(body);
  e.done_ms = now_ms;
  e.summary = std::move(summary);
  return e;
}

Execution SimServer::Error(int code, const std::string& message, int64_t now_ms) const {
  Execution e;
  e.done_ms = now_ms;
  e.summary = absl::StrCat("code ", code);
  if (options_.dialect == Dialect::kClickHouse18) {
    // 18.16 over HTTP: status 500 and the exception text, no code header.
    e.response.http_status = 500;
    e.response.body = absl::StrCat("Code: ", code, ", e.displayText() = DB::Exception: ", message,
                                   ", e.what() = DB::Exception\n");
  } else {
    e.response.http_status = (code == 60 || code == 81) ? 404 : (code == 62 ? 400 : 500);
    e.response.exception_code_header = absl::StrCat(code);
    const char* name = code == 57    ? "TABLE_ALREADY_EXISTS"
                       : code == 60  ? "UNKNOWN_TABLE"
                       : code == 81  ? "UNKNOWN_DATABASE"
                       : code == 218 ? "TABLE_IS_DROPPED"
                                     : "SYNTAX_ERROR";
    e.response.body =
        absl::StrCat("Code: ", code, ". DB::Exception: ", message, " (", name,
                     ") (version 23.8.2.7 (official build))\n");
  }
  return e;
}

bool SimServer::JustDropped(const std::string& name, int64_t now_ms) {
  auto it = dropped_ms_.find(name);
  return it != dropped_ms_.end() && now_ms - it->second < options_.dropped_race_ms && Chance(0.5);
}

Execution SimServer::BeingDropped(const std::string& db, const std::string& name, int64_t now_ms) const {
  return Error(218, absl::StrCat("Table ", db, ".", name, " is dropped"), now_ms);
}

Execution SimServer::UnknownTable(const std::string& name, int64_t now_ms) const {
  return Error(60, absl::StrCat("Table ", options_.schema, ".", name, " doesn't exist."), now_ms);
}

Execution SimServer::Unrecognized(const SqlRequest& request, const std::string& why, int64_t now_ms) {
  unrecognized_.push_back(absl::StrCat(why, " [", request.purpose, "]: ", request.sql));
  return Error(62, absl::StrCat("Syntax error (simulated server: ", why, ")"), now_ms);
}

bool SimServer::CheckDatabase(const std::string& db, int64_t now_ms, Execution* error) const {
  if (db == options_.schema && database_exists_) return true;
  *error = Error(81, absl::StrCat("Database ", db, " doesn't exist"), now_ms);
  return false;
}

const Table* SimServer::Find(const std::string& name) const {
  auto it = tables_.find(name);
  return it == tables_.end() ? nullptr : &it->second;
}

int SimServer::ReplicaOf(const SqlRequest& request) const {
  int i = 0;
  absl::string_view host = request.endpoint.host;
  if (!absl::ConsumePrefix(&host, "replica-") || !absl::SimpleAtoi(host, &i) || i < 0 || i >= options_.replicas) {
    return 0;  // no host list: one address in front of the replicas reaches the first
  }
  return i;
}

void SimServer::PlaceOnReplicas(ClaimRow* r, int inserted_into) {
  // The replica it was inserted into has it at once (confirmed or not).
  r->on_replica_ms.assign(options_.replicas, INT64_MAX);
  r->on_replica_ms[inserted_into] = r->stamped_ms;
  std::vector<int> others;
  for (int i = 0; i < options_.replicas; ++i) {
    if (i != inserted_into && i != options_.dead_replica) others.push_back(i);
  }
  std::shuffle(others.begin(), others.end(), *rng_);
  for (size_t k = 0; k < others.size(); ++k) {
    // The quorum has it when it is confirmed; the others fetch it later.
    const bool in_quorum = static_cast<int>(k) + 1 < options_.replica_quorum;
    r->on_replica_ms[others[k]] = r->visible_ms == INT64_MAX ? INT64_MAX
                                  : in_quorum                ? r->visible_ms
                                                             : r->visible_ms + Upto(options_.replica_fetch_max_ms);
  }
}

Execution SimServer::Execute(const SqlRequest& request, int64_t now_ms) {
  const Patterns& p = P();
  const std::string& sql = request.sql;
  const int64_t now_s = Seconds(now_ms);
  std::string db, db2, name, name2, lit, lit2;
  int64_t stale_s = 0;
  Execution err;

  if (RE2::FullMatch(sql, p.select_version)) {
    // The store's first question (tests/sim drives whole stores too).
    return Ok(options_.dialect == Dialect::kClickHouse18 ? "18.16.1\t1\n" : "26.9.2.1\t1\n", now_ms, "version");
  }

  if (RE2::FullMatch(sql, p.state_table_engine, &lit, &lit2, &name)) {
    // The state table, created replicated by `chstate init` (the lock never
    // writes it); the cluster is the one the claims are made ON CLUSTER.
    if (Unquote(lit2) != options_.schema || Unquote(name) != "state") {
      return Unrecognized(request, "the engine of another table", now_ms);
    }
    if (!database_exists_) return Ok("", now_ms, "no state table");
    return Ok("ReplicatedReplacingMergeTree\t1\n", now_ms, absl::StrCat("state table replicated, cluster ", Unquote(lit)));
  }

  if (RE2::FullMatch(sql, p.create_database, &db)) {
    if (db != options_.schema) return Unrecognized(request, "a database other than the schema", now_ms);
    database_exists_ = true;
    return Ok("", now_ms, "database ok");
  }

  if (RE2::FullMatch(sql, p.create_claims, &db, &name)) {
    if (!CheckDatabase(db, now_ms, &err)) return err;
    if (name != "state_claims") return Unrecognized(request, "a claims table of another name", now_ms);
    claims_table_ = true;
    return Ok("", now_ms, "claims table ok");
  }

  int seq = 0;
  std::string over_lit;
  if (RE2::FullMatch(sql, p.claim_insert, &db, &name, &lit, &lit2, &seq, &stale_s, &over_lit)) {
    if (!CheckDatabase(db, now_ms, &err)) return err;
    if (name != "state_claims") return Unrecognized(request, "an insert into another table", now_ms);
    if (!claims_table_) return UnknownTable(name, now_ms);
    if (Chance(options_.quorum_busy_prob)) {
      return Error(286, "Another quorum insert has been already started", now_ms);
    }
    if (Chance(options_.too_few_replicas_prob)) {
      return Error(285, "Number of alive replicas (1) is less than requested quorum (2).", now_ms);
    }
    ClaimRow r;
    r.name = Unquote(lit);
    r.lock_id = Unquote(lit2);
    r.seq = seq;
    r.at_s = now_s;
    r.stale_s = stale_s;
    r.over = Unquote(over_lit);
    r.stamped_ms = now_ms;
    r.visible_ms = now_ms;
    const bool unknown = Chance(options_.quorum_unknown_prob);
    if (unknown) {
      r.visible_ms = Chance(0.3) ? INT64_MAX : now_ms + 1 + Upto(options_.quorum_unknown_max_ms);
    }
    if (options_.replicas > 0) PlaceOnReplicas(&r, ReplicaOf(request));
    if (seq == 0 && !r.over.empty() && on_claim_over) on_claim_over(r.over, now_ms);
    claims_.push_back(r);
    if (unknown) {
      return Error(319, "Unknown status, client must retry. Reason: Timeout while waiting for quorum", now_ms);
    }
    return Ok("", now_ms, seq == 0 ? "claimed" : seq == 1 ? "renewed" : seq == 2 ? "waiter row" : "ended");
  }

  std::string list;
  if (RE2::FullMatch(sql, p.prune_claims, &db, &name, &lit, &list)) {
    if (!CheckDatabase(db, now_ms, &err)) return err;
    if (name != "state_claims") return Unrecognized(request, "a prune of another table", now_ms);
    if (!claims_table_) return UnknownTable(name, now_ms);
    std::set<std::string> ids;
    absl::string_view rest(list);
    std::string one;
    while (RE2::FindAndConsume(&rest, p.one_literal, &one)) ids.insert(Unquote(one));
    const std::string lock_name = Unquote(lit);
    int matched = 0;
    for (ClaimRow& r : claims_) {
      // Rows written before the mutation, visible or not yet (their part is
      // mutated when it arrives); a waiter's row only once an hour old.
      if (r.name != lock_name || !ids.count(r.lock_id) || r.stamped_ms > now_ms) continue;
      if (r.seq == 2 && r.at_s >= now_s - 3600) continue;
      r.gone_ms = std::min(r.gone_ms, now_ms + Upto(options_.prune_lag_max_ms));
      ++matched;
    }
    return Ok("", now_ms, absl::StrCat("pruning ", matched, " claim rows"));
  }

  if (RE2::FullMatch(sql, p.inspect_claims, &db, &name, &lit)) {
    if (!CheckDatabase(db, now_ms, &err)) return err;
    if (name != "state_claims") return Unrecognized(request, "a read of another table", now_ms);
    if (!claims_table_) return UnknownTable(name, now_ms);
    // Code 289 is select_sequential_consistency's: a read without it is
    // answered with what the replica has.
    const bool sequential = std::find(request.url_params.begin(), request.url_params.end(),
                                      std::pair<std::string, std::string>("select_sequential_consistency", "1")) !=
                            request.url_params.end();
    if (sequential && options_.lag_every_max_ms > 0) {
      if (lag_from_ms_ < 0) {
        lag_from_ms_ = now_ms + Upto(options_.lag_every_max_ms);
        lag_until_ms_ = lag_from_ms_ + 1 + Upto(options_.lag_max_ms);
      }
      while (now_ms >= lag_until_ms_) {
        lag_from_ms_ = lag_until_ms_ + Upto(options_.lag_every_max_ms);
        lag_until_ms_ = lag_from_ms_ + 1 + Upto(options_.lag_max_ms);
      }
      if (now_ms >= lag_from_ms_) {
        return Error(289, "Replica doesn't have part all_1_1_0 which was successfully written to quorum of other "
                          "replicas (a long lag).", now_ms);
      }
    }
    if (sequential && Chance(options_.lagging_read_prob)) {
      return Error(289, "Replica doesn't have part all_1_1_0 which was successfully written to quorum of other "
                        "replicas.", now_ms);
    }
    // Replicas: the one read (sequentially consistent: it must have the last
    // confirmed row, and shows no row that is not confirmed yet).
    const int replica = options_.replicas > 0 ? ReplicaOf(request) : -1;
    auto on_replica = [&](const ClaimRow& r) {
      if (replica < 0 || r.on_replica_ms.empty()) return r.visible_ms <= now_ms;
      return r.on_replica_ms[replica] <= now_ms && (!sequential || r.visible_ms <= now_ms);
    };
    if (replica >= 0 && sequential) {
      const ClaimRow* last = nullptr;
      for (const ClaimRow& r : claims_) {
        if (r.visible_ms <= now_ms && (last == nullptr || r.visible_ms >= last->visible_ms)) last = &r;
      }
      if (last != nullptr && !on_replica(*last)) {
        return Error(289, absl::StrCat("Replica replica-", replica, " doesn't have part all_9_9_0 which was "
                                       "successfully written to quorum of other replicas."), now_ms);
      }
    }
    const std::string lock_name = Unquote(lit);
    struct Agg {
      int claims = 0, ends = 0;
      int64_t newest = 0, stale_s = 0;
      std::string over;
    };
    std::map<std::string, Agg> by_id;
    for (const ClaimRow& r : claims_) {
      if (r.name != lock_name || r.gone_ms <= now_ms || !on_replica(r)) continue;
      Agg& a = by_id[r.lock_id];
      a.newest = std::max(a.newest, r.at_s);
      if (r.seq == 0) {
        ++a.claims;
        a.stale_s = r.stale_s;
        a.over = r.over;
      } else if (r.seq == 3) {
        ++a.ends;
      }
    }
    std::string body;
    for (const auto& [id, a] : by_id) {
      absl::StrAppend(&body, TsvEscape(id), "\t", a.claims, "\t", a.ends, "\t", a.newest, "\t", a.stale_s, "\t",
                      TsvEscape(a.over), "\t", now_s, "\n");
    }
    // The replica read, and how many the table has (one that has every row
    // as soon as it is visible, without ServerOptions::replicas).
    const int replicas = replica < 0 || options_.replicas_understated ? 1 : options_.replicas;
    absl::StrAppend(&body, "#replica\t", replicas, "\t0\t0\t0\t",
                    replica < 0 ? std::string("sim") : absl::StrCat("replica-", replica), "\t", now_s, "\n");
    return Ok(body, now_ms, absl::StrCat(by_id.size(), " claimants"));
  }

  if (RE2::FullMatch(sql, p.create_lock, &db, &name, &lit, &stale_s)) {
    if (!CheckDatabase(db, now_ms, &err)) return err;
    if (tables_.count(name)) {
      return Error(57, absl::StrCat("Table ", db, ".", name, " already exists."), now_ms);
    }
    Table t;
    t.engine = Table::Engine::kLog;
    t.instance = next_instance_++;
    t.created_s = now_s;
    t.created_ms = now_ms;
    Row r;
    r.lock_id = Unquote(lit);
    r.seq = 0;
    r.stale_s = stale_s;
    r.locked_at_s = now_s;  // now() is evaluated when the query starts
    r.stamped_ms = now_ms;
    r.visible_ms = now_ms;
    if (Chance(options_.create_visibility_prob)) r.visible_ms = now_ms + 1 + Upto(options_.create_visibility_max_ms);
    r.insert_order = next_insert_++;
    int64_t done = r.visible_ms;
    t.rows.push_back(std::move(r));
    tables_[name] = std::move(t);
    Execution e = Ok("", now_ms, done > now_ms ? absl::StrCat("created; row visible +", done - now_ms, "ms")
                                                : std::string("created"));
    e.done_ms = done;
    return e;
  }

  if (RE2::FullMatch(sql, p.inspect_lock, &db, &name, &lit, &lit2)) {
    if (Unquote(lit) != db || Unquote(lit2) != name) {
      return Unrecognized(request, "inspection of two different tables", now_ms);
    }
    if (!CheckDatabase(db, now_ms, &err)) return err;
    auto it = tables_.find(name);
    if (it == tables_.end()) {
      if (JustDropped(name, now_ms)) return BeingDropped(db, name, now_ms);
      if (Chance(options_.missing_table_empty_prob)) return Ok("", now_ms, "no rows (table missing)");
      return UnknownTable(name, now_ms);
    }
    const Table& t = it->second;
    if (t.engine != Table::Engine::kLog) return Unrecognized(request, "lock inspection of a non-Log table", now_ms);
    // Each half of the UNION evaluates now() itself, in either order, while
    // the query runs: one may read the second before the other. (The query
    // takes effect at now_ms; a half evaluated earlier reads an earlier time,
    // never a later one.)
    int64_t rows_now_s = now_s, table_now_s = now_s;
    if (options_.union_now_spread_ms > 0) {
      (Chance(0.5) ? rows_now_s : table_now_s) = Seconds(now_ms - Upto(options_.union_now_spread_ms));
    }
    // UNION ALL parts (and rows) arrive in no particular order.
    std::vector<std::string> lines;
    for (const Row& r : t.rows) {
      if (r.visible_ms > now_ms) continue;
      lines.push_back(absl::StrCat(TsvEscape(r.lock_id), "\t", r.seq, "\t", r.locked_at_s, "\t", rows_now_s, "\t",
                                   r.stale_s, "\n"));
    }
    lines.push_back(absl::StrCat("\t255\t", t.created_s, "\t", table_now_s, "\t0\n"));
    for (size_t i = lines.size(); i > 1; --i) std::swap(lines[i - 1], lines[(*rng_)() % i]);
    std::string body;
    for (const std::string& l : lines) body += l;
    return Ok(std::move(body), now_ms, absl::StrCat(lines.size() - 1, " lock rows"));
  }

  if (RE2::FullMatch(sql, p.renew_lock, &db, &name, &lit, &stale_s)) {
    if (!CheckDatabase(db, now_ms, &err)) return err;
    auto it = tables_.find(name);
    if (it == tables_.end()) {
      return JustDropped(name, now_ms) ? BeingDropped(db, name, now_ms) : UnknownTable(name, now_ms);
    }
    if (it->second.engine != Table::Engine::kLog) return Unrecognized(request, "renewal into a non-Log table", now_ms);
    Row r;
    r.lock_id = Unquote(lit);
    r.seq = 1;
    r.stale_s = stale_s;
    r.locked_at_s = now_s;
    r.stamped_ms = now_ms;
    r.visible_ms = now_ms;  // Log inserts are synchronous
    r.insert_order = next_insert_++;
    it->second.rows.push_back(std::move(r));
    return Ok("", now_ms, "renewal row inserted");
  }

  if (RE2::FullMatch(sql, p.announce_waiter, &db, &name, &lit)) {
    if (!CheckDatabase(db, now_ms, &err)) return err;
    auto it = tables_.find(name);
    if (it == tables_.end()) {
      return JustDropped(name, now_ms) ? BeingDropped(db, name, now_ms) : UnknownTable(name, now_ms);
    }
    if (it->second.engine != Table::Engine::kLog) return Unrecognized(request, "waiter row into a non-Log table", now_ms);
    Row r;
    r.lock_id = Unquote(lit);
    r.seq = 2;
    r.stale_s = 0;
    r.locked_at_s = now_s;
    r.stamped_ms = now_ms;
    r.visible_ms = now_ms;
    r.insert_order = next_insert_++;
    it->second.rows.push_back(std::move(r));
    return Ok("", now_ms, "waiter row inserted");
  }

  if (RE2::FullMatch(sql, p.lock_waiters, &db, &name)) {
    if (!CheckDatabase(db, now_ms, &err)) return err;
    auto it = tables_.find(name);
    if (it == tables_.end()) {
      return JustDropped(name, now_ms) ? BeingDropped(db, name, now_ms) : UnknownTable(name, now_ms);
    }
    for (const Row& r : it->second.rows) {
      if (r.seq == 2 && r.visible_ms <= now_ms) return Ok(absl::StrCat(TsvEscape(r.lock_id), "\t1\n"), now_ms, "a waiter");
    }
    return Ok("", now_ms, "no waiter");
  }

  if (RE2::FullMatch(sql, p.drop_table, &db, &name)) {
    if (!CheckDatabase(db, now_ms, &err)) return err;
    bool existed = tables_.erase(name) > 0;
    if (existed) dropped_ms_[name] = now_ms;
    return Ok("", now_ms, existed ? "dropped" : "no such table (ok)");
  }

  if (RE2::FullMatch(sql, p.rename_table, &db, &name, &db2, &name2)) {
    if (db2 != db) return Unrecognized(request, "a rename across databases", now_ms);
    if (!CheckDatabase(db, now_ms, &err)) return err;
    auto from = tables_.find(name);
    if (from == tables_.end()) return UnknownTable(name, now_ms);
    if (tables_.count(name2)) return Error(57, absl::StrCat("Table ", db, ".", name2, " already exists."), now_ms);
    Table moved = std::move(from->second);
    tables_.erase(from);
    const Table& placed = tables_[name2] = std::move(moved);
    if (on_rename) on_rename(name, name2, placed, now_ms);
    return Ok("", now_ms, "renamed");
  }

  if (RE2::FullMatch(sql, p.create_rmt, &db, &name)) {
    if (!CheckDatabase(db, now_ms, &err)) return err;
    auto it = tables_.find(name);
    if (it != tables_.end()) {
      if (it->second.engine != Table::Engine::kReplacingMergeTree) {
        return Unrecognized(request, "CREATE IF NOT EXISTS over a table of another engine", now_ms);
      }
      return Ok("", now_ms, "exists (ok)");
    }
    Table t;
    t.engine = Table::Engine::kReplacingMergeTree;
    t.instance = next_instance_++;
    t.created_s = now_s;
    t.created_ms = now_ms;
    tables_[name] = std::move(t);
    return Ok("", now_ms, "created");
  }

  if (RE2::FullMatch(sql, p.rmt_insert, &db, &name, &lit, &lit2)) {
    if (!CheckDatabase(db, now_ms, &err)) return err;
    auto it = tables_.find(name);
    if (it == tables_.end()) return UnknownTable(name, now_ms);
    if (it->second.engine != Table::Engine::kReplacingMergeTree) {
      return Unrecognized(request, "INSERT VALUES into a Log lock table", now_ms);
    }
    Row r;
    r.state_id = Unquote(lit);
    r.lock_id = Unquote(lit2);
    r.locked_at_s = now_s;
    r.stamped_ms = now_ms;
    r.visible_ms = now_ms + Upto(options_.insert_visibility_max_ms);
    r.insert_order = next_insert_++;
    r.part_min_block = r.part_max_block = ++it->second.last_block;
    int64_t vis = r.visible_ms - now_ms;
    it->second.rows.push_back(std::move(r));
    return Ok("", now_ms, vis ? absl::StrCat("inserted; visible +", vis, "ms") : std::string("inserted"));
  }

  if (RE2::FullMatch(sql, p.rmt_select_final, &db, &name, &lit)) {
    if (!CheckDatabase(db, now_ms, &err)) return err;
    auto it = tables_.find(name);
    if (it == tables_.end()) return UnknownTable(name, now_ms);
    if (it->second.engine != Table::Engine::kReplacingMergeTree) {
      return Unrecognized(request, "SELECT FINAL of a Log table", now_ms);
    }
    const std::string state_id = Unquote(lit);
    const Row* best = FinalRow(it->second, state_id, now_ms);
    if (!best) return Ok("", now_ms, "0 rows");
    return Ok(absl::StrCat(TsvEscape(best->lock_id), "\t", best->locked_at_s, "\t", now_s, "\n"), now_ms, "1 row");
  }

  int64_t window_s = 0;
  std::string with_blocks, blocks_db, blocks_table, after_block;
  if (RE2::FullMatch(sql, p.foreign_rows, &db, &name, &lit, &window_s, &with_blocks, &blocks_db, &blocks_table,
                     &after_block)) {
    if (!CheckDatabase(db, now_ms, &err)) return err;
    auto it = tables_.find(name);
    if (it == tables_.end()) return UnknownTable(name, now_ms);
    if (it->second.engine != Table::Engine::kReplacingMergeTree) {
      return Unrecognized(request, "a look for lock rows in a Log table", now_ms);
    }
    if (!with_blocks.empty() && (Unquote(blocks_db) != db || Unquote(blocks_table) != name)) {
      return Unrecognized(request, "the parts of another table than the rows'", now_ms);
    }
    // 18.x: a literal; modern servers: the id as a query parameter.
    std::string state_id = Unquote(lit);
    for (const auto& [k, v] : request.url_params) {
      if (k == "param_state_id") state_id = Unquote(v);
    }
    std::string out;
    for (const Row& r : it->second.rows) {
      if (r.visible_ms > now_ms || r.state_id != state_id || r.locked_at_s < now_s - window_s) continue;
      if (absl::StartsWith(r.lock_id, "chstate:") || absl::StartsWith(r.lock_id, "!chstate:")) continue;
      absl::StrAppend(&out, TsvEscape(r.lock_id), "\t1\n");
    }
    const std::string summary = out.empty() ? "no Python row" : "a Python row";
    // The negative control: only its own part, whatever happened.
    if (!with_blocks.empty()) {
      int64_t after = 0;
      (void)absl::SimpleAtoi(after_block, &after);
      absl::StrAppend(&out, options_.old_marker ? 1 : PartsAfter(it->second, after), "\t2\n");
    }
    return Ok(out, now_ms, summary);
  }

  if (RE2::FullMatch(sql, p.lock_blocks, &lit, &lit2)) {
    if (!CheckDatabase(Unquote(lit), now_ms, &err)) return err;
    auto it = tables_.find(Unquote(lit2));
    // system.parts of a missing table: no rows, and max() of none is 0.
    int64_t n = it == tables_.end() ? 0 : BlocksRead(it->second);
    if (options_.old_marker) n = 1;  // the negative control reads no block number
    return Ok(absl::StrCat(n, "\t2\n"), now_ms, absl::StrCat("block ", n));
  }

  int64_t ahead_s = 0;
  if (RE2::FullMatch(sql, p.marker_insert, &db, &name, &lit, &lit2, &ahead_s)) {
    if (!CheckDatabase(db, now_ms, &err)) return err;
    auto it = tables_.find(name);
    if (it == tables_.end()) return UnknownTable(name, now_ms);
    if (it->second.engine != Table::Engine::kReplacingMergeTree) {
      return Unrecognized(request, "a marker INSERT into a Log lock table", now_ms);
    }
    Row r;
    r.state_id = Unquote(lit);
    r.lock_id = MarkerId(Unquote(lit2));
    // The negative control stamps it as before: two seconds in the past.
    r.locked_at_s = options_.old_marker ? now_s - 2 : now_s + ahead_s;
    r.stamped_ms = now_ms;
    r.visible_ms = now_ms;  // async_insert=0: visible once answered
    r.insert_order = next_insert_++;
    r.part_min_block = r.part_max_block = ++it->second.last_block;
    it->second.rows.push_back(std::move(r));
    return Ok("", now_ms, "marker inserted");
  }

  if (RE2::FullMatch(sql, p.python_first_read, &db, &name, &lit)) {
    if (!CheckDatabase(db, now_ms, &err)) return err;
    auto it = tables_.find(name);
    if (it == tables_.end()) return UnknownTable(name, now_ms);
    // ORDER BY ... LIMIT 1 of FINAL's one row is it.
    const std::string state_id = Unquote(lit);
    const Row* best = FinalRow(it->second, state_id, now_ms);
    if (!best) return Ok("", now_ms, "0 rows");
    return Ok(absl::StrCat(TsvEscape(best->lock_id), "\n"), now_ms, absl::StrCat("FINAL row ", best->lock_id));
  }

  if (RE2::FullMatch(sql, p.python_every_row, &db, &name, &lit)) {
    if (!CheckDatabase(db, now_ms, &err)) return err;
    auto it = tables_.find(name);
    if (it == tables_.end()) return UnknownTable(name, now_ms);
    const std::string state_id = Unquote(lit);
    std::string out;
    int n = 0;
    for (const Row& r : it->second.rows) {
      if (r.visible_ms > now_ms || r.state_id != state_id) continue;
      absl::StrAppend(&out, TsvEscape(r.lock_id), "\n");
      ++n;
    }
    return Ok(out, now_ms, absl::StrCat(n, " rows"));
  }

  if (RE2::FullMatch(sql, p.python_delete_stale, &db, &name, &window_s)) {
    if (!CheckDatabase(db, now_ms, &err)) return err;
    auto it = tables_.find(name);
    if (it == tables_.end()) return UnknownTable(name, now_ms);
    std::vector<Row>& rows = it->second.rows;
    const size_t before = rows.size();
    rows.erase(std::remove_if(rows.begin(), rows.end(),
                              [&](const Row& r) { return r.visible_ms <= now_ms && r.locked_at_s < now_s - window_s; }),
               rows.end());
    ++it->second.last_block;  // the mutation's number
    return Ok("", now_ms, absl::StrCat("deleted ", before - rows.size(), " stale rows"));
  }

  if (RE2::FullMatch(sql, p.modern_delete, &db, &name, &lit, &lit2)) {
    std::string state_id = Unquote(lit);
    for (const auto& [k, v] : request.url_params) {
      if (k == "param_state_id") state_id = Unquote(v);
    }
    return DeleteRows(request, db, name, state_id, Unquote(lit2), now_ms);
  }

  if (RE2::FullMatch(sql, p.rmt_delete, &db, &name, &lit, &lit2)) {
    return DeleteRows(request, db, name, Unquote(lit), Unquote(lit2), now_ms);
  }

  return Unrecognized(request, "unrecognised statement", now_ms);
}

Execution SimServer::DeleteRows(const SqlRequest& request, const std::string& db, const std::string& name,
                                const std::string& state_id, const std::string& given_lock_id, int64_t now_ms) {
  Execution err;
  if (!CheckDatabase(db, now_ms, &err)) return err;
  auto it = tables_.find(name);
  if (it == tables_.end()) return UnknownTable(name, now_ms);
  if (it->second.engine != Table::Engine::kReplacingMergeTree) {
    return Unrecognized(request, "ALTER DELETE of a Log table", now_ms);
  }
  // A mutation rewrites the parts that exist when it runs; inserts not yet
  // visible are later parts and keep their rows. It takes a block number.
  const std::string lock_id = MarkerId(given_lock_id);
  std::vector<Row>& rows = it->second.rows;
  size_t before = rows.size();
  rows.erase(std::remove_if(rows.begin(), rows.end(),
                            [&](const Row& r) {
                              return r.visible_ms <= now_ms && r.state_id == state_id && r.lock_id == lock_id;
                            }),
             rows.end());
  ++it->second.last_block;
  return Ok("", now_ms, absl::StrCat("deleted ", before - rows.size(), " rows"));
}

std::string SimServer::MarkerId(const std::string& lock_id) const {
  if (options_.old_marker && absl::StartsWith(lock_id, "!chstate:")) return lock_id.substr(1);
  return lock_id;
}

int64_t SimServer::BlocksRead(const Table& t) const {
  // system.parts' greatest max_block_number of the active parts: the parts
  // that still hold rows (an emptied part counts as gone, the least
  // favourable choice for the reader).
  int64_t n = 0;
  for (const Row& r : t.rows) n = std::max(n, r.part_max_block);
  return n;
}

const Row* SimServer::FinalRow(const Table& t, const std::string& state_id, int64_t now_ms) {
  // FINAL: the visible rows of the key collapse to the greatest locked_at,
  // the later insert among equals.
  const Row* best = nullptr;
  for (const Row& r : t.rows) {
    if (r.visible_ms > now_ms || r.state_id != state_id) continue;
    if (!best || r.locked_at_s > best->locked_at_s ||
        (r.locked_at_s == best->locked_at_s && r.insert_order > best->insert_order)) {
      best = &r;
    }
  }
  return best;
}

int64_t SimServer::PartsAfter(const Table& t, int64_t after) const {
  std::set<std::pair<int64_t, int64_t>> parts;
  for (const Row& r : t.rows) {
    if (r.part_max_block > after) parts.emplace(r.part_min_block, r.part_max_block);
  }
  int64_t n = 0;
  for (const auto& [lo, hi] : parts) n += lo == hi ? 1 : 2;
  return n;
}

void SimServer::Merge(int64_t now_ms) {
  for (auto& [name, t] : tables_) {
    if (t.engine != Table::Engine::kReplacingMergeTree) continue;
    std::map<std::string, size_t> keep;  // state_id -> index of the survivor
    for (size_t i = 0; i < t.rows.size(); ++i) {
      const Row& r = t.rows[i];
      if (r.visible_ms > now_ms) continue;
      auto [it, fresh] = keep.emplace(r.state_id, i);
      if (fresh) continue;
      const Row& b = t.rows[it->second];
      if (r.locked_at_s > b.locked_at_s || (r.locked_at_s == b.locked_at_s && r.insert_order > b.insert_order)) {
        it->second = i;
      }
    }
    // The visible rows become one part: its range is theirs.
    int64_t part_min = INT64_MAX, part_max = 0;
    for (const Row& r : t.rows) {
      if (r.visible_ms > now_ms) continue;
      part_min = std::min(part_min, r.part_min_block);
      part_max = std::max(part_max, r.part_max_block);
    }
    std::vector<Row> merged;
    for (size_t i = 0; i < t.rows.size(); ++i) {
      const Row& r = t.rows[i];
      if (r.visible_ms > now_ms) {
        merged.push_back(r);
      } else if (keep[r.state_id] != i) {
        merged_away_.emplace(r.lock_id, MergedAway{now_ms, t.rows[keep[r.state_id]].lock_id});
      } else {
        merged.push_back(r);
        merged.back().part_min_block = part_min;
        merged.back().part_max_block = part_max;
      }
    }
    t.rows = std::move(merged);
  }
}

}  // namespace chstate::sim
