// Store operations as chains of steps: each step is "run this SQL, then
// continue with its answer" or "wait, then continue". Nothing here blocks.
#include "core/store.h"

#include <algorithm>
#include <set>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "core/clickhouse_errors.h"
#include "core/lock_machine.h"
#include "core/quoting.h"
#include "core/response.h"

namespace chstate {

// Builders of step chains for one Store. Every function takes a continuation
// (`then`) that produces the step after it; failures short-circuit with
// Step::Fail unless a caller passes a failure continuation.
class StoreSteps {
 public:
  StoreSteps(Store* store, const Inputs* in) : s_(store), in_(in) {}

  using Then = std::function<Step()>;
  using OnFailure = std::function<Step(absl::Status)>;

  // Runs `req`; on success continues with the body, on failure with `fail`.
  // A request acting under a lock (UnderLease) whose failure would have
  // been sent again, once the lease ran out: kAborted, naming the failure.
  Step Sql(SqlRequest req, std::string what, std::function<Step(const std::string& body)> then,
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
  Step Query(SqlRequest req, std::string what, size_t columns, std::function<Step(const Rows& rows)> then,
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

  static Step Failed(absl::Status st) { return Step::Fail(std::move(st)); }

  // Asks the server's version once per store and picks the dialect.
  Step Connected(Then then, OnFailure fail, bool force = false) {
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
  Step CheckReplicated(Then then, OnFailure fail) {
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

  const Statements& st() const { return *s_->statements_; }
  // This store holds the id's lock (a lock scope's, or lingering).
  bool HoldsLock(const std::string& id) const { return s_->held_.count(id) != 0; }
  const Inputs& inputs() const { return *in_; }
  // Keeps `p` alive as long as these steps; returns the raw pointer.
  template <typename T>
  T* Keep(std::shared_ptr<T> p) {
    keep_.push_back(p);
    return p.get();
  }

  // CREATE ... IF NOT EXISTS. Cluster mode: code 159 (a host did not run the
  // ON CLUSTER DDL in time: it is down) means the live hosts ran it and the
  // others will when they are back, so the schema is there for the quorum.
  Step Ddl(SqlRequest req, std::string what, Then then, OnFailure fail) {
    return Sql(
        std::move(req), std::move(what), [then](const std::string&) { return then(); },
        [this, then, fail](absl::Status status) -> Step {
          if (st().cluster().enabled() && ClickHouseCode(status) == ch::kTimeoutExceeded) return then();
          return fail(std::move(status));
        });
  }

  Step EnsureSchema(Then then, OnFailure fail) {
    return Ddl(st().CreateDatabase(), "creating the state database", [this, then, fail] {
      return Ddl(st().CreateStateTable(), "creating the state table", [this, then, fail] {
        return Ddl(st().CreateLockTable(), "creating the lock table", [this, then, fail] {
          if (!st().cluster().enabled()) return EnsureHistory(then, fail);
          return Ddl(st().CreateClaimsTable(), "creating the lock claims table",
                     [this, then, fail] { return EnsureHistory(then, fail); }, fail);
        }, fail);
      }, fail);
    }, fail);
  }

  // With history on, the history table and the view that feeds it.
  Step EnsureHistory(Then then, OnFailure fail) {
    if (s_->options_.history_days <= 0) return then();
    return Sql(
        st().CreateHistoryTable(s_->options_.history_days), "creating the state history table",
        [this, then, fail](const std::string&) {
          return Sql(
              st().CreateHistoryView(), "creating the state history view",
              [then](const std::string&) { return then(); }, fail);
        },
        fail);
  }

  // Rows of ListHistory / GetHistoryVersion as versions.
  static absl::StatusOr<std::vector<StateVersion>> Versions(const std::string& id, const Rows& rows) {
    std::vector<StateVersion> out;
    for (const Row& row : rows) {
      StateVersion v;
      if (!row[0] || !absl::SimpleAtoi(*row[0], &v.unix_ms) || !row[1] || !row[2]) {
        return absl::DataLossError(absl::StrCat("ClickHouse sent a malformed history row for state id \"",
                                                PrintableId(id), "\""));
      }
      v.version = absl::StrCat(v.unix_ms, "-", *row[1]);
      // "2026-12-01 20:01:02[.123]" in UTC -> ISO 8601.
      v.updated_at = absl::StrCat(absl::StrReplaceAll(*row[2], {{" ", "T"}}), "Z");
      absl::StatusOr<nlohmann::json> partial = FromColumn(row[3], id, "partial_state");
      if (!partial.ok()) return partial.status();
      absl::StatusOr<nlohmann::json> completed = FromColumn(row[4], id, "completed_state");
      if (!completed.ok()) return completed.status();
      v.state = {id, *std::move(partial), *std::move(completed)};
      out.push_back(std::move(v));
    }
    return out;
  }

  // Reads one state; a missing table or database reads as "absent".
  Step ReadState(const std::string& id, std::function<Step(std::optional<MeltanoState>)> then, OnFailure fail) {
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

  absl::StatusOr<std::string> Token() {
    if (in_->random.size() < 16) {
      return absl::InvalidArgumentError(
          "the host passed fewer than 16 random bytes; every input needs fresh random bytes");
    }
    return absl::StrCat("chstate-", HexEncode(in_->random.substr(0, 16)), "-", ++s_->writes_);
  }

  // Writes a whole state row, creating the schema once if it is missing.
  Step WriteState(const MeltanoState& state, Then then, OnFailure fail, bool schema_made = false) {
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

  // After a write of `id`, one time in kHistoryUpkeepEvery (by the fresh
  // random bytes of the write's answer): the id's versions beyond
  // history_versions or older than history_days are removed. The write is
  // done either way; a failure here is left to a later write.
  Step HistoryUpkeep(const std::string& id, Then then) {
    const StoreOptions& o = s_->options_;
    if (o.history_days <= 0 || in_->random.size() < 16 ||
        static_cast<unsigned char>(in_->random[15]) % kHistoryUpkeepEvery != 0) {
      return then();
    }
    return Query(
        st().HistoryOverLimits(id, o.history_versions, o.history_days), "counting the state's versions", 3,
        [this, id, then](const Rows& rows) -> Step {
          const StoreOptions& o = s_->options_;
          int64_t count = 0, expired = 0, cutoff_ms = 0;
          if (rows.empty() || !absl::SimpleAtoi(rows[0][0].value_or(""), &count) ||
              !absl::SimpleAtoi(rows[0][1].value_or(""), &expired) ||
              !absl::SimpleAtoi(rows[0][2].value_or(""), &cutoff_ms)) {
            return then();
          }
          const bool over_count = o.history_versions > 0 && count > o.history_versions && cutoff_ms > 0;
          if (!over_count && expired == 0) return then();
          return Sql(
              st().TrimHistoryOf(id, over_count ? cutoff_ms : 0, o.history_days),
              "removing the state's old versions", [then](const std::string&) { return then(); },
              [then](absl::Status) { return then(); });
        },
        [then](absl::Status) { return then(); });
  }

  // Import: the states from `from` on, in multi-row INSERTs (see
  // Store::Import), creating the schema once if it is missing.
  Step WriteBatches(std::shared_ptr<const std::vector<MeltanoState>> all, size_t from, bool schema_made) {
    const std::vector<MeltanoState>& states = *all;
    if (from >= states.size()) {
      Result r = Base();
      r.count = static_cast<int64_t>(states.size());
      return Step::Done(std::move(r));
    }
    std::vector<Statements::StateRow> rows;
    int64_t bytes = 0;
    size_t next = from;
    for (; next < states.size() && static_cast<int64_t>(rows.size()) < kDefaultImportBatchStates; ++next) {
      const MeltanoState& state = states[next];
      if (absl::Status lease = LeaseCheck(state.state_id); !lease.ok()) return Failed(lease);
      Statements::StateRow row{state.state_id, ToColumn(state.partial), ToColumn(state.completed)};
      // Quoting at most quadruples a byte (\xHH); a row alone is always sent.
      int64_t size = 4 * static_cast<int64_t>(row.state_id.size() + row.partial_json.value_or("").size() +
                                              row.completed_json.value_or("").size()) + 32;
      if (!rows.empty() && bytes + size > kDefaultImportBatchBytes) break;
      bytes += size;
      rows.push_back(std::move(row));
    }
    absl::StatusOr<std::string> token = Token();
    if (!token.ok()) return Failed(token.status());
    SqlRequest req = st().InsertStates(rows, *token);
    for (const Statements::StateRow& row : rows) req = UnderLease(std::move(req), row.state_id);
    return QuorumWrite(
        std::move(req), absl::StrCat("importing states ", from + 1, "-", next, " of ", states.size()),
        in_->now_ms + s_->options_.cluster.quorum_busy_ms, 5,
        [this, all, next] { return WriteBatches(all, next, true); },
        [this, all, from, schema_made](absl::Status st) -> Step {
          if (st.code() == absl::StatusCode::kNotFound && !schema_made) {
            return EnsureSchema([this, all, from] { return WriteBatches(all, from, true); }, Failed);
          }
          return Failed(absl::Status(
              st.code(), absl::StrCat(st.message(), "; the import stopped after ", from, " of ", all->size(),
                                      " states were written (sorted as given). Importing the same states again is "
                                      "safe: each write overwrites the whole state")));
        });
  }

  // Cluster mode: a write that must reach the quorum. Code 286 (another
  // quorum write to the table is in flight, or the previous one has not
  // reached its quorum yet) wrote nothing, so it is retried until the
  // deadline. Code 319 is explained: the row is on one replica and will
  // appear everywhere once another replica has it; writing again is safe.
  Step QuorumWrite(SqlRequest req, std::string what, int64_t deadline_ms, int64_t wait_ms, Then then,
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
            // Under a lock, sent again only within its lease.
            if (PastSendBefore(req, in_->now_ms + wait_ms + jitter)) {
              return fail(LeaseRanOut(what,
                                      *code == ch::kTooManyParts
                                          ? "code 252 (too many parts: the table merges slower than it is written)"
                                          : "code 286 (an earlier quorum write to the table is not confirmed yet)",
                                      false));
            }
            return Step::Wait(wait_ms + jitter, [this, req, what, deadline_ms, wait_ms, then, fail] {
              return QuorumWrite(req, what, deadline_ms, std::min<int64_t>(wait_ms * 2, 100), then, fail);
            });
          }
          return fail(ExplainQuorumError(std::move(st), *code));
        });
  }

  absl::Status ExplainQuorumError(absl::Status st, int code) const {
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
  absl::Status ExplainCluster(absl::Status st) const {
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
  static absl::Status Reworded(const absl::Status& st, absl::StatusCode code, absl::string_view message) {
    absl::Status out(code, message);
    st.ForEachPayload([&out](absl::string_view url, const absl::Cord& payload) { out.SetPayload(url, payload); });
    return out;
  }

  Step DeleteState(const std::string& id, Then then, OnFailure fail) {
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
  Step AwaitMutations(int64_t deadline_ms, int64_t wait_ms, Then then, OnFailure fail) {
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

  // ---- lock (core/lock_machine.h) ----

  using LockPtr = std::shared_ptr<LockMachine>;
  using LockOutcome = std::function<Step(const LockAction&)>;

  // Turns a LockMachine's actions into steps until it reports an outcome
  // (acquired, released, failed, lost). Renewal timers armed while held are
  // not run inside a task: the lease is checked before every write instead.
  Step DriveLock(const LockPtr& m, LockOutcome on_outcome) {
    while (std::optional<LockAction> a = m->Poll()) {
      switch (a->kind) {
        case LockAction::Kind::kRunSql: {
          const bool inspection = a->request.purpose == "inspect_lock" || a->request.purpose == "inspect_claims";
          return Step::Run(std::move(a->request), [this, m, on_outcome, inspection](const SqlResponse& r) {
            // Whether the lock was seen held by a live holder, for the backoff below.
            seen_holder_ = false;
            if (inspection && r.transport_ok && r.http_status == 200) {
              absl::StatusOr<LockInspection> insp =
                  st().cluster().enabled()
                      ? ParseClaimInspection(r.body, m->lock_id(), (m->options().stale_ms + 999) / 1000,
                                             m->claim_prefix())
                      : ParseLockInspection(r.body);
              seen_holder_ = insp.ok() && insp->exists && !insp->holder.empty() && insp->holder != m->lock_id() &&
                             (!st().cluster().enabled() ||
                              insp->age_s * 1000 <= std::max(m->options().stale_ms, insp->stale_s * 1000));
              if (seen_holder_) seen_holder_id_ = insp->holder;
              if (insp.ok()) last_dead_ = insp->dead;
            }
            m->OnResponse(r, *in_);
            return DriveLock(m, on_outcome);
          });
        }
        case LockAction::Kind::kArmTimer:
          // A renewal that finished arms the next one: that is its outcome.
          if (m->state() == LockState::kHeld) return on_outcome(*a);
          // Cluster mode: a claim row resent after code 286 waits a moment.
          if (m->state() != LockState::kBackingOff && !m->busy_waiting()) continue;
          {
            auto wait = [this, m, on_outcome, delay_ms = a->delay_ms] {
              return Step::Wait(delay_ms, [this, m, on_outcome] {
                m->OnTimer(*in_);
                return DriveLock(m, on_outcome);
              });
            };
            // Once per holder seen: a row each retry would only fill the table.
            if (!seen_holder_ || announced_to_ == seen_holder_id_) return wait();
            // Shown to the holder, which gives up a lingering lock for it
            // (linger_locks); an error (the table gone meanwhile) is harmless.
            return Sql(
                st().AnnounceLockWaiter(m->state_id(), m->lock_id(), seen_holder_id_),
                "showing the holder that a process waits",
                [this, wait](const std::string&) {
                  announced_to_ = seen_holder_id_;
                  return wait();
                }, [wait](absl::Status) { return wait(); });
          }
        default:
          return on_outcome(*a);
      }
    }
    return Step::Fail(absl::InternalError(
        absl::StrCat("the lock stopped in state ", LockStateName(m->state()), " without an outcome")));
  }

  // `deadline_ms`: when waiting ends (the lock timeout from the first
  // attempt); a retry after yielding to the Python backend keeps it.
  Step Acquire(const std::string& id, std::function<Step(LockPtr)> then, OnFailure fail,
               std::optional<int64_t> deadline_ms = std::nullopt) {
    const int64_t deadline = deadline_ms.value_or(in_->now_ms + s_->options_.lock.timeout_ms);
    if (auto y = s_->yielded_until_.find(id); y != s_->yielded_until_.end()) {
      // This store just gave the id's lingering lock up to a waiting
      // process: stay away until that process has had its next attempt.
      if (in_->now_ms < y->second && y->second < deadline) {
        return Step::Wait(y->second - in_->now_ms,
                          [this, id, then, fail, deadline] { return Acquire(id, then, fail, deadline); });
      }
      s_->yielded_until_.erase(y);
    }
    // A mixed fleet is safe by default: a live row of the Python backend in
    // <table>_lock is waited for whatever python_locks says (that setting
    // decides whether this store also shows itself there, and looks again
    // after taking its own lock). Looked at before taking the lock, so that
    // a failed look leaves nothing to release. The Python backend knows no
    // clusters.
    if (!s_->options_.python_locks && !st().cluster().enabled()) {
      return Query(
          st().ForeignLockRows(id), "looking for the Python backend's lock rows", 2,
          [this, id, then, fail, deadline](const Rows& rows) -> Step {
            if (rows.empty()) return TakeLock(id, then, fail, deadline);
            return WaitForPython(id, rows[0][0].value_or(""), then, fail, deadline);
          },
          [this, id, then, fail, deadline](absl::Status st) -> Step {
            // No such table: no Python process ever ran on this schema.
            if (st.code() == absl::StatusCode::kNotFound) return TakeLock(id, then, fail, deadline);
            return fail(std::move(st));
          });
    }
    return TakeLock(id, then, fail, deadline);
  }

  // A Python backend's process holds the id: try again after the retry
  // wait, or give up naming it.
  Step WaitForPython(const std::string& id, const std::string& python_lock_id, std::function<Step(LockPtr)> then,
                     OnFailure fail, int64_t deadline) {
    if (in_->now_ms + s_->options_.lock.retry_ms >= deadline) {
      return fail(absl::AbortedError(absl::StrCat(
          "state id \"", PrintableId(id), "\" is locked by a process of the Python ClickHouse backend (its lock row ",
          PrintableId(python_lock_id), " in ", s_->options_.table, "_lock); it was not free within the lock timeout")));
    }
    return Step::Wait(s_->options_.lock.retry_ms,
                      [this, id, then, fail, deadline] { return Acquire(id, then, fail, deadline); });
  }

  Step TakeLock(const std::string& id, std::function<Step(LockPtr)> then, OnFailure fail, int64_t deadline) {
    LockOptions options = s_->options_.lock;
    options.timeout_ms = std::max<int64_t>(deadline - in_->now_ms, 0);
    auto m = std::make_shared<LockMachine>(st(), id, options);
    m->Acquire(*in_);
    last_dead_.clear();
    return DriveLock(m, [this, m, id, deadline, then, fail](const LockAction& a) -> Step {
      if (a.kind != LockAction::Kind::kAcquired) return fail(ExplainCluster(a.status));
      if (!s_->options_.python_locks) return PruneClaims(id, [this, m, then] { return then(m); });
      return ClaimFromPython(id, m, deadline, then, fail);
    });
  }

  // Cluster mode, just acquired: when the claims read last held
  // kClaimsPruneAt claims of the id that no reader counts any more, they
  // are removed (kClaimsPruneAt). A failure changes nothing: they are
  // removed by a later acquisition.
  Step PruneClaims(const std::string& id, Then then) {
    if (!st().cluster().enabled() || static_cast<int64_t>(last_dead_.size()) < kClaimsPruneAt) return then();
    std::vector<std::string> dead = std::move(last_dead_);
    last_dead_.clear();
    // A backlog (claims from before pruning existed) goes kClaimsPruneMax
    // at a time, a slice at a random offset, at every acquisition until it
    // is gone (a statement must stay below max_query_size, 256 KiB).
    const bool backlog = static_cast<int64_t>(dead.size()) > kClaimsPruneMax;
    auto last = s_->claims_pruned_ms_.find(id);
    if (!backlog && last != s_->claims_pruned_ms_.end() && in_->now_ms - last->second < kClaimsPruneEveryMs) {
      return then();
    }
    s_->claims_pruned_ms_[id] = in_->now_ms;
    if (backlog) {
      uint64_t r = 0;
      for (size_t i = 0; i < in_->random.size() && i < 8; ++i) r = (r << 8) | static_cast<unsigned char>(in_->random[i]);
      const size_t from = static_cast<size_t>(r % (dead.size() - kClaimsPruneMax + 1));
      dead = std::vector<std::string>(dead.begin() + from, dead.begin() + from + kClaimsPruneMax);
    }
    return Sql(
        st().PruneClaims(id, dead), "removing ended lock claims", [then](const std::string&) { return then(); },
        [then](absl::Status) { return then(); });
  }

  // python_locks: the table lock is ours; now the Python backend's rows.
  // Look (a Python holder: yield), show ourselves with a marker, wait the
  // settle time (a Python process that saw the lock free before the marker
  // has written its row by then), look again. Yielding releases the table
  // lock and tries again until the deadline.
  Step ClaimFromPython(const std::string& id, const LockPtr& m, int64_t deadline, std::function<Step(LockPtr)> then,
                       OnFailure fail) {
    // Release withdraws the marker first (it is harmless when none was written).
    auto abandon = [this, m, fail](absl::Status st) -> Step {
      return Release(m, [fail, st] { return fail(st); }, [fail, st](absl::Status) { return fail(st); });
    };
    auto yield = [this, id, m, deadline, then, fail](const std::string& python_lock_id) -> Step {
      return Release(
          m,
          [this, id, deadline, then, fail, python_lock_id] {
            if (in_->now_ms + s_->options_.lock.retry_ms >= deadline) {
              return fail(absl::AbortedError(absl::StrCat(
                  "state id \"", PrintableId(id), "\" is locked by a process of the Python ClickHouse backend (its "
                  "lock row ", PrintableId(python_lock_id), " in ", s_->options_.table,
                  "_lock); it was not free within the lock timeout")));
            }
            return Step::Wait(s_->options_.lock.retry_ms,
                              [this, id, deadline, then, fail] { return Acquire(id, then, fail, deadline); });
          },
          fail);
    };
    auto look = [this, id](std::function<Step(const Rows&)> seen, OnFailure failed) {
      return Query(st().ForeignLockRows(id), "looking for the Python backend's lock rows", 2, std::move(seen),
                   std::move(failed));
    };
    return look(
        [this, id, m, then, yield, abandon, look](const Rows& before) -> Step {
          if (!before.empty()) return yield(before[0][0].value_or(""));
          return Sql(
              st().InsertLockMarker(id, m->lock_id()), "showing the lock to the Python backend",
              [m, then, yield, abandon, look](const std::string&) {
                return Step::Wait(kDefaultPythonLockSettleMs, [m, then, yield, abandon, look] {
                  return look(
                      [m, then, yield](const Rows& after) -> Step {
                        if (!after.empty()) return yield(after[0][0].value_or(""));
                        return then(m);
                      },
                      abandon);
                });
              },
              abandon);
        },
        abandon);
  }

  Step Release(const LockPtr& m, Then then, OnFailure fail) {
    auto drop = [this, m, then, fail] {
      m->Release(*in_);
      return DriveLock(m, [this, then, fail](const LockAction& a) -> Step {
        if (a.kind == LockAction::Kind::kReleased) return then();
        return fail(ExplainCluster(a.status));
      });
    };
    if (!s_->options_.python_locks || m->state() != LockState::kHeld) return drop();
    // The marker first: while it stands, Python processes wait.
    return Sql(
        st().DeleteLockMarker(m->state_id(), m->lock_id()), "withdrawing the lock marker",
        [drop](const std::string&) { return drop(); },
        // Dropped anyway; the marker then ends with the Python backend's window.
        [drop](absl::Status) { return drop(); });
  }

  // The lock a write to `id` acts under: the one this task took
  // (WithLock), or one this store holds on `id`; null when none.
  const LockMachine* LockOf(const std::string& id) const {
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
  SqlRequest UnderLease(SqlRequest req, const std::string& id) {
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
  absl::Status LeaseRanOut(const std::string& what, const std::string& cause, bool maybe_landed) const {
    return absl::AbortedError(absl::StrCat(
        "the lock on state id \"", PrintableId(lease_id_), "\" ran out while ", what, " waited out ", cause,
        ": it was not sent again past the lease, since another process may hold the lock by now (",
        maybe_landed ? "its last send may have landed" : "it was not written",
        "). Release the lock and start again"));
  }

  // Writes under a lock are sent only while its lease is valid: the lock
  // this task took (WithLock), or one this store holds on `id`.
  absl::Status LeaseCheck(const std::string& id) const {
    const LockMachine* lock = LockOf(id);
    if (lock == nullptr || lock->LeaseValid(in_->now_ms)) return absl::OkStatus();
    return absl::AbortedError(absl::StrCat(
        "the lock on state id \"", PrintableId(id), "\" ran out before the write (its lease ends ",
        s_->options_.lock.stale_ms / 1000, " s, less a safety margin, after it was taken or last renewed; the store "
        "renews it when used or ticked after a third of that); nothing was written: release it and start again"));
  }

  // Runs `body` under the lock for `id` and releases on every exit path. The
  // body ends by calling `finish` with its result or error; `after` gets that
  // outcome once the lock is released (by default it ends the task).
  using Finish = std::function<Step(absl::StatusOr<Result>)>;
  static Step Terminal(absl::StatusOr<Result> outcome) {
    return outcome.ok() ? Step::Done(*std::move(outcome)) : Step::Fail(outcome.status());
  }
  Step WithLock(const std::string& id, std::function<Step(Finish)> body, Finish after = Terminal) {
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

  Result Base() const {
    Result r;
    r.server_version = s_->server_version_;
    if (s_->statements_) r.dialect = s_->statements_->dialect();
    r.next_timeout_ms = s_->NextTimeoutMs();
    return r;
  }

  // ---- held locks' renewal (Store::Tick) ----

  // Renews the lock this store holds on `id` when its renewal is due. A lock
  // found lost stays known (writes to the id are refused by LeaseCheck until
  // it is released), and the operation goes on: reading is harmless.
  Step RenewIfDue(const std::string& id, Then then, OnFailure fail) {
    auto it = s_->held_.find(id);
    if (it == s_->held_.end() || !it->second.Live() || in_->now_ms < it->second.renew_at_ms) return then();
    return Renew(id, then, [then](absl::Status) { return then(); }, std::move(fail));
  }

  // Renews the lock this store holds on `id` now. `lost` gets the status
  // when the lock turned out not ours any more; `fail` any other failure.
  Step Renew(const std::string& id, Then then, OnFailure lost, OnFailure fail) {
    auto it = s_->held_.find(id);
    if (it == s_->held_.end()) return lost(LostLock(id));
    std::shared_ptr<LockMachine> m = it->second.machine;
    if (m->state() != LockState::kHeld) return lost(LostLock(id));
    m->OnTimer(*in_);
    return DriveLock(m, [this, m, id, then, lost, fail](const LockAction& a) -> Step {
      if (a.kind == LockAction::Kind::kArmTimer) {
        // Confirmed (or inconclusive, to be tried again soon): the machine
        // names when the next renewal is due.
        auto it = s_->held_.find(id);
        if (it != s_->held_.end() && it->second.machine == m) it->second.renew_at_ms = in_->now_ms + a.delay_ms;
        if (!s_->options_.python_locks || m->state() != LockState::kHeld) return then();
        // The marker is renewed with the lock: the Python backend counts a
        // row live for kPythonLockWindowS. A failure here is tried again at
        // the next renewal, well inside that window.
        return Sql(
            st().InsertLockMarker(id, m->lock_id()), "renewing the lock marker",
            [then](const std::string&) { return then(); }, [then](absl::Status) { return then(); });
      }
      if (m->state() == LockState::kLost) return lost(a.status.ok() ? LostLock(id) : a.status);
      return fail(a.status);
    });
  }

  static absl::Status LostLock(const std::string& id) {
    return absl::AbortedError(
        absl::StrCat("the lock on state id \"", PrintableId(id), "\" was lost: stop acting under it and release it"));
  }

  // A lingering lock whose lease ran out (the process was paused) or that
  // was found lost is forgotten when a task starts: not ours to drop, and
  // the next acquisition starts afresh.
  void ForgetStaleLingering() {
    for (auto it = s_->held_.begin(); it != s_->held_.end();) {
      if (it->second.lingering && (!it->second.Live() || !it->second.machine->LeaseValid(in_->now_ms))) {
        it = s_->held_.erase(it);
      } else {
        ++it;
      }
    }
  }

  // Releases the held lock `m` on `id` (inspection and DROP) and then
  // forgets it. It stays known until the release ends (its machine, no
  // longer holding, is neither renewed nor valid for writes meanwhile), so
  // that its lease deadline stays visible (LeaseDeadlineMs) while the DROP
  // is decided.
  Step ReleaseAndForget(const std::string& id, const LockPtr& m, Then then, OnFailure fail) {
    auto forget = [this, id, m] {
      auto held = s_->held_.find(id);
      if (held != s_->held_.end() && held->second.machine == m) s_->held_.erase(held);
    };
    return Release(
        m,
        [forget, then] {
          forget();
          return then();
        },
        [forget, fail](absl::Status st) {
          forget();
          return fail(std::move(st));
        });
  }

  // Releases for real the lingering lock on `id`; `then` either way (a
  // failed release leaves it to expire).
  Step ReleaseLingeringLock(const std::string& id, Then then) {
    auto it = s_->held_.find(id);
    if (it == s_->held_.end() || !it->second.lingering) return then();
    return ReleaseAndForget(id, it->second.machine, then, [then](absl::Status) { return then(); });
  }

  // linger_locks: looks for processes waiting for the lock on `id`. `none`
  // when there is none; when there is one (or the look fails), this store
  // stays away from the id until that process's next attempt (Acquire
  // waits) and `waiter` runs (the release for real).
  Step LookForWaiters(const std::string& id, Then none, Then waiter) {
    auto yield = [this, id, waiter] {
      s_->yielded_until_[id] = in_->now_ms + s_->options_.lock.retry_ms + kDefaultLockYieldMarginMs;
      return waiter();
    };
    auto held = s_->held_.find(id);
    const std::string holder = held == s_->held_.end() ? std::string() : held->second.machine->lock_id();
    return Query(
        st().LockWaiters(id, holder), "looking for processes waiting for the lock", 2,
        [none, yield](const Rows& rows) { return rows.empty() ? none() : yield(); },
        [yield](absl::Status) { return yield(); });
  }

  // Tick's part for linger_locks: lingering locks idle past their time go,
  // and so do those another process now waits for (looked for every
  // WaiterCheckEveryMs while they linger).
  Step ReleaseIdleLingering(Then then) {
    for (auto& [id, held] : s_->held_) {
      if (!held.lingering) continue;
      const std::string state_id = id;
      auto next = [this, then] { return ReleaseIdleLingering(then); };
      if (in_->now_ms >= held.linger_until_ms) return ReleaseLingeringLock(state_id, next);
      if (in_->now_ms >= held.waiters_checked_ms + s_->WaiterCheckEveryMs()) {
        held.waiters_checked_ms = in_->now_ms;
        return LookForWaiters(state_id, next,
                              [this, state_id, next] { return ReleaseLingeringLock(state_id, next); });
      }
    }
    return then();
  }

  // Tasks of one store run one at a time, so when one starts, a held lock
  // still waiting for a renewal's answer belongs to a task that was
  // abandoned (a host that lost interest): that answer will never come.
  // Such a renewal counts as inconclusive, as a lost answer would: the lease
  // stands as last confirmed, and the lock is renewed again when due.
  void SettleAbandonedRenewals() {
    for (auto& [id, held] : s_->held_) {
      if (!held.AbandonedRenewal()) continue;
      SqlResponse never;
      never.transport_ok = false;
      never.maybe_delivered = true;
      never.transport_error = "the renewal's task was abandoned before its answer came";
      held.machine->OnResponse(never, *in_);
      while (std::optional<LockAction> a = held.machine->Poll()) {
        if (a->kind == LockAction::Kind::kArmTimer) held.renew_at_ms = in_->now_ms + a->delay_ms;
      }
    }
  }

  // Renews, one after another, every held lock whose renewal is due; a lost
  // one ends the task with kAborted naming it.
  Step RenewAllDue(Then then, OnFailure fail) {
    for (const auto& [id, held] : s_->held_) {
      if (held.Live() && in_->now_ms >= held.renew_at_ms) {
        return Renew(id, [this, then, fail] { return RenewAllDue(then, fail); }, fail, fail);
      }
    }
    return then();
  }

  // ---- export (Store::ExportPage) ----

  // Samples the page boundaries beyond `from` into the store's export
  // cursor, then reads the next page.
  Step ExportSample(std::optional<std::string> from, int64_t limit) {
    Store::ExportCursor& c = *s_->export_;
    return Query(
        st().SampleStateIds(c.glob, from, kExportSampleEvery, kExportSampleCount), "sampling state ids to export", 2,
        [this, from, limit](const Rows& rows) {
          Store::ExportCursor& c = *s_->export_;
          c.bounds.clear();
          for (const Row& row : rows) {
            std::string id = row[0].value_or("");
            // Sorted by the server; kept strictly ascending and beyond `from`
            // whatever it sent, so that every range is well formed.
            if ((from && id <= *from) || (!c.bounds.empty() && id <= c.bounds.back())) continue;
            c.bounds.push_back(std::move(id));
          }
          c.sampled_to_end = static_cast<int64_t>(rows.size()) < kExportSampleCount || c.bounds.empty();
          return ExportRange(from, limit);
        },
        [this](absl::Status st) { return ExportFailed(std::move(st)); });
  }

  // Reads the states after `from` up to the next boundaries (as many ranges
  // as make about kDefaultExportPageBytes, at most `limit` states).
  Step ExportRange(std::optional<std::string> from, int64_t limit) {
    Store::ExportCursor& c = *s_->export_;
    if (c.bounds.empty() && !c.sampled_to_end) return ExportSample(from, limit);
    // The first page is one range; later ones as many as the size of the
    // states read so far lets into the byte budget.
    size_t ranges = 1;
    if (c.bytes_per_state > 0) {
      const int64_t states = std::min(limit, kDefaultExportPageBytes / c.bytes_per_state);
      ranges = static_cast<size_t>(std::max<int64_t>(states / kExportSampleEvery, 1));
    }
    std::optional<std::string> upto;
    if (c.bounds.size() >= ranges) {
      upto = c.bounds[ranges - 1];
    } else if (!c.bounds.empty() && !c.sampled_to_end) {
      upto = c.bounds.back();  // sampled again from there once it is read
    } else if (!c.bounds.empty()) {
      upto = std::nullopt;  // the last ranges, to the end
    }
    return Sql(
        st().ExportStates(c.glob, from, upto, limit), "exporting states",
        [this, from, upto, limit](const std::string& body) -> Step {
          absl::StatusOr<Rows> rows = ParseTabSeparated(body, 3);
          if (!rows.ok()) return ExportFailed(rows.status());
          Result r = Base();
          r.states.emplace();
          r.states->reserve(rows->size());
          for (const Row& row : *rows) {
            MeltanoState state;
            state.state_id = row[0].value_or("");
            absl::StatusOr<nlohmann::json> partial = FromColumn(row[1], state.state_id, "partial_state");
            if (!partial.ok()) return ExportFailed(partial.status());
            absl::StatusOr<nlohmann::json> completed = FromColumn(row[2], state.state_id, "completed_state");
            if (!completed.ok()) return ExportFailed(completed.status());
            state.partial = std::move(*partial);
            state.completed = std::move(*completed);
            r.states->push_back(std::move(state));
          }
          Store::ExportCursor& c = *s_->export_;
          const bool full = static_cast<int64_t>(rows->size()) >= limit;
          // A full page may have stopped inside its range: the next one goes
          // on from its last id towards the same boundaries.
          const std::optional<std::string> reached = full ? std::optional<std::string>(r.states->back().state_id) : upto;
          while (!c.bounds.empty() && (!reached || c.bounds.front() <= *reached)) c.bounds.pop_front();
          if (!rows->empty()) {
            c.bytes_per_state = std::max<int64_t>(static_cast<int64_t>(body.size() / rows->size()), 1);
          }
          r.more = full || upto.has_value();
          if (r.more && r.states->empty()) return ExportRange(upto, limit);  // an empty range: on to the next
          if (r.more) {
            c.after = r.states->back().state_id;
          } else {
            s_->export_.reset();
          }
          return Step::Done(std::move(r));
        },
        [this](absl::Status st) { return ExportFailed(std::move(st)); });
  }

  // A failed page forgets the export (the next page samples afresh); a
  // missing table is an export of no states.
  Step ExportFailed(absl::Status st) {
    s_->export_.reset();
    if (st.code() != absl::StatusCode::kNotFound) return Step::Fail(std::move(st));
    Result r = Base();
    r.states.emplace();
    return Step::Done(std::move(r));
  }

 private:
  Store* s_;
  const Inputs* in_;
  LockPtr current_lock_;
  std::string lease_id_;  // the id whose lease the last UnderLease request keeps to
  bool seen_holder_ = false;  // the last lock inspection found another live holder
  std::string seen_holder_id_;  // cluster mode: the holder the waiter row names
  std::string announced_to_;  // the holder this task's waiter row named last
  std::vector<std::string> last_dead_;  // cluster mode: the prunable claims the last read found
  std::vector<std::shared_ptr<void>> keep_;
};

namespace {

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

}  // namespace

absl::StatusOr<std::unique_ptr<Store>> Store::Create(StoreOptions options) {
  if (absl::Status s = ValidateIdentifier(options.schema, "schema"); !s.ok()) return s;
  if (absl::Status s = ValidateIdentifier(options.table, "table"); !s.ok()) return s;
  if (options.lock.timeout_ms < 0 || options.lock.retry_ms <= 0 || options.lock.stale_ms <= 0) {
    return absl::InvalidArgumentError(
        "lock settings must be positive (timeout may be 0 to try once): check the lock timeout, retry and "
        "stale-lock settings");
  }
  if (options.lock.stale_ms < kMinStaleLockMs) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the stale-lock window (how long a lock stays valid without renewal) is ", options.lock.stale_ms,
        " ms; it must be at least ", kMinStaleLockMs / 1000,
        " s: the holder keeps a tenth of it as margin for requests still in flight. Raise the stale-lock setting "
        "(Meltano: state_backend.lock_timeout_seconds)"));
  }
  if (options.history_days < 0 || options.history_versions < 0) {
    return absl::InvalidArgumentError("history_days and history_versions must not be negative (0: no limit)");
  }
  if (options.python_locks && options.lock.stale_ms > 2 * kPythonLockWindowS * 1000) {
    return absl::InvalidArgumentError(absl::StrCat(
        "with python_locks the stale-lock window may be at most ", 2 * kPythonLockWindowS,
        " s: a holder's row in the Python backend's lock table must be renewed within its ", kPythonLockWindowS,
        " s, and renewals come every third of the window. Lower the stale-lock setting "
        "(Meltano: state_backend.lock_timeout_seconds)"));
  }
  if (options.hosts.size() > 1 && !options.cluster.enabled()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "several hosts (", Endpoints(options.hosts).Describe(),
        ") need cluster mode: without it each server keeps its own states and locks. Name the cluster "
        "(?cluster=NAME in the URI, --cluster, MELTANO_STATE_BACKEND_CLICKHOUSE_CLUSTER) or give one host"));
  }
  if (options.host_down_ms < 0) return absl::InvalidArgumentError("host_down_ms must not be negative");
  for (const Endpoint& e : options.hosts) {
    if (e.host.empty() || e.port < 1 || e.port > 65535) {
      return absl::InvalidArgumentError("every host needs a name and a port from 1 to 65535");
    }
  }
  if (!options.hosts.empty()) {
    options.transport.endpoints = std::make_shared<Endpoints>(options.hosts, options.host_down_ms);
    if (options.endpoint.empty()) options.endpoint = options.transport.endpoints->Describe();
  }
  return std::unique_ptr<Store>(new Store(std::move(options)));
}

bool Store::LeaseValid(const std::string& state_id, int64_t now_ms) const {
  auto it = held_.find(state_id);
  return it != held_.end() && it->second.machine->LeaseValid(now_ms);
}

int64_t Store::LeaseDeadlineMs(const std::string& state_id) const {
  auto it = held_.find(state_id);
  return it == held_.end() ? 0 : it->second.machine->lease_deadline_ms();
}

std::optional<Dialect> Store::dialect() const {
  if (statements_) return statements_->dialect();
  return std::nullopt;
}

std::unique_ptr<Task> Store::Ping() {
  return MakeTask(this, [](StoreSteps& s) {
    return s.Connected([&s] { return Step::Done(s.Base()); }, StoreSteps::Failed, /*force=*/true);
  });
}

namespace {

// Drops tombstones of taken-over locks once they are older than twice the
// stale window: by then no taker can still be acting on what it saw.
Step DropTombstones(StoreSteps& s, std::vector<std::string> names, size_t next, int64_t* dropped) {
  if (next >= names.size()) {
    Result r = s.Base();
    r.count = *dropped;
    return Step::Done(std::move(r));
  }
  SqlRequest drop = s.st().DropTable(names[next]);
  return s.Sql(
      std::move(drop), "removing an old lock tombstone",
      [&s, names, next, dropped](const std::string&) {
        ++*dropped;
        return DropTombstones(s, names, next + 1, dropped);
      },
      StoreSteps::Failed);
}

}  // namespace

std::unique_ptr<Task> Store::Init() {
  return MakeTask(this, [this](StoreSteps& s) {
    return s.Connected(
        [this, &s] {
          return s.EnsureSchema(
              [this, &s] {
                auto tombstones = [this, &s] {
                  int64_t older_than_s = 2 * ((options_.lock.stale_ms + 999) / 1000);
                  return s.Query(
                      s.st().ListOldTombstones(older_than_s), "listing old lock tombstones", 2,
                      [&s](const Rows& rows) {
                        std::vector<std::string> names;
                        for (const Row& row : rows) names.push_back(row[0].value_or(""));
                        auto dropped = std::make_shared<int64_t>(0);
                        // The counter lives as long as the steps that use it.
                        return DropTombstones(s, names, 0, s.Keep(dropped));
                      },
                      StoreSteps::Failed);
                };
                if (options_.history_days <= 0) return tombstones();
                auto trim = [this, &s, tombstones] {
                  if (options_.history_versions <= 0) return tombstones();
                  return s.Sql(
                      s.st().TrimHistory(options_.history_versions), "removing state versions beyond the count kept",
                      [tombstones](const std::string&) { return tombstones(); }, StoreSteps::Failed);
                };
                // 18.x has no TTL: retention is applied here (modern tables also have one).
                return s.Sql(
                    s.st().ExpireHistory(options_.history_days), "removing old state history",
                    [trim](const std::string&) { return trim(); }, StoreSteps::Failed);
              },
              StoreSteps::Failed);
        },
        StoreSteps::Failed);
  });
}

namespace {

HeldLockInfo LockInfo(const LockInspection& insp, std::string table, std::optional<std::string> state_id) {
  HeldLockInfo info;
  info.state_id = std::move(state_id);
  info.table = std::move(table);
  info.holder = insp.holder;
  info.held_s = insp.now_s - insp.created_s;
  info.renewed_s = insp.age_s;
  info.validity_s = insp.stale_s;
  info.stale = insp.stale_s > 0 && insp.age_s >= insp.stale_s;
  return info;
}

// Inspects the lock tables from `next` on, one request each, collecting the
// ones that still exist.
Step InspectLocks(StoreSteps& s, std::shared_ptr<std::vector<std::pair<std::string, std::optional<std::string>>>> tables,
                  size_t next, std::shared_ptr<std::vector<HeldLockInfo>> found) {
  if (next >= tables->size()) {
    Result r = s.Base();
    r.locks = *found;
    return Step::Done(std::move(r));
  }
  const auto& [table, id] = (*tables)[next];
  return s.Sql(
      s.st().InspectLockTable(table), "inspecting a lock",
      [&s, tables, next, found](const std::string& body) {
        absl::StatusOr<LockInspection> insp = ParseLockInspection(body);
        if (!insp.ok()) return Step::Fail(insp.status());
        if (insp->exists) found->push_back(LockInfo(*insp, (*tables)[next].first, (*tables)[next].second));
        return InspectLocks(s, tables, next + 1, found);
      },
      [&s, tables, next, found](absl::Status st) {
        // Released between the listing and the look: not held.
        if (st.code() != absl::StatusCode::kNotFound) return Step::Fail(std::move(st));
        return InspectLocks(s, tables, next + 1, found);
      });
}


// Cluster mode: the claims not ended, one HeldLockInfo each (`names` maps
// lock names to state ids).
Step ListClaimLocks(StoreSteps& s, std::shared_ptr<std::map<std::string, std::string>> names, bool all) {
  return s.Query(
      s.st().ListClaims(), "listing lock claims", 8,
      [names, all, &s](const Rows& rows) {
        // A claim another claim took over is gone, ended or not.
        std::set<std::pair<std::string, std::string>> taken;
        for (const Row& row : rows) {
          for (absl::string_view id : absl::StrSplit(row[7].value_or(""), ',', absl::SkipEmpty())) {
            taken.emplace(row[0].value_or(""), std::string(id));
          }
        }
        std::vector<HeldLockInfo> found;
        for (const Row& row : rows) {
          if (row[6].value_or("0") != "0" || taken.count({row[0].value_or(""), row[1].value_or("")})) continue;
          int64_t claimed = 0, newest = 0, stale_s = 0, now = 0;
          if (!absl::SimpleAtoi(row[2].value_or(""), &claimed) || !absl::SimpleAtoi(row[3].value_or(""), &newest) ||
              !absl::SimpleAtoi(row[4].value_or(""), &stale_s) || !absl::SimpleAtoi(row[5].value_or(""), &now)) {
            return Step::Fail(absl::DataLossError("unexpected answer listing lock claims"));
          }
          HeldLockInfo info;
          info.table = row[0].value_or("");
          auto it = names->find(info.table);
          if (it != names->end()) {
            info.state_id = it->second;
          } else if (!all) {
            continue;
          }
          info.holder = row[1].value_or("");
          info.held_s = now - claimed;
          info.renewed_s = now - newest;
          info.validity_s = stale_s;
          info.stale = stale_s > 0 && info.renewed_s > stale_s;
          found.push_back(std::move(info));
        }
        Result r = s.Base();
        r.locks = std::move(found);
        return Step::Done(std::move(r));
      },
      [&s](absl::Status st) {
        if (st.code() != absl::StatusCode::kNotFound) return Step::Fail(std::move(st));
        Result r = s.Base();  // no claims table yet: no locks
        r.locks = std::vector<HeldLockInfo>{};
        return Step::Done(std::move(r));
      });
}

// Cluster mode: ends the claims in `ids` from `next` on.
Step EndClaims(StoreSteps& s, const std::string& state_id, std::shared_ptr<std::vector<std::string>> ids, size_t next,
               HeldLockInfo info) {
  if (next >= ids->size()) {
    Result r = s.Base();
    r.locks = std::vector<HeldLockInfo>{info};
    return Step::Done(std::move(r));
  }
  return s.QuorumWrite(
      s.st().EndClaim(state_id, (*ids)[next]), "removing the lock",
      s.inputs().now_ms + s.st().cluster().quorum_busy_ms, 5,
      [&s, state_id, ids, next, info] { return EndClaims(s, state_id, ids, next + 1, info); }, StoreSteps::Failed);
}

}  // namespace

std::unique_ptr<Task> Store::Locks(std::optional<std::string> glob) {
  return MakeTask(this, [glob](StoreSteps& s) {
    return s.Connected(
        [&s, glob] {
          // Lock tables by name, then (a lock can exist before any state or
          // state table does) the tables themselves.
          std::function<Step(std::shared_ptr<std::map<std::string, std::string>>)> with_ids =
              [&s, glob](std::shared_ptr<std::map<std::string, std::string>> names) {
            return s.Query(
                s.st().ListLockTables(), "listing lock tables", 2,
                [&s, glob, names](const Rows& rows) {
                  auto tables = std::make_shared<std::vector<std::pair<std::string, std::optional<std::string>>>>();
                  for (const Row& row : rows) {
                    const std::string table = row[0].value_or("");
                    auto it = names->find(table);
                    if (it != names->end()) {
                      tables->emplace_back(table, it->second);
                    } else if (!glob) {
                      tables->emplace_back(table, std::nullopt);
                    }
                  }
                  return InspectLocks(s, tables, 0, std::make_shared<std::vector<HeldLockInfo>>());
                },
                StoreSteps::Failed);
          };
          if (s.st().cluster().enabled()) {
            // Cluster mode: the claims not ended.
            with_ids = [&s, glob](std::shared_ptr<std::map<std::string, std::string>> names) {
              return ListClaimLocks(s, names, !glob);
            };
          }
          return s.Query(
              s.st().ListStateIds(glob), "listing state ids", 2,
              [&s, with_ids](const Rows& ids) {
                auto names = std::make_shared<std::map<std::string, std::string>>();
                for (const Row& row : ids) (*names)[s.st().LockTableName(row[0].value_or(""))] = row[0].value_or("");
                return with_ids(names);
              },
              [with_ids](absl::Status st) {
                if (st.code() != absl::StatusCode::kNotFound) return Step::Fail(std::move(st));
                return with_ids(std::make_shared<std::map<std::string, std::string>>());  // no state table yet
              });
        },
        StoreSteps::Failed);
  });
}

std::unique_ptr<Task> Store::ForceUnlock(std::string state_id) {
  if (absl::Status st = ValidateStateId(state_id); !st.ok()) return Invalid(st);
  return MakeTask(this, [state_id](StoreSteps& s) {
    return s.Connected(
        [&s, state_id] {
          auto not_locked = [state_id] {
            return Step::Fail(absl::NotFoundError(
                absl::StrCat("state id \"", PrintableId(state_id), "\" is not locked")));
          };
          if (s.st().cluster().enabled()) {
            // Every claim not ended: the holder's and any racer's.
            return s.Sql(
                s.st().InspectClaims(state_id), "inspecting the lock",
                [&s, state_id, not_locked](const std::string& body) {
                  absl::StatusOr<LockInspection> insp = ParseClaimInspection(body, "", 0);
                  if (!insp.ok()) return Step::Fail(insp.status());
                  if (!insp->exists) return not_locked();
                  HeldLockInfo info = LockInfo(*insp, s.st().LockTableName(state_id), state_id);
                  info.held_s = 0;  // claims carry no creation time here
                  auto ids = std::make_shared<std::vector<std::string>>(absl::StrSplit(insp->over, ',', absl::SkipEmpty()));
                  return EndClaims(s, state_id, ids, 0, info);
                },
                [not_locked](absl::Status st) {
                  if (st.code() != absl::StatusCode::kNotFound) return Step::Fail(std::move(st));
                  return not_locked();
                });
          }
          return s.Sql(
              s.st().InspectLock(state_id), "inspecting the lock",
              [&s, state_id, not_locked](const std::string& body) {
                absl::StatusOr<LockInspection> insp = ParseLockInspection(body);
                if (!insp.ok()) return Step::Fail(insp.status());
                if (!insp->exists) return not_locked();
                HeldLockInfo info = LockInfo(*insp, s.st().LockTableName(state_id), state_id);
                return s.Sql(
                    s.st().EntombLock(state_id, LockInstance(*insp)), "removing the lock",
                    [&s, info](const std::string&) {
                      Result r = s.Base();
                      r.locks = std::vector<HeldLockInfo>{info};
                      return Step::Done(std::move(r));
                    },
                    [state_id](absl::Status st) {
                      // 60: released meanwhile; 57: this instance was taken over already.
                      if (st.code() == absl::StatusCode::kNotFound || st.code() == absl::StatusCode::kAlreadyExists) {
                        return Step::Fail(absl::AbortedError(absl::StrCat(
                            "the lock on state id \"", PrintableId(state_id),
                            "\" changed hands while it was being removed; look again with `chstate locks`")));
                      }
                      return Step::Fail(std::move(st));
                    });
              },
              [not_locked](absl::Status st) {
                if (st.code() != absl::StatusCode::kNotFound) return Step::Fail(std::move(st));
                return not_locked();
              });
        },
        StoreSteps::Failed);
  });
}

std::unique_ptr<Task> Store::History(std::string state_id, int64_t limit) {
  if (absl::Status st = ValidateStateId(state_id); !st.ok()) return Invalid(st);
  if (limit < 1) return Invalid(absl::InvalidArgumentError("a history lists at least one version"));
  return MakeTask(this, [state_id, limit](StoreSteps& s) {
    return s.Connected(
        [&s, state_id, limit] {
          auto listed = [&s, state_id](std::vector<StateVersion> versions) {
            return s.ReadState(
                state_id,
                [&s, versions](std::optional<MeltanoState> now) mutable {
                  // 18.x keeps whole seconds: among the newest second's
                  // versions, the one the state table holds is the newest.
                  for (size_t i = 0; now && i < versions.size() && versions[i].unix_ms == versions[0].unix_ms; ++i) {
                    if (versions[i].state.partial == now->partial && versions[i].state.completed == now->completed) {
                      versions[i].current = true;
                      std::rotate(versions.begin(), versions.begin() + i, versions.begin() + i + 1);
                      break;
                    }
                  }
                  Result r = s.Base();
                  r.versions = std::move(versions);
                  return Step::Done(std::move(r));
                },
                StoreSteps::Failed);
          };
          return s.Query(
              s.st().ListHistory(state_id, limit), "reading the state history", 5,
              [state_id, listed](const Rows& rows) {
                absl::StatusOr<std::vector<StateVersion>> versions = StoreSteps::Versions(state_id, rows);
                if (!versions.ok()) return Step::Fail(versions.status());
                return listed(*std::move(versions));
              },
              [listed](absl::Status st) {
                if (st.code() != absl::StatusCode::kNotFound) return Step::Fail(std::move(st));
                return listed({});
              });
        },
        StoreSteps::Failed);
  });
}

std::unique_ptr<Task> Store::Rollback(std::string state_id, std::string version) {
  if (absl::Status st = ValidateStateId(state_id); !st.ok()) return Invalid(st);
  int64_t unix_ms = 0;
  const size_t dash = version.find('-');
  const std::string hash8 = dash == std::string::npos ? "" : version.substr(dash + 1);
  if (dash == std::string::npos || !absl::SimpleAtoi(version.substr(0, dash), &unix_ms) || unix_ms < 0 ||
      hash8.size() != 8 || hash8.find_first_not_of("0123456789abcdef") != std::string::npos) {
    return Invalid(absl::InvalidArgumentError(absl::StrCat(
        "\"", PrintableId(version),
        "\" is not a version: versions look like 1796155032000-9f3a2b1c (`chstate history ID` lists them)")));
  }
  return MakeTask(this, [state_id, version, unix_ms, hash8](StoreSteps& s) {
    return s.Connected(
        [&s, state_id, version, unix_ms, hash8] {
          return s.WithLock(state_id, [&s, state_id, version, unix_ms, hash8](StoreSteps::Finish finish) {
            auto missing = [state_id, version] {
              return absl::NotFoundError(absl::StrCat(
                  "state id \"", PrintableId(state_id), "\" has no version ", version,
                  " in its history; `chstate history ID` lists the versions kept"));
            };
            return s.Query(
                s.st().GetHistoryVersion(state_id, unix_ms, hash8), "reading a version from the state history", 5,
                [&s, state_id, finish, missing](const Rows& rows) {
                  absl::StatusOr<std::vector<StateVersion>> found = StoreSteps::Versions(state_id, rows);
                  if (!found.ok()) return finish(found.status());
                  if (found->empty()) return finish(missing());
                  MeltanoState restored = std::move(found->front().state);
                  return s.WriteState(
                      restored,
                      [&s, finish, restored] {
                        Result r = s.Base();
                        r.state = restored;
                        return finish(std::move(r));
                      },
                      finish);
                },
                [finish, missing](absl::Status st) {
                  return finish(st.code() == absl::StatusCode::kNotFound ? missing() : st);
                });
          });
        },
        StoreSteps::Failed);
  });
}

std::unique_ptr<Task> Store::Get(std::string state_id) {
  if (absl::Status st = ValidateStateId(state_id); !st.ok()) return Invalid(st);
  return MakeTask(this, [state_id](StoreSteps& s) {
    return s.Connected(
        [&s, state_id] {
          return s.RenewIfDue(
              state_id,
              [&s, state_id] {
                return s.ReadState(
                    state_id,
                    [&s](std::optional<MeltanoState> state) {
                      Result r = s.Base();
                      r.state = std::move(state);
                      return Step::Done(std::move(r));
                    },
                    StoreSteps::Failed);
              },
              StoreSteps::Failed);
        },
        StoreSteps::Failed);
  });
}

namespace {

// Under the id's lock: the one this store holds (the caller's lock scope),
// renewed when due and lease-checked at the write, or one taken for `body`
// alone. Which it is, is looked at when the task starts (tasks queue).
Step UnderIdLock(StoreSteps& s, const std::string& id, std::function<Step(StoreSteps::Finish)> body) {
  if (s.HoldsLock(id)) {
    return s.RenewIfDue(id, [body] { return body(StoreSteps::Terminal); }, StoreSteps::Failed);
  }
  return s.WithLock(id, std::move(body));
}

}  // namespace

std::unique_ptr<Task> Store::Set(MeltanoState state) {
  if (absl::Status st = ValidateStateId(state.state_id); !st.ok()) return Invalid(st);
  return MakeTask(this, [state](StoreSteps& s) {
    return s.Connected(
        [&s, state] {
          return UnderIdLock(s, state.state_id, [&s, state](StoreSteps::Finish finish) {
            return s.WriteState(
                state,
                [&s, state, finish] {
                  Result r = s.Base();
                  r.state = state;
                  return finish(std::move(r));
                },
                finish);
          });
        },
        StoreSteps::Failed);
  });
}

namespace {

// Reads the id's state, merges `incoming` into it and writes the result;
// `finish` gets the outcome. The caller holds the id's lock.
Step ReadMergeWrite(StoreSteps& s, const MeltanoState& incoming, StoreSteps::Finish finish) {
  return s.ReadState(
      incoming.state_id,
      [&s, incoming, finish](std::optional<MeltanoState> current) {
        MeltanoState next = ApplyUpdate(current, incoming);
        return s.WriteState(
            next,
            [&s, next, finish] {
              Result r = s.Base();
              r.state = next;
              return finish(std::move(r));
            },
            finish);
      },
      finish);
}

}  // namespace

std::unique_ptr<Task> Store::Update(MeltanoState incoming) {
  if (absl::Status st = ValidateStateId(incoming.state_id); !st.ok()) return Invalid(st);
  return MakeTask(this, [incoming](StoreSteps& s) {
    return s.Connected(
        [&s, incoming] {
          return UnderIdLock(s, incoming.state_id,
                             [&s, incoming](StoreSteps::Finish finish) { return ReadMergeWrite(s, incoming, finish); });
        },
        StoreSteps::Failed);
  });
}

std::unique_ptr<Task> Store::MergeFrom(std::string src, std::string dst, bool force) {
  if (absl::Status st = ValidateStateId(src); !st.ok()) return Invalid(st);
  if (absl::Status st = ValidateStateId(dst); !st.ok()) return Invalid(st);
  return MakeTask(this, [src, dst, force](StoreSteps& s) {
    return s.Connected(
        [&s, src, dst, force] {
          // As `meltano state merge --from-state-id`: the source's merged
          // view, read without its lock, is the incoming partial state.
          return s.ReadState(
              src,
              [&s, src, dst, force](std::optional<MeltanoState> source) -> Step {
                if (!source) {
                  return Step::Fail(absl::NotFoundError(
                      absl::StrCat("state id \"", PrintableId(src), "\" has no state to merge")));
                }
                MeltanoState incoming;
                incoming.state_id = dst;
                incoming.partial = source->Merged();
                if (incoming.partial.empty()) {
                  return Step::Fail(absl::InvalidArgumentError(absl::StrCat(
                      "merge: the state of \"", PrintableId(src), "\" is empty, so there is nothing to "
                      "merge; nothing was written")));
                }
                if (!force && !incoming.partial.contains("singer_state")) {
                  return Step::Fail(absl::InvalidArgumentError(absl::StrCat(
                      "merge: the state of \"", PrintableId(src), "\" has no top-level \"singer_state\" "
                      "key, which Meltano's states have; nothing was written. Pass force to merge it as it is")));
                }
                return UnderIdLock(s, dst, [&s, incoming](StoreSteps::Finish finish) {
                  return ReadMergeWrite(s, incoming, finish);
                });
              },
              StoreSteps::Failed);
        },
        StoreSteps::Failed);
  });
}

std::unique_ptr<Task> Store::Delete(std::string state_id) {
  if (absl::Status st = ValidateStateId(state_id); !st.ok()) return Invalid(st);
  return MakeTask(this, [state_id](StoreSteps& s) {
    return s.Connected(
        [&s, state_id] {
          return UnderIdLock(s, state_id, [&s, state_id](StoreSteps::Finish finish) {
            return s.DeleteState(state_id, [&s, finish] { return finish(s.Base()); }, finish);
          });
        },
        StoreSteps::Failed);
  });
}

std::unique_ptr<Task> Store::List(std::optional<std::string> glob) {
  return MakeTask(this, [glob](StoreSteps& s) {
    return s.Connected(
        [&s, glob] {
          return s.Query(
              s.st().ListStateIds(glob), "listing state ids", 2,
              [&s](const Rows& rows) {
                Result r = s.Base();
                for (const Row& row : rows) r.state_ids.push_back(row[0].value_or(""));
                return Step::Done(std::move(r));
              },
              [&s](absl::Status st) {
                if (st.code() == absl::StatusCode::kNotFound) return Step::Done(s.Base());
                return Step::Fail(std::move(st));
              });
        },
        StoreSteps::Failed);
  });
}

std::unique_ptr<Task> Store::ExportPage(std::optional<std::string> glob, std::optional<std::string> after,
                                        int64_t limit) {
  if (limit < 1) return Invalid(absl::InvalidArgumentError("an export page holds at least one state"));
  if (after) {
    if (absl::Status st = ValidateStateId(*after); !st.ok()) return Invalid(st);
  }
  // What continues is looked at when the task starts (see RenewLock).
  return MakeTask(this, [this, glob, after, limit](StoreSteps& s) {
    return s.Connected(
        [this, &s, glob, after, limit] {
          if (export_ && after && export_->after == after && export_->glob == glob) return s.ExportRange(after, limit);
          export_ = ExportCursor{glob, after};
          return s.ExportSample(after, limit);
        },
        StoreSteps::Failed);
  });
}

std::unique_ptr<Task> Store::Import(std::vector<MeltanoState> states) {
  std::map<std::string, size_t> seen;
  for (size_t i = 0; i < states.size(); ++i) {
    const std::string& id = states[i].state_id;
    if (absl::Status st = ValidateStateId(id); !st.ok()) {
      return Invalid(absl::InvalidArgumentError(
          absl::StrCat("import entry ", i + 1, " of ", states.size(), ": ", st.message(), "; nothing was written")));
    }
    auto [it, fresh] = seen.emplace(id, i);
    if (!fresh) {
      return Invalid(absl::InvalidArgumentError(absl::StrCat(
          "import entries ", it->second + 1, " and ", i + 1, " have the same state id ",
          "\"", PrintableId(id), "\"; keep one of them (nothing was written)")));
    }
  }
  auto all = std::make_shared<const std::vector<MeltanoState>>(std::move(states));
  return MakeTask(this, [all](StoreSteps& s) {
    return s.Connected([&s, all] { return s.WriteBatches(all, 0, false); }, StoreSteps::Failed);
  });
}

std::unique_ptr<Task> Store::ClearAll() {
  return MakeTask(this, [](StoreSteps& s) {
    return s.Connected(
        [&s] {
          return s.Query(
              s.st().CountStates(), "counting states", 2,
              [&s](const Rows& rows) {
                int64_t count = 0;
                if (rows.empty() || !rows[0][0] || !absl::SimpleAtoi(*rows[0][0], &count)) {
                  return Step::Fail(absl::DataLossError("unexpected answer counting states"));
                }
                return s.QuorumWrite(
                    s.st().ClearStates(), "clearing all states",
                    s.inputs().now_ms + s.st().cluster().quorum_busy_ms, 5,
                    [&s, count] {
                      Result r = s.Base();
                      r.count = count;
                      return Step::Done(std::move(r));
                    },
                    StoreSteps::Failed);
              },
              [&s](absl::Status st) {
                if (st.code() == absl::StatusCode::kNotFound) return Step::Done(s.Base());
                return Step::Fail(std::move(st));
              });
        },
        StoreSteps::Failed);
  });
}

namespace {

// Reads `src` and writes it to `dst` under dst's lock; `after` gets the outcome.
Step CopySteps(StoreSteps& s, const std::string& src, const std::string& dst, const char* verb,
               StoreSteps::Finish after) {
  return s.ReadState(
      src,
      [&s, src, dst, verb, after](std::optional<MeltanoState> state) -> Step {
        if (!state) {
          return Step::Fail(absl::NotFoundError(
              absl::StrCat("state id \"", PrintableId(src), "\" has no state to ", verb)));
        }
        MeltanoState copy = *state;
        copy.state_id = dst;
        return s.WithLock(
            dst,
            [&s, copy](StoreSteps::Finish finish) {
              return s.WriteState(copy, [&s, finish] { return finish(s.Base()); }, finish);
            },
            after);
      },
      StoreSteps::Failed);
}

}  // namespace

std::unique_ptr<Task> Store::Copy(std::string src, std::string dst) {
  if (absl::Status st = ValidateStateId(src); !st.ok()) return Invalid(st);
  if (absl::Status st = ValidateStateId(dst); !st.ok()) return Invalid(st);
  return MakeTask(this, [src, dst](StoreSteps& s) {
    return s.Connected([&s, src, dst] { return CopySteps(s, src, dst, "copy", StoreSteps::Terminal); },
                       StoreSteps::Failed);
  });
}

std::unique_ptr<Task> Store::Move(std::string src, std::string dst) {
  if (absl::Status st = ValidateStateId(src); !st.ok()) return Invalid(st);
  if (absl::Status st = ValidateStateId(dst); !st.ok()) return Invalid(st);
  if (src == dst) {
    return Invalid(absl::InvalidArgumentError("move needs two different state ids: source and destination are equal"));
  }
  return MakeTask(this, [src, dst](StoreSteps& s) {
    return s.Connected(
        [&s, src, dst] {
          // The copy is written (and its lock released) before the source is
          // deleted under its own lock: a failure in between leaves both
          // states, never neither.
          return CopySteps(s, src, dst, "move", [&s, src](absl::StatusOr<Result> copied) -> Step {
            if (!copied.ok()) return Step::Fail(copied.status());
            return s.WithLock(src, [&s, src](StoreSteps::Finish finish) {
              return s.DeleteState(src, [&s, finish] { return finish(s.Base()); }, finish);
            });
          });
        },
        StoreSteps::Failed);
  });
}

std::unique_ptr<Task> Store::AcquireLock(std::string state_id) {
  if (absl::Status st = ValidateStateId(state_id); !st.ok()) return Invalid(st);
  return MakeTask(this, [this, state_id](StoreSteps& s) {
    const int64_t started_ms = s.inputs().now_ms;
    if (auto it = held_.find(state_id); it != held_.end() && !it->second.lingering && it->second.Live()) {
      // Waiting for a lock this store holds would wait for itself.
      return Step::Fail(absl::FailedPreconditionError(absl::StrCat(
          "this store already holds the lock on state id \"", PrintableId(state_id),
          "\": lock scopes on one id do not nest (writes inside the scope already run under it)")));
    }
    if (auto it = held_.find(state_id); it != held_.end() && it->second.lingering) {
      // Lingering since its last release and still within its lease (the
      // task's start forgot it otherwise): taken back, no request.
      it->second.lingering = false;
      Result r = s.Base();
      r.lock_id = it->second.machine->lock_id();
      r.waited_ms = 0;
      return Step::Done(std::move(r));
    }
    return s.Connected(
        [this, &s, state_id, started_ms] {
          return s.Acquire(
              state_id,
              [this, &s, state_id, started_ms](std::shared_ptr<LockMachine> m) {
                // The machine's renewal timer, armed as it became the holder.
                int64_t renew_in_ms = options_.lock.stale_ms / 3;
                while (std::optional<LockAction> a = m->Poll()) {
                  if (a->kind == LockAction::Kind::kArmTimer) renew_in_ms = a->delay_ms;
                }
                HeldLock held{m, s.inputs().now_ms + renew_in_ms};
                held.waiters_checked_ms = s.inputs().now_ms;
                held_[state_id] = held;
                Result r = s.Base();
                r.lock_id = m->lock_id();
                r.waited_ms = s.inputs().now_ms - started_ms;
                return Step::Done(std::move(r));
              },
              StoreSteps::Failed);
        },
        StoreSteps::Failed);
  });
}

std::unique_ptr<Task> Store::RenewLock(std::string state_id) {
  // What the store holds is looked at when the task starts, not when it is
  // built: a host may queue tasks (core/connection.h) and the ones before
  // this may take or release locks.
  return MakeTask(this, [this, state_id](StoreSteps& s) {
    auto it = held_.find(state_id);
    if (it == held_.end()) {
      return Step::Fail(absl::FailedPreconditionError(absl::StrCat(
          "cannot renew the lock on state id \"", PrintableId(state_id), "\": this store does not hold it")));
    }
    std::string lock_id = it->second.machine->lock_id();
    return s.Renew(
        state_id,
        [&s, lock_id] {
          Result r = s.Base();
          r.lock_id = lock_id;
          return Step::Done(std::move(r));
        },
        StoreSteps::Failed, StoreSteps::Failed);
  });
}

std::unique_ptr<Task> Store::Tick() {
  return MakeTask(this, [](StoreSteps& s) {
    return s.RenewAllDue([&s] { return s.ReleaseIdleLingering([&s] { return Step::Done(s.Base()); }); },
                         StoreSteps::Failed);
  });
}

std::unique_ptr<Task> Store::ReleaseLingering() {
  return MakeTask(this, [this](StoreSteps& s) {
    auto count = std::make_shared<int64_t>(0);
    // The loop holds itself weakly: only the step waiting on a request owns
    // it, so a task abandoned (or destroyed) mid-release frees it.
    auto next = std::make_shared<std::function<Step()>>();
    *next = [this, &s, count, weak = std::weak_ptr<std::function<Step()>>(next)]() -> Step {
      std::shared_ptr<std::function<Step()>> self = weak.lock();
      for (const auto& [id, held] : held_) {
        if (held.lingering) {
          ++*count;
          return s.ReleaseLingeringLock(id, [self] { return (*self)(); });
        }
      }
      Result r = s.Base();
      r.count = *count;
      return Step::Done(std::move(r));
    };
    return (*next)();
  });
}

std::unique_ptr<Task> Store::Close() {
  return MakeTask(this, [this](StoreSteps& s) {
    auto count = std::make_shared<int64_t>(0);
    // Held weakly by itself, as in ReleaseLingering.
    auto next = std::make_shared<std::function<Step()>>();
    *next = [this, &s, count, weak = std::weak_ptr<std::function<Step()>>(next)]() -> Step {
      std::shared_ptr<std::function<Step()>> self = weak.lock();
      for (auto it = held_.begin(); it != held_.end(); ++it) {
        const std::string id = it->first;
        if (!it->second.Live()) {
          held_.erase(it);  // lost: not ours to drop
          return (*self)();
        }
        ++*count;
        // Best effort: a failed release is forgotten; the lock then expires.
        return s.ReleaseAndForget(id, it->second.machine, [self] { return (*self)(); },
                                  [self](absl::Status) { return (*self)(); });
      }
      Result r = s.Base();
      r.count = *count;
      return Step::Done(std::move(r));
    };
    return (*next)();
  });
}

std::optional<int64_t> Store::NextTimeoutMs() const {
  std::optional<int64_t> next;
  for (const auto& [id, held] : held_) {
    // A renewal left waiting by an abandoned task is due at once (the next
    // task settles it; see SettleAbandonedRenewals).
    if (held.Live() || held.AbandonedRenewal()) {
      if (!next || held.renew_at_ms < *next) next = held.renew_at_ms;
    }
    if (held.lingering) {
      const int64_t at = std::min(held.linger_until_ms, held.waiters_checked_ms + WaiterCheckEveryMs());
      if (!next || at < *next) next = at;
    }
  }
  return next;
}

std::unique_ptr<Task> Store::ReleaseLock(std::string state_id, std::string lock_id) {
  if (absl::Status st = ValidateStateId(state_id); !st.ok()) return Invalid(st);
  // Looked up when the task starts (see RenewLock).
  return MakeTask(this, [this, state_id, lock_id](StoreSteps& s) {
    auto it = held_.find(state_id);
    if (it == held_.end() || it->second.machine->lock_id() != lock_id) {
      // Releasing needs the machine that acquired: only the holder can release.
      return Step::Fail(absl::FailedPreconditionError(
          absl::StrCat("cannot release the lock on state id \"", PrintableId(state_id),
                       "\": this store does not hold it with that lock id (only the process that acquired a lock "
                       "releases it)")));
    }
    std::shared_ptr<LockMachine> m = it->second.machine;
    if (m->state() != LockState::kHeld) {
      // Lost earlier (a renewal found another holder or the lease ran out):
      // it is not ours to drop, so forgetting it is the whole release; but
      // the scope it guarded was not exclusive, which its user must hear.
      held_.erase(it);
      return Step::Fail(absl::AbortedError(absl::StrCat(
          "the lock on state id \"", PrintableId(state_id), "\" was lost while held (its lease of ",
          options_.lock.stale_ms / 1000.0, " s, lock_timeout_seconds, could not be renewed in time, and another "
          "process may have taken it): what was done under it was not exclusive. Check the work, then run it "
          "again")));
    }
    if (it->second.lingering) return Step::Done(s.Base());  // released already; lingering
    auto release = [&s, state_id, m] {
      return s.ReleaseAndForget(state_id, m, [&s] { return Step::Done(s.Base()); }, StoreSteps::Failed);
    };
    if (!Lingers() || !m->LeaseValid(s.inputs().now_ms)) return release();
    const int64_t now = s.inputs().now_ms;
    auto linger = [this, &s, state_id, m](int64_t checked_ms) {
      auto held = held_.find(state_id);
      if (held != held_.end() && held->second.machine == m && m->state() == LockState::kHeld) {
        held->second.lingering = true;
        held->second.linger_until_ms = s.inputs().now_ms + kDefaultLockLingerMs;
        held->second.waiters_checked_ms = checked_ms;
      }
      return Step::Done(s.Base());
    };
    if (now - it->second.waiters_checked_ms < WaiterCheckEveryMs()) return linger(it->second.waiters_checked_ms);
    // Time to look whether another process waits: if one does, the lock is
    // released for real.
    return s.LookForWaiters(state_id, [linger, now] { return linger(now); }, release);
  });
}

}  // namespace chstate
