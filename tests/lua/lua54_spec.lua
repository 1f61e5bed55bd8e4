-- What only Lua 5.4 has: to-be-closed variables (LuaJIT cannot parse this
-- file; run.py gives it to lua5.4 only).
local T = require "support"

describe("a store in Lua 5.4 #lua54", function()
  it("closes at the end of a <close> scope", function()
    local inner
    do
      local s <close> = T.open("lua54_close")
      inner = s
      assert.is_false(s:is_closed())
    end
    assert.is_true(inner:is_closed())
  end)
end)
