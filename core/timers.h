// What a store wakes for, in one table keyed by (kind, id), in the shape of
// quinn-proto's TimerTable: its task's waits and its held locks' renewal,
// linger and waiter-look times, so that the connection's PollTimeout is its
// earliest entry and HandleTimeout walks it. Only kinds something is woken
// for are entries; a deadline an operation merely compares the time with
// (a lock timeout, a lease's end, quorum_busy_ms) and a mark (a host down,
// an id yielded) is a plain field of its owner.
//
//   TimerTable t;
//   t.Set(TimerKind::kRenewal, "dev:a", now_ms + 3000);
//   if (std::optional<int64_t> at = t.Earliest(kIdleTimers)) sleep_until(*at);
//   for (const TimerTable::Key& k : t.Due(now_ms, kIdleTimers)) { ... }
//
// Times are on the host's monotonic clock in milliseconds, as every Inputs.
#ifndef CHSTATE_CORE_TIMERS_H_
#define CHSTATE_CORE_TIMERS_H_

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace chstate {

enum class TimerKind {
  // An operation's own waits (the task that runs it is woken).
  kResend,        // a request sent again after a transport failure (the task's back-off)
  kLockRetry,     // an acquisition's wait before its next attempt
  kQuorumBusy,    // a quorum write (or a claim) sent again after code 286 or 252
  kMutationPoll,  // 18.x: a delete's mutation looked at again
  kOpWait,        // any other wait of an operation
  // The store's idle timers (the connection wakes for them while no task runs).
  kRenewal,       // a held lock's next renewal
  kLinger,        // a lingering lock is released for real when idle until then
  kWaiterLook,    // a lingering lock's next look for processes waiting for it
};

const char* TimerKindName(TimerKind kind);

// A set of kinds, for Earliest and Due.
class TimerKinds {
 public:
  constexpr TimerKinds() = default;
  template <typename... K>
  constexpr explicit TimerKinds(K... kinds) : bits_(((1u << static_cast<unsigned>(kinds)) | ... | 0u)) {}
  constexpr bool Has(TimerKind k) const { return (bits_ >> static_cast<unsigned>(k)) & 1u; }

 private:
  unsigned bits_ = 0;
};

// The kinds a running task is woken for.
inline constexpr TimerKinds kTaskTimers{TimerKind::kResend, TimerKind::kLockRetry, TimerKind::kQuorumBusy,
                                        TimerKind::kMutationPoll, TimerKind::kOpWait};
// The kinds an idle store is woken for (Store::Tick).
inline constexpr TimerKinds kIdleTimers{TimerKind::kRenewal, TimerKind::kLinger, TimerKind::kWaiterLook};

class TimerTable {
 public:
  using Key = std::pair<TimerKind, std::string>;

  // Sets (or moves) the deadline of (kind, id).
  void Set(TimerKind kind, const std::string& id, int64_t at_ms) { timers_[Key(kind, id)] = at_ms; }
  void Clear(TimerKind kind, const std::string& id) { timers_.erase(Key(kind, id)); }
  std::optional<int64_t> At(TimerKind kind, const std::string& id) const;
  // The earliest deadline among `kinds`.
  std::optional<int64_t> Earliest(TimerKinds kinds) const;
  // The entries of `kinds` whose time has come at `now_ms`, earliest first
  // (ties in key order).
  std::vector<Key> Due(int64_t now_ms, TimerKinds kinds) const;
  // A fresh id for an owner of timers ("task 3"), unique in this table.
  std::string NewId(const char* owner) { return std::string(owner) + " " + std::to_string(++ids_); }
  // Every entry, as "kind id @at" lines (for Where and tests).
  std::string Describe() const;
  bool empty() const { return timers_.empty(); }

 private:
  std::map<Key, int64_t> timers_;
  uint64_t ids_ = 0;
};

}  // namespace chstate

#endif  // CHSTATE_CORE_TIMERS_H_
