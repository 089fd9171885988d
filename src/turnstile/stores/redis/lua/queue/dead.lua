-- queue_dead: queue_machine.dead_letters. ARGV: [1] base [2] limit
-- KEYS: every key of the queue, in the order _lib.lua names them (META REC BODY ... WX)
-- Returns {now_us, {id, has_key, key, body, kind, attempts, enqueued_us, died_us, has_error,
-- error}...} flattened, in seq order.
local freed = purge()
local out = {}
for _, id in ipairs(redis.call('ZRANGE', DEAD, 0, tonumber(ARGV[2]) - 1)) do
  local r = get_rec(id)
  local key = redis.call('HGET', KEY, id)
  local e = redis.call('HGET', ERR, id)
  for _, v in ipairs({id, key and 1 or 0, key or '', redis.call('HGET', BODY, id), r.kind,
                      r.attempts, r.enq, r.died, e and 1 or 0, e or ''}) do
    out[#out + 1] = v
  end
end
wake(freed)
return {NOW, out}
