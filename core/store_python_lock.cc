// The bridge to the Python ClickHouse backend's lock: a state id locked by
// one of its processes is waited for, and a free one is claimed so that
// both kinds of process exclude each other.
#include "core/store.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "core/quoting.h"
#include "core/response.h"
#include "core/store_steps.h"

namespace chstate {

// A Python backend's process holds the id: try again after the retry
// wait, or give up naming it.
Step StoreSteps::WaitForPython(const std::string& id, const std::string& python_lock_id, std::function<Step(LockPtr)> then,
                               OnFailure fail, int64_t deadline) {
  if (in_->now_ms + s_->options_.lock.retry_ms >= deadline) {
    return fail(absl::AbortedError(absl::StrCat(
        "state id \"", PrintableId(id), "\" is locked by a process of the Python ClickHouse backend (its lock row ",
        PrintableId(python_lock_id), " in ", s_->options_.table, "_lock); it was not free within the lock timeout")));
  }
  return Step::Wait(s_->options_.lock.retry_ms,
                    [this, id, then, fail, deadline] { return Acquire(id, then, fail, deadline); });
}

// python_locks: the table lock is ours; now the Python backend's rows.
// Look (a Python holder: yield), show ourselves with a marker, wait the
// settle time (a Python process that saw the lock free before the marker
// has written its row by then), look again. Yielding releases the table
// lock and tries again until the deadline.
Step StoreSteps::ClaimFromPython(const std::string& id, const LockPtr& m, int64_t deadline, std::function<Step(LockPtr)> then,
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

}  // namespace chstate
