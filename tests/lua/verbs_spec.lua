-- The store's methods are made from the core's verb table (chstate.verbs):
-- every verb has one (acquire and release are with_lock's), and the verbs
-- beyond get/set/merge work from Lua against a real ClickHouse 18.16: copy,
-- move, export pages with options, import, locks and unlock.
local T = require "support"
local chstate = T.chstate

local SCHEMA = "lua_verbs_spec"

-- The verbs api.md names: the table may grow, but none of these may go
-- missing from chstate.verbs without this spec noticing.
local KNOWN = {"get", "set", "merge", "delete", "list", "clear_all", "copy", "move", "export", "import", "history",
               "rollback", "locks", "unlock", "init", "compact", "ping", "acquire", "renew", "release"}
-- The verbs that are the lock scope's ends: with_lock, not methods.
local SCOPE = {acquire = true, release = true}

local function state(n) return {singer_state = {n = n}} end

describe("the verb table", function()
  it("lists the core's verbs in chstate.verbs", function()
    local listed = {}
    for _, name in ipairs(chstate.verbs) do
      assert.is_string(name)
      assert.is_nil(listed[name], "listed twice: " .. name)
      listed[name] = true
    end
    for _, name in ipairs(KNOWN) do assert.is_true(listed[name], "chstate.verbs lacks " .. name) end
  end)

  it("has a method for every verb (acquire and release are with_lock), raising and safe", function()
    local store = T.open(SCHEMA)
    local safe = assert(chstate.safe.open(T.settings(SCHEMA)))
    for _, name in ipairs(chstate.verbs) do
      if SCOPE[name] then
        assert.is_nil(store[name], name .. " is with_lock's, not a method")
      else
        assert.are.equal("function", type(store[name]), "no method for the verb " .. name)
        assert.are.equal("function", type(safe[name]), "no chstate.safe method for the verb " .. name)
      end
    end
    assert.are.equal("function", type(store.with_lock))
    assert.are.equal("function", type(safe.with_lock))
    store:close()
    safe:close()
  end)
end)

describe("the verbs", function()
  local store

  before_each(function()
    store = T.open(SCHEMA)
    store:clear_all()
  end)

  after_each(function()
    store:close()
  end)

  it("copy and move states between ids", function()
    store:set("dev:src", state(1), {partial = {singer_state = {p = true}}})
    assert.is_true(store:copy("dev:src", "dev:copy"))
    local merged, whole = store:get("dev:copy")
    assert.are.same({singer_state = {n = 1, p = true}}, merged)
    assert.are.same({singer_state = {p = true}}, whole.partial)  -- both sides are copied
    assert.is_true(store:move("dev:copy", "dev:moved"))
    assert.is_nil(store:get("dev:copy"))
    assert.are.same(merged, (store:get("dev:moved")))
    local err = T.error_of(store.copy, store, "dev:absent", "dev:x")
    assert.are.equal("NOT_FOUND", err.code)
    assert.is_nil(store:get("dev:x"))
    err = T.error_of(store.move, store, "dev:src", "dev:src")
    assert.are.equal("INVALID_ARGUMENT", err.code)
  end)

  it("export pages with the after and limit options", function()
    for _, id in ipairs{"dev:c", "dev:a", "dev:b", "prod:z"} do store:set(id, state(id)) end
    local page, more = store:export("dev:*", {limit = 2})
    assert.is_true(chstate.is_array(page))
    assert.are.equal(2, #page)
    assert.is_true(more)
    assert.are.equal("dev:a", page[1].state_id)
    assert.are.same(state("dev:a"), page[1].completed)
    assert.are.same({}, page[1].partial)
    assert.are.same(state("dev:a"), page[1].merged)
    local rest, more2 = store:export("dev:*", {after = page[#page].state_id, limit = 2})
    assert.are.same({"dev:c"}, {rest[1].state_id})
    assert.are.equal(1, #rest)
    assert.is_false(more2)
    local all = store:export()
    assert.are.equal(4, #all)
    assert.is_false((select(2, store:export())))
  end)

  it("import many states at once, and nothing when one entry is bad", function()
    local n = store:import{
      {state_id = "dev:i1", completed = state(1), partial = {}},
      {state_id = "dev:i2", completed = state(2), partial = {singer_state = {p = 2}}},
    }
    assert.are.equal(2, n)
    assert.are.same({singer_state = {n = 2, p = 2}}, (store:get("dev:i2")))
    -- an export imports as it is: the round trip of meltano state export/import
    local exported = store:export()
    store:clear_all()
    assert.are.equal(2, store:import(exported))
    assert.are.same({singer_state = {n = 1}}, (store:get("dev:i1")))
    local err = T.error_of(store.import, store, {
      {state_id = "dev:ok", completed = state(3), partial = {}},
      {state_id = "dev:bad", completed = state(4), partial = {}, extra = 1},
    })
    assert.are.equal("INVALID_ARGUMENT", err.code)
    assert.matches("states%[2%] has the member 'extra'", err.message)
    -- a misspelt side is refused, not dropped (which would import an empty state)
    err = T.error_of(store.import, store, {{state_id = "dev:typo", complete = state(5)}})
    assert.matches("states%[1%] has the member 'complete'; an entry has state_id, completed and partial", err.message)
    assert.is_nil(store:get("dev:typo"))
    -- the core's checks of an entry: nothing is written either
    err = T.error_of(store.import, store, {
      {state_id = "dev:ok", completed = state(3), partial = {}},
      {state_id = "dev:bad", completed = "not a state", partial = {}},
    })
    assert.are.equal("INVALID_ARGUMENT", err.code)
    assert.matches("import entry 2", err.message)
    assert.is_nil(store:get("dev:ok"))  -- one bad entry: nothing written
    assert.matches("states%[1%] expected", T.error_of(store.import, store, {{completed = {}}}).message)
  end)

  it("list the locks held now, and unlock an id whoever holds it", function()
    assert.are.same({}, store:locks("dev:*"))
    -- (locks finds the ids of lock tables among the ids with a state: on
    -- 18.16 a lock table's name is a hash of its id)
    store:set("dev:locked", state(0))
    local other = T.open(SCHEMA, {lock_wait_seconds = 0})
    local ok, err = pcall(store.with_lock, store, "dev:locked", function()
      local locks = store:locks("dev:*")
      assert.are.equal(1, #locks)
      assert.are.equal("dev:locked", locks[1].state_id)
      assert.is_false(locks[1].stale)
      assert.is_string(locks[1].holder)
      -- unlock, from another store, removes it (its holder learns at its
      -- next renewal or release)
      local removed = other:unlock("dev:locked")
      assert.are.equal(1, #removed)
      assert.are.same({}, store:locks("dev:*"))
      assert.are.equal("got it", other:with_lock("dev:locked", function() return "got it" end))
    end)
    -- the scope whose lock was removed is told it was not exclusive
    assert.is_false(ok)
    assert.are.equal("ABORTED", err.code)
    assert.are.equal("with_lock", err.op)
    other:close()
  end)

  it("unlock names an id that is not locked", function()
    local err = T.error_of(store.unlock, store, "dev:free")
    assert.are.equal("NOT_FOUND", err.code)
  end)
end)
