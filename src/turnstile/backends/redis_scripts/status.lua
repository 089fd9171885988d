-- status: read-only snapshot of one name at the server's clock (model.status).
--
-- KEYS: M H HX W WQ WX (see _lib.lua)
-- ARGV: [1] key base
-- Returns {now_us, limit or "", holders, waiters} where holders is a flat list
-- {holder, token, acquired_us, expires_us, ...} of unexpired leases (any order) and waiters
-- a flat list {holder, joined_us, expires_us, ...} of unexpired entries in line order.
-- limit is "" when the name has no live holder or waiter.

local holders = {}
local all = redis.call('HGETALL', H)
for i = 1, #all, 2 do
  local h = parse_holder(all[i + 1])
  if h.expires > NOW then
    table.insert(holders, all[i])
    table.insert(holders, h.token)
    table.insert(holders, h.acquired)
    table.insert(holders, h.expires)
  end
end
local waiters = {}
local line = redis.call('ZRANGE', WQ, 0, -1)
for i = 1, #line, CHUNK do
  local chunk = {unpack(line, i, math.min(i + CHUNK - 1, #line))}
  local recs = redis.call('HMGET', W, unpack(chunk))
  for j, holder in ipairs(chunk) do
    if recs[j] then
      local w = parse_waiter(recs[j])
      if w.expires > NOW then
        table.insert(waiters, holder)
        table.insert(waiters, w.joined)
        table.insert(waiters, w.expires)
      end
    end
  end
end
local limit = ''
if #holders > 0 or #waiters > 0 then limit = redis.call('HGET', M, 'limit') or '1' end
return {NOW, limit, holders, waiters}
