// JSON documents <-> core types, and the one-op-at-a-time driver. Shared by
// tools/pipe_host (JSON lines) and the C ABI (hosts/common/c_api.cc).
#include "hosts/common/protocol.h"

#include "core/defaults.h"

#include <cstdint>
#include <map>
#include <optional>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/dialect.h"
#include "core/quoting.h"
#include "core/state.h"

namespace chstate::protocol {
namespace {

using json = nlohmann::json;

int HexDigit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
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
  return ParseMeltanoStateJson(std::move(state_id), Dump(*it));
}

// "pattern_hex" (any bytes) or "pattern" (a string); nullopt (every id) when
// neither is given or it is null.
absl::StatusOr<std::optional<std::string>> PatternField(const json& op_line) {
  if (auto it = op_line.find("pattern_hex"); it != op_line.end() && !it->is_null()) {
    absl::StatusOr<std::string> p = HexField(op_line, "pattern_hex");
    if (!p.ok()) return p.status();
    return std::optional<std::string>(*std::move(p));
  }
  if (auto it = op_line.find("pattern"); it != op_line.end() && !it->is_null()) {
    if (!it->is_string()) return absl::InvalidArgumentError("\"pattern\" must be a string or null");
    return std::optional<std::string>(it->get<std::string>());
  }
  return std::optional<std::string>();
}

// "limit": a positive integer, `fallback` when absent or null.
absl::StatusOr<int64_t> LimitField(const json& op_line, int64_t fallback, const char* what) {
  auto it = op_line.find("limit");
  if (it == op_line.end() || it->is_null()) return fallback;
  if (!it->is_number_integer() || it->get<int64_t>() < 1) {
    return absl::InvalidArgumentError(absl::StrCat("\"limit\" must be a positive integer (", what, ")"));
  }
  return it->get<int64_t>();
}

// A config source value as the text the core reads; nullopt = not given.
absl::StatusOr<std::optional<std::string>> SettingText(const json& v, absl::string_view where) {
  if (v.is_null()) return std::optional<std::string>();
  if (v.is_string()) return std::optional<std::string>(v.get<std::string>());
  if (v.is_boolean()) return std::optional<std::string>(v.get<bool>() ? "true" : "false");
  if (v.is_number_integer()) return std::optional<std::string>(std::to_string(v.get<int64_t>()));
  return absl::InvalidArgumentError(absl::StrCat(where, " must be a string, an integer, a boolean or null"));
}

absl::StatusOr<std::map<std::string, std::string>> SourceMap(const json& sources, const char* key, bool flags) {
  std::map<std::string, std::string> out;
  auto it = sources.find(key);
  if (it == sources.end() || it->is_null()) return out;
  if (!it->is_object()) return absl::InvalidArgumentError(absl::StrCat("\"", key, "\" must be an object"));
  for (const auto& [name, value] : it->items()) {
    if (flags) {
      bool known = name == "uri";
      for (const char* k : kSettingKeys) known = known || name == k;
      if (!known) {
        return absl::InvalidArgumentError(absl::StrCat(
            "unknown setting \"", name,
            "\" in \"flags\"; expected uri, ", absl::StrJoin(kSettingKeys, ", ")));
      }
    }
    // The name only: a value may be a password.
    absl::StatusOr<std::optional<std::string>> text = SettingText(value, absl::StrCat(key, ".", name));
    if (!text.ok()) return text.status();
    if (*text) out[name] = **text;
  }
  return out;
}

}  // namespace

absl::StatusOr<json> ParseDocument(absl::string_view text) {
  json j = json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return absl::InvalidArgumentError("input line is not valid JSON");
  if (!j.is_object()) return absl::InvalidArgumentError("input line is not a JSON object");
  return j;
}

absl::StatusOr<std::string> HexDecode(absl::string_view hex, absl::string_view field) {
  if (hex.size() % 2 != 0) {
    return absl::InvalidArgumentError(absl::StrCat("\"", field, "\" has an odd number of hex digits"));
  }
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

json RequestJson(const SqlRequest& r) {
  json params = json::array();
  for (const auto& [k, v] : r.url_params) params.push_back(json::array({k, v}));
  json out{{"request",
               {{"sql", r.sql},
                {"url_params", params},
                {"purpose", r.purpose},
                {"idempotent", r.idempotent},
                {"attempt", r.attempt},
                {"timeout_ms", r.timeout_ms}}}};
  if (r.endpoint.port != 0) {
    out["request"]["host"] = r.endpoint.host;
    out["request"]["port"] = r.endpoint.port;
  }
  return out;
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
  out["next_timeout_ms"] = r.next_timeout_ms ? json(*r.next_timeout_ms) : json(nullptr);
  if (r.states) {
    // export_page only, so that every other op's document stays as it was.
    json states = json::array();
    for (const MeltanoState& st : *r.states) {
      states.push_back({{"state_id_hex", HexEncode(st.state_id)}, {"completed", st.completed}, {"partial", st.partial}});
    }
    out["states"] = std::move(states);
    out["more"] = r.more;
  }
  if (r.versions) {
    // history only, likewise.
    json versions = json::array();
    for (const StateVersion& v : *r.versions) {
      versions.push_back({{"version", v.version},
                          {"unix_ms", v.unix_ms},
                          {"updated_at", v.updated_at},
                          {"current", v.current},
                          {"state", {{"completed", v.state.completed}, {"partial", v.state.partial}}}});
    }
    out["versions"] = std::move(versions);
  }
  return json{{"done", std::move(out)}};
}

json FailedJson(const absl::Status& status) {
  return json{{"failed",
               {{"code", absl::StatusCodeToString(status.code())}, {"message", std::string(status.message())}}}};
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

absl::StatusOr<Inputs> InputsFromJson(const json& line, Inputs in) {
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

absl::StatusOr<std::unique_ptr<Task>> TaskForOp(Store& store, const json& op_line) {
  absl::StatusOr<std::string> op = StringField(op_line, "op");
  if (!op.ok()) return op.status();
  auto id = [&](const char* key = "state_id_hex") { return HexField(op_line, key); };

  if (*op == "ping") return store.Ping();
  if (*op == "init") return store.Init();
  if (*op == "tick") return store.Tick();
  if (*op == "release_lingering") return store.ReleaseLingering();
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
    absl::StatusOr<std::optional<std::string>> glob = PatternField(op_line);
    if (!glob.ok()) return glob.status();
    return store.List(*std::move(glob));
  }
  if (*op == "export_page") {
    absl::StatusOr<std::optional<std::string>> glob = PatternField(op_line);
    if (!glob.ok()) return glob.status();
    std::optional<std::string> after;
    if (auto it = op_line.find("after_hex"); it != op_line.end() && !it->is_null()) {
      absl::StatusOr<std::string> a = HexField(op_line, "after_hex");
      if (!a.ok()) return a.status();
      after = *std::move(a);
    }
    absl::StatusOr<int64_t> limit = LimitField(op_line, kDefaultExportPageStates, "states per page");
    if (!limit.ok()) return limit.status();
    return store.ExportPage(*std::move(glob), std::move(after), *limit);
  }
  if (*op == "history") {
    absl::StatusOr<std::string> sid = id();
    if (!sid.ok()) return sid.status();
    absl::StatusOr<int64_t> limit = LimitField(op_line, kDefaultHistoryLimit, "versions to list");
    if (!limit.ok()) return limit.status();
    return store.History(*std::move(sid), *limit);
  }
  if (*op == "rollback") {
    absl::StatusOr<std::string> sid = id();
    if (!sid.ok()) return sid.status();
    absl::StatusOr<std::string> version = StringField(op_line, "version");
    if (!version.ok()) return version.status();
    return store.Rollback(*std::move(sid), *std::move(version));
  }
  if (*op == "import") {
    auto it = op_line.find("states");
    if (it == op_line.end() || !it->is_array()) {
      return absl::InvalidArgumentError(
          "missing array field \"states\" ([{\"state_id_hex\": ..., \"completed\": {...}, \"partial\": {...}}, ...])");
    }
    std::vector<MeltanoState> states;
    states.reserve(it->size());
    for (size_t i = 0; i < it->size(); ++i) {
      const json& entry = (*it)[i];
      std::string where = absl::StrCat("import entry ", i + 1);
      auto named = [&where](const absl::Status& st) {
        return absl::InvalidArgumentError(absl::StrCat(where, ": ", st.message(), "; nothing was written"));
      };
      if (!entry.is_object()) return named(absl::InvalidArgumentError("an entry must be a JSON object"));
      absl::StatusOr<std::string> sid = HexField(entry, "state_id_hex");
      if (!sid.ok()) return named(sid.status());
      absl::StrAppend(&where, " (state id ", QuoteForMessage(*sid), ")");
      json sides = json::object();
      for (const char* side : {"completed", "partial"}) {
        if (auto f = entry.find(side); f != entry.end()) sides[side] = *f;
      }
      absl::StatusOr<MeltanoState> state = MeltanoStateFromJson(*std::move(sid), std::move(sides));
      if (!state.ok()) return named(state.status());
      states.push_back(*std::move(state));
    }
    return store.Import(std::move(states));
  }
  return absl::InvalidArgumentError(absl::StrCat("unknown op \"", *op,
                                                 "\"; expected ping, init, get, set, set_locked, update, delete, "
                                                 "delete_locked, list, export_page, import, history, rollback, clear_all, "
                                                 "copy, move, acquire_lock, renew_lock, release_lock, tick, "
                                                 "release_lingering"));
}

absl::StatusOr<std::vector<Endpoint>> HostsFromJson(const json& j) {
  const char* kShape = "\"hosts\" must be a list of {\"host\": name, \"port\": number} objects";
  if (!j.is_array()) return absl::InvalidArgumentError(kShape);
  std::vector<Endpoint> out;
  for (const json& e : j) {
    if (!e.is_object() || !e.contains("host") || !e.contains("port") || !e["host"].is_string() ||
        !e["port"].is_number_integer()) {
      return absl::InvalidArgumentError(kShape);
    }
    out.push_back(Endpoint{e["host"].get<std::string>(), e["port"].get<int>()});
  }
  return out;
}

absl::StatusOr<StoreOptions> StoreOptionsFromJson(const json& j) {
  StoreOptions opts;
  if (j.is_null()) return opts;
  if (!j.is_object()) return absl::InvalidArgumentError("store options must be a JSON object");
  for (const auto& [key, value] : j.items()) {
    if (key == "hosts") {
      absl::StatusOr<std::vector<Endpoint>> hosts = HostsFromJson(value);
      if (!hosts.ok()) return hosts.status();
      opts.hosts = *std::move(hosts);
      continue;
    }
    std::string* text = key == "schema" ? &opts.schema : key == "table" ? &opts.table
                      : key == "endpoint" ? &opts.endpoint : key == "cluster" ? &opts.cluster.name
                      : key == "zookeeper_path" ? &opts.cluster.zookeeper_path
                      : key == "replica" ? &opts.cluster.replica : nullptr;
    int64_t* ms = key == "lock_timeout_ms" ? &opts.lock.timeout_ms
                : key == "lock_retry_ms" ? &opts.lock.retry_ms
                : key == "stale_lock_ms" ? &opts.lock.stale_ms
                : key == "mutation_timeout_ms" ? &opts.mutation_timeout_ms
                : key == "request_timeout_ms" ? &opts.transport.request_timeout_ms
                : key == "history_days" ? &opts.history_days
                : key == "history_versions" ? &opts.history_versions
                : key == "quorum_timeout_ms" ? &opts.cluster.quorum_timeout_ms
                : key == "quorum_busy_ms" ? &opts.cluster.quorum_busy_ms
                : key == "ddl_timeout_s" ? &opts.cluster.ddl_timeout_s
                : key == "host_down_ms" ? &opts.host_down_ms : nullptr;
    bool* flag = key == "python_locks" ? &opts.python_locks : key == "linger_locks" ? &opts.linger_locks : nullptr;
    if (key == "quorum") {
      if (!value.is_number_integer() || value.get<int64_t>() < 2 || value.get<int64_t>() > 1000) {
        return absl::InvalidArgumentError(
            "\"quorum\" must be a whole number of replicas, at least 2 (a write confirmed by fewer is not a quorum "
            "write)");
      }
      opts.cluster.quorum = value.get<int>();
    } else if (flag != nullptr) {
      if (!value.is_boolean()) return absl::InvalidArgumentError(absl::StrCat("\"", key, "\" must be a boolean"));
      *flag = value.get<bool>();
    } else if (text != nullptr) {
      if (!value.is_string()) return absl::InvalidArgumentError(absl::StrCat("\"", key, "\" must be a string"));
      *text = value.get<std::string>();
    } else if (ms != nullptr) {
      if (!value.is_number_integer() || value.get<int64_t>() < 0) {
        const char* unit = absl::EndsWith(key, "_ms") ? " (milliseconds)" : absl::EndsWith(key, "_s") ? " (seconds)"
                         : absl::EndsWith(key, "_days") ? " (days)" : "";
        return absl::InvalidArgumentError(absl::StrCat("\"", key, "\" must be a non-negative integer", unit));
      }
      *ms = value.get<int64_t>();
    } else {
      return absl::InvalidArgumentError(absl::StrCat(
          "unknown store option \"", key,
          "\"; expected schema, table, endpoint, hosts, cluster, zookeeper_path, replica, lock_timeout_ms, lock_retry_ms, "
          "stale_lock_ms, mutation_timeout_ms, request_timeout_ms, history_days, history_versions, python_locks, "
          "linger_locks, quorum, quorum_timeout_ms, quorum_busy_ms, ddl_timeout_s, host_down_ms"));
    }
  }
  return opts;
}

json ResolveConfigJson(absl::string_view sources_json) {
  absl::StatusOr<json> doc = ParseDocument(sources_json);
  if (!doc.ok()) return FailedJson(doc.status());
  for (const auto& [key, value] : doc->items()) {
    if (key != "flags" && key != "env") {
      return FailedJson(absl::InvalidArgumentError(
          absl::StrCat("unknown key \"", key, "\" in config sources; expected \"flags\" and \"env\"")));
    }
  }
  ConfigSources sources;
  absl::StatusOr<std::map<std::string, std::string>> flags = SourceMap(*doc, "flags", /*flags=*/true);
  if (!flags.ok()) return FailedJson(flags.status());
  absl::StatusOr<std::map<std::string, std::string>> env = SourceMap(*doc, "env", /*flags=*/false);
  if (!env.ok()) return FailedJson(env.status());
  sources.flags = *std::move(flags);
  sources.env = *std::move(env);
  absl::StatusOr<ConnectionConfig> cfg = ResolveConfig(sources);
  if (!cfg.ok()) return FailedJson(cfg.status());
  json origin = json::object();
  for (const auto& [k, v] : cfg->origin) origin[k] = v;
  json hosts = json::array();
  for (const Endpoint& e : cfg->hosts) hosts.push_back({{"host", e.host}, {"port", e.port}});
  return json{{"config",
               {{"host", cfg->host},
                {"port", cfg->port},
                {"hosts", std::move(hosts)},
                {"secure", cfg->secure},
                {"user", cfg->user},
                {"password", cfg->password},
                {"database", cfg->database},
                {"schema", cfg->schema},
                {"table", cfg->table},
                {"ca_file", cfg->ca_file},
                {"connect_timeout_ms", kDefaultConnectTimeoutMs},
                {"request_timeout_ms", kDefaultRequestTimeoutMs},
                {"cluster", cfg->cluster},
                {"zookeeper_path", cfg->zookeeper_path},
                {"replica", cfg->replica},
                {"quorum", cfg->quorum},
                {"redacted_uri", cfg->RedactedUri()},
                {"origin", std::move(origin)}}}};
}

std::string Dump(const json& doc) {
  // Replace, never throw: the core promises ASCII SQL, and a driver that
  // checks for that will see U+FFFD if the promise is ever broken.
  return doc.dump(-1, ' ', /*ensure_ascii=*/false, json::error_handler_t::replace);
}

// ---- OpDriver ----

namespace {

// A state document's merged view (partial over completed, what a tap gets),
// for hosts that would otherwise need Meltano's merge rules of their own.
void AddMerged(json& state) {
  if (!state.is_object()) return;
  state["merged"] = DeepMerge(state.value("completed", json::object()), state.value("partial", json::object()));
}

}  // namespace

void AddMergedViews(json& done) {
  if (auto s = done.find("state"); s != done.end()) AddMerged(*s);
  if (auto v = done.find("versions"); v != done.end() && v->is_array()) {
    for (json& version : *v) {
      if (auto s = version.find("state"); s != version.end()) AddMerged(*s);
    }
  }
  if (auto v = done.find("states"); v != done.end() && v->is_array()) {
    for (json& s : *v) AddMerged(s);
  }
}

json OpDriver::Abort(const absl::Status& status, const Inputs& in) {
  if (op_ != 0) conn_.Abandon(op_, in);
  op_ = 0;
  return FailedJson(status);
}

json OpDriver::Next(const Inputs& in) {
  if (std::optional<OpEvent> e = conn_.PollEvent()) {
    // One op at a time and no renewals of its own (this driver never calls
    // back while idle): the event is the running op's.
    op_ = 0;
    if (!e->ok) return FailedJson(e->status);
    json done = ResultJson(e->result);
    if (merged_) AddMergedViews(done["done"]);
    return done;
  }
  if (std::optional<Transmit> t = conn_.PollTransmit()) {
    awaiting_sql_ = true;
    return RequestJson(t->request);
  }
  if (std::optional<int64_t> at = conn_.PollTimeout()) {
    awaiting_sql_ = false;
    return json{{"wait_ms", std::max<int64_t>(*at - in.now_ms, 0)}};
  }
  return Abort(absl::InternalError("the operation neither finished nor asked for anything"), in);
}

json OpDriver::Start(absl::string_view op_document, const Inputs& defaults) {
  if (op_ != 0) conn_.Abandon(op_, defaults);
  op_ = 0;
  absl::StatusOr<json> op = ParseDocument(op_document);
  if (!op.ok()) return Abort(op.status(), defaults);
  absl::StatusOr<std::unique_ptr<Task>> task = TaskForOp(conn_.store(), *op);
  if (!task.ok()) return Abort(task.status(), defaults);
  merged_ = false;
  if (auto m = op->find("merged"); m != op->end()) {
    if (!m->is_boolean()) {
      return Abort(absl::InvalidArgumentError("\"merged\" must be true or false (true: a state in the result "
                                              "also carries its merged view)"),
                   defaults);
    }
    merged_ = m->get<bool>();
  }
  absl::StatusOr<Inputs> in = InputsFromJson(*op, defaults);
  if (!in.ok()) return Abort(in.status(), defaults);
  op_ = conn_.Start(*std::move(task), *in);
  return Next(*in);
}

json OpDriver::Feed(absl::string_view answer_document, const Inputs& defaults) {
  if (op_ == 0) {
    return FailedJson(absl::FailedPreconditionError(
        "no operation is waiting for an answer: start one first (it may have finished or failed already)"));
  }
  absl::StatusOr<json> answer = ParseDocument(answer_document);
  if (!answer.ok()) return Abort(answer.status(), defaults);
  absl::StatusOr<Inputs> in = InputsFromJson(*answer, defaults);
  if (!in.ok()) return Abort(in.status(), defaults);
  if (awaiting_sql_) {
    absl::StatusOr<SqlResponse> resp = ResponseFromJson(*answer);
    if (!resp.ok()) return Abort(resp.status(), *in);
    if (absl::Status st = conn_.HandleResponse(op_, *resp, *in); !st.ok()) return Abort(st, *in);
    return Next(*in);
  }
  if (!answer->contains("timer")) {
    return Abort(absl::InvalidArgumentError("expected a {\"timer\": true} line after the wait"), *in);
  }
  conn_.HandleTimeout(*in);
  return Next(*in);
}

}  // namespace chstate::protocol
