-- Orchestrator-supplied transports and hooks against a real ClickHouse
-- 18.16: a LuaSocket transport, transport failures and retries, and a
-- transport that yields to an event loop.
local T = require "support"
local chstate = T.chstate

local SCHEMA = "lua_transport_spec"

describe("a Lua transport", function()
  it("runs the whole API over LuaSocket", function()
    local log = {}
    local s = T.open(SCHEMA, {transport = T.luasocket_transport(log)})
    s:clear_all()
    local version, dialect = s:ping()
    assert.are.equal(T.dialect_of(version), dialect)
    s:set("dev:sock", {singer_state = {a = 1}})
    s:merge("dev:sock", {singer_state = {b = chstate.array()}})
    assert.are.equal('{"singer_state":{"a":1,"b":[]}}', chstate.to_json((s:get("dev:sock"))))
    assert.are.same({"dev:sock"}, s:list("dev:*"))
    assert.are.equal("in", s:with_lock("dev:sock", function() return "in" end))
    s:delete("dev:sock")
    assert.is_nil(s:get("dev:sock"))
    -- what a transport is given
    local req = log[#log]
    assert.is_string(req.sql)
    assert.are.equal(req.sql, req.body)
    assert.matches("^http://" .. T.host:gsub("%.", "%%.") .. ":" .. T.port .. "/%?database=default", req.url)
    assert.is_table(req.settings)
    assert.is_boolean(req.idempotent)
    assert.is_string(req.purpose)
    assert.are.equal(T.user, req.headers["X-ClickHouse-User"])
    assert.are.equal(tostring(#req.body), req.headers["Content-Length"])
    -- credentials travel in headers, never in the URL
    for _, r in ipairs(log) do
      if T.password ~= "" then assert.is_nil(r.url:find(T.password, 1, true)) end
    end
    s:close()
  end)

  it("turns ClickHouse exceptions from the transport into errors", function()
    local s = T.open(SCHEMA, {transport = T.luasocket_transport(), password = "not-the-password"})
    local err = T.error_of(s.get, s, "dev:x")
    assert.is_true(chstate.is_error(err))
    assert.is_nil(tostring(err):find("not-the-password", 1, true))
    s:close()
  end)

  it("reports a transport that fails or raises, and retries only idempotent requests", function()
    local calls = 0
    local s = T.open(SCHEMA, {transport = function() calls = calls + 1 return nil, "network down" end,
                              sleep = function() end})
    local err = T.error_of(s.get, s, "dev:x")
    assert.are.equal("UNAVAILABLE", err.code)
    assert.matches("network down", tostring(err))
    assert.are.equal(3, calls)  -- the read was tried three times
    s:close()

    local raising = T.open(SCHEMA, {transport = function() error("bug in the transport") end, sleep = function() end})
    err = T.error_of(raising.get, raising, "dev:x")
    assert.matches("the transport function raised an error: .*bug in the transport", tostring(err))
    raising:close()

    local real = T.luasocket_transport()
    local flaky_calls, fail_next = 0, true
    local flaky = T.open(SCHEMA, {sleep = function() end, transport = function(req)
      flaky_calls = flaky_calls + 1
      if fail_next then
        fail_next = false
        return nil, "connection reset", false
      end
      return real(req)
    end})
    flaky:set("dev:flaky", {singer_state = {v = 1}})
    fail_next = true
    assert.are.same({singer_state = {v = 1}}, (flaky:get("dev:flaky")))  -- recovered by a retry
    flaky:close()

    -- a non-idempotent request (the write) is not retried when its outcome is unknown
    local writes = 0
    local once = T.open(SCHEMA, {transport = function(req)
      if req.purpose:match("insert") then
        writes = writes + 1
        return nil, "reset after sending", true
      end
      return real(req)
    end})
    err = T.error_of(once.with_lock, once, "dev:once", function() once:set("dev:once", {singer_state = {v = 2}}) end)
    assert.are.equal(1, writes)
    assert.matches("reset after sending", tostring(err))
    once:close()
  end)

  it("may yield to an event loop while a request is in flight", function()
    local real = T.luasocket_transport()
    local yields = 0
    local s = T.open(SCHEMA, {transport = function(req)
      coroutine.yield("request " .. req.purpose)  -- an event loop would wait for the socket here
      return real(req)
    end})
    local co = coroutine.create(function()
      s:set("dev:yield", {singer_state = {v = 3}})
      return (s:get("dev:yield")).singer_state.v
    end)
    local ok, value = coroutine.resume(co)
    while coroutine.status(co) == "suspended" do
      assert.matches("^request ", value)
      yields = yields + 1
      -- the store runs one operation at a time: a second caller is told so
      local err = T.error_of(s.get, s, "dev:yield")
      assert.matches("already running an operation", tostring(err))
      ok, value = coroutine.resume(co)
      assert.is_true(ok, tostring(value))
    end
    assert.are.equal(3, value)
    assert.is_true(yields >= 3)
    s:close()
  end)

  it("checks what the transport returns", function()
    local s = T.open(SCHEMA, {transport = function() return "200", {}, "x" end, sleep = function() end})
    assert.matches("status that is not an integer",
                   tostring(T.error_of(s.ping, s)))
    s:close()
  end)
end)
