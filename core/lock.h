// Per-state-id advisory lock settings and the decision rules the store's lock
// steps follow.
//
//   chstate::LockOptions lock;
//   lock.timeout_ms = 10000;   // Meltano's lock_timeout_seconds
//   lock.retry_ms = 1000;      // Meltano's lock_retry_seconds
//
// The table lock (core/table_lock.h; one server, either dialect; cluster mode
// uses the claims lock of core/claims_lock.h instead): the lock for an id is a table whose name derives
// from the id. CREATE TABLE without IF NOT EXISTS is an atomic test-and-set on
// one server: exactly one of any number of concurrent creators succeeds and
// the rest get code 57. The table records the holder's random lock id and is
// timestamped by the server. No fixed sleep is needed on the uncontended path:
// acquire is one round trip, release two.
// A lock older than `stale_ms` (by the server's clock) is taken over: the taker
// RENAMEs it aside (atomic: one taker wins) and checks it moved the lock it
// judged stale. The renamed table stays as a tombstone (a taker that lost the
// race may still read it); `chstate init` drops tombstones older than twice
// the stale window.
#ifndef CHSTATE_CORE_LOCK_H_
#define CHSTATE_CORE_LOCK_H_

#include <cstdint>
#include <string>

#include "absl/strings/string_view.h"
#include "core/defaults.h"

namespace chstate {

struct LockOptions {
  int64_t timeout_ms = kDefaultLockTimeoutMs;  // give up after this long
  int64_t retry_ms = kDefaultLockRetryMs;      // wait between attempts while the lock is held
  int64_t stale_ms = kDefaultStaleLockMs;      // a lock older than this is taken over
};

// What a contender does after its CREATE failed because the lock exists.
enum class LockVerdict {
  kTakeOver,   // the holder is stale
  kWait,       // held; wait retry_ms (or until the deadline)
  kGiveUp,     // held and the deadline has passed
};

// A lock another process holds, `age_s` old by the server clock.
LockVerdict DecideOnHeldLock(int64_t age_s, int64_t now_ms, int64_t deadline_ms, const LockOptions& options);

// A lock id from host-supplied random bytes: 32 hex digits.
std::string MakeLockId(absl::string_view random);

}  // namespace chstate

#endif  // CHSTATE_CORE_LOCK_H_
