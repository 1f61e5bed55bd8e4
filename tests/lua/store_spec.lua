-- The store API against a real ClickHouse 18.16: every call, the argument
-- errors, a closed store, configuration and secrets, and chstate.safe.
-- States are Meltano's ({singer_state = ...}): the core refuses others
-- unless forced (a spec below checks both).
local T = require "support"
local chstate = T.chstate

local SCHEMA = "lua_store_spec"

describe("a store", function()
  local store

  before_each(function()
    store = T.open(SCHEMA)
    store:clear_all()
  end)

  after_each(function()
    store:close()
  end)

  it("pings the server and names the dialect", function()
    local version, dialect = store:ping()
    assert.are.equal(T.dialect_of(version), dialect)
    -- init and compact answer as ping does (the verb table's "server")
    assert.are.same({version, dialect}, {store:init()})
    assert.are.same({version, dialect}, {store:compact()})
  end)

  it("gets nil for an absent id", function()
    assert.is_nil(store:get("dev:absent"))
    assert.are.equal(0, select("#", store:get("dev:absent")) - 1)
  end)

  it("sets and gets a complete state: merged view and whole state", function()
    -- set returns what it wrote, as get would read it
    local written, written_whole = store:set("dev:a", {singer_state = {bookmarks = {issues = {since = "2026-11-01"}}}})
    assert.are.same({singer_state = {bookmarks = {issues = {since = "2026-11-01"}}}}, written)
    assert.are.same({completed = written, partial = {}}, written_whole)
    local merged, whole = store:get("dev:a")
    assert.are.same({singer_state = {bookmarks = {issues = {since = "2026-11-01"}}}}, merged)
    assert.are.same({}, whole.partial)
    assert.are.same(merged, whole.completed)
  end)

  it("merges partial states as Meltano's update() does", function()
    store:set("dev:m", {singer_state = {bookmarks = {issues = {since = "1"}}, list = {1, 2}}})
    local merged, whole = store:merge("dev:m", {singer_state = {bookmarks = {pulls = {since = "2"}}, list = {3}}})
    -- objects merge recursively, lists replace; the completed side is kept
    assert.are.same({singer_state = {bookmarks = {issues = {since = "1"}, pulls = {since = "2"}}, list = {3}}}, merged)
    assert.are.same({singer_state = {bookmarks = {issues = {since = "1"}}, list = {1, 2}}}, whole.completed)
    assert.are.same({singer_state = {bookmarks = {pulls = {since = "2"}}, list = {3}}}, whole.partial)
    local again = store:merge("dev:m", {singer_state = {bookmarks = {pulls = {since = "3"}}}})
    assert.are.equal("3", again.singer_state.bookmarks.pulls.since)
    assert.are.same(again, (store:get("dev:m")))
    -- merging into an absent id creates it
    assert.are.same({singer_state = {x = 1}}, (store:merge("dev:new", {singer_state = {x = 1}})))
  end)

  it("writes both sides with set's partial option, and merges another id's state with from", function()
    local merged, whole = store:set("dev:both", {singer_state = {a = 1, b = 1}}, {partial = {singer_state = {b = 2}}})
    assert.are.same({singer_state = {a = 1, b = 2}}, merged)
    assert.are.same({completed = {singer_state = {a = 1, b = 1}}, partial = {singer_state = {b = 2}}}, whole)
    assert.are.same(merged, (store:get("dev:both")))
    -- merge {from = id}: the merged view of that id, merged in as a partial state
    store:set("dev:into", {singer_state = {a = 0, c = 3}})
    local into = store:merge("dev:into", nil, {from = "dev:both"})
    assert.are.same({singer_state = {a = 1, b = 2, c = 3}}, into)
    assert.are.same({singer_state = {a = 1, b = 2}}, (store:get("dev:both")))  -- the source is unchanged
  end)

  it("refuses a state without singer_state unless forced (meltano state set refuses it too)", function()
    for _, call in ipairs{
      function() return store:set("dev:plain", {v = 1}) end,
      function() return store:merge("dev:plain", {v = 1}) end,
    } do
      local err = T.error_of(call)
      assert.are.equal("INVALID_ARGUMENT", err.code)
      assert.matches("no top%-level \"singer_state\" key", err.message)
      assert.matches("pass force", err.message)
    end
    assert.is_nil(store:get("dev:plain"))  -- nothing was written
    assert.are.same({v = 1}, (store:set("dev:plain", {v = 1}, {force = true})))
    assert.are.same({v = 1, w = 2}, (store:merge("dev:plain", {w = 2}, {force = true})))
    assert.are.same({v = 1, w = 2}, (store:get("dev:plain")))
  end)

  it("lists ids, sorted, with Meltano's glob", function()
    for _, id in ipairs{"dev:b", "dev:a", "prod:a", "dev:a%_x"} do store:set(id, {singer_state = {v = id}}) end
    assert.are.same({"dev:a", "dev:a%_x", "dev:b", "prod:a"}, store:list())
    assert.are.same({"dev:a", "dev:a%_x", "dev:b"}, store:list("dev:*"))
    assert.are.same({"dev:a", "dev:b"}, store:list("dev:?"))
    assert.are.same({"dev:a%_x"}, store:list("dev:a%_*"))
    assert.are.same({}, store:list("nothing*"))
    assert.is_true(chstate.is_array(store:list("nothing*")))
  end)

  it("deletes one id and clears all", function()
    store:set("dev:a", {singer_state = {v = 1}})
    store:set("dev:b", {singer_state = {v = 2}})
    assert.is_true(store:delete("dev:a"))
    assert.is_nil(store:get("dev:a"))
    assert.is_true(store:delete("dev:a"))  -- absent: fine
    assert.are.same({"dev:b"}, store:list())
    assert.are.equal(1, store:clear_all())
    assert.are.same({}, store:list())
  end)

  it("round-trips the JSON rules through the server #lua54", function()
    local state = {singer_state = {
      empty_map = {}, empty_list = chstate.array(), ints = {1, 2, 3}, float = 2.0, half = 0.5,
      null = chstate.null, flag = false, text = "gr\xc3\xbc\xc3\x9f\n\t\"q\" \\ \0 end",
      nested = {{}, chstate.array{chstate.array()}}, big = math.maxinteger,
    }}
    store:set("dev:json", state)
    local back = store:get("dev:json")
    assert.are.equal(chstate.to_json(state), chstate.to_json(back))
    assert.are.equal("float", math.type(back.singer_state.float))
    assert.are.equal("integer", math.type(back.singer_state.ints[1]))
    assert.is_true(chstate.is_array(back.singer_state.empty_list))
    assert.are.equal(chstate.null, back.singer_state.null)
  end)

  it("round-trips a large state", function()
    local big = {singer_state = {bookmarks = {}}}
    for i = 1, 5000 do
      big.singer_state.bookmarks["stream_" .. i] = {since = ("2026-11-%02dT00:00:00Z"):format(i % 28 + 1), n = i}
    end
    big.singer_state.blob = string.rep("x", 512 * 1024)
    store:set("dev:big", big)
    local back = store:get("dev:big")
    assert.are.equal(chstate.to_json(big), chstate.to_json(back))
  end)

  it("keeps hostile ids byte for byte", function()
    local ids = {"a'b", "x\\y", "new\nline", "nul\0byte", "\xff\xfe", "%_*?", "'; DROP TABLE state; --"}
    for i, id in ipairs(ids) do store:set(id, {singer_state = {i = i}}) end
    for i, id in ipairs(ids) do assert.are.equal(i, store:get(id).singer_state.i) end
    local listed = store:list()
    table.sort(ids)
    assert.are.same(ids, listed)
  end)

  it("gives clear argument errors, naming the caller's line", function()
    local function message(fn, ...) return tostring(T.error_of(fn, ...)) end
    -- The verbs' checks are the core's (its message), raised as argument errors
    -- at the caller's line; what Lua cannot send (a number as an id, NaN) the
    -- binding names by argument number.
    assert.matches("store_spec%.lua:%d+: chstate%.get: get needs state_id",
                   message(function() local _ = store:get() end))  -- not a tail call: its line is the position
    assert.matches("store_spec%.lua:%d+: chstate%.get: state_id: the state id is empty",
                   message(function() local _ = store:get("") end))
    assert.matches("store_spec%.lua:%d+: chstate%.set: bad argument #1 to 'set' %(state_id expected: a string, got number%)",
                   message(function() local _ = store:set(42, {singer_state = {}}) end))
    assert.matches("set: state must be a JSON object", message(function() return store:set("a", "{}") end))
    assert.matches("bad argument #2 to 'set' %(state%.x is NaN", message(function() return store:set("a", {x = 0 / 0}) end))
    assert.matches("bad argument #3 to 'set' %(partial%.f is a function",
                   message(function() return store:set("a", {singer_state = {}}, {partial = {f = print}}) end))
    assert.matches("set: state must be a JSON object", message(function() return store:set("a", {1, 2}) end))
    assert.matches("nothing to merge", message(function() return store:merge("a", {}) end))
    assert.matches("merge takes the input either as partial .- or as from", message(function() return store:merge("a") end))
    assert.matches("pattern expected: a string or nil, got number", message(function() return store:list(5) end))
    assert.matches("function expected, got nil", message(function() return store:with_lock("a") end))
    assert.matches("with a colon", message(function() return store.get("a") end))
    -- options tables: only the verb's named arguments, of their types
    assert.matches("bad argument #3 to 'set' %(unknown option 'forse' %(options: force, partial%)%)",
                   message(function() return store:set("a", {singer_state = {}}, {forse = true}) end))
    assert.matches("bad argument #3 to 'set' %(table of options expected, got boolean%)",
                   message(function() return store:set("a", {singer_state = {}}, true) end))
    assert.matches("set: force must be true or false", message(function() return store:set("a", {}, {force = "yes"}) end))
    assert.matches("bad argument #4 to 'set' %(set takes 2 arguments and a table of options%)",
                   message(function() return store:set("a", {singer_state = {}}, {}, {}) end))
    assert.matches("history: limit must be a positive whole number",
                   message(function() return store:history("a", {limit = 0}) end))
    assert.matches("bad argument #2 to 'export' %(unknown option 'pattern' %(options: after, document, limit%)%)",
                   message(function() return store:export(nil, {pattern = "x"}) end))
    local err = T.error_of(function() return store:get() end)
    assert.are.equal("INVALID_ARGUMENT", err.code)
    assert.are.equal("get", err.op)
    assert.is_true(chstate.is_error(err))
    -- nothing was written by the failed calls
    assert.are.same({}, store:list())
  end)

  it("refuses every call once closed", function()
    assert.is_false(store:is_closed())
    assert.is_true(store:close())
    assert.is_true(store:close())  -- idempotent
    assert.is_true(store:is_closed())
    for _, call in ipairs{
      function() return store:get("a") end, function() return store:set("a", {}) end,
      function() return store:merge("a", {x = 1}) end, function() return store:list() end,
      function() return store:delete("a") end, function() return store:clear_all() end,
      function() return store:with_lock("a", print) end, function() return store:ping() end,
    } do
      local err = T.error_of(call)
      assert.are.equal("FAILED_PRECONDITION", err.code)
      assert.matches("the store is closed", tostring(err))
    end
    -- every method made from the verb table, whatever its arguments
    for _, verb in ipairs(chstate.verbs) do
      if store[verb] then
        local err = T.error_of(store[verb], store, "a", "b")
        assert.are.equal("FAILED_PRECONDITION", err.code, verb)
        assert.are.equal(verb, err.op)
      end
    end
    assert.matches("closed", tostring(store))
    store = T.open(SCHEMA)  -- for after_each
  end)

end)

describe("configuration", function()
  it("uses the core's precedence: options beat the environment", function()
    local s = chstate.open{env = {
      MELTANO_STATE_BACKEND_URI = ("clickhouse://%s@%s:%s/default?schema=lua_env_uri"):format(T.user, T.host, T.port),
      MELTANO_STATE_BACKEND_CLICKHOUSE_PASSWORD = T.password,
      CLICKHOUSE_HOST = "unused.invalid",
    }}
    assert.matches("schema=lua_env_uri", tostring(s))
    assert.matches(T.host, tostring(s))
    assert.matches("^%d+%.%d+%.", (s:ping()))
    s:close()
    local over = chstate.open{schema = "lua_flag_schema", env = {
      MELTANO_STATE_BACKEND_URI = ("clickhouse://%s@%s:%s/default?schema=lua_env_uri"):format(T.user, T.host, T.port),
      MELTANO_STATE_BACKEND_CLICKHOUSE_PASSWORD = T.password,
    }}
    assert.matches("schema=lua_flag_schema", tostring(over))
    over:close()
  end)

  it("reads CLICKHOUSE_SCHEMA and CLICKHOUSE_TABLE below everything else", function()
    local env = {
      MELTANO_STATE_BACKEND_URI = ("clickhouse://%s@%s:%s/default"):format(T.user, T.host, T.port),
      MELTANO_STATE_BACKEND_CLICKHOUSE_PASSWORD = T.password,
      CLICKHOUSE_SCHEMA = "lua_generic_schema",
      CLICKHOUSE_TABLE = "lua_generic_table",
    }
    local s = chstate.open{env = env}
    assert.matches("schema=lua_generic_schema", tostring(s))
    assert.matches("table=lua_generic_table", tostring(s))
    s:close()
    local over = chstate.open{table = "lua_flag_table", env = env}
    assert.matches("table=lua_flag_table", tostring(over))
    assert.matches("schema=lua_generic_schema", tostring(over))
    over:close()
  end)

  it("takes a URI with the password in it and never shows the password", function()
    local uri = ("clickhouse://%s:%s@%s:%s/default?schema=lua_uri"):format(T.user, T.password, T.host, T.port)
    local s = chstate.open{uri = uri, env = false}
    assert.matches("^%d+%.%d+%.", (s:ping()))
    assert.is_nil(tostring(s):find(T.password, 1, true))
    assert.matches(":%*%*%*@", tostring(s))
    s:close()
  end)

  it("accepts the core's cluster settings", function()
    local s = T.open(SCHEMA, {cluster = "chstate", replica = "r1"})
    assert.matches("cluster=chstate", tostring(s))
    s:close()
    assert.matches("cluster", tostring(T.error_of(chstate.open, T.settings(SCHEMA, {cluster = "no spaces"}))))
  end)

  it("reads the lock settings from Meltano's environment variables", function()
    local err = T.error_of(chstate.open, T.settings(SCHEMA, {env = {MELTANO_STATE_BACKEND_LOCK_TIMEOUT_SECONDS = "soon"}}))
    assert.matches('MELTANO_STATE_BACKEND_LOCK_TIMEOUT_SECONDS is "soon", which is not a number of seconds', tostring(err))
  end)

  it("names what is missing and refuses unknown and renamed settings", function()
    local err = T.error_of(chstate.open, {host = T.host, database = "default", env = false})
    assert.matches("user is not set", tostring(err))
    assert.are.equal("INVALID_ARGUMENT", err.code)
    assert.matches("store_spec%.lua:%d+: chstate%.open: unknown setting \"hots\"; the settings are uri, host",
                   tostring(T.error_of(function() local _ = chstate.open{hots = "x", env = false} end)))
    assert.matches("values%.port must be a string, a number or a boolean",
                   tostring(T.error_of(chstate.open, {port = {}, env = false})))
    assert.matches("option 'transport' must be a function",
                   tostring(T.error_of(chstate.open, T.settings(SCHEMA, {transport = "http"}))))
    -- Durations are seconds, named *_seconds; the old names are refused naming
    -- the new one (api.md: the old names went on purpose).
    for old, new in pairs{lock_timeout = "lock_wait_seconds", stale_lock = "lock_timeout_seconds",
                          lock_retry = "lock_retry_seconds", connect_timeout = "connect_timeout_seconds",
                          timeout = "request_timeout_seconds"} do
      err = T.error_of(chstate.open, T.settings(SCHEMA, {[old] = 1}))
      assert.are.equal("INVALID_ARGUMENT", err.code)
      assert.matches(('the setting "%s" is now called "%s"'):format(old, new), err.message)
    end
    assert.matches("the lock_wait_seconds setting is \"%-1\", which is not a number of seconds",
                   tostring(T.error_of(chstate.open, T.settings(SCHEMA, {lock_wait_seconds = -1}))))
    assert.matches("the lock_timeout_seconds setting is \"0\", which is not a number of seconds from 1",
                   tostring(T.error_of(chstate.open, T.settings(SCHEMA, {lock_timeout_seconds = 0}))))
    assert.matches("the request_timeout_seconds setting is .*, which is not a number of seconds",
                   tostring(T.error_of(chstate.open, T.settings(SCHEMA, {request_timeout_seconds = 1e300}))))
    assert.matches("table of settings expected, got string", tostring(T.error_of(chstate.open, "clickhouse://x")))
  end)

  it("keeps a wrong password out of every message", function()
    local secret = "wrong-Secret-4711"
    local s = T.open(SCHEMA, {password = secret})
    local err = T.error_of(s.get, s, "dev:a")
    assert.is_nil(tostring(err):find(secret, 1, true))
    assert.is_nil(tostring(s):find(secret, 1, true))
    assert.is_not.equal("INVALID_ARGUMENT", err.code)
    s:close()
    local bad = T.error_of(chstate.open, {uri = "clickhouse://u:" .. secret .. "@h:notaport/db", env = false})
    assert.is_nil(tostring(bad):find(secret, 1, true))
  end)

  it("reports an unreachable server as UNAVAILABLE", function()
    local s = T.open(SCHEMA, {host = "127.0.0.1", port = 1, connect_timeout_seconds = 1})
    local err = T.error_of(s.ping, s)
    assert.are.equal("UNAVAILABLE", err.code)
    assert.matches("127%.0%.0%.1:1", tostring(err))
    s:close()
  end)
end)

describe("chstate.safe", function()
  local safe = chstate.safe

  it("returns nil, message, code instead of raising", function()
    local s = assert(safe.open(T.settings(SCHEMA)))
    assert.are.same({singer_state = {v = 1}}, (s:set("dev:safe", {singer_state = {v = 1}})))
    assert.are.same({singer_state = {v = 1}}, (s:get("dev:safe")))
    local v, msg, code = s:get("dev:absent")
    assert.is_nil(v)
    assert.is_nil(msg)
    v, msg, code = s:set("dev:safe", {0 / 0})
    assert.is_nil(v)
    assert.matches("bad argument #2 to 'set'", msg)
    assert.are.equal("INVALID_ARGUMENT", code)
    v, msg, code = s:get(nil)
    assert.is_nil(v)
    assert.matches("get needs state_id", msg)
    assert.are.equal("INVALID_ARGUMENT", code)
    v, msg, code = s:set("dev:safe", {v = 2})  -- the core's check
    assert.is_nil(v)
    assert.matches("singer_state", msg)
    assert.are.equal("INVALID_ARGUMENT", code)
    assert.are.same({"dev:safe"}, (s:list("dev:*")))
    assert.is_true(s:delete("dev:safe"))
    assert.is_number(s:clear_all())
    assert.is_true(s:close())
    v, msg, code = s:get("x")
    assert.is_nil(v)
    assert.matches("closed", msg)
    assert.are.equal("FAILED_PRECONDITION", code)
  end)

  it("returns nil, message from open", function()
    local s, msg, code = safe.open{hots = 1}
    assert.is_nil(s)
    assert.matches("unknown setting", msg)
    assert.are.equal("INVALID_ARGUMENT", code)
    s, msg, code = safe.open{host = T.host, env = false}
    assert.is_nil(s)
    assert.are.equal("INVALID_ARGUMENT", code)
  end)

  it("releases the lock and returns nil, message when the function raises", function()
    local s = assert(safe.open(T.settings(SCHEMA)))
    local v, msg, code = s:with_lock("dev:safe-lock", function() error("inside") end)
    assert.is_nil(v)
    assert.matches("inside", msg)
    assert.are.equal("UNKNOWN", code)
    local other = T.open(SCHEMA, {lock_wait_seconds = 0})
    assert.are.equal("free", other:with_lock("dev:safe-lock", function() return "free" end))
    assert.are.same({1, 2}, {s:with_lock("dev:safe-lock", function(a, b) return a, b end, 1, 2)})
    other:close()
    s:close()
  end)
end)
