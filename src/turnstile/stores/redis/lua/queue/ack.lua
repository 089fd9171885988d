-- queue_ack: queue_machine.ack. ARGV: [1] base [2] id [3] receipt. Returns 1 or 0.
-- KEYS: every key of the queue, in the order _lib.lua names them (META REC BODY ... WX)
local id = ARGV[2]
local freed = purge()
local r = holding(id, ARGV[3])
if not r then
  wake(freed)
  return 0
end
leave_pending(id)
redis.call('HDEL', REC, id)
redis.call('HDEL', BODY, id)
redis.call('HDEL', KEY, id)
redis.call('HDEL', ERR, id)
wake(freed + 1)
return 1
