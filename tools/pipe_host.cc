// pipe_host: a co-process host for chstate::Store that speaks JSON lines on
// stdin/stdout, so a driver in any language (tests/modern/pipe_host.py runs
// the SQL in chDB) can execute the core's requests wherever it likes.
//
//   pipe_host [SETTINGS]
//
// SETTINGS is a settings document (hosts/common/protocol.h), e.g.
// '{"values":{"uri":"clickhouse://u@pipe/db","lock_timeout_seconds":3}}';
// without one the store opens on clickhouse://pipe@pipe/default.
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
// Ops are the verbs of core/verbs.h, with the arguments their rows name;
// {"timer":true} while no op runs is the idle timer, {"close":true} the
// store's close. State ids travel as hex so any bytes (NUL, invalid UTF-8)
// cross JSON unchanged. A response may give
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

int Main(int argc, char** argv) {
  std::ios::sync_with_stdio(false);
  if (argc > 2) {
    EmitFailed(absl::InvalidArgumentError("pipe_host takes one argument: a settings document"));
    return 2;
  }
  absl::StatusOr<protocol::OpenedStore> opened =
      protocol::OpenStore(argc == 2 ? argv[1] : R"({"values":{"uri":"clickhouse://pipe@pipe/default"}})");
  if (!opened.ok()) {
    EmitFailed(opened.status());
    return 2;
  }
  protocol::OpDriver driver(opened->store.get());
  while (std::optional<std::string> line = ReadLine()) {
    if (line->empty()) continue;
    if (line->find("\"timer\"") != std::string::npos && line->find("\"op\"") == std::string::npos) {
      // The idle timer: fed, not started, and driven like an op.
      json action = driver.Feed(*line, OsInputs());
      Emit(action);
      while (Pending(action)) {
        std::optional<std::string> next = ReadLine();
        if (!next) return 0;
        action = driver.Feed(*next, OsInputs());
        Emit(action);
      }
      continue;
    }
    if (Drive(driver, *line) == Outcome::kEof) break;
  }
  return 0;
}

}  // namespace
}  // namespace chstate

int main(int argc, char** argv) { return chstate::Main(argc, argv); }
