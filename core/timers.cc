// The table of every deadline the core keeps (timers.h).
#include "core/timers.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace chstate {

const char* TimerKindName(TimerKind kind) {
  switch (kind) {
    case TimerKind::kResend: return "resend";
    case TimerKind::kLockRetry: return "lock-retry";
    case TimerKind::kQuorumBusy: return "quorum-busy";
    case TimerKind::kMutationPoll: return "mutation-poll";
    case TimerKind::kOpWait: return "op-wait";
    case TimerKind::kRenewal: return "renewal";
    case TimerKind::kLinger: return "linger";
    case TimerKind::kWaiterLook: return "waiter-look";
  }
  return "?";
}

std::optional<int64_t> TimerTable::At(TimerKind kind, const std::string& id) const {
  auto it = timers_.find(Key(kind, id));
  if (it == timers_.end()) return std::nullopt;
  return it->second;
}

std::optional<int64_t> TimerTable::Earliest(TimerKinds kinds) const {
  std::optional<int64_t> out;
  for (const auto& [key, at] : timers_) {
    if (kinds.Has(key.first) && (!out || at < *out)) out = at;
  }
  return out;
}

std::vector<TimerTable::Key> TimerTable::Due(int64_t now_ms, TimerKinds kinds) const {
  std::vector<std::pair<int64_t, Key>> due;
  for (const auto& [key, at] : timers_) {
    if (kinds.Has(key.first) && now_ms >= at) due.emplace_back(at, key);
  }
  std::stable_sort(due.begin(), due.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  std::vector<Key> out;
  out.reserve(due.size());
  for (auto& [at, key] : due) out.push_back(std::move(key));
  return out;
}

std::string TimerTable::Describe() const {
  std::string out;
  for (const auto& [key, at] : timers_) {
    absl::StrAppend(&out, TimerKindName(key.first), " ", key.second, " @", at, "\n");
  }
  return out;
}

}  // namespace chstate
