// Holding a state id's lock around a child process: spawn, renew, forward
// signals, release.
#include "hosts/native/lock_command.h"

#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <optional>
#include <thread>

#include "absl/strings/str_cat.h"
#include "core/quoting.h"
#include "core/verbs.h"
#include <nlohmann/json.hpp>

extern char** environ;

namespace chstate::native {
namespace {

volatile sig_atomic_t g_signal = 0;

void OnSignal(int sig) { g_signal = sig; }

// Catches the signals that would otherwise kill us with the lock held.
class SignalGuard {
 public:
  SignalGuard() {
    struct sigaction sa {};
    sa.sa_handler = OnSignal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;  // keep HTTP calls going; the loop checks the flag
    for (int i = 0; i < 3; ++i) sigaction(kSignals[i], &sa, &old_[i]);
  }
  ~SignalGuard() {
    for (int i = 0; i < 3; ++i) sigaction(kSignals[i], &old_[i], nullptr);
  }

 private:
  static constexpr int kSignals[3] = {SIGINT, SIGTERM, SIGHUP};
  struct sigaction old_[3];
};

int ExitCodeOf(int wait_status) {
  if (WIFEXITED(wait_status)) return WEXITSTATUS(wait_status);
  if (WIFSIGNALED(wait_status)) return 128 + WTERMSIG(wait_status);
  return 1;
}

// Waits up to `ms` for the child; true when it has exited.
bool WaitChild(pid_t child, int64_t ms, int* status) {
  int64_t deadline = MonotonicMs() + ms;
  while (true) {
    pid_t r = waitpid(child, status, WNOHANG);
    if (r == child) return true;
    if (r < 0 && errno != EINTR) return true;
    if (MonotonicMs() >= deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

void StopChild(pid_t child, int* status) {
  kill(child, SIGTERM);
  if (!WaitChild(child, 10000, status)) {
    kill(child, SIGKILL);
    WaitChild(child, 10000, status);
  }
}


// The lock scope's verbs (core/verbs.h): acquire, then release.
absl::StatusOr<Result> RunVerb(Connection& conn, HttpExecutor& exec, const nlohmann::json& doc) {
  absl::StatusOr<std::unique_ptr<Task>> task = TaskForVerb(conn.store(), doc);
  if (!task.ok()) return task.status();
  return RunOp(conn, *std::move(task), exec);
}

}  // namespace

absl::Status RunLocked(Connection& conn, HttpExecutor& exec, const std::string& state_id,
                       const std::vector<std::string>& command, std::ostream& err, int* exit_code) {
  SignalGuard guard;
  g_signal = 0;
  const std::string id_hex = HexEncode(state_id);
  absl::StatusOr<Result> acquired = RunVerb(conn, exec, {{"op", "acquire"}, {"state_id_hex", id_hex}});
  if (!acquired.ok()) return acquired.status();
  const std::string lock_id = acquired->lock_id;
  auto release = [&]() -> absl::Status {
    return RunVerb(conn, exec, {{"op", "release"}, {"state_id_hex", id_hex}, {"lock_id", lock_id}}).status();
  };

  if (g_signal != 0) {
    // Interrupted while waiting for the lock: do not start the command.
    int sig = g_signal;
    absl::Status r = release();
    *exit_code = 128 + sig;
    return r;
  }

  std::vector<char*> argv;
  for (const std::string& a : command) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  pid_t child = 0;
  int spawn_error = posix_spawnp(&child, argv[0], nullptr, nullptr, argv.data(), environ);
  if (spawn_error != 0) {
    absl::Status r = release();
    return absl::InvalidArgumentError(absl::StrCat("could not run \"", command[0], "\": ", std::strerror(spawn_error),
                                                   r.ok() ? "" : absl::StrCat(" (and: ", r.message(), ")")));
  }

  // The connection renews the lock when called back at its timeout; this
  // loop only waits for the child until then.
  int forwarded = 0;
  int status = 0;
  while (true) {
    std::optional<int64_t> wake = conn.PollTimeout();
    const int64_t until_wake = wake ? std::max<int64_t>(*wake - MonotonicMs(), 0) : 200;
    if (WaitChild(child, std::min<int64_t>(200, until_wake), &status)) break;
    if (g_signal != 0 && forwarded != g_signal) {
      forwarded = g_signal;
      kill(child, forwarded);  // the command decides how to end; we release after it does
    }
    if (absl::Status lost = RunTimers(conn, exec); !lost.ok()) {
      err << "chstate: " << lost.message() << "; stopping the command\n";
      StopChild(child, &status);
      return absl::FailedPreconditionError(
          absl::StrCat("the command was stopped because the lock was lost: ", lost.message()));
    }
  }
  *exit_code = ExitCodeOf(status);
  absl::Status released = release();
  if (!released.ok()) {
    if (*exit_code != 0) {
      err << "chstate: " << released.message() << '\n';
      return absl::OkStatus();  // the command's own failure is the exit code
    }
    return absl::FailedPreconditionError(released.message());
  }
  return absl::OkStatus();
}

}  // namespace chstate::native
