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
#include <sys/random.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "core/dialect.h"
#include "core/quoting.h"
#include "core/sql_request.h"
#include "core/state.h"
#include "core/store.h"
#include "core/task.h"
#include <nlohmann/json.hpp>

namespace chstate {
namespace {

using json = nlohmann::json;

// ---- I/O ----

void Emit(const json& j) {
  // Replace, never throw: the core promises ASCII SQL, and a driver that
  // checks for that will see U+FFFD if the promise is ever broken.
  std::string line = j.dump(-1, ' ', /*ensure_ascii=*/false, json::error_handler_t::replace);
  line.push_back('\n');
  std::fwrite(line.data(), 1, line.size(), stdout);
  std::fflush(stdout);
}

void EmitFailed(const absl::Status& status) {
  Emit(json{{"failed", {{"code", absl::StatusCodeToString(status.code())}, {"message", std::string(status.message())}}}});
}

// Next input line; nullopt on EOF.
std::optional<std::string> ReadLine() {
  std::string line;
  if (!std::getline(std::cin, line)) return std::nullopt;
  if (!line.empty() && line.back() == '\r') line.pop_back();
  return line;
}

// ---- hex ----

int HexDigit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

absl::StatusOr<std::string> HexDecode(absl::string_view hex, absl::string_view field) {
  if (hex.size() % 2 != 0) return absl::InvalidArgumentError(absl::StrCat("\"", field, "\" has an odd number of hex digits"));
  std::string out;
  out.reserve(hex.size() / 2);
  for (size_t i = 0; i < hex.size(); i += 2) {
    int hi = HexDigit(hex[i]);
    int lo = HexDigit(hex[i + 1]);
    if (hi < 0 || lo < 0) {
      return absl::InvalidArgumentError(absl::StrCat("\"", field, "\" is not hex (offset ", i, ")"));
    }
    out.push_back(static_cast<char>(hi * 16 + lo));
  }
  return out;
}

// ---- field access that never throws ----

absl::StatusOr<std::string> StringField(const json& j, const char* key) {
  auto it = j.find(key);
  if (it == j.end() || !it->is_string()) {
    return absl::InvalidArgumentError(absl::StrCat("missing string field \"", key, "\""));
  }
  return it->get<std::string>();
}

absl::StatusOr<std::string> HexField(const json& j, const char* key) {
  absl::StatusOr<std::string> hex = StringField(j, key);
  if (!hex.ok()) return hex.status();
  return HexDecode(*hex, key);
}

absl::StatusOr<MeltanoState> StateField(const json& j, std::string state_id) {
  auto it = j.find("state");
  if (it == j.end() || !it->is_object()) {
    return absl::InvalidArgumentError("missing object field \"state\" ({\"completed\": {...}, \"partial\": {...}})");
  }
  // The core's own parser: checks the keys and the sides' types.
  return ParseMeltanoStateJson(std::move(state_id), it->dump());
}

absl::StatusOr<json> ParseLine(const std::string& line) {
  json j = json::parse(line, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return absl::InvalidArgumentError("input line is not valid JSON");
  if (!j.is_object()) return absl::InvalidArgumentError("input line is not a JSON object");
  return j;
}

// ---- time and randomness ----

int64_t MonotonicMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
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

// Fresh inputs, with the driver's "now_ms"/"random_hex" overrides if present.
absl::StatusOr<Inputs> MakeInputs(const json& line) {
  Inputs in{MonotonicMs(), OsRandomBytes()};
  if (auto it = line.find("now_ms"); it != line.end()) {
    if (!it->is_number_integer()) return absl::InvalidArgumentError("\"now_ms\" must be an integer");
    in.now_ms = it->get<int64_t>();
  }
  if (line.contains("random_hex")) {
    absl::StatusOr<std::string> r = HexField(line, "random_hex");
    if (!r.ok()) return r.status();
    in.random = *std::move(r);
  }
  return in;
}

// ---- protocol ----

json RequestJson(const SqlRequest& r) {
  json params = json::array();
  for (const auto& [k, v] : r.url_params) params.push_back(json::array({k, v}));
  return json{{"request", {{"sql", r.sql}, {"url_params", params}, {"purpose", r.purpose}, {"idempotent", r.idempotent}}}};
}

absl::StatusOr<SqlResponse> ResponseFromJson(const json& line) {
  auto it = line.find("response");
  if (it == line.end() || !it->is_object()) {
    return absl::InvalidArgumentError("expected a {\"response\": {...}} line answering the request");
  }
  const json& r = *it;
  SqlResponse resp;
  if (auto f = r.find("transport_ok"); f != r.end()) {
    if (!f->is_boolean()) return absl::InvalidArgumentError("\"transport_ok\" must be a boolean");
    resp.transport_ok = f->get<bool>();
  }
  if (auto f = r.find("transport_error"); f != r.end() && !f->is_null()) {
    if (!f->is_string()) return absl::InvalidArgumentError("\"transport_error\" must be a string");
    resp.transport_error = f->get<std::string>();
  }
  if (auto f = r.find("maybe_delivered"); f != r.end()) {
    if (!f->is_boolean()) return absl::InvalidArgumentError("\"maybe_delivered\" must be a boolean");
    resp.maybe_delivered = f->get<bool>();
  }
  if (auto f = r.find("http_status"); f != r.end()) {
    if (!f->is_number_integer()) return absl::InvalidArgumentError("\"http_status\" must be an integer");
    resp.http_status = f->get<int>();
  } else if (resp.transport_ok) {
    return absl::InvalidArgumentError("a response with transport_ok needs \"http_status\"");
  }
  if (auto f = r.find("exception_code_header"); f != r.end() && !f->is_null()) {
    if (f->is_string()) {
      resp.exception_code_header = f->get<std::string>();
    } else if (f->is_number_integer()) {
      resp.exception_code_header = std::to_string(f->get<int64_t>());
    } else {
      return absl::InvalidArgumentError("\"exception_code_header\" must be a string");
    }
  }
  if (r.contains("body_hex")) {
    absl::StatusOr<std::string> body = HexField(r, "body_hex");
    if (!body.ok()) return body.status();
    resp.body = *std::move(body);
  } else if (auto f = r.find("body"); f != r.end() && !f->is_null()) {
    if (!f->is_string()) return absl::InvalidArgumentError("\"body\" must be a string");
    resp.body = f->get<std::string>();
  }
  return resp;
}

json ResultJson(const Result& r) {
  json out;
  if (r.state) {
    out["state"] = {{"state_id_hex", HexEncode(r.state->state_id)},
                    {"completed", r.state->completed},
                    {"partial", r.state->partial}};
  } else {
    out["state"] = nullptr;
  }
  json ids = json::array();
  for (const std::string& id : r.state_ids) ids.push_back(HexEncode(id));
  out["state_ids_hex"] = std::move(ids);
  out["count"] = r.count;
  out["server_version"] = r.server_version;
  out["dialect"] = r.dialect ? json(DialectName(*r.dialect)) : json(nullptr);
  out["lock_id"] = r.lock_id;
  out["waited_ms"] = r.waited_ms;
  return json{{"done", std::move(out)}};
}

// Builds the task an op line asks for.
absl::StatusOr<std::unique_ptr<Task>> TaskFor(Store& store, const json& op_line) {
  absl::StatusOr<std::string> op = StringField(op_line, "op");
  if (!op.ok()) return op.status();
  auto id = [&](const char* key = "state_id_hex") { return HexField(op_line, key); };

  if (*op == "ping") return store.Ping();
  if (*op == "init") return store.Init();
  if (*op == "clear_all") return store.ClearAll();
  if (*op == "get" || *op == "delete" || *op == "delete_locked" || *op == "acquire_lock") {
    absl::StatusOr<std::string> sid = id();
    if (!sid.ok()) return sid.status();
    if (*op == "get") return store.Get(*std::move(sid));
    if (*op == "delete") return store.Delete(*std::move(sid));
    if (*op == "delete_locked") return store.DeleteLocked(*std::move(sid));
    return store.AcquireLock(*std::move(sid));
  }
  if (*op == "set" || *op == "set_locked" || *op == "update") {
    absl::StatusOr<std::string> sid = id();
    if (!sid.ok()) return sid.status();
    absl::StatusOr<MeltanoState> state = StateField(op_line, *std::move(sid));
    if (!state.ok()) return state.status();
    if (*op == "set") return store.Set(*std::move(state));
    if (*op == "set_locked") return store.SetLocked(*std::move(state));
    return store.Update(*std::move(state));
  }
  if (*op == "renew_lock") {
    absl::StatusOr<std::string> sid = id();
    if (!sid.ok()) return sid.status();
    return store.RenewLock(*std::move(sid));
  }
  if (*op == "release_lock") {
    absl::StatusOr<std::string> sid = id();
    if (!sid.ok()) return sid.status();
    absl::StatusOr<std::string> lock_id = StringField(op_line, "lock_id");
    if (!lock_id.ok()) return lock_id.status();
    return store.ReleaseLock(*std::move(sid), *std::move(lock_id));
  }
  if (*op == "copy" || *op == "move") {
    absl::StatusOr<std::string> src = id("src_hex");
    if (!src.ok()) return src.status();
    absl::StatusOr<std::string> dst = id("dst_hex");
    if (!dst.ok()) return dst.status();
    if (*op == "copy") return store.Copy(*std::move(src), *std::move(dst));
    return store.Move(*std::move(src), *std::move(dst));
  }
  if (*op == "list") {
    std::optional<std::string> glob;
    if (op_line.contains("pattern_hex") && !op_line["pattern_hex"].is_null()) {
      absl::StatusOr<std::string> p = HexField(op_line, "pattern_hex");
      if (!p.ok()) return p.status();
      glob = *std::move(p);
    } else if (auto it = op_line.find("pattern"); it != op_line.end() && !it->is_null()) {
      if (!it->is_string()) return absl::InvalidArgumentError("\"pattern\" must be a string or null");
      glob = it->get<std::string>();
    }
    return store.List(std::move(glob));
  }
  return absl::InvalidArgumentError(absl::StrCat("unknown op \"", *op,
                                                 "\"; expected ping, init, get, set, set_locked, update, delete, "
                                                 "delete_locked, list, clear_all, copy, move, acquire_lock, "
                                                 "renew_lock, release_lock"));
}

enum class Outcome { kFinished, kEof };

// Drives one task to its end, talking to the driver for every action.
Outcome Drive(Task& task, const json& op_line) {
  absl::StatusOr<Inputs> in = MakeInputs(op_line);
  if (!in.ok()) {
    EmitFailed(in.status());
    return Outcome::kFinished;
  }
  Action a = task.Start(*in);
  while (true) {
    switch (a.kind) {
      case Action::Kind::kDone:
        Emit(ResultJson(a.result));
        return Outcome::kFinished;
      case Action::Kind::kFailed:
        EmitFailed(a.status);
        return Outcome::kFinished;
      case Action::Kind::kRunSql:
      case Action::Kind::kWait: {
        const bool sql = a.kind == Action::Kind::kRunSql;
        Emit(sql ? RequestJson(a.request) : json{{"wait_ms", a.wait_ms}});
        std::optional<std::string> line = ReadLine();
        if (!line) return Outcome::kEof;
        absl::StatusOr<json> j = ParseLine(*line);
        if (!j.ok()) {
          EmitFailed(j.status());
          return Outcome::kFinished;
        }
        absl::StatusOr<Inputs> next = MakeInputs(*j);
        if (!next.ok()) {
          EmitFailed(next.status());
          return Outcome::kFinished;
        }
        if (sql) {
          absl::StatusOr<SqlResponse> resp = ResponseFromJson(*j);
          if (!resp.ok()) {
            EmitFailed(resp.status());
            return Outcome::kFinished;
          }
          a = task.OnResponse(*resp, *next);
        } else {
          if (!j->contains("timer")) {
            EmitFailed(absl::InvalidArgumentError("expected a {\"timer\": true} line after the wait"));
            return Outcome::kFinished;
          }
          a = task.OnTimer(*next);
        }
        break;
      }
    }
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
  while (std::optional<std::string> line = ReadLine()) {
    if (line->empty()) continue;
    absl::StatusOr<json> j = ParseLine(*line);
    if (!j.ok()) {
      EmitFailed(j.status());
      continue;
    }
    absl::StatusOr<std::unique_ptr<Task>> task = TaskFor(**store, *j);
    if (!task.ok()) {
      EmitFailed(task.status());
      continue;
    }
    if (Drive(**task, *j) == Outcome::kEof) break;
  }
  return 0;
}

}  // namespace
}  // namespace chstate

int main(int argc, char** argv) { return chstate::Main(argc, argv); }
