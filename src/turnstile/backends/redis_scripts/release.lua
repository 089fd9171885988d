-- release: model.release, then wake whoever was granted the freed slots.
-- Only the lease with the given token is touched; without a token, also the holder's place
-- in line (and any grant handed to it meanwhile). A stale or repeated release changes
-- nothing.
--
-- KEYS: M H HX W WQ WX (see _lib.lua)
-- ARGV: [1] key base  [2] holder  [3] token as a decimal string, or "" for none
-- Returns 1 if something was released, else 0.

local holder, token = ARGV[2], ARGV[3]
purge()
local released = 0
local mine = redis.call('HGET', H, holder)
if mine then
  local h = parse_holder(mine)
  if token == '' or h.token == token then
    redis.call('HDEL', H, holder)
    redis.call('ZREM', HX, holder)
    released = 1
  end
end
if token == '' then
  if redis.call('HDEL', W, holder) == 1 then
    redis.call('ZREM', WQ, holder)
    redis.call('ZREM', WX, holder)
    released = 1
  end
  redis.call('DEL', signal_key(holder))
end
promote(tonumber(redis.call('HGET', M, 'limit') or '1'), nil)
finish()
return released
