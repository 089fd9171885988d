-- probe: the name stored under these keys if it has a live holder or waiter (for names()).
--
-- KEYS: D HX WX WQ CW PD (see _lib.lua)
-- ARGV: [1] key base
-- Returns the name (string), or "" if the name has nothing alive or no metadata.

local name = redis.call('HGET', D, '=name')
if not name then return '' end
if redis.call('ZCOUNT', HX, '(' .. fmt(NOW), '+inf') > 0
    or redis.call('ZCOUNT', WX, '(' .. fmt(NOW), '+inf') > 0 then
  return name
end
return ''
