-- stats.lua - one stat key of a /record or /stats request (docs/stats.md),
-- atomically on Redis.
--
-- This is the Redis half of docs/stats.md; src/core/sketch.c and
-- src/core/stats_window.c are the C half.  Both follow that page to the
-- letter, including the order of the double arithmetic.
--
-- KEYS[1]  the stat key "<prefix>stat:<name>:{<tag>}", its tag never empty
--          (docs/stats.md "Keys on Redis").  Sub-window s is the hash
--          KEYS[1] .. ':' .. s, in the same hash tag (one slot).
-- ARGV     window_ms, resolution_ms, relative_accuracy, record (0 or 1;
--          2 records and reads nothing, answering an empty array: for
--          bulk loads such as bench/stats_memory.sh), value (a finite
--          number, ignored unless record), then the quantiles asked for,
--          each in [0, 1].
-- Reply    an array of strings: count; and when count > 0: sum, min, max,
--          then one value per quantile, each as '%.17g'.
--
-- Time is the server's (TIME), in milliseconds.  Calling TIME before
-- writing needs effects replication, the default since Redis 5.

local MAXB = 4096       -- buckets per sign per sub-window (docs/stats.md)

local W = tonumber(ARGV[1])
local R = tonumber(ARGV[2])
local a = tonumber(ARGV[3])
local record = ARGV[4] ~= '0'
local v = tonumber(ARGV[5])

local function num(x)
  return string.format('%.17g', x)
end

-- A sum saturates at the largest finite double of its sign, so that
-- finite values never make it infinite (docs/stats.md "Bounds").
local MAXF = 1.7976931348623157e308
local function sat(x)
  if x > MAXF then return MAXF elseif x < -MAXF then return -MAXF end
  return x
end

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local hi = math.floor(now / R)
local lo = math.floor((now - W) / R)
local gamma = (1 + a) / (1 - a)
local lng = math.log(gamma)

-- Fold the lowest bucket of one sign of hash k into the next lowest, as
-- long as the sign holds more than MAXB buckets.
local function fold(k, sign, nfield)
  local n = tonumber(redis.call('HGET', k, nfield))
  if n <= MAXB then
    return
  end
  local f = redis.call('HKEYS', k)
  local i1, i2
  for j = 1, #f do
    if string.sub(f[j], 1, 1) == sign then
      local i = tonumber(string.sub(f[j], 2))
      if i1 == nil or i < i1 then
        i2 = i1
        i1 = i
      elseif i2 == nil or i < i2 then
        i2 = i
      end
    end
  end
  local c = redis.call('HGET', k, sign .. i1)
  redis.call('HINCRBY', k, sign .. i2, c)
  redis.call('HDEL', k, sign .. i1)
  redis.call('HINCRBY', k, nfield, -1)
end

if record then
  local k = KEYS[1] .. ':' .. string.format('%d', hi)
  local cur = redis.call('HMGET', k, 'n', 's', 'lo', 'hi')
  if cur[1] then
    local s = sat(tonumber(cur[2]) + v)
    local mn = tonumber(cur[3])
    local mx = tonumber(cur[4])
    if v < mn then mn = v end
    if v > mx then mx = v end
    redis.call('HSET', k, 'n', tonumber(cur[1]) + 1, 's', num(s),
      'lo', num(mn), 'hi', num(mx), 'w', W)
  else
    redis.call('HSET', k, 'n', 1, 's', num(v), 'lo', num(v), 'hi', num(v),
      'w', W)
  end
  if v > 0 then
    local i = math.ceil(math.log(v) / lng)
    if redis.call('HINCRBY', k, 'p' .. string.format('%d', i), 1) == 1 then
      redis.call('HINCRBY', k, 'bp', 1)
      fold(k, 'p', 'bp')
    end
  elseif v < 0 then
    local i = math.ceil(math.log(-v) / lng)
    if redis.call('HINCRBY', k, 'm' .. string.format('%d', i), 1) == 1 then
      redis.call('HINCRBY', k, 'bm', 1)
      fold(k, 'm', 'bm')
    end
  else
    redis.call('HINCRBY', k, 'z', 1)
  end
  redis.call('PEXPIRE', k, (hi + 1) * R + W - now)
end

if ARGV[4] == '2' then
  return {}
end

-- Merge the live sub-windows, oldest first.  One whose TTL was set under
-- a shorter window (field w; a reload made the window longer) gets the
-- TTL of this one, as the memory store keeps it (docs/stats.md "Reloads
-- and limits").  Bucket counts are summed by
-- field name first, and names turned into indices once at the end: a
-- window holds far more fields than distinct buckets.
local n, sum, mn, mx, zeros = 0, 0, nil, nil, 0
local byname = {}
for s = lo, hi do
  if s >= 0 then
    local k = KEYS[1] .. ':' .. string.format('%d', s)
    local h = redis.call('HGETALL', k)
    local sn, ss, slo, shi, sw
    for j = 1, #h, 2 do
      local name = h[j]
      local b = string.byte(name)
      if b == 112 or b == 109 then        -- 'p<i>', 'm<i>'
        byname[name] = (byname[name] or 0) + tonumber(h[j + 1])
      elseif name == 'n' then
        sn = tonumber(h[j + 1])
      elseif name == 's' then
        ss = tonumber(h[j + 1])
      elseif name == 'lo' then
        slo = tonumber(h[j + 1])
      elseif name == 'hi' then
        shi = tonumber(h[j + 1])
      elseif name == 'z' then
        zeros = zeros + tonumber(h[j + 1])
      elseif name == 'w' then
        sw = tonumber(h[j + 1])
      end
    end
    if sn and (sw == nil or sw < W) then
      redis.call('PEXPIRE', k, (s + 1) * R + W - now)
      redis.call('HSET', k, 'w', W)
    end
    if sn then
      if n == 0 or slo < mn then mn = slo end
      if n == 0 or shi > mx then mx = shi end
      n = n + sn
      sum = sat(sum + ss)
    end
  end
end
local pos, neg = {}, {}
for name, c in pairs(byname) do
  local i = tonumber(string.sub(name, 2))
  if string.byte(name) == 112 then
    pos[i] = c
  else
    neg[i] = c
  end
end

if n == 0 then
  return {'0'}
end

-- One sign's buckets as a sorted list of indices, folded to the MAXB
-- highest (the counts of the lower ones go to the lowest kept).
local function sorted(set)
  local idx = {}
  for i in pairs(set) do
    idx[#idx + 1] = i
  end
  table.sort(idx)
  if #idx > MAXB then
    local first = #idx - MAXB + 1
    local extra = 0
    for j = 1, first - 1 do
      extra = extra + set[idx[j]]
    end
    set[idx[first]] = set[idx[first]] + extra
    local kept = {}
    for j = first, #idx do
      kept[#kept + 1] = idx[j]
    end
    idx = kept
  end
  return idx
end

local pidx = sorted(pos)
local nidx = sorted(neg)

local function clamp(x)
  if x < mn then return mn end
  if x > mx then return mx end
  return x
end

local function bucket_value(i)
  return 2 * gamma ^ i / (gamma + 1)
end

local function quantile(q)
  if q <= 0 then return mn end
  if q >= 1 then return mx end
  local rank = math.floor(q * (n - 1))
  local seen = 0
  for j = #nidx, 1, -1 do
    seen = seen + neg[nidx[j]]
    if seen > rank then
      return clamp(-bucket_value(nidx[j]))
    end
  end
  seen = seen + zeros
  if seen > rank then
    return 0
  end
  for j = 1, #pidx do
    seen = seen + pos[pidx[j]]
    if seen > rank then
      return clamp(bucket_value(pidx[j]))
    end
  end
  return mx
end

local out = {string.format('%d', n), num(sum), num(mn), num(mx)}
for j = 6, #ARGV do
  out[#out + 1] = num(quantile(tonumber(ARGV[j])))
end
return out
