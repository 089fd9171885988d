-- pending: how many unexpired grants of this name wait for their delivery (metrics).
--
-- KEYS: D L CW PD (see _lib.lua)
-- ARGV: [1] key base
-- Returns the count.

local count = 0
if redis.call('ZCARD', PD) > 0 then
  local r = redis.call('HMGET', D, '=hn', '=hr')
  parse_holders(r[1], r[2])
  for _, holder in ipairs(redis.call('ZRANGE', PD, 0, -1)) do
    local h = H[holder]
    if h and h.pending and h.expires > NOW then count = count + 1 end
  end
end
return count
