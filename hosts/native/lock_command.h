// `chstate lock ID -- COMMAND [ARGS...]`: runs a command while holding the
// per-state-id lock, like flock(1).
//
//   int code = 0;
//   absl::Status s = chstate::native::RunLocked(conn, exec, "dev:job", {"make", "load"}, std::cerr, &code);
//
// The command's exit code passes through (128 + N when it died of signal N).
// The lock is renewed every third of the stale window while the command runs
// and released on every exit: the command ending, SIGINT, SIGTERM or SIGHUP
// (forwarded to the command first). A lock not acquired in time is kAborted
// (exit 4, before the command starts); a lock lost while the command runs
// stops the command (SIGTERM, then SIGKILL after 10 s) and is kFailedPrecondition
// (exit 7).
#ifndef CHSTATE_HOSTS_NATIVE_LOCK_COMMAND_H_
#define CHSTATE_HOSTS_NATIVE_LOCK_COMMAND_H_

#include <ostream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "core/store.h"
#include "hosts/native/executor.h"

namespace chstate::native {

absl::Status RunLocked(Connection& conn, HttpExecutor& exec, const std::string& state_id,
                       const std::vector<std::string>& command, std::ostream& err, int* exit_code);

}  // namespace chstate::native

#endif  // CHSTATE_HOSTS_NATIVE_LOCK_COMMAND_H_
