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

// A settings value as the text the core reads; nullopt = not given.
absl::StatusOr<std::optional<std::string>> SettingText(const json& v, absl::string_view where) {
  if (v.is_null()) return std::optional<std::string>();
  if (v.is_string()) return std::optional<std::string>(v.get<std::string>());
  if (v.is_boolean()) return std::optional<std::string>(v.get<bool>() ? "true" : "false");
  if (v.is_number_integer()) return std::optional<std::string>(std::to_string(v.get<int64_t>()));
  if (v.is_number_float()) return std::optional<std::string>(v.dump());  // shortest text that reads back the same
  return absl::InvalidArgumentError(absl::StrCat(where, " must be a string, a number or a boolean"));
}

absl::StatusOr<std::map<std::string, std::string>> TextMap(const json& doc, const char* key) {
  std::map<std::string, std::string> out;
  auto it = doc.find(key);
  if (it == doc.end() || it->is_null()) return out;
  if (!it->is_object()) return absl::InvalidArgumentError(absl::StrCat("\"", key, "\" must be an object"));
  for (const auto& [name, value] : it->items()) {
    // The name only: a value may be a password.
    absl::StatusOr<std::optional<std::string>> text = SettingText(value, absl::StrCat(key, ".", name.substr(0, 100)));
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
  if (r.document) {
    // export_page with document only, likewise; its ids are state_ids_hex.
    out["document"] = *r.document;
    out["more"] = r.more;
  }
  if (r.locks) {
    // locks and unlock only, likewise.
    json locks = json::array();
    for (const HeldLockInfo& l : *r.locks) {
      locks.push_back({{"state_id_hex", l.state_id ? json(HexEncode(*l.state_id)) : json(nullptr)},
                       {"table", l.table},
                       {"holder", l.holder},
                       {"held_s", l.held_s},
                       {"renewed_s", l.renewed_s},
                       {"validity_s", l.validity_s},
                       {"stale", l.stale}});
    }
    out["locks"] = std::move(locks);
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

absl::StatusOr<SettingsSources> SettingsSourcesFromJson(const json& doc) {
  if (!doc.is_object()) return absl::InvalidArgumentError("a settings document must be a JSON object");
  SettingsSources src;
  for (const auto& [key, value] : doc.items()) {
    if (key != "from" && key != "values" && key != "env" && key != "host") {
      return absl::InvalidArgumentError(absl::StrCat("unknown member \"", key.substr(0, 100),
                                                     "\" of the settings document; expected from, values, env, host"));
    }
  }
  if (auto f = doc.find("from"); f != doc.end() && !f->is_null()) {
    const std::string from = f->is_string() ? f->get<std::string>() : "";
    if (from == "api") {
      src.from = SettingsFrom::kApi;
    } else if (from == "cli") {
      src.from = SettingsFrom::kCli;
    } else if (from == "meltano") {
      src.from = SettingsFrom::kMeltano;
    } else {
      return absl::InvalidArgumentError("\"from\" must be \"api\", \"cli\" or \"meltano\" (how the values are named "
                                        "in messages)");
    }
  }
  absl::StatusOr<std::map<std::string, std::string>> values = TextMap(doc, "values");
  if (!values.ok()) return values.status();
  absl::StatusOr<std::map<std::string, std::string>> env = TextMap(doc, "env");
  if (!env.ok()) return env.status();
  src.values = *std::move(values);
  src.env = *std::move(env);
  if (auto h = doc.find("host"); h != doc.end() && !h->is_null()) {
    static constexpr char kHostShape[] =
        "\"host\" must be {\"timers\": bool, \"exit_release\": bool, \"diagnostics\": "
        "\"none\"|\"warning\"|\"info\"|\"debug\", \"show_states\": bool}";
    if (!h->is_object()) return absl::InvalidArgumentError(kHostShape);
    for (const auto& [key, value] : h->items()) {
      if (key == "diagnostics") {
        const std::string level = value.is_string() ? value.get<std::string>() : "";
        static const std::pair<const char*, DiagnosticLevel> kLevels[] = {{"none", DiagnosticLevel::kNone},
                                                                        {"warning", DiagnosticLevel::kWarning},
                                                                        {"info", DiagnosticLevel::kInfo},
                                                                        {"debug", DiagnosticLevel::kDebug}};
        bool known = false;
        for (const auto& [name, l] : kLevels) {
          if (level == name) {
            src.host.diagnostics = l;
            known = true;
          }
        }
        if (!known) return absl::InvalidArgumentError(kHostShape);
        continue;
      }
      bool* target = key == "timers"         ? &src.host.timers
                     : key == "exit_release" ? &src.host.exit_release
                     : key == "show_states"  ? &src.host.show_states
                                             : nullptr;
      if (target == nullptr || !value.is_boolean()) return absl::InvalidArgumentError(kHostShape);
      *target = value.get<bool>();
    }
  }
  return src;
}

namespace {

json StoreOptionsJson(const StoreOptions& o) {
  json hosts = json::array();
  for (const Endpoint& e : o.hosts) hosts.push_back({{"host", e.host}, {"port", e.port}});
  return {{"schema", o.schema},
          {"table", o.table},
          {"endpoint", o.endpoint},
          {"hosts", std::move(hosts)},
          {"lock_wait_ms", o.lock.timeout_ms},
          {"lock_retry_ms", o.lock.retry_ms},
          {"lock_validity_ms", o.lock.stale_ms},
          {"request_timeout_ms", o.transport.request_timeout_ms},
          {"mutation_timeout_ms", o.mutation_timeout_ms},
          {"history_days", o.history_days},
          {"history_versions", o.history_versions},
          {"python_locks", o.python_locks},
          {"linger_locks", o.linger_locks},
          {"host_down_ms", o.host_down_ms},
          {"cluster", o.cluster.name},
          {"zookeeper_path", o.cluster.zookeeper_path},
          {"replica", o.cluster.replica},
          {"quorum", o.cluster.quorum},
          {"quorum_timeout_ms", o.cluster.quorum_timeout_ms},
          {"quorum_busy_ms", o.cluster.quorum_busy_ms},
          {"ddl_timeout_s", o.cluster.ddl_timeout_s}};
}

}  // namespace

json SettingsJson(const Settings& st) {
  const ConnectionConfig& c = st.connection;
  json hosts = json::array();
  for (const Endpoint& e : c.hosts) hosts.push_back({{"host", e.host}, {"port", e.port}});
  json origin = json::object();
  for (const auto& [k, v] : st.origin) origin[k] = v;
  json connection = {{"host", c.host},
                     {"port", c.port},
                     {"hosts", std::move(hosts)},
                     {"secure", c.secure},
                     {"user", c.user},
                     {"password", c.password},
                     {"database", c.database},
                     {"ca_file", c.ca_file},
                     {"connect_timeout_ms", st.connect_timeout_ms},
                     {"redacted_uri", st.chdb_path.empty() ? c.RedactedUri() : absl::StrCat("chdb://", st.chdb_path)},
                     {"endpoint", st.store.endpoint},
                     {"chdb_path", st.chdb_path}};
  json values = json::object();
  for (size_t i = 0; i < kSettingsCount; ++i) values[kSettings[i].key] = ValueText(st, kSettings[i]);
  return json{{"settings",
               {{"connection", std::move(connection)},
                {"store", StoreOptionsJson(st.store)},
                {"values", std::move(values)},
                {"origin", std::move(origin)}}}};
}

json ResolveSettingsJson(absl::string_view text) {
  absl::StatusOr<json> doc = ParseDocument(text);
  if (!doc.ok()) return FailedJson(doc.status());
  absl::StatusOr<SettingsSources> src = SettingsSourcesFromJson(*doc);
  if (!src.ok()) return FailedJson(src.status());
  absl::StatusOr<Settings> settings = ResolveSettings(*src);
  if (!settings.ok()) return FailedJson(settings.status());
  return SettingsJson(*settings);
}

absl::StatusOr<OpenedStore> OpenStore(absl::string_view text) {
  absl::StatusOr<json> doc = ParseDocument(text);
  if (!doc.ok()) return doc.status();
  absl::StatusOr<SettingsSources> src = SettingsSourcesFromJson(*doc);
  if (!src.ok()) return src.status();
  absl::StatusOr<Settings> settings = ResolveSettings(*src);
  if (!settings.ok()) return settings.status();
  absl::StatusOr<std::unique_ptr<Store>> store = Store::Create(settings->store);
  if (!store.ok()) return store.status();
  return OpenedStore{*std::move(store), *std::move(settings)};
}

json VerbsJson() { return VerbTableJson(); }

json SettingsTableJson() {
  static constexpr const char* kTypes[] = {"text", "secret", "bool", "port", "count", "seconds"};
  static constexpr const char* kGroups[] = {"connection", "cluster", "lock", "timeouts", "history"};
  json rows = json::array();
  for (size_t i = 0; i < kSettingsCount; ++i) {
    const SettingSpec& s = kSettings[i];
    rows.push_back({{"key", s.key},
                    {"type", kTypes[static_cast<int>(s.type)]},
                    {"group", kGroups[static_cast<int>(s.group)]},
                    {"default", DefaultText(s)},
                    {"meltano", s.meltano_core ? absl::StrCat("state_backend.", s.key)
                                               : absl::StrCat("state_backend.clickhouse.", s.key)},
                    {"env", s.env},
                    {"cli_flag", absl::StrCat("--", CliFlag(s))},
                    {"meaning", s.meaning}});
  }
  json renamed = json::object();
  for (size_t i = 0; i < kRenamedSettingsCount; ++i) renamed[kRenamedSettings[i].old_key] = kRenamedSettings[i].new_key;
  return json{{"settings", std::move(rows)}, {"renamed", std::move(renamed)}};
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

json DiagnosticJson(const Diagnostic& d) {
  json numbers = json::object();
  for (const auto& [k, v] : d.numbers) numbers[k] = v;
  json texts = json::object();
  for (const auto& [k, v] : d.texts) texts[k] = v;
  json e = {{"kind", DiagnosticKindName(d.kind)}, {"level", DiagnosticLevelName(d.level)}, {"at_ms", d.at_ms},
            {"message", d.message},           {"line", DiagnosticLine(d)},           {"numbers", std::move(numbers)},
            {"texts", std::move(texts)}};
  if (!d.state_id.empty()) e["state_id_hex"] = HexEncode(d.state_id);
  return e;
}

json OpDriver::WithEvents(json doc) {
  json events = json::array();
  while (std::optional<Diagnostic> d = conn_.PollDiagnostic()) events.push_back(DiagnosticJson(*d));
  if (!events.empty()) doc["events"] = std::move(events);
  return doc;
}

json OpDriver::Abort(const absl::Status& status, const Inputs& in) {
  if (uint64_t op = conn_.running(); op != 0) conn_.Abandon(op, in);
  return FailedJson(status);
}

json OpDriver::Next(const Inputs& in) {
  ConnectionOutput out = conn_.Poll();
  switch (out.kind) {
    case ConnectionOutput::Kind::kEnded: {
      if (!out.event.ok) return FailedJson(out.event.status);
      json done = ResultJson(out.event.result);
      if (merged_) AddMergedViews(done["done"]);
      return done;
    }
    case ConnectionOutput::Kind::kTransmit:
      return RequestJson(out.transmit.request);
    case ConnectionOutput::Kind::kWait:
      if (out.at_ms) return json{{"wait_ms", std::max<int64_t>(*out.at_ms - in.now_ms, 0)}};
      break;
    case ConnectionOutput::Kind::kIdle:
      // The connection's own op (an idle timer's) ended well: a renewal's
      // success is no event.
      return json{{"idle", {{"next_timeout_ms", out.at_ms ? json(*out.at_ms) : json(nullptr)}}}};
  }
  return Abort(absl::InternalError("the operation neither finished nor asked for anything"), in);
}

std::optional<std::string> TakeDocument(json* action) {
  auto done = action->find("done");
  if (done == action->end() || !done->is_object()) return std::nullopt;
  auto doc = done->find("document");
  if (doc == done->end() || !doc->is_string()) return std::nullopt;
  std::string out = std::move(doc->get_ref<std::string&>());
  done->erase(doc);
  (*done)["document_bytes"] = out.size();
  return out;
}

json OpDriver::Start(absl::string_view op_document, const Inputs& defaults, std::optional<std::string> document) {
  return WithEvents(StartOp(op_document, defaults, std::move(document)));
}

json OpDriver::Feed(absl::string_view answer_document, const Inputs& defaults, std::optional<std::string> body) {
  return WithEvents(FeedAnswer(answer_document, defaults, std::move(body)));
}

json OpDriver::StartOp(absl::string_view op_document, const Inputs& defaults, std::optional<std::string> document) {
  if (uint64_t running = conn_.running(); running != 0) conn_.Abandon(running, defaults);
  absl::StatusOr<json> op = ParseDocument(op_document);
  if (!op.ok()) return Abort(op.status(), defaults);
  if (document) {
    if (op->contains("document")) {
      return Abort(absl::InvalidArgumentError("the op's \"document\" is given twice: in the op document and apart "
                                              "from it; give it once"),
                   defaults);
    }
    (*op)["document"] = *std::move(document);
  }
  absl::StatusOr<Inputs> in = InputsFromJson(*op, defaults);
  if (!in.ok()) return Abort(in.status(), defaults);
  merged_ = false;
  absl::StatusOr<std::unique_ptr<Task>> task = absl::InternalError("");
  if (auto c = op->find("close"); c != op->end()) {
    if (!c->is_boolean() || !c->get<bool>() || op->contains("op")) {
      return Abort(absl::InvalidArgumentError("a close document is {\"close\": true} and nothing else"), *in);
    }
    task = conn_.store().Close();
  } else {
    task = TaskForVerb(conn_.store(), *op);
  }
  if (!task.ok()) return Abort(task.status(), *in);
  if (auto m = op->find("merged"); m != op->end()) {
    if (!m->is_boolean()) {
      return Abort(absl::InvalidArgumentError("\"merged\" must be true or false (true: a state in the result "
                                              "also carries its merged view)"),
                   *in);
    }
    merged_ = m->get<bool>();
  }
  conn_.Start(*std::move(task), *in);
  return Next(*in);
}

json OpDriver::FeedAnswer(absl::string_view answer_document, const Inputs& defaults,
                          std::optional<std::string> body) {
  absl::StatusOr<json> answer = ParseDocument(answer_document);
  if (!answer.ok()) return Abort(answer.status(), defaults);
  absl::StatusOr<Inputs> in = InputsFromJson(*answer, defaults);
  if (!in.ok()) return Abort(in.status(), defaults);
  if (conn_.idle()) {
    // No op runs: only the idle timer is expected.
    if (answer->contains("timer") && !answer->contains("response")) {
      conn_.HandleTimeout(*in);
      return Next(*in);
    }
    return FailedJson(absl::FailedPreconditionError(
        "no operation is waiting for an answer: start one first (it may have finished or failed already); "
        "while none runs, only {\"timer\": true} (the idle timer) is taken"));
  }
  if (conn_.awaiting_answer()) {
    absl::StatusOr<SqlResponse> resp = ResponseFromJson(*answer);
    if (!resp.ok()) return Abort(resp.status(), *in);
    if (body) {
      const json& r = (*answer)["response"];
      if (r.contains("body") || r.contains("body_hex")) {
        return Abort(absl::InvalidArgumentError("the response's body is given twice: in the response document and "
                                                "apart from it; give it once"),
                     *in);
      }
      resp->body = *std::move(body);
    }
    if (absl::Status st = conn_.HandleResponse(conn_.running(), *resp, *in); !st.ok()) return Abort(st, *in);
    return Next(*in);
  }
  if (!answer->contains("timer")) {
    return Abort(absl::InvalidArgumentError("expected a {\"timer\": true} line after the wait"), *in);
  }
  conn_.HandleTimeout(*in);
  return Next(*in);
}

}  // namespace chstate::protocol
