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
local chosen, r = claim_one(receipt, vt, cap, max_attempts)
if chosen == nil then
  if waiter ~= '' then register(waiter) end
  local retry = retry_after_us()
  wake(freed)
  return {0, NOW, retry}
end
if waiter ~= '' then unregister(waiter) end
local key = redis.call('HGET', KEY, chosen)
wake(freed - 1)
return {1, chosen, key and 1 or 0, key or '', redis.call('HGET', BODY, chosen), r.kind,
        r.attempts, r.enq, r.deadline, NOW}
