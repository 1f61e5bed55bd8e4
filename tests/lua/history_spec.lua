-- State history from Lua: every write is a version, store:history lists them
-- newest first, store:rollback restores one as a new version (the core's
-- history and rollback ops), the history_days option.
local T = require "support"
local chstate = T.chstate

local SCHEMA = "lua_history_spec"

-- 18.16 keeps whole seconds: a version per second keeps the order known.
local function next_second()
  local t = os.time()
  while os.time() == t do T.sleep(0.05) end
end

describe("the state history", function()
  local store

  before_each(function()
    store = T.open(SCHEMA)
    store:clear_all()
  end)

  after_each(function()
    store:close()
  end)

  it("lists every write newest first and rolls back to one", function()
    local id = "dev:hist-" .. tostring(os.time()) .. "-" .. tostring(math.random(1e9))
    store:set(id, {singer_state = {n = 1}})
    next_second()
    store:set(id, {singer_state = {n = 2}})
    local versions = store:history(id)
    assert.are.equal(2, #versions)
    assert.are.same({singer_state = {n = 2}}, versions[1].merged)
    assert.is_true(versions[1].current)
    assert.is_false(versions[2].current)
    assert.are.same({singer_state = {n = 1}}, versions[2].state.completed)
    assert.matches("^%d+%-%x%x%x%x%x%x%x%x$", versions[2].version)
    assert.matches("Z$", versions[2].updated_at)
    assert.are.equal(1, #store:history(id, {limit = 1}))
    next_second()
    local merged = store:rollback(id, versions[2].version)
    assert.are.same({singer_state = {n = 1}}, merged)
    assert.are.same({singer_state = {n = 1}}, (store:get(id)))
    local after = store:history(id)
    assert.are.equal(3, #after)
    assert.is_true(after[1].current)
    assert.are.same({singer_state = {n = 1}}, after[1].merged)
  end)

  it("names a version it does not have, and a malformed one", function()
    store:set("dev:h", {singer_state = {}})
    local ok, err = pcall(store.rollback, store, "dev:h", "1-00000000")
    assert.is_false(ok)
    assert.are.equal("NOT_FOUND", err.code)
    ok, err = pcall(store.rollback, store, "dev:h", "latest")
    assert.is_false(ok)
    assert.are.equal("INVALID_ARGUMENT", err.code)
    assert.matches("is not a version", err.message)
    assert.matches("limit must be a positive whole number", T.error_of(store.history, store, "dev:h", {limit = 0}).message)
    assert.matches("table of options expected, got number", T.error_of(store.history, store, "dev:h", 1).message)
    assert.matches("version must be a string", T.error_of(store.rollback, store, "dev:h", 7).message)
  end)

  it("creates no history with history_days = 0", function()
    local off = T.open("lua_history_off", {history_days = 0})
    off:clear_all()
    off:set("dev:x", {singer_state = {}})
    assert.are.same({}, off:history("dev:x"))
    off:close()
    assert.matches("history_days setting is \"%-1\"", T.error_of(T.open, "lua_history_off", {history_days = -1}).message)
  end)
end)
