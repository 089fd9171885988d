-- Turnstile on Redis: helpers shared by every operation script.
--
-- This file is prepended to each operation script when it is loaded (one EVALSHA per
-- operation; Redis has no includes). It implements the steps of turnstile/_core/model.py.
--
-- Keys of one name, all under one hash tag {T} (T = a hash of the name) so they share a
-- Cluster slot; every script gets them in this order:
--   KEYS[1] M   hash   name, limit, last (last fencing token), seq (waiter sequence)
--   KEYS[2] H   hash   holder -> "token acquired_us expires_us claimed(0|1)"
--   KEYS[3] HX  zset   holder scored by expires_us (expiry index of H)
--   KEYS[4] W   hash   waiter -> "ttl_us wait_ttl_us joined_us expires_us"
--   KEYS[5] WQ  zset   waiter scored by seq (the line, in the order waiters first asked)
--   KEYS[6] WX  zset   waiter scored by expires_us (expiry index of W)
-- ARGV[1] is the common key base "<prefix>{T}:"; the wake-up list of holder X is
-- BASE .. "s:" .. X. It is not in KEYS (the holder to wake is only known inside the
-- script) but it carries the same hash tag, so it lives in the same slot.
--
-- Times are integer microseconds on the server clock (TIME). Redis 7 replicates a script's
-- effects, not the script, so reading TIME before writing is safe on replicas and in AOF.

local M, H, HX, W, WQ, WX = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]
local BASE = ARGV[1]
-- The token counter (M.last) outlives the name's last lease or waiting entry by this much;
-- after that, tokens rest on the clock alone (max(last + 1, now_us)).
local KEEP_US = 3600 * 1000000
local CHUNK = 1000 -- stay well below Lua's unpack() limit

local function server_now()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000000 + tonumber(t[2])
end
local NOW = server_now()

local function fmt(n)
  return string.format('%d', n)
end

local function parse_holder(s)
  local token, acquired, expires, claimed = string.match(s, '^(%d+) (%d+) (%d+) ([01])$')
  return {token = token, acquired = tonumber(acquired), expires = tonumber(expires),
          claimed = claimed == '1'}
end

local function put_holder(holder, h)
  redis.call('HSET', H, holder,
    h.token .. ' ' .. fmt(h.acquired) .. ' ' .. fmt(h.expires) .. ' ' .. (h.claimed and '1' or '0'))
  redis.call('ZADD', HX, fmt(h.expires), holder)
end

local function parse_waiter(s)
  local ttl, wait_ttl, joined, expires = string.match(s, '^(%d+) (%d+) (%d+) (%d+)$')
  return {ttl = tonumber(ttl), wait_ttl = tonumber(wait_ttl), joined = tonumber(joined),
          expires = tonumber(expires)}
end

local function put_waiter(holder, w)
  redis.call('HSET', W, holder,
    fmt(w.ttl) .. ' ' .. fmt(w.wait_ttl) .. ' ' .. fmt(w.joined) .. ' ' .. fmt(w.expires))
  redis.call('ZADD', WX, fmt(w.expires), holder)
end

local function drop_waiter(holder)
  redis.call('HDEL', W, holder)
  redis.call('ZREM', WQ, holder)
  redis.call('ZREM', WX, holder)
end

local function remove_members(hash, zsets, members)
  for i = 1, #members, CHUNK do
    local chunk = {unpack(members, i, math.min(i + CHUNK - 1, #members))}
    redis.call('HDEL', hash, unpack(chunk))
    for _, z in ipairs(zsets) do
      redis.call('ZREM', z, unpack(chunk))
    end
  end
end

-- model.purge: drop expired leases and waiting entries (expires <= now).
local function purge()
  local gone = redis.call('ZRANGEBYSCORE', HX, '-inf', fmt(NOW))
  if #gone > 0 then remove_members(H, {HX}, gone) end
  gone = redis.call('ZRANGEBYSCORE', WX, '-inf', fmt(NOW))
  if #gone > 0 then remove_members(W, {WQ, WX}, gone) end
end

-- model.clock_token: max(last + 1, now_us), the counter kept per name in M.last.
local last_token = nil
local function next_token()
  if last_token == nil then
    last_token = tonumber(redis.call('HGET', M, 'last') or '0')
  end
  last_token = math.max(last_token + 1, NOW)
  return last_token
end

local function signal_key(holder)
  return BASE .. 's:' .. holder
end

-- Wake exactly this waiter: one entry in its own list, which it BLPOPs. The list expires
-- with the unclaimed grant it announces.
local function wake(holder, lease_us)
  local key = signal_key(holder)
  redis.call('RPUSH', key, '1')
  redis.call('PEXPIRE', key, fmt(math.floor(lease_us / 1000) + 1))
end

-- model.promote: grant free slots to waiters from the front. The claimant (the caller)
-- gets a claimed grant for its full ttl; anyone else an unclaimed grant lasting
-- min(ttl, wait_ttl), and a wake-up.
local function promote(limit, claimant)
  local free = limit - redis.call('ZCARD', HX)
  if free <= 0 then return end
  local front = redis.call('ZRANGE', WQ, 0, free - 1)
  for _, holder in ipairs(front) do
    local w = parse_waiter(redis.call('HGET', W, holder))
    drop_waiter(holder)
    local claimed = holder == claimant
    local lease = claimed and w.ttl or math.min(w.ttl, w.wait_ttl)
    put_holder(holder, {token = fmt(next_token()), acquired = NOW, expires = NOW + lease,
                        claimed = claimed})
    if not claimed then wake(holder, lease) end
  end
end

-- Seconds (here: microseconds) until the earliest lease expires, or -1 without holders.
local function retry_after()
  local first = redis.call('ZRANGE', HX, 0, 0, 'WITHSCORES')
  if #first == 0 then return -1 end
  return math.max(0, tonumber(first[2]) - NOW)
end

local function expire_at(keys, us)
  local ms = fmt(math.floor(us / 1000) + 2)
  for _, k in ipairs(keys) do redis.call('PEXPIREAT', k, ms) end
end

-- Write back the token counter and let every key expire by itself once nothing in it is
-- alive: a name nobody touches again leaves nothing behind (M after KEEP_US more).
local function finish()
  if last_token ~= nil then redis.call('HSET', M, 'last', fmt(last_token)) end
  local horizon = NOW
  local top = redis.call('ZRANGE', HX, -1, -1, 'WITHSCORES')
  if #top > 0 then
    local t = tonumber(top[2])
    horizon = math.max(horizon, t)
    expire_at({H, HX}, t)
  end
  top = redis.call('ZRANGE', WX, -1, -1, 'WITHSCORES')
  if #top > 0 then
    local t = tonumber(top[2])
    horizon = math.max(horizon, t)
    expire_at({W, WQ, WX}, t)
  end
  expire_at({M}, horizon + KEEP_US)
end

local function grant_reply(h)
  return {1, h.token, h.acquired, h.expires, NOW, -1, -1}
end

-- ---- operation ------------------------------------------------------------------------
