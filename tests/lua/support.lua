-- Shared set-up for the busted specs of the Lua binding: the module under
-- test (bazel-bin/hosts/lua/chstate.so, put on package.cpath by run.py) and
-- stores connected to the real ClickHouse that CHSTATE_TEST_* name.
local chstate = require "chstate"
local socket = require "socket"

local M = {chstate = chstate}

local function need(name)
  local v = os.getenv(name)
  assert(v and v ~= "", name .. " is not set: run the specs with tests/lua/run.py (it starts a server)")
  return v
end

M.host = need("CHSTATE_TEST_HOST")
M.port = need("CHSTATE_TEST_PORT")
M.user = need("CHSTATE_TEST_USER")

-- The dialect a server version means: 18.16 (the Debian server) speaks
-- clickhouse18; the modern engine (chDB behind tools/chdb_http.py) speaks modern.
-- Specs check that ping's version and dialect agree with this.
function M.dialect_of(version)
  assert(type(version) == "string" and version:match("^%d+%.%d+%.%d+"), "not a server version: " .. tostring(version))
  return version:match("^18%.") and "clickhouse18" or "modern"
end
M.password = os.getenv("CHSTATE_TEST_PASSWORD") or ""

-- A schema per spec file, so files do not see each other's states.
function M.settings(schema, extra)
  local s = {host = M.host, port = M.port, user = M.user, password = M.password, database = "default",
             schema = schema, env = false}
  for k, v in pairs(extra or {}) do s[k] = v end
  return s
end

function M.open(schema, extra)
  return chstate.open(M.settings(schema, extra))
end

-- Runs fn and returns the error it raised (fails when it raised none).
function M.error_of(fn, ...)
  local ok, err = pcall(fn, ...)
  assert(not ok, "expected an error, got none")
  return err
end

-- The interpreter running the specs (run.py: lua5.4 or luajit), for specs
-- that start Lua processes of their own.
M.interpreter = os.getenv("CHSTATE_LUA") or "lua5.4"

M.sleep = socket.sleep
M.gettime = socket.gettime

-- The chstate CLI (run.py builds it; the connection comes from the
-- MELTANO_STATE_BACKEND_* variables run.py sets, never from argv).
M.cli = os.getenv("CHSTATE_CLI") or "bazel-bin/hosts/native/chstate"

-- A contender in another process: `chstate FLAGS merge ID` started in the
-- background, merging {"singer_state":{"contender":1}}. Returns a function
-- that waits for it (at most 60 s) and returns its exit status (0: merged,
-- 4: the lock was not acquired in time) and its output.
function M.contend(schema, id, flags)
  local out = os.tmpname()
  local cmd = ("%s --schema %s %s merge '%s' '{\"singer_state\":{\"contender\":1}}'"):format(
    M.cli, schema, flags, id:gsub("'", "'\\''"))
  assert(os.execute(("(%s >%s 2>&1; echo \"exit=$?\" >>%s) &"):format(cmd, out, out)))
  return function()
    local deadline = M.gettime() + 60
    while M.gettime() < deadline do
      local f = io.open(out)
      local text = f and f:read("*a") or ""
      if f then f:close() end
      local code = text:match("exit=(%d+)\n$")
      if code then
        os.remove(out)
        return tonumber(code), text
      end
      M.sleep(0.05)
    end
    error("the contender (" .. cmd .. ") did not finish in 60 s")
  end
end

-- An HTTP transport written with LuaSocket, as an orchestrator would supply.
function M.luasocket_transport(log)
  local http = require "socket.http"
  local ltn12 = require "ltn12"
  return function(req)
    if log then log[#log + 1] = req end
    local chunks = {}
    local ok, status, headers = http.request{
      url = req.url, method = "POST", headers = req.headers,
      source = ltn12.source.string(req.body), sink = ltn12.sink.table(chunks),
    }
    if not ok then return nil, status end
    return status, headers, table.concat(chunks)
  end
end

return M
