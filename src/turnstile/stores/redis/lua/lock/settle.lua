-- settle: model.settle_delivery: settle the pending delivery of the grant with this token,
-- "delivered" (done), "refused" (release the grant; the next in line is granted, and woken
-- or given a pending delivery, in this same step) or "retry" (the claim runs out in
-- retry_us, for another take).
--
-- KEYS: D HX WX WQ CW PD (see _lib.lua)
-- ARGV: [1] key base  [2] token (decimal string)  [3] outcome  [4] retry_us
-- Returns {settled (1|0), notify or 0, retry_at_us or 0}: 0 and nothing settled when the
-- grant is gone or its delivery was settled already; notify as in _lib.lua (NOTIFY);
-- retry_at_us when the delivery is due again (the client schedules the name then).

local token, outcome, retry = ARGV[2], ARGV[3], tonumber(ARGV[4])
load('')
purge('')
local holder, h
if S.cb then
  local members = redis.call('ZRANGE', PD, 0, -1)
  unpack_chunks(members, function(c)
    local recs = redis.call('HMGET', D, unpack(fields('h:', c)))
    for i, m in ipairs(c) do
      if recs[i] then
        local r = parse_holder(recs[i])
        if r.token == token then holder, h = m, r end
      end
    end
  end)
end
local settled, retry_at = 0, 0
if h and h.pending then
  settled = 1
  if outcome == 'delivered' then
    h.pending, h.cu = false, 0
    pending['h:' .. holder] = pack_holder(h)
    redis.call('ZREM', PD, holder)
  elseif outcome == 'refused' then
    drop_holder(holder)
  else -- retry
    h.cu = NOW + retry
    pending['h:' .. holder] = pack_holder(h)
    put_pending(holder, h)
    retry_at = h.cu
  end
end
if S.limit and not NO_WAITERS then promote(S.limit, nil) end
finish()
return {settled, notify_score() or 0, retry_at}
