// lock_torture: one worker process of the lock torture test
// (tests/lock/test_torture.py). Several of these take the same per-state-id
// lock over and over through the real core and the native HTTP host, and log
// every entry into and exit from the critical section with CLOCK_MONOTONIC
// nanoseconds, so the test can check that no two holds ever overlapped.
//
//   lock_torture --schema t_x --state-id job --rounds 50 --log /tmp/log --worker w1
//                [--stale-ms 300000] [--retry-ms 10] [--timeout-ms 120000] [--hold-ms 3]
//                [--tolerate-timeouts] [--timeout-exit-code N]
//   (with CHSTATE_TEST_HOST, _PORT, _USER, _PASSWORD in the environment, and
//   CHSTATE_TEST_CLUSTER for cluster mode; CHSTATE_TEST_HOSTS="h1:p1,h2:p2,..."
//   instead of _HOST and _PORT names several hosts, read as the core reads the
//   `host` setting, and the core picks the host for each request, the first
//   one first: tests/cluster/test_ha.py)
//
// The connection database is "default". Each round:
//   AcquireLock -> log `enter <worker> <round> <ns>`
//   hold for --hold-ms; every stale/3 during the hold:
//     log `renew <worker> <ns>` (the time it is sent), RenewLock, log `renewed <worker> <ns>`
//   if the lease is no longer valid: log `lost <worker> <round> <ns>`, exit 3
//   log `leave <worker> <round> <ns>` (before the release is sent), ReleaseLock;
//   a release whose requests outlived the lease (ABORTED, "... left to
//   expire": held past the lease, or its end row waited out 286 past it)
//   logs `late_release <worker> <round> <ns>`.
// Other lines: `start <worker> <ns>` once, `timeout <worker> <round> <ns>` for
// a tolerated acquire timeout, `exit <worker> <code> <ns>` at the end.
// The log is opened with O_APPEND and every line is one write(), so lines of
// concurrent workers never interleave. Timestamps are CLOCK_MONOTONIC, which
// is shared by all processes on one machine (Python's time.monotonic_ns too).
//
// Exit codes: 0 all rounds done; 1 any error (message on stderr); 2 bad
// flags; 3 the lease was lost while held (a `lost` line was logged); an
// acquire that gave up after the timeout (kAborted) exits 1, or with
// --timeout-exit-code N, or is logged and skipped with --tolerate-timeouts.
// On success one JSON summary line goes to stdout.
#include <fcntl.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "core/config.h"
#include "core/store.h"
#include "hosts/native/executor.h"
#include <nlohmann/json.hpp>

namespace chstate {
namespace {

constexpr int kExitError = 1;
constexpr int kExitUsage = 2;
constexpr int kExitLost = 3;

int64_t MonoNs() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

// The lease is judged on the scale RunTask feeds the core (steady_clock,
// which is CLOCK_MONOTONIC on Linux).
int64_t LeaseNowMs() { return native::MonotonicMs(); }

void SleepUntilNs(int64_t deadline_ns) {
  while (true) {
    int64_t left = deadline_ns - MonoNs();
    if (left <= 0) return;
    timespec ts{static_cast<time_t>(left / 1000000000), static_cast<long>(left % 1000000000)};
    nanosleep(&ts, nullptr);
  }
}

struct Flags {
  std::string schema;
  std::string state_id;
  std::string log;
  std::string worker;
  int64_t rounds = 1;
  int64_t stale_ms = 300000;
  int64_t retry_ms = 10;
  int64_t timeout_ms = 120000;
  int64_t hold_ms = 0;
  bool tolerate_timeouts = false;
  int timeout_exit_code = kExitError;
};

const char kUsage[] =
    "usage: lock_torture --schema S --state-id ID --rounds N --log FILE --worker NAME\n"
    "                    [--stale-ms MS] [--retry-ms MS] [--timeout-ms MS] [--hold-ms MS]\n"
    "                    [--tolerate-timeouts] [--timeout-exit-code N]\n"
    "Connection: CHSTATE_TEST_HOST, CHSTATE_TEST_PORT (or CHSTATE_TEST_HOSTS=h1:p1,h2:p2,... with\n"
    "CHSTATE_TEST_CLUSTER), CHSTATE_TEST_USER, CHSTATE_TEST_PASSWORD.\n";

absl::StatusOr<Flags> ParseFlags(int argc, char** argv) {
  Flags f;
  std::map<std::string, std::string*> strings = {
      {"--schema", &f.schema}, {"--state-id", &f.state_id}, {"--log", &f.log}, {"--worker", &f.worker}};
  std::map<std::string, int64_t*> ints = {{"--rounds", &f.rounds},         {"--stale-ms", &f.stale_ms},
                                          {"--retry-ms", &f.retry_ms},     {"--timeout-ms", &f.timeout_ms},
                                          {"--hold-ms", &f.hold_ms}};
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    std::string value;
    bool inline_value = false;
    if (size_t eq = arg.find('='); arg.rfind("--", 0) == 0 && eq != std::string::npos) {
      value = arg.substr(eq + 1);
      arg = arg.substr(0, eq);
      inline_value = true;
    }
    if (arg == "--tolerate-timeouts") {
      f.tolerate_timeouts = true;
      continue;
    }
    auto take = [&]() -> absl::StatusOr<std::string> {
      if (inline_value) return value;
      if (i + 1 >= argc) return absl::InvalidArgumentError(absl::StrCat(arg, " needs a value"));
      return std::string(argv[++i]);
    };
    if (auto s = strings.find(arg); s != strings.end()) {
      absl::StatusOr<std::string> v = take();
      if (!v.ok()) return v.status();
      *s->second = *v;
    } else if (auto n = ints.find(arg); n != ints.end()) {
      absl::StatusOr<std::string> v = take();
      if (!v.ok()) return v.status();
      if (!absl::SimpleAtoi(*v, n->second) || *n->second < 0) {
        return absl::InvalidArgumentError(absl::StrCat(arg, " needs a non-negative integer, got \"", *v, "\""));
      }
    } else if (arg == "--timeout-exit-code") {
      absl::StatusOr<std::string> v = take();
      if (!v.ok()) return v.status();
      if (!absl::SimpleAtoi(*v, &f.timeout_exit_code) || f.timeout_exit_code < 0 || f.timeout_exit_code > 125) {
        return absl::InvalidArgumentError("--timeout-exit-code needs 0..125");
      }
    } else {
      return absl::InvalidArgumentError(absl::StrCat("unknown flag \"", arg, "\""));
    }
  }
  if (f.schema.empty() || f.state_id.empty() || f.log.empty() || f.worker.empty()) {
    return absl::InvalidArgumentError("--schema, --state-id, --log and --worker are required");
  }
  if (f.worker.find_first_of(" \t\n") != std::string::npos) {
    return absl::InvalidArgumentError("--worker must not contain whitespace");
  }
  if (f.stale_ms < 3 || f.retry_ms <= 0) {
    return absl::InvalidArgumentError("--stale-ms must be at least 3 and --retry-ms positive");
  }
  return f;
}

std::string Env(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

absl::StatusOr<ConnectionConfig> ConfigFromEnv() {
  if (std::string hosts = Env("CHSTATE_TEST_HOSTS"); !hosts.empty()) {
    // The core's own reading of a host list (and its refusal without a cluster).
    ConfigSources sources;
    sources.flags = {{"host", hosts}, {"user", Env("CHSTATE_TEST_USER")}, {"database", "default"}};
    if (std::string pw = Env("CHSTATE_TEST_PASSWORD"); !pw.empty()) sources.flags["password"] = pw;
    if (std::string cluster = Env("CHSTATE_TEST_CLUSTER"); !cluster.empty()) sources.flags["cluster"] = cluster;
    return ResolveConfig(sources);
  }
  ConnectionConfig c;
  c.host = Env("CHSTATE_TEST_HOST");
  if (c.host.empty()) c.host = "127.0.0.1";
  std::string port = Env("CHSTATE_TEST_PORT");
  if (port.empty() || !absl::SimpleAtoi(port, &c.port)) {
    return absl::InvalidArgumentError("CHSTATE_TEST_PORT is not set to a port number");
  }
  c.user = Env("CHSTATE_TEST_USER");
  c.password = Env("CHSTATE_TEST_PASSWORD");
  c.database = "default";
  return c;
}

class Log {
 public:
  explicit Log(int fd) : fd_(fd) {}
  // One write() per line: O_APPEND makes each one atomic with respect to the
  // other workers' lines.
  absl::Status Line(const std::string& text) {
    std::string line = absl::StrCat(text, "\n");
    ssize_t n = write(fd_, line.data(), line.size());
    if (n != static_cast<ssize_t>(line.size())) {
      return absl::InternalError(absl::StrCat("writing the log failed: ", n < 0 ? strerror(errno) : "short write"));
    }
    return absl::OkStatus();
  }

 private:
  int fd_;
};

int Run(const Flags& f) {
  absl::StatusOr<ConnectionConfig> config = ConfigFromEnv();
  if (!config.ok()) {
    std::cerr << "lock_torture: " << config.status().message() << "\n";
    return kExitUsage;
  }
  int fd = open(f.log.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) {
    std::cerr << "lock_torture: cannot open " << f.log << ": " << strerror(errno) << "\n";
    return kExitError;
  }
  Log log(fd);
  const std::string& w = f.worker;
  auto fail = [&](const std::string& what, const absl::Status& s, int code) {
    std::cerr << "lock_torture " << w << ": " << what << ": " << s.ToString() << "\n";
    (void)log.Line(absl::StrCat("exit ", w, " ", code, " ", MonoNs()));
    return code;
  };
  auto line = [&](const std::string& text) -> bool {
    absl::Status s = log.Line(text);
    if (!s.ok()) std::cerr << "lock_torture " << w << ": " << s.message() << "\n";
    return s.ok();
  };

  StoreOptions options;
  options.schema = f.schema;
  options.cluster.name = Env("CHSTATE_TEST_CLUSTER");  // tests/cluster: lock across replicas
  options.endpoint = absl::StrCat(config->host, ":", config->port);
  if (config->hosts.size() > 1) {
    options.hosts = config->hosts;  // the core picks one for every request
    options.endpoint.clear();
  }
  options.lock.stale_ms = f.stale_ms;
  options.lock.retry_ms = f.retry_ms;
  options.lock.timeout_ms = f.timeout_ms;
  absl::StatusOr<std::unique_ptr<Store>> store = Store::Create(options);
  if (!store.ok()) return fail("bad store options", store.status(), kExitUsage);
  native::HttpExecutor exec(*config);

  if (!line(absl::StrCat("start ", w, " ", MonoNs()))) return kExitError;

  int64_t renewals = 0, timeouts = 0, done = 0, late_releases = 0;
  std::vector<double> wait_ms;
  const int64_t renew_every_ns = f.stale_ms / 3 * 1000000;
  for (int64_t round = 0; round < f.rounds; ++round) {
    int64_t asked_ns = MonoNs();
    absl::StatusOr<Result> got = native::RunTask(*(*store)->AcquireLock(f.state_id), exec);
    int64_t entered_ns = MonoNs();
    if (!got.ok()) {
      if (got.status().code() == absl::StatusCode::kAborted) {
        if (f.tolerate_timeouts) {
          ++timeouts;
          if (!line(absl::StrCat("timeout ", w, " ", round, " ", entered_ns))) return kExitError;
          continue;
        }
        return fail(absl::StrCat("acquire timed out in round ", round), got.status(), f.timeout_exit_code);
      }
      return fail(absl::StrCat("acquire failed in round ", round), got.status(), kExitError);
    }
    wait_ms.push_back((entered_ns - asked_ns) / 1e6);
    if (!line(absl::StrCat("enter ", w, " ", round, " ", entered_ns))) return kExitError;

    const int64_t hold_end_ns = entered_ns + f.hold_ms * 1000000;
    int64_t next_renew_ns = entered_ns + renew_every_ns;
    while (true) {
      SleepUntilNs(std::min(hold_end_ns, next_renew_ns));
      int64_t now = MonoNs();
      if (now >= hold_end_ns) break;
      if (now < next_renew_ns) continue;
      if (!line(absl::StrCat("renew ", w, " ", now))) return kExitError;
      absl::StatusOr<Result> renewed = native::RunTask(*(*store)->RenewLock(f.state_id), exec);
      if (!renewed.ok()) {
        // A failed renewal means the store no longer holds the lock.
        (void)line(absl::StrCat("lost ", w, " ", round, " ", MonoNs()));
        return fail(absl::StrCat("renewal failed in round ", round), renewed.status(), kExitLost);
      }
      ++renewals;
      if (!line(absl::StrCat("renewed ", w, " ", MonoNs()))) return kExitError;
      next_renew_ns = now + renew_every_ns;
    }

    if (!(*store)->LeaseValid(f.state_id, LeaseNowMs())) {
      (void)line(absl::StrCat("lost ", w, " ", round, " ", MonoNs()));
      return fail(absl::StrCat("the lease ran out while held in round ", round),
                  absl::AbortedError("lease no longer valid before leaving"), kExitLost);
    }
    if (!line(absl::StrCat("leave ", w, " ", round, " ", MonoNs()))) return kExitError;
    absl::StatusOr<Result> released = native::RunTask(*(*store)->ReleaseLock(f.state_id, got->lock_id), exec);
    if (!released.ok()) {
      // Left within the lease (logged above), but the release's own requests
      // outlived it (a replica killed mid-release): the core leaves the lock
      // to expire rather than drop it blind. Exclusive all the same; the next
      // holder takes it over once stale.
      if (released.status().code() != absl::StatusCode::kAborted ||
          !absl::StrContains(released.status().message(), "left to expire")) {
        return fail(absl::StrCat("release failed in round ", round), released.status(), kExitError);
      }
      ++late_releases;
      if (!line(absl::StrCat("late_release ", w, " ", round, " ", MonoNs()))) return kExitError;
    }
    ++done;
  }

  (void)line(absl::StrCat("exit ", w, " 0 ", MonoNs()));
  double total_wait = 0, max_wait = 0;
  for (double x : wait_ms) {
    total_wait += x;
    max_wait = std::max(max_wait, x);
  }
  nlohmann::json summary = {{"worker", w},
                            {"rounds", done},
                            {"timeouts", timeouts},
                            {"renewals", renewals},
                            {"late_releases", late_releases},
                            {"mean_acquire_ms", wait_ms.empty() ? 0.0 : total_wait / wait_ms.size()},
                            {"max_acquire_ms", max_wait}};
  std::cout << summary.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << std::endl;
  close(fd);
  return 0;
}

}  // namespace
}  // namespace chstate

int main(int argc, char** argv) {
  absl::StatusOr<chstate::Flags> flags = chstate::ParseFlags(argc, argv);
  if (!flags.ok()) {
    std::cerr << "lock_torture: " << flags.status().message() << "\n" << chstate::kUsage;
    return chstate::kExitUsage;
  }
  return chstate::Run(*flags);
}
