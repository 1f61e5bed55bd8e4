-- What only the LuaJIT module has (hosts/luajit): its numbers, where it finds
-- libchstate.so, its own HTTP transport over LuaSocket, and its rock. The
-- rest of the API is proven by the shared specs, which run.py --lua luajit
-- runs against it. OpenResty's cosockets are tests/openresty (a real nginx).
local T = require "support"
local chstate = T.chstate
local ffi = require "ffi"

local SCHEMA = "luajit_spec"

local function sh(cmd)
  local p = assert(io.popen(cmd .. " 2>&1; echo \"exit=$?\""))
  local out = p:read("*a")
  p:close()
  local body, code = out:match("^(.-)\n?exit=(%d+)\n?$")
  return body, tonumber(code)
end

local function quote(s)
  return "'" .. s:gsub("'", "'\\''") .. "'"
end

describe("the LuaJIT module #luajit", function()
  local store
  before_each(function() store = T.open(SCHEMA) end)
  after_each(function()
    if not store:is_closed() then
      store:clear_all()
      store:close()
    end
  end)

  it("is the FFI module over the library CHSTATE_LIBRARY names", function()
    assert.is_true(chstate._LUAJIT)
    assert.are.equal(os.getenv("CHSTATE_LIBRARY"), chstate._LIBRARY)
  end)

  it("writes whole numbers without a fraction and keeps other doubles exact", function()
    assert.are.equal("1", chstate.to_json(1.0))
    assert.are.equal("-0.5", chstate.to_json(-0.5))
    assert.are.equal("0.1", chstate.to_json(0.1))
    assert.are.equal(0.1 + 0.2, chstate.from_json(chstate.to_json(0.1 + 0.2)))
    assert.are.equal("5e-324", chstate.to_json(5e-324))
    assert.are.equal("9007199254740991", chstate.to_json(2 ^ 53 - 1))
    assert.are.equal("1e+300", chstate.to_json(1e300))
  end)

  it("keeps integers beyond 2^53 exact as int64_t", function()
    local v = chstate.from_json('{"big":9223372036854775807,"neg":-9223372036854775808,"edge":9007199254740993}')
    assert.is_true(ffi.istype("int64_t", v.big))
    assert.is_true(v.big == 9223372036854775807LL)
    assert.is_true(v.neg == -9223372036854775807LL - 1)
    assert.is_true(v.edge == 9007199254740993LL)  -- a double would be ...992
    assert.are.equal('{"big":9223372036854775807,"edge":9007199254740993,"neg":-9223372036854775808}',
                     chstate.to_json(v))
    -- Past 64 bits a double, as in the Lua 5.4 module.
    assert.are.equal("number", type(chstate.from_json("18446744073709551615")))
    assert.are.equal("18446744073709551615", chstate.to_json(18446744073709551615ULL))
  end)

  it("round-trips a state's numbers through the server", function()
    local state = {singer_state = {ts = 1764547200123, ratio = 0.25, big = 1234567890123456789LL,
                                   ints = {1, 2, 3}, empty = chstate.array()}}
    store:set("dev:numbers", state)
    local back = store:get("dev:numbers")
    assert.is_true(back.singer_state.big == 1234567890123456789LL)
    assert.are.equal(1764547200123, back.singer_state.ts)
    assert.are.equal(chstate.to_json(state), chstate.to_json(back))
  end)

  it("refuses cdata other than 64-bit integers, naming where it is", function()
    local ok, err = pcall(chstate.to_json, {p = ffi.new("int[1]")})
    assert.is_false(ok)
    assert.matches("value%.p is a cdata %(ctype<int %[1%]>%), which JSON cannot hold", tostring(err))
  end)

  it("sends again on a fresh connection after the server closed an idle one", function()
    store:set("dev:idle", {singer_state = {n = 1}})
    T.sleep(3.5)  -- ClickHouse 18.16 closes idle keep-alive connections after 3 s
    store:set("dev:idle", {singer_state = {n = 2}})
    assert.are.equal(2, store:get("dev:idle").singer_state.n)
  end)

  it("reports a server that is not there as UNAVAILABLE, without the password", function()
    local dead = chstate.open{host = "127.0.0.1", port = 1, user = "u", password = "s3cret-luajit", database = "default", env = false,
                              request_timeout_seconds = 2}
    local err = T.error_of(dead.ping, dead)
    assert.are.equal("UNAVAILABLE", err.code)
    assert.matches("connection refused", err.message)
    assert.matches("127%.0%.0%.1:1", err.message)
    assert.is_nil(tostring(err):find("s3cret", 1, true))
    dead:close()
  end)

  it("says that https outside nginx needs cosockets or a transport", function()
    local tls = chstate.open{host = T.host, port = T.port, user = T.user, secure = true, database = "default", env = false}
    local err = T.error_of(tls.ping, tls)
    assert.matches("https needs OpenResty's cosockets", err.message)
    tls:close()
  end)

  it("names CHSTATE_LIBRARY when the library cannot be found", function()
    local probe = "local ok, e = pcall(require, 'chstate'); io.write(tostring(e))"
    local lua_path = quote(os.getenv("LUA_PATH"))
    local out = sh(("env -u CHSTATE_LIBRARY LUA_CPATH=';' LUA_PATH=%s luajit -e %s"):format(lua_path, quote(probe)))
    assert.matches("CHSTATE_LIBRARY is not set", out)
    out = sh(("CHSTATE_LIBRARY=/nonexistent/libchstate.so LUA_CPATH=';' LUA_PATH=%s luajit -e %s"):format(
      lua_path, quote(probe)))
    assert.matches('CHSTATE_LIBRARY is "/nonexistent/libchstate.so", which is not a file', out)
  end)
end)

describe("the LuaJIT rockspec #luajit", function()
  it("installs a module that a plain luajit loads from the tree alone", function()
    local tree = os.tmpname()
    os.remove(tree)
    local out, code = sh(("luarocks --lua-version=5.1 --tree=%q make hosts/luajit/chstate-luajit-scm-1.rockspec"):format(
      tree))
    assert.are.equal(0, code, "luarocks make failed:\n" .. tostring(out))
    local lib = tree .. "/lib/lua/5.1/chstate/libchstate.so"
    assert.is_truthy(io.open(lib), "no " .. lib)
    -- Outside the checkout, with no CHSTATE_LIBRARY and only the tree's paths.
    local probe = "local c = require 'chstate'; local s = c.open{env = false, database = 'default', host = '" .. T.host .. "', port = " ..
                  T.port .. ", user = '" .. T.user .. "', password = '" .. T.password .. "'}; " ..
                  "io.write(c._LIBRARY, ' ', (s:ping()))"
    -- (";;": the system's LuaSocket, the transport outside nginx.)
    local said = sh(("cd /tmp && env -u CHSTATE_LIBRARY LUA_PATH=%q LUA_CPATH=%q luajit -e %s"):format(
      tree .. "/share/lua/5.1/?.lua;;", tree .. "/lib/lua/5.1/?.so;;", quote(probe)))
    assert.matches("^" .. lib:gsub("%p", "%%%0") .. " %d+%.%d+", said)
    os.execute(("rm -rf %q"):format(tree))
  end)
end)
