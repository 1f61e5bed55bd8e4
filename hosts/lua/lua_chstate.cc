// The native half of the Lua 5.4 module `chstate`: the core's Store and the
// native HTTP executor behind a small Lua C API, and the conversion between
// Lua values and JSON. The idiomatic API (chstate.open, store:get, ...,
// chstate.safe) is chstate.lua, compiled into this library and run by
// luaopen_chstate with the table built here as its argument.
//
//   local chstate = require "chstate"          -- loads chstate.so
//   local store = chstate.open{uri = "clickhouse://meltano@localhost:8123/default"}
//
// Rules kept here:
// - lua_error longjmps over C++ frames, so no function raises while a C++
//   object with a destructor is alive: work happens in a scope that pushes an
//   error message, and the function raises after the scope ends. Expected
//   failures (bad values, failed operations) are returned as values instead.
// - Operations are driven one input at a time (op:start / op:response /
//   op:timer), so chstate.lua can run a Lua transport and Lua sleep (which may
//   yield a coroutine); store:run(op) drives an op entirely in C with the
//   native executor when no Lua hook is given.
//
// JSON <-> Lua (README "Using it from Lua" documents it for users):
//   object  <-> table with string keys (an empty table is an object: {})
//   array   <-> table with keys 1..n, or any table with the chstate.array
//               metatable (chstate.array{} is the empty array []); decoded
//               arrays carry that metatable, so [] round-trips
//   integer <-> Lua integer (math.type "integer"); float <-> Lua float (1.0
//               stays 1.0); NaN and infinities are refused
//   null    <-> chstate.null (a light userdata NULL, like cjson.null)
//   strings must be valid UTF-8; other key types, sparse or mixed tables,
//   functions, coroutines and userdata are refused with the path of the value.
#include <time.h>

#include <cerrno>
#include <cmath>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "core/config.h"
#include "core/defaults.h"
#include "core/lock.h"
#include "core/state.h"
#include "core/store.h"
#include "core/task.h"
#include "hosts/native/executor.h"
#include "lua.hpp"
#include <nlohmann/json.hpp>

extern char** environ;

// The Lua half, generated from chstate.lua (see BUILD.bazel).
#include "hosts/lua/chstate_lua.inc"

namespace chstate::lua {
namespace {

constexpr char kStoreMeta[] = "chstate.native_store";
constexpr char kOpMeta[] = "chstate.native_op";
constexpr char kArrayMeta[] = "chstate.array";
constexpr int kMaxDepth = 512;

using nlohmann::json;

// ---------------------------------------------------------------- JSON

bool ValidUtf8(const char* s, size_t n) {
  size_t i = 0;
  while (i < n) {
    unsigned char c = static_cast<unsigned char>(s[i]);
    if (c < 0x80) {
      ++i;
      continue;
    }
    int len = 0;
    uint32_t cp = 0;
    if ((c & 0xE0) == 0xC0) {
      len = 2;
      cp = c & 0x1F;
    } else if ((c & 0xF0) == 0xE0) {
      len = 3;
      cp = c & 0x0F;
    } else if ((c & 0xF8) == 0xF0) {
      len = 4;
      cp = c & 0x07;
    } else {
      return false;
    }
    if (i + len > n) return false;
    for (int k = 1; k < len; ++k) {
      unsigned char cc = static_cast<unsigned char>(s[i + k]);
      if ((cc & 0xC0) != 0x80) return false;
      cp = (cp << 6) | (cc & 0x3F);
    }
    // Overlong forms, surrogates and values past U+10FFFF are not UTF-8.
    if ((len == 2 && cp < 0x80) || (len == 3 && cp < 0x800) || (len == 4 && cp < 0x10000) || cp > 0x10FFFF ||
        (cp >= 0xD800 && cp <= 0xDFFF)) {
      return false;
    }
    i += len;
  }
  return true;
}

bool IsIdentifier(const std::string& k) {
  if (k.empty() || k.size() > 40) return false;
  for (size_t i = 0; i < k.size(); ++i) {
    char c = k[i];
    bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || (i > 0 && c >= '0' && c <= '9');
    if (!ok) return false;
  }
  return true;
}

std::string KeyPath(const std::string& path, const std::string& key) {
  if (IsIdentifier(key)) return absl::StrCat(path, ".", key);
  std::string shown;
  for (char c : key.substr(0, 40)) shown += (c >= 0x20 && c < 0x7f && c != '"' && c != '\\') ? c : '?';
  return absl::StrCat(path, "[\"", shown, key.size() > 40 ? "...\"]" : "\"]");
}

bool IsArrayMarked(lua_State* L, int idx) {
  if (!lua_getmetatable(L, idx)) return false;
  luaL_getmetatable(L, kArrayMeta);
  bool marked = lua_rawequal(L, -1, -2);
  lua_pop(L, 2);
  return marked;
}

const char* Describe(lua_State* L, int idx) {
  switch (lua_type(L, idx)) {
    case LUA_TFUNCTION: return "a function";
    case LUA_TTHREAD: return "a coroutine";
    case LUA_TUSERDATA: return "a userdata";
    case LUA_TLIGHTUSERDATA: return "a light userdata other than chstate.null";
    case LUA_TNIL: return "nil";
    default: return lua_typename(L, lua_type(L, idx));
  }
}

// Lua value at `idx` -> JSON. On failure returns false with `err` set (the
// path of the offending value and the rule it breaks).
bool ToJson(lua_State* L, int idx, const std::string& path, int depth, json& out, std::string& err) {
  idx = lua_absindex(L, idx);
  switch (lua_type(L, idx)) {
    case LUA_TBOOLEAN:
      out = static_cast<bool>(lua_toboolean(L, idx));
      return true;
    case LUA_TNUMBER:
      if (lua_isinteger(L, idx)) {
        out = static_cast<int64_t>(lua_tointeger(L, idx));
        return true;
      } else {
        double d = lua_tonumber(L, idx);
        if (!std::isfinite(d)) {
          err = absl::StrCat(path, " is ", std::isnan(d) ? "NaN" : "an infinity",
                             ", which JSON cannot hold (store a string or null instead)");
          return false;
        }
        out = d;
        return true;
      }
    case LUA_TSTRING: {
      size_t n = 0;
      const char* s = lua_tolstring(L, idx, &n);
      if (!ValidUtf8(s, n)) {
        err = absl::StrCat(path, " is not valid UTF-8, which JSON strings must be (encode binary data, e.g. as hex)");
        return false;
      }
      out = std::string(s, n);
      return true;
    }
    case LUA_TLIGHTUSERDATA:
      if (lua_touserdata(L, idx) == nullptr) {
        out = nullptr;
        return true;
      }
      break;
    case LUA_TTABLE: {
      if (depth >= kMaxDepth) {
        err = absl::StrCat(path, " is nested more than ", kMaxDepth, " levels deep (or the table contains itself)");
        return false;
      }
      if (!lua_checkstack(L, 4)) {
        err = absl::StrCat(path, ": out of Lua stack space");
        return false;
      }
      const bool marked = IsArrayMarked(L, idx);
      // One pass over the keys decides object or array.
      int64_t count = 0, max_int = 0;
      bool all_int = true, all_str = true;
      std::string bad_key;
      lua_pushnil(L);
      while (lua_next(L, idx) != 0) {
        ++count;
        int kt = lua_type(L, -2);
        if (kt == LUA_TSTRING) {
          all_int = false;
        } else if (kt == LUA_TNUMBER && lua_isinteger(L, -2) && lua_tointeger(L, -2) >= 1) {
          all_str = false;
          max_int = std::max<int64_t>(max_int, lua_tointeger(L, -2));
        } else {
          all_int = all_str = false;
          if (kt == LUA_TNUMBER) {
            lua_pushvalue(L, -2);  // tostring on a copy: lua_next needs the key unchanged
            bad_key = absl::StrCat("the key ", lua_tostring(L, -1));
            lua_pop(L, 1);
          } else {
            bad_key = absl::StrCat("a ", luaL_typename(L, -2), " key");
          }
        }
        lua_pop(L, 1);
      }
      if (!bad_key.empty()) {
        err = absl::StrCat(path, " has ", bad_key,
                           ": JSON objects need string keys and arrays need the keys 1..n (convert the key "
                           "with tostring, or use a sequence)");
        return false;
      }
      const bool as_array = marked ? true : (count > 0 && all_int);
      if (as_array) {
        if (!all_int && count > 0) {
          err = absl::StrCat(path, " is marked as an array (chstate.array) but has string keys");
          return false;
        }
        if (max_int != count) {
          err = absl::StrCat(path, " has integer keys that are not 1..n (a sparse or holed array, highest key ",
                             max_int, ", ", count, " values): JSON arrays have no holes (fill them with chstate.null)");
          return false;
        }
        out = json::array();
        for (int64_t i = 1; i <= count; ++i) {
          lua_rawgeti(L, idx, i);
          json item;
          bool ok = ToJson(L, -1, absl::StrCat(path, "[", i, "]"), depth + 1, item, err);
          lua_pop(L, 1);
          if (!ok) return false;
          out.push_back(std::move(item));
        }
        return true;
      }
      if (!all_str && count > 0) {
        err = absl::StrCat(path,
                           " mixes integer and string keys: a JSON value is either an object (string keys) or "
                           "an array (keys 1..n); convert the integer keys with tostring");
        return false;
      }
      out = json::object();
      lua_pushnil(L);
      while (lua_next(L, idx) != 0) {
        size_t n = 0;
        const char* k = lua_tolstring(L, -2, &n);  // a string key: no conversion happens
        std::string key(k, n);
        if (!ValidUtf8(k, n)) {
          err = absl::StrCat(KeyPath(path, key), ": the key is not valid UTF-8, which JSON keys must be");
          lua_pop(L, 2);
          return false;
        }
        json item;
        bool ok = ToJson(L, -1, KeyPath(path, key), depth + 1, item, err);
        lua_pop(L, 1);
        if (!ok) {
          lua_pop(L, 1);
          return false;
        }
        out[key] = std::move(item);
      }
      return true;
    }
    default:
      break;
  }
  err = absl::StrCat(path, " is ", Describe(L, idx), ", which JSON cannot hold");
  return false;
}

// JSON -> a Lua value on top of the stack. Depth is bounded by the encoder
// and by the core's parser (512).
bool PushJson(lua_State* L, const json& j) {
  if (!lua_checkstack(L, 4)) return false;
  switch (j.type()) {
    case json::value_t::null:
      lua_pushlightuserdata(L, nullptr);
      return true;
    case json::value_t::boolean:
      lua_pushboolean(L, j.get<bool>());
      return true;
    case json::value_t::number_integer:
      lua_pushinteger(L, static_cast<lua_Integer>(j.get<int64_t>()));
      return true;
    case json::value_t::number_unsigned: {
      uint64_t u = j.get<uint64_t>();
      // Above 2^63-1 a Lua integer cannot hold it: it becomes a float.
      if (u <= static_cast<uint64_t>(INT64_MAX)) {
        lua_pushinteger(L, static_cast<lua_Integer>(u));
      } else {
        lua_pushnumber(L, static_cast<lua_Number>(u));
      }
      return true;
    }
    case json::value_t::number_float:
      lua_pushnumber(L, j.get<double>());
      return true;
    case json::value_t::string: {
      const std::string& s = j.get_ref<const std::string&>();
      lua_pushlstring(L, s.data(), s.size());
      return true;
    }
    case json::value_t::array: {
      lua_createtable(L, static_cast<int>(j.size()), 0);
      lua_Integer i = 0;
      for (const json& item : j) {
        if (!PushJson(L, item)) return false;
        lua_rawseti(L, -2, ++i);
      }
      luaL_setmetatable(L, kArrayMeta);
      return true;
    }
    case json::value_t::object: {
      lua_createtable(L, 0, static_cast<int>(j.size()));
      for (auto it = j.begin(); it != j.end(); ++it) {
        lua_pushlstring(L, it.key().data(), it.key().size());
        if (!PushJson(L, it.value())) return false;
        lua_rawset(L, -3);
      }
      return true;
    }
    default:
      lua_pushnil(L);  // binary / discarded: never produced by the core
      return true;
  }
}

// chstate.to_json(value) -> text | nil, message
int LuaToJson(lua_State* L) {
  luaL_checkany(L, 1);
  bool ok = false;
  {
    json j;
    std::string err;
    ok = ToJson(L, 1, "value", 0, j, err);
    if (ok) {
      std::string text = DumpJson(j);
      lua_pushlstring(L, text.data(), text.size());
    } else {
      lua_pushnil(L);
      lua_pushlstring(L, err.data(), err.size());
    }
  }
  return ok ? 1 : 2;
}

// Deepest nesting of arrays and objects in a JSON text (strings skipped), so
// that neither the parser nor PushJson recurses without bound.
int NestingDepth(absl::string_view s) {
  int depth = 0, deepest = 0;
  bool in_string = false;
  for (size_t i = 0; i < s.size(); ++i) {
    char c = s[i];
    if (in_string) {
      if (c == '\\') ++i;
      else if (c == '"') in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      deepest = std::max(deepest, ++depth);
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return deepest;
}

// chstate.from_json(text) -> value | nil, message. Any JSON value is accepted
// (states themselves must be objects).
int LuaFromJson(lua_State* L) {
  size_t n = 0;
  const char* s = luaL_checklstring(L, 1, &n);
  int results = 2;
  {
    absl::string_view text(s, n);
    size_t first = text.find_first_not_of(" \t\r\n");
    std::string err;
    json value;
    if (first == absl::string_view::npos) {
      err = "empty input: no JSON value";
    } else if (NestingDepth(text) > kMaxDepth) {
      err = absl::StrCat("JSON nested more than ", kMaxDepth, " levels deep");
    } else if (text[first] == '{') {
      // The core's object parser gives positioned messages.
      absl::StatusOr<json> parsed = ParseStateJson(text);
      if (parsed.ok()) value = *std::move(parsed);
      else err = std::string(parsed.status().message());
    } else if (!ValidUtf8(s, n)) {
      err = "invalid JSON: the text is not valid UTF-8";
    } else {
      value = json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
      if (value.is_discarded()) err = "invalid JSON (not a JSON value)";
    }
    if (!err.empty()) {
      lua_pushnil(L);
      lua_pushlstring(L, err.data(), err.size());
    } else if (!PushJson(L, value)) {
      lua_pushnil(L);
      lua_pushstring(L, "the JSON value is nested too deeply for the Lua stack");
    } else {
      results = 1;
    }
  }
  return results;
}

// ---------------------------------------------------------------- stores

struct OpenStore {
  std::unique_ptr<Store> store;
  std::unique_ptr<native::HttpExecutor> exec;  // null when Lua supplies the transport
  ConnectionConfig config;
  std::string base_url;  // scheme://host:port/?database=...
};

// The userdata holds one pointer, so that a closed store owns nothing (Lua
// frees the block itself; no destructor has to run).
struct StoreBox {
  OpenStore* open;  // null once closed
};

std::string PercentEncode(absl::string_view s) {
  static const char kHex[] = "0123456789ABCDEF";
  std::string out;
  for (unsigned char c : s) {
    if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '_' ||
        c == '.' || c == '~') {
      out += static_cast<char>(c);
    } else {
      out += '%';
      out += kHex[c >> 4];
      out += kHex[c & 15];
    }
  }
  return out;
}

OpenStore* CheckStore(lua_State* L, int idx) {
  StoreBox* box = static_cast<StoreBox*>(luaL_checkudata(L, idx, kStoreMeta));
  if (box->open == nullptr) luaL_error(L, "the store is closed");  // callers hold no C++ locals yet
  return box->open;
}

int StoreGc(lua_State* L) {
  StoreBox* box = static_cast<StoreBox*>(luaL_checkudata(L, 1, kStoreMeta));
  delete box->open;
  box->open = nullptr;  // a second __gc or close finds nothing to free
  return 0;
}

void SetField(lua_State* L, const char* k, const std::string& v) {
  lua_pushlstring(L, v.data(), v.size());
  lua_setfield(L, -2, k);
}

// Reads a string->string Lua table into a map (values must be strings).
bool ReadStringMap(lua_State* L, int idx, const char* what, std::map<std::string, std::string>& out,
                   std::string& err) {
  if (lua_isnoneornil(L, idx)) return true;
  if (!lua_istable(L, idx)) {
    err = absl::StrCat(what, " must be a table of strings");
    return false;
  }
  lua_pushnil(L);
  while (lua_next(L, idx) != 0) {
    if (lua_type(L, -2) != LUA_TSTRING || lua_type(L, -1) != LUA_TSTRING) {
      lua_pop(L, 2);
      err = absl::StrCat(what, " must map strings to strings");
      return false;
    }
    out[lua_tostring(L, -2)] = std::string(lua_tostring(L, -1), lua_rawlen(L, -1));
    lua_pop(L, 1);
  }
  return true;
}

int64_t IntField(lua_State* L, int idx, const char* k, int64_t dflt) {
  lua_getfield(L, idx, k);
  int64_t v = lua_isinteger(L, -1) ? lua_tointeger(L, -1) : dflt;
  lua_pop(L, 1);
  return v;
}

// C.new_store(flags, env, opts) -> store, info | nil, message
// flags: {uri=, host=, ...} strings (kSettingKeys and "uri"); env: NAME ->
// value; opts: {native=bool, lock_timeout_ms, lock_retry_ms, stale_ms,
// connect_timeout_ms, timeout_ms}.
int NewStore(lua_State* L) {
  luaL_checktype(L, 3, LUA_TTABLE);
  lua_getfield(L, 3, "native");
  const bool native = lua_toboolean(L, -1);
  lua_pop(L, 1);
  const int64_t lock_timeout = IntField(L, 3, "lock_timeout_ms", kDefaultLockTimeoutMs);
  const int64_t lock_retry = IntField(L, 3, "lock_retry_ms", kDefaultLockRetryMs);
  const int64_t stale = IntField(L, 3, "stale_ms", kDefaultStaleLockMs);
  const int64_t connect_timeout = IntField(L, 3, "connect_timeout_ms", kDefaultConnectTimeoutMs);
  const int64_t timeout = IntField(L, 3, "timeout_ms", kDefaultRequestTimeoutMs);
  StoreBox* ud = static_cast<StoreBox*>(lua_newuserdatauv(L, sizeof(StoreBox), 0));
  ud->open = nullptr;
  luaL_setmetatable(L, kStoreMeta);
  bool ok = false;
  {
    ConfigSources sources;
    std::string err;
    absl::StatusOr<ConnectionConfig> config = absl::InvalidArgumentError("");
    if (!ReadStringMap(L, 1, "the connection settings", sources.flags, err) ||
        !ReadStringMap(L, 2, "env", sources.env, err)) {
      config = absl::InvalidArgumentError(err);
    } else {
      config = ResolveConfig(sources);
    }
    absl::StatusOr<std::unique_ptr<Store>> store = absl::InvalidArgumentError("");
    if (config.ok()) {
      StoreOptions options;
      options.schema = config->schema;
      options.table = config->table;
      options.endpoint = absl::StrCat(config->host.find(':') != std::string::npos ? "[" + config->host + "]"
                                                                                   : config->host,
                                      ":", config->port);
      options.lock.timeout_ms = lock_timeout;
      options.lock.retry_ms = lock_retry;
      options.lock.stale_ms = stale;
      options.transport.request_timeout_ms = timeout;
      options.cluster.name = config->cluster;
      options.cluster.zookeeper_path = config->zookeeper_path;
      options.cluster.replica = config->replica;
      store = Store::Create(std::move(options));
    }
    if (!config.ok() || !store.ok()) {
      absl::Status st = config.ok() ? store.status() : config.status();
      lua_pushnil(L);
      lua_pushlstring(L, st.message().data(), st.message().size());
    } else {
      ok = true;
      OpenStore* box = new OpenStore();
      ud->open = box;
      box->config = *std::move(config);
      box->store = *std::move(store);
      box->base_url = absl::StrCat(box->config.secure ? "https://" : "http://", box->store->options().endpoint,
                                   "/?database=", PercentEncode(box->config.database));
      if (native) {
        native::ExecutorOptions eo;
        eo.connect_timeout_ms = connect_timeout;
        box->exec = std::make_unique<native::HttpExecutor>(box->config, eo);
      }
      lua_createtable(L, 0, 11);
      SetField(L, "redacted_uri", box->config.RedactedUri());
      SetField(L, "host", box->config.host);
      lua_pushinteger(L, box->config.port);
      lua_setfield(L, -2, "port");
      lua_pushinteger(L, box->store->options().lock.stale_ms);
      lua_setfield(L, -2, "stale_ms");
      lua_pushboolean(L, box->config.secure);
      lua_setfield(L, -2, "secure");
      SetField(L, "user", box->config.user);
      SetField(L, "database", box->config.database);
      SetField(L, "schema", box->config.schema);
      SetField(L, "table", box->config.table);
      SetField(L, "endpoint", box->store->options().endpoint);
    }
  }
  if (!ok) return 2;
  lua_pushvalue(L, -2);  // store
  lua_pushvalue(L, -2);  // info
  return 2;
}

// store:connection() -> the settings a Lua transport needs, password included.
int StoreConnection(lua_State* L) {
  OpenStore* box = CheckStore(L, 1);
  lua_createtable(L, 0, 8);
  SetField(L, "host", box->config.host);
  lua_pushinteger(L, box->config.port);
  lua_setfield(L, -2, "port");
  lua_pushboolean(L, box->config.secure);
  lua_setfield(L, -2, "secure");
  SetField(L, "user", box->config.user);
  SetField(L, "password", box->config.password);
  SetField(L, "database", box->config.database);
  SetField(L, "ca_file", box->config.ca_file);
  SetField(L, "url", box->base_url);
  return 1;
}

int StoreClose(lua_State* L) {
  luaL_checkudata(L, 1, kStoreMeta);
  return StoreGc(L);
}

int StoreIsClosed(lua_State* L) {
  StoreBox* box = static_cast<StoreBox*>(luaL_checkudata(L, 1, kStoreMeta));
  lua_pushboolean(L, box->open == nullptr);
  return 1;
}

// store:lease_valid(id, now_ms) -> bool
int StoreLeaseValid(lua_State* L) {
  OpenStore* box = CheckStore(L, 1);
  size_t n = 0;
  const char* id = luaL_checklstring(L, 2, &n);
  lua_Integer now = luaL_checkinteger(L, 3);
  bool valid = box->store->LeaseValid(std::string(id, n), now);
  lua_pushboolean(L, valid);
  return 1;
}

// ---------------------------------------------------------------- operations

enum class Shape { kNone, kState, kStateAfter, kIds, kCount, kLockId, kPing };

using TaskMaker = std::function<absl::StatusOr<std::unique_ptr<Task>>(const Inputs&)>;
using NextMaker = std::function<absl::StatusOr<std::unique_ptr<Task>>(const Result&, const Inputs&)>;

// One operation of the Lua API: one core task, or two in a row (a merge
// under a lock the caller already holds reads, then writes).
struct HostOp {
  StoreBox* box = nullptr;  // the store's userdata (box->open is null once closed)
  Shape shape = Shape::kNone;
  TaskMaker first;
  NextMaker then;
  std::shared_ptr<std::optional<MeltanoState>> produced;  // the state a two-step merge wrote
  std::unique_ptr<Task> task;
  SqlRequest pending;  // the request in flight
  bool started = false;
  bool ended = false;

  Action Fail(absl::Status st) {
    ended = true;
    Action a;
    a.kind = Action::Kind::kFailed;
    a.status = std::move(st);
    return a;
  }

  Action Advance(Action a, const Inputs& in) {
    while (a.kind == Action::Kind::kDone && then) {
      NextMaker next = std::move(then);
      then = nullptr;
      absl::StatusOr<std::unique_ptr<Task>> t = next(a.result, in);
      if (!t.ok()) return Fail(t.status());
      task = *std::move(t);
      a = task->Start(in);
    }
    if (a.kind == Action::Kind::kRunSql) pending = a.request;
    if (a.kind == Action::Kind::kDone || a.kind == Action::Kind::kFailed) ended = true;
    return a;
  }

  Action Start(const Inputs& in) {
    if (started) return Fail(absl::FailedPreconditionError("the operation was already started"));
    started = true;
    absl::StatusOr<std::unique_ptr<Task>> t = first(in);
    if (!t.ok()) return Fail(t.status());
    task = *std::move(t);
    return Advance(task->Start(in), in);
  }
  Action OnResponse(const SqlResponse& r, const Inputs& in) {
    if (!task || ended) return Fail(absl::FailedPreconditionError("the operation is not waiting for an answer"));
    return Advance(task->OnResponse(r, in), in);
  }
  Action OnTimer(const Inputs& in) {
    if (!task || ended) return Fail(absl::FailedPreconditionError("the operation is not waiting for a timer"));
    return Advance(task->OnTimer(in), in);
  }
};

struct OpBox {
  HostOp* op;
};

HostOp* CheckOp(lua_State* L, int idx) {
  OpBox* ob = static_cast<OpBox*>(luaL_checkudata(L, idx, kOpMeta));
  if (ob->op == nullptr || ob->op->box->open == nullptr) luaL_error(L, "the store is closed");
  return ob->op;
}

int OpGc(lua_State* L) {
  OpBox* ob = static_cast<OpBox*>(luaL_checkudata(L, 1, kOpMeta));
  delete ob->op;
  ob->op = nullptr;
  return 0;
}

Inputs InputsAt(int64_t now_ms) { return Inputs{now_ms, native::OsRandomBytes()}; }

void PushStateViews(lua_State* L, const MeltanoState& s) {
  PushJson(L, s.Merged());
  lua_createtable(L, 0, 2);
  PushJson(L, s.completed);
  lua_setfield(L, -2, "completed");
  PushJson(L, s.partial);
  lua_setfield(L, -2, "partial");
}

// Pushes an action: "sql", request | "wait", ms | "done", values... |
// "failed", code, message. Returns the number of values.
int PushAction(lua_State* L, HostOp& op, const Action& a) {
  switch (a.kind) {
    case Action::Kind::kRunSql: {
      lua_pushliteral(L, "sql");
      const SqlRequest& r = a.request;
      std::string url = op.box->open->base_url;
      lua_createtable(L, 0, 8);
      SetField(L, "sql", r.sql);
      SetField(L, "body", r.sql);
      lua_createtable(L, static_cast<int>(r.url_params.size()), 0);
      for (size_t i = 0; i < r.url_params.size(); ++i) {
        absl::StrAppend(&url, "&", PercentEncode(r.url_params[i].first), "=", PercentEncode(r.url_params[i].second));
        lua_createtable(L, 2, 0);
        lua_pushlstring(L, r.url_params[i].first.data(), r.url_params[i].first.size());
        lua_rawseti(L, -2, 1);
        lua_pushlstring(L, r.url_params[i].second.data(), r.url_params[i].second.size());
        lua_rawseti(L, -2, 2);
        lua_rawseti(L, -2, static_cast<lua_Integer>(i + 1));
      }
      lua_setfield(L, -2, "settings");
      SetField(L, "url", url);
      lua_pushboolean(L, r.idempotent);
      lua_setfield(L, -2, "idempotent");
      lua_pushinteger(L, r.attempt);
      lua_setfield(L, -2, "attempt");
      lua_pushinteger(L, r.timeout_ms);
      lua_setfield(L, -2, "timeout_ms");
      SetField(L, "purpose", r.purpose);
      return 2;
    }
    case Action::Kind::kWait:
      lua_pushliteral(L, "wait");
      lua_pushinteger(L, a.wait_ms);
      return 2;
    case Action::Kind::kFailed: {
      lua_pushliteral(L, "failed");
      std::string code = absl::StatusCodeToString(a.status.code());
      lua_pushlstring(L, code.data(), code.size());
      lua_pushlstring(L, a.status.message().data(), a.status.message().size());
      return 3;
    }
    case Action::Kind::kDone:
      break;
  }
  lua_pushliteral(L, "done");
  const Result& r = a.result;
  switch (op.shape) {
    case Shape::kNone:
      lua_pushboolean(L, 1);
      return 2;
    case Shape::kState:
      if (!r.state) {
        lua_pushnil(L);
        return 2;
      }
      PushStateViews(L, *r.state);
      return 3;
    case Shape::kStateAfter: {
      const std::optional<MeltanoState>* s = op.produced && *op.produced ? op.produced.get() : nullptr;
      if (s == nullptr && r.state) s = &r.state;
      if (s == nullptr) {
        lua_pushnil(L);
        return 2;
      }
      PushStateViews(L, **s);
      return 3;
    }
    case Shape::kIds: {
      lua_createtable(L, static_cast<int>(r.state_ids.size()), 0);
      for (size_t i = 0; i < r.state_ids.size(); ++i) {
        lua_pushlstring(L, r.state_ids[i].data(), r.state_ids[i].size());
        lua_rawseti(L, -2, static_cast<lua_Integer>(i + 1));
      }
      luaL_setmetatable(L, kArrayMeta);
      return 2;
    }
    case Shape::kCount:
      lua_pushinteger(L, r.count);
      return 2;
    case Shape::kLockId:
      lua_pushlstring(L, r.lock_id.data(), r.lock_id.size());
      lua_pushinteger(L, r.waited_ms);
      return 3;
    case Shape::kPing: {
      lua_pushlstring(L, r.server_version.data(), r.server_version.size());
      std::string dialect = r.dialect ? (*r.dialect == Dialect::kModern ? "modern" : "clickhouse18") : "";
      lua_pushlstring(L, dialect.data(), dialect.size());
      return 3;
    }
  }
  return 1;
}

absl::Status LeaseCheck(Store& store, const std::string& id, const Inputs& in) {
  if (store.LeaseValid(id, in.now_ms)) return absl::OkStatus();
  return absl::AbortedError(
      "the lock on this state id expired (or was lost) before the write; nothing was written. A with_lock "
      "function that runs longer than a third of the stale-lock window without using the store must call "
      "store:renew(id)");
}

// store:op(kind, ...) -> op | nil, message (a value that cannot become JSON)
//   "ping" | "init" | "get", id | "set", id, state, held | "merge", id,
//   partial, held | "delete", id, held | "list", pattern? | "clear_all" |
//   "acquire", id | "renew", id | "release", id, lock_id
int StoreOp(lua_State* L) {
  OpenStore* box = CheckStore(L, 1);
  const std::string kind = luaL_checkstring(L, 2);
  lua_settop(L, 5);
  std::string id;
  if (lua_type(L, 3) == LUA_TSTRING) id.assign(lua_tostring(L, 3), lua_rawlen(L, 3));
  const bool held = lua_toboolean(L, 5);
  auto* op = new HostOp();
  op->box = static_cast<StoreBox*>(lua_touserdata(L, 1));
  Store* store = box->store.get();
  bool ok = true;
  {
    std::string err;
    json value;
    if ((kind == "set" || kind == "merge")) {
      if (!ToJson(L, 4, "state", 0, value, err)) {
        ok = false;
      } else if (!value.is_object()) {
        err = "state must be a table with string keys (a JSON object), not an array";
        ok = false;
      }
    }
    if (ok) {
      if (kind == "ping") {
        op->shape = Shape::kPing;
        op->first = [store](const Inputs&) { return store->Ping(); };
      } else if (kind == "init") {
        op->shape = Shape::kCount;
        op->first = [store](const Inputs&) { return store->Init(); };
      } else if (kind == "get") {
        op->shape = Shape::kState;
        op->first = [store, id](const Inputs&) { return store->Get(id); };
      } else if (kind == "set") {
        MeltanoState s;
        s.state_id = id;
        s.completed = std::move(value);
        if (held) {
          op->first = [store, s](const Inputs& in) -> absl::StatusOr<std::unique_ptr<Task>> {
            if (absl::Status st = LeaseCheck(*store, s.state_id, in); !st.ok()) return st;
            return store->Set(s);
          };
        } else {
          op->first = [store, s](const Inputs&) { return store->SetLocked(s); };
        }
      } else if (kind == "merge") {
        MeltanoState incoming;
        incoming.state_id = id;
        incoming.partial = std::move(value);
        op->shape = Shape::kStateAfter;
        if (held) {
          // Meltano's update() with the lock already taken: read, merge, write.
          auto produced = std::make_shared<std::optional<MeltanoState>>();
          op->produced = produced;
          op->first = [store, id](const Inputs&) { return store->Get(id); };
          op->then = [store, incoming, produced](const Result& got,
                                                 const Inputs& in) -> absl::StatusOr<std::unique_ptr<Task>> {
            MeltanoState next = ApplyUpdate(got.state, incoming);
            if (absl::Status st = LeaseCheck(*store, incoming.state_id, in); !st.ok()) return st;
            *produced = next;
            return store->Set(next);
          };
        } else {
          op->first = [store, incoming](const Inputs&) { return store->Update(incoming); };
        }
      } else if (kind == "delete") {
        if (held) {
          op->first = [store, id](const Inputs& in) -> absl::StatusOr<std::unique_ptr<Task>> {
            if (absl::Status st = LeaseCheck(*store, id, in); !st.ok()) return st;
            return store->Delete(id);
          };
        } else {
          op->first = [store, id](const Inputs&) { return store->DeleteLocked(id); };
        }
      } else if (kind == "list") {
        std::optional<std::string> pattern;
        if (lua_type(L, 3) == LUA_TSTRING) pattern = id;
        op->shape = Shape::kIds;
        op->first = [store, pattern](const Inputs&) { return store->List(pattern); };
      } else if (kind == "clear_all") {
        op->shape = Shape::kCount;
        op->first = [store](const Inputs&) { return store->ClearAll(); };
      } else if (kind == "acquire") {
        op->shape = Shape::kLockId;
        op->first = [store, id](const Inputs&) { return store->AcquireLock(id); };
      } else if (kind == "renew") {
        op->shape = Shape::kLockId;
        op->first = [store, id](const Inputs&) { return store->RenewLock(id); };
      } else if (kind == "release") {
        std::string lock_id = lua_type(L, 4) == LUA_TSTRING ? lua_tostring(L, 4) : "";
        op->first = [store, id, lock_id](const Inputs&) { return store->ReleaseLock(id, lock_id); };
      } else {
        err = absl::StrCat("unknown operation \"", kind, "\"");
        ok = false;
      }
    }
    if (!ok) {
      lua_pushnil(L);
      lua_pushlstring(L, err.data(), err.size());
    }
  }
  if (!ok) {
    delete op;
    return 2;
  }
  OpBox* ob = static_cast<OpBox*>(lua_newuserdatauv(L, sizeof(OpBox), 1));
  ob->op = op;
  luaL_setmetatable(L, kOpMeta);
  lua_pushvalue(L, 1);
  lua_setiuservalue(L, -2, 1);  // the op keeps its store alive
  return 1;
}

// op:start(now_ms) / op:timer(now_ms) -> action
int OpStart(lua_State* L) {
  HostOp* op = CheckOp(L, 1);
  int64_t now = luaL_checkinteger(L, 2);
  Action a = op->Start(InputsAt(now));
  int n = PushAction(L, *op, a);
  return n;  // `a` is destroyed on return, after all pushes; nothing raised meanwhile but OOM
}

int OpTimer(lua_State* L) {
  HostOp* op = CheckOp(L, 1);
  int64_t now = luaL_checkinteger(L, 2);
  Action a = op->OnTimer(InputsAt(now));
  return PushAction(L, *op, a);
}

// op:response(now_ms, status, body, exception_code) -> action
// op:response(now_ms, nil, message, maybe_delivered) -> action (no answer)
int OpResponse(lua_State* L) {
  HostOp* op = CheckOp(L, 1);
  int64_t now = luaL_checkinteger(L, 2);
  SqlResponse r;
  if (lua_isnil(L, 3)) {
    r.transport_ok = false;
    size_t n = 0;
    const char* msg = luaL_optlstring(L, 4, "the transport gave no answer", &n);
    r.transport_error.assign(msg, n);
    r.maybe_delivered = lua_isnoneornil(L, 5) ? true : lua_toboolean(L, 5);
  } else {
    r.http_status = static_cast<int>(luaL_checkinteger(L, 3));
    size_t n = 0;
    const char* body = luaL_optlstring(L, 4, "", &n);
    r.body.assign(body, n);
    if (lua_type(L, 5) == LUA_TSTRING) r.exception_code_header = lua_tostring(L, 5);
  }
  Action a = op->OnResponse(r, InputsAt(now));
  return PushAction(L, *op, a);
}

// store:execute(op) -> status, body, exception_code | nil, message, maybe_delivered
// Runs the op's pending request once with the native executor.
int StoreExecute(lua_State* L) {
  OpenStore* box = CheckStore(L, 1);
  HostOp* op = CheckOp(L, 2);
  if (!box->exec) return luaL_error(L, "this store has no native transport");
  SqlResponse r = box->exec->Execute(op->pending);
  if (!r.transport_ok) {
    lua_pushnil(L);
    lua_pushlstring(L, r.transport_error.data(), r.transport_error.size());
    lua_pushboolean(L, r.maybe_delivered);
  } else {
    lua_pushinteger(L, r.http_status);
    lua_pushlstring(L, r.body.data(), r.body.size());
    lua_pushlstring(L, r.exception_code_header.data(), r.exception_code_header.size());
  }
  return 3;
}

void SleepMs(int64_t ms) {
  if (ms <= 0) return;
  struct timespec ts {};
  ts.tv_sec = ms / 1000;
  ts.tv_nsec = (ms % 1000) * 1000000;
  while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
  }
}

// store:run(op) -> action (done or failed): the whole op in C, with the
// native executor, the monotonic clock and real sleeps (resends after
// transport failures are the core's, as for every host).
int StoreRun(lua_State* L) {
  OpenStore* box = CheckStore(L, 1);
  HostOp* op = CheckOp(L, 2);
  if (!box->exec) return luaL_error(L, "this store has no native transport");
  Action a = op->Start(InputsAt(native::MonotonicMs()));
  while (a.kind == Action::Kind::kRunSql || a.kind == Action::Kind::kWait) {
    if (a.kind == Action::Kind::kRunSql) {
      a = op->OnResponse(box->exec->Execute(a.request), InputsAt(native::MonotonicMs()));
    } else {
      SleepMs(a.wait_ms);
      a = op->OnTimer(InputsAt(native::MonotonicMs()));
    }
  }
  return PushAction(L, *op, a);
}

// ---------------------------------------------------------------- helpers

int LuaMonotonicMs(lua_State* L) {
  lua_pushinteger(L, native::MonotonicMs());
  return 1;
}

int LuaSleepMs(lua_State* L) {
  SleepMs(luaL_checkinteger(L, 1));
  return 0;
}

// C.environ() -> the variables configuration reads (CLICKHOUSE_*, MELTANO_STATE_BACKEND_*).
int LuaEnviron(lua_State* L) {
  lua_newtable(L);
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
    const char* eq = std::strchr(*e, '=');
    if (eq == nullptr) continue;
    if (std::strncmp(*e, "CLICKHOUSE_", 11) != 0 && std::strncmp(*e, "MELTANO_STATE_BACKEND_", 22) != 0) continue;
    lua_pushlstring(L, *e, static_cast<size_t>(eq - *e));
    lua_pushstring(L, eq + 1);
    lua_rawset(L, -3);
  }
  return 1;
}

const luaL_Reg kStoreMethods[] = {
    {"op", StoreOp},           {"run", StoreRun},         {"execute", StoreExecute},
    {"connection", StoreConnection}, {"close", StoreClose}, {"is_closed", StoreIsClosed},
    {"lease_valid", StoreLeaseValid}, {nullptr, nullptr},
};

const luaL_Reg kOpMethods[] = {
    {"start", OpStart}, {"response", OpResponse}, {"timer", OpTimer}, {nullptr, nullptr},
};

const luaL_Reg kFunctions[] = {
    {"new_store", NewStore},  {"to_json", LuaToJson},         {"from_json", LuaFromJson},
    {"environ", LuaEnviron},  {"monotonic_ms", LuaMonotonicMs}, {"sleep_ms", LuaSleepMs},
    {nullptr, nullptr},
};

}  // namespace
}  // namespace chstate::lua

extern "C" __attribute__((visibility("default"))) int luaopen_chstate(lua_State* L) {
  using namespace chstate::lua;
  if (luaL_newmetatable(L, kStoreMeta)) {
    lua_newtable(L);
    luaL_setfuncs(L, kStoreMethods, 0);
    lua_setfield(L, -2, "__index");
    lua_pushcfunction(L, StoreGc);
    lua_setfield(L, -2, "__gc");
  }
  lua_pop(L, 1);
  if (luaL_newmetatable(L, kOpMeta)) {
    lua_newtable(L);
    luaL_setfuncs(L, kOpMethods, 0);
    lua_setfield(L, -2, "__index");
    lua_pushcfunction(L, OpGc);
    lua_setfield(L, -2, "__gc");
  }
  lua_pop(L, 1);
  luaL_newmetatable(L, kArrayMeta);
  lua_pop(L, 1);

  if (luaL_loadbufferx(L, kChstateLua, sizeof(kChstateLua) - 1, "=chstate.lua", "t") != LUA_OK) {
    return lua_error(L);
  }
  luaL_newlib(L, kFunctions);
  luaL_getmetatable(L, kArrayMeta);
  lua_setfield(L, -2, "array_mt");
  lua_pushlightuserdata(L, nullptr);
  lua_setfield(L, -2, "null");
  // The connection settings chstate.open accepts: the core's, plus "uri".
  lua_newtable(L);
  lua_Integer n = 0;
  for (const char* key : chstate::kSettingKeys) {
    lua_pushstring(L, key);
    lua_rawseti(L, -2, ++n);
  }
  lua_setfield(L, -2, "setting_keys");
  lua_call(L, 1, 1);  // chstate.lua returns the module table
  return 1;
}
