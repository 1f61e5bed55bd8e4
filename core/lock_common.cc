// What both lock machines share (lock_common.h): the lease margin, the
// jitter, counting requests without an answer, and the wording of outcomes.
// The inspections' parsers are in lock_inspection.cc.
#include "core/lock_common.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "core/clickhouse_errors.h"
#include "core/quoting.h"
#include "core/response.h"

namespace chstate {

int64_t LeaseMarginMs(const LockOptions& options) {
  return std::max<int64_t>(options.stale_ms / 10, 100);
}

int64_t StaleWindowSeconds(const LockOptions& options) { return (options.stale_ms + 999) / 1000; }

int64_t Jitter(absl::string_view random, int64_t base_ms) {
  uint64_t r = 0;
  for (size_t i = 0; i < random.size() && i < 8; ++i) r = (r << 8) | static_cast<unsigned char>(random[i]);
  return base_ms / 2 + static_cast<int64_t>(r % static_cast<uint64_t>(std::max<int64_t>(base_ms, 1)));
}

LockAnswer AnswerOf(const SqlResponse& r) {
  absl::Status s = CheckResponse(r, "locking");
  if (s.ok()) return LockAnswer::kOk;
  std::optional<int> code = ClickHouseCode(s);
  if (code == kCodeTableAlreadyExists) return LockAnswer::kExists;
  if (code == kCodeUnknownTable || code == kCodeUnknownDatabase || code == kCodeTableIsDropped) {
    return LockAnswer::kMissing;
  }
  return LockAnswer::kError;
}

const char* LockAnswerName(LockAnswer a) {
  switch (a) {
    case LockAnswer::kOk: return "ok";
    case LockAnswer::kExists: return "exists";
    case LockAnswer::kMissing: return "missing";
    case LockAnswer::kError: return "error";
  }
  return "?";
}

void NoAnswerCount::Count(const SqlResponse& r) {
  last_ = CheckResponse(r, "taking the lock");
  if (last_.ok()) last_ = absl::UnavailableError("no answer from ClickHouse");
  ++in_a_row_;
}

absl::Status NoAnswerCount::GaveUp(const std::string& note) const {
  return absl::Status(last_.code(), absl::StrCat(last_.message(), " (", in_a_row_,
                                                 " lock requests in a row got no answer; the lock was not taken",
                                                 note, ")"));
}

std::string WaitedOut(const SqlResponse* r, absl::string_view what) {
  if (r == nullptr) return "no answer";
  const std::optional<int> code = ResponseCode(*r);
  if (code == ch::kUnsatisfiedQuorumForPreviousWrite) return kBusyCause;
  absl::Status st = CheckResponse(*r, what);
  return st.ok() ? std::string("an unexpected answer") : std::string(st.message());
}

absl::Status LeaseRanOut(const std::string& state_id, absl::string_view request, const std::string& cause,
                         bool releasing) {
  return absl::AbortedError(absl::StrCat(
      "the lock on state id \"", PrintableId(state_id), "\" ran out while ", request, " waited out ", cause,
      ": it was not sent again past the lease, since another process may hold the lock by now. ",
      releasing ? "It was left to expire" : "Stop acting under it and release it"));
}

absl::Status AnswerError(const SqlResponse* r, absl::string_view what) {
  absl::Status s = r ? CheckResponse(*r, what) : absl::UnknownError("lock request failed");
  if (s.ok()) s = absl::InternalError(absl::StrCat("unexpected answer while ", what));
  return s;
}

absl::Status ReleaseFailed(const SqlResponse* r, const std::string& state_id, const LockOptions& options) {
  absl::Status s = r ? CheckResponse(*r, "releasing the lock") : absl::UnknownError("release failed");
  if (s.ok()) s = absl::InternalError("unexpected answer releasing the lock");
  return absl::Status(s.code(), absl::StrCat(s.message(), ". The lock on state id \"", PrintableId(state_id),
                                             "\" was not released; it expires after ", options.stale_ms / 1000,
                                             " s"));
}

}  // namespace chstate
