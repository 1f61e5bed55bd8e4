// Lua values <-> JSON for the Lua 5.4 module `chstate` (docs/lua.md
// documents the rules for users):
//   object  <-> table with string keys (an empty table is an object: {})
//   array   <-> table with keys 1..n, or any table with the chstate.array
//               metatable (chstate.array{} is the empty array []); decoded
//               arrays carry that metatable, so [] round-trips
//   integer <-> Lua integer (math.type "integer"); float <-> Lua float (1.0
//               stays 1.0); NaN and infinities are refused
//   null    <-> chstate.null (a light userdata NULL, like cjson.null)
//   strings must be valid UTF-8; other key types, sparse or mixed tables,
//   functions, coroutines and userdata are refused with the path of the value.
//
// None of these raise a Lua error while a C++ object is alive: failures are
// returned (ToJson, PushJson) or pushed as `nil, message` (the Lua functions).
#ifndef CHSTATE_HOSTS_LUA_LUA_JSON_H_
#define CHSTATE_HOSTS_LUA_LUA_JSON_H_

#include <string>

#include "lua.hpp"
#include <nlohmann/json.hpp>

namespace chstate::lua {

// The registry name of the metatable that marks a table as a JSON array.
inline constexpr char kArrayMeta[] = "chstate.array";

// The Lua value at `idx` -> `out`. On failure returns false with `err` naming
// the offending value by its path below `path` ("state.bookmarks[2] is NaN").
bool ToJson(lua_State* L, int idx, const std::string& path, nlohmann::json& out, std::string& err);

// `j` -> a Lua value on top of the stack. False (with nothing pushed that
// matters) when it is nested more than 512 levels or the Lua stack is full.
bool PushJson(lua_State* L, const nlohmann::json& j);

// chstate.to_json(value) -> text | nil, message
int LuaToJson(lua_State* L);
// chstate.from_json(text) -> value | nil, message (any JSON value).
int LuaFromJson(lua_State* L);

}  // namespace chstate::lua

#endif  // CHSTATE_HOSTS_LUA_LUA_JSON_H_
