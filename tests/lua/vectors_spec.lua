-- The conformance vectors (tests/vectors/*.json) replayed through the Lua
-- module's chstate.protocol: every step's document goes in (re-encoded by
-- chstate.to_json) with the recorded time and random bytes, and every answer
-- must equal the recorded one byte for byte, as in the native, Python and
-- Wasm runners.
local chstate = require "chstate"

local here = debug.getinfo(1, "S").source:match("^@(.*/)") or "./"
local vectors = here .. "../vectors/"

local function read(path)
  local f = assert(io.open(path, "rb"))
  local text = f:read("a")
  f:close()
  return text
end

local function unhex(h)
  return (h:gsub("%x%x", function(byte) return string.char(tonumber(byte, 16)) end))
end

for _, file in ipairs{"config", "sql", "lock", "policy"} do
  local doc = chstate.from_json(read(vectors .. file .. ".json"))
  local random = unhex(doc.random_hex)

  describe("vectors " .. file, function()
    it("has cases", function()
      assert.is_true(#doc.cases >= 8)
    end)

    for _, case in ipairs(doc.cases) do
      it(case.name, function()
        local store
        if case.store ~= nil then  -- a settings document, passed as it is
          local err
          store, err = chstate.protocol.store(chstate.to_json(case.store))
          assert.is_not_nil(store, err)
        end
        for i, step in ipairs(case.steps) do
          local input = chstate.to_json(step.doc)
          local got
          if step.call == "resolve_settings" then
            got = chstate.protocol.resolve_settings(input)
          elseif step.call == "start" then
            got = store:start(input, step.now_ms, random)
          else
            got = store:feed(input, step.now_ms, random)
          end
          assert.are.equal(step.expect, got, ("step %d (%s %s)"):format(i, step.call, input:sub(1, 200)))
        end
        if store ~= nil then store:free() end
      end)
    end
  end)
end
