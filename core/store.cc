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
struct UnderIdLockSteps {
  StoreSteps& s;
  std::string id;
  std::unique_ptr<Op> body;
  bool held;  // by this store: renewed when due, then the body
  Next Lock(const Reply&) { return Next::Call(part::Locked(s, id, std::move(body))); }
  Next Renew(const Reply&) { return Next::Call(s.RenewIfDuePart(id)); }
  Next Body(const Reply&) { return Next::Call(std::move(body)); }
  std::string Where(size_t step) const {
    if (!held || step != 0) return "under the id's lock";
    return absl::StrCat("renewing the held lock on \"", PrintableId(id), "\"");
  }
};
std::unique_ptr<Op> UnderIdLock(StoreSteps& s, std::string id, std::unique_ptr<Op> body) {
  using U = UnderIdLockSteps;
  if (!s.HoldsLock(id)) return Steps<U>({&U::Lock}, s, std::move(id), std::move(body), false);
  return Steps<U>({&U::Renew, &U::Body}, s, std::move(id), std::move(body), true);
}

// Meltano's update() under a lock the caller holds: reads the id's state,
// merges `incoming` into it (ApplyUpdate) and writes the result to
// *written.
struct ReadMergeWriteSteps {
  StoreSteps& s;
  MeltanoState incoming;
  MeltanoState* written;
  std::optional<MeltanoState> current;
  Next Read(const Reply&) { return Next::Call(part::ReadState(s, incoming.state_id, &current, true)); }
  Next Write(const Reply&) {
    *written = ApplyUpdate(current, incoming);
    return Next::Call(part::WriteState(s, *written));
  }
  std::string Where(size_t step) const { return step == 1 ? "writing the merged state" : "merging"; }
};
std::unique_ptr<Op> ReadMergeWrite(StoreSteps& s, MeltanoState incoming, MeltanoState* written) {
  using R = ReadMergeWriteSteps;
  return Steps<R>({&R::Read, &R::Write}, s, std::move(incoming), written);
}

// get: the id's state, renewing this store's held lock on it first when due.
struct GetSteps {
  StoreSteps& s;
  std::string id;
  std::optional<MeltanoState> state;
  Next Connect(const Reply&) { return Next::Call(part::Connect(s)); }
  Next Renew(const Reply&) { return Next::Call(s.RenewIfDuePart(id)); }
  Next Read(const Reply&) { return Next::Call(part::ReadState(s, id, &state)); }
  Next Done(const Reply&) { return Next::Done(s.Base(std::move(state))); }
  std::string Where(size_t) const { return absl::StrCat("get \"", PrintableId(id), "\""); }
};

// set, update, merge and delete: one change to one id under its lock.
enum class Change { kSet, kUpdate, kDelete };
struct ChangeSteps {
  StoreSteps& s;
  Change kind;
  MeltanoState in;
  MeltanoState written;
  Next Connect(const Reply&) { return Next::Call(part::Connect(s)); }
  Next Write(const Reply&) {
    std::unique_ptr<Op> change;
    switch (kind) {
      case Change::kSet: change = part::WriteState(s, in); break;
      case Change::kUpdate: change = ReadMergeWrite(s, in, &written); break;
      case Change::kDelete: change = part::DeleteState(s, in.state_id); break;
    }
    return Next::Call(UnderIdLock(s, in.state_id, std::move(change)));
  }
  Next Done(const Reply&) {
    if (kind == Change::kDelete) return Next::Done(s.Base());
    return Next::Done(s.Base(kind == Change::kSet ? in : written));
  }
  std::string Where(size_t) const {
    const char* verb = kind == Change::kSet ? "set" : kind == Change::kUpdate ? "update" : "delete";
    return absl::StrCat(verb, " \"", PrintableId(in.state_id), "\"");
  }
};
std::unique_ptr<Op> ChangeOp(StoreSteps& s, Change kind, MeltanoState state) {
  using C = ChangeSteps;
  return Steps<C>({&C::Connect, &C::Write, &C::Done}, s, kind, std::move(state));
}

// The source's merged view as dst's incoming partial state; nothing is
// written when there is nothing to merge or it is not Meltano's shape.
absl::StatusOr<MeltanoState> MergeInput(const std::optional<MeltanoState>& source, const std::string& src,
                                        const std::string& dst, bool force) {
  if (!source) return absl::NotFoundError(absl::StrCat("state id \"", PrintableId(src), "\" has no state to merge"));
  MeltanoState incoming;
  incoming.state_id = dst;
  incoming.partial = source->Merged();
  if (incoming.partial.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("merge: the state of \"", PrintableId(src),
                                                   "\" is empty, so there is nothing to merge; nothing was written"));
  }
  if (!force && !incoming.partial.contains("singer_state")) {
    return absl::InvalidArgumentError(absl::StrCat(
        "merge: the state of \"", PrintableId(src), "\" has no top-level \"singer_state\" "
        "key, which Meltano's states have; nothing was written. Pass force to merge it as it is"));
  }
  return incoming;
}

// merge --from-state-id: the merged view of `src`'s state, read without its
// lock, merged into `dst` as update() does.
struct MergeFromSteps {
  StoreSteps& s;
  std::string src;
  std::string dst;
  bool force;
  std::optional<MeltanoState> source;
  MeltanoState written;
  Next Connect(const Reply&) { return Next::Call(part::Connect(s)); }
  Next Read(const Reply&) { return Next::Call(part::ReadState(s, src, &source)); }
  Next Merge(const Reply&) {
    absl::StatusOr<MeltanoState> incoming = MergeInput(source, src, dst, force);
    if (!incoming.ok()) return Next::Fail(incoming.status());
    return Next::Call(UnderIdLock(s, dst, ReadMergeWrite(s, *std::move(incoming), &written)));
  }
  Next Done(const Reply&) { return Next::Done(s.Base(written)); }
  std::string Where(size_t) const {
    return absl::StrCat("merge \"", PrintableId(src), "\" into \"", PrintableId(dst), "\"");
  }
};

// copy and move: dst := src under dst's lock; a move then deletes src under
// its own lock. The copy is written (and its lock released) before the
// source is deleted: a failure in between leaves both states, never neither.
struct CopySteps {
  StoreSteps& s;
  std::string src;
  std::string dst;
  bool move;
  std::optional<MeltanoState> source;
  Next Connect(const Reply&) { return Next::Call(part::Connect(s)); }
  Next Read(const Reply&) { return Next::Call(part::ReadState(s, src, &source)); }
  Next Copy(const Reply&) {
    if (!source) {
      return Next::Fail(absl::NotFoundError(
          absl::StrCat("state id \"", PrintableId(src), "\" has no state to ", move ? "move" : "copy")));
    }
    MeltanoState copy = *source;
    copy.state_id = dst;
    return Next::Call(part::Locked(s, dst, part::WriteState(s, std::move(copy))));
  }
  Next DeleteSource(const Reply&) {
    if (!move) return Next::Done(s.Base());
    return Next::Call(part::Locked(s, src, part::DeleteState(s, src)));
  }
  Next Done(const Reply&) { return Next::Done(s.Base()); }
  std::string Where(size_t) const {
    return absl::StrCat(move ? "move" : "copy", " \"", PrintableId(src), "\" to \"", PrintableId(dst), "\"");
  }
};
std::unique_ptr<Op> CopyOp(StoreSteps& s, std::string src, std::string dst, bool move) {
  using C = CopySteps;
  return Steps<C>({&C::Connect, &C::Read, &C::Copy, &C::DeleteSource, &C::Done}, s, std::move(src), std::move(dst), move);
}

}  // namespace

std::unique_ptr<Task> Store::Get(std::string state_id) {
  if (absl::Status st = ValidateStateId(state_id); !st.ok()) return Invalid(st);
  return MakeOpTask(this, [&](StoreSteps& s) {
    using G = GetSteps;
    return Steps<G>({&G::Connect, &G::Renew, &G::Read, &G::Done}, s, state_id);
  });
}

std::unique_ptr<Task> Store::Set(MeltanoState state) {
  if (absl::Status st = ValidateStateId(state.state_id); !st.ok()) return Invalid(st);
  return MakeOpTask(this, [&](StoreSteps& s) { return ChangeOp(s, Change::kSet, state); });
}

std::unique_ptr<Task> Store::Update(MeltanoState incoming) {
  if (absl::Status st = ValidateStateId(incoming.state_id); !st.ok()) return Invalid(st);
  return MakeOpTask(this, [&](StoreSteps& s) {
    return ChangeOp(s, Change::kUpdate, incoming);
  });
}

std::unique_ptr<Task> Store::MergeFrom(std::string src, std::string dst, bool force) {
  if (absl::Status st = ValidateStateId(src); !st.ok()) return Invalid(st);
  if (absl::Status st = ValidateStateId(dst); !st.ok()) return Invalid(st);
  return MakeOpTask(this, [&](StoreSteps& s) {
    using M = MergeFromSteps;
    return Steps<M>({&M::Connect, &M::Read, &M::Merge, &M::Done}, s, src, dst, force);
  });
}

std::unique_ptr<Task> Store::Delete(std::string state_id) {
  if (absl::Status st = ValidateStateId(state_id); !st.ok()) return Invalid(st);
  MeltanoState id_only;
  id_only.state_id = std::move(state_id);
  return MakeOpTask(this, [&](StoreSteps& s) {
    return ChangeOp(s, Change::kDelete, id_only);
  });
}

std::unique_ptr<Task> Store::Copy(std::string src, std::string dst) {
  if (absl::Status st = ValidateStateId(src); !st.ok()) return Invalid(st);
  if (absl::Status st = ValidateStateId(dst); !st.ok()) return Invalid(st);
  return MakeOpTask(this, [&](StoreSteps& s) { return CopyOp(s, src, dst, false); });
}

std::unique_ptr<Task> Store::Move(std::string src, std::string dst) {
  if (absl::Status st = ValidateStateId(src); !st.ok()) return Invalid(st);
  if (absl::Status st = ValidateStateId(dst); !st.ok()) return Invalid(st);
  if (src == dst) {
    return Invalid(absl::InvalidArgumentError("move needs two different state ids: source and destination are equal"));
  }
  return MakeOpTask(this, [&](StoreSteps& s) { return CopyOp(s, src, dst, true); });
}

}  // namespace chstate
