// cpp-httplib transport for core SqlRequests, and the pump that drives Tasks.
#include "hosts/native/executor.h"

#include <pthread.h>
#include <signal.h>
#include <sys/random.h>

#include <cerrno>

#include <chrono>
#include <map>
#include <memory>
#include <thread>

#include "absl/strings/str_cat.h"
#include "httplib.h"

namespace chstate::native {
namespace {

std::string HostForUrl(const std::string& host) {
  // An IPv6 literal needs brackets in the Host header and URL.
  return host.find(':') != std::string::npos ? absl::StrCat("[", host, "]") : host;
}

std::string Describe(httplib::Error e) {
  switch (e) {
    case httplib::Error::Connection: return "connection refused or host unreachable";
    case httplib::Error::ConnectionTimeout: return "connect timed out";
    case httplib::Error::Read: return "connection closed or timed out while reading the answer";
    case httplib::Error::Write: return "connection failed while sending the request";
    case httplib::Error::SSLConnection: return "TLS handshake failed";
    case httplib::Error::SSLLoadingCerts: return "could not load the CA certificates (check the CA file)";
    case httplib::Error::SSLServerVerification:
      return "the server's TLS certificate could not be verified (wrong CA or host name)";
    case httplib::Error::UnsupportedMultipartBoundaryChars: return "bad multipart boundary";
    case httplib::Error::Compression: return "decompression failed";
    default: return httplib::to_string(e);
  }
}

// A server that closes the connection while the request is still being
// sent makes the next write raise SIGPIPE, which kills the process (the CLI,
// a lua5.4 interpreter) without a word. cpp-httplib does not send with
// MSG_NOSIGNAL, and a library must not change the process's signal
// disposition, so for the duration of one request SIGPIPE is blocked on the
// calling thread and one raised meanwhile is discarded: the write fails with
// EPIPE instead, reported as a transport failure.
class ScopedSigpipeBlock {
 public:
  ScopedSigpipeBlock() {
    sigemptyset(&pipe_);
    sigaddset(&pipe_, SIGPIPE);
    sigset_t pending;
    sigpending(&pending);
    was_pending_ = sigismember(&pending, SIGPIPE) == 1;
    pthread_sigmask(SIG_BLOCK, &pipe_, &old_);
  }
  ~ScopedSigpipeBlock() {
    sigset_t pending;
    sigpending(&pending);
    if (!was_pending_ && sigismember(&pending, SIGPIPE) == 1) {
      const struct timespec zero {};
      while (sigtimedwait(&pipe_, nullptr, &zero) == -1 && errno == EINTR) {
      }
    }
    pthread_sigmask(SIG_SETMASK, &old_, nullptr);
  }
  ScopedSigpipeBlock(const ScopedSigpipeBlock&) = delete;
  ScopedSigpipeBlock& operator=(const ScopedSigpipeBlock&) = delete;

 private:
  sigset_t pipe_;
  sigset_t old_;
  bool was_pending_ = false;
};

// After these errors the request may have reached the server.
bool MaybeDelivered(httplib::Error e) {
  return e == httplib::Error::Read || e == httplib::Error::Write || e == httplib::Error::Unknown;
}

}  // namespace

struct HttpExecutor::Impl {
  ConnectionConfig config;
  ExecutorOptions options;
  // One keep-alive client per host:port the core sends to.
  std::map<std::string, std::unique_ptr<httplib::Client>> clients;
  httplib::Headers headers;
  std::string base_query;

  httplib::Client& ClientFor(const std::string& endpoint) {
    std::unique_ptr<httplib::Client>& slot = clients[endpoint];
    if (slot) return *slot;
    slot = std::make_unique<httplib::Client>(absl::StrCat(config.secure ? "https://" : "http://", endpoint));
    httplib::Client& c = *slot;
    c.set_keep_alive(true);
    // Without it Nagle's algorithm holds each small request back for the
    // server's delayed ACK: about 44 ms per request instead of 0.3 ms.
    c.set_tcp_nodelay(true);
    c.set_connection_timeout(options.connect_timeout_ms / 1000, (options.connect_timeout_ms % 1000) * 1000);
    if (config.secure) {
      // Verification stays on: there is deliberately no switch to turn it off.
      c.enable_server_certificate_verification(true);
      if (!config.ca_file.empty()) c.set_ca_cert_path(config.ca_file);
    }
    return c;
  }
};

HttpExecutor::HttpExecutor(const ConnectionConfig& config, ExecutorOptions options) : impl_(new Impl) {
  endpoint_ = absl::StrCat(HostForUrl(config.host), ":", config.port);
  impl_->config = config;
  impl_->options = options;
  impl_->headers = {{"X-ClickHouse-User", config.user}};
  if (!config.password.empty()) impl_->headers.emplace("X-ClickHouse-Key", config.password);
  impl_->base_query = absl::StrCat("/?database=", httplib::detail::encode_query_param(config.database));
}

HttpExecutor::~HttpExecutor() = default;

void HttpExecutor::Tell(Connection& conn) {
  if (!impl_->options.on_diagnostic) return;
  while (std::optional<Diagnostic> d = conn.PollDiagnostic()) impl_->options.on_diagnostic(*d);
}

SqlResponse HttpExecutor::Execute(const SqlRequest& request) {
  std::string path = impl_->base_query;
  for (const auto& [key, value] : request.url_params) {
    absl::StrAppend(&path, "&", httplib::detail::encode_query_param(key), "=",
                    httplib::detail::encode_query_param(value));
  }
  SqlResponse out;
  const std::string endpoint = request.endpoint.port != 0
                                   ? absl::StrCat(HostForUrl(request.endpoint.host), ":", request.endpoint.port)
                                   : endpoint_;
  httplib::Client& client = impl_->ClientFor(endpoint);
  if (request.timeout_ms > 0) {
    const time_t sec = static_cast<time_t>(request.timeout_ms / 1000);
    const time_t usec = static_cast<time_t>((request.timeout_ms % 1000) * 1000);
    client.set_read_timeout(sec, usec);
    client.set_write_timeout(sec, usec);
  }
  ScopedSigpipeBlock no_sigpipe;
  httplib::Result res = client.Post(path, impl_->headers, request.sql, "text/plain; charset=UTF-8");
  if (!res) {
    out.transport_ok = false;
    out.maybe_delivered = MaybeDelivered(res.error());
    out.transport_error = absl::StrCat(Describe(res.error()), " (", endpoint,
                                       "). Check that ClickHouse is running there and that host, port and "
                                       "secure are right");
    return out;
  }
  out.http_status = res->status;
  out.body = std::move(res->body);
  if (res->has_header("X-ClickHouse-Exception-Code")) {
    out.exception_code_header = res->get_header_value("X-ClickHouse-Exception-Code");
  }
  return out;
}

std::string OsRandomBytes() {
  std::string bytes(32, '\0');
  size_t got = 0;
  while (got < bytes.size()) {
    ssize_t n = getrandom(bytes.data() + got, bytes.size() - got, 0);
    if (n > 0) got += static_cast<size_t>(n);
  }
  return bytes;
}

int64_t MonotonicMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

namespace {

Inputs Now() { return Inputs{MonotonicMs(), OsRandomBytes()}; }

}  // namespace

// The whole pump: send what the connection asks, sleep until it wants to be
// called back, pass the clock and random bytes. Everything else is the core's.
std::optional<OpEvent> Pump(Connection& conn, HttpExecutor& exec, uint64_t op) {
  while (true) {
    while (std::optional<Transmit> t = conn.PollTransmit()) {
      SqlResponse answer = exec.Execute(t->request);
      (void)conn.HandleResponse(t->op, answer, Now());  // refused only for an op no one waits for
      exec.Tell(conn);
    }
    exec.Tell(conn);
    if (std::optional<OpEvent> e = conn.PollEvent()) return e;
    std::optional<int64_t> at = conn.PollTimeout();
    if (op == 0 || !at) return std::nullopt;  // only what was due, or nothing left to do
    int64_t ms = *at - MonotonicMs();
    if (ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(ms));
    conn.HandleTimeout(Now());
  }
}

absl::StatusOr<Result> RunOp(Connection& conn, std::unique_ptr<Task> task, HttpExecutor& exec) {
  const uint64_t op = conn.Start(std::move(task), Now());
  while (std::optional<OpEvent> e = Pump(conn, exec, op)) {
    if (e->op != op) continue;  // a renewal's lost lock: the next op on that id reports it
    if (!e->ok) return e->status;
    return std::move(e->result);
  }
  return absl::InternalError("the operation ended without an outcome");
}

absl::StatusOr<Result> RunTask(Task& task, HttpExecutor& exec) {
  Action a = task.Start(Now());
  while (true) {
    switch (a.kind) {
      case Action::Kind::kRunSql:
        a = task.OnResponse(exec.Execute(a.request), Now());
        break;
      case Action::Kind::kWait:
        std::this_thread::sleep_for(std::chrono::milliseconds(a.wait_ms));
        a = task.OnTimer(Now());
        break;
      case Action::Kind::kDone:
        return std::move(a.result);
      case Action::Kind::kFailed:
        return a.status;
    }
  }
}

absl::Status RunTimers(Connection& conn, HttpExecutor& exec) {
  std::optional<int64_t> at = conn.PollTimeout();
  if (!at || *at > MonotonicMs()) return absl::OkStatus();
  conn.HandleTimeout(Now());
  absl::Status lost = absl::OkStatus();
  while (std::optional<OpEvent> e = Pump(conn, exec, 0)) {
    if (!e->ok && lost.ok()) lost = e->status;
  }
  return lost;
}

}  // namespace chstate::native
