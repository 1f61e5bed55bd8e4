-- The rockspec: `luarocks make` from the checkout builds chstate.so with
-- Bazel and installs it where a plain `require "chstate"` finds it.
describe("the rockspec #lua54", function()
  it("installs a loadable chstate module into a LuaRocks tree", function()
    local tree = os.tmpname()
    os.remove(tree)
    local log = tree .. ".log"
    local ok = os.execute(("luarocks --lua-version=5.4 --tree=%q make hosts/lua/chstate-scm-1.rockspec >%q 2>&1")
                            :format(tree, log))
    local f = io.open(log)
    local output = f and f:read("a") or ""
    if f then f:close() end
    os.remove(log)
    assert.is_true(ok == true, "luarocks make failed:\n" .. output)
    local so = tree .. "/lib/lua/5.4/chstate.so"
    assert.is_truthy(io.open(so), "no " .. so)
    -- a fresh interpreter that only knows the tree's path loads it
    local probe = io.popen(("LUA_CPATH_5_4=%q lua5.4 -e %q"):format(
      tree .. "/lib/lua/5.4/?.so",
      'local c = require "chstate"; io.write(c._VERSION, " ", package.searchpath("chstate", package.cpath))'))
    local said = probe:read("a")
    probe:close()
    assert.are.equal("chstate 0.1.0 " .. so, said)
    os.execute(("rm -rf %q"):format(tree))
  end)
end)
