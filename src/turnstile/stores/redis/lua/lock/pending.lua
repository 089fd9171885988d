-- pending: how many unexpired grants of this name wait for their delivery (metrics).
--
-- KEYS: D HX WX WQ CW PD (see _lib.lua)
-- ARGV: [1] key base
-- Returns the count.

local count = 0
local members = redis.call('ZRANGE', PD, 0, -1)
unpack_chunks(members, function(c)
  local recs = redis.call('HMGET', D, unpack(fields('h:', c)))
  for i = 1, #c do
    if recs[i] then
      local h = parse_holder(recs[i])
      if h.pending and h.expires > NOW then count = count + 1 end
    end
  end
end)
return count
