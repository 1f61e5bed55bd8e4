// Store: its creation and the operations on one state (get, set, update,
// merge, delete, copy, move). Each operation is an Op (core/op.h) built
// from the parts in store_steps.h; nothing here blocks.
#include "core/store.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "core/quoting.h"
#include "core/store_steps.h"

namespace chstate {

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
  if (options.python_locks && options.cluster.enabled()) {
    return absl::InvalidArgumentError(
        "python_locks needs one server, not cluster mode: the Python ClickHouse backend knows no clusters, and the "
        "mixed fleet's look reads block numbers that only one server's MergeTree gives in commit order. Turn "
        "python_locks off (Meltano: state_backend.clickhouse.python_locks) or leave cluster mode");
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

std::optional<Dialect> Store::dialect() const {
  if (statements_) return statements_->dialect();
  return std::nullopt;
}

namespace {

// Under the id's lock: the one this store holds (the caller's lock scope),
// renewed when due and lease-checked at the write, or one taken for `body`
// alone (Locked). Which it is, is looked at when the part starts (tasks
// queue).
class UnderIdLockOp final : public StorePart {
 public:
  UnderIdLockOp(StoreSteps& s, std::string id, std::unique_ptr<Op> body)
      : StorePart(s), id_(std::move(id)), body_(std::move(body)) {}
  std::string Where() const override {
    return stage_ == Stage::kRenewing ? absl::StrCat("renewing the held lock on \"", PrintableId(id_), "\"")
                                   : "under the id's lock";
  }

  Next Resume(const Reply&) override {
    switch (stage_) {
      case Stage::kStart:
        if (!s_.HoldsLock(id_)) {
          stage_ = Stage::kInBody;
          return Next::Call(part::Locked(s_, id_, std::move(body_)));
        }
        stage_ = Stage::kRenewing;
        return Next::Call(s_.RenewIfDuePart(id_));
      case Stage::kRenewing:
        stage_ = Stage::kInBody;
        return Next::Call(std::move(body_));
      case Stage::kInBody:
        return Next::Done();
    }
    return Next::Fail(absl::InternalError("under the id's lock: no such stage"));
  }

 private:
  // What the op waits for; Resume goes on from there.
  enum class Stage { kStart, kRenewing, kInBody };
  Stage stage_ = Stage::kStart;
  std::string id_;
  std::unique_ptr<Op> body_;
};

// Meltano's update() under a lock the caller holds: reads the id's state,
// merges `incoming` into it (ApplyUpdate) and writes the result to
// *written.
class ReadMergeWriteOp final : public StorePart {
 public:
  ReadMergeWriteOp(StoreSteps& s, MeltanoState incoming, MeltanoState* written)
      : StorePart(s), incoming_(std::move(incoming)), written_(written) {}
  std::string Where() const override { return stage_ == Stage::kWriting ? "writing the merged state" : "merging"; }

  Next Resume(const Reply&) override {
    switch (stage_) {
      case Stage::kStart:
        stage_ = Stage::kReading;
        return Next::Call(part::ReadState(s_, incoming_.state_id, &current_));
      case Stage::kReading:
        *written_ = ApplyUpdate(current_, incoming_);
        stage_ = Stage::kWriting;
        return Next::Call(part::WriteState(s_, *written_));
      case Stage::kWriting:
        return Next::Done();
    }
    return Next::Fail(absl::InternalError("merge: no such stage"));
  }

 private:
  enum class Stage { kStart, kReading, kWriting };
  Stage stage_ = Stage::kStart;
  MeltanoState incoming_;
  MeltanoState* written_;
  std::optional<MeltanoState> current_;
};

std::unique_ptr<Op> UnderIdLock(StoreSteps& s, std::string id, std::unique_ptr<Op> body) {
  return std::make_unique<UnderIdLockOp>(s, std::move(id), std::move(body));
}

// get: the id's state, renewing this store's held lock on it first when due.
class GetOp final : public StorePart {
 public:
  GetOp(StoreSteps& s, std::string id) : StorePart(s), id_(std::move(id)) {}
  std::string Where() const override { return absl::StrCat("get \"", PrintableId(id_), "\""); }

  Next Resume(const Reply&) override {
    switch (stage_) {
      case Stage::kStart:
        stage_ = Stage::kConnecting;
        return Next::Call(part::Connect(s_));
      case Stage::kConnecting:
        stage_ = Stage::kRenewing;
        return Next::Call(s_.RenewIfDuePart(id_));
      case Stage::kRenewing:
        stage_ = Stage::kReading;
        return Next::Call(part::ReadState(s_, id_, &state_));
      case Stage::kReading: {
        Result r = s_.Base();
        r.state = std::move(state_);
        return Next::Done(std::move(r));
      }
    }
    return Next::Fail(absl::InternalError("get: no such stage"));
  }

 private:
  enum class Stage { kStart, kConnecting, kRenewing, kReading };
  Stage stage_ = Stage::kStart;
  std::string id_;
  std::optional<MeltanoState> state_;
};

// set, update, merge and delete: one change to one id under its lock.
class ChangeOp final : public StorePart {
 public:
  enum class Kind { kSet, kUpdate, kDelete };
  ChangeOp(StoreSteps& s, Kind kind, MeltanoState state) : StorePart(s), kind_(kind), state_(std::move(state)) {}
  std::string Where() const override {
    const char* verb = kind_ == Kind::kSet ? "set" : kind_ == Kind::kUpdate ? "update" : "delete";
    return absl::StrCat(verb, " \"", PrintableId(state_.state_id), "\"");
  }

  Next Resume(const Reply&) override {
    switch (stage_) {
      case Stage::kStart:
        stage_ = Stage::kConnecting;
        return Next::Call(part::Connect(s_));
      case Stage::kConnecting: {
        stage_ = Stage::kChanging;
        std::unique_ptr<Op> change;
        switch (kind_) {
          case Kind::kSet: change = part::WriteState(s_, state_); break;
          case Kind::kUpdate: change = std::make_unique<ReadMergeWriteOp>(s_, state_, &written_); break;
          case Kind::kDelete: change = part::DeleteState(s_, state_.state_id); break;
        }
        return Next::Call(UnderIdLock(s_, state_.state_id, std::move(change)));
      }
      case Stage::kChanging: {
        Result r = s_.Base();
        if (kind_ == Kind::kSet) r.state = state_;
        if (kind_ == Kind::kUpdate) r.state = written_;
        return Next::Done(std::move(r));
      }
    }
    return Next::Fail(absl::InternalError("change: no such stage"));
  }

 private:
  enum class Stage { kStart, kConnecting, kChanging };
  Stage stage_ = Stage::kStart;
  Kind kind_;
  MeltanoState state_;
  MeltanoState written_;
};

// merge --from-state-id: the merged view of `src`'s state, read without its
// lock, merged into `dst` as update() does.
class MergeFromOp final : public StorePart {
 public:
  MergeFromOp(StoreSteps& s, std::string src, std::string dst, bool force)
      : StorePart(s), src_(std::move(src)), dst_(std::move(dst)), force_(force) {}
  std::string Where() const override {
    return absl::StrCat("merge \"", PrintableId(src_), "\" into \"", PrintableId(dst_), "\"");
  }

  Next Resume(const Reply&) override {
    switch (stage_) {
      case Stage::kStart:
        stage_ = Stage::kConnecting;
        return Next::Call(part::Connect(s_));
      case Stage::kConnecting:
        stage_ = Stage::kReading;
        return Next::Call(part::ReadState(s_, src_, &source_));
      case Stage::kReading: {
        absl::StatusOr<MeltanoState> incoming = Incoming();
        if (!incoming.ok()) return Next::Fail(incoming.status());
        stage_ = Stage::kMerging;
        return Next::Call(
            UnderIdLock(s_, dst_, std::make_unique<ReadMergeWriteOp>(s_, *std::move(incoming), &written_)));
      }
      case Stage::kMerging: {
        Result r = s_.Base();
        r.state = written_;
        return Next::Done(std::move(r));
      }
    }
    return Next::Fail(absl::InternalError("merge: no such stage"));
  }

 private:
  // The source's merged view as dst's incoming partial state; nothing is
  // written when there is nothing to merge or it is not Meltano's shape.
  absl::StatusOr<MeltanoState> Incoming() const {
    if (!source_) {
      return absl::NotFoundError(absl::StrCat("state id \"", PrintableId(src_), "\" has no state to merge"));
    }
    MeltanoState incoming;
    incoming.state_id = dst_;
    incoming.partial = source_->Merged();
    if (incoming.partial.empty()) {
      return absl::InvalidArgumentError(absl::StrCat("merge: the state of \"", PrintableId(src_),
                                                     "\" is empty, so there is nothing to merge; nothing was written"));
    }
    if (!force_ && !incoming.partial.contains("singer_state")) {
      return absl::InvalidArgumentError(absl::StrCat(
          "merge: the state of \"", PrintableId(src_), "\" has no top-level \"singer_state\" "
          "key, which Meltano's states have; nothing was written. Pass force to merge it as it is"));
    }
    return incoming;
  }

  enum class Stage { kStart, kConnecting, kReading, kMerging };
  Stage stage_ = Stage::kStart;
  std::string src_;
  std::string dst_;
  bool force_;
  std::optional<MeltanoState> source_;
  MeltanoState written_;
};

// copy and move: dst := src under dst's lock; a move then deletes src under
// its own lock. The copy is written (and its lock released) before the
// source is deleted: a failure in between leaves both states, never neither.
class CopyOp final : public StorePart {
 public:
  CopyOp(StoreSteps& s, std::string src, std::string dst, bool move)
      : StorePart(s), src_(std::move(src)), dst_(std::move(dst)), move_(move) {}
  std::string Where() const override {
    return absl::StrCat(move_ ? "move" : "copy", " \"", PrintableId(src_), "\" to \"", PrintableId(dst_), "\"");
  }

  Next Resume(const Reply&) override {
    switch (stage_) {
      case Stage::kStart:
        stage_ = Stage::kConnecting;
        return Next::Call(part::Connect(s_));
      case Stage::kConnecting:
        stage_ = Stage::kReading;
        return Next::Call(part::ReadState(s_, src_, &state_));
      case Stage::kReading: {
        if (!state_) {
          return Next::Fail(absl::NotFoundError(
              absl::StrCat("state id \"", PrintableId(src_), "\" has no state to ", move_ ? "move" : "copy")));
        }
        MeltanoState copy = *state_;
        copy.state_id = dst_;
        stage_ = Stage::kCopying;
        return Next::Call(part::Locked(s_, dst_, part::WriteState(s_, std::move(copy))));
      }
      case Stage::kCopying:
        if (!move_) return Next::Done(s_.Base());
        stage_ = Stage::kDeletingSource;
        return Next::Call(part::Locked(s_, src_, part::DeleteState(s_, src_)));
      case Stage::kDeletingSource:
        return Next::Done(s_.Base());
    }
    return Next::Fail(absl::InternalError("copy: no such stage"));
  }

 private:
  enum class Stage { kStart, kConnecting, kReading, kCopying, kDeletingSource };
  Stage stage_ = Stage::kStart;
  std::string src_;
  std::string dst_;
  bool move_;
  std::optional<MeltanoState> state_;
};

}  // namespace

std::unique_ptr<Task> Store::Get(std::string state_id) {
  if (absl::Status st = ValidateStateId(state_id); !st.ok()) return Invalid(st);
  return MakeOpTask(this, [state_id](StoreSteps& s) { return std::make_unique<GetOp>(s, state_id); });
}

std::unique_ptr<Task> Store::Set(MeltanoState state) {
  if (absl::Status st = ValidateStateId(state.state_id); !st.ok()) return Invalid(st);
  return MakeOpTask(this, [state](StoreSteps& s) { return std::make_unique<ChangeOp>(s, ChangeOp::Kind::kSet, state); });
}

std::unique_ptr<Task> Store::Update(MeltanoState incoming) {
  if (absl::Status st = ValidateStateId(incoming.state_id); !st.ok()) return Invalid(st);
  return MakeOpTask(this, [incoming](StoreSteps& s) {
    return std::make_unique<ChangeOp>(s, ChangeOp::Kind::kUpdate, incoming);
  });
}

std::unique_ptr<Task> Store::MergeFrom(std::string src, std::string dst, bool force) {
  if (absl::Status st = ValidateStateId(src); !st.ok()) return Invalid(st);
  if (absl::Status st = ValidateStateId(dst); !st.ok()) return Invalid(st);
  return MakeOpTask(this, [src, dst, force](StoreSteps& s) { return std::make_unique<MergeFromOp>(s, src, dst, force); });
}

std::unique_ptr<Task> Store::Delete(std::string state_id) {
  if (absl::Status st = ValidateStateId(state_id); !st.ok()) return Invalid(st);
  MeltanoState id_only;
  id_only.state_id = std::move(state_id);
  return MakeOpTask(this, [id_only](StoreSteps& s) {
    return std::make_unique<ChangeOp>(s, ChangeOp::Kind::kDelete, id_only);
  });
}

std::unique_ptr<Task> Store::Copy(std::string src, std::string dst) {
  if (absl::Status st = ValidateStateId(src); !st.ok()) return Invalid(st);
  if (absl::Status st = ValidateStateId(dst); !st.ok()) return Invalid(st);
  return MakeOpTask(this, [src, dst](StoreSteps& s) { return std::make_unique<CopyOp>(s, src, dst, false); });
}

std::unique_ptr<Task> Store::Move(std::string src, std::string dst) {
  if (absl::Status st = ValidateStateId(src); !st.ok()) return Invalid(st);
  if (absl::Status st = ValidateStateId(dst); !st.ok()) return Invalid(st);
  if (src == dst) {
    return Invalid(absl::InvalidArgumentError("move needs two different state ids: source and destination are equal"));
  }
  return MakeOpTask(this, [src, dst](StoreSteps& s) { return std::make_unique<CopyOp>(s, src, dst, true); });
}

}  // namespace chstate
