-- The Lua binding and the chstate CLI share tables, merge rules and the lock:
-- what one writes the other reads, and each one's lock excludes the other.
-- The CLI gets its connection from the environment run.py sets
-- (MELTANO_STATE_BACKEND_URI and ..._CLICKHOUSE_PASSWORD), never from argv.
local T = require "support"
local chstate = T.chstate

local SCHEMA = "lua_interop"
local CLI = os.getenv("CHSTATE_CLI") or "bazel-bin/hosts/native/chstate"

local function cli(args)
  local p = assert(io.popen(("%s --schema %s %s 2>&1; echo \"exit=$?\""):format(CLI, SCHEMA, args)))
  local out = p:read("a")
  p:close()
  local body, code = out:match("^(.-)exit=(%d+)\n$")
  return body, tonumber(code)
end

local function quote(s) return "'" .. s:gsub("'", "'\\''") .. "'" end

describe("the Lua binding and the chstate CLI", function()
  local store

  setup(function()
    assert.is_truthy(os.getenv("MELTANO_STATE_BACKEND_URI"), "run the specs with tests/lua/run.py")
    assert.is_truthy(io.open(CLI), CLI .. " is missing: bazel build //hosts/native:chstate")
  end)

  before_each(function()
    store = T.open(SCHEMA)
    store:clear_all()
  end)

  after_each(function() store:close() end)

  it("read what the other wrote", function()
    store:set("dev:x", {singer_state = {a = 1.5, list = chstate.array(), map = {}}})
    store:merge("dev:x", {singer_state = {b = "two"}})
    local out, code = cli("get dev:x")
    assert.are.equal(0, code, out)
    assert.are.equal(chstate.to_json((store:get("dev:x"))), chstate.to_json(chstate.from_json(out)))

    local _, set_code = cli("set dev:y " .. quote('{"singer_state":{"n":1,"e":[]}}'))
    assert.are.equal(0, set_code)
    local _, merge_code = cli("merge dev:y " .. quote('{"singer_state":{"m":2}}'))
    assert.are.equal(0, merge_code)
    local merged, whole = store:get("dev:y")
    assert.are.same({singer_state = {n = 1, e = {}, m = 2}}, merged)
    assert.is_true(chstate.is_array(merged.singer_state.e))
    assert.are.same({singer_state = {m = 2}}, whole.partial)
    local listed = cli("list")
    assert.are.equal("dev:x\ndev:y\n", listed)
  end)

  it("exclude each other with the lock", function()
    store:with_lock("dev:locked", function()
      local out, code = cli("--lock-timeout 0 merge dev:locked " .. quote('{"singer_state":{"x":1}}'))
      assert.are.equal(4, code, out)  -- 4: the lock was not acquired in time
    end)
    local _, code = cli("--lock-timeout 0 merge dev:locked " .. quote('{"singer_state":{"x":1}}'))
    assert.are.equal(0, code)

    -- a Lua process run by `chstate lock` finds the lock taken
    local probe = "local c = require 'chstate'; local s = c.open{schema = '" .. SCHEMA .. "', lock_wait_seconds = 0}; " ..
                  "local ok, err = pcall(s.with_lock, s, 'dev:locked', print); io.write(ok and 'got it' or err.code)"
    local out, lock_code = cli("lock dev:locked -- " .. T.interpreter .. " -e " .. quote(probe))
    assert.are.equal(0, lock_code, out)
    assert.are.equal("ABORTED", out)
  end)
end)
