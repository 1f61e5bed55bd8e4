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
// What is here, per store: open it from the user's raw settings (the core
// resolves them), start a verb document, answer its request or wait, send a
// request with the native executor, and, with that executor, a thread that
// feeds the core's idle timer at its next_timeout_ms while Lua code runs, so
// that a lock scope keeps its lock however long its function runs. Every
// rule (settings, SQL, resends, the lock and its renewal, Meltano's merge)
// is the core's.
//
// lua_error longjmps over C++ frames, so no function raises while a C++
// object with a destructor is alive: work happens in a scope that pushes its
// results, and failures are returned as values.
#include <time.h>

#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "core/config.h"
#include "core/settings.h"
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
  // The Lua thread's calls and the renewer take turns on the store.
  std::mutex mu;
  Settings settings;
  std::unique_ptr<Store> store;
  std::unique_ptr<protocol::OpDriver> driver;  // declared after the store: destroyed first
  std::unique_ptr<native::HttpExecutor> exec;  // null when Lua supplies the transport
  SqlRequest pending;                          // the last request, for store:execute
  // The renewer (native transport only): feeds the idle timer when due.
  std::thread renewer;
  std::condition_variable wake;
  std::optional<int64_t> next_timeout_ms;  // from the last "done"/"idle"
  bool stopping = false;
  // The renewer is inside an idle timer's operation; it may let go of `mu`
  // while the core waits (a resend's back-off), and Lua must not start an
  // operation then (it would abandon the renewal).
  bool renewing = false;
  // What the store told while the renewer ran (a renewal, a lease lost):
  // no Lua code can run on its thread, so they wait here for the next action
  // Lua takes, which carries them first.
  nlohmann::json told_in_background = nlohmann::json::array();

  ~OpenStore() {
    {
      std::lock_guard<std::mutex> lock(mu);
      stopping = true;
    }
    wake.notify_all();
    if (renewer.joinable()) renewer.join();
  }
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

Inputs InputsAt(int64_t now_ms) { return Inputs{now_ms, native::OsRandomBytes()}; }

// Remembers when the core next wants its idle timer, from an action document.
void NoteTimer(OpenStore* box, const json& action) {
  const json* body = action.contains("done") ? &action["done"] : action.contains("idle") ? &action["idle"] : nullptr;
  if (body == nullptr) return;
  auto it = body->find("next_timeout_ms");
  if (it == body->end()) return;
  box->next_timeout_ms = it->is_number_integer() ? std::optional<int64_t>(it->get<int64_t>()) : std::nullopt;
  box->wake.notify_all();
}

// The request document as the native executor takes it (the inverse of
// protocol::RequestJson; the executor reads the SQL, the settings, the
// timeout and where to send it).
SqlRequest RequestFromJson(const json& r);

// Keeps an action's events for Lua (the renewer's; `mu` held).
void KeepEvents(OpenStore* box, const json& action) {
  auto it = action.find("events");
  if (it == action.end() || !it->is_array()) return;
  for (const json& e : *it) box->told_in_background.push_back(e);
  // Not unbounded while Lua makes no call: the newest, as the core's own queue keeps.
  constexpr size_t kMaxKept = 1000;
  json& kept = box->told_in_background;
  if (kept.size() > kMaxKept) kept.erase(kept.begin(), kept.begin() + static_cast<std::ptrdiff_t>(kept.size() - kMaxKept));
}

// `action` with the events told in the background before its own (`mu` held).
json WithBackgroundEvents(OpenStore* box, json action) {
  if (box->told_in_background.empty()) return action;
  json events = std::move(box->told_in_background);
  box->told_in_background = json::array();
  if (auto it = action.find("events"); it != action.end() && it->is_array()) {
    for (json& e : *it) events.push_back(std::move(e));
  }
  action["events"] = std::move(events);
  return action;
}

// The renewer's loop: while no operation runs and the core's timer is due,
// the idle timer runs to its end over the native executor. A lock found lost
// is the core's to report: the scope's release says so.
void Renew(OpenStore* box) {
  std::unique_lock<std::mutex> lock(box->mu);
  while (!box->stopping) {
    if (!box->next_timeout_ms) {
      box->wake.wait(lock);
      continue;
    }
    const int64_t now = native::MonotonicMs();
    if (now < *box->next_timeout_ms) {
      box->wake.wait_for(lock, std::chrono::milliseconds(*box->next_timeout_ms - now));
      continue;
    }
    if (box->driver->busy()) {
      // An op runs (its pump renews what it needs); look again shortly.
      box->wake.wait_for(lock, std::chrono::milliseconds(10));
      continue;
    }
    box->renewing = true;
    json action = box->driver->Feed(R"({"timer":true})", InputsAt(now));
    KeepEvents(box, action);
    while (!box->stopping && (action.contains("request") || action.contains("wait_ms"))) {
      if (action.contains("request")) {
        SqlResponse r = box->exec->Execute(RequestFromJson(action["request"]));
        json answer = r.transport_ok ? json{{"transport_ok", true},
                                            {"http_status", r.http_status},
                                            {"exception_code_header", r.exception_code_header},
                                            {"body_hex", HexEncode(r.body)}}
                                     : json{{"transport_ok", false},
                                            {"transport_error", r.transport_error},
                                            {"maybe_delivered", r.maybe_delivered}};
        action = box->driver->Feed(protocol::Dump(json{{"response", std::move(answer)}}),
                                   InputsAt(native::MonotonicMs()));
      } else {
        box->wake.wait_for(lock, std::chrono::milliseconds(action["wait_ms"].get<int64_t>()));
        action = box->driver->Feed(R"({"timer":true})", InputsAt(native::MonotonicMs()));
      }
      KeepEvents(box, action);
    }
    box->renewing = false;
    if (action.contains("failed")) {
      box->next_timeout_ms = box->store->NextTimeoutMs();  // a lost lock is no longer renewed
    } else {
      NoteTimer(box, action);
    }
    box->wake.notify_all();  // a Lua call waiting for the renewal to end
  }
}

// C.open(settings, native) -> store, info | nil, failed
// settings: the settings document as a Lua table ({from=, values=, env=,
// host=}); native: the module's own HTTP executor (and its renewer) serve
// the store. `info` holds what Lua shows (never the password); `failed` is
// {code=, message=}.
int Open(lua_State* L) {
  luaL_checktype(L, 1, LUA_TTABLE);
  const bool native = lua_toboolean(L, 2);
  StoreBox* ud = static_cast<StoreBox*>(lua_newuserdatauv(L, sizeof(StoreBox), 0));
  ud->open = nullptr;
  luaL_setmetatable(L, kStoreMeta);
  bool ok = false;
  {
    json doc;
    std::string err;
    absl::StatusOr<protocol::OpenedStore> opened = absl::InvalidArgumentError("");
    if (!ToJson(L, 1, "settings", doc, err)) {
      opened = absl::InvalidArgumentError(err);
    } else {
      if (native) {
        // What Lua asked for (diagnostics) stays; the renewer thread is the module's.
        if (!doc.contains("host") || !doc["host"].is_object()) doc["host"] = json::object();
        doc["host"]["timers"] = true;
        doc["host"]["exit_release"] = false;
      }
      opened = protocol::OpenStore(protocol::Dump(doc));
    }
    if (!opened.ok()) {
      lua_pushnil(L);
      PushJson(L, protocol::FailedJson(opened.status())["failed"]);
    } else {
      ok = true;
      OpenStore* box = new OpenStore();
      ud->open = box;
      box->settings = std::move(opened->settings);
      box->store = std::move(opened->store);
      box->driver = std::make_unique<protocol::OpDriver>(box->store.get());
      if (native) {
        native::ExecutorOptions eo;
        eo.connect_timeout_ms = box->settings.connect_timeout_ms;
        box->exec = std::make_unique<native::HttpExecutor>(box->settings.connection, eo);
        box->renewer = std::thread(Renew, box);
      }
      json info = protocol::SettingsJson(box->settings)["settings"];
      info["connection"].erase("password");
      PushJson(L, info);
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
  const ConnectionConfig& c = box->settings.connection;
  lua_createtable(L, 0, 8);
  SetField(L, "host", c.host);
  lua_pushinteger(L, c.port);
  lua_setfield(L, -2, "port");
  lua_pushboolean(L, c.secure);
  lua_setfield(L, -2, "secure");
  SetField(L, "user", c.user);
  SetField(L, "password", c.password);
  SetField(L, "database", c.database);
  SetField(L, "ca_file", c.ca_file);
  lua_pushinteger(L, box->settings.connect_timeout_ms);
  lua_setfield(L, -2, "connect_timeout_ms");
  return 1;
}

// store:renews() -> true when a thread of the module renews held locks
// while Lua code runs (the native transport).
int StoreRenews(lua_State* L) {
  OpenStore* box = CheckStore(L, 1);
  lua_pushboolean(L, box->exec != nullptr);
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
  NoteTimer(box, action);
  if (!PushJson(L, action)) {
    PushJson(L, protocol::FailedJson(absl::InternalError("the result is nested too deeply for the Lua stack")));
  }
  return 1;
}

// Feeds one answer document to the running op and pushes the next action.
int Feed(lua_State* L, OpenStore* box, const json& answer, int64_t now_ms) {
  json action;
  {
    std::lock_guard<std::mutex> lock(box->mu);
    action = WithBackgroundEvents(box, box->driver->Feed(protocol::Dump(answer), InputsAt(now_ms)));
  }
  return PushAction(L, box, std::move(action));
}

// store:start(now_ms, op) -> action | nil, message
// `op` is a verb document as a Lua table (a value JSON cannot hold is named
// by its path).
int StoreStart(lua_State* L) {
  OpenStore* box = CheckStore(L, 1);
  const int64_t now = luaL_checkinteger(L, 2);
  luaL_checktype(L, 3, LUA_TTABLE);
  int results = 2;
  {
    json op;
    std::string err;
    if (!ToJson(L, 3, "op", op, err)) {
      lua_pushnil(L);
      lua_pushlstring(L, err.data(), err.size());
    } else {
      json action;
      {
        std::unique_lock<std::mutex> lock(box->mu);
        box->wake.wait(lock, [box] { return !box->renewing; });  // a renewal in flight ends first
        action = WithBackgroundEvents(box, box->driver->Start(protocol::Dump(op), InputsAt(now)));
      }
      results = PushAction(L, box, std::move(action));
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
    SqlResponse r;
    {
      std::lock_guard<std::mutex> lock(box->mu);
      r = box->exec->Execute(box->pending);
    }
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

// C.protocol_store(settings_json) -> store | nil, failed_json
int ProtocolStoreNew(lua_State* L) {
  size_t n = 0;
  const char* text = luaL_checklstring(L, 1, &n);
  absl::StatusOr<protocol::OpenedStore> opened = protocol::OpenStore(absl::string_view(text, n));
  if (!opened.ok()) {
    lua_pushnil(L);
    PushString(L, protocol::Dump(protocol::FailedJson(opened.status())));
    return 2;
  }
  auto** box = static_cast<ProtocolStore**>(lua_newuserdatauv(L, sizeof(ProtocolStore*), 0));
  *box = new ProtocolStore();
  (*box)->store = std::move(opened->store);
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

// C.resolve_settings(settings_json) -> settings_or_failed_json
int ProtocolResolveSettings(lua_State* L) {
  size_t n = 0;
  const char* text = luaL_checklstring(L, 1, &n);
  std::string out = protocol::Dump(protocol::ResolveSettingsJson(absl::string_view(text, n)));
  PushString(L, out);
  return 1;
}

const luaL_Reg kProtocolMethods[] = {
    {"start", ProtocolStart}, {"feed", ProtocolFeed}, {"free", ProtocolStoreFree}, {nullptr, nullptr},
};

const luaL_Reg kStoreMethods[] = {
    {"start", StoreStart},           {"response", StoreResponse}, {"timer", StoreTimer},
    {"execute", StoreExecute},       {"connection", StoreConnection}, {"close", StoreClose},
    {"is_closed", StoreIsClosed},    {"renews", StoreRenews},         {nullptr, nullptr},
};

const luaL_Reg kFunctions[] = {
    {"open", Open},           {"to_json", LuaToJson},         {"from_json", LuaFromJson},
    {"environ", LuaEnviron},  {"monotonic_ms", LuaMonotonicMs}, {"sleep_ms", LuaSleepMs},
    {"protocol_store", ProtocolStoreNew}, {"resolve_settings", ProtocolResolveSettings},
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
  // The verb table the Lua half binds (core/verbs.h).
  chstate::lua::PushJson(L, chstate::protocol::VerbsJson()["verbs"]);
  lua_setfield(L, -2, "verbs");
  lua_call(L, 1, 1);  // chstate.lua returns the module table
  return 1;
}
