// One ClickHouse server: where a request goes. A connection may name several
// (docs/cluster.md); the core picks one for every request
// (core/endpoints.h) and the host's transport connects where it is told.
#ifndef CHSTATE_CORE_ENDPOINT_H_
#define CHSTATE_CORE_ENDPOINT_H_

#include <string>

namespace chstate {

struct Endpoint {
  std::string host;  // a name or address; IPv6 without brackets
  int port = 0;
  bool operator==(const Endpoint& o) const { return host == o.host && port == o.port; }
  bool operator!=(const Endpoint& o) const { return !(*this == o); }
};

}  // namespace chstate

#endif  // CHSTATE_CORE_ENDPOINT_H_
