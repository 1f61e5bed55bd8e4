// The Python ClickHouse backend's lock, modelled for the mixed-fleet
// simulation (tests/sim/python_backend_lock.h).
#include "tests/sim/python_backend_lock.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/quoting.h"
#include "core/response.h"

namespace chstate::sim {
namespace {

// str(uuid.uuid4()): 32 lowercase hex digits as 8-4-4-4-12, version 4, variant 10xx.
std::string Uuid4(std::mt19937_64& rng) {
  static const char kHex[] = "0123456789abcdef";
  std::string out;
  for (int i = 0; i < 32; ++i) {
    int d = static_cast<int>(rng() % 16);
    if (i == 12) d = 4;
    if (i == 16) d = 8 + d % 4;
    if (i == 8 || i == 12 || i == 16 || i == 20) out.push_back('-');
    out.push_back(kHex[d]);
  }
  return out;
}

constexpr int64_t kSettleMs = 1000;  // LOCK_SETTLE_SECONDS

std::string Table(const Statements& st) { return absl::StrCat("`", st.schema(), "`.`", st.table(), "_lock`"); }

}  // namespace

PythonBackendLock::PythonBackendLock(const Statements& statements, std::string state_id, PythonLockVersion version,
                                     LockOptions options, double pause_prob, int64_t pause_max_ms, uint64_t seed)
    : st_(statements),
      state_id_(std::move(state_id)),
      version_(version),
      options_(options),
      pause_prob_(pause_prob),
      pause_max_ms_(pause_max_ms),
      rng_(seed) {}

std::string PythonBackendLock::StateName() const {
  static const char* const kNames[] = {"py:idle",    "py:reading",     "py:cleaning", "py:rereading", "py:inserting",
                                       "py:settling", "py:checking",   "py:withdrawing", "py:backing-off", "py:held",
                                       "py:releasing", "py:done",      "py:pausing"};
  return kNames[state_];
}

SqlRequest PythonBackendLock::FirstRead() const {
  SqlRequest r;
  r.purpose = "python_first_read";
  r.sql = absl::StrCat("SELECT lock_id FROM ", Table(st_), " FINAL WHERE state_id = ", QuoteStringLiteral(state_id_),
                       " ORDER BY lock_id LIMIT 1 FORMAT TabSeparated");
  return r;
}

SqlRequest PythonBackendLock::DeleteStale() const {
  SqlRequest r;
  r.purpose = "python_delete_stale";
  r.sql = absl::StrCat("ALTER TABLE ", Table(st_), " DELETE WHERE locked_at < now() - ", kPythonLockWindowS);
  return r;
}

SqlRequest PythonBackendLock::Insert() const {
  SqlRequest r;
  r.purpose = "python_insert";
  r.idempotent = false;
  r.sql = absl::StrCat("INSERT INTO ", Table(st_), " (state_id, lock_id) VALUES (", QuoteStringLiteral(state_id_),
                       ", ", QuoteStringLiteral(lock_id_), ")");
  return r;
}

SqlRequest PythonBackendLock::EveryRow() const {
  SqlRequest r;
  r.purpose = "python_every_row";
  r.sql = absl::StrCat("SELECT lock_id FROM ", Table(st_), " WHERE state_id = ", QuoteStringLiteral(state_id_),
                       " FORMAT TabSeparated");
  return r;
}

SqlRequest PythonBackendLock::DeleteOwn() const {
  SqlRequest r;
  r.purpose = "python_delete_own";
  r.sql = absl::StrCat("ALTER TABLE ", Table(st_), " DELETE WHERE state_id = ", QuoteStringLiteral(state_id_),
                       " AND lock_id = ", QuoteStringLiteral(lock_id_));
  return r;
}

void PythonBackendLock::Send(SqlRequest r, State next) {
  state_ = next;
  EmitSql(std::move(r));
}

void PythonBackendLock::Step(SqlRequest r, State next) {
  std::uniform_real_distribution<double> u(0, 1);
  if (pause_max_ms_ > 0 && u(rng_) < pause_prob_) {
    paused_ = std::move(r);
    paused_next_ = next;
    return Timer(1 + static_cast<int64_t>(rng_() % pause_max_ms_), kPausing);
  }
  Send(std::move(r), next);
}

void PythonBackendLock::Timer(int64_t ms, State next) {
  state_ = next;
  EmitTimer(ms);
}

void PythonBackendLock::Fail(const std::string& why) {
  state_ = kDone;
  EmitFailed(absl::AbortedError(why));
}

void PythonBackendLock::Acquire(const Inputs& in) {
  if (state_ != kIdle) return Fail("acquire twice");
  lock_id_ = Uuid4(rng_);
  deadline_ms_ = in.now_ms + options_.timeout_ms;
  Attempt(in);
}

void PythonBackendLock::Attempt(const Inputs& in) {
  if (in.now_ms >= deadline_ms_) return Fail("StateIDLockedError: timed out");
  Step(FirstRead(), kReading);
}

void PythonBackendLock::Won(const Inputs& in) {
  state_ = kHeld;
  held_until_ms_ = in.now_ms + 1000LL * 1000 * 1000;  // no lease: held until released
  Emit(SimAction::Kind::kAcquired);
}

void PythonBackendLock::Release(const Inputs&) {
  if (state_ != kHeld) return Fail("release while not held");
  Step(DeleteOwn(), kReleasing);
}

void PythonBackendLock::OnTimer(const Inputs& in) {
  switch (state_) {
    case kPausing: {
      SqlRequest r = std::move(*paused_);
      paused_.reset();
      return Send(std::move(r), paused_next_);
    }
    case kSettling: return Step(EveryRow(), kChecking);
    case kBackingOff: return Attempt(in);
    default: return;  // a timer in any other state is stale
  }
}

void PythonBackendLock::OnResponse(const SqlResponse& response, const Inputs& in) {
  absl::Status s = CheckResponse(response, "python backend lock");
  if (!s.ok()) return Fail(std::string(s.message()));  // the backend raises; its row may stay
  absl::StatusOr<Rows> rows = ParseTabSeparated(response.body, 1);
  switch (state_) {
    case kReading:
    case kRereading:
      if (!rows.ok()) return Fail("bad rows");
      if (rows->empty()) return Step(Insert(), kInserting);
      if (state_ == kReading) return Step(DeleteStale(), kCleaning);
      return Timer(options_.retry_ms, kBackingOff);
    case kCleaning:
      return Step(FirstRead(), kRereading);
    case kInserting:
      if (version_ == PythonLockVersion::kOld) return Step(FirstRead(), kChecking);
      return Timer(kSettleMs, kSettling);
    case kChecking: {
      if (!rows.ok()) return Fail("bad rows");
      // Published: min() of every row; old: the FINAL row.
      std::string least;
      for (const Row& row : *rows) {
        const std::string id = row[0].value_or("");
        if (least.empty() || id < least) least = id;
      }
      if (!rows->empty() && least == lock_id_) return Won(in);
      return Step(DeleteOwn(), kWithdrawing);
    }
    case kWithdrawing:
      return Timer(options_.retry_ms, kBackingOff);
    case kReleasing:
      state_ = kDone;
      Emit(SimAction::Kind::kReleased);
      return;
    default:
      return Fail(absl::StrCat("unexpected answer in state ", StateName()));
  }
}

}  // namespace chstate::sim
