// The C ABI of hosts/common/chstate.h over protocol::OpDriver. Every entry
// point catches everything: no C++ exception (in practice only bad_alloc) may
// unwind into a C, Python or Lua caller.
#include "hosts/common/chstate.h"

#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>
#include <optional>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "core/config.h"
#include "core/store.h"
#include "core/task.h"
#include "hosts/common/protocol.h"
#include <nlohmann/json.hpp>

struct chstate_store {
  std::unique_ptr<chstate::Store> store;
  chstate::Settings settings;
  std::unique_ptr<chstate::protocol::OpDriver> driver;
};

namespace {

// A malloc'd copy, released by chstate_string_free. NULL when out of memory.
char* Give(const std::string& s) {
  char* out = static_cast<char*>(std::malloc(s.size() + 1));
  if (out == nullptr) return nullptr;
  std::memcpy(out, s.data(), s.size());
  out[s.size()] = '\0';
  return out;
}

char* GiveFailed(const absl::Status& status) {
  try {
    return Give(chstate::protocol::Dump(chstate::protocol::FailedJson(status)));
  } catch (...) {
    return nullptr;
  }
}

chstate::Inputs MakeInputs(int64_t now_ms, const unsigned char* random, size_t random_len) {
  chstate::Inputs in;
  in.now_ms = now_ms;
  if (random != nullptr && random_len > 0) in.random.assign(reinterpret_cast<const char*>(random), random_len);
  return in;
}

std::optional<std::string> Data(const unsigned char* data, size_t data_len) {
  if (data == nullptr) return std::nullopt;
  return std::string(reinterpret_cast<const char*>(data), data_len);
}

// The action, its document apart when the caller takes it so.
char* GiveApart(nlohmann::json action, char** out_document, size_t* out_document_len) {
  if (out_document == nullptr) return Give(chstate::protocol::Dump(action));
  *out_document = nullptr;
  if (out_document_len != nullptr) *out_document_len = 0;
  std::optional<std::string> document = chstate::protocol::TakeDocument(&action);
  char* out = Give(chstate::protocol::Dump(action));
  if (out == nullptr || !document) return out;
  *out_document = Give(*document);
  if (*out_document == nullptr) {
    std::free(out);
    return nullptr;
  }
  if (out_document_len != nullptr) *out_document_len = document->size();
  return out;
}

// A *_bytes call: its arguments checked, `call` run (the driver's next
// action), the action given with its document apart.
template <typename Call>
char* RunApart(chstate_store* store, const char* json_text, const char* json_name, char** out_document,
               size_t* out_document_len, Call call) {
  if (out_document != nullptr) *out_document = nullptr;
  if (store == nullptr) return GiveFailed(absl::InvalidArgumentError("store is NULL"));
  if (json_text == nullptr) return GiveFailed(absl::InvalidArgumentError(std::string(json_name) + " is NULL"));
  try {
    return GiveApart(call(), out_document, out_document_len);
  } catch (...) {
    return GiveFailed(absl::ResourceExhaustedError("out of memory running the operation"));
  }
}

}  // namespace

extern "C" {

int32_t chstate_abi_version(void) { return CHSTATE_ABI_VERSION; }

char* chstate_verbs(void) {
  try {
    return Give(chstate::protocol::Dump(chstate::protocol::VerbsJson()));
  } catch (...) {
    return nullptr;
  }
}

char* chstate_settings_table(void) {
  try {
    return Give(chstate::protocol::Dump(chstate::protocol::SettingsTableJson()));
  } catch (...) {
    return nullptr;
  }
}

char* chstate_resolve_settings(const char* settings_json) {
  if (settings_json == nullptr) return GiveFailed(absl::InvalidArgumentError("settings_json is NULL"));
  try {
    return Give(chstate::protocol::Dump(chstate::protocol::ResolveSettingsJson(settings_json)));
  } catch (...) {
    return GiveFailed(absl::ResourceExhaustedError("out of memory resolving the settings"));
  }
}

chstate_store* chstate_store_new(const char* settings_json, char** error_json) {
  if (error_json != nullptr) *error_json = nullptr;
  auto fail = [error_json](const absl::Status& status) -> chstate_store* {
    if (error_json != nullptr) *error_json = GiveFailed(status);
    return nullptr;
  };
  if (settings_json == nullptr) return fail(absl::InvalidArgumentError("settings_json is NULL"));
  try {
    absl::StatusOr<chstate::protocol::OpenedStore> opened = chstate::protocol::OpenStore(settings_json);
    if (!opened.ok()) return fail(opened.status());
    auto handle = std::make_unique<chstate_store>();
    handle->store = std::move(opened->store);
    handle->settings = std::move(opened->settings);
    handle->driver = std::make_unique<chstate::protocol::OpDriver>(handle->store.get());
    return handle.release();
  } catch (...) {
    return fail(absl::ResourceExhaustedError("out of memory creating the store"));
  }
}

char* chstate_store_settings(chstate_store* store) {
  if (store == nullptr) return GiveFailed(absl::InvalidArgumentError("store is NULL"));
  try {
    return Give(chstate::protocol::Dump(chstate::protocol::SettingsJson(store->settings)));
  } catch (...) {
    return nullptr;
  }
}

void chstate_store_free(chstate_store* store) {
  // The driver's task refers to the store: destroy it first.
  if (store == nullptr) return;
  store->driver.reset();
  store->store.reset();
  delete store;
}

char* chstate_op_start(chstate_store* store, const char* op_json, int64_t now_ms, const unsigned char* random,
                       size_t random_len) {
  if (store == nullptr) return GiveFailed(absl::InvalidArgumentError("store is NULL"));
  if (op_json == nullptr) return GiveFailed(absl::InvalidArgumentError("op_json is NULL"));
  try {
    return Give(chstate::protocol::Dump(store->driver->Start(op_json, MakeInputs(now_ms, random, random_len))));
  } catch (...) {
    return GiveFailed(absl::ResourceExhaustedError("out of memory running the operation"));
  }
}

char* chstate_op_feed(chstate_store* store, const char* input_json, int64_t now_ms, const unsigned char* random,
                      size_t random_len) {
  if (store == nullptr) return GiveFailed(absl::InvalidArgumentError("store is NULL"));
  if (input_json == nullptr) return GiveFailed(absl::InvalidArgumentError("input_json is NULL"));
  try {
    return Give(chstate::protocol::Dump(store->driver->Feed(input_json, MakeInputs(now_ms, random, random_len))));
  } catch (...) {
    return GiveFailed(absl::ResourceExhaustedError("out of memory running the operation"));
  }
}

char* chstate_op_start_bytes(chstate_store* store, const char* op_json, const unsigned char* data, size_t data_len,
                             int64_t now_ms, const unsigned char* random, size_t random_len, char** out_document,
                             size_t* out_document_len) {
  return RunApart(store, op_json, "op_json", out_document, out_document_len, [&] {
    return store->driver->Start(op_json, MakeInputs(now_ms, random, random_len), Data(data, data_len));
  });
}

char* chstate_op_feed_bytes(chstate_store* store, const char* input_json, const unsigned char* data, size_t data_len,
                            int64_t now_ms, const unsigned char* random, size_t random_len, char** out_document,
                            size_t* out_document_len) {
  return RunApart(store, input_json, "input_json", out_document, out_document_len, [&] {
    return store->driver->Feed(input_json, MakeInputs(now_ms, random, random_len), Data(data, data_len));
  });
}

void chstate_string_free(char* s) { std::free(s); }

}  // extern "C"
