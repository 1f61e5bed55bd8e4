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
--    store:merge("dev:tap-a-to-target-b", {singer_state = {bookmarks = {users = {id = 7}}}})
--    store:with_lock("dev:tap-a-to-target-b", function()
--      local state = store:get("dev:tap-a-to-target-b")
--      ...
--    end)
--    store:close()
--
-- Errors are raised as chstate error objects ({code=, op=, message=}, with
-- __tostring); `chstate.safe` has the same functions returning
-- `nil, message, code` instead. The core decides everything (settings and
-- their defaults, the verbs and their checks, SQL, the lock, Meltano's merge
-- rules): the store's methods are made from the core's verb table, and this
-- file only converts Lua values and moves requests between the core and a
-- transport.
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

--- Lua value -> JSON text, by the binding's rules (docs/lua.md).
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
  -- A renewal the binding runs in the background (inside nginx) is not the
  -- caller's operation: the call waits for it instead of failing.
  if rec.busy == "background" and rec.wait_background then rec.wait_background() end
  if rec.closed then
    raise("FAILED_PRECONDITION", op, "the store is closed; open a new one with chstate.open")
  end
  if rec.busy then
    raise("FAILED_PRECONDITION", op,
          "the store is already running an operation (one at a time per store: give each coroutine its own store)")
  end
  return rec
end

-- State ids and patterns travel as hex in verb documents, so any bytes cross.
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

-- What the store told (docs/diagnostics.md), each event to the store's
-- on_event as a table; an error the callback raises does not stop the
-- operation (the first one is written to nginx's error log or stderr).
local function tell(rec, events)
  if rec.on_event == nil then return end
  for _, e in ipairs(events) do
    local hex_id = e.state_id_hex
    local event = {kind = e.kind, level = e.level, at_ms = tointeger(e.at_ms), message = e.message,
                   line = e.line or e.message, numbers = e.numbers, texts = e.texts,
                   state_id = (type(hex_id) == "string") and unhex(hex_id) or nil}
    local ok, err = pcall(rec.on_event, event)
    if not ok and not rec.on_event_failed then
      rec.on_event_failed = true
      local text = "chstate: on_event raised an error on a " .. tostring(e.kind) .. " event (later ones are not shown): " ..
                   tostring(err)
      if C.log_error then C.log_error(text) else io.stderr:write(text, "\n") end
    end
  end
end

-- Answers actions until the op (or idle timer) ends: sends each request once
-- and sleeps when told (resends are the core's). Returns the last action.
local function answer(rec, a)
  while true do
    if a.events then tell(rec, a.events) end
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

local function note_timer(rec, a)
  local body = a.done or a.idle
  if body then rec.next_tick = tointeger(body.next_timeout_ms) end  -- null (nothing held) becomes nil
end

-- The core's idle timer, when due: held locks renewed, lingering ones
-- released. A lock it finds lost is the core's to report (at the scope's
-- release, and to any write under it), so its failure is not raised here.
local function tick(rec)
  if rec.next_tick == nil or rec.now_ms() < rec.next_tick then return end
  local a = answer(rec, rec.ud:timer(rec.now_ms()))
  if a.failed then rec.next_tick = nil else note_timer(rec, a) end
end

-- A value the verb document cannot hold (NaN, a function, ...) is named by
-- its path under "op"; `fields` (document member -> {n, name}) turns that
-- into the argument the caller passed: "bad argument #2 to 'set' (state.x is NaN ...)".
local function conversion_error(opname, fields, err)
  local field, rest = err:match("^op%.([%w_]+)(.*)$")
  local arg = field and fields and fields[field]
  if arg then argerror(opname, arg[1], arg[2] .. rest) end
  argerror(opname, 1, err)
end

-- Runs one verb document to its end; returns the "done" body or raises.
local function run(rec, opname, doc, fields)
  rec.busy = true
  local ok, res = pcall(function()
    -- Every call renews what is due first (hosts that cannot run code while
    -- their user's does: plain Lua with a transport of its own).
    if not rec.renews then tick(rec) end
    doc.merged = true  -- states in the result also carry the view a tap gets (the core's merge)
    local a, err = rec.ud:start(rec.now_ms(), doc)
    if a == nil then conversion_error(opname, fields, err) end
    if a.failed and a.failed.code == "INVALID_ARGUMENT" then
      -- The core refused the arguments before sending anything: an argument
      -- error, so it names the caller's line as Lua's own argument errors do.
      error(setmetatable({code = a.failed.code, op = opname, message = a.failed.message,
                          where = caller_position()}, Error), 0)
    end
    a = answer(rec, a)
    note_timer(rec, a)
    if a.failed then raise(a.failed.code, opname, a.failed.message) end
    return a.done
  end)
  rec.busy = false
  if not ok then error(res, 0) end
  return res
end

-- ---------------------------------------------------------------- the verbs

local function side(s)
  return {completed = s.completed, partial = s.partial}
end

local function state_of(done)
  local s = done.state
  if s == nil or s == C.null then return nil end
  return s.merged, side(s)
end

-- What each kind of result (the verb table's "returns") is in Lua.
local RETURNS = {
  nothing = function() return true end,
  server = function(done) return done.server_version, done.dialect end,
  state = state_of,
  maybe_state = state_of,
  state_ids = function(done)
    local ids = M.array()
    for i, h in ipairs(done.state_ids_hex) do ids[i] = unhex(h) end
    return ids
  end,
  count = function(done) return tointeger(done.count) end,
  page = function(done)
    if done.document ~= nil then  -- document = true: the entries' text, more, the page's ids
      local ids = M.array()
      for i, h in ipairs(done.state_ids_hex) do ids[i] = unhex(h) end
      return done.document, done.more, ids
    end
    local states = M.array()
    for i, s in ipairs(done.states) do
      states[i] = {state_id = unhex(s.state_id_hex), completed = s.completed, partial = s.partial, merged = s.merged}
    end
    return states, done.more
  end,
  versions = function(done)
    local out = M.array()
    for i, v in ipairs(done.versions) do
      out[i] = {version = v.version, updated_at = v.updated_at, current = v.current, merged = v.state.merged,
                state = side(v.state)}
    end
    return out
  end,
  locks = function(done)
    local out = M.array()
    for i, l in ipairs(done.locks) do
      out[i] = {state_id = l.state_id_hex ~= C.null and unhex(l.state_id_hex) or nil, table = l.table,
                holder = l.holder, held_s = l.held_s, renewed_s = l.renewed_s, validity_s = l.validity_s,
                stale = l.stale}
    end
    return out
  end,
  lock = function(done) return done.lock_id, tointeger(done.waited_ms) end,
}

-- The members of an import entry (see put_arg).
local IMPORT_MEMBERS = {state_id = true, completed = true, partial = true, merged = true}

local function describe_key(k)
  if type(k) == "string" then return ("'%s'"):format(k:sub(1, 100)) end
  return ("[%s] (a %s key)"):format(tostring(k), type(k))
end

-- One argument of a verb into its document member; Lua values the core
-- cannot take are named here (a state id must be a string).
local function put_arg(verb, n, arg, v, doc)
  if v == nil then return end
  local t = arg.type
  if t == "state_id" then
    if type(v) ~= "string" then argerror(verb, n, arg.name .. " expected: a string, got " .. describe(v)) end
    doc[arg.field] = hex(v)
  elseif t == "pattern" then
    if type(v) ~= "string" then argerror(verb, n, "pattern expected: a string or nil, got " .. type(v)) end
    doc.pattern_hex = hex(v)
  elseif t == "states" then
    if type(v) ~= "table" then argerror(verb, n, "states expected: a list of {state_id=, completed=, partial=}") end
    local entries = M.array()
    for i, e in ipairs(v) do
      if type(e) ~= "table" or type(e.state_id) ~= "string" then
        argerror(verb, n, ("states[%d] expected: {state_id = string, completed = {...}, partial = {...}}"):format(i))
      end
      -- A member the entry cannot carry is refused, not dropped: a typo
      -- ("complete") would otherwise import an empty state. merged is what
      -- export gives besides the sides (derived from them), so an exported
      -- page imports as it is.
      for k in pairs(e) do
        if not IMPORT_MEMBERS[k] then
          argerror(verb, n, ("states[%d] has the member %s; an entry has state_id, completed and partial (and " ..
                             "merged, as export gives it, which is derived and not written)"):format(i, describe_key(k)))
        end
      end
      entries[i] = {state_id_hex = hex(e.state_id), completed = e.completed, partial = e.partial}
    end
    doc[arg.field] = entries
  else
    doc[arg.field] = v
  end
end

-- A method for a verb of the table: positional arguments in the row's order,
-- then a table of the named ones ({force = true}, {limit = 5}).
local function bind(verb)
  local positional, named, fields = {}, {}, {}
  for _, arg in ipairs(verb.args) do
    if arg.positional then positional[#positional + 1] = arg else named[arg.name] = arg end
  end
  for i, arg in ipairs(positional) do fields[arg.field] = {i, arg.name} end
  for _, arg in pairs(named) do fields[arg.field] = {#positional + 1, arg.name} end
  return function(self, ...)
    local rec = check(self, verb.name)
    local doc = {op = verb.name}
    local n = select("#", ...)
    for i, arg in ipairs(positional) do put_arg(verb.name, i, arg, (select(i, ...)), doc) end
    if n > #positional + 1 then
      argerror(verb.name, #positional + 2, ("%s takes %d arguments and a table of options"):format(verb.name,
               #positional))
    end
    local opts = n > #positional and select(#positional + 1, ...) or nil
    if opts ~= nil then
      if type(opts) ~= "table" then
        argerror(verb.name, #positional + 1, "table of options expected, got " .. type(opts))
      end
      for k, v in pairs(opts) do
        local arg = named[k]
        if arg == nil then
          local names = {}
          for name in pairs(named) do names[#names + 1] = name end
          table.sort(names)
          argerror(verb.name, #positional + 1, ("unknown option '%s' (options: %s)"):format(
                     tostring(k), #names > 0 and table.concat(names, ", ") or "none"))
        end
        put_arg(verb.name, #positional + 1, arg, v, doc)
      end
    end
    return RETURNS[verb.returns](run(rec, verb.name, doc, fields))
  end
end

-- The core's verb table as it is ({name=, args={{name=, type=, positional=, ...}}, lock=, returns=, ...}),
-- and every verb but the scope's ends (acquire and release are with_lock) as a method.
M.verb_table = C.verbs
M.verbs = {}
for _, verb in ipairs(C.verbs) do
  M.verbs[#M.verbs + 1] = verb.name
  if verb.name ~= "acquire" and verb.name ~= "release" then Store[verb.name] = bind(verb) end
end

Store.__tostring = function(self)
  local rec = records[self]
  return "chstate.store(" .. rec.info.connection.redacted_uri .. (rec.closed and ", closed" or "") .. ")"
end

-- `local store <close> = chstate.open{...}` closes it at the end of the scope.
Store.__close = function(self)
  local rec = records[self]
  if rec and not rec.closed then self:close() end
end

--- Runs fn(...) holding the state id's lock (a lock scope) and returns what
-- fn returns. Released when fn returns or raises (fn's error is raised as
-- is). With the module's own transport a thread renews the lock while fn
-- runs, however long; with a transport function of your own (and in LuaJIT
-- outside nginx) nothing can run while fn does, so every store call renews
-- when due, and a scope that outlived its lease ends with ABORTED naming the
-- lease. fn may yield: the lock stays held while its coroutine is suspended.
function Store:with_lock(id, fn, ...)
  local rec = check(self, "with_lock")
  if not callable(fn) then argerror("with_lock", 2, "function expected, got " .. describe(fn)) end
  local doc = {op = "acquire"}
  put_arg("with_lock", 1, {name = "state_id", type = "state_id", field = "state_id_hex"}, id, doc)
  local lock_id = run(rec, "with_lock", doc).lock_id
  -- Inside nginx a light thread of this request renews the lock while fn
  -- runs; it ends with the scope, and with the request if fn ends that
  -- (ngx.exit), so an abandoned scope's lock goes stale as a dead process's does.
  local stop_renewer = rec.renewer and rec.renewer()
  local results = pack(pcall(fn, ...))
  if stop_renewer then stop_renewer() end
  local released, release_error = true, nil
  if not rec.closed then
    released, release_error = pcall(run, rec, "with_lock",
                                    {op = "release", state_id_hex = doc.state_id_hex, lock_id = lock_id})
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
  if rec.busy == "background" and rec.wait_background then rec.wait_background() end
  if rec.busy then raise("FAILED_PRECONDITION", "close", "an operation is still running on this store") end
  -- Best effort: a lock whose release fails goes stale anyway.
  pcall(function()
    rec.busy = true
    local a = answer(rec, rec.ud:start(rec.now_ms(), {close = true}))
    rec.busy = false
    return a
  end)
  rec.busy = false
  rec.ud:close()
  rec.closed = true
  return true
end

--- What the core resolved from the settings given (the password left out):
-- {values = {key = text}, origin = {key = where}, store = {...}, connection = {...}}.
function Store:settings()
  local rec = check(self, "settings")
  return rec.info
end

--- True once close() ran.
function Store:is_closed()
  local rec = records[self]
  return rec == nil or rec.closed
end

--- True when held locks are renewed while your own code runs (the module's
-- transport: a thread; inside nginx: a light thread); false where only store
-- calls renew them (a transport function of your own; LuaJIT outside nginx).
function Store:renews_in_background()
  local rec = check(self, "renews_in_background")
  return rec.renews
end

-- What chstate.open takes besides settings: the hooks of an orchestrator's
-- own event loop, the environment to read, and where what the store tells goes.
local HOOKS = {env = true, transport = true, sleep = true, now = true, on_event = true, diagnostics = true,
               show_states = true}
local LEVELS = {none = true, warning = true, info = true, debug = true}

--- Opens a store. Every key but the hooks is a setting, by the names of the
-- core's settings table (Meltano's: uri, host, port, database, user,
-- password, secure, schema, table, lock_timeout_seconds, lock_wait_seconds,
-- history_days, ...; docs/settings.md); the core resolves them with the
-- environment (MELTANO_STATE_BACKEND_*, CLICKHOUSE_*) and its defaults, and
-- refuses unknown names. Hooks: env (a table to read instead of the process
-- environment, or false for none), transport(request), sleep(seconds) and
-- now() (seconds) for an orchestrator's own event loop. Nothing is sent
-- until the first operation.
--
-- What the store tells beside its results (a wait for a lock another process
-- holds, a request sent again, a host marked down, each statement at debug:
-- docs/diagnostics.md): on_event(event) is called with each as a table
-- {kind=, level=, at_ms=, message=, line=, state_id=, numbers={}, texts={}}
-- at the level `diagnostics` asks the core for ("warning", "info", "debug";
-- "info" by default). Inside nginx, with no on_event, each is written with
-- ngx.log at its level (ngx.WARN, ngx.INFO, ngx.DEBUG), asking the core for
-- what error_log's level shows. show_states = true keeps states' contents in
-- debug statements.
function M.open(opts)
  if opts == nil then opts = {} end
  if type(opts) ~= "table" then argerror("open", 1, "table of settings expected, got " .. type(opts)) end
  local values = {}
  for k, v in pairs(opts) do
    if not HOOKS[k] then
      if type(k) ~= "string" then argerror("open", 1, "setting names are strings, got " .. type(k)) end
      values[k] = v
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
  for _, hook in ipairs{"transport", "sleep", "now", "on_event"} do
    if opts[hook] ~= nil and not callable(opts[hook]) then
      argerror("open", 1, ("option '%s' must be a function, got %s"):format(hook, type(opts[hook])))
    end
  end
  if opts.diagnostics ~= nil and not LEVELS[opts.diagnostics] then
    argerror("open", 1, ("option 'diagnostics' must be \"none\", \"warning\", \"info\" or \"debug\", got %s"):format(
      type(opts.diagnostics) == "string" and ("%q"):format(opts.diagnostics) or type(opts.diagnostics)))
  end
  -- Where what the store tells goes: on_event, else inside nginx its error log.
  local on_event, level = opts.on_event, opts.diagnostics
  if on_event == nil and C.nginx_diagnostics then
    local shown = C.nginx_diagnostics()
    if shown then on_event, level = C.nginx_log, level or shown end
  end
  level = on_event and (level or "info") or "none"
  local native = opts.transport == nil
  local ud, info = C.open({from = "api", values = values, env = env,
                           host = {diagnostics = level, show_states = opts.show_states == true}}, native)
  if ud == nil then
    -- Settings the core refused are the caller's argument: they name its line.
    error(setmetatable({code = info.code, op = "open", message = info.message,
                        where = info.code == "INVALID_ARGUMENT" and caller_position() or nil}, Error), 0)
  end
  local now, sleep = opts.now, opts.sleep
  local conn = not native and ud:connection() or nil
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
    next_tick = nil,   -- when the core next wants its idle timer (its next_timeout_ms)
    on_event = on_event,  -- where what the store tells goes (nil: nothing is made)
    renews = ud:renews(),
    busy = false,
    closed = false,
  }
  if not rec.renews and C.renewer then
    -- Inside nginx: C.renewer(due, tick) starts a light thread that calls
    -- tick when the core's timer is due, and returns the function that stops
    -- it; C.wait_background() yields until a background tick is over.
    local function due()
      return not rec.closed and rec.next_tick, rec.busy
    end
    local function background_tick()
      if rec.busy or rec.closed then return end
      rec.busy = "background"
      pcall(tick, rec)
      rec.busy = false
    end
    rec.renewer = function() return C.renewer(due, background_tick) end
    rec.wait_background = function() C.wait_background(function() return rec.busy == "background" end) end
    rec.renews = true
  end
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

local SAFE = {"with_lock", "close", "is_closed", "renews_in_background", "settings"}
for _, verb in ipairs(C.verbs) do
  if Store[verb.name] then SAFE[#SAFE + 1] = verb.name end
end
for _, name in ipairs(SAFE) do
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
-- orchestrator that drives it on its own: `chstate.protocol.store(settings_json)`
-- gives a store with `:start(op_json, now_ms, random)` and `:feed(answer_json,
-- now_ms, random)` returning the next action document (strings in and out;
-- `random` is 16 or more fresh random bytes), and `:free()`;
-- `chstate.protocol.resolve_settings(settings_json)` resolves settings.
M.protocol = {store = C.protocol_store, resolve_settings = C.resolve_settings}

return M
