-- queue_ack: queue_machine.ack. ARGV: [1] base [2] id [3] receipt. Returns 1 or 0.
-- KEYS: every key of the queue, in the order _lib.lua names them (META REC BODY ... WX)
local freed = purge()
if not ack_one(ARGV[2], ARGV[3]) then
  wake(freed)
  return 0
end
wake(freed + 1)
return 1
