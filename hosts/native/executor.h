// The native host's transport: runs SqlRequests against ClickHouse's HTTP(S)
// interface with cpp-httplib, and pumps core Tasks to completion.
//
//   chstate::native::HttpExecutor exec(config);
//   absl::StatusOr<chstate::Result> r = chstate::native::RunTask(*store->Get(id), exec);
//
// Credentials travel in X-ClickHouse-User / X-ClickHouse-Key headers, never in
// the URL. One keep-alive connection is reused for every request. The pump
// sends each request once, within the request's own timeout_ms, and sleeps
// when told: whether and when a failed request is sent again is the core's
// decision (core/task.h), the same for every host.
#ifndef CHSTATE_HOSTS_NATIVE_EXECUTOR_H_
#define CHSTATE_HOSTS_NATIVE_EXECUTOR_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "core/config.h"
#include "core/defaults.h"
#include "core/sql_request.h"
#include "core/task.h"

namespace chstate::native {

struct ExecutorOptions {
  int64_t connect_timeout_ms = kDefaultConnectTimeoutMs;
};

class HttpExecutor {
 public:
  HttpExecutor(const ConnectionConfig& config, ExecutorOptions options = {});
  ~HttpExecutor();
  HttpExecutor(const HttpExecutor&) = delete;
  HttpExecutor& operator=(const HttpExecutor&) = delete;

  // Sends `request` once, allowing it request.timeout_ms (when set) to be
  // sent and answered. Never throws. Transport failures come back with
  // transport_ok = false, whether the request may have been delivered, and a
  // message that names host:port and what to check (never the password).
  SqlResponse Execute(const SqlRequest& request);

  // "host:port", for messages.
  const std::string& endpoint() const { return endpoint_; }

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  std::string endpoint_;
};

// Drives `task` to its end: runs SQL through `exec`, sleeps for waits, feeds
// the monotonic clock and fresh random bytes (from the OS) with every input.
absl::StatusOr<Result> RunTask(Task& task, HttpExecutor& exec);

// 32 bytes from the OS random source.
std::string OsRandomBytes();
// Milliseconds on a monotonic clock.
int64_t MonotonicMs();

}  // namespace chstate::native

#endif  // CHSTATE_HOSTS_NATIVE_EXECUTOR_H_
