// StoreSteps (core/store_steps.h): what one task of a store works with.
// The task that runs an operation (MakeOpTask), the wording of answers and
// their failures (cluster trouble, quorum codes), leases (which lock a write
// acts under, and the check before it), diagnostics, and the Result every
// operation starts from.
#include "core/store.h"

#include <algorithm>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "core/clickhouse_errors.h"
#include "core/lock_machine.h"
#include "core/quoting.h"
#include "core/response.h"
#include "core/store_steps.h"

namespace chstate {

namespace {

// The root of a store task: when the task starts, it settles what earlier
// tasks left behind (abandoned renewals, stale lingering locks), then runs
// the operation, and ends as it ends. Invisible in Where.
class StoreTaskOp final : public Op {
 public:
  StoreTaskOp(StoreSteps* s, std::unique_ptr<Op> op) : s_(s), op_(std::move(op)) {}
  std::string Where() const override { return ""; }

  Next Resume(const Reply& r) override {
    // Moved, not copied: an export page holds its document and thousands of ids.
    if (r.kind != Reply::Kind::kStart) return r.result ? Next::Done(std::move(*r.result)) : Next::Done(Result{});
    s_->SettleAbandonedRenewals();
    s_->ForgetStaleLingering();
    return Next::Call(std::move(op_));
  }

 private:
  StoreSteps* s_;
  std::unique_ptr<Op> op_;
};

}  // namespace

std::unique_ptr<Task> MakeOpTask(Store* store, absl::FunctionRef<std::unique_ptr<Op>(StoreSteps&)> make) {
  auto task = std::make_unique<Task>(store->options().transport);
  auto steps = std::make_shared<StoreSteps>(store, task->inputs());
  StoreSteps* s = steps.get();
  task->Run(std::move(steps), std::make_unique<StoreTaskOp>(s, make(*s)));
  return task;
}

namespace {

// An operation refused before it starts (bad arguments).
class FailOp final : public Op {
 public:
  explicit FailOp(absl::Status status) : status_(std::move(status)) {}
  std::string Where() const override { return ""; }
  Next Resume(const Reply&) override { return Next::Fail(status_); }

 private:
  absl::Status status_;
};

}  // namespace

std::unique_ptr<Task> Invalid(absl::Status status) {
  auto task = std::make_unique<Task>();
  task->Run(nullptr, std::make_unique<FailOp>(std::move(status)));
  return task;
}

void StoreSteps::Tell(DiagnosticKind kind, DiagnosticLevel level, const std::string& state_id, std::string message,
                      std::vector<std::pair<std::string, int64_t>> numbers,
                      std::vector<std::pair<std::string, std::string>> texts) {
  if (!s_->diagnostics_.Wants(level)) return;
  Diagnostic d;
  d.kind = kind;
  d.level = level;
  d.at_ms = in_->now_ms;
  d.state_id = state_id;
  d.message = std::move(message);
  d.numbers = std::move(numbers);
  d.texts = std::move(texts);
  s_->diagnostics_.Emit(std::move(d));
}

// ---- answers ----

absl::StatusOr<std::string> StoreSteps::Answer(const Reply& r, absl::string_view what) const {
  absl::Status st = CheckResponse(*r.answer, what);
  if (st.ok()) return r.answer->body;
  // A request acting under a lock (UnderLease) whose failure would have
  // been sent again, once the lease ran out: kAborted, naming the failure.
  if (PastSendBefore(*r.sent, in_->now_ms) && (MayResend(*r.sent, *r.answer) || ReplicaLevelError(*r.sent, *r.answer))) {
    return LeaseRanOut(std::string(what), std::string(st.message()),
                       !r.answer->transport_ok && r.answer->maybe_delivered);
  }
  return ExplainCluster(std::move(st));
}

absl::StatusOr<Rows> StoreSteps::AnswerRows(const Reply& r, absl::string_view what, size_t columns) const {
  absl::StatusOr<std::string> body = Answer(r, what);
  if (!body.ok()) return body.status();
  return ParseTabSeparated(*body, columns);
}


absl::StatusOr<std::string> StoreSteps::Token() {
  if (in_->random.size() < 16) {
    return absl::InvalidArgumentError(
        "the host passed fewer than 16 random bytes; every input needs fresh random bytes");
  }
  return absl::StrCat("chstate-", HexEncode(in_->random.substr(0, 16)), "-", ++s_->writes_);
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

absl::Status StoreSteps::ExplainCluster(absl::Status st) const {
  std::optional<int> code = ClickHouseCode(st);
  if (s_->options_.cluster.enabled() && code == ch::kBadArguments && absl::StrContains(st.message(), "Requested cluster")) {
    return Reworded(st, absl::StatusCode::kInvalidArgument,
                    absl::StrCat("the servers know no cluster \"", s_->options_.cluster.name,
                                 "\": set the cluster setting to a name from their remote_servers (SELECT DISTINCT "
                                 "cluster FROM system.clusters). ", st.message()));
  }
  const bool zookeeper = code == ch::kTableIsReadOnly || code == ch::kNoZooKeeper || code == ch::kKeeperException ||
                         (code == ch::kReadonly && ReplicaNotActive(st.message()));
  if (!s_->options_.cluster.enabled() || !zookeeper) return st;
  return Reworded(st, absl::StatusCode::kUnavailable,
                  absl::StrCat("ClickHouse cannot reach ZooKeeper (code ", *code, "), which cluster mode needs for "
                               "replicated tables and ON CLUSTER DDL; nothing was changed. Check ZooKeeper (the "
                               "servers reconnect by themselves a few seconds after it is back), then retry. ",
                               st.message()));
}

absl::Status StoreSteps::Reworded(const absl::Status& st, absl::StatusCode code, absl::string_view message) {
  absl::Status out(code, message);
  st.ForEachPayload([&out](absl::string_view url, const absl::Cord& payload) { out.SetPayload(url, payload); });
  return out;
}

const LockMachine* StoreSteps::LockOf(const std::string& id) const {
  const LockMachine* lock = current_lock_.get();
  if (lock == nullptr || lock->state_id() != id) {
    auto it = s_->held_.find(id);
    lock = it == s_->held_.end() ? nullptr : it->second.machine.get();
  }
  return lock;
}

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

absl::Status StoreSteps::LeaseRanOut(const std::string& what, const std::string& cause, bool maybe_landed) const {
  return absl::AbortedError(absl::StrCat(
      "the lock on state id \"", PrintableId(lease_id_), "\" ran out while ", what, " waited out ", cause,
      ": it was not sent again past the lease, since another process may hold the lock by now (",
      maybe_landed ? "its last send may have landed" : "it was not written",
      "). Release the lock and start again"));
}

absl::Status StoreSteps::LeaseCheck(const std::string& id) const {
  const LockMachine* lock = LockOf(id);
  if (lock == nullptr || lock->LeaseValid(in_->now_ms)) return absl::OkStatus();
  return absl::AbortedError(absl::StrCat(
      "the lock on state id \"", PrintableId(id), "\" ran out before the write (its lease ends ",
      s_->options_.lock.stale_ms / 1000, " s, less a safety margin, after it was taken or last renewed; the store "
      "renews it when used or ticked after a third of that); nothing was written: release it and start again"));
}

void StoreSteps::TellAcquired(const LockMachine& m, int64_t waited_ms, bool waited_for_another) {
  // Worth a line at info when the acquisition waited for another process;
  // the round trips of an uncontended lock are debug.
  Tell(DiagnosticKind::kLockAcquired, waited_for_another ? DiagnosticLevel::kInfo : DiagnosticLevel::kDebug,
       m.state_id(), absl::StrCat("acquired the lock on \"", PrintableId(m.state_id()), "\" after ", waited_ms, " ms"),
       {{"waited_ms", waited_ms}}, {{"lock_id", m.lock_id()}});
}

Result StoreSteps::Base(std::optional<MeltanoState> state) const {
  Result r;
  r.state = std::move(state);
  r.server_version = s_->server_version_;
  if (s_->statements_) r.dialect = s_->statements_->dialect();
  r.next_timeout_ms = s_->NextTimeoutMs();
  return r;
}

}  // namespace chstate
