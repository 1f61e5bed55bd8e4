/* The chstate C ABI: the state store behind a sans-IO interface any language
 * can load (Python's ctypes, LuaJIT's ffi, a Wasm host). The library never
 * touches the network, the clock, the environment, files or a random source:
 * the caller runs the SQL it asks for and passes the time and random bytes
 * with every call. Documents are the JSON of hosts/common/protocol.h (the
 * same as tools/pipe_host's lines).
 *
 *   char* err = NULL;
 *   chstate_store* s = chstate_store_new("{\"values\":{\"uri\":\"clickhouse://me@db:8123/default\"}}", &err);
 *   char* settings = chstate_store_settings(s);   // where to connect, as whom (for the transport)
 *   char* action = chstate_op_start(s, "{\"op\":\"get\",\"state_id_hex\":\"6465763a61\"}",
 *                                   now_ms, random, 32);
 *   while (action is {"request":...} or {"wait_ms":...}) {
 *     ... run the SQL (or sleep) ...
 *     chstate_string_free(action);
 *     action = chstate_op_feed(s, "{\"response\":{...}}" or "{\"timer\":true}", now_ms, random, 32);
 *   }
 *   ... action is {"done":{...}} or {"failed":{"code":...,"message":...}} ...
 *   chstate_string_free(action);
 *   chstate_store_free(s);
 *
 * Memory ownership:
 * - Every `char*` a chstate_* function returns was allocated by the library,
 *   is NUL-terminated UTF-8 JSON, belongs to the caller and must be released
 *   exactly once with chstate_string_free (never free(): the library may use
 *   another allocator). NULL is returned only if memory ran out.
 * - Every `const char*` / `const unsigned char*` argument is borrowed for the
 *   duration of the call only; the library keeps no pointer to it.
 * - A chstate_store is created by chstate_store_new and released by
 *   chstate_store_free, which also abandons an unfinished operation.
 *
 * Threads: a store is not thread-safe; run one operation at a time on it (the
 * store remembers held locks and the server's dialect between operations).
 * Different stores are independent. No function throws or aborts on bad input.
 *
 * Transport: send each {"request": ...} exactly once, allowing it its "timeout_ms", and feed
 * back what happened: the answer, or {"transport_ok": false, "transport_error": ...,
 * "maybe_delivered": BOOL} (false only when the request certainly never reached the server,
 * e.g. connection refused). Never resend on your own: when a resend is safe the library
 * answers with {"wait_ms": N} and then the same request with "attempt" + 1 (core/task.h).
 *
 * Time and randomness: `now_ms` is milliseconds on any monotonic clock (only
 * differences matter); `random` must point at 16 or more fresh bytes from a
 * cryptographic source on every call (lock ids and insert tokens are made from
 * them). A document may carry "now_ms"/"random_hex" to override them.
 */
#ifndef CHSTATE_HOSTS_COMMON_CHSTATE_H_
#define CHSTATE_HOSTS_COMMON_CHSTATE_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Bumped on any incompatible change of a signature, a document or the host's duties
 * (2: resends after transport failures moved from the hosts into the library;
 *  3: stores open from the user's raw settings, ops are the verbs of core/verbs.h,
 *     the idle timer and close are inputs). */
#define CHSTATE_ABI_VERSION 3

typedef struct chstate_store chstate_store;

/* CHSTATE_ABI_VERSION of the loaded library; callers check it first. */
int32_t chstate_abi_version(void);

/* The verb table every binding builds its API from: {"verbs": [{"name", "args": [...], "lock",
 * "checks", "returns", "summary"}, ...]} (core/verbs.h). */
char* chstate_verbs(void);

/* The settings table: {"settings": [{"key", "type", "group", "default", "meltano", "env",
 * "cli_flag", "meaning"}, ...], "renamed": {old: new}} (core/settings.h). */
char* chstate_settings_table(void);

/* Resolves a settings document (hosts/common/protocol.h "settings": {"from", "values", "env",
 * "host"}) without opening a store: {"settings": {"connection", "store", "origin"}} or
 * {"failed": ...}. The connection holds the password (the transport needs it); no message
 * contains it. */
char* chstate_resolve_settings(const char* settings_json);

/* Opens a store from a settings document (the user's settings as given; the core resolves
 * them, every default included). On failure returns NULL and, when `error_json` is not NULL,
 * sets *error_json to a {"failed": ...} document the caller frees with chstate_string_free. */
chstate_store* chstate_store_new(const char* settings_json, char** error_json);

/* What the store was opened with: {"settings": {"connection": {host, port, hosts, secure,
 * user, password, database, ca_file, connect_timeout_ms, redacted_uri, endpoint, chdb_path},
 * "store": {...}, "origin": {...}}}. A transport connects within connect_timeout_ms (each
 * request carries its own timeout_ms) to the host and port each request names. */
char* chstate_store_settings(chstate_store* store);

/* Releases a store and any unfinished operation. NULL is ignored. */
void chstate_store_free(chstate_store* store);

/* Starts a verb ({"op": VERB, ...}) or a close ({"close": true}) and returns its first
 * action: {"request": ...}, {"wait_ms": N}, {"done": ...} or {"failed": ...}. An
 * unfinished earlier operation on this store is abandoned. */
char* chstate_op_start(chstate_store* store, const char* op_json, int64_t now_ms, const unsigned char* random,
                       size_t random_len);

/* Answers the last action ({"response": ...} after a request, {"timer": true} after a
 * wait) and returns the next one. While no operation runs, {"timer": true} is the idle
 * timer (due at the last "done"'s next_timeout_ms): held locks are renewed, lingering
 * ones released; it ends in {"idle": {"next_timeout_ms": N|null}} or {"failed": ...}. */
char* chstate_op_feed(chstate_store* store, const char* input_json, int64_t now_ms, const unsigned char* random,
                      size_t random_len);

/* chstate_op_start and chstate_op_feed with the one large text of each side handed across as
 * bytes, neither escaped into JSON nor hex-encoded (an import document or an export page is
 * a hundred megabytes or more; an answer body as large):
 * - `data` (`data_len` bytes; NULL for none) is the op's "document" (import_document), or
 *   the body of the {"response": {...}} answer; the JSON then has no such field.
 * - When `out_document` is not NULL and the action is a "done" carrying a "document" (an
 *   export page's entries), *out_document is set to that document (NUL-terminated, to be
 *   released with chstate_string_free), *out_document_len to its length, and the JSON has
 *   "document_bytes": LENGTH in its place; otherwise *out_document is set to NULL. */
char* chstate_op_start_bytes(chstate_store* store, const char* op_json, const unsigned char* data, size_t data_len,
                             int64_t now_ms, const unsigned char* random, size_t random_len, char** out_document,
                             size_t* out_document_len);
char* chstate_op_feed_bytes(chstate_store* store, const char* input_json, const unsigned char* data, size_t data_len,
                            int64_t now_ms, const unsigned char* random, size_t random_len, char** out_document,
                            size_t* out_document_len);
/* Releases a string returned by any chstate_* function. NULL is ignored. */
void chstate_string_free(char* s);

#ifdef __cplusplus
}
#endif

#endif /* CHSTATE_HOSTS_COMMON_CHSTATE_H_ */
