// The bridge to the Python ClickHouse backend's lock: a state id locked by
// one of its processes is waited for (core/store_lock.cc), and with
// python_locks a free one is claimed so that both kinds of process exclude
// each other.
#include "core/store.h"

#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "core/quoting.h"
#include "core/response.h"
#include "core/store_steps.h"

namespace chstate {
namespace part {
namespace {

// python_locks: the table lock `m` is ours; now the Python backend's rows
// (docs/lock.md, "A mixed fleet"). Read the greatest block number of their
// table; look for a Python row (one: yield); write the marker; look again,
// with the parts committed since. A Python row then, or any part but the
// marker's own unmerged one (a Python candidate the marker may have merged
// away), yields too. Nothing here waits: what the reads show decides, not
// how long anything took. Ends with *holder naming the Python row seen, or
// *busy set for such a part (neither: the id is ours); fails when a read or
// the marker fails (the caller releases the lock, marker first).
class ClaimFromPythonOp final : public StorePart {
 public:
  ClaimFromPythonOp(StoreSteps& s, StoreSteps::LockPtr m, std::string* holder, bool* busy)
      : StorePart(s), m_(std::move(m)), holder_(holder), busy_(busy) {}
  std::string Where() const override {
    const std::string id = PrintableId(m_->state_id());
    switch (stage_) {
      case Stage::kMarking: return absl::StrCat("showing the lock on \"", id, "\" to the Python backend");
      case Stage::kReadingBlocks:
        return absl::StrCat("reading the parts of the Python backend's lock table for \"", id, "\"");
      default: return absl::StrCat("looking for the Python backend's lock on \"", id, "\"");
    }
  }

  Next Resume(const Reply& r) override {
    switch (stage_) {
      case Stage::kStart:
        holder_->clear();
        *busy_ = false;
        stage_ = Stage::kReadingBlocks;
        return Next::Send(s_.st().PythonLockBlocks());
      case Stage::kReadingBlocks: {
        absl::StatusOr<Rows> rows = s_.AnswerRows(r, "reading the parts of the Python backend's lock table", 2);
        if (!rows.ok()) return Next::Fail(rows.status());
        absl::StatusOr<int64_t> blocks = Blocks(*rows);
        if (!blocks.ok()) return Next::Fail(blocks.status());
        blocks_ = *blocks;
        stage_ = Stage::kLookingBefore;
        return Next::Send(s_.st().ForeignLockRows(m_->state_id()));
      }
      case Stage::kLookingBefore: {
        absl::StatusOr<Rows> rows = s_.AnswerRows(r, "looking for the Python backend's lock rows", 2);
        if (!rows.ok()) return Next::Fail(rows.status());
        if (!rows->empty()) {
          *holder_ = (*rows)[0][0].value_or("");
          return Next::Done();
        }
        stage_ = Stage::kMarking;
        return Next::Send(s_.st().InsertLockMarker(m_->state_id(), m_->lock_id(), MarkerAheadS(s_.options())));
      }
      case Stage::kMarking: {
        absl::StatusOr<std::string> done = s_.Answer(r, "showing the lock to the Python backend");
        if (!done.ok()) return Next::Fail(done.status());
        stage_ = Stage::kLookingAfter;
        return Next::Send(s_.st().ForeignLockRowsAndParts(m_->state_id(), blocks_));
      }
      case Stage::kLookingAfter: {
        absl::StatusOr<Rows> rows = s_.AnswerRows(r, "looking for the Python backend's lock rows", 2);
        if (!rows.ok()) return Next::Fail(rows.status());
        Rows parts_row;
        for (const Row& row : *rows) {
          if (row[1].value_or("") == "2") {
            parts_row.push_back(row);
          } else {
            *holder_ = row[0].value_or("");
            return Next::Done();
          }
        }
        absl::StatusOr<int64_t> parts = Blocks(parts_row);
        if (!parts.ok()) return Next::Fail(parts.status());
        // The marker's own part is the only one committed since the first
        // read, unmerged: no Python candidate came between (docs/lock.md).
        if (*parts != 1) *busy_ = true;
        return Next::Done();
      }
    }
    return Next::Fail(absl::InternalError("claim from Python: no such stage"));
  }

 private:
  enum class Stage { kStart, kReadingBlocks, kLookingBefore, kMarking, kLookingAfter };

  // The one number of Statements::PythonLockBlocks or of the parts' row of
  // ForeignLockRowsAndParts.
  static absl::StatusOr<int64_t> Blocks(const Rows& rows) {
    int64_t n = 0;
    if (rows.size() != 1 || !absl::SimpleAtoi(rows[0][0].value_or(""), &n)) {
      return absl::InternalError(absl::StrCat("the server's answer to the read of the Python backend's lock table's "
                                              "parts is not one number (", rows.size(), " rows)"));
    }
    return n;
  }

  Stage stage_ = Stage::kStart;
  StoreSteps::LockPtr m_;
  std::string* holder_;
  bool* busy_;
  int64_t blocks_ = 0;  // the greatest block number before the first look
};

}  // namespace

std::unique_ptr<Op> ClaimFromPython(StoreSteps& s, StoreSteps::LockPtr m, std::string* holder, bool* busy) {
  return std::make_unique<ClaimFromPythonOp>(s, std::move(m), holder, busy);
}

int64_t MarkerAheadS(const StoreOptions& o) {
  // Twice the stale window, in whole seconds rounded up: the lease a
  // renewal gives (less than the window from its send) ends before the
  // marker written just before it stops being the newest row (docs/lock.md).
  return 2 * ((o.lock.stale_ms + 999) / 1000);
}

absl::Status PythonHolds(const StoreOptions& o, const std::string& id, const std::string& python_lock_id) {
  if (python_lock_id.empty()) {
    return absl::AbortedError(absl::StrCat(
        "state id \"", PrintableId(id), "\" was not free within the lock timeout: every attempt found ", o.table,
        "_lock (the Python ClickHouse backend's lock table) written to between chstate's two looks, so a Python "
        "process may have been taking the lock; try again, or raise the lock wait"));
  }
  return absl::AbortedError(absl::StrCat(
      "state id \"", PrintableId(id), "\" is locked by a process of the Python ClickHouse backend (its lock row ",
      PrintableId(python_lock_id), " in ", o.table, "_lock); it was not free within the lock timeout"));
}

}  // namespace part
}  // namespace chstate
