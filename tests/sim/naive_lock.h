// Negative control for the lock simulation: the seed's lock design, which is
// NOT mutually exclusive. The simulation must catch it overlapping.
//
// Design (on the Python backend's `<table>_lock` ReplacingMergeTree(locked_at)
// table ORDER BY state_id): look for a fresh row of another holder (wait if
// there is one), insert a candidate row (state_id, lock_id, now()), wait a
// settle period, read the rows with FINAL; the lowest lock id among the fresh
// rows read wins. Release deletes the holder's row. It has no renewal; its
// "lease" is the stale window from its insert, minus the same margin.
//
// Why it fails: FINAL keeps one row per state_id (the greatest locked_at, the
// later insert among equals), a candidate that is not yet visible when
// another contender reads is simply absent, and a merge or a delete changes
// which row FINAL picks: two contenders can each read their own row.
#ifndef CHSTATE_TESTS_SIM_NAIVE_LOCK_H_
#define CHSTATE_TESTS_SIM_NAIVE_LOCK_H_

#include <cstdint>
#include <deque>
#include <string>

#include "core/statements.h"
#include "tests/sim/lock_sim.h"

namespace chstate::sim {

class NaiveLock : public QueuedSimLock {
 public:
  NaiveLock(const Statements& statements, std::string state_id, LockOptions options, int64_t settle_ms);

  void Acquire(const Inputs& in) override;
  void Release(const Inputs& in) override;
  void OnResponse(const SqlResponse& response, const Inputs& in) override;
  void OnTimer(const Inputs& in) override;
  bool LeaseValid(int64_t now_ms) const override { return state_ == kHeld && now_ms < lease_deadline_ms_; }
  int64_t lease_deadline_ms() const override { return lease_deadline_ms_; }
  std::string lock_id() const override { return lock_id_; }
  std::string StateName() const override;
  bool Held() const override { return state_ == kHeld; }

 private:
  enum State { kIdle, kEnsuringTable, kChecking, kBackingOff, kInserting, kSettling, kReading, kHeld,
               kReleasing, kDone };

  void Send(SqlRequest r, State next);
  void Timer(int64_t ms, State next);
  void Fail(const std::string& why);
  void Check(const Inputs& in);

  SqlRequest SelectFinal() const;
  SqlRequest InsertCandidate() const;
  SqlRequest DeleteOwn() const;

  const Statements& st_;
  std::string state_id_;
  LockOptions options_;
  int64_t settle_ms_;
  State state_ = kIdle;
  std::string lock_id_;
  int64_t deadline_ms_ = 0;
  int64_t insert_sent_ms_ = 0;
  int64_t lease_deadline_ms_ = 0;
};

}  // namespace chstate::sim

#endif  // CHSTATE_TESTS_SIM_NAIVE_LOCK_H_
