-- queue_ack_claim_many: queue_machine.ack of each (id, receipt) pair, then queue_machine.claim
-- once per receipt until one finds nothing (only the first naming the waiter), in one
-- script: the worker loop's step between two batches (and between two messages).
-- KEYS: every key of the queue, in the order _lib.lua names them (META REC BODY ... WX)
-- ARGV: [1] base [2] name [3] visibility_us [4] concurrency or -1 [5] max_attempts
-- [6] waiter or "" (new: not registered before) [7] number of acks n, then n pairs
-- (id, receipt), then one receipt per claim (at least one).
-- Returns {{acked 1/0 per pair}, {{id, has_key, key, body, kind, attempt, enqueued_us,
-- deadline_us} per claimed message, oldest first}, now_us, retry_after_us or -1 (-1 also
-- when a message was claimed)}.
local err = check_name(ARGV[2])
if err then return err end
local vt, cap, max_attempts = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
local waiter, n_acks = ARGV[6], tonumber(ARGV[7])
local wakes = purge()
local acked = {}
for i = 1, n_acks do
  if ack_one(ARGV[6 + 2 * i], ARGV[7 + 2 * i]) then
    acked[i] = 1
    wakes = wakes + 1
  else
    acked[i] = 0
  end
end
local claimed = {}
for i = 8 + 2 * n_acks, #ARGV do
  local chosen, r = claim_one(ARGV[i], vt, cap, max_attempts)
  if chosen == nil then break end
  local key = redis.call('HGET', KEY, chosen)
  claimed[#claimed + 1] = {chosen, key and 1 or 0, key or '', redis.call('HGET', BODY, chosen),
                           r.kind, r.attempts, r.enq, r.deadline}
end
local retry = -1
if #claimed == 0 then
  retry = retry_after_us()
  -- As the steps one after another: the acks wake before the claim registers the waiter;
  -- without an ack, the claim registers it and then wakes for its time-outs.
  if n_acks > 0 then wake(wakes) end
  if waiter ~= '' then register(waiter) end
  if n_acks == 0 then wake(wakes) end
else
  if waiter ~= '' then unregister(waiter) end
  if n_acks == 0 then wakes = wakes - 1 end -- the first claim took one of its time-outs
  wake(wakes)
end
return {acked, claimed, NOW, retry}
