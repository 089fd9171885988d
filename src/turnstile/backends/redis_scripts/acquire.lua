-- acquire: one atomic step of model.acquire: hold, join the line, or keep one's place.
-- Idempotent per holder.
--
-- KEYS: M H HX W WQ WX (see _lib.lua)
-- ARGV: [1] key base "<prefix>{T}:"  [2] name  [3] holder  [4] limit
--       [5] ttl_us  [6] wait_ttl_us  [7] enqueue: "1" join the line, "0" take a free slot
--       only if nobody waits
-- Returns {granted, token, acquired_us, expires_us, now_us, position, retry_after_us}:
--   granted = 1: token (a decimal string), acquired_us and expires_us describe the lease;
--   granted = 0: position in line (0 = next) or -1 when not in line, and retry_after_us
--   until the earliest lease expires or -1 without holders.
-- Error "TURNSTILE name-collision" if M belongs to another name (a hash collision).

local name, holder = ARGV[2], ARGV[3]
local limit, ttl, wait_ttl = tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6])
local enqueue = ARGV[7] == '1'

local stored = redis.call('HGET', M, 'name')
if stored and stored ~= name then
  return redis.error_reply('TURNSTILE name-collision: two names share one key hash')
end
purge()
if not stored then redis.call('HSET', M, 'name', name) end
redis.call('HSET', M, 'limit', fmt(limit))
promote(limit, nil) -- a changed limit or expiries may free slots

local mine = redis.call('HGET', H, holder)
if mine then
  local h = parse_holder(mine)
  if not h.claimed then
    -- Our own grant, handed over while we waited: claim it for the full ttl.
    h.claimed = true
    h.expires = NOW + ttl
    put_holder(holder, h)
    redis.call('DEL', signal_key(holder))
  end
  finish()
  return grant_reply(h)
end

local waiting = redis.call('HGET', W, holder)
if waiting then
  local w = parse_waiter(waiting)
  w.ttl, w.wait_ttl, w.expires = ttl, wait_ttl, NOW + wait_ttl
  put_waiter(holder, w)
elseif enqueue or (redis.call('ZCARD', WQ) == 0 and redis.call('ZCARD', HX) < limit) then
  local seq = redis.call('HINCRBY', M, 'seq', 1)
  redis.call('ZADD', WQ, seq, holder)
  put_waiter(holder, {ttl = ttl, wait_ttl = wait_ttl, joined = NOW, expires = NOW + wait_ttl})
end
promote(limit, holder)

mine = redis.call('HGET', H, holder)
if mine then
  finish()
  return grant_reply(parse_holder(mine))
end
local position = redis.call('ZRANK', WQ, holder)
local retry = retry_after()
finish()
return {0, '', 0, 0, NOW, position or -1, retry}
