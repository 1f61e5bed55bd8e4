-- What a store tells beside its results (docs/diagnostics.md), through the
-- on_event option, against a real ClickHouse 18.16: a wait for a lock another
-- store holds at info, each statement at debug with states as their size
-- only, the option's checks, and (Lua 5.4) what the module's renewer thread
-- told, handed over at the next call.
local T = require "support"
local chstate = T.chstate

local SCHEMA = "lua_events_spec"

local function kinds(events)
  local out = {}
  for _, e in ipairs(events) do out[#out + 1] = e.kind end
  return table.concat(out, " ")
end

describe("on_event", function()
  local store

  before_each(function()
    store = T.open(SCHEMA)
    store:clear_all()
  end)

  after_each(function()
    store:close()
  end)

  it("tells a wait for a lock another store holds, at info, with the holder", function()
    local told = {}
    local waiter = T.open(SCHEMA, {lock_wait_seconds = 0.5, lock_retry_seconds = 0.1,
                                   on_event = function(e) told[#told + 1] = e end})
    store:with_lock("dev:told", function()
      assert.are.equal("ABORTED", T.error_of(waiter.set, waiter, "dev:told", {singer_state = {x = 1}}).code)
    end)
    waiter:close()
    local waiting
    for _, e in ipairs(told) do
      if e.kind == "lock_waiting" then waiting = waiting or e end
      assert.are_not.equal("statement", e.kind)  -- info by default: no statements
    end
    assert.is_table(waiting, "no lock_waiting event: " .. kinds(told))
    assert.are.equal("info", waiting.level)
    assert.are.equal("dev:told", waiting.state_id)
    assert.is_truthy(waiting.line:find('waiting for the lock on "dev:told": another process (lock ', 1, true),
                     waiting.line)
    assert.is_string(waiting.texts.holder)
    assert.is_number(waiting.numbers.next_try_ms)
    assert.is_number(waiting.at_ms)
  end)

  it("tells each statement at debug, states shown as their size unless show_states", function()
    local told = {}
    local s = T.open(SCHEMA, {diagnostics = "debug", on_event = function(e) told[#told + 1] = e end})
    s:set("dev:stmt", {singer_state = {bookmark = "bm-lua-77"}})
    s:close()
    local insert
    for _, e in ipairs(told) do
      if e.kind == "statement" and e.texts.purpose == "insert_state" then insert = e end
      assert.is_falsy(e.line:find("bm-lua-77", 1, true), e.line)
    end
    assert.is_table(insert, "no insert_state statement: " .. kinds(told))
    assert.are.equal("debug", insert.level)
    assert.is_truthy(insert.line:find("ok in %d+ ms: INSERT INTO .*'<state: %d+ bytes>'"), insert.line)
    assert.is_number(insert.numbers.took_ms)
    -- On purpose: the contents are shown.
    local shown = {}
    s = T.open(SCHEMA, {diagnostics = "debug", show_states = true, on_event = function(e) shown[#shown + 1] = e.line end})
    s:set("dev:stmt", {singer_state = {bookmark = "bm-lua-77"}})
    s:close()
    assert.is_truthy(table.concat(shown, "\n"):find("bm-lua-77", 1, true))
  end)

  it("checks the options, and an on_event that raises does not stop the operation", function()
    local err = T.error_of(T.open, SCHEMA, {diagnostics = "loud", on_event = print})
    assert.are.equal("INVALID_ARGUMENT", err.code)
    assert.is_truthy(err.message:find("diagnostics", 1, true))
    err = T.error_of(T.open, SCHEMA, {on_event = "print"})
    assert.is_truthy(err.message:find("on_event", 1, true))
    local calls = 0
    local s = T.open(SCHEMA, {diagnostics = "debug", on_event = function() calls = calls + 1; error("boom") end})
    assert.is_table(s:set("dev:raises", {singer_state = {x = 1}}))
    s:close()
    assert.is_true(calls > 0)
    assert.are.equal(1, store:get("dev:raises").singer_state.x)
  end)

  it("hands over what the renewer thread told at the next call #lua54", function()
    local told = {}
    local s = T.open(SCHEMA, {lock_timeout_seconds = 1, diagnostics = "debug",
                              on_event = function(e) told[#told + 1] = e end})
    assert.is_true(s:renews_in_background())
    s:with_lock("dev:renewed", function()
      local before = #told
      -- Time that must pass (by design): past a renewal (a third of the 1 s
      -- validity) with no call on the store, so only the thread renews.
      T.sleep(1.2)
      assert.are.equal(before, #told)  -- nothing from the thread reaches Lua while Lua runs
      s:get("dev:renewed")
    end)
    s:close()
    local renewed = 0
    for _, e in ipairs(told) do
      if e.kind == "lease_renewed" then renewed = renewed + 1 end
    end
    assert.is_true(renewed >= 1, "no lease_renewed event: " .. kinds(told))
  end)
end)
