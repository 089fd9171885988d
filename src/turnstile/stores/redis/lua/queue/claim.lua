-- queue_claim: queue_machine.claim. ARGV: [1] base [2] name [3] receipt [4] visibility_us
-- KEYS: every key of the queue, in the order _lib.lua names them (META REC BODY ... WX)
-- [5] concurrency or -1 [6] max_attempts [7] waiter or ""
-- Returns {1, id, has_key, key, body, kind, attempt, enqueued_us, deadline_us, now_us}
--      or {0, now_us, retry_after_us or -1}.
local err = check_name(ARGV[2])
if err then return err end
local receipt, vt, cap = ARGV[3], tonumber(ARGV[4]), tonumber(ARGV[5])
local max_attempts, waiter = tonumber(ARGV[6]), ARGV[7]
local freed = purge()
local chosen, r = nil, nil
if cap < 0 or redis.call('ZCARD', FLY) < cap then
  local start = 0
  while chosen == nil do
    local batch = redis.call('ZRANGE', CAND, start, start + SCAN - 1)
    if #batch == 0 then break end
    for _, id in ipairs(batch) do
      local c = get_rec(id)
      if c.avail <= NOW then
        chosen, r = id, c
        break
      end
    end
    start = start + SCAN
  end
end
if chosen == nil then
  if waiter ~= '' then register(waiter) end
  local times = {}
  local due = redis.call('ZRANGEBYSCORE', DUE, '(' .. fmt(NOW), '+inf', 'WITHSCORES', 'LIMIT', 0, 1)
  if #due > 0 then times[#times + 1] = tonumber(due[2]) end
  local fly = redis.call('ZRANGE', FLY, 0, 0, 'WITHSCORES')
  if #fly > 0 then times[#times + 1] = tonumber(fly[2]) end
  local retry = -1
  if #times > 0 then retry = math.max(0, math.min(unpack(times)) - NOW) end
  wake(freed)
  return {0, NOW, retry}
end
if waiter ~= '' then unregister(waiter) end
r.state, r.attempts, r.max, r.deadline = 1, r.attempts + 1, max_attempts, NOW + vt
put_rec(chosen, r)
redis.call('ZREM', CAND, chosen)
redis.call('ZREM', DUE, chosen)
redis.call('ZADD', FLY, fmt(r.deadline), chosen)
redis.call('HSET', RCPT, chosen, receipt)
local key = redis.call('HGET', KEY, chosen)
wake(freed - 1)
return {1, chosen, key and 1 or 0, key or '', redis.call('HGET', BODY, chosen), r.kind,
        r.attempts, r.enq, r.deadline, NOW}
