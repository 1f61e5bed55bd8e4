// chstate as an Extism plugin (chstate_extism.wasm): the same sans-IO core as
// chstate.wasm, with exports shaped the way Extism calls plugins. Each export
// takes no arguments and returns 0; its input is one JSON document read
// through Extism's input functions and its output one JSON document set
// through output_set. The plugin has no clock and no randomness, so the time
// and fresh random bytes come in every document that may need them:
//
//   verbs           (no input)                             -> {"verbs": [...]} (core/verbs.h)
//   resolve_settings  a settings document (hosts/common/protocol.h) -> {"settings": {...}} | {"failed": ...}
//   store_new       a settings document                   -> {"store": N, "settings": {...}} | {"failed": ...}
//   op_start        {"store": N, "now_ms": T, "random_hex": "<32+ hex>", "op": {...}}
//   op_feed         {"store": N, "now_ms": T, "random_hex": "...", "answer": {"response": ...} | {"timer": true}}
//                   -> the next action: {"request": ...}, {"wait_ms": N}, {"done": ...} or {"failed": ...}
//   store_free      {"store": N}                           -> {"freed": true} | {"failed": ...}
//
// The host SDK runs the request the core asks for (its own HTTP, or Extism's
// http_request within allowed_hosts), sleeps for waits and feeds the answer:
// the same pump as every other host (docs/wasm.md).
//
// What the store tells beside its results (docs/diagnostics.md) is logged the
// way Extism plugins log, through the runtime's log_warn / log_info /
// log_debug: the host's Extism logger shows it (JS: createPlugin's `logger`;
// Python: extism.set_log_file or set_log_custom; each SDK filters by its own
// level). The core makes events only at the level the settings document asks
// for ("host": {"diagnostics": "info"}; none by default), and the action
// documents carry them as "events" too. Malformed
// input of any kind is a {"failed": {"code": "INVALID_ARGUMENT", ...}}
// document, never a trap; a store handle is valid from store_new until
// store_free, in the plugin instance that made it.
#include <cstdint>
#include <map>
#include <string>

#include "hosts/common/chstate.h"
#include <nlohmann/json.hpp>

#define EXTISM_IMPORT(name) extern "C" __attribute__((import_module("extism:host/env"), import_name(name)))
#define EXTISM_EXPORT(name) extern "C" __attribute__((export_name(name), used))

// Extism's kernel functions (every offset and length is an i64).
EXTISM_IMPORT("input_length") uint64_t extism_input_length(void);
EXTISM_IMPORT("input_load_u8") uint8_t extism_input_load_u8(uint64_t offset);
EXTISM_IMPORT("input_load_u64") uint64_t extism_input_load_u64(uint64_t offset);
EXTISM_IMPORT("alloc") uint64_t extism_alloc(uint64_t length);
EXTISM_IMPORT("store_u8") void extism_store_u8(uint64_t offset, uint8_t value);
EXTISM_IMPORT("store_u64") void extism_store_u64(uint64_t offset, uint64_t value);
EXTISM_IMPORT("output_set") void extism_output_set(uint64_t offset, uint64_t length);
EXTISM_IMPORT("free") void extism_free(uint64_t offset);
EXTISM_IMPORT("log_warn") void extism_log_warn(uint64_t offset);
EXTISM_IMPORT("log_info") void extism_log_info(uint64_t offset);
EXTISM_IMPORT("log_debug") void extism_log_debug(uint64_t offset);

namespace {

using json = nlohmann::json;

// Documents larger than this are refused (as chstate.wasm refuses them).
constexpr uint64_t kMaxInput = 16u << 20;

std::map<int64_t, chstate_store*>& Stores() {
  static auto* stores = new std::map<int64_t, chstate_store*>();
  return *stores;
}
int64_t next_handle = 1;

// The stores whose settings document asked for diagnostics: their actions'
// events are logged (the others' documents are not parsed for them).
std::map<int64_t, bool>& Telling() {
  static auto* telling = new std::map<int64_t, bool>();
  return *telling;
}

bool ReadInput(std::string* out) {
  const uint64_t n = extism_input_length();
  if (n > kMaxInput) return false;
  out->resize(n);
  uint64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const uint64_t word = extism_input_load_u64(i);
    for (int b = 0; b < 8; ++b) (*out)[i + b] = static_cast<char>((word >> (8 * b)) & 0xff);
  }
  for (; i < n; ++i) (*out)[i] = static_cast<char>(extism_input_load_u8(i));
  return true;
}


// A block of Extism's memory holding `text` (the caller frees it).
uint64_t Block(const std::string& text) {
  const uint64_t n = text.size();
  const uint64_t at = extism_alloc(n);
  uint64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    uint64_t word = 0;
    for (int b = 7; b >= 0; --b) word = (word << 8) | static_cast<unsigned char>(text[i + b]);
    extism_store_u64(at + i, word);
  }
  for (; i < n; ++i) extism_store_u8(at + i, static_cast<uint8_t>(text[i]));
  return at;
}

// Logs each event of an action document through the runtime's log function
// of its level, its line as the core made it.
void LogEvents(const std::string& action_text) {
  if (action_text.find("\"events\"") == std::string::npos) return;
  const json action = json::parse(action_text, nullptr, /*allow_exceptions=*/false);
  if (action.is_discarded() || !action.is_object()) return;
  auto events = action.find("events");
  if (events == action.end() || !events->is_array()) return;
  for (const json& e : *events) {
    if (!e.is_object() || !e.contains("line") || !e["line"].is_string() || !e.contains("level")) continue;
    const std::string level = e["level"].is_string() ? e["level"].get<std::string>() : "";
    const uint64_t at = Block("chstate: " + e["line"].get<std::string>());
    if (level == "warning") {
      extism_log_warn(at);
    } else if (level == "debug") {
      extism_log_debug(at);
    } else {
      extism_log_info(at);
    }
    extism_free(at);
  }
}

int32_t Output(const std::string& doc) {
  extism_output_set(Block(doc), doc.size());
  return 0;
}

// Copies a C ABI document out and frees it.
int32_t OutputOwned(char* doc) {
  if (doc == nullptr) return Output(R"({"failed":{"code":"RESOURCE_EXHAUSTED","message":"out of memory"}})");
  std::string copy(doc);
  chstate_string_free(doc);
  return Output(copy);
}

int32_t Failed(const std::string& message) {
  json doc = {{"failed", {{"code", "INVALID_ARGUMENT"}, {"message", message}}}};
  return Output(doc.dump(-1, ' ', false, json::error_handler_t::replace));
}

// The input as a JSON object; false (with the failure already output) when not.
bool InputObject(json* doc) {
  std::string text;
  if (!ReadInput(&text)) {
    Failed("the input is larger than 16 MiB");
    return false;
  }
  *doc = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (doc->is_discarded() || !doc->is_object()) {
    Failed("the input is not a JSON object");
    return false;
  }
  return true;
}

chstate_store* StoreOf(const json& doc) {
  auto it = doc.find("store");
  if (it == doc.end() || !it->is_number_integer()) return nullptr;
  auto found = Stores().find(it->get<int64_t>());
  return found == Stores().end() ? nullptr : found->second;
}

int HexDigit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// "now_ms" and "random_hex" of an op_start/op_feed document.
bool TimeAndRandom(const json& doc, int64_t* now_ms, std::string* random) {
  auto now = doc.find("now_ms");
  auto hex = doc.find("random_hex");
  if (now == doc.end() || !now->is_number_integer() || hex == doc.end() || !hex->is_string()) return false;
  *now_ms = now->get<int64_t>();
  const std::string& h = hex->get_ref<const std::string&>();
  if (h.size() % 2 != 0 || h.size() > 1024) return false;
  random->clear();
  for (size_t i = 0; i < h.size(); i += 2) {
    const int hi = HexDigit(h[i]), lo = HexDigit(h[i + 1]);
    if (hi < 0 || lo < 0) return false;
    random->push_back(static_cast<char>(hi * 16 + lo));
  }
  return true;
}

// op_start and op_feed: the store, the time, the random bytes and the
// document the C ABI takes.
int32_t Step(const char* document_key, char* (*call)(chstate_store*, const char*, int64_t, const unsigned char*,
                                                      size_t)) {
  json doc;
  if (!InputObject(&doc)) return 0;
  chstate_store* store = StoreOf(doc);
  if (store == nullptr) return Failed("\"store\" must be a handle store_new returned (and store_free did not end)");
  int64_t now_ms = 0;
  std::string random;
  if (!TimeAndRandom(doc, &now_ms, &random)) {
    return Failed("the input needs \"now_ms\" (the host's clock, an integer) and \"random_hex\" (fresh random bytes, "
                  "16 or more, as hex): the plugin has no clock and no randomness of its own");
  }
  auto inner = doc.find(document_key);
  if (inner == doc.end() || !inner->is_object()) return Failed(std::string("missing object \"") + document_key + "\"");
  const std::string text = inner->dump(-1, ' ', false, json::error_handler_t::replace);
  char* action = call(store, text.c_str(), now_ms, reinterpret_cast<const unsigned char*>(random.data()),
                      random.size());
  if (action != nullptr && Telling().count(doc["store"].get<int64_t>()) != 0) LogEvents(action);
  return OutputOwned(action);
}

}  // namespace

EXTISM_EXPORT("verbs") int32_t verbs(void) { return OutputOwned(chstate_verbs()); }

EXTISM_EXPORT("resolve_settings") int32_t resolve_settings(void) {
  std::string text;
  if (!ReadInput(&text)) return Failed("the input is larger than 16 MiB");
  return OutputOwned(chstate_resolve_settings(text.c_str()));
}

EXTISM_EXPORT("store_new") int32_t store_new(void) {
  std::string text;
  if (!ReadInput(&text)) return Failed("the input is larger than 16 MiB");
  char* error = nullptr;
  chstate_store* store = chstate_store_new(text.empty() ? "{}" : text.c_str(), &error);
  if (store == nullptr) return OutputOwned(error);
  const int64_t handle = next_handle++;
  Stores()[handle] = store;
  // Events are logged when the host asked for a level (the core makes none otherwise).
  const json settings_doc = json::parse(text.empty() ? "{}" : text, nullptr, /*allow_exceptions=*/false);
  if (settings_doc.is_object() && settings_doc.contains("host") && settings_doc["host"].is_object()) {
    const json& level = settings_doc["host"].value("diagnostics", json("none"));
    if (level.is_string() && level.get<std::string>() != "none") Telling()[handle] = true;
  }
  // What it was opened with (where to connect: the host's transport needs it).
  char* settings = chstate_store_settings(store);
  json out = json::parse(settings == nullptr ? "{}" : settings, nullptr, false);
  chstate_string_free(settings);
  out["store"] = handle;
  return Output(out.dump(-1, ' ', false, json::error_handler_t::replace));
}

EXTISM_EXPORT("op_start") int32_t op_start(void) { return Step("op", chstate_op_start); }

EXTISM_EXPORT("op_feed") int32_t op_feed(void) { return Step("answer", chstate_op_feed); }

EXTISM_EXPORT("store_free") int32_t store_free(void) {
  json doc;
  if (!InputObject(&doc)) return 0;
  chstate_store* store = StoreOf(doc);
  if (store == nullptr) return Failed("\"store\" must be a handle store_new returned (and store_free did not end)");
  chstate_store_free(store);
  Stores().erase(doc["store"].get<int64_t>());
  Telling().erase(doc["store"].get<int64_t>());
  return Output(R"({"freed":true})");
}
