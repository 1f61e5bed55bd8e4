// pipe_host: a co-process host for chstate::Store that speaks JSON lines on
// stdin/stdout, so a driver in any language (tests/modern/pipe_host.py runs
// the SQL in chDB) can execute the core's requests wherever it likes.
//
//   pipe_host [--schema S] [--table T] [--lock-timeout-ms N] [--lock-retry-ms N]
//             [--stale-lock-ms N] [--mutation-timeout-ms N] [--endpoint NAME]
//
// One Store lives for the whole session (its dialect is detected once). Per
// operation, the driver writes one op line and then answers what the host asks:
//
//   driver -> {"op":"get","state_id_hex":"6465763a61"}
//   host   -> {"request":{"sql":"...","url_params":[["k","v"],...],"purpose":"get_state","idempotent":true}}
//   driver -> {"response":{"transport_ok":true,"http_status":200,"exception_code_header":"","body_hex":"..."}}
//   host   -> {"wait_ms":1000}
//   driver -> {"timer":true}
//   host   -> {"done":{"state":{"state_id_hex":..,"completed":{..},"partial":{..}}|null,"state_ids_hex":[..],
//                      "count":0,"server_version":"26.9.2.1","dialect":"modern","lock_id":"","waited_ms":0}}
//          or {"failed":{"code":"NOT_FOUND","message":"..."}}
//
// Ops: ping, init, get, set, set_locked, update, delete, delete_locked, list
// ("pattern": string|null, or "pattern_hex"), clear_all, copy/move ("src_hex",
// "dst_hex"), acquire_lock, release_lock ("lock_id"). State ids travel as hex
// so any bytes (NUL, invalid UTF-8) cross JSON unchanged. A response may give
// "body" (text) instead of "body_hex", and "transport_ok":false with
// "transport_error" and "maybe_delivered".
//
// Time and randomness come from the OS (steady_clock, getrandom) unless an
// input line carries "now_ms" and/or "random_hex", which then win.
//
// An unreadable line ends the current operation with {"failed":{...}} (code
// INVALID_ARGUMENT) and the host reads the next op. EOF ends the process.

#include <cstdint>
#include <cstdio>
#include <iostream>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "core/store.h"
#include "core/task.h"
#include "hosts/common/protocol.h"
#include "hosts/native/executor.h"
#include <nlohmann/json.hpp>

namespace chstate {
namespace {

using json = nlohmann::json;

// ---- I/O ----

void Emit(const json& j) {
  std::string line = protocol::Dump(j);
  line.push_back('\n');
  std::fwrite(line.data(), 1, line.size(), stdout);
  std::fflush(stdout);
}

void EmitFailed(const absl::Status& status) { Emit(protocol::FailedJson(status)); }

// Next input line; nullopt on EOF.
std::optional<std::string> ReadLine() {
  std::string line;
  if (!std::getline(std::cin, line)) return std::nullopt;
  if (!line.empty() && line.back() == '\r') line.pop_back();
  return line;
}

// ---- time and randomness: the native host's (hosts/native/executor.h) ----

using native::MonotonicMs;
using native::OsRandomBytes;

// Fresh inputs from the OS; a line's "now_ms"/"random_hex" win (the driver
// applies them).
Inputs OsInputs() { return Inputs{MonotonicMs(), OsRandomBytes()}; }

bool Pending(const json& action) { return action.contains("request") || action.contains("wait_ms"); }

enum class Outcome { kFinished, kEof };

// Drives one op line to its end, talking to the driver for every action.
Outcome Drive(protocol::OpDriver& driver, const std::string& op_line) {
  json action = driver.Start(op_line, OsInputs());
  while (true) {
    Emit(action);
    if (!Pending(action)) return Outcome::kFinished;
    std::optional<std::string> line = ReadLine();
    if (!line) return Outcome::kEof;
    action = driver.Feed(*line, OsInputs());
  }
}

// --name=value or --name value.
absl::Status ParseArgs(int argc, char** argv, StoreOptions* opts) {
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    std::string name = arg;
    std::optional<std::string> value;
    if (size_t eq = arg.find('='); eq != std::string::npos) {
      name = arg.substr(0, eq);
      value = arg.substr(eq + 1);
    }
    auto take = [&]() -> absl::StatusOr<std::string> {
      if (value) return *value;
      if (i + 1 >= argc) return absl::InvalidArgumentError(absl::StrCat(name, " needs a value"));
      return std::string(argv[++i]);
    };
    auto take_ms = [&](int64_t* out) -> absl::Status {
      absl::StatusOr<std::string> v = take();
      if (!v.ok()) return v.status();
      if (!absl::SimpleAtoi(*v, out)) return absl::InvalidArgumentError(absl::StrCat(name, " needs an integer"));
      return absl::OkStatus();
    };
    absl::Status st;
    if (name == "--schema" || name == "--table" || name == "--endpoint") {
      absl::StatusOr<std::string> v = take();
      if (!v.ok()) return v.status();
      (name == "--schema" ? opts->schema : name == "--table" ? opts->table : opts->endpoint) = *v;
    } else if (name == "--lock-timeout-ms") {
      st = take_ms(&opts->lock.timeout_ms);
    } else if (name == "--lock-retry-ms") {
      st = take_ms(&opts->lock.retry_ms);
    } else if (name == "--stale-lock-ms") {
      st = take_ms(&opts->lock.stale_ms);
    } else if (name == "--mutation-timeout-ms") {
      st = take_ms(&opts->mutation_timeout_ms);
    } else {
      return absl::InvalidArgumentError(absl::StrCat("unknown argument ", arg));
    }
    if (!st.ok()) return st;
  }
  return absl::OkStatus();
}

int Main(int argc, char** argv) {
  std::ios::sync_with_stdio(false);
  StoreOptions opts;
  opts.endpoint = "pipe";
  if (absl::Status st = ParseArgs(argc, argv, &opts); !st.ok()) {
    EmitFailed(st);
    return 2;
  }
  absl::StatusOr<std::unique_ptr<Store>> store = Store::Create(opts);
  if (!store.ok()) {
    EmitFailed(store.status());
    return 2;
  }
  protocol::OpDriver driver(store->get());
  while (std::optional<std::string> line = ReadLine()) {
    if (line->empty()) continue;
    if (Drive(driver, *line) == Outcome::kEof) break;
  }
  return 0;
}

}  // namespace
}  // namespace chstate

int main(int argc, char** argv) { return chstate::Main(argc, argv); }
