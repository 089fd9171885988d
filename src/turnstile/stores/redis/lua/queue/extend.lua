-- queue_extend: queue_machine.extend. ARGV: [1] base [2] id [3] receipt [4] seconds_us
-- KEYS: every key of the queue, in the order _lib.lua names them (META REC BODY ... WX)
-- Returns the new deadline_us, or -1 if the receipt is stale.
local id = ARGV[2]
local freed = purge()
local r = holding(id, ARGV[3])
if not r then
  wake(freed)
  return -1
end
r.deadline = NOW + tonumber(ARGV[4])
put_rec(id, r)
redis.call('ZADD', FLY, fmt(r.deadline), id)
wake(freed)
return r.deadline
