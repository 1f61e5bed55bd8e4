--- Meltano state in ClickHouse, for Lua 5.4 and LuaJIT orchestrators.
--
-- The idiomatic half of the `chstate` module. For Lua 5.4 it is compiled into
-- chstate.so and run by luaopen_chstate with the native half (lua_chstate.cc)
-- as its argument, so `require "chstate"` loads one file and defines no
-- globals. For LuaJIT, hosts/luajit/chstate.lua runs it with a native half
-- made of LuaJIT's FFI over the C ABI (the rock installs it as chstate/api.lua).
--
--    local chstate = require "chstate"
--    local store = chstate.open{uri = "clickhouse://meltano@localhost:8123/default"}
--    store:set("dev:tap-a-to-target-b", {singer_state = {bookmarks = {}}})
--    store:with_lock("dev:tap-a-to-target-b", function()
--      local state = store:get("dev:tap-a-to-target-b")
--      ...
--    end)
--    store:close()
--
-- Errors are raised as chstate error objects ({code=, op=, message=}, with
-- __tostring); `chstate.safe` has the same functions returning
-- `nil, message, code` instead. The core decides everything (SQL, the lock,
-- Meltano's merge rules); this file only moves requests between the core and
-- a transport, and checks arguments.
-- @module chstate

local C = ...
if type(C) ~= "table" then
  error("chstate's Lua half is loaded by require \"chstate\", not on its own", 2)
end

-- What differs between Lua 5.4 and LuaJIT (numbers are doubles there: the
-- native half says which are integers).
local tointeger = math.tointeger or C.tointeger
local pack = table.pack or function(...) return {n = select("#", ...), ...} end
local unpack = table.unpack or unpack
local THIS_FILE = debug.getinfo(1, "S").source

local M = {
  _VERSION = "chstate 0.1.0",
  --- JSON null (a light userdata NULL, equal to cjson.null).
  null = C.null,
}

-- ---------------------------------------------------------------- errors

local Error = {__name = "chstate.error"}
Error.__index = Error
Error.__tostring = function(e)
  return (e.where or "") .. "chstate." .. e.op .. ": " .. e.message
end
Error.__concat = function(a, b)
  return tostring(a) .. tostring(b)
end

local function raise(code, op, message)
  error(setmetatable({code = code, op = op, message = message}, Error), 0)
end

-- "file:line: " of the first caller outside this file, for argument errors.
local function caller_position()
  for level = 3, 30 do
    local info = debug.getinfo(level, "Sl")
    if info == nil then break end
    if info.what ~= "C" and info.source ~= THIS_FILE then
      return info.short_src .. ":" .. info.currentline .. ": "
    end
  end
  return ""
end

local function argerror(op, n, what)
  local e = setmetatable({code = "INVALID_ARGUMENT", op = op, where = caller_position(),
                          message = ("bad argument #%d to '%s' (%s)"):format(n, op, what)}, Error)
  error(e, 0)
end

local function describe(v)
  if v == nil then return "nil" end
  if v == "" then return "an empty string" end
  return type(v)
end

local function callable(f)
  if type(f) == "function" then return true end
  local mt = getmetatable(f)
  return type(mt) == "table" and mt.__call ~= nil
end

--- True when `v` is an error raised by chstate.
function M.is_error(v)
  return getmetatable(v) == Error
end

-- ---------------------------------------------------------------- JSON

--- Marks `t` (or a new table) as a JSON array; `chstate.array()` is `[]`.
function M.array(t)
  if t ~= nil and type(t) ~= "table" then argerror("array", 1, "table or nil expected, got " .. type(t)) end
  return setmetatable(t or {}, C.array_mt)
end

--- True when `t` carries the array mark (decoded arrays do).
function M.is_array(t)
  return type(t) == "table" and getmetatable(t) == C.array_mt
end

--- Lua value -> JSON text, by the binding's rules (README "Using it from Lua").
function M.to_json(v)
  local text, err = C.to_json(v)
  if text == nil then raise("INVALID_ARGUMENT", "to_json", err) end
  return text
end

--- JSON text -> Lua value.
function M.from_json(text)
  if type(text) ~= "string" then argerror("from_json", 1, "string expected, got " .. type(text)) end
  local v, err = C.from_json(text)
  if err ~= nil then raise("INVALID_ARGUMENT", "from_json", err) end
  return v
end

-- ---------------------------------------------------------------- stores

-- Store tables carry no fields: everything (and the password) lives here.
local records = setmetatable({}, {__mode = "k"})

local Store = {__name = "chstate.store"}
Store.__index = Store

local function check(self, op)
  local rec = records[self]
  if rec == nil then
    argerror(op, 0, "a chstate store expected: call it as store:" .. op .. "(...), with a colon")
  end
  if rec.closed then
    raise("FAILED_PRECONDITION", op, "the store is closed; open a new one with chstate.open")
  end
  if rec.busy then
    raise("FAILED_PRECONDITION", op,
          "the store is already running an operation (one at a time per store: give each coroutine its own store)")
  end
  return rec
end

local function check_id(op, id)
  if type(id) ~= "string" or id == "" then
    argerror(op, 1, "state id expected: a non-empty string, got " .. describe(id))
  end
end

-- State ids and patterns travel as hex in op documents, so any bytes cross.
local function hex(s)
  return (s:gsub(".", function(c) return ("%02x"):format(c:byte()) end))
end

local function unhex(h)
  return (h:gsub("%x%x", function(x) return string.char(tonumber(x, 16)) end))
end

-- A query parameter as a URL carries it (RFC 3986 unreserved bytes stay).
local function urlencode(s)
  return (s:gsub("[^A-Za-z0-9%-._~]", function(c) return ("%%%02X"):format(c:byte()) end))
end

local function header(headers, wanted)
  if type(headers) ~= "table" then return nil end
  for k, v in pairs(headers) do
    if type(k) == "string" and k:lower() == wanted then return tostring(v) end
  end
  return nil
end

-- "host:port" as a URL writes it (IPv6 in brackets).
local function host_port(host, port)
  return (host:find(":", 1, true) and ("[" .. host .. "]") or host) .. ":" .. ("%d"):format(port)
end

-- Sends a request document once through the store's transport: status, body,
-- exception code, or nil, message, maybe_delivered.
local function send(rec, req)
  if rec.transport == nil then return rec.ud:execute() end
  local conn = rec.conn
  -- Where the core sends it (one of the connection's hosts), else the configured host.
  req.host, req.port = req.host or conn.host, req.port or conn.port
  local url = {conn.scheme, host_port(req.host, req.port), conn.path}
  for _, kv in ipairs(req.url_params) do url[#url + 1] = "&" .. urlencode(kv[1]) .. "=" .. urlencode(kv[2]) end
  req.url, req.body, req.settings, req.connection = table.concat(url), req.sql, req.url_params, conn
  req.headers = {
    ["X-ClickHouse-User"] = conn.user,
    ["X-ClickHouse-Key"] = conn.password ~= "" and conn.password or nil,
    ["Content-Type"] = "text/plain; charset=UTF-8",
    ["Content-Length"] = tostring(#req.body),
  }
  local ok, status, headers, body = pcall(rec.transport, req)
  if not ok then
    return nil, "the transport function raised an error: " .. tostring(status), true
  end
  if status == nil then
    -- nil, message [, maybe_delivered (default true: the outcome is unknown)]
    return nil, tostring(headers or "the transport gave no answer"), body ~= false
  end
  local code = type(status) == "number" and tointeger(status) or nil
  if code == nil then
    return nil, "the transport function returned a status that is not an integer: " .. tostring(status), true
  end
  if body ~= nil and type(body) ~= "string" then
    return nil, "the transport function returned a body that is not a string", true
  end
  return code, body or "", header(headers, "x-clickhouse-exception-code")
end

-- Pumps one op document to its end: sends each request once and sleeps when
-- told (resends are the core's). Returns the "done" or "failed" document, or
-- nil, message when a value in it cannot become JSON.
local function pump(rec, doc, side, state)
  local a, err = rec.ud:start(rec.now_ms(), doc, side, state)
  if a == nil then return nil, err end
  while true do
    if a.request then
      local status, body, extra = send(rec, a.request)
      a = rec.ud:response(rec.now_ms(), status, body, extra)
    elseif a.wait_ms then
      rec.sleep_ms(a.wait_ms)
      a = rec.ud:timer(rec.now_ms())
    else
      return a
    end
  end
end

-- Runs one op: first, when the core's timer is due, a tick (renewals of held
-- locks); its failure is the caller's (a lock it holds may be lost). A
-- release goes without: its own outcome says what became of its lock.
local function drive(rec, opname, doc, side, state)
  if doc.op ~= "release_lock" and rec.next_tick ~= nil and rec.now_ms() >= rec.next_tick then
    local t = pump(rec, {op = "tick"})
    if t.failed then
      for _, h in pairs(rec.held) do h.suspect = true end  -- one of them may be lost: with_lock asks
      raise(t.failed.code, opname, t.failed.message)
    end
    rec.next_tick = tointeger(t.done.next_timeout_ms)
  end
  doc.merged = true  -- states in the result also carry the view a tap gets (the core's merge)
  local a, err = pump(rec, doc, side, state)
  if a == nil then argerror(opname, 2, err) end
  if a.failed then raise(a.failed.code, opname, a.failed.message) end
  rec.next_tick = tointeger(a.done.next_timeout_ms)  -- null (no lock held) becomes nil
  return a.done
end

local function run(rec, opname, doc, side, state)
  rec.busy = true
  local ok, done = pcall(drive, rec, opname, doc, side, state)
  rec.busy = false
  if not ok then error(done, 0) end
  return done
end

-- The merged view and the whole state of a "done" document; nil when absent.
local function views(done)
  local s = done.state
  if s == C.null then return nil end
  return s.merged, {completed = s.completed, partial = s.partial}
end

Store.__tostring = function(self)
  local rec = records[self]
  return "chstate.store(" .. rec.info.redacted_uri .. (rec.closed and ", closed" or "") .. ")"
end

-- `local store <close> = chstate.open{...}` closes it at the end of the scope.
Store.__close = function(self)
  local rec = records[self]
  if rec and not rec.closed then self:close() end
end

--- The merged view of a state (partial over completed, what a tap gets), and
-- the whole state {completed=, partial=}; nil when the id has no state.
function Store:get(id)
  local rec = check(self, "get")
  check_id("get", id)
  return views(run(rec, "get", {op = "get", state_id_hex = hex(id)}))
end

--- Writes a complete state (completed = state, partial = {}), as Meltano's
-- set(). Takes the id's lock, unless this store holds it (inside with_lock).
function Store:set(id, state)
  local rec = check(self, "set")
  check_id("set", id)
  if type(state) ~= "table" then argerror("set", 2, "state expected: a table, got " .. describe(state)) end
  run(rec, "set", {op = rec.held[id] and "set" or "set_locked", state_id_hex = hex(id)}, "completed", state)
  return true
end

--- Merges a partial state as Meltano's update() does (objects merge
-- recursively, lists and scalars replace), under the id's lock (the one
-- with_lock holds, or its own). Returns the new merged view and whole state.
function Store:merge(id, partial)
  local rec = check(self, "merge")
  check_id("merge", id)
  if type(partial) ~= "table" then argerror("merge", 2, "partial state expected: a table, got " .. describe(partial)) end
  if next(partial) == nil then
    argerror("merge", 2, "nothing to merge: the partial state is empty (use set to write a state)")
  end
  return views(run(rec, "merge", {op = "update", state_id_hex = hex(id)}, "partial", partial))
end

--- State ids, sorted; `pattern` uses Meltano's `*` and `?` (nil: all).
function Store:list(pattern)
  local rec = check(self, "list")
  if pattern ~= nil and type(pattern) ~= "string" then
    argerror("list", 1, "pattern expected: a string or nil, got " .. type(pattern))
  end
  local done = run(rec, "list", {op = "list", pattern_hex = pattern and hex(pattern)})
  local ids = M.array()
  for i, h in ipairs(done.state_ids_hex) do ids[i] = unhex(h) end
  return ids
end

--- Removes one state (under its lock unless held). Absent ids are fine.
function Store:delete(id)
  local rec = check(self, "delete")
  check_id("delete", id)
  run(rec, "delete", {op = rec.held[id] and "delete" or "delete_locked", state_id_hex = hex(id)})
  return true
end

--- Removes every state; returns how many.
function Store:clear_all()
  local rec = check(self, "clear_all")
  return run(rec, "clear_all", {op = "clear_all"}).count
end

--- The versions of a state kept in its history, newest first (at most
-- `limit`, default 20): an array of {version=, updated_at=, current=,
-- merged=, state={completed=, partial=}}.
function Store:history(id, limit)
  local rec = check(self, "history")
  check_id("history", id)
  if limit ~= nil and (type(limit) ~= "number" or tointeger(limit) == nil or limit < 1) then
    argerror("history", 2, "limit expected: a positive integer or nil, got " .. describe(limit))
  end
  local done = run(rec, "history", {op = "history", state_id_hex = hex(id), limit = limit and tointeger(limit)})
  local out = M.array()
  for i, v in ipairs(done.versions) do
    out[i] = {version = v.version, updated_at = v.updated_at, current = v.current, merged = v.state.merged,
              state = {completed = v.state.completed, partial = v.state.partial}}
  end
  return out
end

--- Restores a version (as history names it) under the id's lock; the
-- restored state is a new version. Returns its merged view and whole state.
function Store:rollback(id, version)
  local rec = check(self, "rollback")
  check_id("rollback", id)
  if type(version) ~= "string" then argerror("rollback", 2, "version expected: a string, got " .. describe(version)) end
  return views(run(rec, "rollback", {op = "rollback", state_id_hex = hex(id), version = version}))
end

--- Creates the database and tables (writes also do it when missing).
function Store:init()
  local rec = check(self, "init")
  run(rec, "init", {op = "init"})
  return true
end

--- The server's version and the SQL dialect chstate uses with it.
function Store:ping()
  local rec = check(self, "ping")
  local done = run(rec, "ping", {op = "ping"})
  return done.server_version, done.dialect
end

--- Renews the lease of a lock held by with_lock now (every operation first
-- renews held locks that are due; a function that works long without the
-- store calls this at least every third of the stale-lock window).
function Store:renew(id)
  local rec = check(self, "renew")
  check_id("renew", id)
  local ok, err = pcall(run, rec, "renew", {op = "renew_lock", state_id_hex = hex(id)})
  if not ok then
    if rec.held[id] and M.is_error(err) and err.code == "ABORTED" then rec.held[id].lost = true end
    error(err, 0)
  end
  return true
end

--- Runs fn(...) holding the state id's lock and returns what fn returns. The
-- lock is released when fn returns or raises (the error is re-raised as is).
-- fn may yield: the lock stays held while its coroutine is suspended.
function Store:with_lock(id, fn, ...)
  local rec = check(self, "with_lock")
  check_id("with_lock", id)
  if not callable(fn) then argerror("with_lock", 2, "function expected, got " .. describe(fn)) end
  if rec.held[id] ~= nil then
    raise("FAILED_PRECONDITION", "with_lock",
          "this store already holds the lock on this state id (with_lock calls on one id do not nest)")
  end
  local release = {op = "release_lock", state_id_hex = hex(id)}
  release.lock_id = run(rec, "with_lock", {op = "acquire_lock", state_id_hex = release.state_id_hex}).lock_id
  local h = {lock_id = release.lock_id}
  rec.held[id] = h
  local results = pack(pcall(fn, ...))
  if rec.held[id] == h then rec.held[id] = nil end
  local released, release_error = true, nil
  if not rec.closed and not h.released then
    if h.suspect and not h.lost then
      -- A tick failed while fn ran: the core answers a renewal of a lost lock at once.
      local ok, err = pcall(run, rec, "with_lock", {op = "renew_lock", state_id_hex = release.state_id_hex})
      h.lost = not ok and M.is_error(err) and err.code == "ABORTED"
    end
    released, release_error = pcall(run, rec, "with_lock", release)  -- a lost lock is forgotten, nothing sent
  end
  if h.lost then
    -- A renewal failed while fn ran (and fn carried on): the lock is gone.
    released, release_error = pcall(raise, "ABORTED", "with_lock",
      "the lock on this state id was lost while the function ran (its lease could not be renewed); " ..
      "what the function did was not necessarily exclusive")
  end
  if not results[1] then error(results[2], 0) end  -- fn's error matters more
  if not released then error(release_error, 0) end
  return unpack(results, 2, results.n)
end

--- Releases the locks this store holds and frees it. Idempotent.
function Store:close()
  local rec = records[self]
  if rec == nil then argerror("close", 0, "a chstate store expected: call it as store:close()") end
  if rec.closed then return true end
  if rec.busy then raise("FAILED_PRECONDITION", "close", "an operation is still running on this store") end
  for id, h in pairs(rec.held) do
    -- best effort: a lock whose release fails goes stale anyway
    pcall(run, rec, "close", {op = "release_lock", state_id_hex = hex(id), lock_id = h.lock_id})
    h.released = true
  end
  rec.held = {}
  rec.ud:close()
  rec.closed = true
  return true
end

--- True once close() ran.
function Store:is_closed()
  local rec = records[self]
  return rec == nil or rec.closed
end

-- Connection settings: the core's keys (core/config.h kSettingKeys) and uri.
local SETTINGS = {uri = true}
local SETTING_NAMES = {"uri"}
for _, key in ipairs(C.setting_keys) do
  SETTINGS[key] = true
  SETTING_NAMES[#SETTING_NAMES + 1] = key
end
local OPTIONS = {env = true, transport = true, sleep = true, now = true, lock_timeout = true, lock_retry = true,
                 stale_lock = true, connect_timeout = true, timeout = true, history_days = true}

-- Milliseconds from an option or its variable; nil when neither is given
-- (the core's default applies: core/defaults.h).
local function seconds(opts, env, key, env_name, zero_ok)
  local v, origin = opts[key], "option '" .. key .. "'"
  if v == nil and env_name and env[env_name] and env[env_name] ~= "" then
    v, origin = tonumber(env[env_name]), env_name
    if v == nil then argerror("open", 1, env_name .. " is not a number of seconds") end
  end
  if v == nil then return nil end
  if type(v) ~= "number" or v ~= v or v > 1e9 or v < 0 or (v == 0 and not zero_ok) then
    argerror("open", 1, origin .. " must be a number of seconds " .. (zero_ok and "(0 or more)" or "(more than 0)"))
  end
  return math.max(math.floor(v * 1000 + 0.5), zero_ok and 0 or 1)
end

-- state_backend.clickhouse.history_days: the option, else its variable;
-- nil when neither is given.
local function days(opts, env)
  local v, origin = opts.history_days, "option 'history_days'"
  local name = "MELTANO_STATE_BACKEND_CLICKHOUSE_HISTORY_DAYS"
  if v == nil and env[name] and env[name] ~= "" then
    v, origin = tonumber(env[name]), name
    if v == nil then argerror("open", 1, name .. " is not a whole number of days") end
  end
  if v == nil then return nil end
  if type(v) ~= "number" or v ~= math.floor(v) or v < 0 or v > 1000000 then
    argerror("open", 1, origin .. " must be a whole number of days (0: no history)")
  end
  return tointeger(v)
end

--- Opens a store. Settings (all optional, Meltano's names): uri, host, port,
-- database, user, password, secure, schema, table, ca_file (and the cluster
-- settings cluster, zookeeper_path, replica, quorum: README "Cluster mode"); they beat the
-- environment (MELTANO_STATE_BACKEND_*, CLICKHOUSE_*) with the CLI's
-- precedence. Options: env (a table to use instead of the process
-- environment, or false for none), lock_timeout, lock_retry, stale_lock,
-- connect_timeout, timeout (seconds), history_days, and the hooks transport(request),
-- sleep(seconds) and now() (seconds) for an orchestrator's own event loop.
-- Nothing is sent until the first operation.
function M.open(opts)
  if opts == nil then opts = {} end
  if type(opts) ~= "table" then argerror("open", 1, "table of settings expected, got " .. type(opts)) end
  local flags = {}
  for k, v in pairs(opts) do
    if SETTINGS[k] then
      local t = type(v)
      if t == "string" then
        flags[k] = v
      elseif (k == "port" or k == "quorum") and t == "number" and tointeger(v) then
        flags[k] = ("%d"):format(v)
      elseif k == "secure" and t == "boolean" then
        flags[k] = tostring(v)
      else
        argerror("open", 1, ("setting '%s' must be a string%s, got %s"):format(
                   k, (k == "port" or k == "quorum") and " or an integer" or k == "secure" and " or a boolean" or "", t))
      end
    elseif not OPTIONS[k] then
      argerror("open", 1, ("unknown setting '%s' (settings: %s; options: env, transport, sleep, now, " ..
                           "lock_timeout, lock_retry, stale_lock, connect_timeout, timeout, history_days)"):format(
                             tostring(k), table.concat(SETTING_NAMES, ", ")))
    end
  end
  local env = opts.env
  if env == nil then
    env = C.environ()
  elseif env == false then
    env = {}
  elseif type(env) ~= "table" then
    argerror("open", 1, "option 'env' must be a table of strings or false, got " .. type(env))
  end
  for _, hook in ipairs{"transport", "sleep", "now"} do
    if opts[hook] ~= nil and not callable(opts[hook]) then
      argerror("open", 1, ("option '%s' must be a function, got %s"):format(hook, type(opts[hook])))
    end
  end
  local native = {
    native = opts.transport == nil,
    -- Meltano's lock_timeout_seconds is the lock's validity (stale_lock);
    -- the wait (lock_timeout) is state_backend.clickhouse.lock_wait_seconds.
    lock_timeout_ms = seconds(opts, env, "lock_timeout", "MELTANO_STATE_BACKEND_CLICKHOUSE_LOCK_WAIT_SECONDS", true),
    lock_retry_ms = seconds(opts, env, "lock_retry", "MELTANO_STATE_BACKEND_LOCK_RETRY_SECONDS", false),
    stale_ms = seconds(opts, env, "stale_lock", "MELTANO_STATE_BACKEND_LOCK_TIMEOUT_SECONDS", false),
    connect_timeout_ms = seconds(opts, env, "connect_timeout", nil, false),
    timeout_ms = seconds(opts, env, "timeout", nil, false),
    history_days = days(opts, env),
  }
  local ud, info = C.new_store(flags, env, native)
  if ud == nil then raise("INVALID_ARGUMENT", "open", info) end
  local now, sleep = opts.now, opts.sleep
  local conn = opts.transport and ud:connection() or nil
  if conn then
    conn.scheme, conn.path = conn.secure and "https://" or "http://", "/?database=" .. urlencode(conn.database)
    conn.url = conn.scheme .. host_port(conn.host, conn.port) .. conn.path  -- the first host's
  end
  local rec = {
    ud = ud,
    info = info,
    transport = opts.transport,
    conn = conn,
    now_ms = now and function() return math.floor(now() * 1000) end or C.monotonic_ms,
    sleep_ms = sleep and function(ms) sleep(ms / 1000) end or C.sleep_ms,
    next_tick = nil,  -- when the core next needs a tick (its next_timeout_ms)
    held = {},        -- id -> {lock_id=} for the locks with_lock holds
    busy = false,
    closed = false,
  }
  local store = setmetatable({}, Store)
  records[store] = rec
  return store
end

-- ---------------------------------------------------------------- safe

local function soften(ok, ...)
  if ok then return ... end
  local e = ...
  if getmetatable(e) == Error then return nil, tostring(e), e.code end
  return nil, tostring(e), "UNKNOWN"  -- an error raised by a with_lock function or a hook
end

local inner = setmetatable({}, {__mode = "k"})
local SafeStore = {__name = "chstate.safe_store"}
SafeStore.__index = SafeStore
SafeStore.__tostring = function(self) return tostring(inner[self]) end
SafeStore.__close = function(self) inner[self]:close() end

for _, name in ipairs{"get", "set", "merge", "list", "delete", "clear_all", "init", "ping", "renew",
                      "with_lock", "close", "is_closed"} do
  SafeStore[name] = function(self, ...)
    local store = inner[self]
    if store == nil then
      return nil, "bad argument #0 to '" .. name .. "' (a chstate store expected: call it as store:" .. name ..
                  "(...), with a colon)", "INVALID_ARGUMENT"
    end
    return soften(pcall(store[name], store, ...))
  end
end

--- The same API returning nil, message, code instead of raising. get of an
-- absent id returns nil without a message.
M.safe = {
  _VERSION = M._VERSION,
  null = M.null,
  array = M.array,
  is_array = M.is_array,
  is_error = M.is_error,
}

function M.safe.open(opts)
  local ok, store = pcall(M.open, opts)
  if not ok then return soften(false, store) end
  local proxy = setmetatable({}, SafeStore)
  inner[proxy] = store
  return proxy
end

function M.safe.to_json(v)
  return soften(pcall(M.to_json, v))
end

function M.safe.from_json(text)
  return soften(pcall(M.from_json, text))
end

--- The core's JSON protocol itself (hosts/common/protocol.h), for an
-- orchestrator that drives it on its own: `chstate.protocol.store(options_json)`
-- gives a store with `:start(op_json, now_ms, random)` and `:feed(answer_json,
-- now_ms, random)` returning the next action document (strings in and out;
-- `random` is 16 or more fresh random bytes), and `:free()`;
-- `chstate.protocol.resolve_config(sources_json)` resolves settings.
M.protocol = {store = C.protocol_store, resolve_config = C.resolve_config}

return M
