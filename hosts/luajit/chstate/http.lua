--- ClickHouse's HTTP interface as the LuaJIT module's own transport.
--
-- One HTTP/1.1 exchange per request, over whichever socket the process has:
--   * inside nginx (OpenResty, or Debian's libnginx-mod-http-lua), a cosocket
--     (`ngx.socket.tcp`): non-blocking, so a request or a lock wait never
--     stalls the worker; connections go back to nginx's keep-alive pool;
--   * elsewhere, a LuaSocket TCP object (`require "socket"`), blocking, one
--     keep-alive connection per store and host:port.
-- Each request goes to the host and port it names (the core picks one of the
-- connection's hosts for every request), else to the store's host and port;
-- nginx's pools are keyed by host:port as well.
-- Both have the same receive("*l") / receive(n) interface, so the HTTP code
-- below is shared. A connection idle for longer than MAX_IDLE_MS is not
-- reused (ClickHouse closes idle connections after a few seconds, 3 by
-- default on 18.16, and a request written into a closing connection has an
-- unknown outcome).
--
-- Credentials go in X-ClickHouse-User / X-ClickHouse-Key headers, never in
-- the URL. A failure without an HTTP answer is `nil, message, maybe_delivered`
-- (false only when the connection could not be made). Whether to send again
-- is the core's decision: nothing here resends.
local M = {}

local MAX_IDLE_MS = 2000
local POOL_SIZE = 16

local function urlencode(s)
  return (tostring(s):gsub("[^A-Za-z0-9%-._~]", function(c) return ("%%%02X"):format(c:byte()) end))
end
M.urlencode = urlencode

--- True when cosockets can be used here (an nginx request or timer context).
function M.in_nginx()
  if type(ngx) ~= "table" or type(ngx.socket) ~= "table" or type(ngx.get_phase) ~= "function" then return false end
  local phase = ngx.get_phase()
  return phase == "rewrite" or phase == "access" or phase == "content" or phase == "timer" or
         phase == "ssl_cert" or phase == "ssl_session_fetch" or phase == "preread" or phase == "balancer"
end

-- A connected socket object with :send, :receive, :close, :keepalive, and
-- whether it was reused; or nil, message.
local function cosocket(conn, connect_ms, read_ms)
  local sock = ngx.socket.tcp()
  sock:settimeouts(connect_ms, read_ms, read_ms)
  local pool = ("chstate:%s:%d:%s"):format(conn.host, conn.port, conn.secure and "tls" or "tcp")
  local ok, err = sock:connect(conn.host, conn.port, {pool = pool})
  if not ok then return nil, err end
  local reused = (sock:getreusedtimes() or 0) > 0
  if conn.secure and not reused then
    -- The trust store is nginx's lua_ssl_trusted_certificate; the name is checked.
    local session, herr = sock:sslhandshake(nil, conn.host, true)
    if not session then
      sock:close()
      return nil, "TLS failed (" .. tostring(herr) .. "; nginx verifies against lua_ssl_trusted_certificate)"
    end
  end
  return {
    reused = reused,
    send = function(_, data) return sock:send(data) end,
    receive = function(_, pattern) return sock:receive(pattern) end,
    close = function() sock:close() end,
    keepalive = function() sock:setkeepalive(MAX_IDLE_MS, POOL_SIZE) end,
  }
end

local function luasocket(state, conn, connect_ms, read_ms, now_ms)
  local found, socket = pcall(require, "socket")
  if not found then
    return nil, "outside nginx the LuaJIT module's transport is LuaSocket, which is not installed (apt install " ..
                "lua-socket, or luarocks install luasocket); or pass chstate.open a transport function"
  end
  local key = conn.host .. "\0" .. conn.port
  local kept = state.kept[key]
  state.kept[key] = nil
  if kept then
    local readable = socket.select({kept.sock}, nil, 0)
    if now_ms() - kept.last_used <= MAX_IDLE_MS and #readable == 0 then
      kept.sock:settimeout(read_ms / 1000)
      kept.reused = true
      return kept
    end
    kept.sock:close()
  end
  if conn.secure then
    return nil, "https needs OpenResty's cosockets here (outside nginx the LuaJIT module speaks plain HTTP): " ..
                "run it inside nginx, or pass chstate.open a transport function"
  end
  local sock = socket.tcp()
  sock:settimeout(connect_ms / 1000)
  local ok, err = sock:connect(conn.host, conn.port)
  if not ok then
    sock:close()
    return nil, err
  end
  sock:setoption("tcp-nodelay", true)
  sock:settimeout(read_ms / 1000)
  local s = {sock = sock, reused = false}
  s.send = function(_, data) return sock:send(data) end
  s.receive = function(_, pattern) return sock:receive(pattern) end
  s.close = function() sock:close() end
  s.keepalive = function()
    s.last_used = now_ms()
    state.kept[key] = s
  end
  return s
end

local function describe(err, connecting)
  err = tostring(err)
  if err == "timeout" then return connecting and "connect timed out" or "timed out waiting for the answer" end
  if err == "connection refused" then return err end
  if err == "closed" then return "the server closed the connection before answering" end
  return err
end

-- Reads the body after the headers: by Content-Length, chunked, or to the end.
local function read_body(s, length, chunked)
  if chunked then
    local parts = {}
    while true do
      local line, err = s:receive("*l")
      if not line then return nil, err end
      local size = tonumber(line:match("^%x+"), 16)
      if size == nil then return nil, "a bad chunk size in the answer" end
      if size == 0 then
        repeat
          line, err = s:receive("*l")  -- trailers, then the empty line
          if not line then return nil, err end
        until line == ""
        return table.concat(parts)
      end
      local data, derr = s:receive(size)
      if not data then return nil, derr end
      parts[#parts + 1] = data
      local crlf, cerr = s:receive("*l")
      if not crlf then return nil, cerr end
    end
  end
  if length then
    if length == 0 then return "" end
    return s:receive(length)
  end
  return s:receive("*a")
end

--- A transport for one store: `t:execute(conn, request, connect_ms)` ->
-- status, body, exception_code | nil, message, maybe_delivered; `t:close()`.
-- `conn` is the store's connection (host, port, secure, user, password,
-- database); `request` the core's request document (sql, url_params,
-- timeout_ms, and host and port when the store has hosts); `now_ms` a
-- monotonic clock.
function M.new(now_ms)
  local state = {kept = {}}  -- kept: host NUL port -> an idle LuaSocket connection
  local t = {}

  function t.execute(_, conn, request, connect_ms)
    local read_ms = assert(request.timeout_ms, "chstate: a request without timeout_ms (the core gives each one)")
    local target = {host = request.host or conn.host, port = tonumber(request.port or conn.port),
                    secure = conn.secure}
    local endpoint = target.host:find(":", 1, true) and ("[" .. target.host .. "]:" .. target.port)
                     or (target.host .. ":" .. target.port)
    local where = " (" .. endpoint .. "). Check that ClickHouse is running there and that host, port and " ..
                  "secure are right"
    local s, err
    if M.in_nginx() then
      s, err = cosocket(target, connect_ms, read_ms)
    else
      s, err = luasocket(state, target, connect_ms, read_ms, now_ms)
    end
    if not s then return nil, describe(err, true) .. where, false end
    local query = {"/?database=", urlencode(conn.database)}
    for _, kv in ipairs(request.url_params or {}) do
      query[#query + 1] = "&" .. urlencode(kv[1]) .. "=" .. urlencode(kv[2])
    end
    local body = request.sql or ""
    local head = {
      "POST ", table.concat(query), " HTTP/1.1\r\n",
      "Host: ", endpoint, "\r\n",
      "X-ClickHouse-User: ", conn.user, "\r\n",
    }
    if conn.password ~= nil and conn.password ~= "" then
      head[#head + 1] = "X-ClickHouse-Key: " .. conn.password .. "\r\n"
    end
    head[#head + 1] = "Content-Type: text/plain; charset=UTF-8\r\nContent-Length: " .. #body ..
                      "\r\nConnection: keep-alive\r\n\r\n"
    head[#head + 1] = body
    local ok, serr = s:send(table.concat(head))
    if not ok then
      s:close()
      return nil, describe(serr, false) .. where, true
    end
    local line, rerr = s:receive("*l")
    if not line then
      s:close()
      return nil, describe(rerr, false) .. where, true
    end
    local status = tonumber(line:match("^HTTP/1%.%d (%d%d%d)"))
    if status == nil then
      s:close()
      return nil, "not an HTTP answer" .. where, true
    end
    local length, chunked, close, exception = nil, false, line:match("^HTTP/1%.0") ~= nil, ""
    while true do
      local h, herr = s:receive("*l")
      if not h then
        s:close()
        return nil, describe(herr, false) .. where, true
      end
      if h == "" then break end
      local name, value = h:match("^([^:]+):%s*(.-)%s*$")
      if name then
        name = name:lower()
        if name == "content-length" then
          length = tonumber(value)
        elseif name == "transfer-encoding" then
          chunked = value:lower():find("chunked", 1, true) ~= nil
        elseif name == "connection" then
          close = value:lower() == "close"
        elseif name == "x-clickhouse-exception-code" then
          exception = value
        end
      end
    end
    local data, berr = read_body(s, length, chunked)
    if not data then
      s:close()
      return nil, describe(berr, false) .. where, true
    end
    if close or (not chunked and not length) then s:close() else s:keepalive() end
    return status, data, exception
  end

  function t.close()
    for key, kept in pairs(state.kept) do
      kept.sock:close()
      state.kept[key] = nil
    end
  end

  return t
end

return M
