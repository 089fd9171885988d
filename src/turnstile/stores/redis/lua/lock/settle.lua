-- settle: model.settle_delivery: settle the pending delivery of the grant with this token,
-- "delivered" (done), "refused" (release the grant; the next in line is granted, and woken
-- or given a pending delivery, in this same step) or "retry" (the claim runs out in
-- retry_us, for another take).
--
-- KEYS: D L CW PD (see _lib.lua)
-- ARGV: [1] key base  [2] token (decimal string)  [3] outcome  [4] retry_us
-- Returns {settled (1|0), notify or 0, retry_at_us or 0}: 0 and nothing settled when the
-- grant is gone or its delivery was settled already; notify as in _lib.lua (NOTIFY);
-- retry_at_us when the delivery is due again (the client schedules the name then).

local token, outcome, retry = ARGV[2], ARGV[3], tonumber(ARGV[4])
load('')
purge('')
local holder, h
if S.cb then
  for _, m in ipairs(redis.call('ZRANGE', PD, 0, -1)) do
    local r = H[m]
    if r and r.token == token then holder, h = m, r end
  end
end
local settled, retry_at = 0, 0
if h and h.pending then
  settled = 1
  if outcome == 'delivered' then
    h.pending, h.cu = false, 0
    put_holder(holder, h)
    redis.call('ZREM', PD, holder)
  elseif outcome == 'refused' then
    drop_holder(holder)
  else -- retry
    h.cu = NOW + retry
    put_holder(holder, h)
    put_pending(holder, h)
    retry_at = h.cu
  end
end
if S.limit and N > 0 then promote(S.limit, nil) end
finish()
local notify = notify_score()
return {settled, notify ~= '' and notify or 0, retry_at}
