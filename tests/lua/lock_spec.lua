-- with_lock against a real ClickHouse 18.16: results and errors of the
-- function, the lock while a coroutine is suspended, an event loop driving
-- two stores, two processes contending, and the lease.
local T = require "support"
local chstate = T.chstate

local SCHEMA = "lua_lock_spec"

local function try_lock(id)
  -- Another store (another holder) that tries once.
  local other = T.open(SCHEMA, {lock_wait_seconds = 0})
  local ok, err = pcall(other.with_lock, other, id, function() return "got it" end)
  other:close()
  return ok, err
end

describe("with_lock", function()
  local store

  before_each(function()
    store = T.open(SCHEMA)
    store:clear_all()
  end)

  after_each(function()
    store:close()
  end)

  it("returns what the function returns and passes its arguments", function()
    local a, b, c = store:with_lock("dev:l", function(x, y) return x + y, nil, "third" end, 40, 2)
    assert.are.equal(42, a)
    assert.is_nil(b)
    assert.are.equal("third", c)
  end)

  it("holds the lock while the function runs, and releases it after", function()
    store:with_lock("dev:l", function()
      local ok, err = try_lock("dev:l")
      assert.is_false(ok)
      assert.are.equal("ABORTED", err.code)
      -- writes by other stores wait for the lock too
      local other = T.open(SCHEMA, {lock_wait_seconds = 0})
      assert.are.equal("ABORTED", T.error_of(other.set, other, "dev:l", {singer_state = {x = 1}}).code)
      other:close()
    end)
    assert.is_true((try_lock("dev:l")))
  end)

  it("releases the lock when the function raises, and re-raises the same error", function()
    local thrown = setmetatable({}, {__tostring = function() return "custom error" end})
    local ok, err = pcall(store.with_lock, store, "dev:l", function() error(thrown) end)
    assert.is_false(ok)
    assert.are.equal(thrown, err)  -- the very same value
    ok, err = pcall(store.with_lock, store, "dev:l", function() error("plain", 0) end)
    assert.are.equal("plain", err)
    assert.is_true((try_lock("dev:l")))
    -- the store still works after
    assert.is_table(store:set("dev:l", {singer_state = {after = true}}))
  end)

  it("uses the held lock for writes inside the function (no self-deadlock)", function()
    local merged = store:with_lock("dev:w", function()
      store:set("dev:w", {singer_state = {a = 1}})
      store:merge("dev:w", {singer_state = {b = 2}})
      local m = store:get("dev:w")
      store:delete("dev:other")
      return m
    end)
    assert.are.same({singer_state = {a = 1, b = 2}}, merged)
    local _, whole = store:get("dev:w")
    assert.are.same({singer_state = {a = 1}}, whole.completed)
    assert.are.same({singer_state = {b = 2}}, whole.partial)
    store:with_lock("dev:w", function() store:delete("dev:w") end)
    assert.is_nil(store:get("dev:w"))
  end)

  it("does not nest on one id, but does on different ids", function()
    local err = T.error_of(store.with_lock, store, "dev:n", function()
      store:with_lock("dev:n", function() end)
    end)
    assert.are.equal("FAILED_PRECONDITION", err.code)
    assert.matches("do not nest", tostring(err))
    assert.is_true((try_lock("dev:n")))  -- the outer lock was released too
    local r = store:with_lock("dev:n1", function()
      return store:with_lock("dev:n2", function() return "both" end)
    end)
    assert.are.equal("both", r)
  end)

  it("keeps the lock while its coroutine is suspended", function()
    local co = coroutine.create(function()
      return store:with_lock("dev:co", function()
        local got = coroutine.yield("holding")
        store:merge("dev:co", {singer_state = {resumed_with = got}})
        return "finished"
      end)
    end)
    local ok, what = coroutine.resume(co)
    assert.is_true(ok)
    assert.are.equal("holding", what)
    assert.are.equal("suspended", coroutine.status(co))
    -- the lock is held across the yield: nobody else gets it
    local got, err = try_lock("dev:co")
    assert.is_false(got)
    assert.are.equal("ABORTED", err.code)
    -- the suspended holder's store serves other calls meanwhile
    assert.is_table(store:set("dev:unrelated", {singer_state = {x = 1}}))
    local ok2, result = coroutine.resume(co, "value")
    assert.is_true(ok2, tostring(result))
    assert.are.equal("finished", result)
    assert.are.equal("dead", coroutine.status(co))
    assert.are.equal("value", store:get("dev:co").singer_state.resumed_with)
    assert.is_true((try_lock("dev:co")))
  end)

  it("releases the lock when a resumed coroutine raises inside it", function()
    local co = coroutine.wrap(function()
      store:with_lock("dev:co2", function()
        coroutine.yield()
        error("failed after the yield", 0)
      end)
    end)
    co()
    assert.is_false((try_lock("dev:co2")))
    local ok, err = pcall(co)
    assert.is_false(ok)
    assert.are.equal("failed after the yield", err)
    assert.is_true((try_lock("dev:co2")))
  end)

  it("lets an event loop run the holder while a contender waits (sleep hook yields)", function()
    -- A tiny scheduler: coroutines yield a wake-up time; the loop resumes
    -- the earliest. chstate's sleep hook yields instead of blocking. No step
    -- waits for a guessed time: b starts once a recorded that it holds the
    -- lock, and a leaves once b's lock attempt has waited (yielded) 3 times.
    local tasks, order = {}, {}
    local function loop_sleep(seconds) coroutine.yield(T.gettime() + seconds) end
    local function spawn(name, fn) tasks[#tasks + 1] = {name = name, co = coroutine.create(fn), wake = 0} end
    local hooks = {sleep = loop_sleep, now = T.gettime, lock_retry_seconds = 0.05, lock_wait_seconds = 20}
    local b_waits = 0  -- times b's store called its sleep hook: its retries while a held the lock
    local a = T.open(SCHEMA, hooks)
    local b = T.open(SCHEMA, {sleep = function(s) b_waits = b_waits + 1 loop_sleep(s) end, now = T.gettime,
                              lock_retry_seconds = 0.05, lock_wait_seconds = 20})
    spawn("a", function()
      a:with_lock("dev:loop", function()
        order[#order + 1] = "a in"
        -- Event: b tried and is waiting. The deadline only bounds a broken
        -- build (b never waits); the order assertion below then fails.
        local deadline = T.gettime() + 10
        while b_waits < 3 and T.gettime() < deadline do loop_sleep(0.01) end
        order[#order + 1] = "a out"
      end)
    end)
    spawn("b", function()
      -- Event: a holds the lock (the two tasks start in either order).
      local deadline = T.gettime() + 10
      while order[1] ~= "a in" and T.gettime() < deadline do loop_sleep(0.01) end
      order[#order + 1] = "b tries"
      b:with_lock("dev:loop", function() order[#order + 1] = "b in" end)
      order[#order + 1] = "b done"
    end)
    while #tasks > 0 do
      table.sort(tasks, function(x, y) return x.wake < y.wake end)
      local t = table.remove(tasks, 1)
      local delay = t.wake - T.gettime()
      if delay > 0 then T.sleep(delay) end  -- the loop idles until the earliest wake-up
      local ok, wake = coroutine.resume(t.co)
      assert.is_true(ok, tostring(wake))
      if coroutine.status(t.co) ~= "dead" then
        t.wake = wake
        tasks[#tasks + 1] = t
      end
    end
    -- b tried while a held the lock, waited by yielding to the loop (so a
    -- could run, finish and release meanwhile), and got in only after a left
    assert.are.same({"a in", "b tries", "a out", "b in", "b done"}, order)
    assert.is_true(b_waits >= 3, "b waited " .. b_waits .. " times")
    a:close()
    b:close()
  end)

  it("excludes two Lua processes contending for one lock (no overlap, no lost update)", function()
    local log = os.tmpname()
    local iterations = 15
    local worker = "tests/lua/lock_worker.lua"
    local lua = T.interpreter
    local cmd = ("%s %s %s dev:contended %d %s A & %s %s %s dev:contended %d %s B & wait"):format(
      lua, worker, SCHEMA, iterations, log, lua, worker, SCHEMA, iterations, log)
    assert.is_true(os.execute(cmd) ~= nil)
    local lines = {}
    for line in io.lines(log) do lines[#lines + 1] = line end
    os.remove(log)
    local done, holder, enters = {}, nil, {A = 0, B = 0}
    for i, line in ipairs(lines) do
      local what, tag = line:match("^(%a+) (%a)$")
      assert.is_not_nil(what, "unexpected log line " .. line)
      if what == "enter" then
        assert.is_nil(holder, ("line %d: %s entered while %s held the lock"):format(i, tag, tostring(holder)))
        holder = tag
        enters[tag] = enters[tag] + 1
      elseif what == "leave" then
        assert.are.equal(holder, tag, ("line %d: %s left a lock it did not hold"):format(i, tag))
        holder = nil
      else
        done[tag] = true
      end
    end
    assert.is_true(done.A and done.B, "a worker did not finish: " .. table.concat(lines, " | "))
    assert.are.same({A = iterations, B = iterations}, enters)
    -- both interleaved (they really contended) ...
    local switches = 0
    for i = 3, #lines do
      if lines[i]:match("^enter") and lines[i]:sub(-1) ~= lines[i - 2]:sub(-1) then switches = switches + 1 end
    end
    assert.is_true(switches > 0, "the two workers never alternated")
    -- ... and every increment landed
    assert.are.equal(2 * iterations, store:get("dev:contended").singer_state.count)
  end)

  it("says where renewal comes from", function()
    -- The module's own transport renews from a thread in Lua 5.4; LuaJIT
    -- outside nginx, and any transport function, renew only in store calls.
    assert.are.equal(not jit, store:renews_in_background())
    local own = T.open(SCHEMA, {transport = T.luasocket_transport()})
    assert.is_false(own:renews_in_background())
    own:close()
  end)

  it("renews the lease while the function uses the store (a transport function: only calls renew)", function()
    local s = T.open(SCHEMA, {lock_timeout_seconds = 3, transport = T.luasocket_transport()})
    assert.is_false(s:renews_in_background())
    s:with_lock("dev:lease", function()
      local started = T.gettime()
      -- Time must pass (by design): longer than the 3 s validity, so that
      -- only the renewals done by these calls keep the lock from going stale.
      while T.gettime() - started < 4.5 do
        s:get("dev:lease")
        T.sleep(0.5)
      end
      -- still exclusive: a contender with the same validity cannot take over
      local other = T.open(SCHEMA, {lock_wait_seconds = 0, lock_timeout_seconds = 3})
      assert.are.equal("ABORTED", T.error_of(other.with_lock, other, "dev:lease", print).code)
      other:close()
      s:set("dev:lease", {singer_state = {kept = true}})
    end)
    assert.is_true(store:get("dev:lease").singer_state.kept)
    s:close()
  end)

  it("refuses writes once the lease expired unrenewed, and says so (a transport function)", function()
    -- Each T.sleep(2.2) below is time that must pass (by design): the lease
    -- (2 s minus the margin) runs out without the store being touched, and
    -- with a transport function nothing renews it meanwhile.
    local s = T.open(SCHEMA, {lock_timeout_seconds = 2, transport = T.luasocket_transport()})
    local err = T.error_of(s.with_lock, s, "dev:expired", function()
      T.sleep(2.2)
      s:set("dev:expired", {singer_state = {late = true}})
    end)
    assert.is_true(chstate.is_error(err))
    assert.are.equal("set", err.op)
    assert.are.equal("ABORTED", err.code)
    assert.matches("the lock on state id \"dev:expired\" ", tostring(err))
    assert.is_nil(store:get("dev:expired"))  -- nothing was written
    -- a function that returns after its lease ran out gets an error too: what
    -- it did was not necessarily exclusive
    err = T.error_of(s.with_lock, s, "dev:expired", function() T.sleep(2.2) return "done" end)
    assert.are.equal("with_lock", err.op)
    assert.are.equal("ABORTED", err.code)
    assert.matches("lease", tostring(err))
    -- a function that still reads after its lease ran out may (reads take no
    -- lock), but its scope ends ABORTED all the same
    err = T.error_of(s.with_lock, s, "dev:expired", function()
      T.sleep(2.2)
      assert.is_nil(s:get("dev:expired"))
      return "carried on"
    end)
    assert.are.equal("ABORTED", err.code)
    assert.matches("lease", tostring(err))
    s:close()
  end)

  -- A function that sleeps three times the validity (1 s) without touching the
  -- store, while the chstate CLI in another process tries for 2.5 s to merge
  -- into the id. Renewed in the background (Lua 5.4's own transport: a
  -- thread), the contender never gets the lock; renewed only by store calls
  -- (a transport function, LuaJIT outside nginx), the lock goes stale, the
  -- contender takes it, and the scope ends ABORTED naming the lease.
  for _, case in ipairs{
    {name = "the module's own transport", extra = {}, background = not jit},
    {name = "a transport function", extra = {transport = T.luasocket_transport()}, background = false},
  } do
    it(("keeps or loses a lock held 3x its validity without calls: %s"):format(case.name), function()
      local id = "dev:sleeper"
      local opts = {lock_timeout_seconds = 1}
      for k, v in pairs(case.extra) do opts[k] = v end
      local s = T.open(SCHEMA, opts)
      assert.are.equal(case.background, s:renews_in_background())
      local contender
      local ok, err = pcall(s.with_lock, s, id, function()
        s:set(id, {singer_state = {holder = "start"}})
        -- the contender's validity is the holder's; it waits 2.5 s, well inside the 3 s sleep
        contender = T.contend(SCHEMA, id, "--stale-lock 1 --lock-timeout 2.5 --lock-retry 0.1")
        T.sleep(3)  -- by design: 3x the validity, no store call
        return "slept"
      end)
      local code, out = contender()
      local final = store:get(id).singer_state
      if case.background then
        assert.is_true(ok, tostring(err))
        assert.are.equal("slept", err)
        assert.are.equal(4, code, "the contender got the lock of a live holder: " .. out)
        assert.is_nil(final.contender)
      else
        assert.is_false(ok)
        assert.is_true(chstate.is_error(err), tostring(err))
        assert.are.equal("ABORTED", err.code)
        assert.are.equal("with_lock", err.op)
        assert.matches("lease", err.message)
        assert.are.equal(0, code, "the contender did not get a lock left to go stale: " .. out)
        assert.are.equal(1, final.contender)
      end
      s:close()
    end)
  end

  it("renews on request with store:renew, and only for a held lock", function()
    assert.are.equal("FAILED_PRECONDITION", T.error_of(store.renew, store, "dev:r").code)
    store:with_lock("dev:r", function()
      local lock_id = store:renew("dev:r")
      assert.is_string(lock_id)
      assert.is_true(#lock_id > 0)
      assert.are.equal(lock_id, (store:renew("dev:r")))  -- the same lock, renewed
    end)
    -- and no longer once the scope ended
    assert.are.equal("FAILED_PRECONDITION", T.error_of(store.renew, store, "dev:r").code)
  end)

  it("releases held locks on close", function()
    local s = T.open(SCHEMA)
    local co = coroutine.wrap(function() s:with_lock("dev:closed", function() coroutine.yield() end) end)
    co()
    assert.is_false((try_lock("dev:closed")))
    s:close()
    assert.is_true((try_lock("dev:closed")))
  end)
end)
