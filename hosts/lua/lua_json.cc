// Lua values <-> JSON (lua_json.h). The JSON side is the core's: texts are
// parsed by its parser and strings checked by the serialiser every document
// goes through; what is decided here is only which Lua value is which JSON
// value, and the path of a value that has none.
#include "hosts/lua/lua_json.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <utility>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "core/state.h"

namespace chstate::lua {
namespace {

using nlohmann::json;

// Deeper than this is refused both ways (the core's parser has the same
// bound), so no conversion recurses without limit.
constexpr int kMaxDepth = 512;

// nlohmann's serialiser checks UTF-8 (strict: it reports what the core's
// Dump would replace).
bool IsUtf8(const json& s) {
  try {
    s.dump(-1, ' ', false, json::error_handler_t::strict);
    return true;
  } catch (const json::exception&) {
    return false;
  }
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
bool Convert(lua_State* L, int idx, const std::string& path, int depth, json& out, std::string& err) {
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
      out = std::string(s, n);
      if (!IsUtf8(out)) {
        err = absl::StrCat(path, " is not valid UTF-8, which JSON strings must be (encode binary data, e.g. as hex)");
        return false;
      }
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
          bool ok = Convert(L, -1, absl::StrCat(path, "[", i, "]"), depth + 1, item, err);
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
        if (!IsUtf8(key)) {
          err = absl::StrCat(KeyPath(path, key), ": the key is not valid UTF-8, which JSON keys must be");
          lua_pop(L, 2);
          return false;
        }
        json item;
        bool ok = Convert(L, -1, KeyPath(path, key), depth + 1, item, err);
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

bool Push(lua_State* L, const json& j, int depth) {
  if (depth > kMaxDepth || !lua_checkstack(L, 4)) return false;
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
        if (!Push(L, item, depth + 1)) return false;
        lua_rawseti(L, -2, ++i);
      }
      luaL_setmetatable(L, kArrayMeta);
      return true;
    }
    case json::value_t::object: {
      lua_createtable(L, 0, static_cast<int>(j.size()));
      for (auto it = j.begin(); it != j.end(); ++it) {
        lua_pushlstring(L, it.key().data(), it.key().size());
        if (!Push(L, it.value(), depth + 1)) return false;
        lua_rawset(L, -3);
      }
      return true;
    }
    default:
      lua_pushnil(L);  // binary / discarded: never produced by the core
      return true;
  }
}

}  // namespace

bool ToJson(lua_State* L, int idx, const std::string& path, json& out, std::string& err) {
  return Convert(L, idx, path, 0, out, err);
}

bool PushJson(lua_State* L, const json& j) { return Push(L, j, 0); }

int LuaToJson(lua_State* L) {
  luaL_checkany(L, 1);
  bool ok = false;
  {
    json j;
    std::string err;
    ok = ToJson(L, 1, "value", j, err);
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
    } else if (text[first] == '{') {
      // The core's object parser gives positioned messages.
      absl::StatusOr<json> parsed = ParseStateJson(text);
      if (parsed.ok()) value = *std::move(parsed);
      else err = std::string(parsed.status().message());
    } else {
      value = json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
      if (value.is_discarded()) err = "invalid JSON (not a JSON value)";
    }
    if (!err.empty()) {
      lua_pushnil(L);
      lua_pushlstring(L, err.data(), err.size());
    } else if (!PushJson(L, value)) {
      lua_pushnil(L);
      err = absl::StrCat("JSON nested more than ", kMaxDepth, " levels deep");
      lua_pushlstring(L, err.data(), err.size());
    } else {
      results = 1;
    }
  }
  return results;
}

}  // namespace chstate::lua
