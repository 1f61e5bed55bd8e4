// The native half of the Lua 5.4 module `chstate`: a core Store driven
// through the JSON protocol every host speaks (hosts/common/protocol.h), and
// the native HTTP executor. The idiomatic API (chstate.open, store:get, ...,
// chstate.safe) and the loop that pumps operations are chstate.lua, compiled
// into this library and run by luaopen_chstate with the table built here as
// its argument. Lua values become JSON and back in lua_json.cc.
//
//   local chstate = require "chstate"          -- loads chstate.so
//   local store = chstate.open{uri = "clickhouse://meltano@localhost:8123/default"}
//
// What is here, per store: start an op document, answer its request or wait,
// and send a request with the native executor; every rule (SQL, resends, the
// lock and its renewal, Meltano's merge) is the core's.
//
// lua_error longjmps over C++ frames, so no function raises while a C++
// object with a destructor is alive: work happens in a scope that pushes its
// results, and failures are returned as values.
#include <time.h>

#include <cerrno>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "core/config.h"
#include "core/defaults.h"
#include "core/quoting.h"
#include "core/store.h"
#include "core/task.h"
#include "hosts/common/protocol.h"
#include "hosts/lua/lua_json.h"
#include "hosts/native/executor.h"
#include "lua.hpp"
#include <nlohmann/json.hpp>

extern char** environ;

// The Lua half, generated from chstate.lua (see BUILD.bazel).
#include "hosts/lua/chstate_lua.inc"

namespace chstate::lua {
namespace {

constexpr char kStoreMeta[] = "chstate.native_store";

using nlohmann::json;

// ---------------------------------------------------------------- stores

struct OpenStore {
  ConnectionConfig config;
  std::unique_ptr<Store> store;
  std::unique_ptr<protocol::OpDriver> driver;  // declared after the store: destroyed first
  std::unique_ptr<native::HttpExecutor> exec;  // null when Lua supplies the transport
  SqlRequest pending;                          // the last request, for store:execute
};

// The userdata holds one pointer, so that a closed store owns nothing (Lua
// frees the block itself; no destructor has to run).
struct StoreBox {
  OpenStore* open;  // null once closed
};

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
// connect_timeout_ms, timeout_ms, history_days}.
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
  const int64_t history_days = IntField(L, 3, "history_days", kDefaultHistoryDays);
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
      // Every host of the connection: the core picks one per request (and
      // names them in its messages); the executor connects where it says.
      options.hosts = config->hosts;
      if (options.hosts.empty()) {
        options.endpoint = absl::StrCat(config->host.find(':') != std::string::npos ? "[" + config->host + "]"
                                                                                     : config->host,
                                        ":", config->port);
      }
      options.lock.timeout_ms = lock_timeout;
      options.lock.retry_ms = lock_retry;
      options.lock.stale_ms = stale;
      options.transport.request_timeout_ms = timeout;
      options.history_days = history_days;
      options.cluster.name = config->cluster;
      options.cluster.zookeeper_path = config->zookeeper_path;
      options.cluster.replica = config->replica;
      options.cluster.quorum = config->quorum;
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
      box->driver = std::make_unique<protocol::OpDriver>(box->store.get());
      if (native) {
        native::ExecutorOptions eo;
        eo.connect_timeout_ms = connect_timeout;
        box->exec = std::make_unique<native::HttpExecutor>(box->config, eo);
      }
      lua_createtable(L, 0, 10);
      SetField(L, "redacted_uri", box->config.RedactedUri());
      SetField(L, "host", box->config.host);
      lua_pushinteger(L, box->config.port);
      lua_setfield(L, -2, "port");
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
  lua_createtable(L, 0, 7);
  SetField(L, "host", box->config.host);
  lua_pushinteger(L, box->config.port);
  lua_setfield(L, -2, "port");
  lua_pushboolean(L, box->config.secure);
  lua_setfield(L, -2, "secure");
  SetField(L, "user", box->config.user);
  SetField(L, "password", box->config.password);
  SetField(L, "database", box->config.database);
  SetField(L, "ca_file", box->config.ca_file);
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

// ---------------------------------------------------------------- operations

Inputs InputsAt(int64_t now_ms) { return Inputs{now_ms, native::OsRandomBytes()}; }

// The request document as the native executor takes it (the inverse of
// protocol::RequestJson; the executor reads the SQL, the settings, the
// timeout and where to send it).
SqlRequest RequestFromJson(const json& r) {
  SqlRequest out;
  if (auto it = r.find("sql"); it != r.end() && it->is_string()) out.sql = it->get<std::string>();
  if (auto it = r.find("url_params"); it != r.end() && it->is_array()) {
    for (const json& p : *it) {
      if (p.is_array() && p.size() == 2 && p[0].is_string() && p[1].is_string()) {
        out.url_params.emplace_back(p[0].get<std::string>(), p[1].get<std::string>());
      }
    }
  }
  if (auto it = r.find("timeout_ms"); it != r.end() && it->is_number_integer()) out.timeout_ms = it->get<int64_t>();
  auto host = r.find("host");
  auto port = r.find("port");
  if (host != r.end() && host->is_string() && port != r.end() && port->is_number_integer()) {
    out.endpoint = Endpoint{host->get<std::string>(), port->get<int>()};
  }
  return out;
}

// Pushes the next action document as one Lua table ({request=}, {wait_ms=},
// {done=} or {failed=}). A request is kept for store:execute.
int PushAction(lua_State* L, OpenStore* box, json action) {
  if (auto r = action.find("request"); r != action.end()) {
    if (box->exec) box->pending = RequestFromJson(*r);
  }
  if (!PushJson(L, action)) {
    PushJson(L, protocol::FailedJson(absl::InternalError("the result is nested too deeply for the Lua stack")));
  }
  return 1;
}

// Feeds one answer document to the running op and pushes the next action.
int Feed(lua_State* L, OpenStore* box, const json& answer, int64_t now_ms) {
  return PushAction(L, box, box->driver->Feed(protocol::Dump(answer), InputsAt(now_ms)));
}

// store:start(now_ms, op[, side, state]) -> action | nil, message
// `op` is an op document as a Lua table (chstate.lua asks for "merged"
// views, the core's DeepMerge); `state`, when given, becomes its
// "state" member {[side] = state} (converted here so that a value JSON cannot
// hold is named by its path below "state").
int StoreStart(lua_State* L) {
  OpenStore* box = CheckStore(L, 1);
  const int64_t now = luaL_checkinteger(L, 2);
  luaL_checktype(L, 3, LUA_TTABLE);
  const bool has_state = !lua_isnoneornil(L, 5);
  if (has_state) luaL_checkstring(L, 4);
  int results = 2;
  {
    json op, state;
    std::string err;
    if (!ToJson(L, 3, "op", op, err) || (has_state && !ToJson(L, 5, "state", state, err))) {
      // err names the value
    } else if (has_state && !state.is_object()) {
      err = "state must be a table with string keys (a JSON object), not an array";
    } else {
      if (has_state) op["state"] = json::object({{lua_tostring(L, 4), std::move(state)}});
      results = PushAction(L, box, box->driver->Start(protocol::Dump(op), InputsAt(now)));
    }
    if (!err.empty()) {
      lua_pushnil(L);
      lua_pushlstring(L, err.data(), err.size());
    }
  }
  return results;
}

// store:response(now_ms, status, body, exception_code) -> action
// store:response(now_ms, nil, message, maybe_delivered) -> action (no answer)
int StoreResponse(lua_State* L) {
  OpenStore* box = CheckStore(L, 1);
  const int64_t now = luaL_checkinteger(L, 2);
  size_t n = 0;
  const char* text = luaL_optlstring(L, 4, "", &n);
  int results = 0;
  {
    json r;
    if (lua_isnil(L, 3)) {
      r = {{"transport_ok", false},
           {"transport_error", n > 0 ? std::string(text, n) : "the transport gave no answer"},
           {"maybe_delivered", lua_isnoneornil(L, 5) ? true : static_cast<bool>(lua_toboolean(L, 5))}};
    } else {
      r = {{"transport_ok", true},
           {"http_status", static_cast<int64_t>(lua_tointeger(L, 3))},
           {"body_hex", HexEncode(absl::string_view(text, n))}};  // any bytes
      if (lua_type(L, 5) == LUA_TSTRING) r["exception_code_header"] = lua_tostring(L, 5);
    }
    results = Feed(L, box, json{{"response", std::move(r)}}, now);
  }
  return results;
}

// store:timer(now_ms) -> action, after a wait.
int StoreTimer(lua_State* L) {
  OpenStore* box = CheckStore(L, 1);
  const int64_t now = luaL_checkinteger(L, 2);
  return Feed(L, box, json{{"timer", true}}, now);
}

// store:execute() -> status, body, exception_code | nil, message, maybe_delivered
// Sends the last request once with the native executor.
int StoreExecute(lua_State* L) {
  OpenStore* box = CheckStore(L, 1);
  if (!box->exec) return luaL_error(L, "this store has no native transport");
  {
    SqlResponse r = box->exec->Execute(box->pending);
    if (!r.transport_ok) {
      lua_pushnil(L);
      lua_pushlstring(L, r.transport_error.data(), r.transport_error.size());
      lua_pushboolean(L, r.maybe_delivered);
    } else {
      lua_pushinteger(L, r.http_status);
      lua_pushlstring(L, r.body.data(), r.body.size());
      lua_pushlstring(L, r.exception_code_header.data(), r.exception_code_header.size());
    }
  }
  return 3;
}

// ---------------------------------------------------------------- helpers

void SleepMs(int64_t ms) {
  if (ms <= 0) return;
  struct timespec ts {};
  ts.tv_sec = ms / 1000;
  ts.tv_nsec = (ms % 1000) * 1000000;
  while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
  }
}

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

// ------------------------------------------------- the protocol, as documents
//
// chstate.protocol: the core's JSON protocol itself (hosts/common/protocol.h),
// documents in and out as strings, with the time and random bytes given by
// the caller. For orchestrators that drive the protocol on their own, and for
// the conformance vectors, which every host replays byte for byte.

constexpr char kProtocolMeta[] = "chstate.protocol_store";

struct ProtocolStore {
  std::unique_ptr<Store> store;
  std::unique_ptr<protocol::OpDriver> driver;  // destroyed before the store
};

ProtocolStore* CheckProtocolStore(lua_State* L) {
  auto** box = static_cast<ProtocolStore**>(luaL_checkudata(L, 1, kProtocolMeta));
  if (*box == nullptr) luaL_argerror(L, 1, "the protocol store was freed");
  return *box;
}

void PushString(lua_State* L, const std::string& s) { lua_pushlstring(L, s.data(), s.size()); }

// C.protocol_store(options_json) -> store | nil, failed_json
int ProtocolStoreNew(lua_State* L) {
  size_t n = 0;
  const char* text = luaL_checklstring(L, 1, &n);
  absl::StatusOr<json> doc = protocol::ParseDocument(absl::string_view(text, n));
  absl::StatusOr<StoreOptions> options =
      doc.ok() ? protocol::StoreOptionsFromJson(*doc) : absl::StatusOr<StoreOptions>(doc.status());
  absl::StatusOr<std::unique_ptr<Store>> store =
      options.ok() ? Store::Create(*std::move(options)) : absl::StatusOr<std::unique_ptr<Store>>(options.status());
  if (!store.ok()) {
    lua_pushnil(L);
    PushString(L, protocol::Dump(protocol::FailedJson(store.status())));
    return 2;
  }
  auto** box = static_cast<ProtocolStore**>(lua_newuserdatauv(L, sizeof(ProtocolStore*), 0));
  *box = new ProtocolStore();
  (*box)->store = *std::move(store);
  (*box)->driver = std::make_unique<protocol::OpDriver>((*box)->store.get());
  luaL_setmetatable(L, kProtocolMeta);
  return 1;
}

// store:start(op_json, now_ms, random) / store:feed(answer_json, now_ms, random) -> action_json
int ProtocolCall(lua_State* L, bool start) {
  ProtocolStore* ps = CheckProtocolStore(L);
  size_t n = 0, rn = 0;
  const char* text = luaL_checklstring(L, 2, &n);
  const int64_t now = luaL_checkinteger(L, 3);
  const char* random = luaL_checklstring(L, 4, &rn);
  const Inputs in{now, std::string(random, rn)};
  std::string out;
  {
    json action = start ? ps->driver->Start(absl::string_view(text, n), in)
                        : ps->driver->Feed(absl::string_view(text, n), in);
    out = protocol::Dump(action);
  }
  PushString(L, out);
  return 1;
}
int ProtocolStart(lua_State* L) { return ProtocolCall(L, true); }
int ProtocolFeed(lua_State* L) { return ProtocolCall(L, false); }

int ProtocolStoreFree(lua_State* L) {
  auto** box = static_cast<ProtocolStore**>(luaL_checkudata(L, 1, kProtocolMeta));
  delete *box;
  *box = nullptr;
  return 0;
}

// C.resolve_config(sources_json) -> config_or_failed_json
int ProtocolResolveConfig(lua_State* L) {
  size_t n = 0;
  const char* text = luaL_checklstring(L, 1, &n);
  std::string out = protocol::Dump(protocol::ResolveConfigJson(absl::string_view(text, n)));
  PushString(L, out);
  return 1;
}

const luaL_Reg kProtocolMethods[] = {
    {"start", ProtocolStart}, {"feed", ProtocolFeed}, {"free", ProtocolStoreFree}, {nullptr, nullptr},
};

const luaL_Reg kStoreMethods[] = {
    {"start", StoreStart},           {"response", StoreResponse}, {"timer", StoreTimer},
    {"execute", StoreExecute},       {"connection", StoreConnection}, {"close", StoreClose},
    {"is_closed", StoreIsClosed},    {nullptr, nullptr},
};

const luaL_Reg kFunctions[] = {
    {"new_store", NewStore},  {"to_json", LuaToJson},         {"from_json", LuaFromJson},
    {"environ", LuaEnviron},  {"monotonic_ms", LuaMonotonicMs}, {"sleep_ms", LuaSleepMs},
    {"protocol_store", ProtocolStoreNew}, {"resolve_config", ProtocolResolveConfig},
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
  if (luaL_newmetatable(L, kProtocolMeta)) {
    lua_newtable(L);
    luaL_setfuncs(L, kProtocolMethods, 0);
    lua_setfield(L, -2, "__index");
    lua_pushcfunction(L, ProtocolStoreFree);
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
