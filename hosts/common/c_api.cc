// The C ABI of hosts/common/chstate.h over protocol::OpDriver. Every entry
// point catches everything: no C++ exception (in practice only bad_alloc) may
// unwind into a C, Python or Lua caller.
#include "hosts/common/chstate.h"

#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>
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

}  // namespace

extern "C" {

int32_t chstate_abi_version(void) { return CHSTATE_ABI_VERSION; }

char* chstate_setting_keys(void) {
  try {
    nlohmann::json keys = nlohmann::json::array({"uri"});
    for (const char* k : chstate::kSettingKeys) keys.push_back(k);
    return Give(chstate::protocol::Dump(nlohmann::json{{"setting_keys", std::move(keys)}}));
  } catch (...) {
    return nullptr;
  }
}

char* chstate_resolve_config(const char* sources_json) {
  if (sources_json == nullptr) return GiveFailed(absl::InvalidArgumentError("sources_json is NULL"));
  try {
    return Give(chstate::protocol::Dump(chstate::protocol::ResolveConfigJson(sources_json)));
  } catch (...) {
    return GiveFailed(absl::ResourceExhaustedError("out of memory resolving the configuration"));
  }
}

chstate_store* chstate_store_new(const char* options_json, char** error_json) {
  if (error_json != nullptr) *error_json = nullptr;
  auto fail = [error_json](const absl::Status& status) -> chstate_store* {
    if (error_json != nullptr) *error_json = GiveFailed(status);
    return nullptr;
  };
  try {
    nlohmann::json options;  // null: all defaults
    if (options_json != nullptr && options_json[0] != '\0') {
      absl::StatusOr<nlohmann::json> doc = chstate::protocol::ParseDocument(options_json);
      if (!doc.ok()) return fail(doc.status());
      options = *std::move(doc);
    }
    absl::StatusOr<chstate::StoreOptions> opts = chstate::protocol::StoreOptionsFromJson(options);
    if (!opts.ok()) return fail(opts.status());
    absl::StatusOr<std::unique_ptr<chstate::Store>> store = chstate::Store::Create(*std::move(opts));
    if (!store.ok()) return fail(store.status());
    auto handle = std::make_unique<chstate_store>();
    handle->store = *std::move(store);
    handle->driver = std::make_unique<chstate::protocol::OpDriver>(handle->store.get());
    return handle.release();
  } catch (...) {
    return fail(absl::ResourceExhaustedError("out of memory creating the store"));
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

void chstate_string_free(char* s) { std::free(s); }

}  // extern "C"
