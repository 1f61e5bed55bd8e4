-- Replays tests/api/scenarios.json through the Lua module's PUBLIC API
-- (chstate.open{...}, the store's methods, with_lock) and prints the
-- transcript as JSON (the same normalisation as driver.py).
--
--   lua5.4 driver.lua HOST SCHEMA_PREFIX     -- HOST: lua54 | luajit (run by luajit)
--
-- package.path/cpath and CHSTATE_LIBRARY are set by the caller (tests/api).
local chstate = require "chstate"
local host, prefix = arg[1], arg[2]
local URI, PASSWORD, CLI = os.getenv("CHSTATE_API_URI"), os.getenv("CHSTATE_API_PASSWORD") or "", os.getenv("CHSTATE_CLI")

local function read(path)
  local f = assert(io.open(path, "rb"))
  local text = f:read("a") or f:read("*a")
  f:close()
  return text
end

local here = debug.getinfo(1, "S").source:match("^@(.*)/[^/]*$") or "."
local scenarios = chstate.from_json(read(here .. "/scenarios.json"))
local null = chstate.null

local function value(v)
  if type(v) == "table" and v["repeat"] ~= nil then return string.rep(v["repeat"], v.times) end
  return v
end

local function uri_with(q)
  if q == nil then return URI end
  return URI .. (URI:find("?", 1, true) and "&" or "?") .. q
end

local function origin_class(o)
  if o == "default" then return "default" end
  if o:find("^MELTANO_STATE_BACKEND_") or o:find("^CLICKHOUSE_") then return "env" end
  return "setting"
end

local function sh_quote(s)
  return "'" .. s:gsub("'", "'\\''") .. "'"
end

-- The contender: the CLI wanting the lock, started in the background; its
-- exit code lands in a file.
-- It runs in the scope's schema, with the scope's validity: were the scope's
-- lock not renewed, it would be stale to this contender in time.
local function contender(state_id, wait_s, settings)
  local out, script = os.tmpname(), os.tmpname()
  local f = assert(io.open(script, "w"))
  f:write(("%s --uri %s --schema %s --stale-lock %s --lock-timeout %s lock -- %s true >/dev/null 2>&1\n" ..
           "echo $? > %s.done\n"):format(sh_quote(CLI), sh_quote(URI), sh_quote(settings.schema),
                                          tostring(settings.lock_timeout_seconds or 10), tostring(wait_s),
                                          sh_quote(state_id), sh_quote(out)))
  f:close()
  os.execute(("MELTANO_STATE_BACKEND_CLICKHOUSE_PASSWORD=%s sh %s &"):format(sh_quote(PASSWORD), sh_quote(script)))
  return out .. ".done"
end

local function contender_outcome(out)
  for _ = 1, 600 do
    local f = io.open(out, "r")
    local code = f and f:read("n") or f and f:read("*n")
    if f then f:close() end
    if code then
      os.remove(out)
      return code == 0 and "acquired" or code == 4 and "not acquired" or ("exit " .. code)
    end
    os.execute("sleep 0.1")
  end
  return "no outcome"
end

local function normal(verb, a, b, c)
  if verb == "get" or verb == "set" or verb == "merge" or verb == "rollback" then
    if a == nil then return null end
    return a
  elseif verb == "delete" or verb == "copy" or verb == "move" then
    return null
  elseif verb == "ping" or verb == "init" or verb == "compact" then
    return b and "dialect" or a
  elseif verb == "export" and type(a) == "string" then  -- document = true: text, more, ids
    return {ids = c, more = b, entries = chstate.from_json("{" .. a .. "}")}
  elseif verb == "export" then
    local ids = chstate.array()
    for i, s in ipairs(a) do ids[i] = s.state_id end
    return {ids = ids, more = b}
  elseif verb == "history" then
    local out = chstate.array()
    for i, v in ipairs(a) do out[i] = v.merged end
    return out
  elseif verb == "locks" then
    local out = chstate.array()
    for i, l in ipairs(a) do out[i] = l.state_id end
    return out
  elseif verb == "unlock" then
    return a[1].state_id
  elseif verb == "renew" then
    return "renewed"
  end
  return a
end

local function has(t, k) return type(t) == "table" and t[k] ~= nil end

local run_steps

local function run_scope(store, step, settings)
  local inner = chstate.array()
  local record = {}
  local ok, err = pcall(store.with_lock, store, step.scope, function()
    local out = has(step, "contender_wait_seconds") and contender(step.scope, step.contender_wait_seconds, settings)
    if (step.idle_seconds or 0) > 0 then os.execute("sleep " .. step.idle_seconds) end
    run_steps(store, step.steps, inner, settings)
    if out then record.contender = contender_outcome(out) end
  end)
  local result
  if ok then
    result = {ok = record.contender and {contender = record.contender} or null}
  else
    result = {error = chstate.is_error(err) and err.code or tostring(err), contender = record.contender}
  end
  if #inner > 0 then result.steps = inner end
  return result
end

function run_steps(store, steps, out, settings)
  for _, step in ipairs(steps) do
    if has(step.skip_hosts, host) then
      out[#out + 1] = {skipped = step.skip_hosts[host]}
    elseif has(step, "scope") then
      out[#out + 1] = run_scope(store, step, settings)
    elseif has(step, "settings") then
      local s, view = store:settings(), {}
      for _, k in ipairs(step.settings) do view[k] = chstate.array{s.values[k], origin_class(s.origin[k])} end
      out[#out + 1] = {ok = view}
    else
      local args = {}
      for i, a in ipairs(step.args or {}) do args[i] = value(a) end
      local nargs = #(step.args or {})
      local named = step.named
      if named and next(named) ~= nil then
        -- Named options follow the positional ones (nil where one is left out).
        local positional = 0
        for _, v in ipairs(chstate.verb_table) do
          if v.name == step.verb then
            for _, a in ipairs(v.args) do if a.positional then positional = positional + 1 end end
          end
        end
        nargs = math.max(nargs, positional)
        args[nargs + 1] = named
        nargs = nargs + 1
      end
      local unpack_ = table.unpack or unpack
      local results = {pcall(store[step.verb], store, unpack_(args, 1, nargs))}
      if results[1] then
        out[#out + 1] = {ok = normal(step.verb, results[2], results[3], results[4])}
      else
        local e = results[2]
        out[#out + 1] = {error = chstate.is_error(e) and e.code or tostring(e)}
      end
    end
  end
end

local transcript = chstate.array()
for n, scenario in ipairs(scenarios.scenarios) do
  local entry = {scenario = scenario.name, steps = chstate.array()}
  transcript[#transcript + 1] = entry
  local settings = {schema = ("%s_%d"):format(prefix, n - 1), password = PASSWORD, env = false}
  local query
  for k, v in pairs(scenario.open or {}) do
    if k == "uri_query" then query = v else settings[k] = v end
  end
  settings.uri = uri_with(query)
  local ok, store = pcall(chstate.open, settings)
  if ok then
    entry.open = {ok = null}
    local ran, err = pcall(run_steps, store, scenario.steps, entry.steps, settings)
    store:close()
    if not ran then error(err, 0) end
  else
    entry.open = {error = chstate.is_error(store) and store.code or tostring(store)}
  end
end
io.write(chstate.to_json(transcript))
