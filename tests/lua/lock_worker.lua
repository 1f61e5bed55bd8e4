-- One contender of lock_spec's two-process test: `iterations` times, under
-- the state id's lock, logs "enter TAG", reads the counter state, writes it
-- plus one, logs "leave TAG". The connection comes from CHSTATE_TEST_* in the
-- environment (never from argv, which other users can read).
-- Usage: lua5.4 lock_worker.lua SCHEMA ID ITERATIONS LOG TAG
local chstate = require "chstate"
local socket = require "socket"

local schema, id, iterations, log_path, tag = arg[1], arg[2], tonumber(arg[3]), arg[4], arg[5]
local store = chstate.open{
  host = os.getenv("CHSTATE_TEST_HOST"), port = os.getenv("CHSTATE_TEST_PORT"),
  user = os.getenv("CHSTATE_TEST_USER"), password = os.getenv("CHSTATE_TEST_PASSWORD"),
  database = "default", schema = schema, env = false, lock_wait_seconds = 60, lock_retry_seconds = 0.02,
}
local log = assert(io.open(log_path, "a"))
local function note(line)
  log:write(line, "\n")  -- one small O_APPEND write per line: lines never interleave
  log:flush()
end

for _ = 1, iterations do
  store:with_lock(id, function()
    note("enter " .. tag)
    local current = store:get(id)
    -- Time must pass (by design): widens the read-modify-write window, so
    -- that a second holder inside it would show as an overlap or a lost update.
    socket.sleep(0.003)
    store:set(id, {singer_state = {count = (current and current.singer_state.count or 0) + 1}})
    note("leave " .. tag)
  end)
end
note("done " .. tag)
store:close()
