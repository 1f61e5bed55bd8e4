// The seed's ReplacingMergeTree lock, kept only to prove that the simulation's
// checker catches a lock that is not exclusive.
#include "tests/sim/naive_lock.h"

#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "core/quoting.h"
#include "core/response.h"

namespace chstate::sim {

NaiveLock::NaiveLock(const Statements& statements, std::string state_id, LockOptions options, int64_t settle_ms)
    : st_(statements), state_id_(std::move(state_id)), options_(options), settle_ms_(settle_ms) {}

std::string NaiveLock::StateName() const {
  static const char* const kNames[] = {"idle",    "ensuring-table", "checking", "backing-off", "inserting",
                                       "settling", "reading",       "held",     "releasing",   "done"};
  return kNames[state_];
}

SqlRequest NaiveLock::SelectFinal() const {
  SqlRequest r;
  r.purpose = "naive_select";
  r.url_params.emplace_back("wait_end_of_query", "1");
  r.sql = absl::StrCat("SELECT lock_id, toInt64(locked_at), toInt64(now()) FROM `", st_.schema(), "`.`", st_.table(),
                       "_lock` FINAL WHERE state_id = ", QuoteStringLiteral(state_id_), " FORMAT TabSeparated");
  return r;
}

SqlRequest NaiveLock::InsertCandidate() const {
  SqlRequest r;
  r.purpose = "naive_insert";
  r.idempotent = false;
  r.sql = absl::StrCat("INSERT INTO `", st_.schema(), "`.`", st_.table(), "_lock` (state_id, lock_id) VALUES (",
                       QuoteStringLiteral(state_id_), ", ", QuoteStringLiteral(lock_id_), ")");
  return r;
}

SqlRequest NaiveLock::DeleteOwn() const {
  SqlRequest r;
  r.purpose = "naive_delete";
  r.sql = absl::StrCat("ALTER TABLE `", st_.schema(), "`.`", st_.table(), "_lock` DELETE WHERE state_id = ",
                       QuoteStringLiteral(state_id_), " AND lock_id = ", QuoteStringLiteral(lock_id_));
  return r;
}

void NaiveLock::Send(SqlRequest r, State next) {
  state_ = next;
  EmitSql(std::move(r));
}

void NaiveLock::Timer(int64_t ms, State next) {
  state_ = next;
  EmitTimer(ms);
}

void NaiveLock::Fail(const std::string& why) {
  state_ = kDone;
  EmitFailed(absl::AbortedError(why));
}

void NaiveLock::Acquire(const Inputs& in) {
  if (state_ != kIdle) return Fail("acquire twice");
  lock_id_ = MakeLockId(in.random);
  deadline_ms_ = in.now_ms + options_.timeout_ms;
  Send(st_.CreateLockTable(), kEnsuringTable);
}

void NaiveLock::Release(const Inputs&) {
  if (state_ != kHeld) return Fail("release while not held");
  lease_deadline_ms_ = 0;
  Send(DeleteOwn(), kReleasing);
}

void NaiveLock::Check(const Inputs& in) {
  if (in.now_ms >= deadline_ms_) return Fail("timed out");
  Send(SelectFinal(), kChecking);
}

void NaiveLock::OnTimer(const Inputs& in) {
  if (state_ == kBackingOff) return Check(in);
  if (state_ == kSettling) return Send(SelectFinal(), kReading);
  // A timer in any other state is stale; ignore it.
}

void NaiveLock::OnResponse(const SqlResponse& response, const Inputs& in) {
  absl::Status s = CheckResponse(response, "naive lock");
  if (!s.ok()) return Fail(std::string(s.message()));
  switch (state_) {
    case kEnsuringTable:
      return Check(in);
    case kChecking:
    case kReading: {
      absl::StatusOr<Rows> rows = ParseTabSeparated(response.body, 3);
      if (!rows.ok()) return Fail(std::string(rows.status().message()));
      // The lowest lock id among fresh rows wins.
      std::string winner;
      for (const Row& row : *rows) {
        int64_t at = 0, now = 0;
        if (!row[0] || !row[1] || !row[2] || !absl::SimpleAtoi(*row[1], &at) || !absl::SimpleAtoi(*row[2], &now)) {
          return Fail("bad row");
        }
        bool fresh = (now - at) * 1000 <= options_.stale_ms;
        if (fresh && (winner.empty() || *row[0] < winner)) winner = *row[0];
      }
      if (state_ == kChecking) {
        if (!winner.empty() && winner != lock_id_) return Timer(options_.retry_ms, kBackingOff);
        insert_sent_ms_ = in.now_ms;
        return Send(InsertCandidate(), kInserting);
      }
      if (winner == lock_id_) {
        state_ = kHeld;
        lease_deadline_ms_ = insert_sent_ms_ + options_.stale_ms - LeaseMarginMs(options_);
        Emit(SimAction::Kind::kAcquired);
        return;
      }
      return Timer(options_.retry_ms, kBackingOff);
    }
    case kInserting:
      return Timer(settle_ms_, kSettling);
    case kReleasing:
      state_ = kDone;
      Emit(SimAction::Kind::kReleased);
      return;
    default:
      return Fail(absl::StrCat("unexpected answer in state ", StateName()));
  }
}

}  // namespace chstate::sim
