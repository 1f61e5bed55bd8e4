-- The Lua examples of docs/lua.md, run as written against a real ClickHouse
-- 18.16: the ```lua block of "## Lua 5.4" (in LuaJIT, of "## LuaJIT and
-- OpenResty") must print the first ```text block after it. run.py sets
-- MELTANO_STATE_BACKEND_URI and MELTANO_STATE_BACKEND_CLICKHOUSE_PASSWORD for
-- the server under test, as the page's shell lines do. (tests/docs runs the
-- whole page, the way it says, too.)
local T = require "support"

local function section(text, heading)
  local start = text:find("\n" .. heading .. "\n", 1, true)
  assert(start, "docs/lua.md has no section " .. heading)
  local stop = text:find("\n##", start + 1, true) or #text
  return text:sub(start, stop)
end

local function block(text, lang)
  local code = text:match("\n```" .. lang .. "\n(.-)\n```\n")
  assert(code, "no ```" .. lang .. " block")
  return code
end

describe("docs/lua.md", function()
  it("has a Lua example that prints what the page says", function()
    assert.is_truthy(os.getenv("MELTANO_STATE_BACKEND_URI"), "run the specs with tests/lua/run.py")
    local f = assert(io.open("docs/lua.md"))
    -- LuaJIT runs the example of its own section.
    local lua_section = section(f:read("*a"), jit and "## LuaJIT and OpenResty" or "## Lua 5.4")
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
    local chunk = assert(load(code, "=docs/lua.md (Lua example)", "t", env))
    chunk()
    assert.are.equal(expected, table.concat(out, "\n"))
  end)
end)
