-- status: read-only snapshot of one rate limit at the server's clock (rate_machine.status).
--
-- KEYS: M L X A (see _lib.lua)
-- ARGV: none
-- Returns {now_us, rate, per, burst, next_slot_us, waiters, admitted}: rate, per and burst
-- are "" while the name is idle (next_slot_us is then now_us); waiters is a flat list
-- {holder, joined_us, slot_us, ...} of live places in line order; admitted the times (us) of
-- the admissions of the last per seconds, oldest first. Fractional times are strings.

load()
local waiters = {}
if S.nw > 0 then
  local alive = {}
  for _, h in ipairs(redis.call('ZRANGEBYSCORE', X, '(' .. fmt(NOW), '+inf')) do
    alive[h] = true
  end
  local line = {}
  for _, h in ipairs(redis.call('ZRANGE', L, 0, -1)) do
    if alive[h] then table.insert(line, h) end
  end
  local position = 0
  each_chunk(line, function(c)
    local joined = redis.call('HMGET', M, unpack(fields('j:', c)))
    for i, h in ipairs(c) do
      table.insert(waiters, h)
      table.insert(waiters, joined[i] or fmt(NOW))
      table.insert(waiters, num(slot(position)))
      position = position + 1
    end
  end)
end
local admitted = {}
if S.na > 0 then
  local flat = redis.call('ZRANGEBYSCORE', A, '(' .. num(NOW - S.per_us), '+inf', 'WITHSCORES')
  for i = 2, #flat, 2 do table.insert(admitted, flat[i]) end
end
if #waiters == 0 and S.tat <= NOW and #admitted == 0 then
  return {NOW, '', '', '', fmt(NOW), {}, {}}
end
return {NOW, fmt(S.rate), S.per_text, fmt(S.burst), num(slot(0)), waiters, admitted}
