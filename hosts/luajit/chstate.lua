--- Meltano state in ClickHouse, for LuaJIT 2.1 (OpenResty, Kong, APISIX,
-- Tarantool, plain luajit).
--
--    local chstate = require "chstate"
--    local store = chstate.open{uri = "clickhouse://meltano@localhost:8123/default"}
--    store:set("dev:tap-a-to-target-b", {singer_state = {bookmarks = {}}})
--    store:close()
--
-- The same API as the Lua 5.4 module (hosts/lua/chstate.lua is shared: this
-- file gives it its native half). The core is the C ABI (hosts/common/chstate.h,
-- libchstate.so) loaded with LuaJIT's FFI; JSON is chstate/json.lua, the HTTP
-- transport chstate/http.lua (cosockets inside nginx, LuaSocket elsewhere).
-- Every rule (SQL, resends, the lock, Meltano's merge) is the core's.
--
-- Where libchstate.so comes from (first match wins), as in the Python adapter:
--   1. chstate/libchstate.so on package.cpath (the rock installs it there),
--   2. the path in $CHSTATE_LIBRARY (e.g. bazel-bin/hosts/python/libchstate.so;
--      inside nginx, name it with `env CHSTATE_LIBRARY;`).
-- @module chstate

local ffi = require "ffi"
local json = require "chstate.json"
local http = require "chstate.http"

local ABI_VERSION = 3
local LIBRARY_ENV = "CHSTATE_LIBRARY"

-- Each declaration on its own, so that one another module made first (a
-- libc function OpenResty's resty.core declares too) does not stop the rest.
for _, decl in ipairs{
  "typedef struct chstate_store chstate_store;",
  "int32_t chstate_abi_version(void);",
  "char* chstate_verbs(void);",
  "char* chstate_resolve_settings(const char* settings_json);",
  "chstate_store* chstate_store_new(const char* settings_json, char** error_json);",
  "char* chstate_store_settings(chstate_store* store);",
  "void chstate_store_free(chstate_store* store);",
  "char* chstate_op_start(chstate_store*, const char*, int64_t, const unsigned char*, size_t);",
  "char* chstate_op_feed(chstate_store*, const char*, int64_t, const unsigned char*, size_t);",
  "void chstate_string_free(char* s);",
  "struct chstate_timespec { long tv_sec; long tv_nsec; };",
  "int clock_gettime(int clk_id, struct chstate_timespec* tp);",
  "int poll(void* fds, unsigned long nfds, int timeout);",
  "long getrandom(void* buf, size_t buflen, unsigned int flags);",
  "extern char** environ;",
} do
  pcall(ffi.cdef, decl)
end

local function library_path()
  local packaged = package.searchpath("chstate.libchstate", package.cpath)
  if packaged then return packaged end
  local env = os.getenv(LIBRARY_ENV)
  if env and env ~= "" then
    local f = io.open(env, "rb")
    if f then
      f:close()
      return env
    end
    error(("chstate: %s is %q, which is not a file: build the library with `bazel build -c opt " ..
           "//hosts/python:libchstate.so` and point it at bazel-bin/hosts/python/libchstate.so"):format(LIBRARY_ENV, env),
          0)
  end
  error("chstate: the native library was not found: chstate/libchstate.so is not on package.cpath and " ..
        LIBRARY_ENV .. " is not set. Install the rock (hosts/luajit/chstate-luajit-scm-1.rockspec), or build " ..
        "it with `bazel build -c opt //hosts/python:libchstate.so` and set " .. LIBRARY_ENV .. " to its path " ..
        "(inside nginx also add `env " .. LIBRARY_ENV .. ";` to nginx.conf)", 0)
end

local path = library_path()
local ok, lib = pcall(ffi.load, path)
if not ok then error("chstate: could not load " .. path .. ": " .. tostring(lib), 0) end
local version = lib.chstate_abi_version()
if version ~= ABI_VERSION then
  error(("chstate: %s speaks ABI version %d, this module ABI version %d: use the library from the same " ..
         "release"):format(path, version, ABI_VERSION), 0)
end

-- A string the library returned, copied and released.
local function take(p)
  if p == nil then return nil end
  local s = ffi.string(p)
  lib.chstate_string_free(p)
  return s
end

-- ------------------------------------------------------------ the host's inputs

local ts = ffi.new("struct chstate_timespec")
local function monotonic_ms()
  ffi.C.clock_gettime(1, ts)  -- CLOCK_MONOTONIC
  return tonumber(ts.tv_sec) * 1000 + math.floor(tonumber(ts.tv_nsec) / 1000000)
end

local RANDOM_LEN = 32
local random_buf = ffi.new("unsigned char[?]", RANDOM_LEN)
local function random_bytes()
  local got = ffi.C.getrandom(random_buf, RANDOM_LEN, 0)
  if got ~= RANDOM_LEN then
    local f = assert(io.open("/dev/urandom", "rb"))
    ffi.copy(random_buf, f:read(RANDOM_LEN), RANDOM_LEN)
    f:close()
  end
  return random_buf
end

local function sleep_ms(ms)
  if ms <= 0 then return end
  if http.in_nginx() then
    ngx.sleep(ms / 1000)  -- yields: the worker serves other requests meanwhile
  else
    ffi.C.poll(nil, 0, ms)
  end
end

-- ------------------------------------------------------------ the native half

local C = {
  null = json.null,
  array_mt = json.array_mt,
  monotonic_ms = monotonic_ms,
  sleep_ms = sleep_ms,
}

local MAX_INTEGER = 2 ^ 63

--- LuaJIT numbers are doubles: a whole number in int64's range is an integer.
function C.tointeger(v)
  if type(v) == "number" and v == math.floor(v) and v >= -MAX_INTEGER and v < MAX_INTEGER then return v end
  return nil
end

function C.to_json(v)
  return json.encode(v, "value")
end

function C.from_json(text)
  return json.decode(text)
end

-- The verb table the Lua half binds (core/verbs.h).
C.verbs = json.decode(take(lib.chstate_verbs())).verbs

-- The variables configuration reads (CLICKHOUSE_*, MELTANO_STATE_BACKEND_*).
function C.environ()
  local out = {}
  local e = ffi.C.environ
  local i = 0
  while e ~= nil and e[i] ~= nil do
    local kv = ffi.string(e[i])
    local k, v = kv:match("^([^=]*)=(.*)$")
    if k and (k:find("^CLICKHOUSE_") or k:find("^MELTANO_STATE_BACKEND_")) then out[k] = v end
    i = i + 1
  end
  return out
end

-- The action document an ABI call returned, as a table; a request is kept
-- for execute.
local function action(box, text)
  if text == nil then
    return {failed = {code = "RESOURCE_EXHAUSTED", message = "the chstate library ran out of memory"}}
  end
  local a, err = json.decode(text)
  if a == nil then return {failed = {code = "INTERNAL", message = "the library's answer is not JSON: " .. err}} end
  if a.request then box.pending = a.request end
  return a
end

-- Frees t.store (a store handle the GC would otherwise free) once.
local function free_store(t)
  if t.store ~= nil then
    lib.chstate_store_free(ffi.gc(t.store, nil))
    t.store = nil
  end
end

local function feed(box, doc, now)
  return action(box, take(lib.chstate_op_feed(box.store, doc, now, random_bytes(), RANDOM_LEN)))
end

local Native = {}
Native.__index = Native

local function check_open(box)
  if box.store == nil then error("the store is closed", 2) end
end

-- box:start(now_ms, op) -> action | nil, message
function Native.start(box, now, op)
  check_open(box)
  local op_text, err = json.encode(op, "op")
  if op_text == nil then return nil, err end
  return action(box, take(lib.chstate_op_start(box.store, op_text, now, random_bytes(), RANDOM_LEN)))
end

-- box:response(now_ms, status, body, exception_code) / (now_ms, nil, message, maybe_delivered)
function Native.response(box, now, status, body, extra)
  check_open(box)
  local r
  if status == nil then
    r = {transport_ok = false, transport_error = (body ~= nil and body ~= "") and body or "the transport gave no answer",
         maybe_delivered = extra ~= false}
  else
    r = {transport_ok = true, http_status = status}
    body = body or ""
    if json.valid_utf8(body) then r.body = body else
      r.body_hex = body:gsub(".", function(c) return ("%02x"):format(c:byte()) end)
    end
    if type(extra) == "string" then r.exception_code_header = extra end
  end
  local text = json.encode({response = r})
  return feed(box, text, now)
end

function Native.timer(box, now)
  check_open(box)
  return feed(box, '{"timer":true}', now)
end

-- Sends the last request once with the module's own transport.
function Native.execute(box)
  check_open(box)
  if box.http == nil then error("this store has no native transport", 2) end
  return box.http:execute(box.conn, box.pending, box.connect_ms)
end

function Native.connection(box)
  check_open(box)
  local c = box.conn
  return {host = c.host, port = c.port, secure = c.secure, user = c.user, password = c.password,
          database = c.database, ca_file = c.ca_file, connect_timeout_ms = c.connect_timeout_ms}
end

-- Nothing here runs while Lua code does (no threads in LuaJIT; inside nginx
-- the Lua half starts a light thread through C.renewer).
function Native.renews()
  return false
end

function Native.close(box)
  free_store(box)
  if box.http then box.http:close() end
end

function Native.is_closed(box)
  return box.store == nil
end

-- C.open(settings, native) -> store, info | nil, failed (as lua_chstate.cc's).
function C.open(settings, native)
  local text, err = json.encode(settings, "settings")
  if text == nil then return nil, {code = "INVALID_ARGUMENT", message = err} end
  local errp = ffi.new("char*[1]")
  local store = lib.chstate_store_new(text, errp)
  if store == nil then
    local failed = json.decode(take(errp[0]) or '{"failed":{"code":"RESOURCE_EXHAUSTED","message":"out of memory"}}')
    return nil, failed.failed
  end
  store = ffi.gc(store, lib.chstate_store_free)  -- collected without close: freed, no I/O
  local resolved = json.decode(take(lib.chstate_store_settings(store))).settings
  -- The transport's copy keeps the password; what the Lua half shows
  -- (tostring(store)) gets a copy without it.
  local shown = {}
  for k, v in pairs(resolved.connection) do
    if k ~= "password" then shown[k] = v end
  end
  local box = setmetatable({
    store = store,
    conn = resolved.connection,
    connect_ms = resolved.connection.connect_timeout_ms,
    http = native and http.new(monotonic_ms) or nil,
  }, Native)
  resolved.connection = shown
  return box, resolved
end

-- Inside nginx: renewal while a lock scope's function runs, from a light
-- thread of the request (ngx.thread.spawn). Not an ngx.timer: a timer outlives
-- its request, so a scope the request abandoned (ngx.exit inside the
-- function) would be renewed for as long as nginx runs; a light thread is
-- killed with its request, and the lock then goes stale as a dead process's
-- does. C.renewer(due, tick) starts one and returns the function that stops
-- it (nil where no light thread can start); due() is false once the store
-- is closed, else the core's next timeout (ms, or nil) and whether an
-- operation runs; tick() runs the core's idle timer. Cosockets are fine in
-- light threads.
if type(ngx) == "table" and type(ngx.thread) == "table" then
  function C.renewer(due, tick)
    if not http.in_nginx() then return nil end
    local stopped, ticking = false, false
    local ok, thread = pcall(ngx.thread.spawn, function()
      while not stopped do
        local next_ms, busy = due()
        if next_ms == false then return end
        local wait = next_ms and next_ms - monotonic_ms() or 100
        if wait <= 0 and not busy then
          ticking = true
          tick()
          ticking = false
        else
          -- An operation runs (its pump renews what it needs): look again shortly.
          ngx.sleep(math.max(busy and 10 or wait, 1) / 1000)
        end
      end
    end)
    if not ok then return nil end
    return function()
      stopped = true
      -- Not in the middle of a tick: that would leave the store's operation unfinished.
      while ticking do ngx.sleep(0.001) end
      ngx.thread.kill(thread)  -- (nil, "already terminated" when the store was closed: fine)
    end
  end

  function C.wait_background(running)
    while running() do ngx.sleep(0.001) end
  end
end

-- Inside nginx, what the store tells goes to nginx's error log when the
-- caller gives no on_event: each event with ngx.log at its level, the core
-- asked for what error_log's level shows (`error_log ... info;` shows the
-- waits for a lock, `debug` the statements too; nginx's default, error,
-- shows none of them and nothing is made).
if type(ngx) == "table" and type(ngx.log) == "function" then
  local NGX_LEVELS = {warning = ngx.WARN, info = ngx.INFO, debug = ngx.DEBUG}

  function C.nginx_diagnostics()
    if not http.in_nginx() then return nil end
    local ok, errlog = pcall(require, "ngx.errlog")
    local got, shown = false, nil
    if ok and type(errlog) == "table" and errlog.get_sys_filter_level then
      got, shown = pcall(errlog.get_sys_filter_level)
    end
    -- Without lua-resty-core's errlog, ngx.log filters by itself.
    if not got or type(shown) ~= "number" then return "info" end
    if shown >= ngx.DEBUG then return "debug" end
    if shown >= ngx.INFO then return "info" end
    if shown >= ngx.WARN then return "warning" end
    return nil
  end

  function C.nginx_log(event)
    ngx.log(NGX_LEVELS[event.level] or ngx.INFO, "chstate: ", event.line)
  end

  function C.log_error(text)
    ngx.log(ngx.ERR, text)
  end
end

-- ------------------------------------------------------------ the protocol, as documents

local Protocol = {}
Protocol.__index = Protocol

local function random_from(s)
  if type(s) ~= "string" then error("random bytes expected: a string of 16 or more bytes", 3) end
  return s, #s
end

function Protocol.start(ps, op_json, now, random)
  if ps.store == nil then error("bad argument #1 (the protocol store was freed)", 2) end
  local r, n = random_from(random)
  return take(lib.chstate_op_start(ps.store, op_json, now, r, n))
end

function Protocol.feed(ps, answer_json, now, random)
  if ps.store == nil then error("bad argument #1 (the protocol store was freed)", 2) end
  local r, n = random_from(random)
  return take(lib.chstate_op_feed(ps.store, answer_json, now, r, n))
end

Protocol.free = free_store

function C.protocol_store(settings_json)
  local errp = ffi.new("char*[1]")
  local store = lib.chstate_store_new(settings_json, errp)
  if store == nil then return nil, take(errp[0]) end
  return setmetatable({store = ffi.gc(store, lib.chstate_store_free)}, Protocol)
end

function C.resolve_settings(settings_json)
  return take(lib.chstate_resolve_settings(settings_json))
end

-- ------------------------------------------------------------ the shared API

-- hosts/lua/chstate.lua: installed by the rock as chstate/api.lua, found in a
-- checkout next to this directory.
local function api_path()
  local installed = package.searchpath("chstate.api", package.path)
  if installed then return installed end
  local here = debug.getinfo(1, "S").source:match("^@(.*)/[^/]*$") or "."
  return here .. "/../lua/chstate.lua"
end

local api_file = api_path()
local chunk, load_err = loadfile(api_file)
if chunk == nil then
  error("chstate: the module's Lua half (" .. api_file .. ") did not load: " .. tostring(load_err), 0)
end
local M = chunk(C)
M._LUAJIT = true
M._LIBRARY = path
return M
