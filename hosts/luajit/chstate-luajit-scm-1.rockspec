-- LuaRocks package of the LuaJIT module (OpenResty, Kong, APISIX, Tarantool,
-- plain LuaJIT 2.1). The module is Lua over LuaJIT's FFI; the core is
-- libchstate.so, built by Bazel from this repository (the core, abseil and RE2
-- compiled in), so the rock is made from a checkout, at its root:
--
--   luarocks --lua-version=5.1 make hosts/luajit/chstate-luajit-scm-1.rockspec              # system tree (root)
--   luarocks --lua-version=5.1 --tree=lua_modules make hosts/luajit/chstate-luajit-scm-1.rockspec
--
-- Run tools/setup first. It installs chstate.lua, chstate/{api,json,http}.lua
-- and chstate/libchstate.so, where `require "chstate"` finds them with no
-- CHSTATE_LIBRARY. Inside nginx, add the tree to lua_package_path and
-- lua_package_cpath.
rockspec_format = "3.0"
package = "chstate-luajit"
version = "scm-1"
source = {
  url = "git+file://.",
}
description = {
  summary = "Meltano state in ClickHouse, for LuaJIT and OpenResty",
  detailed = [[
chstate keeps Meltano's incremental state in ClickHouse with Meltano's
semantics (completed/partial states, update() merges, a per-state-id lock).
The same API as the Lua 5.4 rock: chstate.open{...} -> store with a method
per verb of the core's table (get, set, merge, list, export, import, ...),
with_lock and close, plus chstate.safe. Inside
nginx it talks to ClickHouse over cosockets and waits with ngx.sleep.
]],
}
dependencies = {
  "lua == 5.1",
}
build = {
  type = "command",
  -- The default configuration, as the tests build it (add -c opt to optimise).
  build_command = "bazel build //hosts/python:libchstate.so",
  install = {
    lua = {
      chstate = "hosts/luajit/chstate.lua",
      ["chstate.api"] = "hosts/lua/chstate.lua",
      ["chstate.json"] = "hosts/luajit/chstate/json.lua",
      ["chstate.http"] = "hosts/luajit/chstate/http.lua",
    },
    lib = {
      ["chstate.libchstate"] = "bazel-bin/hosts/python/libchstate.so",
    },
  },
}
