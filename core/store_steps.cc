// The parts every store operation is built from (store_steps.h): the
// server's version, the schema, reading and writing one state, quorum
// writes, waiting for mutations, an operation under an id's lock, and one
// statement run for its success.
#include "core/store.h"

#include <algorithm>
#include <optional>
#include <tuple>
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

namespace part {
namespace {

// Asks the server's version once per store and picks the dialect; in
// cluster mode, checks that the state table is replicated.
// Cluster mode: a state table made earlier without cluster mode is a plain
// table on one server; writing to it would silently skip replication.
Next CheckReplicated(StoreSteps& s, const Reply& r) {
  absl::StatusOr<Rows> rows = s.AnswerRows(r, "checking the state table's engine", 2);
  if (!rows.ok()) return Next::Fail(rows.status());
  const StoreOptions& o = s.options();
  std::string engine = rows->empty() ? "" : (*rows)[0][0].value_or("");
  if (!rows->empty() && (*rows)[0][1].value_or("") == "0") {
    s.statements_slot().reset();  // ask again next time
    return Next::Fail(absl::InvalidArgumentError(absl::StrCat(
        "the servers know no cluster \"", o.cluster.name,
        "\": set the cluster setting to a name from their remote_servers (SELECT DISTINCT cluster FROM "
        "system.clusters)")));
  }
  if (engine.empty() || engine.rfind("Replicated", 0) == 0) return Next::Done();
  s.statements_slot().reset();  // ask again next time
  return Next::Fail(absl::FailedPreconditionError(absl::StrCat(
      "cluster mode is on (cluster \"", o.cluster.name, "\") but the state table ", o.schema, ".", o.table,
      " on this server is a ", engine,
      ", not replicated: writes would stay on this server. Use another schema for cluster mode, or move "
      "the states into a replicated table (docs/cluster.md)")));
}

}  // namespace

namespace {
struct ConnectSteps {
  StoreSteps& s;
  bool force;
  Next Ask(const Reply&) {
    if (s.statements_slot() && !force) return Next::Done();
    return Next::Send(Statements::SelectVersion());
  }
  Next Choose(const Reply& r) {
    absl::StatusOr<Rows> rows = s.AnswerRows(r, "connecting", 2);
    if (!rows.ok()) return Next::Fail(rows.status());
    if (rows->empty() || !(*rows)[0][0]) {
      return Next::Fail(absl::DataLossError("ClickHouse sent no version for SELECT version()"));
    }
    absl::StatusOr<ServerVersion> v = ParseServerVersion(*(*rows)[0][0]);
    if (!v.ok()) return Next::Fail(v.status());
    absl::StatusOr<Dialect> d = DialectFor(*v);
    if (!d.ok()) return Next::Fail(d.status());
    const StoreOptions& o = s.options();
    absl::StatusOr<Statements> st = Statements::Create(*d, o.schema, o.table, o.cluster);
    if (!st.ok()) return Next::Fail(st.status());
    s.statements_slot() = std::move(*st);
    s.set_server_version(v->text);
    if (!o.cluster.enabled()) return Next::Done();
    return Next::Send(s.st().StateTableEngine());
  }
  Next Check(const Reply& r) { return CheckReplicated(s, r); }
  std::string Where(size_t step) const { return step == 1 ? "checking the state table" : "connecting"; }
};
}  // namespace

std::unique_ptr<Op> Connect(StoreSteps& s, bool force) {
  return Steps<ConnectSteps>({&ConnectSteps::Ask, &ConnectSteps::Choose, &ConnectSteps::Check}, s, force);
}

namespace {

// The schema, each statement in turn: the database, the state, lock (and in
// cluster mode claims) tables, and with history on the history table and
// the view that feeds it. CREATE ... IF NOT EXISTS each; in cluster mode
// code 159 (a host did not run the ON CLUSTER DDL in time: it is down)
// means the live hosts ran it and the others will when they are back, so
// the schema is there for the quorum.
class EnsureSchemaOp final : public StorePart {
 public:
  explicit EnsureSchemaOp(StoreSteps& s) : StorePart(s) {
    const Statements& st = s.st();
    ddl_.emplace_back(st.CreateDatabase(), "creating the state database");
    ddl_.emplace_back(st.CreateStateTable(), "creating the state table");
    ddl_.emplace_back(st.CreateLockTable(), "creating the lock table");
    if (st.cluster().enabled()) ddl_.emplace_back(st.CreateClaimsTable(), "creating the lock claims table");
    if (s.options().history_days > 0) {
      ddl_.emplace_back(st.CreateHistoryTable(s.options().history_days), "creating the state history table");
      if (st.HistoryBuffered()) ddl_.emplace_back(st.CreateHistoryBuffer(), "creating the state history buffer");
      ddl_.emplace_back(st.CreateHistoryView(), "creating the state history view");
      // A schema made before the buffer: its view into the table goes, once
      // the buffered one records the writes.
      if (st.HistoryBuffered()) {
        ddl_.emplace_back(st.DropUnbufferedHistoryView(), "dropping the unbuffered state history view");
      }
    }
  }
  std::string Where() const override { return next_ == 0 ? "making the schema" : ddl_[next_ - 1].second; }

  Next Resume(const Reply& r) override {
    if (r.kind == Reply::Kind::kAnswer) {
      absl::StatusOr<std::string> done = s_.Answer(r, ddl_[next_ - 1].second);
      if (!done.ok() && !(s_.st().cluster().enabled() && ClickHouseCode(done.status()) == ch::kTimeoutExceeded)) {
        return Next::Fail(done.status());
      }
    }
    if (next_ == ddl_.size()) return Next::Done();
    return Next::Send(ddl_[next_++].first);
  }

 private:
  std::vector<std::pair<SqlRequest, std::string>> ddl_;
  size_t next_ = 0;
};

// Cluster mode: the newest state row of the replicas' joined answers to
// Statements::GetState (the replica rows left out), by version, then by the
// last block number of its part; nullopt when none has a row. A row that
// does not parse fails the read.
absl::StatusOr<std::optional<Row>> NewestStateRow(const Rows& rows) {
  std::optional<Row> best;
  int64_t best_version = 0, best_block = 0;
  for (const Row& row : rows) {
    if (row[0] && *row[0] == kClaimsReplicaRow) continue;
    int64_t version = 0, block = 0;
    if (!row[2] || !row[3] || !absl::SimpleAtoi(*row[2], &version) || !absl::SimpleAtoi(*row[3], &block)) {
      return absl::DataLossError("a replica answered a state read with a row that has no version or block number");
    }
    if (!best || std::tie(version, block) > std::tie(best_version, best_block)) {
      best = row;
      best_version = version;
      best_block = block;
    }
  }
  return best;
}

// Reads one state into *out; a missing table or database reads as
// "absent" (nullopt). Cluster mode: from enough replicas that one has the
// newest confirmed write (part::ReadEachReplica); `for_write` (the read of
// a read-modify-write under the id's lock) fails when it cannot reach them,
// others take what the replicas reached show.
class ReadStateOp final : public StorePart {
 public:
  ReadStateOp(StoreSteps& s, std::string id, bool for_write, std::optional<MeltanoState>* out)
      : StorePart(s), id_(std::move(id)), for_write_(for_write), out_(out) {}
  std::string Where() const override { return absl::StrCat("reading state \"", PrintableId(id_), "\""); }

  Next Resume(const Reply& r) override {
    if (r.kind == Reply::Kind::kStart) {
      req_ = s_.st().GetState(id_);
      if (!req_.each_replica) return Next::Send(req_);
      return Next::Call(ReadEachReplica(s_, req_, "the state", "a write", !for_write_, &joined_));
    }
    absl::StatusOr<Rows> rows =
        r.kind == Reply::Kind::kPart ? s_.AnswerRows(Reply{Reply::Kind::kAnswer, &joined_, &req_}, "reading state", 7)
                                     : s_.AnswerRows(r, "reading state", 2);
    if (!rows.ok()) {
      if (rows.status().code() != absl::StatusCode::kNotFound) return Next::Fail(rows.status());
      *out_ = std::nullopt;
      return Next::Done();
    }
    std::optional<Row> row = rows->empty() ? std::nullopt : std::optional<Row>((*rows)[0]);
    if (req_.each_replica) {
      absl::StatusOr<std::optional<Row>> newest = NewestStateRow(*rows);
      if (!newest.ok()) return Next::Fail(newest.status());
      row = *std::move(newest);
      if (row && (*row)[1] && *(*row)[1] == kTombstone) row.reset();
    }
    if (!row) {
      *out_ = std::nullopt;
      return Next::Done();
    }
    absl::StatusOr<nlohmann::json> partial = FromColumn((*row)[0], id_, "partial_state");
    if (!partial.ok()) return Next::Fail(partial.status());
    absl::StatusOr<nlohmann::json> completed = FromColumn((*row)[1], id_, "completed_state");
    if (!completed.ok()) return Next::Fail(completed.status());
    MeltanoState state;
    state.state_id = id_;
    state.partial = std::move(*partial);
    state.completed = std::move(*completed);
    *out_ = std::move(state);
    return Next::Done();
  }

 private:
  std::string id_;
  const bool for_write_;
  std::optional<MeltanoState>* out_;
  SqlRequest req_;
  SqlResponse joined_;  // cluster mode: the replicas' answers, joined
};

// Cluster mode: a write that must reach the quorum. Code 286 (another
// quorum write to the table is in flight, or the previous one has not
// reached its quorum yet) and 252 wrote nothing, so the write is sent again
// until the deadline, after a short wait that doubles up to 100 ms with a
// little jitter; while it waits, the lock it writes under is renewed
// whenever its lease ends within a third of the stale window. Code 319
// (the quorum not confirmed in time: the row is on the replica that
// answered and may still land) is an
// unknown outcome, like a lost answer: a write that replaces itself
// (idempotent) is sent again, to another replica (the task marks that one
// down), and the 286 it meets there while the first row's quorum is pending
// is waited out for quorum_busy_ms from the 319, which itself took the
// quorum timeout. A second 319, or a write that is not idempotent, fails
// with the outcome explained. Without cluster mode: one send.
class QuorumWriteOp final : public StorePart {
 public:
  QuorumWriteOp(StoreSteps& s, SqlRequest req, std::string what, int64_t deadline_ms, int64_t wait_ms)
      : StorePart(s), req_(std::move(req)), what_(std::move(what)), deadline_ms_(deadline_ms), wait_ms_(wait_ms) {}
  std::string Where() const override {
    switch (stage_) {
      case Stage::kRenewing: return absl::StrCat(what_, " (renewing the lock to wait out ", cause_, ")");
      case Stage::kWaiting: return absl::StrCat(what_, " (waiting out ", cause_, ")");
      default: return what_;
    }
  }

  Next Resume(const Reply& r) override {
    switch (stage_) {
      case Stage::kSend:
        stage_ = Stage::kSent;
        return Next::Send(req_);
      case Stage::kSent:
        return Answered(r);
      case Stage::kRenewing: {
        // Nothing was written, so the lock is still ours to renew: it is
        // renewed now and the wait goes on within the lease that gives. A
        // renewal that fails, finds the lock lost, or gives no lease long
        // enough ends the write as a lease that ran out.
        if (!r.status.ok()) {
          const absl::Status ran_out = s_.LeaseRanOut(what_, cause_, false);
          return Next::Fail(StoreSteps::Reworded(
              ran_out, ran_out.code(),
              absl::StrCat(ran_out.message(), ". Renewing the lock to wait longer failed: ", r.status.message())));
        }
        if (const LockMachine* lock = s_.LockOf(s_.lease_id())) req_.send_before_ms = lock->lease_deadline_ms();
        if (PastSendBefore(req_, s_.inputs().now_ms + wait_ms_)) {
          return Next::Fail(s_.LeaseRanOut(what_, cause_, false));
        }
        stage_ = Stage::kWaiting;
        return Next::Wait(TimerKind::kQuorumBusy, wait_ms_);
      }
      case Stage::kWaiting:
        wait_ms_ = std::min<int64_t>(wait_ms_ * 2, 100);
        stage_ = Stage::kSent;
        return Next::Send(req_);
    }
    return Next::Fail(absl::InternalError("quorum write: no such stage"));
  }

 private:
  Next Answered(const Reply& r) {
    absl::StatusOr<std::string> body = s_.Answer(r, what_);
    if (body.ok()) return Next::Done();
    absl::Status st = body.status();
    std::optional<int> code = ClickHouseCode(st);
    if (!s_.options().cluster.enabled() || !code) return Next::Fail(std::move(st));
    const Inputs& in = s_.inputs();
    const bool unknown_outcome = *code == ch::kUnknownStatusOfInsert && req_.idempotent && !unknown_;
    if (unknown_outcome) {
      unknown_ = st;
      deadline_ms_ = std::max(deadline_ms_, in.now_ms + s_.options().cluster.quorum_busy_ms);
    }
    if ((*code == ch::kUnsatisfiedQuorumForPreviousWrite || *code == ch::kTooManyParts || unknown_outcome) &&
        in.now_ms < deadline_ms_) {
      // A little jitter from the fresh random bytes keeps two writers
      // from retrying in lockstep.
      const int64_t jitter = in.random.empty() ? 0 : static_cast<unsigned char>(in.random[0]) % 8;
      cause_ = *code == ch::kTooManyParts ? "code 252 (too many parts: the table merges slower than it is written)"
               : unknown_outcome ? "code 319 (the write's quorum was not confirmed in time: sent again elsewhere)"
                                 : "code 286 (an earlier quorum write to the table is not confirmed yet)";
      wait_ms_ += jitter;
      s_.Tell(DiagnosticKind::kQuorumBusy, DiagnosticLevel::kInfo, s_.lease_id(),
              absl::StrCat(what_, " waits ", wait_ms_, " ms for ", cause_, "; it is sent again until ",
                           deadline_ms_ - in.now_ms, " ms from now"),
              {{"wait_ms", wait_ms_}, {"left_ms", deadline_ms_ - in.now_ms}}, {{"code", std::to_string(*code)}});
      // Under a lock, sent again only within its lease, which is renewed
      // on the lock's own cadence (a third of the stale window) while the
      // write waits: this task holds the store, so its periodic renewal
      // waits too, and a lease left until its last moment is past by the
      // time a refusal that took a while comes back.
      if (PastSendBefore(req_, in.now_ms + wait_ms_ + s_.options().lock.stale_ms / 3)) {
        stage_ = Stage::kRenewing;
        return Next::Try(s_.RenewForWaitPart(s_.lease_id()));
      }
      stage_ = Stage::kWaiting;
      const int64_t wait = wait_ms_;
      wait_ms_ -= jitter;  // the next wait doubles the one without jitter
      return Next::Wait(TimerKind::kQuorumBusy, wait);
    }
    if (unknown_) {
      // The first write's outcome is what the caller must know about.
      absl::Status first = s_.ExplainQuorumError(*unknown_, ch::kUnknownStatusOfInsert);
      return Next::Fail(StoreSteps::Reworded(
          first, first.code(),
          absl::StrCat(first.message(), ". It was sent again for ", s_.options().cluster.quorum_busy_ms,
                       " ms (quorum_busy_ms); the last answer: ", st.message())));
    }
    return Next::Fail(s_.ExplainQuorumError(std::move(st), *code));
  }

  enum class Stage { kSend, kSent, kRenewing, kWaiting };
  Stage stage_ = Stage::kSend;
  SqlRequest req_;
  std::string what_;
  int64_t deadline_ms_;
  int64_t wait_ms_;
  std::string cause_;
  std::optional<absl::Status> unknown_;  // the 319 a resend followed
};

// Writes a whole state row, under the id's lock when the task or the store
// holds it, creating the schema once if it is missing; then keeps the id's
// history in bounds (HistoryUpkeep).
class WriteStateOp final : public StorePart {
 public:
  WriteStateOp(StoreSteps& s, MeltanoState state) : StorePart(s), state_(std::move(state)) {}
  std::string Where() const override {
    switch (stage_) {
      case Stage::kSchema: return "making the schema for the first write";
      case Stage::kUpkeep: return "keeping the history in bounds";
      case Stage::kFencedOut: return "finding out the lock a refused write was fenced on";
      default: return absl::StrCat("writing state \"", PrintableId(state_.state_id), "\"");
    }
  }

  Next Resume(const Reply& r) override {
    switch (stage_) {
      case Stage::kWrite: {
        if (absl::Status lease = s_.LeaseCheck(state_.state_id); !lease.ok()) return Next::Fail(lease);
        absl::StatusOr<std::string> token = s_.Token();
        if (!token.ok()) return Next::Fail(token.status());
        const LockMachine* lock = s_.LockOf(state_.state_id);
        fence_ = lock != nullptr ? lock->lock_id() : "";
        SqlRequest req = s_.UnderLease(s_.st().InsertState(state_.state_id, ToColumn(state_.partial),
                                                           ToColumn(state_.completed), *token, fence_),
                                       state_.state_id);
        stage_ = Stage::kWritten;
        return Next::Try(std::make_unique<QuorumWriteOp>(
            s_, std::move(req), "writing state", s_.inputs().now_ms + s_.options().cluster.quorum_busy_ms, 5));
      }
      case Stage::kWritten:
        if (r.status.ok()) {
          stage_ = Stage::kUpkeep;
          return Next::Call(s_.HistoryUpkeepPart(state_.state_id));
        }
        if (FencedOut(r.status)) {
          // The lock is not ours: a renewal finds that out for the lock
          // machine (taken over, or its table missing), so that the id's
          // later writes are refused before they are sent, a lingering
          // lock is not reused, and the scope's release says it was lost.
          stage_ = Stage::kFencedOut;
          fenced_ = absl::AbortedError(absl::StrCat(
              "the lock on state id \"", PrintableId(state_.state_id),
              "\" was not this process's any more when its write ran on the server (the write arrived after the "
              "lock's release or a takeover, or the lock was removed by hand): nothing was written. Release the "
              "lock and start again"));
          return Next::Try(s_.RenewForWaitPart(state_.state_id));
        }
        if (r.status.code() != absl::StatusCode::kNotFound || schema_made_) return Next::Fail(r.status);
        stage_ = Stage::kSchema;
        return Next::Call(std::make_unique<EnsureSchemaOp>(s_));
      case Stage::kSchema:
        schema_made_ = true;
        stage_ = Stage::kWrite;
        return Resume(r);
      case Stage::kUpkeep:
        return Next::Done();
      case Stage::kFencedOut:
        return Next::Fail(fenced_);
    }
    return Next::Fail(absl::InternalError("write state: no such stage"));
  }

 private:
  // A fenced write the server refused: its lock table held another lock
  // (code 395 from throwIf) or none (code 60 naming the lock table; the
  // state table's own name is a prefix of it, so the lock's is looked for).
  bool FencedOut(const absl::Status& st) const {
    if (fence_.empty() || s_.st().cluster().enabled()) return false;
    const std::optional<int> code = ClickHouseCode(st);
    if (code == ch::kThrowIfValueIsNonZero) return true;
    return code == ch::kUnknownTable && absl::StrContains(st.message(), s_.st().LockTableName(state_.state_id));
  }

  enum class Stage { kWrite, kWritten, kSchema, kUpkeep, kFencedOut };
  Stage stage_ = Stage::kWrite;
  MeltanoState state_;
  std::string fence_;  // the lock id the write was fenced on, if any
  absl::Status fenced_;
  bool schema_made_ = false;
};

// 18.x: ALTER ... DELETE returns before rows are gone; polls until done,
// waiting 5 ms, then twice as long each time up to 200 ms.
class AwaitMutationsOp final : public StorePart {
 public:
  AwaitMutationsOp(StoreSteps& s, int64_t deadline_ms) : StorePart(s), deadline_ms_(deadline_ms) {}
  std::string Where() const override { return "waiting for the delete to finish"; }

  Next Resume(const Reply& r) override {
    switch (r.kind) {
      case Reply::Kind::kStart:
        return Next::Send(s_.st().PendingMutations());
      case Reply::Kind::kTimer:
        wait_ms_ = std::min<int64_t>(wait_ms_ * 2, 200);
        return Next::Send(s_.st().PendingMutations());
      default:
        break;
    }
    absl::StatusOr<Rows> rows = s_.AnswerRows(r, "waiting for the delete to finish", 2);
    if (!rows.ok()) return Next::Fail(rows.status());
    int64_t pending = 0;
    if (rows->empty() || !(*rows)[0][0] || !absl::SimpleAtoi(*(*rows)[0][0], &pending)) {
      return Next::Fail(absl::DataLossError("unexpected answer counting pending mutations"));
    }
    if (pending == 0) return Next::Done();
    if (s_.inputs().now_ms >= deadline_ms_) {
      return Next::Fail(absl::DeadlineExceededError(
          absl::StrCat("the delete was accepted but its mutation is still running after ",
                       s_.options().mutation_timeout_ms / 1000,
                       " s; check system.mutations on the server (it will finish there)")));
    }
    return Next::Wait(TimerKind::kMutationPoll, wait_ms_);
  }

 private:
  int64_t deadline_ms_;
  int64_t wait_ms_ = 5;
};

// Removes the id's state under its lock (as WriteState); a missing table
// is nothing to delete. Cluster mode: a quorum write; else on 18.x the
// mutation is waited for.
class DeleteStateOp final : public StorePart {
 public:
  DeleteStateOp(StoreSteps& s, std::string id) : StorePart(s), id_(std::move(id)) {}
  std::string Where() const override { return absl::StrCat("deleting state \"", PrintableId(id_), "\""); }

  Next Resume(const Reply& r) override {
    switch (stage_) {
      case Stage::kStart: {
        if (absl::Status lease = s_.LeaseCheck(id_); !lease.ok()) return Next::Fail(lease);
        SqlRequest req = s_.UnderLease(s_.st().DeleteState(id_), id_);
        if (s_.st().cluster().enabled()) {
          stage_ = Stage::kQuorumDeleted;
          return Next::Try(std::make_unique<QuorumWriteOp>(
              s_, std::move(req), "deleting state", s_.inputs().now_ms + s_.options().cluster.quorum_busy_ms, 5));
        }
        stage_ = Stage::kDeleted;
        return Next::Send(std::move(req));
      }
      case Stage::kQuorumDeleted:
        if (r.status.ok() || r.status.code() == absl::StatusCode::kNotFound) return Next::Done();
        return Next::Fail(r.status);
      case Stage::kDeleted: {
        absl::StatusOr<std::string> done = s_.Answer(r, "deleting state");
        if (!done.ok()) {
          if (done.status().code() == absl::StatusCode::kNotFound) return Next::Done();  // no table: nothing to delete
          return Next::Fail(done.status());
        }
        if (s_.st().dialect() == Dialect::kModern) return Next::Done();
        stage_ = Stage::kMutation;
        return Next::Call(
            std::make_unique<AwaitMutationsOp>(s_, s_.inputs().now_ms + s_.options().mutation_timeout_ms));
      }
      case Stage::kMutation:
        return Next::Done();
    }
    return Next::Fail(absl::InternalError("delete state: no such stage"));
  }

 private:
  enum class Stage { kStart, kQuorumDeleted, kDeleted, kMutation };
  Stage stage_ = Stage::kStart;
  std::string id_;
};

}  // namespace

// Runs `body` under the lock for `id`, taken for it and released on every
// exit path. Ends with the body's result; the body's error matters more
// than a failed release.
namespace {
struct LockedSteps {
  StoreSteps& s;
  std::string id;
  std::unique_ptr<Op> body;
  int64_t started_ms = 0;
  StoreSteps::LockPtr lock;
  bool waited = false;  // for another process
  absl::Status outcome;
  std::shared_ptr<Result> result;
  Next Acquire(const Reply&) {
    started_ms = s.inputs().now_ms;
    return Next::Call(part::Acquire(s, id, &lock, &waited));
  }
  Next Body(const Reply&) {
    s.TellAcquired(*lock, s.inputs().now_ms - started_ms, waited);
    s.set_current_lock(lock);
    return Next::Try(std::move(body));
  }
  Next Release(const Reply& r) {
    s.set_current_lock(nullptr);
    outcome = r.status;
    result = r.result;
    return Next::Try(part::Release(s, lock));
  }
  Next Done(const Reply& r) {
    if (!outcome.ok()) return Next::Fail(outcome);
    if (!r.status.ok()) return Next::Fail(r.status);
    return result ? Next::Done(*result) : Next::Done();
  }
  std::string Where(size_t step) const {
    const char* doing = step == 0 ? "taking" : step == 1 ? "under" : "releasing";
    return absl::StrCat(doing, " the lock on \"", PrintableId(id), "\"");
  }
};
}  // namespace

std::unique_ptr<Op> Locked(StoreSteps& s, std::string id, std::unique_ptr<Op> body) {
  using L = LockedSteps;
  return Steps<L>({&L::Acquire, &L::Body, &L::Release, &L::Done}, s, std::move(id), std::move(body));
}

namespace {

// Runs one statement for its success alone.
class SqlOp final : public StorePart {
 public:
  SqlOp(StoreSteps& s, SqlRequest req, std::string what) : StorePart(s), req_(std::move(req)), what_(std::move(what)) {}
  std::string Where() const override { return what_; }
  Next Resume(const Reply& r) override {
    if (r.kind == Reply::Kind::kStart) return Next::Send(req_);
    absl::StatusOr<std::string> done = s_.Answer(r, what_);
    return done.ok() ? Next::Done() : Next::Fail(done.status());
  }

 private:
  SqlRequest req_;
  std::string what_;
};

}  // namespace

std::unique_ptr<Op> EnsureSchema(StoreSteps& s) { return std::make_unique<EnsureSchemaOp>(s); }
std::unique_ptr<Op> ReadState(StoreSteps& s, std::string id, std::optional<MeltanoState>* out, bool for_write) {
  return std::make_unique<ReadStateOp>(s, std::move(id), for_write, out);
}
std::unique_ptr<Op> WriteState(StoreSteps& s, MeltanoState state) {
  return std::make_unique<WriteStateOp>(s, std::move(state));
}
std::unique_ptr<Op> QuorumWrite(StoreSteps& s, SqlRequest req, std::string what, int64_t deadline_ms, int64_t wait_ms) {
  return std::make_unique<QuorumWriteOp>(s, std::move(req), std::move(what), deadline_ms, wait_ms);
}
std::unique_ptr<Op> DeleteState(StoreSteps& s, std::string id) { return std::make_unique<DeleteStateOp>(s, std::move(id)); }
}  // namespace part

std::unique_ptr<Op> StoreSteps::SqlPart(SqlRequest req, std::string what) {
  return std::make_unique<part::SqlOp>(*this, std::move(req), std::move(what));
}

}  // namespace chstate
