-- Latency of the Lua binding's calls against the server CHSTATE_TEST_* name:
--   tools/clickhouse_server.py run -- env LUA_CPATH_5_4="$PWD/bazel-bin/hosts/lua/?.so;;" \
--     LUA_PATH_5_4="$PWD/tests/lua/?.lua;;" lua5.4 tests/lua/bench.lua [N]
-- Prints median and 99th percentile per call, for the native transport and a
-- LuaSocket transport. Not a test: numbers for the README and reports.
local T = require "support"

local n = tonumber(arg and arg[1]) or 200

local function measure(label, fn)
  local times = {}
  for i = 1, n do
    local t0 = T.gettime()
    fn(i)
    times[i] = (T.gettime() - t0) * 1000
  end
  table.sort(times)
  print(("%-34s median %6.2f ms   p99 %6.2f ms"):format(label, times[n // 2 + 1], times[math.ceil(n * 0.99)]))
end

for _, variant in ipairs{{"native", {}}, {"LuaSocket", {transport = T.luasocket_transport()}}} do
  local name, extra = variant[1], variant[2]
  local s = T.open("lua_bench", extra)
  s:clear_all()
  s:set("bench", {singer_state = {n = 0}})
  measure(name .. ": get", function() s:get("bench") end)
  measure(name .. ": set (takes the lock)", function(i) s:set("bench", {singer_state = {n = i}}) end)
  measure(name .. ": merge (takes the lock)", function(i) s:merge("bench", {singer_state = {m = i}}) end)
  measure(name .. ": with_lock, empty function", function() s:with_lock("bench", function() end) end)
  measure(name .. ": with_lock + merge inside", function(i)
    s:with_lock("bench", function() s:merge("bench", {singer_state = {k = i}}) end)
  end)
  s:close()
end
