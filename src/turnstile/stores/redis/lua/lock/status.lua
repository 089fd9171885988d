-- status: read-only snapshot of one name at the server's clock (model.status).
--
-- KEYS: D L CW PD (see _lib.lua)
-- ARGV: [1] key base
-- Returns {now_us, limit or "", holders, waiters, per_key or ""} where holders is a flat list
-- {holder, token, acquired_us, expires_us, callback kind, delivery, has_key, key, ...} of
-- unexpired leases (any order) and waiters a flat list {holder, joined_us, expires_us,
-- callback kind, has_key, key, ...} of unexpired entries in line order. A callback kind is
-- "sfn", "http", "unknown" or "" (no callback; never the callback itself), delivery "1"
-- pending, "0" delivered, "" none; has_key 1 and the key of a group's holder or waiter, or
-- 0 and "". limit (and per_key, "" unless the name is a semaphore group) is "" when the
-- name has no live holder or waiter.

local meta = redis.call('HMGET', D, '=limit', '=pk', '=layout', '=exp', '=hn', '=hr', '=n')
refuse_layout(meta[3], meta[4])
parse_holders(meta[5], meta[6])
local holders = {}
for _, holder in ipairs(HORDER) do
  local h = H[holder]
  if h.expires > NOW then
    table.insert(holders, holder)
    table.insert(holders, h.token)
    table.insert(holders, h.acquired)
    table.insert(holders, h.expires)
    table.insert(holders, callback_kind(h.cb))
    table.insert(holders, h.cb and (h.pending and '1' or '0') or '')
    table.insert(holders, h.key and 1 or 0)
    table.insert(holders, h.key or '')
  end
end
local waiters = {}
if tonumber(meta[7] or '0') > 0 then
  for _, m in ipairs(redis.call('ZRANGE', L, 0, -1)) do
    if m ~= SENTINEL then
      local w = parse_member(m)
      if w.expires > NOW then
        table.insert(waiters, w.holder)
        table.insert(waiters, w.joined)
        table.insert(waiters, w.expires)
        table.insert(waiters, callback_kind(w.cb))
        table.insert(waiters, w.key and 1 or 0)
        table.insert(waiters, w.key or '')
      end
    end
  end
end
local limit, per_key = '', ''
if #holders > 0 or #waiters > 0 then
  limit, per_key = meta[1] or '1', meta[2] or ''
end
return {NOW, limit, holders, waiters, per_key}
