// The `chstate` command-line tool as a function, so that main() only gathers
// the process's arguments, environment and streams, and everything else can
// be called with plain values.
//
//   int code = chstate::cli::Main({"get", "dev:tap-a-to-target-b"}, env, std::cin, std::cout, std::cerr);
//
// Exit codes are part of the interface (scripts branch on them) and are listed
// in `chstate --help`.
#ifndef CHSTATE_HOSTS_NATIVE_CLI_H_
#define CHSTATE_HOSTS_NATIVE_CLI_H_

#include <istream>
#include <map>
#include <ostream>
#include <string>
#include <vector>

#include "absl/status/status.h"

namespace chstate::cli {

enum ExitCode : int {
  kExitOk = 0,
  kExitInternal = 1,     // kInternal, kDataLoss, kUnknown and anything unexpected
  kExitUsage = 2,        // bad flags, bad input JSON, kInvalidArgument
  kExitNotFound = 3,     // kNotFound
  kExitLocked = 4,       // kAborted: the state id's lock was not acquired in time
  kExitUnavailable = 5,  // kUnavailable, kDeadlineExceeded: ClickHouse unreachable
  kExitRefused = 6,      // kUnauthenticated, kPermissionDenied
  kExitUnsupported = 7,  // kFailedPrecondition: unsupported server, lost lock
};

ExitCode ExitCodeFor(absl::StatusCode code);

// Runs one command. `args` excludes the program name; `env` is the whole
// process environment. Returns the exit code.
int Main(const std::vector<std::string>& args, const std::map<std::string, std::string>& env, std::istream& in,
         std::ostream& out, std::ostream& err);

}  // namespace chstate::cli

#endif  // CHSTATE_HOSTS_NATIVE_CLI_H_
