-- ratelimit.lua - every rule of one request, evaluated atomically on Redis.
--
-- This is the Redis half of docs/algorithms.md; src/core/limiter.c is the C half.
-- Both follow that page to the letter, including the order of the double
-- arithmetic, so that a request gets the same answer from either store.
-- backend_redis.c loads the script with SCRIPT LOAD and runs it with EVALSHA.
--
-- One call carries one request or several (a batch); each request is
-- evaluated on its own, all-or-nothing, in order.
--
-- KEYS[i]  the full key of check i: "<prefix><rule>:{<key>}", untouched.
--          The checks of request 1 come first, then those of request 2...
-- ARGV     for a batch of R requests: R, then the number of checks of each
--          request (R values, each >= 1), then five values per check;
--          for one request the count may be left out: just five values per
--          check, in KEYS order; and when every request has the same
--          checks (a batch of one rule, the common one, or of one set of
--          rules): 'same', their count C, and five values per check of one
--          request, which stand for every request's; KEYS then hold C keys
--          per request.  That form is only for checks that log_single()
--          or lean_request() take (below): one sliding_log check, or
--          several of sliding_log, fixed_window and token_bucket on keys
--          that differ, none shadow.  The five values:
--            algorithm  0 sliding_log, 1 sliding_window, 2 fixed_window,
--                       3 token_bucket (enum rl_algorithm); '4:<token>'
--                       concurrency, with the new lease's token; '4'
--                       alone a look at it that takes no lease and is
--                       denied (a request queued behind others that
--                       wait for a lease: docs/leases.md)
--            limit      L >= 1
--            window_ms  >= 1
--            cost       0 <= c <= L
--            shadow     0 or 1
--          A first ARGV 'marks' (before R, 'same' or the checks) asks
--          for marks: see the reply; then (or first) 'chunks' adds two
--          fields per check to the reply (taken, valid_us).  An
--          algorithm written '<alg>+<want>+<hold_us>' takes a chunk of
--          up to want units when it records (docs/algorithms.md,
--          "Taking quota in advance"); it needs 'chunks'.  A request's count may be written
--          '<count>:<wait_us>': when denied now, it waits for its turn
--          (docs/algorithms.md, "Waiting for a turn"): its units are
--          recorded at the earliest time within wait_us at which every
--          non-shadow check fits, if there is one.  Written '<count>:r'
--          it is a report (POST /report; docs/algorithms.md, "Usage
--          reported after the fact"): every check records c, even past
--          the limit (c may then exceed L), and nothing is denied; a
--          report carries no concurrency check.
-- Reply    a flat array of integers, per request in order:
--            all_allowed (1 + the microseconds until its reserved time
--            when it waits), then per check: allowed, remaining, reset_ms,
--            retry_after_ms (for a report: overdrawn, the units used
--            past the limit), effective_ms (the RateLimit header's t:
--            docs/algorithms.md, "Common ground"); with 'marks', a sixth
--            field per check, a
--            string: where the check's units were recorded ('0' when it
--            recorded nothing), which lua/takeback.lua needs to take
--            exactly those units back (Redis Cluster, across slots:
--            docs/algorithms.md, "Taking a request back").
--
-- Per request, phase 1 checks every rule and records nothing (dropping
-- expired state is allowed).  Phase 2 runs only if every non-shadow check
-- of the request allows, and then records the cost of each check that
-- allows and has c > 0.  Only recorded keys get a new TTL (a sliding_log
-- key only from the first record in each eighth of its window: log_renew);
-- keys that are only read keep theirs.
--
-- Time is the server's: TIME, in microseconds.  Calling TIME before writing
-- needs effects replication, the default since Redis 5 and the only mode
-- since 7, so no redis.replicate_commands() is called: the target is Redis
-- >= 6.2.  Microsecond epochs (~1.7e15) are exact in Lua's doubles (< 2^53),
-- but Lua's tostring() (and ..) would print them with 14 digits, so every
-- number that goes into a string is formatted explicitly; a number passed
-- as an argument of redis.call (a score, a TTL) is converted by Redis
-- itself, exactly (%.17g, or the shortest form that reads back the same).
--
-- A key holding the wrong type (the rule's algorithm changed on a reload)
-- is deleted and the rule starts fresh: the first command on each key runs
-- under redis.pcall, so this costs nothing on the common path.  So is a
-- sorted set that sliding_log cannot read (concurrency's leases share the
-- type): log_read() looks at its two ends anyway.

local B = 20            -- sliding_window buckets per window
-- Reports may record past L (docs/algorithms.md, "Usage reported after the
-- fact"): a token_bucket tat runs at most MAX_AHEAD microseconds after the
-- time it is recorded at, and overdrawn is at most MAX_UNITS, so that every
-- time difference stays exact in a double and every TTL and reply fits
-- Redis's integers.  The same as src/core/limiter.h.
local MAX_AHEAD, MAX_UNITS = 2^52, 2^53
local floor, max, min, fmt = math.floor, math.max, math.min, string.format

local function ceil_ms(x)
  if x <= 0 then
    return 0
  end
  return floor((x + 999) / 1000)
end

local function int(x)
  return fmt('%d', x)
end

-- Run a read on key; on WRONGTYPE drop the key and run it again.
local function first(cmd, key, ...)
  local r = redis.pcall(cmd, key, ...)
  if type(r) == 'table' and r.err then
    if string.find(r.err, 'WRONGTYPE', 1, true) == nil then
      error(r)
    end
    redis.call('DEL', key)
    r = redis.call(cmd, key, ...)
  end
  return r
end

-- Each algorithm has three steps on a check table `s` (key, L, W, c, now):
-- check (phase 1: sets s.allowed, and s.retry when denied), record (phase 2,
-- only when recording) and finish (sets s.remaining and s.reset, and gives
-- recorded keys their TTL).  s.recorded tells whether record ran.  Then
-- effective(s) gives the effective window: the retry a request of
-- remaining + 1 units would get, from the state after the call.

-- sliding_log: a sorted set of runs, one member per recorded time.
--
-- A run is the units recorded at one time T (the score, in microseconds):
-- one call's c units, or those of several calls of one batch (they share
-- the script's clock).  Its member is "<end>:<n>": n its units, and end =
-- the units admitted on the key so far, this run included (1, 2, ... while
-- the key lives).  Records are made at max(now, newest), so scores, and
-- ends with them, only grow: a record at the newest run's time replaces
-- that member by a merged one, so no two members share a score, and ranks
-- follow time and end alike.  Then the units in the log are the ones
-- numbered first .. newest_end with first = oldest_end - oldest_n + 1, and
-- every step reads at most a few members, whatever the cost: the work of
-- one call is O(log runs).
-- A key written before runs (members "T.n", one per unit), or one where
-- both layouts meet during a rolling upgrade, is rewritten in runs, each
-- unit at its own time (log_convert; only the older units at its newest end:
-- log_convert_top).
local sliding_log = {}

-- A run's member: its end and n, or nil when m is not a valid run.  A
-- member "<end>:0" (no writer of this version makes one: a member from
-- outside) is not: it is counted as one unit, as any member that is not a
-- run (log_convert), so that no key converts into itself again.
local function log_member(m)
  local e, n = string.match(m, '^(%d+):(%d+)$')
  n = tonumber(n)
  if n == nil or n < 1 then
    return nil
  end
  return tonumber(e), n
end

-- What one call knows of a sliding_log key, so that the next check of
-- the key in the same call (a batch's requests often share keys) reads
-- nothing: logs[key] = {W, v, first, first_t, last_end, last_n, last_t,
-- last_ts}, its runs after dropping those expired at now for window W
-- (first nil when none is left), kept up to date by record; v counts the
-- records, last_ts is last_t as a string that reads back exactly (the
-- score as Redis wrote it, or as a record gave it).
-- The clock is the call's, so nothing else expires meanwhile.  A check of
-- another algorithm on the key forgets it (forget()).  The TTL a record
-- gives the key is set once, when the call ends: ttls[key] is the one
-- computed, and the key is not read for its TTL in between (a new key's
-- is set at once: log_renew).
local logs, ttls = {}, {}

-- What one call wrote to a token_bucket key (a batch's requests often
-- share one: a rule without a key): tats[key] is the tat last written and
-- tat_ttls[key] its TTL in milliseconds (a string only for the SET).  The
-- SET is made once, when the call ends, or before a check of another
-- algorithm reads the key (tat_flush); a token_bucket check of the key
-- reads tats[key] instead of GET, which is exact: the SET writes it with
-- %.17g, which reads back bit for bit, and no key expires during a call.
-- Only the key's expiry moves, by the time between the record and the
-- end of the call, as for sliding_log.
-- Both are made by the first record (most calls have none: the tables
-- would cost the common call more than the check).
local tats, tat_ttls = nil, nil

local function tat_flush(key)
  local tat = tats and tats[key]
  if tat ~= nil then
    redis.call('SET', key, fmt('%.17g', tat), 'PX', int(tat_ttls[key]))
    tats[key], tat_ttls[key] = nil, nil
  end
end

-- Before a check of another algorithm than sliding_log reads key: drop
-- what the call knows of it as a sliding_log key, and give it the TTL a
-- record computed; and, unless the check is token_bucket's (keep_tat),
-- write its pending tat.
local function forget(key, keep_tat)
  logs[key] = nil
  local ttl = ttls[key]
  if ttl ~= nil then
    redis.call('PEXPIRE', key, ttl)
    ttls[key] = nil
  end
  if not keep_tat and tats ~= nil then
    tat_flush(key)
  end
end

-- An integer (a TTL in milliseconds, a cost) as the argument Redis would
-- make of the number (its digits), made once per value in a call: Redis
-- formats a number argument with %.17g, and int() costs more than this
-- lookup.
local int_strings = {}
local function int_arg(x)
  local a = int_strings[x]
  if a == nil then
    a = int(x)
    int_strings[x] = a
  end
  return a
end

-- sliding_log's TTL (docs/algorithms.md, sliding_log): a key expires at
-- the end of the eighth of W (E = floor(W / 8), counted from the epoch)
-- that holds its newest run, plus W.  A record at t into a key whose
-- newest run was at prev (nil: none) renews it only when t falls in a
-- later eighth: then ttls[key] gets the new TTL, unless the call has set
-- a longer one already.  Between renewals the key's TTL covers t + W, so
-- most records of a busy key send no PEXPIRE.
-- A record that makes a new key (prev nil) sets its TTL at once instead:
-- deferred to the end of the call, an error later in the call (a Redis
-- command that fails) would leave the key without one, for ever.  Only a
-- key's first record pays for it.
local function log_renew(key, t, prev, W, now)
  local E = floor(W / 8)
  local s = t - math.fmod(t, E)
  if prev ~= nil and prev >= s then
    return
  end
  local ttl = max(1, ceil_ms(s + E + W - now))
  local old = ttls[key]
  if prev == nil then
    if old ~= nil and tonumber(old) > ttl then
      ttl = tonumber(old)
    end
    redis.call('PEXPIRE', key, int_arg(ttl))
    ttls[key] = nil
  elseif old == nil or tonumber(old) < ttl then
    ttls[key] = int_arg(ttl)
  end
end

-- Whether m, a member that is not a valid run, is one unit of a
-- sliding_log key: a unit of the older layout "T.n", or a member shaped as
-- a run with n = 0.  Another algorithm's member is not (log_read then
-- starts afresh).
local function log_unit(m)
  return string.find(m, '^%d+%.%d+$') ~= nil or
    string.find(m, '^%d+:%d+$') ~= nil
end

-- Rewrite key in runs (docs/algorithms.md, sliding_log, "The older
-- layout"): a key of the older layout, or one where both layouts meet
-- during a rolling upgrade.  Its members in score order, those of one time
-- become one run of their units (a run counts its n, any other member
-- one: a time always makes a run of n >= 1), at that time, ends counted
-- from 1; members that left the window at now are dropped.  Every unit
-- keeps its time, so the key admits exactly as many as before, and its
-- units leave when they would have.  Reads and writes every member:
-- O(members), paid by a call that finds a member that is not a run at the
-- key's oldest end (once per key) or between its runs (log_time_of); older
-- units at the newest end only are log_convert_top's.  The key, new, gets
-- its TTL right after the first chunk (log_renew).  Returns what log_read
-- would, and makes it the call's logs[key].
local function log_convert(key, W, now)
  local k = {W = W, v = 0, first = nil, first_t = nil, last_end = 0,
    last_n = 0, last_t = nil, last_ts = nil}
  local out, e, i = {}, 0, 0
  local gt, gts, gn = nil, nil, 0 -- the time being counted
  local function run_done()
    if gt ~= nil then
      e = e + gn
      out[#out + 1], out[#out + 2] = gts, fmt('%d:%d', e, gn)
      if k.first == nil then
        k.first, k.first_t = e - gn + 1, gt
      end
      k.last_end, k.last_n, k.last_t, k.last_ts = e, gn, gt, gts
    end
  end
  local r
  repeat
    r = redis.call('ZRANGE', key, int(i), int(i + 999), 'WITHSCORES')
    for j = 1, #r, 2 do
      local t = tonumber(r[j + 1])
      if t > now - W then
        if t ~= gt then
          run_done()
          gt, gts, gn = t, r[j + 1], 0
        end
        local _, n = log_member(r[j])
        gn = gn + (n or 1)
      end
    end
    i = i + 1000
  until #r < 2000
  run_done()
  redis.call('DEL', key)
  for j = 1, #out, 2000 do
    redis.call('ZADD', key, unpack(out, j, min(j + 1999, #out)))
    if j == 1 then
      -- The TTL right after the first chunk: a later command that failed
      -- would leave the key without one.
      log_renew(key, k.last_t, nil, W, now)
    end
  end
  logs[key] = k
  return k
end

-- Rewrite the top of key in runs (docs/algorithms.md, sliding_log, "The
-- older layout"): the members above its newest run, which an older daemon
-- recorded at its now (the usual case during a rolling upgrade: its units
-- land at the key's newest end, above this version's runs).  They are
-- read from the top down a page at a time, down to the first run R (the
-- oldest member, a run (oe, on) at time ot, stops it at worst); those of
-- one time become one run of their units (any member that is not a run
-- counts one) at that time, its end continuing from R's (units at R's own
-- time merge into R).  The new runs are added before the older members
-- are removed, so that the key never empties, and the key gets the TTL a
-- record at the newest of those times gives a new key, right after the
-- first chunk.  O(members above R): the runs below are not read.  Returns
-- what log_read would, and makes it the call's logs[key].
local function log_convert_top(key, W, now, oe, on, ot)
  local above, i, P = {}, 0, 16 -- members above R, newest first
  local re, rn, rt, rts, rm
  while re == nil do
    local r = redis.call('ZRANGE', key, int(-(i + P)), int(-(i + 1)),
      'WITHSCORES')
    for j = #r - 1, 1, -2 do
      re, rn = log_member(r[j])
      if re ~= nil then
        rm, rts, rt = r[j], r[j + 1], tonumber(r[j + 1])
        break
      end
      above[#above + 1], above[#above + 2] = r[j], r[j + 1]
    end
    if #r < 2 * P and re == nil then
      -- The bottom, and no run: cannot be, the oldest is one.
      return log_convert(key, W, now)
    end
    i, P = i + P, 1000
  end
  -- Members of one score sort by their string, so older units at R's
  -- very time may sort below R, where the search stopped: they are of
  -- R's time all the same, and join it.
  local seen = {}
  for j = 1, #above, 2 do
    seen[above[j]] = true
  end
  local at = redis.call('ZRANGEBYSCORE', key, rts, rts)
  for j = 1, #at do
    local m = at[j]
    if m ~= rm and not seen[m] and log_member(m) == nil then
      above[#above + 1], above[#above + 2] = m, rts
    end
  end
  local out, old = {}, {}
  local e = re - rn -- the end before the run being counted
  local gt, gts, gn = rt, rts, rn
  local merged = false
  local function run_done()
    if gt ~= rt or gn ~= rn then
      out[#out + 1], out[#out + 2] = gts, fmt('%d:%d', e + gn, gn)
      merged = merged or gt == rt
    end
    e = e + gn
  end
  for j = #above - 1, 1, -2 do
    local t = tonumber(above[j + 1])
    if t ~= gt then
      run_done()
      gt, gts, gn = t, above[j + 1], 0
    end
    gn = gn + 1
    old[#old + 1] = above[j]
  end
  run_done()
  for j = 1, #out, 2000 do
    redis.call('ZADD', key, unpack(out, j, min(j + 1999, #out)))
    if j == 1 then
      log_renew(key, gt, nil, W, now)
    end
  end
  if merged then
    old[#old + 1] = rm
  end
  for j = 1, #old, 1000 do
    redis.call('ZREM', key, unpack(old, j, min(j + 999, #old)))
  end
  local k = {W = W, v = 0, first = oe - on + 1, first_t = ot, last_end = e,
    last_n = gn, last_t = gt, last_ts = gts}
  logs[key] = k
  return k
end

-- Drop the runs that left the window, then read the oldest and newest.
-- The oldest is read first: when it is still inside, nothing is dropped.
-- It is first()'s read, written out: this is the path every sliding_log
-- check takes, and a reply of ZRANGE is a table either way.
local function log_read(key, now, W)
  if tats ~= nil and tats[key] ~= nil then
    tat_flush(key)
  end
  local old = redis.pcall('ZRANGE', key, '0', '0', 'WITHSCORES')
  if old.err ~= nil then
    old = first('ZRANGE', key, '0', '0', 'WITHSCORES')
  end
  local ot = tonumber(old[2])
  if ot ~= nil and ot <= now - W then
    redis.call('ZREMRANGEBYSCORE', key, '-inf', now - W)
    old = redis.call('ZRANGE', key, '0', '0', 'WITHSCORES')
    ot = tonumber(old[2])
  end
  local k = {W = W, v = 0, first = nil, first_t = nil, last_end = 0,
    last_n = 0, last_t = nil, last_ts = nil}
  if #old > 0 then
    local new = redis.call('ZRANGE', key, '-1', '-1', 'WITHSCORES')
    local e, n = log_member(new[1])
    local t = tonumber(new[2])
    local oe, on = e, n
    if old[1] ~= new[1] then
      oe, on = log_member(old[1])
    end
    if e == nil or oe == nil then
      if not log_unit(e == nil and new[1] or old[1]) then
        -- Neither a run nor a unit of the older layout: another
        -- algorithm's sorted set (concurrency's leases, after a reload
        -- changed the rule's algorithm).  Start fresh, as for a key of
        -- another type.
        redis.call('DEL', key)
        return k
      end
      -- The older layout at an end, runs maybe elsewhere (a rolling
      -- upgrade): every unit counts, at its own time.  Older units at
      -- the newest end only, above runs (an older daemon records at its
      -- now): those alone are rewritten.  Older units at the oldest end:
      -- the whole key, once.
      if oe ~= nil then
        return log_convert_top(key, W, now, oe, on, ot)
      end
      return log_convert(key, W, now)
    end
    k.first, k.first_t = oe - on + 1, ot
    k.last_end, k.last_n, k.last_t, k.last_ts = e, n, t, new[2]
  end
  return k
end

-- The time of the run holding unit number `want` (runs sorted by end), of
-- a key whose runs, read from its two ends, hold `units` (used) numbered
-- from fst, and whose window is W.  Members of the older layout between
-- the two ends (a rolling upgrade: older daemons record at now, under
-- runs reserved later) have no number and are not in units: when the
-- search meets a member that is not a run, or there are more members than
-- units, which runs alone cannot be, the key is rewritten in runs at once
-- (log_convert), and the time is that of the unit as many places after
-- want's as the conversion found units more: the one the caller's answer
-- needs with every unit counted (want is the k-th unit to leave, k grows
-- with used).  Returns the time, and the key's new logs entry when it was
-- converted (the caller then reads its state from it, so that nothing
-- later in the call counts from the runs alone).  A search converts at most
-- once (again: the search of the converted key): a converted key holds
-- valid runs only, and should it still not read as runs, the time is the
-- newest member's, which only waits longer; no member can make it recurse.
local function log_time_of(key, want, units, fst, W, now, again)
  local lo, hi = 0, redis.call('ZCARD', key) - 1
  local runs = hi < units
  while runs and lo < hi do
    local mid = floor((lo + hi) / 2)
    local e = log_member(redis.call('ZRANGE', key, int(mid), int(mid))[1])
    if e == nil then
      runs = false
    elseif e >= want then
      hi = mid
    else
      lo = mid + 1
    end
  end
  if not runs and again then
    return tonumber(redis.call('ZRANGE', key, '-1', '-1', 'WITHSCORES')[2])
      or now
  elseif not runs then
    local k = log_convert(key, W, now)
    if k.first == nil then -- nothing left in the window
      return now - W, k
    end
    local used = k.last_end - k.first + 1
    local t = log_time_of(key, k.first + (want - fst) + (used - units), used,
      k.first, W, now, true)
    return t, k
  end
  return tonumber(redis.call('ZRANGE', key, int(lo), int(lo),
    'WITHSCORES')[2])
end

-- The common request, fast: one sliding_log check, not shadow, that neither
-- waits nor is a report nor takes a chunk (the main loop picks them).  It
-- is sliding_log's check, record, finish and effective (the general path,
-- below) and request()'s reply, written out for that one case with locals
-- instead of a check table: the same steps on the same values in the same
-- order, so it gives exactly what the general path gives
-- (tests/integration/check_batch_merge.c and the vectors hold both to it).
-- Appends all_allowed and the fields of the check to reply, and returns
-- whether it allowed.
local function log_single(key, L, W, c, now, now_s, reply, marks, chunks)
  local k = logs[key]
  if k == nil or k.W ~= W then
    k = log_read(key, now, W)
    logs[key] = k
  end
  local fst, fst_t, last_t = k.first, k.first_t, k.last_t
  local used = 0
  if fst ~= nil then
    used = k.last_end - fst + 1
  end
  local allowed = used + c <= L
  local retry, mark = 0, '0'
  if not allowed then
    local t, conv = log_time_of(key, fst + (used + c - L) - 1, used, fst, W,
      now)
    retry = floor(ceil_ms(t + W - now))
    if conv ~= nil then
      -- Converted: every unit counts from here on (log_time_of).
      k, fst, fst_t, last_t, used = conv, conv.first, conv.first_t,
        conv.last_t, 0
      if fst ~= nil then
        used = k.last_end - fst + 1
      end
    end
  elseif c > 0 then
    -- record, then finish's TTL.  The score is given as a string that
    -- reads back as t (now_s is now): Redis would format the number t
    -- itself, at a higher cost.
    local t, ts, n, e = now, now_s, c, k.last_end + c
    local merge = last_t ~= nil and last_t >= t
    if merge then
      t, ts, n = last_t, k.last_ts or last_t, k.last_n + c
    end
    redis.call('ZADD', key, ts, fmt('%d:%d', e, n))
    if merge then
      -- After the ZADD: a key left empty would go, and its TTL with it.
      redis.call('ZREM', key, fmt('%d:%d', k.last_end, k.last_n))
    end
    log_renew(key, t, last_t, W, now)
    used, last_t = used + c, t
    if fst == nil then
      k.first, k.first_t = e - n + 1, t
    end
    k.last_end, k.last_n, k.last_t, k.last_ts = e, n, t, ts
    k.v = k.v + 1
    if marks then
      mark = int(t)
    end
  end
  local remaining, reset = max(0, L - used), 0
  if used > 0 then
    reset = ceil_ms(last_t + W - now)
  end
  local eff
  if remaining >= L then
    eff = ceil_ms(W)
  else
    local u = used + remaining + 1 - L
    local t = last_t
    if fst ~= nil then
      t = fst_t
      if u ~= 1 then
        t = log_time_of(key, fst + u - 1, used, fst, W, now)
      end
    end
    eff = floor(ceil_ms(t + W - now))
  end
  local o = #reply
  local a = allowed and 1 or 0
  reply[o + 1], reply[o + 2], reply[o + 3] = a, a, floor(remaining)
  reply[o + 4], reply[o + 5], reply[o + 6] = floor(reset), retry, eff
  o = o + 6
  if marks then
    o = o + 1
    reply[o] = mark
  end
  if chunks then
    reply[o + 1], reply[o + 2] = 0, 0
  end
  return allowed
end

-- Requests of several checks, fast: every check sliding_log, fixed_window
-- or token_bucket, none of them shadow, each on its own key, in a request
-- that neither waits nor is a report nor takes a chunk (the main loop
-- picks them: bench/speed.sh's row (e) is one).  It is request() with
-- those algorithms' check, record, finish and effective (the general path,
-- below) written out, with per-check arrays instead of check tables: the
-- same Redis commands on the same values in the same order (token_bucket's
-- SET deferred alike, see tats), the same double arithmetic, so it gives
-- exactly what the general path gives (tests/integration/check_batch_merge.c
-- holds it to that).  That no key appears twice in the request is what
-- lets a record use the state its check read: nothing else touches the key
-- in between (the general path keeps a copy per check for that case).
-- plain_A[k] is the algorithm (0, 2 or 3), plain_L/W/c[k] L, W in µs and
-- c; between the phases check k keeps allowed in st_ok[k], its retry in
-- st_retry[k] and in st_x, st_y, st_z[k]:
--   sliding_log   the key's logs entry, used, first before the record
--                 (nil: the log was empty)
--   fixed_window  the count n, the start of the window holding it (a
--                 later one: units reserved there), whether the hash is
--                 stale (true), holds now's window under another W ('w':
--                 a record renews its TTL) or holds that later window
--                 ('later')
--   token_bucket  -, base, new_tat
-- (plain_A and the st_ arrays are made by the first such request.)
local plain_L, plain_W, plain_c = {}, {}, {}
local plain_A, st_ok, st_retry, st_x, st_y, st_z
-- The function is made only for a call of several keys (one is needed for
-- a request of several checks): a closure of this many upvalues costs
-- the call of one check more than its test.
local lean_request
if #KEYS > 1 then
  function lean_request(first_k, last_k, now, now_s, reply, marks,
      chunks)
    -- Phase 1: check every rule, record nothing.
    local all = true
    for k = first_k, last_k do
      local a, key, L, W, c = plain_A[k], KEYS[k], plain_L[k], plain_W[k],
        plain_c[k]
      local ok, retry = false, 0
      if a == 0 then
        local lg = logs[key]
        if lg == nil or lg.W ~= W then
          lg = log_read(key, now, W)
          logs[key] = lg
        end
        local fst, used = lg.first, 0
        if fst ~= nil then
          used = lg.last_end - fst + 1
        end
        ok = used + c <= L
        if not ok then
          local t, conv = log_time_of(key, fst + (used + c - L) - 1, used,
            fst, W, now)
          retry = ceil_ms(t + W - now)
          if conv ~= nil then
            -- as in log_single
            lg, fst, used = conv, conv.first, 0
            if fst ~= nil then
              used = lg.last_end - fst + 1
            end
          end
        end
        st_x[k], st_y[k], st_z[k] = lg, used, fst
      elseif a == 2 then
        forget(key)
        -- first()'s read, written out (as in log_read)
        local r = redis.pcall('HMGET', key, 's', 'n', 'w')
        if r.err ~= nil then
          r = first('HMGET', key, 's', 'n', 'w')
        end
        local s_now = now - math.fmod(now, W)
        local st, n = tonumber(r[1]), tonumber(r[2]) or 0
        local stale = false
        if st ~= nil and n > 0 and st > s_now and math.fmod(st, W) == 0 then
          -- Reserved in a later window: c = 0 is allowed (and records
          -- nothing); else the retry is fixed_window.earliest's from now.
          ok = c == 0
          if not ok then
            local t = st
            if c > L - n then
              t = st + W
            end
            retry = ceil_ms(t - now)
          end
          stale = 'later'
        else
          if st ~= s_now then
            n = 0
            stale = true
          elseif tonumber(r[3]) ~= W then
            stale = 'w'
          end
          st = s_now
          ok = n + c <= L
          if not ok then
            retry = ceil_ms(s_now + W - now)
          end
        end
        st_x[k], st_y[k], st_z[k] = n, st, stale
      else
        forget(key, true)
        local tat = tats and tats[key]
        if tat == nil then
          tat = tonumber(first('GET', key))
        end
        if tat ~= nil and (tat ~= tat or tat == math.huge or
            tat == -math.huge) then
          tat = nil
        end
        local inc = c * W / L
        local base = now
        if tat ~= nil and tat > now then
          base = tat
        end
        local new_tat = base + inc
        ok = new_tat - now <= W + 1
        if not ok then
          retry = max(1, ceil_ms(math.ceil(new_tat - W - now)))
        end
        st_y[k], st_z[k] = base, new_tat
      end
      st_ok[k], st_retry[k] = ok, retry
      if not ok then
        all = false
      end
    end

    -- Phase 2: every check allows; record those with c > 0 (token_bucket
    -- records in its finish, below).
    if all then
      for k = first_k, last_k do
        local a, c = plain_A[k], plain_c[k]
        if c > 0 and a == 0 then
          local key, lg = KEYS[k], st_x[k]
          local t, ts, n, e = now, now_s, c, lg.last_end + c
          local last_t = lg.last_t
          local merge = last_t ~= nil and last_t >= t
          if merge then
            t, ts, n = last_t, lg.last_ts or last_t, lg.last_n + c
          end
          redis.call('ZADD', key, ts, fmt('%d:%d', e, n))
          if merge then
            redis.call('ZREM', key, fmt('%d:%d', lg.last_end, lg.last_n))
          end
          log_renew(key, t, last_t, plain_W[k], now)
          if lg.first == nil then
            lg.first, lg.first_t = e - n + 1, t
          end
          lg.last_end, lg.last_n, lg.last_t, lg.last_ts = e, n, t, ts
          lg.v = lg.v + 1
          st_y[k] = st_y[k] + c
        elseif c > 0 and a == 2 then
          local key = KEYS[k]
          if st_z[k] == true then
            redis.call('DEL', key)
            redis.call('HSET', key, 's', int(st_y[k]), 'n', int(c), 'w',
              int_arg(plain_W[k]))
            st_x[k] = c
          else
            redis.call('HINCRBY', key, 'n', int_arg(c))
            st_x[k] = st_x[k] + c
            if st_z[k] == 'w' then
              redis.call('HSET', key, 'w', int_arg(plain_W[k]))
            end
          end
        end
      end
    end

    -- finish and effective, and the reply.
    local o = #reply + 1
    reply[o] = all and 1 or 0
    for k = first_k, last_k do
      local a, key, L, W, c = plain_A[k], KEYS[k], plain_L[k], plain_W[k],
        plain_c[k]
      local ok = st_ok[k]
      local rec = all and c > 0
      local remaining, reset, eff
      local mark = '0'
      if a == 0 then
        local lg, used, fst = st_x[k], st_y[k], st_z[k]
        remaining, reset = max(0, L - used), 0
        if used > 0 then
          reset = ceil_ms(lg.last_t + W - now)
        end
        if rec and marks then
          mark = int(lg.last_t)
        end
        if remaining >= L then
          eff = ceil_ms(W)
        else
          local u = used + remaining + 1 - L
          local t
          if fst == nil then
            t = lg.last_t
          elseif u == 1 then
            t = lg.first_t
          else
            t = log_time_of(key, fst + u - 1, used, fst, W, now)
          end
          eff = ceil_ms(t + W - now)
        end
      elseif a == 2 then
        local n, st = st_x[k], st_y[k]
        local s_now = now - math.fmod(now, W)
        local later = n > 0 and st > s_now
        if later then
          remaining, reset = 0, ceil_ms(st + W - now)
        else
          remaining, reset = max(0, L - n), 0
          if n > 0 then
            reset = ceil_ms(s_now + W - now)
          end
        end
        if rec then
          -- The window's end, set when its hash was made or its W changed
          -- (st_z[k]): a record in a window the hash holds under this W
          -- would set the same time.
          if st_z[k] == true or st_z[k] == 'w' then
            redis.call('PEXPIRE', key,
              int_arg(max(1, ceil_ms(st + W - now))))
          end
          if marks then
            mark = int(st)
          end
        end
        if remaining >= L then
          eff = ceil_ms(W)
        elseif later then
          -- fixed_window.earliest of one unit from now
          local t = st
          if 1 > L - n then
            t = st + W
          end
          eff = ceil_ms(t - now)
        else
          eff = ceil_ms(s_now + W - now)
        end
      else
        local t, new_tat = st_y[k], st_z[k]
        if rec then
          t = new_tat
        end
        local rem = floor((W + 1 - (t - now)) * L / W)
        remaining = min(L, max(0, rem))
        reset = ceil_ms(math.ceil(t - now))
        if rec then
          if tats == nil then
            tats, tat_ttls = {}, {}
          end
          tats[key], tat_ttls[key] = new_tat, max(1, reset)
          if marks then
            mark = fmt('%.17g', new_tat)
          end
        end
        if remaining >= L then
          eff = ceil_ms(W)
        else
          local nt = t + (remaining + 1) * W / L
          eff = max(1, ceil_ms(math.ceil(nt - W - now)))
        end
      end
      reply[o + 1] = ok and 1 or 0
      reply[o + 2] = floor(remaining)
      reply[o + 3] = floor(reset)
      reply[o + 4] = ok and 0 or floor(st_retry[k])
      reply[o + 5] = floor(eff)
      o = o + 5
      if marks then
        o = o + 1
        reply[o] = mark
      end
      if chunks then
        reply[o + 1], reply[o + 2] = 0, 0
        o = o + 2
      end
    end
  end
end

-- The general path: every other request (several checks, shadow, waiting,
-- reports, chunks, the other algorithms).  Its functions are made only
-- for a call that has such a request: a call makes every function it
-- defines, and the common call needs none of these.
local concurrency, algorithm, make_extras, request
local function make_general()
  if request ~= nil then
    return
  end
  -- The state of key k (a logs entry) in check s.
  local function log_load(s, k)
    s.log, s.v = k, k.v
    s.first, s.first_t = k.first, k.first_t
    s.last_end, s.last_n, s.last_t = k.last_end, k.last_n, k.last_t
    s.used = 0
    if k.first ~= nil then
      s.used = k.last_end - k.first + 1
    end
  end

  function sliding_log.check(s)
    local k = logs[s.key]
    if k == nil or k.W ~= s.W then
      k = log_read(s.key, s.now, s.W)
      logs[s.key] = k
    end
    log_load(s, k)
    s.allowed = s.used + s.c <= s.L
    if not s.allowed then
      -- The unit numbered first + k - 1 must expire, k = used + c - L: find
      -- the oldest run whose end reaches it (runs sorted by end and score).
      local t, conv = log_time_of(s.key, s.first + (s.used + s.c - s.L) - 1,
        s.used, s.first, s.W, s.now)
      s.retry = ceil_ms(t + s.W - s.now)
      if conv ~= nil then
        -- Converted: every unit counts from here on (log_time_of).
        log_load(s, conv)
      end
    end
  end

  -- now: the call's time, when s.now is another (record_at).
  function sliding_log.record(s, now)
    -- Never past MAX_UNITS units in the window (only a report gets there).
    local c = min(s.c, MAX_UNITS - s.used)
    if c <= 0 then
      s.mark = '0'
      return
    end
    local t, n = s.now, c
    local merge = s.last_t ~= nil and s.last_t >= t
    if merge then
      -- The newest run's time: merge into it (the new member first, so
      -- that the key, and its TTL, never goes).
      t, n = s.last_t, s.last_n + c
    end
    local e = s.last_end + c
    redis.call('ZADD', s.key, t, fmt('%d:%d', e, n))
    if merge then
      redis.call('ZREM', s.key, fmt('%d:%d', s.last_end, s.last_n))
    end
    s.prev_t = s.last_t -- finish renews the TTL, or not, from it
    if s.last_t == nil then
      -- A new key: its TTL now (log_renew), not in finish.
      log_renew(s.key, t, nil, s.W, now or s.now)
      s.prev_t = t
    end
    s.used = s.used + c
    s.last_t = t
    s.mark = t
    local k = s.log
    if logs[s.key] ~= k or k.v ~= s.v then
      -- The key changed since this check read it (it appears twice in one
      -- request): read it again next time.
      logs[s.key] = nil
    else
      if k.first == nil then
        k.first, k.first_t = e - n + 1, t
      end
      k.last_end, k.last_n, k.last_t, k.last_ts = e, n, t, nil
      k.v = k.v + 1
      s.v = k.v
    end
  end

  -- The unit numbered first + k - 1 leaves, k = used + (remaining + 1) - L:
  -- the oldest (k = 1) unless a reload lowered L below what is used.
  function sliding_log.effective(s)
    local k = s.used + s.remaining + 1 - s.L
    local t
    if s.first == nil then
      t = s.last_t             -- the log was empty: this call's run
    elseif k == 1 then
      t = s.first_t
    else
      t = log_time_of(s.key, s.first + k - 1, s.used, s.first, s.W, s.now)
    end
    return ceil_ms(t + s.W - s.now)
  end

  function sliding_log.finish(s)
    s.remaining = max(0, s.L - s.used)
    s.over = max(0, s.used - s.L)
    s.reset = 0
    if s.used > 0 then
      s.reset = ceil_ms(s.last_t + s.W - s.now)
    end
    if s.recorded then
      log_renew(s.key, s.last_t, s.prev_t, s.W, s.now)
    end
  end

  -- Rules that never wait: now if they admit now, else never.
  local function at_once(s, from)
    if s.allowed and from == s.now then
      return from
    end
    return nil
  end

  -- The other algorithms are made when a call first uses one.
  local fixed_window, token_bucket, sliding_window

  -- fixed_window: a hash {s = window start, n = count, w = the window W it
  -- was counted under}.  The state is the newest window holding units; with
  -- waiting (docs/algorithms.md, "Waiting for a turn") that window may lie
  -- after now's: units reserved there.  The key's TTL is the window's end,
  -- set when a record makes the hash or finds it under another W (a reload
  -- changed the window; w absent: a hash an older version made), which
  -- also writes w: a record in a window the hash holds under the same W
  -- would set the same time.
  local function make_fixed_window()
    fixed_window = {}

    function fixed_window.check(s)
      forget(s.key)
      local r = first('HMGET', s.key, 's', 'n', 'w')
      s.s_now = s.now - math.fmod(s.now, s.W)
      local st, n = tonumber(r[1]), tonumber(r[2]) or 0
      s.n = n
      s.f_w = tonumber(r[3])
      s.stale = false
      if st ~= nil and n > 0 and st > s.s_now and math.fmod(st, s.W) == 0 then
        -- Reserved in a later window: those waiters come first.
        s.f_start, s.f_n = st, n
        s.allowed = s.c == 0
        if not s.allowed then
          s.retry = ceil_ms(fixed_window.earliest(s, s.now) - s.now)
        end
        return
      end
      if st ~= s.s_now then
        s.n = 0
        s.stale = true
      end
      s.f_start, s.f_n = s.s_now, s.n
      s.allowed = s.n + s.c <= s.L
      if not s.allowed then
        s.retry = ceil_ms(s.s_now + s.W - s.now)
      end
    end

    -- The earliest t >= from at which c fits: not before the newest window
    -- holding units; there if its count leaves room, else the next window.
    function fixed_window.earliest(s, from)
      local st, n, t = s.f_start, s.f_n, from
      if n == 0 then
        return t
      end
      if st > t - math.fmod(t, s.W) then
        t = st
      end
      if t - math.fmod(t, s.W) ~= st or s.c <= s.L - n then
        return t
      end
      return st + s.W
    end

    function fixed_window.record_at(s, t)
      local st = t - math.fmod(t, s.W)
      if s.stale or st ~= s.f_start then
        -- A past window, another algorithm's hash, or a later window than
        -- the one held: start a clean one.
        redis.call('DEL', s.key)
        redis.call('HSET', s.key, 's', int(st), 'n', int(s.c), 'w',
          int(s.W))
        s.f_start, s.f_n = st, s.c
        s.renew = true
      else
        -- Never past MAX_UNITS (only a report gets there).
        local c = min(s.c, MAX_UNITS - s.f_n)
        if c > 0 then
          redis.call('HINCRBY', s.key, 'n', int(c))
        end
        s.f_n = s.f_n + c
        if s.f_w ~= s.W then
          -- Counted under another W: its TTL is that window's end.
          redis.call('HSET', s.key, 'w', int(s.W))
          s.renew = true
        end
      end
      s.f_w = s.W
      s.stale = false
      s.mark = int(st)
    end

    function fixed_window.record(s)
      fixed_window.record_at(s, s.now)
    end

    function fixed_window.effective(s)
      if s.f_n > 0 and s.f_start > s.s_now then
        -- Reservations in a later window: when one unit would fit.
        local c = s.c
        s.c = 1
        local t = fixed_window.earliest(s, s.now)
        s.c = c
        return ceil_ms(t - s.now)
      end
      return ceil_ms(s.s_now + s.W - s.now)
    end

    function fixed_window.finish(s)
      local st, n = s.f_start, s.f_n
      s.over = max(0, n - s.L)
      if n > 0 and st > s.s_now then
        s.remaining = 0
        s.reset = ceil_ms(st + s.W - s.now)
      else
        s.remaining = max(0, s.L - n)
        s.reset = 0
        if n > 0 then
          s.reset = ceil_ms(s.s_now + s.W - s.now)
        end
      end
      -- TTL: the end of the window, set when its hash was made or its W
      -- changed (s.renew); a record in a window the hash already holds
      -- under this W would set the same.
      if s.recorded and s.renew then
        redis.call('PEXPIRE', s.key,
          int(max(1, ceil_ms(st + s.W - s.now))))
      end
    end
    return fixed_window
  end

  -- token_bucket (GCRA): a string holding tat, a double in microseconds,
  -- written with %.17g so that it reads back bit for bit.
  local function make_token_bucket()
    token_bucket = {}

    function token_bucket.check(s)
      forget(s.key, true)
      local tat = tats and tats[s.key]
      if tat == nil then
        tat = tonumber(first('GET', s.key))
      end
      if tat ~= nil and (tat ~= tat or tat == math.huge or
          tat == -math.huge) then
        tat = nil
      end
      local inc = s.c * s.W / s.L
      local base = s.now
      if tat ~= nil and tat > s.now then
        base = tat
      end
      s.tat = tat
      s.base = base
      s.new_tat = base + inc
      s.rec_t = s.now
      s.allowed = s.new_tat - s.now <= s.W + 1
      if not s.allowed then
        s.retry = max(1, ceil_ms(math.ceil(s.new_tat - s.W - s.now)))
      end
    end

    function token_bucket.record(s)
      -- Written with its TTL in finish(); never more than MAX_AHEAD after
      -- the time recorded at (only a report gets there).
      s.new_tat = min(s.new_tat, s.rec_t + MAX_AHEAD)
      s.mark = fmt('%.17g', s.new_tat)
    end

    -- GCRA at t: max(tat, t) + c*W/L - t <= W + 1.
    local function bucket_fits(s, t)
      local base = t
      if s.tat ~= nil and s.tat > t then
        base = s.tat
      end
      return base + s.c * s.W / s.L - t <= s.W + 1
    end

    function token_bucket.earliest(s, from)
      if bucket_fits(s, from) then
        return from
      end
      local t = from
      local x = math.ceil(s.tat + s.c * s.W / s.L - s.W - 1)
      if x > t then
        t = x
      end
      while not bucket_fits(s, t) do
        t = t + 1
      end
      return t
    end

    function token_bucket.record_at(s, t)
      local base = t
      if s.tat ~= nil and s.tat > t then
        base = s.tat
      end
      s.new_tat = base + s.c * s.W / s.L
      s.rec_t = t
      token_bucket.record(s)
    end

    function token_bucket.finish(s)
      local t = s.base
      if s.recorded then
        t = s.new_tat
      end
      local rem = floor((s.W + 1 - (t - s.now)) * s.L / s.W)
      s.remaining = min(s.L, max(0, rem))
      s.over = min(MAX_UNITS, max(0, -rem))
      s.reset = ceil_ms(math.ceil(t - s.now))
      if s.recorded then
        -- SET with PX at the end of the call (tats).
        if tats == nil then
          tats, tat_ttls = {}, {}
        end
        tats[s.key], tat_ttls[s.key] = s.new_tat, max(1, s.reset)
      end
    end

    function token_bucket.effective(s)
      local t = s.base
      if s.recorded then
        t = s.new_tat
      end
      local nt = t + (s.remaining + 1) * s.W / s.L
      return max(1, ceil_ms(math.ceil(nt - s.W - s.now)))
    end
    return token_bucket
  end

  -- sliding_window: a hash bucket index -> count, B buckets per window.
  local function make_sliding_window()
    sliding_window = {}

    -- The retry of a request of c units: walk forward through bucket
    -- boundaries with no new traffic until full + c <= L, then solve
    -- est(t) + c = L in that bucket.  full and old are those of bucket i.
    local function sw_retry(s, c, full, old)
      local L, i, t = s.L, s.i, nil
      for _ = 0, B do
        if full + c <= L then
          if old > 0 then
            t = (i + 1) * s.G - s.G * (L - c - full) / old
            if t < s.now then
              t = s.now
            end
          else
            t = s.now
          end
          break
        end
        old = s.counts[i - B + 1] or 0
        full = full - old
        i = i + 1
      end
      return max(1, ceil_ms(math.ceil(t - s.now)))
    end

    function sliding_window.check(s)
      forget(s.key)
      local G = s.W / B
      local i = (s.now - math.fmod(s.now, G)) / G
      local h = first('HGETALL', s.key)
      local counts, old_fields = {}, {}
      for j = 1, #h, 2 do
        local b, v = tonumber(h[j]), tonumber(h[j + 1])
        if b == nil or v == nil or b ~= floor(b) or b < i - B or
            b > i then
          -- Expired; from the future (the clock stepped back, or a reload
          -- changed W and the indexes mean other times); or not a bucket at
          -- all (another algorithm's hash).  None of them counts anywhere.
          old_fields[#old_fields + 1] = h[j]
        else
          counts[b] = v
        end
      end
      if #old_fields > 0 then
        redis.call('HDEL', s.key, unpack(old_fields))
      end
      local full = 0
      for j = i - B + 1, i do
        full = full + (counts[j] or 0)
      end
      local old = counts[i - B] or 0
      local f = ((i + 1) * G - s.now) / G
      s.G, s.i, s.counts = G, i, counts
      s.est = full + old * f
      s.allowed = s.est + s.c <= s.L
      if not s.allowed then
        s.retry = sw_retry(s, s.c, full, old)
      end
    end

    function sliding_window.record(s)
      -- A bucket never holds more than MAX_UNITS (only a report gets
      -- there).
      local c = min(s.c, MAX_UNITS - (s.counts[s.i] or 0))
      if c > 0 then
        redis.call('HINCRBY', s.key, int(s.i), int(c))
      end
      s.mark = int(s.i)
      s.counts[s.i] = (s.counts[s.i] or 0) + c
      s.est = s.est + c
    end

    function sliding_window.effective(s)
      local full = 0
      for j = s.i - B + 1, s.i do
        full = full + (s.counts[j] or 0)
      end
      return sw_retry(s, s.remaining + 1, full, s.counts[s.i - B] or 0)
    end

    function sliding_window.finish(s)
      local rem = floor(s.L - s.est)
      s.remaining = max(0, rem)
      s.over = min(MAX_UNITS, max(0, -rem))
      local newest = nil
      for b, v in pairs(s.counts) do
        if v > 0 and (newest == nil or b > newest) then
          newest = b
        end
      end
      s.reset = 0
      if newest ~= nil then
        s.reset = ceil_ms((newest + 1) * s.G + s.W - s.now)
      end
      if s.recorded then
        redis.call('PEXPIRE', s.key, int(ceil_ms(s.W + s.G)))
      end
    end
    sliding_window.earliest = at_once
    sliding_window.record_at = function(s) sliding_window.record(s) end
    return sliding_window
  end

  -- concurrency: a sorted set, "<token>:<cost>" by expiry, '#used' by -used
  -- (docs/algorithms.md; lease.lua and takeback.lua read the same layout).
  local function make_concurrency()
    concurrency = {}

    function concurrency.check(s)
      forget(s.key)
      local gone = first('ZRANGEBYSCORE', s.key, '(0', int(s.now))
      local u = redis.call('ZSCORE', s.key, '#used')
      if not u and redis.call('ZCARD', s.key) > 0 then
        -- Members but no '#used': another algorithm's sorted set
        -- (sliding_log's runs, after a reload changed the rule's
        -- algorithm), whose runs would read as leases.  Start fresh, as
        -- for a key of another type.
        redis.call('DEL', s.key)
        gone = {}
      end
      s.used = u and -tonumber(u) or 0
      if #gone > 0 then
        for _, m in ipairs(gone) do
          s.used = s.used - (tonumber(string.match(m, ':(%d+)$')) or 0)
        end
        redis.call('ZREMRANGEBYSCORE', s.key, '(0', int(s.now))
        if s.used <= 0 or redis.call('ZCARD', s.key) <= 1 then
          s.used = 0
          redis.call('DEL', s.key)
        else
          redis.call('ZADD', s.key, int(-s.used), '#used')
        end
      end
      -- No token: a look that takes no lease, and is denied.
      s.allowed = s.used + s.c <= s.L and (s.token ~= nil or s.c == 0)
      if not s.allowed then
        -- k units to free: leases by expiry from rank 1 ('#used' is 0);
        -- at least 1 (a look denied with room waits for the oldest)
        local k = max(1, s.used + s.c - s.L)
        local r = redis.call('ZRANGE', s.key, '1', int(k), 'WITHSCORES')
        local acc, t = 0, nil
        for i = 1, #r, 2 do
          acc = acc + (tonumber(string.match(r[i], ':(%d+)$')) or 0)
          t = tonumber(r[i + 1])
          if acc >= k then
            break
          end
        end
        s.retry = max(1, ceil_ms((t or s.now) - s.now))
      end
    end

    function concurrency.record(s)
      redis.call('ZADD', s.key, int(s.now + s.W), s.token .. ':' .. int(s.c))
      s.used = s.used + s.c
      redis.call('ZADD', s.key, int(-s.used), '#used')
      s.mark = '1'
    end

    function concurrency.finish(s)
      s.remaining = max(0, s.L - s.used)
      s.reset = 0
      if s.used > 0 then
        local r = redis.call('ZRANGE', s.key, '-1', '-1', 'WITHSCORES')
        if #r > 0 then
          s.reset = ceil_ms(tonumber(r[2]) - s.now)
        end
      end
      if s.recorded then
        redis.call('PEXPIRE', s.key, int(max(1, s.reset)))
      end
    end
    -- The lease is taken when the request is decided (docs/leases.md) and
    -- expires at now + W: one that fits now fits at a turn another rule
    -- gives it while the answer, sent ceil_ms(t - now) after the decision,
    -- finds at least 1 ms of it left (t <= now + W - 1 ms); one that does
    -- not fit is waited for by the daemon, not here.
    function concurrency.earliest(s, from)
      if s.allowed and from <= s.now + s.W - 1000 then
        return from
      end
      return nil
    end
    concurrency.record_at = function(s) concurrency.record(s) end
    return concurrency
  end

  local ALGORITHMS = {[0] = sliding_log}
  local MAKE = {[1] = make_sliding_window, [2] = make_fixed_window,
    [3] = make_token_bucket, [4] = make_concurrency}

  -- The algorithm numbered a (enum rl_algorithm), or nil.
  function algorithm(a)
    local alg = ALGORITHMS[a]
    if alg == nil and a ~= nil and MAKE[a] ~= nil then
      alg = MAKE[a]()
      ALGORITHMS[a] = alg
    end
    return alg
  end

  -- Waiting, reports and chunks, made only for a call that has one.
  local reserve_time, report, chunk
  function make_extras()
    -- Not before the newest run; at t0 = max(from, newest) the units of
    -- (t0 - W, t0] plus c must fit, else when the k-th oldest of them leaves.
    function sliding_log.earliest(s, from)
      local t0 = from
      if s.last_t ~= nil and s.last_t > t0 then
        t0 = s.last_t
      end
      if s.used == 0 then
        return t0
      end
      local r = redis.call('ZRANGEBYSCORE', s.key, '(' .. int(t0 - s.W), '+inf',
        'WITHSCORES', 'LIMIT', '0', '1')
      local count, firstu = 0, 0
      if #r > 0 then
        local e, n = log_member(r[1])
        if e == nil then
          -- Not a run (log_time_of): the run count no longer says how
          -- many units are in the window.  Count them all, then again.
          log_load(s, log_convert(s.key, s.W, s.now))
          return sliding_log.earliest(s, from)
        end
        firstu = e - n + 1
        count = s.last_end - firstu + 1
      end
      if count + s.c <= s.L then
        return t0
      end
      local t, conv = log_time_of(s.key, firstu + (count + s.c - s.L) - 1,
        s.used, s.first, s.W, s.now)
      if conv ~= nil then
        log_load(s, conv)
        return sliding_log.earliest(s, from)
      end
      return t + s.W
    end

    function sliding_log.record_at(s, t)
      local now = s.now
      s.now = t
      sliding_log.record(s, now)
      s.now = now
    end

    -- Taking quota in advance (docs/algorithms.md): instead of record, a
    -- check with s.want records k = c + min(want - c, floor(F / SHARE)) units,
    -- F the units still free after c, so that they may be used for s.valid
    -- microseconds after now.  Sets s.c = k (finish and effective then see a
    -- call that recorded k), s.taken and s.valid.
    local SHARE = 8

    function chunk(s)
      local F
      s.valid = s.hold
      if s.alg == sliding_log then
        F = s.L - s.used - s.c
      elseif s.alg == fixed_window then
        F = s.L - s.n - s.c
        if s.s_now + s.W - s.now < s.valid then
          s.valid = s.s_now + s.W - s.now
        end
      elseif s.alg == token_bucket then
        F = min(s.L,
          floor((s.W + 1 - (s.new_tat - s.now)) * s.L / s.W))
      else
        F = floor(s.L - s.est - s.c)
        if (s.i + 1) * s.G - s.now < s.valid then
          s.valid = (s.i + 1) * s.G - s.now
        end
      end
      local x = 0
      if F >= SHARE then
        x = min(s.want - s.c, floor(F / SHARE))
      end
      local k = s.c + x
      if s.alg == token_bucket and s.base + k * s.W / s.L - s.now > s.W + 1 then
        k = s.c -- double rounding said no
      end
      s.c = k
      s.taken = k
      if s.alg == sliding_log or s.alg == token_bucket then
        s.alg.record_at(s, s.now + s.hold)
      else
        s.alg.record(s)
      end
    end

    -- Waiting: the earliest t within `wait` microseconds at which every
    -- non-shadow check fits (the max of their earliest times, until they
    -- agree), or nil.
    function reserve_time(checks, first, last, wait)
      local now = checks[first].now
      local t = now
      for _ = 1, 64 do
        local nxt = t
        for k = first, last do
          local s = checks[k]
          if not s.shadow then
            local e = s.alg.earliest(s, t)
            if e == nil then
              return nil
            end
            if e > nxt then
              nxt = e
            end
          end
        end
        if nxt - now > wait then
          return nil
        end
        if nxt == t then
          if t == now then
            return nil
          end
          return t
        end
        t = nxt
      end
      return nil
    end

    -- A report: phase 1 with c = 0 (expire, read), then every check records
    -- c whatever it allows: at now, or in fixed_window's later window when
    -- that holds reservations (they keep their place; the report drains
    -- with that window).
    function report(checks, first, last)
      for k = first, last do
        local s = checks[k]
        local c = s.c
        s.c = 0
        s.alg.check(s)
        s.c = c
        s.allowed = true
      end
      for k = first, last do
        local s = checks[k]
        if s.c > 0 then
          local t = s.now
          if s.alg == fixed_window and s.f_start > t then
            t = s.f_start
          end
          s.alg.record_at(s, t)
          s.recorded = true
        end
      end
    end
  end

  -- One request: checks[first .. last], all-or-nothing on its own.  Appends
  -- its all_allowed and 5 fields per check to reply.
  function request(checks, first, last, reply, marks, chunks, wait,
      is_report)
    -- Phase 1: check.
    local all = true
    if is_report then
      report(checks, first, last)
    end
    for k = first, last do
      local s = checks[k]
      if not is_report then
        s.alg.check(s)
      end
      if not s.allowed and not s.shadow then
        all = false
      end
    end

    -- Waiting: record at the reserved time instead.
    local waited = 0
    if not all and wait > 0 then
      local t = reserve_time(checks, first, last, wait)
      if t ~= nil then
        for k = first, last do
          local s = checks[k]
          local ok = not s.shadow or s.alg.earliest(s, t) == t
          if not ok and s.retry < 1 then
            -- A shadow check that admits now but not at t: phase 1's
            -- retry (0), at least 1 (docs/algorithms.md, "Waiting for a
            -- turn").
            s.retry = 1
          end
          s.allowed = ok
          if s.allowed and s.c > 0 then
            s.alg.record_at(s, t)
            s.recorded = true
          end
        end
        waited = t - checks[first].now
      end
    end

    -- Phase 2: record.
    if all and not is_report then
      for k = first, last do
        local s = checks[k]
        if s.allowed and s.c > 0 then
          if s.want ~= nil and s.want >= s.c then
            chunk(s)
          else
            s.alg.record(s)
          end
          s.recorded = true
        end
      end
    end

    local o = #reply + 1
    if waited > 0 then
      reply[o] = 1 + waited
    else
      reply[o] = all and 1 or 0
    end
    for k = first, last do
      local s = checks[k]
      local alg, allowed = s.alg, s.allowed
      alg.finish(s)
      reply[o + 1] = allowed and 1 or 0
      reply[o + 2] = floor(s.remaining)
      reply[o + 3] = floor(s.reset)
      if is_report then
        reply[o + 4] = floor(s.over or 0)
      else
        reply[o + 4] = allowed and 0 or floor(s.retry)
      end
      if alg == concurrency then
        reply[o + 5] = 0
      elseif s.remaining >= s.L then
        reply[o + 5] = ceil_ms(s.W)
      else
        reply[o + 5] = floor(alg.effective(s))
      end
      o = o + 5
      if marks then
        local mk = '0'
        if s.recorded then
          mk = s.mark
          if alg == sliding_log then
            mk = int(mk)
          end
        end
        o = o + 1
        reply[o] = mk
      end
      if chunks then
        reply[o + 1] = s.taken or 0
        reply[o + 2] = s.taken and s.valid or 0
        o = o + 2
      end
    end
  end
end


-- Main.
local n = #KEYS
local counts, base
local waits, reports, any_report = {}, {}, false
local m = 0
local marks, chunks = false, false
if ARGV[m + 1] == 'marks' then
  marks, m = true, m + 1
end
if ARGV[m + 1] == 'chunks' then
  chunks, m = true, m + 1
end
local same = ARGV[m + 1] == 'same'
local same_n, same_L, same_W, same_c
if same then
  -- The checks of one request, checked once; with several, every
  -- request's are written into lean_request()'s arrays (checked below).
  same_n = tonumber(ARGV[m + 2])
  if same_n == nil or same_n < 1 or #ARGV ~= m + 2 + 5 * same_n or
      n % same_n ~= 0 or chunks then
    return redis.error_reply('ratelimit.lua: bad arguments after same')
  end
  local sa, sl, sw, sc = {}, {}, {}, {}
  for j = 1, same_n do
    local a = m + 2 + (j - 1) * 5
    local alg, L, wms = ARGV[a + 1], tonumber(ARGV[a + 2]),
      tonumber(ARGV[a + 3])
    local c = tonumber(ARGV[a + 4])
    if (alg ~= '0' and (same_n == 1 or (alg ~= '2' and alg ~= '3'))) or
        ARGV[a + 5] ~= '0' or L == nil or wms == nil or c == nil or
        L < 1 or wms < 1 or c < 0 or c > L then
      return redis.error_reply('ratelimit.lua: bad arguments after same')
    end
    sa[j], sl[j], sw[j], sc[j] = tonumber(alg), L, wms * 1000, c
  end
  if same_n == 1 then
    same_L, same_W, same_c = sl[1], sw[1], sc[1]
  else
    plain_A, st_ok, st_retry, st_x, st_y, st_z = {}, {}, {}, {}, {}, {}
    counts = {}
    for r = 1, n / same_n do
      counts[r] = same_n
      local k0 = (r - 1) * same_n
      for j = 1, same_n do
        local k = k0 + j
        for i = k0 + 1, k - 1 do
          if KEYS[i] == KEYS[k] then
            return redis.error_reply('ratelimit.lua: bad arguments ' ..
              'after same')
          end
        end
        plain_A[k], plain_L[k], plain_W[k], plain_c[k] = sa[j], sl[j],
          sw[j], sc[j]
      end
    end
  end
elseif #ARGV == m + 5 * n then
  counts, base = {n}, m
else
  local R = tonumber(ARGV[m + 1])
  if R == nil or R < 1 or #ARGV ~= m + 1 + R + 5 * n then
    return redis.error_reply('ratelimit.lua: need 5 ARGV per key, or ' ..
      'a request count, the checks of each request and 5 ARGV per key')
  end
  counts, base = {}, m + 1 + R
  local total = 0
  for r = 1, R do
    local a = ARGV[m + 1 + r]
    counts[r] = tonumber(a)
    if counts[r] == nil then
      local cn, wt = string.match(a, '^(%d+):(%d+)$')
      local rn = string.match(a, '^(%d+):r$')
      if cn ~= nil then
        counts[r], waits[r] = tonumber(cn), tonumber(wt)
      elseif rn ~= nil then
        counts[r], reports[r], any_report = tonumber(rn), true, true
      end
    end
    if counts[r] == nil or counts[r] < 1 then
      return redis.error_reply('ratelimit.lua: bad check count for ' ..
        'request ' .. r)
    end
    total = total + counts[r]
  end
  if total ~= n then
    return redis.error_reply('ratelimit.lua: check counts do not add ' ..
      'up to the keys')
  end
end
if chunks or any_report or next(waits) ~= nil then
  make_general()
  make_extras()
end
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000000 + tonumber(time[2])
local now_s = int(now)

-- 'same' of one check: each key one request of log_single(), merged as
-- below (a denied request records nothing, so the same request again on
-- its key gets the same answer: denied[key] keeps the reply's fields).
-- Of several: the requests below, their checks read already.
if same and same_n == 1 then
  local reply, denied = {}, {}
  for k = 1, n do
    local key = KEYS[k]
    local d = denied[key]
    local o = #reply
    if d ~= nil then
      for j = 1, #d do
        reply[o + j] = d[j]
      end
    elseif not log_single(key, same_L, same_W, same_c, now, now_s, reply,
        marks, false) then
      local f = {}
      for j = o + 1, #reply do
        f[j - o] = reply[j]
      end
      denied[key] = f
    end
  end
  for key, ttl in pairs(ttls) do
    redis.call('PEXPIRE', key, ttl)
  end
  return reply
end

-- The checks, request by request.  A request that log_single() can take
-- (one sliding_log check, not shadow, neither waiting nor a report, no
-- chunk: its algorithm is exactly 0) or lean_request() (several checks,
-- each exactly 0, 2 or 3, not shadow, on keys that differ, neither
-- waiting nor a report) keeps only its algorithm, L, W and c, in
-- plain_A[k], plain_L[k], plain_W[k] and plain_c[k]; every other check
-- gets a table.  All are read and checked before any is evaluated.
local checks = {}
local k = 0
for r = 1, same and 0 or #counts do
  local cnt = counts[r]
  local plain = waits[r] == nil and not reports[r]
  if plain and cnt == 1 then
    local a = base + k * 5
    plain = ARGV[a + 1] == '0' and ARGV[a + 5] ~= '1'
  elseif plain then
    for j = k + 1, k + cnt do
      local a = base + (j - 1) * 5
      local alg = ARGV[a + 1]
      if (alg ~= '0' and alg ~= '2' and alg ~= '3') or
          ARGV[a + 5] == '1' then
        plain = false
        break
      end
      for i = k + 1, j - 1 do
        if KEYS[i] == KEYS[j] then
          plain = false
        end
      end
    end
    if plain and plain_A == nil then
      plain_A, st_ok, st_retry, st_x, st_y, st_z = {}, {}, {}, {}, {}, {}
    end
  end
  local in_report = reports[r] or false
  for _ = 1, cnt do
    k = k + 1
    local a = base + (k - 1) * 5
    local L, wms = tonumber(ARGV[a + 2]), tonumber(ARGV[a + 3])
    local c, shadow = tonumber(ARGV[a + 4]), ARGV[a + 5] == '1'
    if plain then
      if L == nil or wms == nil or c == nil or L < 1 or wms < 1 or
          c < 0 or c > L then
        return redis.error_reply('ratelimit.lua: bad arguments for key ' ..
          k)
      end
      if cnt > 1 then
        plain_A[k] = tonumber(ARGV[a + 1])
      end
      plain_L[k], plain_W[k], plain_c[k] = L, wms * 1000, c
    else
      make_general()
      local alg = algorithm(tonumber(ARGV[a + 1]))
      local token, want, hold = nil, nil, nil
      local pa, pw, ph
      if alg == nil then
        pa, pw, ph = string.match(ARGV[a + 1], '^(%d+)%+(%d+)%+(%d+)$')
      end
      if pa ~= nil and chunks then
        alg, want, hold = algorithm(tonumber(pa)), tonumber(pw),
          tonumber(ph)
        if alg == concurrency then
          alg = nil
        end
      elseif alg == nil then
        local an, tk = string.match(ARGV[a + 1], '^(%d+):(%x+)$')
        alg, token = algorithm(tonumber(an)), tk
        if alg ~= concurrency then
          alg = nil
        end
      end
      if alg == nil or L == nil or wms == nil or c == nil or L < 1 or
          wms < 1 or c < 0 or (c > L and not in_report) or
          (in_report and alg == concurrency) then
        return redis.error_reply('ratelimit.lua: bad arguments for key ' ..
          k)
      end
      -- Every field a check may get, so that the table is made at its
      -- size.
      checks[k] = {alg = alg, key = KEYS[k], L = L, W = wms * 1000, c = c,
        shadow = shadow, now = now, retry = 0, recorded = false,
        token = token, want = want, hold = hold, allowed = false,
        used = nil, remaining = nil, reset = nil, over = nil, mark = nil,
        log = nil, v = nil, first = nil, first_t = nil, last_end = nil,
        last_n = nil, last_t = nil, prev_t = nil, renew = false}
    end
  end
end

-- The requests one after the other, in order: a later one sees what an
-- earlier one recorded, as if each had been its own call.
--
-- Merging (docs/algorithms.md, "Requests of one key in one call"): a
-- request of one non-shadow check, neither waiting nor a report nor a
-- chunk nor concurrency, that is denied records nothing, so until another
-- check touches its key, the same request again gets the same answer:
-- denied[key] keeps that answer (the rule's algorithm, L, W and c, and the
-- reply's fields), and a later such request with the same rule is given
-- them without being evaluated.  Any check on the key that is evaluated
-- forgets it first.
local reply = {}
local denied = {}
local first = 1
for r = 1, #counts do
  local last = first + counts[r] - 1
  local L = plain_L[first]
  if L ~= nil and first < last then
    if next(denied) ~= nil then
      for j = first, last do
        denied[KEYS[j]] = nil
      end
    end
    lean_request(first, last, now, now_s, reply, marks, chunks)
  elseif L ~= nil then
    local key, W, c = KEYS[first], plain_W[first], plain_c[first]
    local d = denied[key]
    if d ~= nil and d.alg == sliding_log and d.L == L and d.W == W and
        d.c == c then
      local o = #reply
      for j = 1, #d.fields do
        reply[o + j] = d.fields[j]
      end
    else
      denied[key] = nil
      local o = #reply
      if not log_single(key, L, W, c, now, now_s, reply, marks,
          chunks) then
        local f = {}
        for j = o + 1, #reply do
          f[j - o] = reply[j]
        end
        denied[key] = {alg = sliding_log, L = L, W = W, c = c, fields = f}
      end
    end
  else
    local s = checks[first]
    local one = first == last and waits[r] == nil and not reports[r] and
      not s.shadow and s.want == nil and s.alg ~= concurrency
    local d = nil
    if one then
      d = denied[s.key]
    end
    if d ~= nil and d.alg == s.alg and d.L == s.L and d.W == s.W and
        d.c == s.c then
      local o = #reply
      for j = 1, #d.fields do
        reply[o + j] = d.fields[j]
      end
    else
      for k = first, last do
        denied[checks[k].key] = nil
      end
      local o = #reply
      request(checks, first, last, reply, marks, chunks, waits[r] or 0,
        reports[r])
      if one and reply[o + 1] == 0 then
        local f = {}
        for j = o + 1, #reply do
          f[j - o] = reply[j]
        end
        denied[s.key] = {alg = s.alg, L = s.L, W = s.W, c = s.c, fields = f}
      end
    end
  end
  first = last + 1
end
for key, ttl in pairs(ttls) do
  redis.call('PEXPIRE', key, ttl)
end
if tats ~= nil then
  for key in pairs(tats) do
    tat_flush(key)
  end
end
return reply
