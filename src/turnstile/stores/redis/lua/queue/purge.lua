-- queue_purge: queue_machine.purge_dead. ARGV: [1] base [2..] ids (none: every dead letter).
-- KEYS: every key of the queue, in the order _lib.lua names them (META REC BODY ... WX)
-- Returns how many dead letters were deleted.
local freed = purge()
local ids = dead_ids(2)
for _, id in ipairs(ids) do
  redis.call('ZREM', DEAD, id)
  for _, h in ipairs({REC, BODY, KEY, ERR}) do redis.call('HDEL', h, id) end
end
wake(freed)
return #ids
