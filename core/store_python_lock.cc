// The bridge to the Python ClickHouse backend's lock: a state id locked by
// one of its processes is waited for (core/store_lock.cc), and with
// python_locks a free one is claimed so that both kinds of process exclude
// each other.
#include "core/store.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "core/quoting.h"
#include "core/response.h"
#include "core/store_steps.h"

namespace chstate {
namespace part {
namespace {

// python_locks: the table lock `m` is ours; now the Python backend's rows.
// Look (a Python holder: yield), show ourselves with a marker, wait the
// settle time (a Python process that saw the lock free before the marker
// has written its row by then), look again. Ends with the Python holder
// seen in *holder (empty: the id is ours); fails when a look or the marker
// fails (the caller releases the lock, marker first).
class ClaimFromPythonOp final : public StorePart {
 public:
  ClaimFromPythonOp(StoreSteps& s, StoreSteps::LockPtr m, std::string* holder)
      : StorePart(s), m_(std::move(m)), holder_(holder) {}
  std::string Where() const override {
    const std::string id = PrintableId(m_->state_id());
    switch (stage_) {
      case Stage::kMarking: return absl::StrCat("showing the lock on \"", id, "\" to the Python backend");
      case Stage::kSettling: return absl::StrCat("letting the Python backend see the lock on \"", id, "\"");
      default: return absl::StrCat("looking for the Python backend's lock on \"", id, "\"");
    }
  }

  Next Resume(const Reply& r) override {
    switch (stage_) {
      case Stage::kStart:
        holder_->clear();
        stage_ = Stage::kLookingBefore;
        return Look();
      case Stage::kLookingBefore:
      case Stage::kLookingAfter: {
        absl::StatusOr<Rows> rows = s_.AnswerRows(r, "looking for the Python backend's lock rows", 2);
        if (!rows.ok()) return Next::Fail(rows.status());
        if (!rows->empty()) {
          *holder_ = (*rows)[0][0].value_or("");
          return Next::Done();
        }
        if (stage_ == Stage::kLookingAfter) return Next::Done();
        stage_ = Stage::kMarking;
        return Next::Send(s_.st().InsertLockMarker(m_->state_id(), m_->lock_id()));
      }
      case Stage::kMarking: {
        absl::StatusOr<std::string> done = s_.Answer(r, "showing the lock to the Python backend");
        if (!done.ok()) return Next::Fail(done.status());
        stage_ = Stage::kSettling;
        return Next::Wait(TimerKind::kPythonSettle, kDefaultPythonLockSettleMs);
      }
      case Stage::kSettling:
        stage_ = Stage::kLookingAfter;
        return Look();
    }
    return Next::Fail(absl::InternalError("claim from Python: no such stage"));
  }

 private:
  enum class Stage { kStart, kLookingBefore, kMarking, kSettling, kLookingAfter };
  Next Look() { return Next::Send(s_.st().ForeignLockRows(m_->state_id())); }

  Stage stage_ = Stage::kStart;
  StoreSteps::LockPtr m_;
  std::string* holder_;
};

}  // namespace

std::unique_ptr<Op> ClaimFromPython(StoreSteps& s, StoreSteps::LockPtr m, std::string* holder) {
  return std::make_unique<ClaimFromPythonOp>(s, std::move(m), holder);
}

absl::Status PythonHolds(const StoreOptions& o, const std::string& id, const std::string& python_lock_id) {
  return absl::AbortedError(absl::StrCat(
      "state id \"", PrintableId(id), "\" is locked by a process of the Python ClickHouse backend (its lock row ",
      PrintableId(python_lock_id), " in ", o.table, "_lock); it was not free within the lock timeout"));
}

}  // namespace part
}  // namespace chstate
