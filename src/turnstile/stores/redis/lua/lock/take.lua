-- take: model.take_deliveries on one name, for a deliverer: drop what expired (an
-- undelivered grant with it), grant what that freed (waking plain waiters, writing the
-- pending deliveries of callback waiters), then claim up to max_count pending deliveries
-- nobody holds a claim on, for lease_us, oldest grant first.
--
-- KEYS: D L CW PD (see _lib.lua)
-- ARGV: [1] key base  [2] lease_us  [3] max_count  [4] recheck_us
-- Returns {now_us, next_us, name, limit, deliveries}: next_us is when the name next needs a
-- take (the earliest of a pending delivery's claim running out, a lease or callback
-- waiter's expiry, and now + recheck_us: the index never trusts a schedule further), or -1
-- when the name has no callback waiter and no pending delivery left ("=cb" is then
-- cleared); deliveries is a flat list {holder, token, acquired_us, expires_us, callback,
-- attempts, ...}.

local lease, max_count, recheck = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
load('')
if not S.name then return {NOW, -1, '', 0, {}} end
purge('')
local limit = S.limit or 1
if S.limit and N > 0 then promote(S.limit, nil) end

local taken = {}
if S.cb and max_count > 0 then
  local due = redis.call('ZRANGEBYSCORE', PD, '-inf', fmt(NOW))
  local rows, stale = {}, {}
  for _, holder in ipairs(due) do
    local h = H[holder]
    if h and h.pending then
      table.insert(rows, {holder, h})
    else
      table.insert(stale, holder) -- settled or gone: a stale entry
    end
  end
  unpack_chunks(stale, function(c) redis.call('ZREM', PD, unpack(c)) end)
  table.sort(rows, function(a, b) return tonumber(a[2].token) < tonumber(b[2].token) end)
  local z = {}
  for i = 1, math.min(max_count, #rows) do
    local holder, h = rows[i][1], rows[i][2]
    h.cu = NOW + lease
    h.attempts = h.attempts + 1
    put_holder(holder, h)
    table.insert(z, fmt(h.cu))
    table.insert(z, holder)
    cbkeys[PD] = true
    for _, v in ipairs({holder, h.token, h.acquired, h.expires, h.cb, h.attempts}) do
      table.insert(taken, v)
    end
  end
  if #z > 0 then redis.call('ZADD', PD, unpack(z)) end
end

local next_us = -1
local first_cw, first_pd = first_score(CW), first_score(PD)
if first_cw == nil and first_pd == nil then
  if S.cb then drop_fields({'=cb'}) end
else
  mark_callbacks()
  next_us = NOW + recheck
  local first_h = retry_after()
  first_h = first_h >= 0 and NOW + first_h or nil
  for _, at in pairs({first_cw or false, first_pd or false, first_h or false}) do
    if at and at < next_us then next_us = at end
  end
end
finish()
return {NOW, next_us, S.name, limit, taken}
