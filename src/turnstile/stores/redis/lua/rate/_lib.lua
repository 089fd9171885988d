-- Turnstile on Redis: helpers shared by the rate-limit scripts.
--
-- Prepended to each operation script when it is loaded (Redis has no includes). It
-- implements the steps of turnstile/_core/rate_machine.py: GCRA with emission interval
-- T = per / rate and tolerance tau = (burst - 1) * T, and a line of waiters in order of rank
-- (turnstile/_core/ranking.py: arrival stamp less priority x level; FIFO within a level),
-- the k-th (0 = next) due at max(now, tat - tau) + k * T, its place lapsing `grace` after.
--
-- Keys of one rate limit, under the name's hash tag {T} (one Cluster slot), in this order:
--   KEYS[1] M  hash  "=name" the name, "=rate", "=per" (Python's repr of the float, so the
--                    spec compares exactly), "=burst", "=tat" (us, may be fractional),
--                    "=seq" a per-name strictly increasing number: the newest waiter's
--                    arrival stamp (us) and the admission members (a plain counter before
--                    priorities), "=nw" waiters in line, "=na" recent admissions, "=last"
--                    the latest admission (us), "=exp" how far the keys' expiry reaches
--                    (us); "j:"..holder -> joined_us (the arrival stamp) of each waiter
--   KEYS[2] L  zset  waiters scored by rank (stamp - lead, see join()): the line, smallest
--                    first, FIFO within a rank (entries from before priorities are scored
--                    by a small counter, so they stay first)
--   KEYS[3] X  zset  waiters scored by when their place lapses (us)
--   KEYS[4] A  zset  recent admissions (member: a seq) scored by their time (us)
-- L and X hold the same members; both exist only while "=nw" > 0, A only while "=na" > 0.
--
-- Times are microseconds on the server clock (TIME), passed to Redis as formatted strings
-- (Redis would format a Lua number with 14 digits). Every key expires by itself at "=exp":
-- the latest of tat, the last admission + per and every waiter's lapse, after which the
-- rate limit is idle (nobody in line, tat past, no admission in the last per): an idle rate
-- limit leaves nothing behind.

-- The keys, NOW and the step's state are set per step by begin() (below), which each
-- operation calls first: a script makes these helpers for one step, a function library (see
-- stores/redis/scripts.py) once for every step.
local M, L, X, A
local CHUNK = 1000 -- stay well below Lua's unpack() limit
local MAX_RECENT = 10000 -- rate_machine.MAX_RECENT

local function num(x)
  return string.format('%.17g', x)
end

local NOW

local S
local cover      -- latest time this step's writes need the keys to last to
local dirty      -- M's fields must be written back
local written    -- keys written by this step (their expiry must be set)

-- The start of a step: every variable above as a new step finds it.
local function begin()
  M, L, X, A = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
  NOW = server_us()
  S, cover, dirty, written = {}, 0, false, {}
end

local function derive()
  S.per_us = S.per * 1000000
  S.interval = S.per_us / S.rate
  S.tolerance = (S.burst - 1) * S.interval
end

local function load()
  local r = redis.call('HMGET', M, '=rate', '=per', '=burst', '=tat', '=seq', '=nw', '=na',
                       '=last', '=exp')
  S.exists = r[1] and true or false
  S.rate, S.per_text, S.burst = tonumber(r[1] or '1'), r[2] or '1.0', tonumber(r[3] or '1')
  S.per = tonumber(S.per_text)
  S.tat, S.seq = tonumber(r[4] or '0'), tonumber(r[5] or '0')
  S.nw, S.na = tonumber(r[6] or '0'), tonumber(r[7] or '0')
  S.last, S.exp = tonumber(r[8] or '0'), tonumber(r[9] or '0')
  derive()
end

local function covers(until_us)
  if until_us > cover then cover = until_us end
end

local function each_chunk(list, fn)
  for i = 1, #list, CHUNK do
    fn({unpack(list, i, math.min(i + CHUNK - 1, #list))})
  end
end

local function fields(p, members)
  local out = {}
  for i, m in ipairs(members) do out[i] = p .. m end
  return out
end

-- rate_machine.purge, waiters: drop every place that lapsed (expires_at <= now).
local function purge_waiters()
  if S.nw <= 0 then return end
  local gone = redis.call('ZRANGEBYSCORE', X, '-inf', fmt(NOW))
  if #gone > 0 then
    each_chunk(gone, function(c)
      redis.call('ZREM', L, unpack(c))
      redis.call('ZREM', X, unpack(c))
      redis.call('HDEL', M, unpack(fields('j:', c)))
    end)
  end
  local n = redis.call('ZCARD', L)
  if n ~= S.nw then
    S.nw = n
    dirty = true
  end
end

-- rate_machine.purge, admissions: none older than per (t <= now - per goes).
local function purge_admissions()
  if S.na <= 0 then return end
  local cutoff = NOW - S.per_us
  if S.last <= cutoff then
    redis.call('DEL', A)
    S.na = 0
    dirty = true
  else
    local n = redis.call('ZREMRANGEBYSCORE', A, '-inf', num(cutoff))
    if n > 0 then
      S.na = math.max(0, S.na - n)
      dirty = true
    end
  end
end

-- rate_machine.slot: when the position-th waiter (0 = next) is due.
local function slot(position)
  return math.max(NOW, S.tat - S.tolerance) + position * S.interval
end

local function idle()
  return S.nw <= 0 and S.tat <= NOW and (S.na <= 0 or S.last <= NOW - S.per_us)
end

-- rate_machine._admit
local function admit()
  S.tat = math.max(S.tat, NOW) + S.interval
  S.seq = S.seq + 1
  redis.call('ZADD', A, fmt(NOW), fmt(S.seq))
  S.na, S.last = S.na + 1, NOW
  if S.na > MAX_RECENT then
    redis.call('ZREMRANGEBYRANK', A, 0, -(MAX_RECENT + 1))
    S.na = MAX_RECENT
  end
  written[A] = true
  covers(S.tat)
  covers(NOW + S.per_us)
  dirty = true
end

-- rate_machine.acquire, a newcomer's place: its stamp is its arrival on the server clock,
-- strictly increasing per name (max(NOW, "=seq" + 1)), its rank stamp - lead (lead =
-- priority x level, ranking.lead). It goes behind every waiter of its rank or better, ahead
-- of the rest. A sorted set orders equal scores by member, not by arrival, so a rank some
-- waiter already has (only possible between waiters of different leads) is avoided by
-- arriving 1 us later: the line is then exactly the one the model gives with that stamp.
-- Returns the stamp, the rank and the index the newcomer would take (nothing written).
local function place(lead)
  local stamp = math.max(S.seq + 1, NOW)
  if S.nw > 0 then
    while redis.call('ZCOUNT', L, fmt(stamp - lead), fmt(stamp - lead)) > 0 do
      stamp = stamp + 1
    end
    return stamp, stamp - lead, redis.call('ZCOUNT', L, '-inf', '(' .. fmt(stamp - lead))
  end
  return stamp, stamp - lead, 0
end

-- Put a newcomer in line at its place (see place()).
local function join(holder, stamp, rank)
  S.seq = stamp
  redis.call('ZADD', L, fmt(rank), holder)
  redis.call('HSET', M, 'j:' .. holder, fmt(stamp))
  S.nw = S.nw + 1
  written[L] = true
  dirty = true
end

local function remove_waiter(holder)
  redis.call('ZREM', L, holder)
  redis.call('ZREM', X, holder)
  redis.call('HDEL', M, 'j:' .. holder)
  S.nw = S.nw - 1
  dirty = true
end

-- Write M's fields back (when changed) and make every key last until `cover` at least:
-- the keys written now, and all of them when the reach grows.
local function save(name)
  local grows = cover > S.exp
  if grows then
    S.exp = cover
    dirty = true
  end
  if dirty then
    local f = {'=rate', fmt(S.rate), '=per', S.per_text, '=burst', fmt(S.burst),
               '=tat', num(S.tat), '=seq', fmt(S.seq), '=nw', fmt(S.nw), '=na', fmt(S.na),
               '=last', fmt(S.last), '=exp', fmt(S.exp)}
    if not S.exists then -- the name is data, written once (it may be long)
      table.insert(f, '=name')
      table.insert(f, name)
    end
    redis.call('HSET', M, unpack(f))
    written[M] = true
  end
  if grows then
    written[M] = true
    if S.nw > 0 then
      written[L] = true
      written[X] = true
    end
    if S.na > 0 then written[A] = true end
  end
  local at = fmt(math.floor(S.exp / 1000) + 1) -- ms, never before S.exp
  for _, k in ipairs({M, L, X, A}) do
    if written[k] then redis.call('PEXPIREAT', k, at) end
  end
end
