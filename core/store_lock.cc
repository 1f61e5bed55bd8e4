// An operation's lock, as parts (core/op.h): driving a lock machine
// (core/lock_machine.h) until its outcome, taking an id's lock (staying
// away after yielding it, waiting for the Python backend's rows, pruning
// dead claims in cluster mode) and releasing it.
#include "core/store.h"

#include <algorithm>
#include <map>
#include <optional>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/endpoints.h"
#include "core/lock_common.h"
#include "core/lock_machine.h"
#include "core/quoting.h"
#include "core/response.h"
#include "core/store_steps.h"

namespace chstate {
namespace part {
namespace {

// A read (SqlRequest::each_replica: the lock's claims, a state) asked of
// enough replicas that one of them has every confirmed write. On 18.16,
// select_sequential_consistency only makes sure that the replica read has
// the last quorum insert of the table: one that missed an earlier insert
// (its fetch failed, or is still queued, as after a restart) answers
// without it, and the claimant would hold the lock while that claim's
// holder does (tests/cluster/test_claims_gap.py), or an update would merge
// into a state older than one already acknowledged and lose it
// (tests/cluster/test_state_gap.py). A write is confirmed on `quorum`
// replicas, so any replicas - quorum + 1 replicas include one of them
// (ClaimsReplicasToRead). Each answer names its replica
// (ClaimsReadReplica); the read goes to the hosts that have not answered
// first (SqlRequest::not_to), and asks again, up to once per host and once
// more per replica it needs, before it gives up: with `fewer_ok` it then
// ends with the answers it has, otherwise it fails, saying how few replicas
// answered. The answers, joined, go to the caller as one (the lock machine:
// ParseClaimInspection joins the replicas' rows; a state read picks the
// newest row, NewestStateRow). A failed answer goes to the caller as it
// came: it judges it as any failed read.
class ReadEachReplicaOp final : public StorePart {
 public:
  ReadEachReplicaOp(StoreSteps& s, SqlRequest req, std::string what, std::string item, bool fewer_ok,
                    SqlResponse* out)
      : StorePart(s),
        req_(std::move(req)),
        what_(std::move(what)),
        item_(std::move(item)),
        fewer_ok_(fewer_ok),
        out_(out) {}
  std::string Where() const override {
    return absl::StrCat("reading ", what_, " (", replicas_.size(), " replica", replicas_.size() == 1 ? "" : "s", ")");
  }

  Next Resume(const Reply& r) override {
    if (r.kind == Reply::Kind::kStart) return Ask();
    if (r.kind != Reply::Kind::kAnswer) return Next::Fail(absl::InternalError("the claims read got no answer"));
    const SqlResponse& a = *r.answer;
    const bool answered = a.transport_ok && a.http_status == 200 && !ResponseCode(a);
    const std::optional<ClaimsReplica> replica = answered ? ClaimsReadReplica(a.body) : std::nullopt;
    if (!replica) {
      // With `fewer_ok`, the other hosts failing after some replica answered
      // leaves what that replica showed.
      if (fewer_ok_ && !replicas_.empty() && !answered) return Joined();
      // A server that does not say which replica it is, or a failure: the
      // caller judges it, and a failure of the other hosts after some
      // replica answered says how few replicas that was.
      *out_ = a;
      if (!a.transport_ok && !replicas_.empty()) {
        out_->transport_error = absl::StrCat(TooFew(), "; the other hosts: ", a.transport_error);
      }
      return Next::Done();
    }
    if (r.sent != nullptr && r.sent->endpoint.port != 0) req_.not_to.push_back(r.sent->endpoint);
    if (std::find(replicas_.begin(), replicas_.end(), replica->name) == replicas_.end()) {
      answered_ = a;
      replicas_.push_back(replica->name);
      absl::StrAppend(&joined_, a.body, absl::EndsWith(a.body, "\n") ? "" : "\n");
      through_.push_back(r.sent != nullptr && r.sent->endpoint.port != 0
                             ? absl::StrCat(replica->name, " through ", Endpoints::Describe(r.sent->endpoint))
                             : replica->name);
    }
    need_ = std::max(need_, ClaimsReplicasToRead(replica->replicas, s_.st().cluster().quorum));
    replicas_total_ = std::max(replicas_total_, replica->replicas);
    if (static_cast<int64_t>(replicas_.size()) >= need_) return Joined();
    const int64_t hosts = std::max<int64_t>(1, static_cast<int64_t>(s_.options().hosts.size()));
    if (asked_ < hosts + need_) return Ask();
    if (fewer_ok_) return Joined();
    *out_ = SqlResponse{};
    out_->transport_ok = false;
    out_->transport_error = absl::StrCat(TooFew(), "; name the replicas in the URI (clickhouse://USER@HOST1,HOST2,HOST3/...) "
                                         "or reach them through a load balancer");
    return Next::Done();
  }

 private:
  std::string TooFew() const {
    return absl::StrCat(what_, absl::EndsWith(what_, "s") ? " were" : " was", " read from ", replicas_.size(),
                        " of the ", need_, " replicas a read must reach (", absl::StrJoin(through_, ", "), "): ", item_,
                        " is confirmed on a quorum of ", s_.st().cluster().quorum, " of the ", replicas_total_,
                        " replicas, and the others may lack it");
  }

  Next Ask() {
    ++asked_;
    return Next::Send(req_);
  }

  // Ends with the answers of the replicas that answered, joined.
  Next Joined() {
    *out_ = answered_;
    out_->body = std::move(joined_);
    return Next::Done();
  }

  SqlRequest req_;
  const std::string what_;  // what is read ("the lock's claims")
  const std::string item_;  // what a quorum confirms ("a claim")
  const bool fewer_ok_;
  SqlResponse* out_;
  std::vector<std::string> replicas_;  // those that answered, in order
  std::vector<std::string> through_;   // the same, with the host each answered through
  std::string joined_;
  SqlResponse answered_;  // the last answer of a replica not heard before
  int64_t need_ = 1;
  int64_t replicas_total_ = 0;
  int64_t asked_ = 0;
};

// Gives the lock machine its first input (`start`), then sends what it
// sends (its waiter rows included) and waits what it says until it reports
// an outcome (acquired, released, failed, lost), which it leaves in *out
// (with what the machine does next: a renewal armed as it became the
// holder). A renewal that finished arms the next one: that is its outcome.
// A back-off after a read that found another process holding the lock is
// told (lock_waiting), and noted in *waited when given.
class DriveLockOp final : public StorePart {
 public:
  DriveLockOp(StoreSteps& s, StoreSteps::LockPtr m, LockStart start, LockOutput* out, bool* waited)
      : StorePart(s), m_(std::move(m)), start_(start), out_(out), waited_(waited) {}
  std::string Where() const override {
    return absl::StrCat("the lock on \"", PrintableId(m_->state_id()), "\" (", LockStateName(m_->state()), ")");
  }

  Next Resume(const Reply& r) override {
    const Inputs& in = s_.inputs();
    LockOutput o;
    if (r.kind == Reply::Kind::kStart) {
      o = start_ == LockStart::kAcquire   ? m_->Acquire(in)
          : start_ == LockStart::kRelease ? m_->Release(in)
                                          : m_->OnTimer(in);
    } else if (r.kind == Reply::Kind::kAnswer || r.kind == Reply::Kind::kPart) {
      // kPart: a claims read asked of several replicas (ReadEachReplicaOp), joined.
      const bool waiter_row = m_->state() == LockState::kAnnouncing;
      o = m_->OnResponse(r.kind == Reply::Kind::kPart ? claims_ : *r.answer, in);
      // A waiter row's answer is no read: the holder seen before stands.
      if (!waiter_row) {
        holder_ = m_->sighting().live_holder;
        holder_age_s_ = m_->sighting().inspection.age_s;
        holder_stale_s_ = m_->sighting().inspection.stale_s;
      }
    } else if (r.kind == Reply::Kind::kTimer) {
      o = m_->OnTimer(in);
    }
    if (o.outcome != LockOutput::Outcome::kNone || o.renewed()) {
      *out_ = std::move(o);
      return Next::Done();
    }
    switch (o.next) {
      case LockOutput::Next::kRunSql:
        if (o.request.each_replica) {
          claims_ = SqlResponse{};
          return Next::Call(ReadClaims(s_, std::move(o.request), &claims_));
        }
        return Next::Send(std::move(o.request));
      case LockOutput::Next::kWait:
        // The back-off before the next attempt, or (cluster mode) a quorum
        // insert answered 286 sent again after a moment.
        if (o.timer != LockTimer::kBackOff) return Next::Wait(TimerKind::kQuorumBusy, o.wait_ms);
        if (!holder_.empty()) TellWaiting(o.wait_ms);
        return Next::Wait(TimerKind::kLockRetry, o.wait_ms);
      case LockOutput::Next::kNone:
        break;
    }
    return Next::Fail(absl::InternalError(
        absl::StrCat("the lock stopped in state ", LockStateName(m_->state()), " without an outcome")));
  }

 private:
  void TellWaiting(int64_t next_try_ms) {
    if (waited_ != nullptr) *waited_ = true;
    const int64_t window_s = std::max((m_->options().stale_ms + 999) / 1000, holder_stale_s_);
    const int64_t validity_left_s = std::max<int64_t>(window_s - holder_age_s_, 0);
    const int64_t gives_up_in_ms = std::max<int64_t>(m_->acquire_deadline_ms() - s_.inputs().now_ms, 0);
    s_.Tell(DiagnosticKind::kLockWaiting, DiagnosticLevel::kInfo, m_->state_id(),
            absl::StrCat("waiting for the lock on \"", PrintableId(m_->state_id()), "\": another process (lock ",
                         holder_, ") renewed it ", holder_age_s_, " s ago and it stays valid up to ", validity_left_s,
                         " s more; next try in ", next_try_ms, " ms, giving up in ", gives_up_in_ms, " ms"),
            {{"renewed_s_ago", holder_age_s_},
             {"validity_left_s", validity_left_s},
             {"next_try_ms", next_try_ms},
             {"gives_up_in_ms", gives_up_in_ms}},
            {{"holder", holder_}});
  }

  StoreSteps::LockPtr m_;
  const LockStart start_;
  LockOutput* out_;
  bool* waited_;
  // The other process the lock's last read found holding it (empty: none),
  // how long ago it renewed and the stale window it wrote, by the server.
  std::string holder_;
  int64_t holder_age_s_ = 0;
  int64_t holder_stale_s_ = 0;
  SqlResponse claims_;  // the last claims read, joined over the replicas (ReadEachReplicaOp)
};

// Takes the lock on `id` until the lock timeout (from the first attempt),
// into *out; *waited tells whether it waited for another process.
class AcquireOp final : public StorePart {
 public:
  AcquireOp(StoreSteps& s, std::string id, StoreSteps::LockPtr* out, bool* waited, int64_t* renew_in_ms)
      : StorePart(s),
        id_(std::move(id)),
        out_(out),
        waited_(waited),
        renew_in_ms_(renew_in_ms) {}
  std::string Where() const override {
    const std::string id = PrintableId(id_);
    switch (stage_) {
      case Stage::kStart: return absl::StrCat("acquiring \"", id, "\"");
      case Stage::kStayingAway: return absl::StrCat("staying away from \"", id, "\" (it yielded its lock to a waiter)");
      case Stage::kLookingForPython:
      case Stage::kClaimingFromPython:
        return absl::StrCat("looking for the Python backend's lock on \"", id, "\"");
      case Stage::kTaking: return absl::StrCat("acquiring \"", id, "\"");
      case Stage::kPruning: return absl::StrCat("removing ended lock claims of \"", id, "\"");
      case Stage::kYielding: return absl::StrCat("yielding the lock on \"", id, "\" to the Python backend");
      case Stage::kAbandoning: return absl::StrCat("releasing the lock on \"", id, "\" after a failure");
      case Stage::kWaitingForPython:
        return absl::StrCat("waiting for the Python backend's lock on \"", id, "\"");
    }
    return "";
  }

  Next Resume(const Reply& r) override {
    const Inputs& in = s_.inputs();
    const StoreOptions& o = s_.options();
    switch (stage_) {
      case Stage::kStart:
        *waited_ = false;
        deadline_ms_ = in.now_ms + o.lock.timeout_ms;
        return Attempt();
      case Stage::kStayingAway:
      case Stage::kWaitingForPython:
        return Attempt();
      case Stage::kLookingForPython: {
        // No such table: no Python process ever ran on this schema.
        absl::StatusOr<Rows> rows = s_.AnswerRows(r, "looking for the Python backend's lock rows", 2);
        if (!rows.ok() && rows.status().code() != absl::StatusCode::kNotFound) return Next::Fail(rows.status());
        if (rows.ok() && !rows->empty()) return WaitForPython((*rows)[0][0].value_or(""));
        return Take();
      }
      case Stage::kTaking:
        if (outcome_.outcome != LockOutput::Outcome::kAcquired) return Next::Fail(s_.ExplainCluster(outcome_.status));
        if (o.python_locks) {
          stage_ = Stage::kClaimingFromPython;
          return Next::Try(ClaimFromPython(s_, m_, &python_holder_, &python_busy_));
        }
        return Prune();
      case Stage::kClaimingFromPython:
        if (!r.status.ok()) {
          // Release withdraws the marker first (harmless when none was written).
          failure_ = r.status;
          stage_ = Stage::kAbandoning;
          return Next::Try(Release(s_, m_));
        }
        if (python_holder_.empty() && !python_busy_) return Acquired();
        stage_ = Stage::kYielding;
        return Next::Call(Release(s_, m_));
      case Stage::kYielding:
        return WaitForPython(python_holder_);  // empty: a write between the looks
      case Stage::kAbandoning:
        return Next::Fail(failure_);
      case Stage::kPruning:
        return Acquired();  // a failure changes nothing: a later acquisition prunes them
    }
    return Next::Fail(absl::InternalError("acquire: no such stage"));
  }

 private:
  // What the op is doing (waiting for); Resume goes on from there.
  enum class Stage {
    kStart,
    kStayingAway,        // this store just yielded the id's lingering lock to a waiter
    kLookingForPython,   // the Python backend's rows, before taking the lock
    kTaking,             // the lock machine, acquiring
    kClaimingFromPython, // python_locks: the lock is ours, the Python backend's rows next
    kYielding,           // a Python process holds it: releasing ours
    kWaitingForPython,   // ... and waiting the retry before the next attempt
    kAbandoning,         // releasing after a failure
    kPruning,            // cluster mode: removing dead claims
  };

  // One attempt at the lock (the first, or after a wait).
  Next Attempt() {
    const Inputs& in = s_.inputs();
    if (auto away = s_.away_until_ms().find(id_); away != s_.away_until_ms().end()) {
      // This store just gave the id's lingering lock up to a waiting
      // process: stay away until that process has had its next attempt.
      if (in.now_ms < away->second && away->second < deadline_ms_) {
        stage_ = Stage::kStayingAway;
        return Next::Wait(TimerKind::kLockRetry, away->second - in.now_ms);
      }
      s_.away_until_ms().erase(away);
    }
    // A mixed fleet is safe by default: a live row of the Python backend in
    // <table>_lock is waited for whatever python_locks says (that setting
    // decides whether this store also shows itself there, and looks again
    // after taking its own lock). Looked at before taking the lock, so that
    // a failed look leaves nothing to release. The Python backend knows no
    // clusters.
    if (!s_.options().python_locks && !s_.st().cluster().enabled()) {
      stage_ = Stage::kLookingForPython;
      return Next::Send(s_.st().ForeignLockRows(id_));
    }
    return Take();
  }

  Next Take() {
    LockOptions options = s_.options().lock;
    options.timeout_ms = std::max<int64_t>(deadline_ms_ - s_.inputs().now_ms, 0);
    // Waiting for a live holder, the machine shows itself to it (a waiter
    // row, once per holder) so that a lingering holder elsewhere yields.
    LockMachineOptions machine_options;
    machine_options.write_waiter_rows = true;
    m_ = MakeLockMachine(s_.st(), id_, options, machine_options);
    stage_ = Stage::kTaking;
    return Next::Call(DriveLock(s_, m_, LockStart::kAcquire, &outcome_, waited_));
  }

  // A Python backend's process holds the id: try again after the retry
  // wait, or give up naming it.
  Next WaitForPython(const std::string& python_lock_id) {
    const StoreOptions& o = s_.options();
    *waited_ = true;
    if (s_.inputs().now_ms + o.lock.retry_ms >= deadline_ms_) return Next::Fail(PythonHolds(o, id_, python_lock_id));
    stage_ = Stage::kWaitingForPython;
    return Next::Wait(TimerKind::kLockRetry, o.lock.retry_ms);
  }

  // Cluster mode, just acquired: when its winning claims read held
  // kClaimsPruneAt claims of the id that no reader counts any more, they
  // are removed. A backlog (claims from before pruning existed) goes
  // kClaimsPruneMax at a time, a slice at a random offset, at every
  // acquisition until it is gone (a statement must stay below
  // max_query_size, 256 KiB).
  Next Prune() {
    const Inputs& in = s_.inputs();
    std::vector<std::string> dead = m_->prunable_claims();
    if (!s_.st().cluster().enabled() || static_cast<int64_t>(dead.size()) < kClaimsPruneAt) return Acquired();
    const bool backlog = static_cast<int64_t>(dead.size()) > kClaimsPruneMax;
    std::map<std::string, int64_t>& pruned = s_.claims_pruned_ms();
    auto last = pruned.find(id_);
    if (!backlog && last != pruned.end() && in.now_ms - last->second < kClaimsPruneEveryMs) return Acquired();
    pruned[id_] = in.now_ms;
    if (backlog) {
      uint64_t r = 0;
      for (size_t i = 0; i < in.random.size() && i < 8; ++i) r = (r << 8) | static_cast<unsigned char>(in.random[i]);
      const size_t from = static_cast<size_t>(r % (dead.size() - kClaimsPruneMax + 1));
      dead = std::vector<std::string>(dead.begin() + from, dead.begin() + from + kClaimsPruneMax);
    }
    stage_ = Stage::kPruning;
    return Next::Try(s_.SqlPart(s_.st().PruneClaims(id_, dead), "removing ended lock claims"));
  }

  Next Acquired() {
    *out_ = m_;
    // The first renewal the machine armed as it became the holder.
    if (renew_in_ms_ != nullptr) *renew_in_ms_ = outcome_.wait_ms;
    return Next::Done();
  }

  Stage stage_ = Stage::kStart;
  std::string id_;
  StoreSteps::LockPtr* out_;
  bool* waited_;
  int64_t deadline_ms_ = 0;  // the lock timeout, from the first attempt
  StoreSteps::LockPtr m_;
  LockOutput outcome_;
  int64_t* renew_in_ms_;
  std::string python_holder_;  // python_locks: the Python process found holding the id
  bool python_busy_ = false;   // python_locks: its table was written between the looks
  absl::Status failure_;       // what failed while the lock was held (kAbandoning)
};

}  // namespace

// Releases `m`: with python_locks, the marker first (while it stands,
// Python processes wait; a failure leaves it to end with the Python
// backend's window), then the lock itself.
namespace {
struct ReleaseSteps {
  StoreSteps& s;
  StoreSteps::LockPtr m;
  bool marker;  // python_locks, while held: the marker is withdrawn first
  LockOutput outcome;
  Next Withdraw(const Reply&) {
    return Next::Try(s.SqlPart(s.st().DeleteLockMarker(m->state_id(), m->lock_id()), "withdrawing the lock marker"));
  }
  // The lock is dropped whatever became of the marker.
  Next Drop(const Reply&) { return Next::Call(DriveLock(s, m, LockStart::kRelease, &outcome)); }
  Next Done(const Reply&) {
    if (outcome.outcome == LockOutput::Outcome::kReleased) return Next::Done();
    return Next::Fail(s.ExplainCluster(outcome.status));
  }
  std::string Where(size_t step) const {
    return absl::StrCat(marker && step == 0 ? "withdrawing the lock marker of \"" : "releasing the lock on \"",
                        PrintableId(m->state_id()), "\"");
  }
};
}  // namespace

std::unique_ptr<Op> Release(StoreSteps& s, StoreSteps::LockPtr m) {
  using R = ReleaseSteps;
  const bool marker = s.options().python_locks && m->state() == LockState::kHeld;
  if (marker) return Steps<R>({&R::Withdraw, &R::Drop, &R::Done}, s, std::move(m), true);
  return Steps<R>({&R::Drop, &R::Done}, s, std::move(m), false);
}

std::unique_ptr<Op> ReadClaims(StoreSteps& s, SqlRequest req, SqlResponse* out) {
  return ReadEachReplica(s, std::move(req), "the lock's claims", "a claim", false, out);
}

std::unique_ptr<Op> ReadEachReplica(StoreSteps& s, SqlRequest req, std::string what, std::string item,
                                    bool fewer_ok, SqlResponse* out) {
  return std::make_unique<ReadEachReplicaOp>(s, std::move(req), std::move(what), std::move(item), fewer_ok, out);
}

std::unique_ptr<Op> DriveLock(StoreSteps& s, StoreSteps::LockPtr m, LockStart start, LockOutput* out, bool* waited) {
  return std::make_unique<DriveLockOp>(s, std::move(m), start, out, waited);
}

std::unique_ptr<Op> Acquire(StoreSteps& s, std::string id, StoreSteps::LockPtr* out, bool* waited,
                            int64_t* renew_in_ms) {
  return std::make_unique<AcquireOp>(s, std::move(id), out, waited, renew_in_ms);
}

}  // namespace part
}  // namespace chstate
