-- The README's Lua example, run as written against a real ClickHouse 18.16:
-- the ```lua block of "## Using it from Lua" must print the ```text block
-- after it. run.py sets MELTANO_STATE_BACKEND_URI and
-- MELTANO_STATE_BACKEND_CLICKHOUSE_PASSWORD for the server under test, as the
-- README's shell lines do.
local T = require "support"

local function section(text, heading)
  local start = text:find("\n" .. heading .. "\n", 1, true)
  assert(start, "README.md has no section " .. heading)
  local stop = text:find("\n##", start + 1, true) or #text
  return text:sub(start, stop)
end

local function block(text, lang)
  local code = text:match("\n```" .. lang .. "\n(.-)\n```\n")
  assert(code, "no ```" .. lang .. " block")
  return code
end

describe("README", function()
  it("has a Lua example that prints what the README says", function()
    assert.is_truthy(os.getenv("MELTANO_STATE_BACKEND_URI"), "run the specs with tests/lua/run.py")
    local f = assert(io.open("README.md"))
    -- LuaJIT runs the example of its own section (README "LuaJIT and OpenResty").
    local lua_section = section(f:read("*a"), jit and "### LuaJIT and OpenResty" or "## Using it from Lua")
    f:close()
    local code, expected = block(lua_section, "lua"), block(lua_section, "text")
    local cleanup = T.open("lua_example")
    cleanup:clear_all()
    cleanup:close()
    local out = {}
    local env = setmetatable({print = function(...)
      local n, parts = select("#", ...), {...}
      for i = 1, n do parts[i] = tostring(parts[i]) end
      out[#out + 1] = table.concat(parts, "\t", 1, n)
    end}, {__index = _G})
    local chunk = assert(load(code, "=README.md (Lua example)", "t", env))
    chunk()
    assert.are.equal(expected, table.concat(out, "\n"))
  end)
end)
