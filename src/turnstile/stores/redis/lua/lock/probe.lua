-- probe: the name stored under these keys if it has a live holder or waiter (for names()).
--
-- KEYS: D HX WX WQ CW PD (see _lib.lua)
-- ARGV: [1] key base
-- Returns the name (string), or "" if the name has nothing alive or no metadata, or is
-- kept in a newer layout.

local r = redis.call('HMGET', D, '=name', '=layout')
local name = r[1]
-- A name a later release keeps in another layout (see refuse_layout()) is not this
-- release's to list.
if not name or r[2] then return '' end
if redis.call('ZCOUNT', HX, '(' .. fmt(NOW), '+inf') > 0
    or redis.call('ZCOUNT', WX, '(' .. fmt(NOW), '+inf') > 0 then
  return name
end
return ''
