-- queue_nack: queue_machine.nack. ARGV: [1] base [2] id [3] receipt [4] delay_us
-- KEYS: every key of the queue, in the order _lib.lua names them (META REC BODY ... WX)
-- [5] has_error (0|1) [6] error. Returns 1 or 0.
local id = ARGV[2]
local freed = purge()
local r = holding(id, ARGV[3])
if not r then
  wake(freed)
  return 0
end
redis.call('HSET', ERR, id, ARGV[5] == '1' and ARGV[6] or NACKED)
if r.attempts >= r.max then kill(id, r, NOW) else make_ready(id, r, NOW + tonumber(ARGV[4])) end
wake(freed + 1)
return 1
