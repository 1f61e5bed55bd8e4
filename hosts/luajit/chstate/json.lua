--- JSON for the LuaJIT module `chstate`, by the Lua 5.4 binding's rules
-- (docs/lua.md), as far as LuaJIT's numbers allow:
--
--   object  <-> table with string keys (an empty table is an object: {})
--   array   <-> table with keys 1..n, or any table carrying `array_mt`
--               (decoded arrays carry it, so [] round-trips)
--   number  <-> number. LuaJIT has no integer subtype: a whole number within
--               2^53 is written without a fraction (1.0 is written 1), and an
--               integer literal beyond 2^53 decodes to an exact int64_t cdata
--               (1LL style), which is written back exactly. NaN and
--               infinities are refused.
--   null    <-> `null` (chstate.null: a light userdata NULL where OpenResty or
--               lua-cjson provide one, so it equals ngx.null and cjson.null)
--   strings must be valid UTF-8; other key types, sparse or mixed tables,
--   functions, coroutines, userdata and other cdata are refused with the
--   path of the value. Keys are written in byte order, as the core does.
--
-- The codec is the binding's, not the core's: the core only ever sees the
-- text this writes and writes the text this reads.
local ffi = require "ffi"

local byte, char, find, format, sub, gsub = string.byte, string.char, string.find, string.format, string.sub,
  string.gsub
local concat, sort = table.concat, table.sort
local floor, huge = math.floor, math.huge
local type, pairs, next, tostring, tonumber, setmetatable, getmetatable, error, pcall =
  type, pairs, next, tostring, tonumber, setmetatable, getmetatable, error, pcall

local MAX_DEPTH = 512
local EXACT = 2 ^ 53

local M = {}

--- The metatable that marks a table as a JSON array.
M.array_mt = {__name = "chstate.array"}

-- JSON null: a light userdata NULL when the process has one to share.
local function find_null()
  if type(ngx) == "table" and ngx.null ~= nil then return ngx.null end
  local ok, cjson = pcall(require, "cjson")
  if ok and type(cjson) == "table" and cjson.null ~= nil then return cjson.null end
  local p = newproxy(true)
  getmetatable(p).__tostring = function() return "chstate.null" end
  return p
end
M.null = find_null()

local int64_t, uint64_t = ffi.typeof("int64_t"), ffi.typeof("uint64_t")

-- ------------------------------------------------------------ UTF-8

-- True when s is valid UTF-8 (no overlong forms, surrogates or values past
-- U+10FFFF).
local function valid_utf8(s)
  if not find(s, "[\128-\255]") then return true end
  local i, n = 1, #s
  while i <= n do
    local c = byte(s, i)
    if c < 0x80 then
      i = i + 1
    else
      local len, lo, hi
      if c >= 0xC2 and c <= 0xDF then
        len, lo, hi = 2, 0x80, 0xBF
      elseif c >= 0xE0 and c <= 0xEF then
        len = 3
        lo = c == 0xE0 and 0xA0 or 0x80
        hi = c == 0xED and 0x9F or 0xBF
      elseif c >= 0xF0 and c <= 0xF4 then
        len = 4
        lo = c == 0xF0 and 0x90 or 0x80
        hi = c == 0xF4 and 0x8F or 0xBF
      else
        return false
      end
      local c2 = byte(s, i + 1)
      if c2 == nil or c2 < lo or c2 > hi then return false end
      for k = 2, len - 1 do
        local ck = byte(s, i + k)
        if ck == nil or ck < 0x80 or ck > 0xBF then return false end
      end
      i = i + len
    end
  end
  return true
end
M.valid_utf8 = valid_utf8

-- ------------------------------------------------------------ encoding

local ESCAPES = {['"'] = '\\"', ["\\"] = "\\\\", ["\b"] = "\\b", ["\f"] = "\\f", ["\n"] = "\\n",
                 ["\r"] = "\\r", ["\t"] = "\\t"}
for c = 0, 31 do
  local ch = char(c)
  if ESCAPES[ch] == nil then ESCAPES[ch] = format("\\u%04x", c) end
end

local function quote(s)
  return '"' .. gsub(s, '[%c"\\]', ESCAPES) .. '"'
end

local function is_identifier(k)
  return find(k, "^[A-Za-z_][A-Za-z0-9_]*$") ~= nil
end

-- `path` then `key` as the 5.4 binding names it: path.key or path["k ey"].
local function key_path(path, key)
  if is_identifier(key) then return path .. "." .. key end
  local shown = gsub(sub(key, 1, 40), '[^ -~]', "?"):gsub('["\\]', "?")
  return path .. '["' .. shown .. (#key > 40 and '..."]' or '"]')
end

local function number_text(v)
  if v == floor(v) and v > -EXACT and v < EXACT then return format("%d", v) end
  for digits = 1, 17 do  -- the shortest text that reads back as v, as the core writes it
    local s = format("%." .. digits .. "g", v)
    if tonumber(s) == v then return s end
  end
  return format("%.17g", v)
end

local function describe(v)
  local t = type(v)
  if t == "function" then return "a function" end
  if t == "thread" then return "a coroutine" end
  if t == "userdata" then return "a userdata" end
  if t == "cdata" then return "a cdata (" .. tostring(ffi.typeof(v)) .. ")" end
  return t
end

local encode

local function encode_table(t, path, depth, out)
  if depth >= MAX_DEPTH then
    error(path .. " is nested more than " .. MAX_DEPTH .. " levels deep (or the table contains itself)", 0)
  end
  local marked = getmetatable(t) == M.array_mt
  local count, max_int, all_int, all_str, bad_key = 0, 0, true, true, nil
  for k in pairs(t) do
    count = count + 1
    local kt = type(k)
    if kt == "string" then
      all_int = false
    elseif kt == "number" and k == floor(k) and k >= 1 and k < EXACT then
      all_str = false
      if k > max_int then max_int = k end
    else
      bad_key = bad_key or (kt == "number" and "the key " .. number_text(k) or "a " .. kt .. " key")
    end
  end
  if bad_key then
    error(path .. " has " .. bad_key .. ": JSON objects need string keys and arrays need the keys 1..n " ..
          "(convert the key with tostring, or use a sequence)", 0)
  end
  if count == 0 then
    out[#out + 1] = marked and "[]" or "{}"
    return
  end
  if marked and not all_int then
    error(path .. " is marked as an array (chstate.array) but has string keys", 0)
  end
  if all_int then
    if max_int ~= count then
      error(format("%s has integer keys that are not 1..n (a sparse or holed array, highest key %d, %d values): " ..
                   "JSON arrays have no holes (fill them with chstate.null)", path, max_int, count), 0)
    end
    out[#out + 1] = "["
    for i = 1, count do
      if i > 1 then out[#out + 1] = "," end
      encode(t[i], path .. "[" .. i .. "]", depth + 1, out)
    end
    out[#out + 1] = "]"
    return
  end
  if not all_str then
    error(path .. " mixes integer and string keys: a JSON value is either an object (string keys) or an array " ..
          "(keys 1..n); convert the integer keys with tostring", 0)
  end
  local keys = {}
  for k in pairs(t) do keys[#keys + 1] = k end
  sort(keys)
  out[#out + 1] = "{"
  for i, k in ipairs(keys) do
    local p = key_path(path, k)
    if not valid_utf8(k) then error(p .. ": the key is not valid UTF-8, which JSON keys must be", 0) end
    if i > 1 then out[#out + 1] = "," end
    out[#out + 1] = quote(k)
    out[#out + 1] = ":"
    encode(t[k], p, depth + 1, out)
  end
  out[#out + 1] = "}"
end

encode = function(v, path, depth, out)
  local t = type(v)
  if t == "string" then
    if not valid_utf8(v) then
      error(path .. " is not valid UTF-8, which JSON strings must be (encode binary data, e.g. as hex)", 0)
    end
    out[#out + 1] = quote(v)
  elseif t == "number" then
    if v ~= v or v == huge or v == -huge then
      error(path .. " is " .. (v ~= v and "NaN" or "an infinity") ..
            ", which JSON cannot hold (store a string or null instead)", 0)
    end
    out[#out + 1] = number_text(v)
  elseif t == "boolean" then
    out[#out + 1] = v and "true" or "false"
  elseif t == "table" then
    encode_table(v, path, depth, out)
  elseif v == M.null or (t == "userdata" and (v == (type(ngx) == "table" and ngx.null))) then
    out[#out + 1] = "null"
  elseif t == "cdata" and (ffi.istype(int64_t, v) or ffi.istype(uint64_t, v)) then
    out[#out + 1] = (gsub(tostring(v), "U?LL$", ""))
  else
    error(path .. " is " .. describe(v) .. ", which JSON cannot hold", 0)
  end
end

--- value -> JSON text, or nil, message naming the value by its path below `path`.
function M.encode(v, path)
  local out = {}
  local ok, err = pcall(encode, v, path or "value", 0, out)
  if not ok then return nil, err end
  return concat(out)
end

-- ------------------------------------------------------------ decoding

local function fail(s, pos, what)
  local line, col = 1, 1
  local last = 1
  for nl in s:sub(1, pos - 1):gmatch("()\n") do
    line = line + 1
    last = nl + 1
  end
  col = pos - last + 1
  error(format("invalid JSON at line %d, column %d: %s", line, col, what), 0)
end

local function utf8_char(cp)
  if cp < 0x80 then return char(cp) end
  if cp < 0x800 then return char(0xC0 + floor(cp / 64), 0x80 + cp % 64) end
  if cp < 0x10000 then return char(0xE0 + floor(cp / 4096), 0x80 + floor(cp / 64) % 64, 0x80 + cp % 64) end
  return char(0xF0 + floor(cp / 262144), 0x80 + floor(cp / 4096) % 64, 0x80 + floor(cp / 64) % 64, 0x80 + cp % 64)
end

local SIMPLE = {['"'] = '"', ["\\"] = "\\", ["/"] = "/", b = "\b", f = "\f", n = "\n", r = "\r", t = "\t"}

local function decode_string(s, pos)
  -- s:sub(pos, pos) is the opening quote
  local parts, i = {}, pos + 1
  while true do
    local j = find(s, '["\\%c]', i)
    if j == nil then fail(s, pos, "unterminated string") end
    parts[#parts + 1] = sub(s, i, j - 1)
    local c = sub(s, j, j)
    if c == '"' then
      local text = concat(parts)
      if not valid_utf8(text) then fail(s, pos, "a string that is not valid UTF-8") end
      return text, j + 1
    elseif c == "\\" then
      local e = sub(s, j + 1, j + 1)
      if SIMPLE[e] then
        parts[#parts + 1] = SIMPLE[e]
        i = j + 2
      elseif e == "u" then
        local hex = sub(s, j + 2, j + 5)
        if not find(hex, "^%x%x%x%x$") then fail(s, j, "a bad \\u escape") end
        local cp = tonumber(hex, 16)
        i = j + 6
        if cp >= 0xD800 and cp <= 0xDBFF then
          local lo = sub(s, i, i + 1) == "\\u" and sub(s, i + 2, i + 5)
          local lcp = lo and find(lo, "^%x%x%x%x$") and tonumber(lo, 16)
          if not lcp or lcp < 0xDC00 or lcp > 0xDFFF then fail(s, j, "a lone UTF-16 surrogate") end
          cp = 0x10000 + (cp - 0xD800) * 1024 + (lcp - 0xDC00)
          i = i + 6
        elseif cp >= 0xDC00 and cp <= 0xDFFF then
          fail(s, j, "a lone UTF-16 surrogate")
        end
        parts[#parts + 1] = utf8_char(cp)
      else
        fail(s, j, "a bad escape")
      end
    else
      fail(s, j, "a control character in a string (escape it)")
    end
  end
end

local MAX_INT64 = "9223372036854775807"

-- An integer literal (no fraction or exponent) beyond 2^53: exact as int64_t
-- when it fits, else a double as the 5.4 binding does past 64 bits.
local function big_integer(lit)
  local neg = sub(lit, 1, 1) == "-"
  local digits = neg and sub(lit, 2) or lit
  local limit = neg and "9223372036854775808" or MAX_INT64
  if #digits > #limit or (#digits == #limit and digits > limit) then return tonumber(lit) end
  local n = int64_t(0)
  for k = 1, #digits do n = n * 10 - (byte(digits, k) - 48) end  -- negative side holds -2^63
  if not neg then n = -n end
  return n
end

local decode_value

local function skip(s, pos)
  return (find(s, "[^ \t\r\n]", pos)) or #s + 1
end

decode_value = function(s, pos, depth)
  pos = skip(s, pos)
  local c = sub(s, pos, pos)
  if c == "{" or c == "[" then
    if depth >= MAX_DEPTH then error("JSON nested more than " .. MAX_DEPTH .. " levels deep", 0) end
    local obj = c == "{"
    local out = obj and {} or setmetatable({}, M.array_mt)
    local n = 0
    pos = skip(s, pos + 1)
    local close = obj and "}" or "]"
    if sub(s, pos, pos) == close then return out, pos + 1 end
    while true do
      if obj then
        if sub(s, pos, pos) ~= '"' then fail(s, pos, "an object key (a string) expected") end
        local key
        key, pos = decode_string(s, pos)
        pos = skip(s, pos)
        if sub(s, pos, pos) ~= ":" then fail(s, pos, "':' expected after an object key") end
        local v
        v, pos = decode_value(s, pos + 1, depth + 1)
        out[key] = v
      else
        local v
        v, pos = decode_value(s, pos, depth + 1)
        n = n + 1
        out[n] = v
      end
      pos = skip(s, pos)
      local d = sub(s, pos, pos)
      if d == close then return out, pos + 1 end
      if d ~= "," then fail(s, pos, "',' or '" .. close .. "' expected") end
      pos = skip(s, pos + 1)
    end
  elseif c == '"' then
    return decode_string(s, pos)
  elseif c == "-" or find(c, "^%d$") then
    local int = s:match("^-?%d+", pos)
    if int == nil or find(int, "^-?0%d") then fail(s, pos, "a bad number") end
    local e = pos + #int
    local frac = s:match("^%.%d+", e)
    if sub(s, e, e) == "." and not frac then fail(s, e, "a bad number") end
    if frac then e = e + #frac end
    local exp = s:match("^[eE][-+]?%d+", e)
    if find(sub(s, e, e), "^[eE]$") and not exp then fail(s, e, "a bad number") end
    if exp then e = e + #exp end
    local lit = sub(s, pos, e - 1)
    if not frac and not exp and #int > 15 then
      local v = tonumber(lit)
      if v <= -EXACT or v >= EXACT then return big_integer(lit), e end
      return v, e
    end
    return tonumber(lit), e
  elseif sub(s, pos, pos + 3) == "true" then
    return true, pos + 4
  elseif sub(s, pos, pos + 4) == "false" then
    return false, pos + 5
  elseif sub(s, pos, pos + 3) == "null" then
    return M.null, pos + 4
  elseif c == "" then
    fail(s, pos, "the text ended where a value was expected")
  end
  fail(s, pos, "a JSON value expected")
end

--- JSON text -> value, or nil, message.
function M.decode(s)
  if type(s) ~= "string" then return nil, "string expected, got " .. type(s) end
  if not find(s, "[^ \t\r\n]") then return nil, "empty input: no JSON value" end
  local ok, v, pos = pcall(decode_value, s, 1, 0)
  if not ok then return nil, v end
  pos = skip(s, pos)
  if pos <= #s then
    local ok2, err = pcall(fail, s, pos, "text after the JSON value")
    return nil, err
  end
  return v
end

return M
