-- LuaRocks package of the Lua 5.4 binding. chstate.so is built by Bazel from
-- this repository (the core, abseil and RE2 are compiled in), so the rock is
-- made from a checkout, at its root:
--
--   luarocks --lua-version=5.4 make hosts/lua/chstate-scm-1.rockspec            # system tree (root)
--   luarocks --lua-version=5.4 --tree=lua_modules make hosts/lua/chstate-scm-1.rockspec
--
-- Run tools/setup first (Bazel 4, the Debian C++ libraries, the pinned
-- abseil/RE2 sources); `make` runs the build command below and installs
-- bazel-bin/hosts/lua/chstate.so as the module `chstate`.
rockspec_format = "3.0"
package = "chstate"
version = "scm-1"
source = {
  -- `luarocks make` builds the checkout it runs in; this URL is only read by
  -- `luarocks build`/`install` of a published rock.
  url = "git+file://.",
}
description = {
  summary = "Meltano state in ClickHouse, for Lua 5.4 orchestrators",
  detailed = [[
chstate keeps Meltano's incremental state in ClickHouse with Meltano's
semantics (completed/partial states, update() merges, a per-state-id lock).
require "chstate" gives chstate.open{...} -> store with a method per verb of
the core's table (get, set, merge, list, export, import, ...), with_lock and
close, plus chstate.safe (nil, err).
]],
}
dependencies = {
  "lua >= 5.4, < 5.5",
}
build = {
  type = "command",
  -- The default configuration, as the tests build it (add -c opt to
  -- optimise; bazel-bin then points at the opt outputs).
  build_command = "bazel build //hosts/lua:chstate.so",
  install = {
    lib = {
      chstate = "bazel-bin/hosts/lua/chstate.so",
    },
  },
}
