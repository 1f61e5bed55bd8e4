// Store: its creation and the operations on one state (get, set, update,
// merge, delete, copy, move). Each operation is a task built from the
// steps in store_steps.h; nothing here blocks.
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

}  // namespace chstate
