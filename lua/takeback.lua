-- takeback.lua - take back exactly the units one request recorded, on Redis
-- Cluster, when another slot denied that request (docs/scale.md).
--
-- The rules of one request usually live in different slots, and one script
-- can only touch the keys of one slot, so such a request is decided by one
-- lua/ratelimit.lua call per slot.  When any slot denies, the slots that
-- recorded run this script, so that a denied request leaves nothing behind
-- once it is answered.  docs/algorithms.md, "Taking a request back", is the
-- spec; each algorithm below follows it.  Only this request's units go:
-- what other requests recorded since stays, in its place.
--
-- KEYS[i]  the key of a check that recorded (all of one slot).
-- ARGV     five values per key: algorithm (as ratelimit.lua, 4 for
--          concurrency), limit L, window_ms, cost c (> 0), and the mark
--          ratelimit.lua returned for it (where the units were recorded;
--          for concurrency, the lease's token); then, optionally, the
--          release channel ("<key_prefix>released").
-- Reply    the number of keys from which units were taken back (a key
--          whose units expired meanwhile has nothing left to take).
--
-- With the channel, each key of another algorithm than concurrency is
-- PUBLISHed on it too, followed by one NUL byte, so that every daemon
-- forgets the denials of it that it learnt while our units were held
-- (docs/algorithms.md, "Taking a request back").  No key and no override
-- hash name ends in a NUL byte; a daemon that does not know the notice
-- takes it for the name of an override hash of no rule, and ignores it.

local function int(x)
  return string.format('%d', x)
end

local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000000 + tonumber(time[2])

-- sliding_log: the run at time `mark` loses c units; the runs after it
-- were numbered after ours, so their ends move down by c as well.  Units
-- of the older layout ("T.n", written by an older daemon during a rolling
-- upgrade: docs/algorithms.md, sliding_log) have no number and stay.
local function sliding_log(key, L, W, c, mark)
  local at = redis.call('ZRANGEBYSCORE', key, mark, mark)
  if #at ~= 1 then
    return 0
  end
  local e, n = string.match(at[1], '^(%d+):(%d+)$')
  e, n = tonumber(e), tonumber(n)
  if e == nil or n < c then
    return 0
  end
  local later = redis.call('ZRANGEBYSCORE', key, '(' .. mark, '+inf',
    'WITHSCORES')
  -- Each new member is added before the old one goes (no two are the
  -- same: their ends differ), so that the key is never empty, which
  -- would drop it and its TTL (a record renews that TTL only once per
  -- eighth of W: docs/algorithms.md, sliding_log).
  if n > c then
    redis.call('ZADD', key, mark, int(e - c) .. ':' .. int(n - c))
  end
  redis.call('ZREM', key, at[1])
  for i = 1, #later, 2 do
    local le, ln = string.match(later[i], '^(%d+):(%d+)$')
    if le ~= nil then
      redis.call('ZADD', key, later[i + 1],
        int(tonumber(le) - c) .. ':' .. ln)
      redis.call('ZREM', key, later[i])
    end
  end
  if redis.call('ZCARD', key) == 0 then
    redis.call('DEL', key)
  end
  return 1
end

-- fixed_window: the count of the window that started at `mark`, if that
-- window is still the key's.
local function fixed_window(key, L, W, c, mark)
  local r = redis.call('HMGET', key, 's', 'n')
  if r[1] ~= mark or tonumber(r[2]) == nil then
    return 0
  end
  local n = tonumber(r[2]) - c
  if n <= 0 then
    redis.call('DEL', key)
  else
    redis.call('HSET', key, 'n', int(n))
  end
  return 1
end

-- sliding_window: the bucket numbered `mark`.
local function sliding_window(key, L, W, c, mark)
  local v = tonumber(redis.call('HGET', key, mark))
  if v == nil then
    return 0
  end
  if v <= c then
    redis.call('HDEL', key, mark)
    if redis.call('HLEN', key) == 0 then
      redis.call('DEL', key)
    end
  else
    redis.call('HSET', key, mark, int(v - c))
  end
  return 1
end

-- token_bucket: our call moved tat to `mark` = X by inc = c*W/L.  Later
-- calls built on it; of our inc, at most X - now can still be in tat (the
-- rest has drained), so tat moves back by min(inc, X - now): exact when no
-- call came after ours, and never more than ours otherwise.
local function token_bucket(key, L, W, c, mark)
  local tat = tonumber(redis.call('GET', key))
  local x = tonumber(mark)
  if tat == nil or x == nil then
    return 0
  end
  local d = math.min(c * W / L, x - now)
  if d <= 0 then
    return 0
  end
  redis.call('SET', key, string.format('%.17g', tat - d), 'KEEPTTL')
  return 1
end

-- concurrency (ratelimit.lua's layout): the lease whose token is `mark`
-- goes, and its c units with it.  That is a release: the key is
-- PUBLISHed on the release channel when the call gave one (as lease.lua
-- does), so that requests waiting for a lease of it try again.
local channel
local function concurrency(key, L, W, c, mark)
  if redis.call('ZREM', key, mark .. ':' .. int(c)) == 0 then
    return 0
  end
  local used = -(tonumber(redis.call('ZSCORE', key, '#used')) or 0) - c
  if used <= 0 or redis.call('ZCARD', key) <= 1 then
    redis.call('DEL', key)
  else
    redis.call('ZADD', key, int(-used), '#used')
  end
  if channel ~= nil then
    pcall(redis.call, 'PUBLISH', channel, key)
  end
  return 1
end

local ALGORITHMS = {
  [0] = sliding_log, [1] = sliding_window, [2] = fixed_window,
  [3] = token_bucket, [4] = concurrency
}

if #ARGV == 5 * #KEYS + 1 then
  channel = ARGV[#ARGV]
elseif #ARGV ~= 5 * #KEYS then
  return redis.error_reply('takeback.lua: need 5 ARGV per key, then ' ..
    'the release channel or nothing')
end
local done = 0
for k = 1, #KEYS do
  local a = (k - 1) * 5
  local alg = ALGORITHMS[tonumber(ARGV[a + 1])]
  local L, wms = tonumber(ARGV[a + 2]), tonumber(ARGV[a + 3])
  local c, mark = tonumber(ARGV[a + 4]), ARGV[a + 5]
  if alg == nil or L == nil or wms == nil or c == nil or L < 1 or
      wms < 1 or c < 1 then
    return redis.error_reply('takeback.lua: bad arguments for key ' .. k)
  end
  -- A key of another type (a reload changed the rule) has none of our
  -- units: WRONGTYPE is taken as "nothing to take back".  Any other
  -- error (out of memory, say) fails the call, so that the daemon counts
  -- the take-back as failed.
  local ok, r = pcall(alg, KEYS[k], L, wms * 1000, c, mark)
  if ok then
    done = done + r
    if channel ~= nil and alg ~= concurrency then
      -- Whether or not units were left to take: a denial learnt while
      -- they were held may be stale either way.
      pcall(redis.call, 'PUBLISH', channel, KEYS[k] .. '\0')
    end
  else
    local msg = type(r) == 'table' and r.err or tostring(r)
    if string.find(msg, 'WRONGTYPE', 1, true) == nil then
      return redis.error_reply('takeback.lua: key ' .. k .. ': ' .. msg)
    end
  end
end
return done
