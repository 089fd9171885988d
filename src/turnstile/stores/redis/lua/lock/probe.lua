-- probe: the name stored under these keys if it has a live holder or waiter (for names()).
--
-- KEYS: D L CW PD (see _lib.lua)
-- ARGV: [1] key base
-- Returns the name (string), or "" if the name has nothing alive or no metadata, or is
-- kept in another layout.

local r = redis.call('HMGET', D, '=name', '=layout', '=hn', '=hr', '=n', '=wdue')
local name = r[1]
-- A name kept in another layout (see refuse_layout()) is not this release's to list.
if not name or r[2] ~= LAYOUT then return '' end
parse_holders(r[3], r[4])
for _, holder in ipairs(HORDER) do
  if H[holder].expires > NOW then return name end
end
if tonumber(r[5] or '0') > 0 then
  if r[6] and tonumber(r[6]) > NOW then return name end -- every entry in line is alive
  for _, m in ipairs(redis.call('ZRANGE', L, 0, -1)) do
    if m ~= SENTINEL and parse_member(m).expires > NOW then return name end
  end
end
return ''
