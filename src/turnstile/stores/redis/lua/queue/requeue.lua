-- queue_requeue: queue_machine.requeue. ARGV: [1] base [2..] ids (none: every dead letter).
-- KEYS: every key of the queue, in the order _lib.lua names them (META REC BODY ... WX)
-- Returns how many dead letters went back to the end of the queue.
local freed = purge()
local ids = dead_ids(2)
for _, id in ipairs(ids) do
  local r = get_rec(id)
  redis.call('ZREM', DEAD, id)
  redis.call('HDEL', ERR, id)
  r.seq = tonumber(redis.call('HINCRBY', META, 'seq', 1))
  r.state, r.attempts, r.avail, r.died = 0, 0, NOW, 0
  put_rec(id, r)
  redis.call('ZADD', DUE, fmt(NOW), id)
  redis.call('ZADD', ENQ, fmt(r.enq), id)
  local key = redis.call('HGET', KEY, id)
  if key then
    redis.call('ZADD', key_zset(key), fmt(r.seq), id)
    redis.call('ZINCRBY', DEPTH, 1, key)
    promote_head(key)
  else
    redis.call('ZADD', CAND, fmt(r.seq), id)
  end
end
wake(freed + #ids)
return #ids
