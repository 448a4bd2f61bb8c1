-- lease.lua - release or renew one lease of a concurrency rule on Redis
-- (docs/leases.md: POST /release, POST /renew).
--
-- The Redis half of limiter_lease_release() and limiter_lease_renew() in
-- src/core/limiter_concurrency.c; the key's layout is ratelimit.lua's
-- (concurrency): members "<token>:<cost>" scored by expiry in
-- microseconds, and '#used' scored by minus the units held.  Only the
-- token finds a lease: a wrong token, or a lease already expired or
-- released, is "not held" and changes nothing.
--
-- KEYS[1]  the rule's key, "<prefix><rule>:{<key>}".
-- ARGV     'release' or 'renew', the token, the lease's cost, (renew)
--          the rule's window_ms, and (release, optional) the channel on
--          which to PUBLISH the key once a lease is freed, so that every
--          daemon's waiters for it try again (docs/leases.md with wait_ms).
-- Reply    an integer: 0 when the lease is not held; else 1 (release) or
--          the lease's new lifetime in milliseconds, window_ms (renew).

local function int(x)
  return string.format('%d', x)
end

local key, op, token = KEYS[1], ARGV[1], ARGV[2]
local c, wms = tonumber(ARGV[3]), tonumber(ARGV[4] or '0')
if (op ~= 'release' and op ~= 'renew') or c == nil or c < 1 or
    string.match(token or '', '^%x+$') == nil or
    (op == 'renew' and (wms == nil or wms < 1)) then
  return redis.error_reply('lease.lua: bad arguments')
end
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000000 + tonumber(time[2])
local member = token .. ':' .. int(c)

-- Another type under the key (a reload changed the rule) holds no lease.
local ok, score = pcall(redis.call, 'ZSCORE', key, member)
if not ok or not score or tonumber(score) <= now then
  return 0
end
if op == 'release' then
  redis.call('ZREM', key, member)
  local used = -(tonumber(redis.call('ZSCORE', key, '#used')) or 0) - c
  if used <= 0 or redis.call('ZCARD', key) <= 1 then
    redis.call('DEL', key)
  else
    redis.call('ZADD', key, int(-used), '#used')
  end
  if ARGV[5] and ARGV[5] ~= '' then
    -- A user whose ACL forbids the channel still releases; waiters on
    -- other daemons then learn of it only at the lease's expiry.
    pcall(redis.call, 'PUBLISH', ARGV[5], key)
  end
  return 1
end
redis.call('ZADD', key, 'XX', int(now + wms * 1000), member)
local newest = redis.call('ZRANGE', key, '-1', '-1', 'WITHSCORES')
redis.call('PEXPIRE', key,
  int(math.max(1, math.floor((tonumber(newest[2]) - now + 999) / 1000))))
return wms
