-- queue_put: queue_machine.put. ARGV: [1] base [2] name [3] id [4] key or "" [5] body
-- KEYS: every key of the queue, in the order _lib.lua names them (META REC BODY ... WX)
-- [6] kind [7] delay_us [8] dedup_id or "" [9] max_attempts [10] dedup_window_us
-- Returns {id, created (0|1), now_us}.
local err = check_name(ARGV[2])
if err then return err end
local id, key, dedup = ARGV[3], ARGV[4], ARGV[8]
local freed = purge()
if dedup ~= '' then
  local existing = redis.call('HGET', DD, dedup)
  if existing then
    wake(freed)
    return {existing, 0, NOW}
  end
end
if redis.call('HEXISTS', REC, id) == 1 then
  wake(freed)
  return {id, 0, NOW}
end
local seq = tonumber(redis.call('HINCRBY', META, 'seq', 1))
local r = {seq = seq, kind = tonumber(ARGV[6]), enq = NOW, avail = NOW + tonumber(ARGV[7]),
           attempts = 0, max = tonumber(ARGV[9]), state = 0, deadline = 0, died = 0}
put_rec(id, r)
redis.call('HSET', BODY, id, ARGV[5])
redis.call('ZADD', DUE, fmt(r.avail), id)
redis.call('ZADD', ENQ, fmt(NOW), id)
if key ~= '' then
  redis.call('HSET', KEY, id, key)
  redis.call('ZADD', key_zset(key), fmt(seq), id)
  redis.call('ZINCRBY', DEPTH, 1, key)
  if redis.call('ZCARD', key_zset(key)) == 1 then redis.call('ZADD', CAND, fmt(seq), id) end
else
  redis.call('ZADD', CAND, fmt(seq), id)
end
if dedup ~= '' then
  redis.call('HSET', DD, dedup, id)
  redis.call('ZADD', DDX, fmt(NOW + tonumber(ARGV[10])), dedup)
end
wake(freed + 1)
return {id, 1, NOW}
