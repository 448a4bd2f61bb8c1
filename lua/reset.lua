-- reset.lua - an admin reset of one key's counters (docs/admin.md), on
-- Redis.
--
-- KEYS[1]  the store key, "<key_prefix><rule>:{<key>}".
-- ARGV[1]  the release channel, "<key_prefix>released".
-- Reply    1 if the key was there, else 0.
--
-- The key is dropped whatever its rule's algorithm.  When it was there,
-- its name is PUBLISHed on the release channel, as a lease's release is
-- (lua/lease.lua): a concurrency key's leases went with it, and requests
-- waiting for one, on every daemon, try again at once (docs/leases.md).
-- A daemon with no waiter on that key ignores it.  A PUBLISH the ACL
-- refuses is ignored: the waiters then try again when their wait says.

local n = redis.call('DEL', KEYS[1])
if n > 0 then
  pcall(redis.call, 'PUBLISH', ARGV[1], KEYS[1])
end
return n
