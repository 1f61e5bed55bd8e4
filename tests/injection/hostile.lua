-- Hostile ids and JSON through the Lua binding (hosts/lua), driven by
-- tests/injection/test_injection.py: ids arrive hex-encoded in HOSTILE_HEX
-- (comma-separated), the connection in MELTANO_STATE_BACKEND_URI/_PASSWORD
-- and the schema in MELTANO_STATE_BACKEND_CLICKHOUSE_SCHEMA. Prints one line
-- per id and "ok N" at the end; any mismatch raises (non-zero exit).
local chstate = require("chstate")

local function unhex(h)
  return (h:gsub("..", function(b) return string.char(tonumber(b, 16)) end))
end

local store = chstate.open{}
local value = {singer_state = {q = "it's \"quoted\" \\ back\\slash", nul = "a\0b", sql = "'); DROP TABLE state; --",
                               u = "\u{2028}\u{1F986}", nested = {["`"] = {"\\N", "\t", 1.5e300}}}}
local n = 0
for h in os.getenv("HOSTILE_HEX"):gmatch("[^,]+") do
  local id = unhex(h)
  store:set(id, value)
  local back = store:get(id)
  assert(chstate.to_json(back) == chstate.to_json(value), "state changed for id " .. h)
  local found = false
  for _, listed in ipairs(store:list()) do found = found or listed == id end
  assert(found, "id not listed: " .. h)
  store:delete(id)
  assert(store:get(id) == nil, "id not deleted: " .. h)
  n = n + 1
  print("id " .. h)
end
-- The same ids through import and paged export (the after option carries a
-- hostile id back to the server): every id comes back byte for byte, once.
local entries, wanted = {}, {}
for h in os.getenv("HOSTILE_HEX"):gmatch("[^,]+") do
  entries[#entries + 1] = {state_id = unhex(h), completed = value, partial = {singer_state = {p = h}}}
  wanted[unhex(h)] = h
end
assert(store:import(entries) == #entries, "import did not write every hostile id")
local seen, after, pages = 0, nil, 0
repeat
  local page, more = store:export(nil, {after = after, limit = 3})
  for _, s in ipairs(page) do
    local h = wanted[s.state_id]
    assert(h, "export gave an id that was not imported")
    wanted[s.state_id] = nil
    assert(chstate.to_json(s.completed) == chstate.to_json(value), "state changed in import/export for id " .. h)
    assert(s.partial.singer_state.p == h, "partial changed in import/export for id " .. h)
    seen = seen + 1
  end
  after, pages = page[#page] and page[#page].state_id, pages + 1
until not more
assert(seen == #entries and next(wanted) == nil, "export missed hostile ids")
print("import/export " .. seen .. " in " .. pages .. " pages")
store:clear_all()
-- Patterns: % and _ match themselves.
for _, id in ipairs{"p%q", "p_q", "pxq"} do store:set(id, {singer_state = {}}) end
local only = store:list("p_q")
assert(#only == 1 and only[1] == "p_q", "pattern p_q matched " .. #only .. " ids")
assert(#store:list("p?q") == 3, "pattern p?q")
-- Hostile schema: refused with INVALID_ARGUMENT before anything is sent.
local ok, err = pcall(chstate.open, {schema = "x`; DROP DATABASE default; --"})
if ok then ok, err = pcall(function() return err:get("x") end) end
assert(not ok, "a hostile schema was accepted")
assert(tostring(err):find("schema"), tostring(err))
store:close()
print("ok " .. n)
