-- The Lua module (hosts/lua, its compiled-in native HTTP transport) against
-- the ClickHouse HTTP endpoint the environment names
-- (MELTANO_STATE_BACKEND_URI / _PASSWORD / _SCHEMA): prints one JSON line
-- with what each operation returned, for test_lua.py to check.
--   lua5.4 modern.lua STATE_ID_FILE
local chstate = require "chstate"

local f = assert(io.open(arg[1], "rb"))
local id = f:read("a")
f:close()

local out = {}
local store <close> = chstate.open{lock_wait_seconds = 0.5, lock_retry_seconds = 0.1}
local other <close> = chstate.open{lock_wait_seconds = 0.5, lock_retry_seconds = 0.1}

out.server_version, out.dialect = store:ping()
local state = {singer_state = {bookmarks = {t = {v = os.getenv("T_VALUE")}}}}
store:set(id, state)
store:set("dev:plain", {singer_state = {n = 1}})
out.get = store:get(id)
out.merged = store:merge(id, {singer_state = {more = true}})
out.list = store:list()
out.list_pattern = store:list("dev:p*")
out.in_lock = store:with_lock(id, function()
  local ok, err = pcall(other.set, other, id, {singer_state = {intruder = 1}})
  local s = store:get(id)
  s.singer_state.locked_write = 1
  store:set(id, s)
  return ok and "intruder wrote" or err.code
end)
out.after_lock = store:get(id)
-- The verbs beyond Meltano's four, through the modern dialect.
store:copy(id, "dev:copy")
out.copy = store:get("dev:copy")
local page, more = store:export(nil, {limit = 2})
out.export_ids, out.export_more = {}, more
for i, s in ipairs(page) do out.export_ids[i] = s.state_id end
out.history_count = #store:history(id, {limit = 5})
out.imported = store:import{{state_id = "dev:imported", completed = {singer_state = {i = 1}}, partial = {}}}
store:move("dev:imported", "dev:moved")
out.moved = store:get("dev:moved")
out.after_move = store:get("dev:imported") == nil
store:delete(id)
out.after_delete = store:get(id) == nil
out.cleared = store:clear_all()
out.list_after = chstate.array(store:list())

local bad <close> = chstate.open{password = "wrong-" .. os.getenv("MELTANO_STATE_BACKEND_CLICKHOUSE_PASSWORD"):sub(1, 5)}
local ok, err = pcall(bad.get, bad, "dev:plain")
out.wrong_password = ok and "accepted" or (chstate.is_error(err) and err.code or tostring(err))

print(chstate.to_json(out))
