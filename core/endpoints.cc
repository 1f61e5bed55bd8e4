#include "core/endpoints.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/defaults.h"

namespace chstate {

Endpoints::Endpoints(std::vector<Endpoint> list, int64_t down_ms)
    : list_(std::move(list)), down_ms_(down_ms), down_until_ms_(list_.size(), 0) {}

std::optional<size_t> Endpoints::Pick(int64_t now_ms, const std::vector<size_t>& tried) const {
  auto untried = [&](size_t i) { return std::find(tried.begin(), tried.end(), i) == tried.end(); };
  std::optional<size_t> best;
  // In list order: the first untried host not marked down; failing that,
  // the untried host whose mark runs out first.
  for (size_t i = 0; i < list_.size(); ++i) {
    if (!untried(i)) continue;
    if (!Down(i, now_ms)) return i;
    if (!best || DownUntil(i) < DownUntil(*best)) best = i;
  }
  return best;
}

void Endpoints::Failed(size_t i, int64_t now_ms) { down_until_ms_[i] = now_ms + down_ms_; }

void Endpoints::Answered(size_t i) { down_until_ms_[i] = 0; }

std::string Endpoints::Describe(const Endpoint& e) {
  const bool ipv6 = e.host.find(':') != std::string::npos;
  return absl::StrCat(ipv6 ? "[" : "", e.host, ipv6 ? "]" : "", ":", e.port);
}

std::string Endpoints::Describe() const {
  std::vector<std::string> parts;
  for (const Endpoint& e : list_) parts.push_back(Describe(e));
  if (parts.size() <= 1) return parts.empty() ? "" : parts[0];
  const std::string last = parts.back();
  parts.pop_back();
  return absl::StrCat(absl::StrJoin(parts, ", "), " and ", last);
}

}  // namespace chstate
