// The JSON protocol every out-of-process or foreign-language host speaks to
// drive chstate::Store: one op in, then "run this SQL" / "wait" requests out
// and their answers in, until "done" or "failed". tools/pipe_host speaks it as
// JSON lines; the C ABI (hosts/common/chstate.h, loaded by the Python adapter
// and later the Wasm and Lua hosts) passes the same documents as strings.
//
//   chstate::protocol::OpDriver driver(store.get());
//   nlohmann::json action = driver.Start(R"({"op":"get","state_id_hex":"6465763a61"})", inputs);
//   while (action.contains("request") || action.contains("wait_ms")) {
//     std::string answer = ...;  // {"response":{...}} or {"timer":true}
//     action = driver.Feed(answer, fresh_inputs);
//   }
//   // action is {"done":{...}} or {"failed":{"code":"NOT_FOUND","message":"..."}}
//
// Documents (state ids travel as hex so any bytes cross JSON unchanged):
//
//   op       {"op":"get","state_id_hex":"..."}; ops: ping, init, get, set, set_locked,
//            update, delete, delete_locked, list ("pattern": string|null, or
//            "pattern_hex"), clear_all, copy/move ("src_hex","dst_hex"),
//            acquire_lock, renew_lock, release_lock ("lock_id"), tick (renews every
//            held lock that is due, and releases lingering locks that are idle: call it
//            at "next_timeout_ms"), release_lingering (releases every lingering lock:
//            the store option "linger_locks"; "count": how many); set, set_locked
//            and update carry "state": {"completed": {...}, "partial": {...}};
//            export_page (Meltano's get_all, a page at a time: "pattern"/"pattern_hex",
//            "after_hex" (the last id of the previous page, or absent), "limit" (default
//            1000)); import (Meltano's set_all: "states": [{"state_id_hex": ...,
//            "completed": {...}, "partial": {...}}, ...], all checked before any is sent);
//            history ("state_id_hex", "limit": versions, default 20); rollback
//            ("state_id_hex", "version": a name history gave).
//   request  {"request":{"sql":"...","url_params":[["k","v"],...],"purpose":"get_state","idempotent":true,
//                        "attempt":1,"timeout_ms":30000}}: send it once within timeout_ms; the core
//            resends (a wait, then the same request with attempt + 1) when that is safe
//   response {"response":{"transport_ok":true,"http_status":200,"exception_code_header":"",
//                         "body_hex":"..."}} ("body" may replace "body_hex";
//            "transport_ok":false comes with "transport_error" and "maybe_delivered")
//   wait     {"wait_ms":1000}, answered by {"timer":true}
//   done     {"done":{"state":{"state_id_hex":..,"completed":{..},"partial":{..}}|null,
//                     "state_ids_hex":[..],"count":0,"server_version":"26.9.2.1",
//                     "dialect":"modern","lock_id":"","waited_ms":0,"next_timeout_ms":N|null}}
//            next_timeout_ms: when the store next needs a tick (a held lock's
//            renewal), on the host's clock; null when it holds no lock.
//            export_page's done also has "states": [{"state_id_hex","completed","partial"}, ...]
//            (sorted by id) and "more": true when more may follow (ask for the next
//            page with "after_hex" = its last id; a page is never empty while more follow). history's done has "versions":
//            [{"version","unix_ms","updated_at","current","state":{"completed","partial"}}, ...]
//            newest first; rollback's has the restored "state"
//   failed   {"failed":{"code":"NOT_FOUND","message":"..."}} (code: absl::StatusCode name)
//
// An op document with "merged": true gets, in every state of its "done"
// ("state", each of "versions" and "states"), a "merged" member too: partial
// over completed by Meltano's rules (core/state.h DeepMerge), so that a host
// shows the view a tap gets without merge rules of its own.
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
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/config.h"
#include "core/connection.h"
#include "core/sql_request.h"
#include "core/store.h"
#include "core/task.h"
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
// {"failed": {"code": ..., "message": ...}}.
nlohmann::json FailedJson(const absl::Status& status);

// Reads the "response" member of an answer document.
absl::StatusOr<SqlResponse> ResponseFromJson(const nlohmann::json& answer);

// `defaults` with the document's "now_ms" / "random_hex" overrides applied.
absl::StatusOr<Inputs> InputsFromJson(const nlohmann::json& doc, Inputs defaults);

// Builds the task an op document asks for (not started).
absl::StatusOr<std::unique_ptr<Task>> TaskForOp(Store& store, const nlohmann::json& op);

// Store options from {"schema","table","endpoint","lock_timeout_ms",
// "lock_retry_ms","stale_lock_ms","mutation_timeout_ms","request_timeout_ms",
// "history_days","cluster","zookeeper_path","replica"} (all optional;
// unknown keys are an error so typos do not pass silently).
absl::StatusOr<StoreOptions> StoreOptionsFromJson(const nlohmann::json& options);

// Config resolution from {"flags": {...}, "env": {...}}: values may be
// strings, integers or booleans (null or "" = not given); flag keys are "uri"
// and kSettingKeys. Returns {"config": {host, port, secure, user, password,
// database, schema, table, ca_file, redacted_uri, origin}} or {"failed": ...}.
// The password is returned to the caller (its transport needs it) but no
// message and no other field ever contains it.
nlohmann::json ResolveConfigJson(absl::string_view sources_json);

// Serialises a document on one line. Never throws: invalid UTF-8 (impossible
// for what the core produces) becomes U+FFFD.
std::string Dump(const nlohmann::json& doc);

// ---- driving one operation at a time ----

// The protocol's view of a chstate::Connection (core/connection.h): one op at
// a time, each input document turned into the next action document ("after
// every input, take the next action"): "request" is the connection's
// PollTransmit, "wait_ms" its PollTimeout (from now), "done"/"failed" its
// PollEvent. Starting an op while another is unfinished abandons the old
// one (a host that lost interest, e.g. after an exception, need not drain it).
// Adds "merged" (DeepMerge of completed and partial) to each state of a
// "done" document's body: "state", each of "versions" and of "states". An op
// document with {"merged": true} gets this from OpDriver.
void AddMergedViews(nlohmann::json& done);

class OpDriver {
 public:
  explicit OpDriver(Store* store) : conn_(store) {}

  // Starts the op in `op_document`; returns its first action.
  nlohmann::json Start(absl::string_view op_document, const Inputs& inputs);
  // Answers the last request ({"response": ...}) or wait ({"timer": true});
  // returns the next action. A malformed answer ends the op with "failed".
  // A timer answered before the wait is over gives a wait for the rest.
  nlohmann::json Feed(absl::string_view answer_document, const Inputs& inputs);

  // True while an op waits for an answer.
  bool busy() const { return op_ != 0; }

 private:
  // The connection's next output for the running op, as a document.
  nlohmann::json Next(const Inputs& in);
  nlohmann::json Abort(const absl::Status& status, const Inputs& in);

  Connection conn_;
  uint64_t op_ = 0;  // the running op (0: none)
  bool merged_ = false;  // the running op's {"merged": true}
  bool awaiting_sql_ = false;
};

}  // namespace chstate::protocol

#endif  // CHSTATE_HOSTS_COMMON_PROTOCOL_H_
