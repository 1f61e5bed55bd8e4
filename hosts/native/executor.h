// The native host's transport: runs SqlRequests against ClickHouse's HTTP(S)
// interface with cpp-httplib, and pumps the core's Connection.
//
//   chstate::native::HttpExecutor exec(config);
//   absl::StatusOr<chstate::Result> r = chstate::native::RunOp(conn, conn.store().Get(id), exec);
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
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "core/config.h"
#include "core/connection.h"
#include "core/defaults.h"
#include "core/diagnostics.h"
#include "core/sql_request.h"
#include "core/task.h"

namespace chstate::native {

struct ExecutorOptions {
  int64_t connect_timeout_ms = kDefaultConnectTimeoutMs;
  // What the pump does with what the store tells (core/diagnostics.h): each
  // diagnostic is handed here as soon as the store made it. Unset: they are
  // left where they are (a store makes none unless its host set a level).
  std::function<void(const Diagnostic&)> on_diagnostic;
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

  // Hands what the connection's store told since the last call to
  // options.on_diagnostic (the pump calls it after every input).
  void Tell(Connection& conn);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  std::string endpoint_;
};

// The host as a pump of a chstate::Connection (core/connection.h): each
// request the connection transmits goes through `exec`, the thread sleeps
// until the connection's timeout, and every input carries the monotonic
// clock and fresh random bytes from the OS.
//
// Pump serves the connection until it has an event (returned), or, with
// op = 0, until no request is left and no timer is due. RunOp starts `task`
// and pumps until its outcome. RunTimers fires the timers that are due (the
// renewal of held locks) and returns kAborted naming the id of a lock found
// lost. Each pumps what the store tells to the executor's on_diagnostic.
std::optional<OpEvent> Pump(Connection& conn, HttpExecutor& exec, uint64_t op);
absl::StatusOr<Result> RunOp(Connection& conn, std::unique_ptr<Task> task, HttpExecutor& exec);
absl::Status RunTimers(Connection& conn, HttpExecutor& exec);

// One task by itself, for tools and tests that drive a store's tasks one by
// one and renew held locks explicitly (RenewLock); the chstate tool pumps a
// Connection instead.
absl::StatusOr<Result> RunTask(Task& task, HttpExecutor& exec);

// 32 bytes from the OS random source.
std::string OsRandomBytes();
// Milliseconds on a monotonic clock.
int64_t MonotonicMs();

}  // namespace chstate::native

#endif  // CHSTATE_HOSTS_NATIVE_EXECUTOR_H_
