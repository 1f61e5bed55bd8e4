// The steps store operations are built from (store_steps.h): running SQL
// and wording its failures, the schema, reading and writing one state,
// quorum writes, waiting for mutations, and acting under a lock's lease.
#include "core/store.h"

#include <algorithm>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "core/clickhouse_errors.h"
#include "core/lock_machine.h"
#include "core/quoting.h"
#include "core/response.h"
#include "core/store_steps.h"

namespace chstate {

// A task whose body gets a StoreSteps bound to the task's inputs.
std::unique_ptr<Task> MakeTask(Store* store, std::function<Step(StoreSteps&)> body) {
  return std::make_unique<Task>(
      [store, body = std::move(body)](const Inputs* in) -> Task::Body {
        auto steps = std::make_shared<StoreSteps>(store, in);
        return [steps, body] {
          steps->SettleAbandonedRenewals();
          steps->ForgetStaleLingering();
          return body(*steps);
        };
      },
      store->options().transport);
}

std::unique_ptr<Task> Invalid(absl::Status status) {
  return std::make_unique<Task>([status](const Inputs*) -> Task::Body {
    return [status] { return Step::Fail(status); };
  });
}

// Runs `req`; on success continues with the body, on failure with `fail`.
// A request acting under a lock (UnderLease) whose failure would have
// been sent again, once the lease ran out: kAborted, naming the failure.
Step StoreSteps::Sql(SqlRequest req, std::string what, std::function<Step(const std::string& body)> then,
                     OnFailure fail) {
  SqlRequest sent;  // what the failure needs of the request (not its SQL)
  sent.idempotent = req.idempotent;
  sent.send_before_ms = req.send_before_ms;
  return Step::Run(std::move(req), [this, sent, what = std::move(what), then = std::move(then),
                                    fail = std::move(fail)](const SqlResponse& r) -> Step {
    absl::Status st = CheckResponse(r, what);
    if (!st.ok() && PastSendBefore(sent, in_->now_ms) && (MayResend(sent, r) || ReplicaLevelError(sent, r))) {
      return fail(LeaseRanOut(what, std::string(st.message()), !r.transport_ok && r.maybe_delivered));
    }
    if (!st.ok()) return fail(ExplainCluster(std::move(st)));
    return then(r.body);
  });
}

// Like Sql, decoding `columns`-wide TabSeparated rows.
Step StoreSteps::Query(SqlRequest req, std::string what, size_t columns, std::function<Step(const Rows& rows)> then,
                       OnFailure fail) {
  return Sql(
      std::move(req), what,
      [columns, then = std::move(then), fail](const std::string& body) -> Step {
        absl::StatusOr<Rows> rows = ParseTabSeparated(body, columns);
        if (!rows.ok()) return fail(rows.status());
        return then(*rows);
      },
      fail);
}

// Asks the server's version once per store and picks the dialect.
Step StoreSteps::Connected(Then then, OnFailure fail, bool force) {
  if (s_->statements_ && !force) return then();
  return Query(
      Statements::SelectVersion(), "connecting", 2,
      [this, then = std::move(then), fail](const Rows& rows) -> Step {
        if (rows.empty() || !rows[0][0]) {
          return fail(absl::DataLossError("ClickHouse sent no version for SELECT version()"));
        }
        absl::StatusOr<ServerVersion> v = ParseServerVersion(*rows[0][0]);
        if (!v.ok()) return fail(v.status());
        absl::StatusOr<Dialect> d = DialectFor(*v);
        if (!d.ok()) return fail(d.status());
        absl::StatusOr<Statements> st = Statements::Create(*d, s_->options_.schema, s_->options_.table, s_->options_.cluster);
        if (!st.ok()) return fail(st.status());
        s_->statements_ = std::move(*st);
        s_->server_version_ = v->text;
        if (s_->options_.cluster.enabled()) return CheckReplicated(then, fail);
        return then();
      },
      fail);
}

// Cluster mode: a state table made earlier without cluster mode is a plain
// table on one server; writing to it would silently skip replication.
Step StoreSteps::CheckReplicated(Then then, OnFailure fail) {
  return Query(
      st().StateTableEngine(), "checking the state table's engine", 2,
      [this, then, fail](const Rows& rows) -> Step {
        std::string engine = rows.empty() ? "" : rows[0][0].value_or("");
        if (!rows.empty() && rows[0][1].value_or("") == "0") {
          s_->statements_.reset();  // ask again next time
          return fail(absl::InvalidArgumentError(absl::StrCat(
              "the servers know no cluster \"", s_->options_.cluster.name,
              "\": set the cluster setting to a name from their remote_servers (SELECT DISTINCT cluster FROM "
              "system.clusters)")));
        }
        if (engine.empty() || engine.rfind("Replicated", 0) == 0) return then();
        s_->statements_.reset();  // ask again next time
        return fail(absl::FailedPreconditionError(absl::StrCat(
            "cluster mode is on (cluster \"", s_->options_.cluster.name, "\") but the state table ",
            s_->options_.schema, ".", s_->options_.table, " on this server is a ", engine,
            ", not replicated: writes would stay on this server. Use another schema for cluster mode, or move "
            "the states into a replicated table (README \"Cluster mode\")")));
      },
      fail);
}

// CREATE ... IF NOT EXISTS. Cluster mode: code 159 (a host did not run the
// ON CLUSTER DDL in time: it is down) means the live hosts ran it and the
// others will when they are back, so the schema is there for the quorum.
Step StoreSteps::Ddl(SqlRequest req, std::string what, Then then, OnFailure fail) {
  return Sql(
      std::move(req), std::move(what), [then](const std::string&) { return then(); },
      [this, then, fail](absl::Status status) -> Step {
        if (st().cluster().enabled() && ClickHouseCode(status) == ch::kTimeoutExceeded) return then();
        return fail(std::move(status));
      });
}

Step StoreSteps::EnsureSchema(Then then, OnFailure fail) {
  auto ddl = std::make_shared<std::vector<std::pair<SqlRequest, std::string>>>();
  ddl->emplace_back(st().CreateDatabase(), "creating the state database");
  ddl->emplace_back(st().CreateStateTable(), "creating the state table");
  ddl->emplace_back(st().CreateLockTable(), "creating the lock table");
  if (st().cluster().enabled()) ddl->emplace_back(st().CreateClaimsTable(), "creating the lock claims table");
  if (s_->options_.history_days > 0) {
    // With history on, the history table and the view that feeds it.
    ddl->emplace_back(st().CreateHistoryTable(s_->options_.history_days), "creating the state history table");
    ddl->emplace_back(st().CreateHistoryView(), "creating the state history view");
  }
  return DdlInOrder(std::move(ddl), 0, std::move(then), std::move(fail));
}

Step StoreSteps::DdlInOrder(std::shared_ptr<const std::vector<std::pair<SqlRequest, std::string>>> ddl, size_t next,
                            Then then, OnFailure fail) {
  if (next >= ddl->size()) return then();
  const auto& [req, what] = (*ddl)[next];
  return Ddl(req, what, [this, ddl, next, then, fail] { return DdlInOrder(ddl, next + 1, then, fail); }, fail);
}

// Reads one state; a missing table or database reads as "absent".
Step StoreSteps::ReadState(const std::string& id, std::function<Step(std::optional<MeltanoState>)> then, OnFailure fail) {
  return Query(
      st().GetState(id), "reading state", 2,
      [id, then, fail](const Rows& rows) -> Step {
        if (rows.empty()) return then(std::nullopt);
        absl::StatusOr<nlohmann::json> partial = FromColumn(rows[0][0], id, "partial_state");
        if (!partial.ok()) return fail(partial.status());
        absl::StatusOr<nlohmann::json> completed = FromColumn(rows[0][1], id, "completed_state");
        if (!completed.ok()) return fail(completed.status());
        MeltanoState s;
        s.state_id = id;
        s.partial = std::move(*partial);
        s.completed = std::move(*completed);
        return then(std::move(s));
      },
      [then, fail](absl::Status st) -> Step {
        if (st.code() == absl::StatusCode::kNotFound) return then(std::nullopt);
        return fail(std::move(st));
      });
}

absl::StatusOr<std::string> StoreSteps::Token() {
  if (in_->random.size() < 16) {
    return absl::InvalidArgumentError(
        "the host passed fewer than 16 random bytes; every input needs fresh random bytes");
  }
  return absl::StrCat("chstate-", HexEncode(in_->random.substr(0, 16)), "-", ++s_->writes_);
}

// Writes a whole state row, creating the schema once if it is missing.
Step StoreSteps::WriteState(const MeltanoState& state, Then then, OnFailure fail, bool schema_made) {
  if (absl::Status lease = LeaseCheck(state.state_id); !lease.ok()) return fail(lease);
  absl::StatusOr<std::string> token = Token();
  if (!token.ok()) return fail(token.status());
  SqlRequest req = UnderLease(
      st().InsertState(state.state_id, ToColumn(state.partial), ToColumn(state.completed), *token), state.state_id);
  const std::string id = state.state_id;
  return QuorumWrite(
      std::move(req), "writing state", in_->now_ms + s_->options_.cluster.quorum_busy_ms, 5,
      [this, id, then] { return HistoryUpkeep(id, then); },
      [this, state, then, fail, schema_made](absl::Status st) -> Step {
        if (st.code() == absl::StatusCode::kNotFound && !schema_made) {
          return EnsureSchema([this, state, then, fail] { return WriteState(state, then, fail, true); }, fail);
        }
        return fail(std::move(st));
      });
}

// Cluster mode: a write that must reach the quorum. Code 286 (another
// quorum write to the table is in flight, or the previous one has not
// reached its quorum yet) wrote nothing, so it is retried until the
// deadline. Code 319 is explained: the row is on one replica and will
// appear everywhere once another replica has it; writing again is safe.
Step StoreSteps::QuorumWrite(SqlRequest req, std::string what, int64_t deadline_ms, int64_t wait_ms, Then then,
                             OnFailure fail) {
  return Sql(
      req, what, [then](const std::string&) { return then(); },
      [this, req, what, deadline_ms, wait_ms, then, fail](absl::Status st) -> Step {
        std::optional<int> code = ClickHouseCode(st);
        if (!s_->options_.cluster.enabled() || !code) return fail(std::move(st));
        if ((*code == ch::kUnsatisfiedQuorumForPreviousWrite || *code == ch::kTooManyParts) &&
            in_->now_ms < deadline_ms) {
          // A little jitter from the fresh random bytes keeps two writers
          // from retrying in lockstep.
          int64_t jitter = in_->random.empty() ? 0 : static_cast<unsigned char>(in_->random[0]) % 8;
          const char* cause = *code == ch::kTooManyParts
                                  ? "code 252 (too many parts: the table merges slower than it is written)"
                                  : "code 286 (an earlier quorum write to the table is not confirmed yet)";
          // Under a lock, sent again only within its lease.
          if (PastSendBefore(req, in_->now_ms + wait_ms + jitter)) {
            return QuorumWaitPastLease(req, what, deadline_ms, wait_ms + jitter, cause, then, fail);
          }
          return QuorumResend(req, what, deadline_ms, wait_ms, jitter, then, fail);
        }
        return fail(ExplainQuorumError(std::move(st), *code));
      });
}

Step StoreSteps::QuorumResend(SqlRequest req, std::string what, int64_t deadline_ms, int64_t wait_ms, int64_t jitter,
                              Then then, OnFailure fail) {
  return Step::Wait(wait_ms + jitter, [this, req, what, deadline_ms, wait_ms, then, fail] {
    return QuorumWrite(req, what, deadline_ms, std::min<int64_t>(wait_ms * 2, 100), then, fail);
  });
}

// Nothing was written, so the lock is still ours to renew: it is renewed
// now and the wait goes on within the lease that gives. A renewal that fails,
// finds the lock lost, or gives no lease long enough ends the write as a
// lease that ran out.
Step StoreSteps::QuorumWaitPastLease(SqlRequest req, std::string what, int64_t deadline_ms, int64_t wait_ms,
                                     const char* cause, Then then, OnFailure fail) {
  return RenewForWait(
      lease_id_,
      [this, req, what, deadline_ms, wait_ms, cause, then, fail]() -> Step {
        SqlRequest next = req;
        if (const LockMachine* lock = LockOf(lease_id_)) next.send_before_ms = lock->lease_deadline_ms();
        if (PastSendBefore(next, in_->now_ms + wait_ms)) return fail(LeaseRanOut(what, cause, false));
        return QuorumResend(next, what, deadline_ms, wait_ms, 0, then, fail);
      },
      [this, what, cause, fail](absl::Status) { return fail(LeaseRanOut(what, cause, false)); });
}

absl::Status StoreSteps::ExplainQuorumError(absl::Status st, int code) const {
  const ClusterOptions& c = s_->options_.cluster;
  std::string why;
  switch (code) {
    case ch::kUnsatisfiedQuorumForPreviousWrite:
      why = absl::StrCat("an earlier write to this table has still not reached its quorum of ", c.quorum,
                         " replicas after ", c.quorum_busy_ms, " ms (a replica is down or lagging); nothing "
                         "was written. Bring the replica back, then retry");
      break;
    case ch::kTooFewLiveReplicas:
      why = absl::StrCat("fewer than ", c.quorum, " replicas are alive; nothing was written. Start the stopped "
                         "replica (or lower the quorum), then retry");
      break;
    case ch::kUnknownStatusOfInsert:
      return Reworded(st, absl::StatusCode::kUnavailable, absl::StrCat(
          "unknown outcome of the write (ClickHouse code 319): it reached one replica but the quorum of ",
          c.quorum, " was not confirmed within ", c.quorum_timeout_ms, " ms (a replica is down or hung). It is "
          "not readable yet and becomes readable on every replica once another replica has fetched it; until "
          "then further writes fail with code 286. Retrying the same write after the replica is back is safe "
          "(it replaces itself). ClickHouse said: ", st.message()));
    default:
      return st;
  }
  return Reworded(st, absl::StatusCode::kUnavailable,  // 285 and 286: nothing was written, retry later
                  absl::StrCat(why, ". ClickHouse said: ", st.message()));
}

// Cluster mode: errors that mean "ZooKeeper is unreachable" say so, and
// are kUnavailable (retry later) whatever ClickHouse called them.
absl::Status StoreSteps::ExplainCluster(absl::Status st) const {
  std::optional<int> code = ClickHouseCode(st);
  if (s_->options_.cluster.enabled() && code == ch::kBadArguments && absl::StrContains(st.message(), "Requested cluster")) {
    return Reworded(st, absl::StatusCode::kInvalidArgument,
                    absl::StrCat("the servers know no cluster \"", s_->options_.cluster.name,
                                 "\": set the cluster setting to a name from their remote_servers (SELECT DISTINCT "
                                 "cluster FROM system.clusters). ", st.message()));
  }
  if (!s_->options_.cluster.enabled() || !code || (*code != ch::kTableIsReadOnly && *code != ch::kNoZooKeeper && *code != ch::kKeeperException)) return st;
  return Reworded(st, absl::StatusCode::kUnavailable,
                  absl::StrCat("ClickHouse cannot reach ZooKeeper (code ", *code, "), which cluster mode needs for "
                               "replicated tables and ON CLUSTER DDL; nothing was changed. Check ZooKeeper (the "
                               "servers reconnect by themselves a few seconds after it is back), then retry. ",
                               st.message()));
}

// A new message for `st`, keeping its payloads (the ClickHouse code).
absl::Status StoreSteps::Reworded(const absl::Status& st, absl::StatusCode code, absl::string_view message) {
  absl::Status out(code, message);
  st.ForEachPayload([&out](absl::string_view url, const absl::Cord& payload) { out.SetPayload(url, payload); });
  return out;
}

Step StoreSteps::DeleteState(const std::string& id, Then then, OnFailure fail) {
  if (absl::Status lease = LeaseCheck(id); !lease.ok()) return fail(lease);
  if (st().cluster().enabled()) {
    return QuorumWrite(UnderLease(st().DeleteState(id), id), "deleting state",
                       in_->now_ms + s_->options_.cluster.quorum_busy_ms, 5, then,
                       [then, fail](absl::Status st) -> Step {
                         if (st.code() == absl::StatusCode::kNotFound) return then();  // no table: nothing to delete
                         return fail(std::move(st));
                       });
  }
  return Sql(
      UnderLease(st().DeleteState(id), id), "deleting state",
      [this, then, fail](const std::string&) -> Step {
        if (st().dialect() == Dialect::kModern) return then();
        return AwaitMutations(in_->now_ms + s_->options_.mutation_timeout_ms, 5, then, fail);
      },
      [then, fail](absl::Status st) -> Step {
        if (st.code() == absl::StatusCode::kNotFound) return then();  // no table: nothing to delete
        return fail(std::move(st));
      });
}

// 18.x: ALTER ... DELETE returns before rows are gone; poll until done.
Step StoreSteps::AwaitMutations(int64_t deadline_ms, int64_t wait_ms, Then then, OnFailure fail) {
  return Query(
      st().PendingMutations(), "waiting for the delete to finish", 2,
      [this, deadline_ms, wait_ms, then, fail](const Rows& rows) -> Step {
        int64_t pending = 0;
        if (rows.empty() || !rows[0][0] || !absl::SimpleAtoi(*rows[0][0], &pending)) {
          return fail(absl::DataLossError("unexpected answer counting pending mutations"));
        }
        if (pending == 0) return then();
        if (in_->now_ms >= deadline_ms) {
          return fail(absl::DeadlineExceededError(
              absl::StrCat("the delete was accepted but its mutation is still running after ",
                           s_->options_.mutation_timeout_ms / 1000,
                           " s; check system.mutations on the server (it will finish there)")));
        }
        return Step::Wait(wait_ms, [this, deadline_ms, wait_ms, then, fail] {
          return AwaitMutations(deadline_ms, std::min<int64_t>(wait_ms * 2, 200), then, fail);
        });
      },
      fail);
}

// The lock a write to `id` acts under: the one this task took
// (WithLock), or one this store holds on `id`; null when none.
const LockMachine* StoreSteps::LockOf(const std::string& id) const {
  const LockMachine* lock = current_lock_.get();
  if (lock == nullptr || lock->state_id() != id) {
    auto it = s_->held_.find(id);
    lock = it == s_->held_.end() ? nullptr : it->second.machine.get();
  }
  return lock;
}

// `req` writes to `id`: under its lock, the task sends it (first, again,
// anywhere) only before the lease ends (SqlRequest::send_before_ms; with
// several ids, the earliest lease).
SqlRequest StoreSteps::UnderLease(SqlRequest req, const std::string& id) {
  const LockMachine* lock = LockOf(id);
  if (lock == nullptr) return req;
  const int64_t deadline = lock->lease_deadline_ms();
  if (req.send_before_ms == 0 || deadline < req.send_before_ms) {
    req.send_before_ms = deadline;
    lease_id_ = id;
  }
  return req;
}

// A write under the lock of lease_id_ met `cause` and the lease ran out
// before it could go again: nothing more is sent.
absl::Status StoreSteps::LeaseRanOut(const std::string& what, const std::string& cause, bool maybe_landed) const {
  return absl::AbortedError(absl::StrCat(
      "the lock on state id \"", PrintableId(lease_id_), "\" ran out while ", what, " waited out ", cause,
      ": it was not sent again past the lease, since another process may hold the lock by now (",
      maybe_landed ? "its last send may have landed" : "it was not written",
      "). Release the lock and start again"));
}

// Writes under a lock are sent only while its lease is valid: the lock
// this task took (WithLock), or one this store holds on `id`.
absl::Status StoreSteps::LeaseCheck(const std::string& id) const {
  const LockMachine* lock = LockOf(id);
  if (lock == nullptr || lock->LeaseValid(in_->now_ms)) return absl::OkStatus();
  return absl::AbortedError(absl::StrCat(
      "the lock on state id \"", PrintableId(id), "\" ran out before the write (its lease ends ",
      s_->options_.lock.stale_ms / 1000, " s, less a safety margin, after it was taken or last renewed; the store "
      "renews it when used or ticked after a third of that); nothing was written: release it and start again"));
}

Step StoreSteps::Terminal(absl::StatusOr<Result> outcome) {
  return outcome.ok() ? Step::Done(*std::move(outcome)) : Step::Fail(outcome.status());
}

Step StoreSteps::WithLock(const std::string& id, std::function<Step(Finish)> body, Finish after) {
  return Acquire(
      id,
      [this, body, after](LockPtr m) -> Step {
        current_lock_ = m;
        Finish finish = [this, m, after](absl::StatusOr<Result> outcome) -> Step {
          current_lock_ = nullptr;
          return Release(
              m, [outcome, after]() -> Step { return after(outcome); },
              [outcome, after](absl::Status release_error) -> Step {
                // The body's own error matters more than a failed release.
                return after(outcome.ok() ? absl::StatusOr<Result>(release_error) : outcome);
              });
        };
        return body(finish);
      },
      [after](absl::Status st) { return after(std::move(st)); });
}

Result StoreSteps::Base() const {
  Result r;
  r.server_version = s_->server_version_;
  if (s_->statements_) r.dialect = s_->statements_->dialect();
  r.next_timeout_ms = s_->NextTimeoutMs();
  return r;
}

}  // namespace chstate
