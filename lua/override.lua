-- override.lua - limits per key (docs/admin.md), on Redis.
--
-- KEYS[1]  "<key_prefix>override:<rule>": a hash of one rule's overrides,
--          field = the rendered key, value = "<limit> <window_ms>
--          <expires_at_ms>" (window 0: the rule's, whatever it is when a
--          decision asks; expiry 0: never), the expiry on the server's
--          clock.
-- ARGV     'set', field, '<limit> <window_ms>', ttl_ms (0: none), channel
--          'del', field, channel
--          'undo', field, previous ('': none), value, channel
--          'drop', field, value, field, value, ... (at most a batch)
-- Reply    set: {previous, value}, what the field held before (nil:
--          nothing) and the value it holds now; del: 1 if the field was
--          there and not expired, else 0; undo: 1 if it put the field
--          back, else 0; drop: how many fields were dropped.  A daemon
--          reads the hash in pages with HSCAN (no script) and skips
--          expired fields.
--
-- set, del and undo touch the one field they name, whatever the size of
-- the hash, and PUBLISH KEYS[1] on channel ("<key_prefix>released", which
-- every daemon hears: a name that ends in no '}' is no lease key), so
-- that every daemon reads the rule's overrides again (undo only when it
-- changed the field).  undo takes back a set whose daemon refused it
-- after the write (its table filled in between, docs/admin.md): the
-- field gets back what set answered it held before (its expiry with it,
-- as it was), or goes when it held nothing, but only while it still
-- holds the value that set wrote: a write since, of any daemon, stays.
-- Expired fields are dropped by drop, which a daemon sends with the
-- fields its read of the hash found expired: each goes only if it still
-- holds the value read (a field set again since keeps its new value) and
-- is expired by this server's clock too.  A hash left empty is gone
-- (Redis deletes it).

local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
local key, op = KEYS[1], ARGV[1]

local function expired(v)
  local e = tonumber(string.match(v, '^%d+ %d+ (%d+)$'))
  return e == nil or (e > 0 and e <= now)
end

local reply = 0
if op == 'set' then
  local ttl = tonumber(ARGV[4])
  if ttl == nil or string.match(ARGV[3], '^%d+ %d+$') == nil then
    return redis.error_reply('override.lua: bad set arguments')
  end
  local e = 0
  if ttl > 0 then
    e = now + ttl
  end
  local v = ARGV[3] .. ' ' .. string.format('%d', e)
  reply = { redis.call('HGET', key, ARGV[2]), v }
  redis.call('HSET', key, ARGV[2], v)
elseif op == 'del' then
  -- A field past its expiry is no override (docs/admin.md): dropped all
  -- the same, but not found, as on the memory store.
  local v = redis.call('HGET', key, ARGV[2])
  if v then
    redis.call('HDEL', key, ARGV[2])
    if not expired(v) then
      reply = 1
    end
  end
elseif op == 'undo' then
  local previous, written = ARGV[3], ARGV[4]
  if redis.call('HGET', key, ARGV[2]) ~= written or previous == written then
    return 0
  end
  if previous == '' then
    redis.call('HDEL', key, ARGV[2])
  else
    redis.call('HSET', key, ARGV[2], previous)
  end
  reply = 1
elseif op == 'drop' then
  local n = 0
  for i = 2, #ARGV - 1, 2 do
    local v = redis.call('HGET', key, ARGV[i])
    if v == ARGV[i + 1] and expired(v) then
      redis.call('HDEL', key, ARGV[i])
      n = n + 1
    end
  end
  return n
else
  return redis.error_reply('override.lua: unknown op')
end
-- A PUBLISH the ACL user may not make (no &<key_prefix>released) is
-- skipped: the hash is written all the same, and other daemons read it
-- again at their periodic read (docs/admin.md).
pcall(redis.call, 'PUBLISH', ARGV[#ARGV], key)
return reply
