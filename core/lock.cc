// Lock decision rules shared by the store's lock steps.
#include "core/lock.h"

#include "core/quoting.h"

namespace chstate {

LockVerdict DecideOnHeldLock(int64_t age_s, int64_t now_ms, int64_t deadline_ms, const LockOptions& options) {
  // Whole seconds from the server: a lock is stale only once it is older
  // than the window by a full second, never early.
  if (age_s * 1000 > options.stale_ms) return LockVerdict::kTakeOver;
  if (now_ms >= deadline_ms) return LockVerdict::kGiveUp;
  return LockVerdict::kWait;
}

std::string MakeLockId(absl::string_view random) { return HexEncode(random.substr(0, 16)); }

}  // namespace chstate
