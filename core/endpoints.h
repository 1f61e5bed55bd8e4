// Which of a connection's hosts each request goes to (docs/cluster.md).
// Shared by every task of a store, so what one request learned about
// a host (it refused the connection, it lags behind the quorum) steers the
// next one, in every host runtime alike.
//
//   chstate::Endpoints hosts({{"h1", 8123}, {"h2", 8123}, {"h3", 8123}});
//   size_t i = hosts.Pick(now_ms, /*tried=*/{});   // the first host not down
//   // h1 refused: hosts.Failed(i, now_ms); i = hosts.Pick(now_ms, {i});
//
// The rule: the list is an order of preference. Every request goes to the
// first host not marked down; a host that failed is marked down for
// host_down_ms (kDefaultHostDownMs), skipped by later requests meanwhile,
// then tried first again (what clickhouse-client, libpq and ClickHouse's
// in_order load balancing do: all clients of a cluster meet on its first
// healthy host). A request that failed on one host tries each other host
// before it reports the failure. When every host left is marked down the
// one whose mark runs out first is tried first.
#ifndef CHSTATE_CORE_ENDPOINTS_H_
#define CHSTATE_CORE_ENDPOINTS_H_

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "core/defaults.h"
#include "core/endpoint.h"

namespace chstate {

class Endpoints {
 public:
  // A host that failed is skipped for `down_ms` (host_down_ms).
  explicit Endpoints(std::vector<Endpoint> list, int64_t down_ms = kDefaultHostDownMs);
  int64_t down_ms() const { return down_ms_; }

  size_t size() const { return list_.size(); }
  const Endpoint& at(size_t i) const { return list_[i]; }
  const std::vector<Endpoint>& list() const { return list_; }

  // The host for the next send of a request that already went to `tried`
  // (indices), or nullopt when every host has been tried.
  std::optional<size_t> Pick(int64_t now_ms, const std::vector<size_t>& tried) const;
  // Host i gave no answer, or a replica-level error: skip it for down_ms.
  void Failed(size_t i, int64_t now_ms);
  // Host i answered: it is down no more.
  void Answered(size_t i);
  bool Down(size_t i, int64_t now_ms) const { return DownUntil(i) > now_ms; }
  // When host i's down mark runs out (0: not marked).
  int64_t DownUntil(size_t i) const { return down_until_ms_[i]; }

  // "h1:8123, h2:8123 and h3:8123" (IPv6 in brackets), for messages.
  std::string Describe() const;
  static std::string Describe(const Endpoint& e);

 private:
  std::vector<Endpoint> list_;
  int64_t down_ms_;
  std::vector<int64_t> down_until_ms_;  // per host
};

}  // namespace chstate

#endif  // CHSTATE_CORE_ENDPOINTS_H_
