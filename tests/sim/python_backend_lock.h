// A model of the Python ClickHouse state backend's lock
// (meltano-state-backend-clickhouse, /work/shared/notes/meltano.md), for the
// mixed-fleet simulation: chstate stores with python_locks and processes of
// this model lock one state id on one server. Two versions:
//
// - kPublished (f6ec0ce): per attempt, read FINAL ORDER BY lock_id LIMIT 1;
//   if a row is there, delete rows older than 300 s and read again; if none,
//   insert a candidate (state_id, uuid4); sleep the settle time (1 s); read
//   every row of the id without FINAL; it holds iff min(lock_ids) is its own,
//   else it deletes its row. Then sleep the retry and try again.
// - kOld (before 6c0f559): the same without the settle, and the check is the
//   FINAL read of the first step (the newest row by locked_at).
//
// Release deletes its row. The model has no lease (the backend has none):
// it holds until it releases. Between any two of its steps it may pause for
// up to pause_max_ms (a slow client, a busy server answering late), with
// probability pause_prob per step: nothing in the model relies on time.
#ifndef CHSTATE_TESTS_SIM_PYTHON_BACKEND_LOCK_H_
#define CHSTATE_TESTS_SIM_PYTHON_BACKEND_LOCK_H_

#include <cstdint>
#include <deque>
#include <optional>
#include <random>
#include <string>

#include "core/statements.h"
#include "tests/sim/lock_sim.h"

namespace chstate::sim {

enum class PythonLockVersion { kNone, kPublished, kOld };

class PythonBackendLock : public QueuedSimLock {
 public:
  PythonBackendLock(const Statements& statements, std::string state_id, PythonLockVersion version,
                    LockOptions options, double pause_prob, int64_t pause_max_ms, uint64_t seed);

  void Acquire(const Inputs& in) override;
  void Release(const Inputs& in) override;
  void OnResponse(const SqlResponse& response, const Inputs& in) override;
  void OnTimer(const Inputs& in) override;
  bool LeaseValid(int64_t now_ms) const override { return state_ == kHeld && now_ms < held_until_ms_; }
  int64_t lease_deadline_ms() const override { return state_ == kHeld ? held_until_ms_ : 0; }
  std::string lock_id() const override { return lock_id_; }
  std::string StateName() const override;
  bool Held() const override { return state_ == kHeld; }

  // The statements, as the sim server recognises them.
  SqlRequest FirstRead() const;    // FINAL ORDER BY lock_id LIMIT 1
  SqlRequest DeleteStale() const;  // rows older than 300 s, every id
  SqlRequest Insert() const;       // the candidate
  SqlRequest EveryRow() const;     // the published check: no FINAL
  SqlRequest DeleteOwn() const;

 private:
  enum State { kIdle, kReading, kCleaning, kRereading, kInserting, kSettling, kChecking, kWithdrawing,
               kBackingOff, kHeld, kReleasing, kDone, kPausing };

  // Sends `r` (into state `next`), after a pause if one is drawn.
  void Step(SqlRequest r, State next);
  void Send(SqlRequest r, State next);
  void Timer(int64_t ms, State next);
  void Fail(const std::string& why);
  void Attempt(const Inputs& in);
  void Won(const Inputs& in);

  const Statements& st_;
  std::string state_id_;
  PythonLockVersion version_;
  LockOptions options_;
  double pause_prob_;
  int64_t pause_max_ms_;
  std::mt19937_64 rng_;
  State state_ = kIdle;
  std::string lock_id_;
  int64_t deadline_ms_ = 0;
  int64_t held_until_ms_ = 0;
  // A step held back by a pause: sent when its timer fires.
  std::optional<SqlRequest> paused_;
  State paused_next_ = kIdle;
};

}  // namespace chstate::sim

#endif  // CHSTATE_TESTS_SIM_PYTHON_BACKEND_LOCK_H_
