-- The binding's JSON rules (docs/lua.md): what each Lua value becomes, the
-- errors for what JSON cannot hold, and round trips.
local chstate = require "chstate"

local function err_of(fn, ...)
  local ok, err = pcall(fn, ...)
  assert.is_false(ok, "expected an error")
  return tostring(err), err
end

describe("JSON conversion", function()
  it("encodes an empty table as an object and chstate.array() as an array", function()
    assert.are.equal("{}", chstate.to_json({}))
    assert.are.equal("[]", chstate.to_json(chstate.array()))
    assert.are.equal('{"a":{},"b":[]}', chstate.to_json({a = {}, b = chstate.array()}))
  end)

  it("decodes [] to a marked table that encodes as [] again, and {} to a plain table", function()
    local v = chstate.from_json('{"a":[],"b":{}}')
    assert.is_true(chstate.is_array(v.a))
    assert.is_false(chstate.is_array(v.b))
    assert.is_nil(next(v.a))
    assert.are.equal('{"a":[],"b":{}}', chstate.to_json(v))
  end)

  it("encodes sequences 1..n as arrays and string-keyed tables as objects", function()
    assert.are.equal("[1,2,3]", chstate.to_json({1, 2, 3}))
    assert.are.equal('{"x":[{"y":"z"}]}', chstate.to_json({x = {{y = "z"}}}))
    assert.are.equal('["a",["b"]]', chstate.to_json(chstate.array{"a", {"b"}}))
  end)

  it("keeps integers and floats apart (math.type) #lua54", function()
    assert.are.equal("1", chstate.to_json(1))
    assert.are.equal("1.0", chstate.to_json(1.0))
    assert.are.equal("-0.5", chstate.to_json(-0.5))
    assert.are.equal("integer", math.type(chstate.from_json("1")))
    assert.are.equal("float", math.type(chstate.from_json("1.0")))
    assert.are.equal("float", math.type(chstate.from_json("1e2")))
    assert.are.equal(math.maxinteger, chstate.from_json("9223372036854775807"))
    assert.are.equal(math.mininteger, chstate.from_json("-9223372036854775808"))
    -- Beyond a Lua integer the value becomes a float (documented).
    assert.are.equal("float", math.type(chstate.from_json("18446744073709551615")))
    local v = chstate.from_json(chstate.to_json({i = 3, f = 3.0, big = math.maxinteger, tiny = 5e-324}))
    assert.are.equal("integer", math.type(v.i))
    assert.are.equal("float", math.type(v.f))
    assert.are.equal(math.maxinteger, v.big)
    assert.are.equal(5e-324, v.tiny)
  end)

  it("refuses NaN and infinities, naming where they are", function()
    local msg, err = err_of(chstate.to_json, {a = {b = {1, 0 / 0}}})
    assert.matches("value%.a%.b%[2%] is NaN", msg)
    assert.are.equal("INVALID_ARGUMENT", err.code)
    assert.matches("is an infinity", (err_of(chstate.to_json, {x = math.huge})))
    assert.matches("is an infinity", (err_of(chstate.to_json, {x = -math.huge})))
  end)

  it("refuses non-string keys, sparse and mixed tables with the rule in the message", function()
    assert.matches("has a boolean key", (err_of(chstate.to_json, {[true] = 1})))
    assert.matches("has the key 1%.5", (err_of(chstate.to_json, {[1.5] = 1})))
    assert.matches("has the key 0", (err_of(chstate.to_json, {[0] = "zero"})))
    assert.matches("has the key %-1", (err_of(chstate.to_json, {[-1] = "x"})))
    assert.matches("sparse", (err_of(chstate.to_json, {[1] = 1, [3] = 3})))
    assert.matches("mixes integer and string keys", (err_of(chstate.to_json, {1, a = 2})))
    assert.matches("marked as an array", (err_of(chstate.to_json, chstate.array{a = 1})))
    assert.matches('%["a b"%] has a table key', (err_of(chstate.to_json, {["a b"] = {[{}] = 1}})))
  end)

  it("keeps numeric-looking string keys as strings", function()
    local v = chstate.from_json('{"1":"one","2":"two"}')
    assert.are.equal("one", v["1"])
    assert.is_nil(v[1])
    assert.are.equal('{"1":"one","2":"two"}', chstate.to_json(v))
  end)

  it("refuses values JSON cannot hold", function()
    assert.matches("value%.f is a function", (err_of(chstate.to_json, {f = print})))
    assert.matches("is a coroutine", (err_of(chstate.to_json, {coroutine.create(print)})))
    assert.matches("is a userdata", (err_of(chstate.to_json, {io.stdout})))
    assert.matches("not valid UTF%-8", (err_of(chstate.to_json, {s = "\xff\xfe"})))
    assert.matches("key is not valid UTF%-8", (err_of(chstate.to_json, {["\xc3"] = 1})))
    assert.matches("not valid UTF%-8", (err_of(chstate.to_json, {s = "\xed\xa0\x80"})))  -- a surrogate
  end)

  it("refuses nesting past 512 levels and tables that contain themselves", function()
    local deep = {}
    local t = deep
    for _ = 1, 600 do
      t.x = {}
      t = t.x
    end
    assert.matches("nested more than 512 levels", (err_of(chstate.to_json, deep)))
    local cyclic = {}
    cyclic.self = cyclic
    assert.matches("contains itself", (err_of(chstate.to_json, cyclic)))
    assert.matches("nested more than 512", (err_of(chstate.from_json, string.rep("[", 600) .. string.rep("]", 600))))
  end)

  it("maps null to chstate.null and back", function()
    assert.are.equal('{"a":null}', chstate.to_json({a = chstate.null}))
    assert.are.equal(chstate.null, chstate.from_json('{"a":null}').a)
    assert.are.equal("[1,null,3]", chstate.to_json({1, chstate.null, 3}))
  end)

  it("round-trips a state byte for byte", function()
    local text = '{"bookmarks":{"issues":{"since":"2026-11-01T00:00:00Z","ids":[1,2,3],"ratio":0.25,' ..
                 '"done":false,"cursor":null,"empty_list":[],"empty_map":{},"nested":[[],[{}]]}},' ..
                 '"unicode":"gr\xc3\xbc\xc3\x9f \xe2\x82\xac \xf0\x9f\x98\x80","nul":"a\\u0000b","whole":2.0}'
    local v = chstate.from_json(text)
    assert.are.equal("a\0b", v.nul)
    if math.type then
      assert.are.equal("float", math.type(v.whole))
    else
      assert.are.equal(2, v.whole)  -- LuaJIT: one number type (luajit_spec.lua)
    end
    local again = chstate.to_json(v)
    assert.are.same(v, chstate.from_json(again))
    assert.are.equal(again, chstate.to_json(chstate.from_json(again)))
  end)

  it("reports invalid JSON text with its position", function()
    assert.matches("line 1, column", (err_of(chstate.from_json, '{"a": }')))
    assert.matches("empty input", (err_of(chstate.from_json, "  ")))
    assert.matches("invalid JSON", (err_of(chstate.from_json, "[1,")))
    assert.matches("string expected, got number", (err_of(chstate.from_json, 5)))
  end)

  it("has non-raising variants in chstate.safe", function()
    local v, msg, code = chstate.safe.to_json({0 / 0})
    assert.is_nil(v)
    assert.matches("NaN", msg)
    assert.are.equal("INVALID_ARGUMENT", code)
    v, msg = chstate.safe.from_json("{")
    assert.is_nil(v)
    assert.is_string(msg)
    assert.are.equal("[1]", chstate.safe.to_json({1}))
  end)

  it("defines no globals", function()
    local before = {}
    for k in pairs(_G) do before[k] = true end
    package.loaded.chstate = nil
    local again = require "chstate"
    assert.is_table(again)
    for k in pairs(_G) do assert.is_true(before[k] ~= nil, "new global " .. tostring(k)) end
  end)
end)
