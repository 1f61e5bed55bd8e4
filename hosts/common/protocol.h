// The JSON protocol every out-of-process or foreign-language host speaks to
// drive a chstate store: a store opened from the user's raw settings, one
// verb in, then "run this SQL" / "wait" requests out and their answers in,
// until "done" or "failed". tools/pipe_host speaks it as JSON lines; the C
// ABI (hosts/common/chstate.h: the Python adapter, LuaJIT's FFI, the Wasm
// module and the Extism plugin) passes the same documents as strings.
//
//   absl::StatusOr<OpenedStore> opened = OpenStore(R"({"values":{"uri":"clickhouse://me@db/default"}})");
//   chstate::protocol::OpDriver driver(opened->store.get());
//   nlohmann::json action = driver.Start(R"({"op":"get","state_id_hex":"6465763a61"})", inputs);
//   while (action.contains("request") || action.contains("wait_ms")) {
//     std::string answer = ...;  // {"response":{...}} or {"timer":true}
//     action = driver.Feed(answer, fresh_inputs);
//   }
//   // action is {"done":{...}} or {"failed":{"code":"NOT_FOUND","message":"..."}}
//
// Documents (state ids travel as hex so any bytes cross JSON unchanged):
//
//   settings {"from": "api"|"cli"|"meltano", "values": {KEY: value, ...},
//             "env": {NAME: value, ...}, "host": {"timers": bool, "exit_release": bool,
//             "diagnostics": "none"|"warning"|"info"|"debug", "show_states": bool}}
//            The user's settings as they gave them (core/settings.h): values
//            may be strings, numbers or booleans (null or "" = not given);
//            "host" says what the host can do (lock policy follows from it).
//            Resolved: {"settings": {"connection": {host, port, hosts, secure,
//            user, password, database, ca_file, connect_timeout_ms,
//            redacted_uri, endpoint, chdb_path}, "store": {the store's
//            options}, "origin": {KEY: where it came from}}}.
//   op       a verb document {"op": VERB, ...}: the verbs and their arguments
//            are core/verbs.h's table (VerbTableJson). {"merged": true} adds
//            each state's merged view (partial over completed, Meltano's
//            rules) as "merged", so no host needs merge rules of its own.
//   close    {"close": true} in place of an op: releases every lock the store
//            holds or keeps lingering; done's "count" says how many.
//   request  {"request":{"sql":"...","url_params":[["k","v"],...],"purpose":"get_state","idempotent":true,
//                        "attempt":1,"timeout_ms":30000[,"host":"h1","port":8123]}}: send it once
//            within timeout_ms; the core resends (a wait, then the same request
//            with attempt + 1) when that is safe
//   response {"response":{"transport_ok":true,"http_status":200,"exception_code_header":"",
//                         "body_hex":"..."}} ("body" may replace "body_hex";
//            "transport_ok":false comes with "transport_error" and "maybe_delivered")
//   wait     {"wait_ms":1000}, answered by {"timer":true}
//   idle     {"timer":true} fed while no op runs, at or after next_timeout_ms:
//            the store renews held locks that are due and releases lingering
//            ones (a request or two may follow, answered as usual); it ends in
//            {"idle":{"next_timeout_ms":N|null}} or {"failed":...} (ABORTED: a
//            held lock was found lost).
//   done     {"done":{"state":{"state_id_hex":..,"completed":{..},"partial":{..}}|null,
//                     "state_ids_hex":[..],"count":0,"server_version":"26.9.2.1",
//                     "dialect":"modern","lock_id":"","waited_ms":0,"next_timeout_ms":N|null}}
//            next_timeout_ms: when the store next needs an idle timer (a held
//            lock's renewal, a lingering lock's release), on the host's clock;
//            null when it holds no lock. A host that can run code while its
//            user's code runs (an event loop, a thread) feeds {"timer":true}
//            then, so that a lock scope keeps its lock however long it runs.
//            export's done also has "states" (sorted by id) and "more" (more may
//            follow: ask again after the last id; a page is never empty while more
//            follow); history's
//            "versions" [{"version","unix_ms","updated_at","current","state"}],
//            newest first; locks and unlock have "locks" [{"state_id_hex"|null,
//            "table","holder","held_s","renewed_s","validity_s","stale"}].
//   failed   {"failed":{"code":"NOT_FOUND","message":"..."}} (code: absl::StatusCode name)
//   events   any action document may also carry "events": [{"kind": "lock_waiting"|"lock_acquired"|
//            "lease_renewed"|"lease_lost"|"lock_yielded"|"resent"|"host_down"|"quorum_busy"|
//            "history_pruned"|"statement", "level": "warning"|"info"|"debug", "at_ms": N,
//            "message": "...", "line": "...", "state_id_hex": "..." (when it concerns an id),
//            "numbers": {NAME: N}, "texts": {NAME: "..."}}], what the store told since the last document
//            (core/diagnostics.h): only when the settings document's "host" asked for a
//            "diagnostics" level ("none" by default; "show_states": true keeps states'
//            contents in debug statements). "line" is what a host's log shows: the
//            message, and a statement's SQL after it (DiagnosticLine).
//
// Any op or answer document may also carry "now_ms" (integer) and
// "random_hex", which override the time and random bytes the host supplied
// for that input (tests use them to script the clock).
//
// Errors: a malformed document ends the current operation with a "failed"
// action of code INVALID_ARGUMENT; an answer while no operation runs, or of
// the wrong kind, gives "failed" with INVALID_ARGUMENT or FAILED_PRECONDITION.
// Nothing here throws.
#ifndef CHSTATE_HOSTS_COMMON_PROTOCOL_H_
#define CHSTATE_HOSTS_COMMON_PROTOCOL_H_

#include <memory>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/config.h"
#include "core/settings.h"
#include "core/connection.h"
#include "core/sql_request.h"
#include "core/store.h"
#include "core/task.h"
#include "core/verbs.h"
#include <nlohmann/json.hpp>

namespace chstate::protocol {

// ---- documents <-> core types ----

// Parses one document; it must be a JSON object.
absl::StatusOr<nlohmann::json> ParseDocument(absl::string_view text);

// Decodes hex (either case). Errors name `field`.
absl::StatusOr<std::string> HexDecode(absl::string_view hex, absl::string_view field);

// {"request": {...}}.
nlohmann::json RequestJson(const SqlRequest& request);
// {"done": {...}}.
nlohmann::json ResultJson(const Result& result);
// One diagnostic (core/diagnostics.h) as an "events" entry.
nlohmann::json DiagnosticJson(const Diagnostic& d);
// {"failed": {"code": ..., "message": ...}}.
nlohmann::json FailedJson(const absl::Status& status);

// Reads the "response" member of an answer document.
absl::StatusOr<SqlResponse> ResponseFromJson(const nlohmann::json& answer);

// `defaults` with the document's "now_ms" / "random_hex" overrides applied.
absl::StatusOr<Inputs> InputsFromJson(const nlohmann::json& doc, Inputs defaults);

// The settings document's sources (see above).
absl::StatusOr<SettingsSources> SettingsSourcesFromJson(const nlohmann::json& doc);
// {"settings": {...}} for resolved settings (the password included: the
// host's transport needs it; no message contains it).
nlohmann::json SettingsJson(const Settings& settings);
// Resolves a settings document: {"settings": ...} or {"failed": ...}.
nlohmann::json ResolveSettingsJson(absl::string_view settings_document);

// A store opened from a settings document, with what it was opened with.
struct OpenedStore {
  std::unique_ptr<Store> store;
  Settings settings;
};
absl::StatusOr<OpenedStore> OpenStore(absl::string_view settings_document);

// The tables hosts bind and docs print: {"verbs": [...]} (core/verbs.h) and
// {"settings": [{"key","type","group","default","meltano","env","cli_flag","meaning"}]}.
nlohmann::json VerbsJson();
nlohmann::json SettingsTableJson();

// Serialises a document on one line. Never throws: invalid UTF-8 (impossible
// for what the core produces) becomes U+FFFD.
std::string Dump(const nlohmann::json& doc);

// ---- driving one operation at a time ----

// Adds "merged" (DeepMerge of completed and partial) to each state of a
// "done" document's body: "state", each of "versions" and of "states". An op
// document with {"merged": true} gets this from OpDriver.
void AddMergedViews(nlohmann::json& done);

// The protocol's view of a chstate::Connection (core/connection.h), one op
// at a time: each input document is handed to the connection, and its next
// output (Connection::Poll) is the action document ("after every input,
// take the next action"): "done"/"failed" an op that ended, "request" a
// transmit, "wait_ms" the running op's timer (from now), "idle" nothing
// running; {"timer":true} is HandleTimeout (the idle timer while nothing
// runs). Starting an op while another is unfinished abandons the old one (a
// host that lost interest need not drain it).
// Moves the document out of a "done" action that carries one (an export
// page's entries, "document"), leaving "document_bytes" (its length) in its
// place: for a host that takes the document apart from the JSON
// (chstate_op_start_bytes). Nothing for any other action.
std::optional<std::string> TakeDocument(nlohmann::json* action);

class OpDriver {
 public:
  explicit OpDriver(Store* store) : conn_(store) {}

  // Starts the op in `op_document`; returns its first action. `document`,
  // when given, is the op's "document" (import_document's text), handed
  // over apart from the JSON: the op document then has none.
  nlohmann::json Start(absl::string_view op_document, const Inputs& inputs,
                       std::optional<std::string> document = std::nullopt);
  // Answers the last request ({"response": ...}) or wait ({"timer": true});
  // returns the next action. A malformed answer ends the op with "failed".
  // A timer answered before the wait is over gives a wait for the rest.
  // `body`, when given, is the response's body, handed over apart from the
  // JSON: the response then has neither "body" nor "body_hex".
  nlohmann::json Feed(absl::string_view answer_document, const Inputs& inputs,
                      std::optional<std::string> body = std::nullopt);

  // True while an op runs (the caller's, or the connection's own renewal
  // started by an idle timer).
  bool busy() const { return !conn_.idle(); }

 private:
  nlohmann::json StartOp(absl::string_view op_document, const Inputs& inputs, std::optional<std::string> document);
  nlohmann::json FeedAnswer(absl::string_view answer_document, const Inputs& inputs,
                            std::optional<std::string> body);
  // `doc` with the diagnostics the store told since the last document
  // ("events"), when there are any.
  nlohmann::json WithEvents(nlohmann::json doc);
  // The connection's next output (Connection::Poll) as a document: the
  // driver keeps no state of its own but whether the op asked for merged
  // views.
  nlohmann::json Next(const Inputs& in);
  nlohmann::json Abort(const absl::Status& status, const Inputs& in);

  Connection conn_;
  bool merged_ = false;  // the running op's {"merged": true}
};

}  // namespace chstate::protocol

#endif  // CHSTATE_HOSTS_COMMON_PROTOCOL_H_
