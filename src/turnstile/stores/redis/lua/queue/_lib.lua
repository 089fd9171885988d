-- Turnstile queues on Redis: helpers shared by every script in this folder (prepended to each).
-- The steps of turnstile/_core/queue_machine.py; times are integer microseconds on the server
-- clock (TIME), read before any write (Redis replicates a script's effects).
--
-- Keys of one queue share the hash tag {T} (a hash of the name, never the name itself), so
-- a queue lives in one Cluster slot. KEYS, in this order (names relative to ARGV[1], the key
-- base "<prefix>{T}:q:"):
--   META  meta   hash  name, seq (last message seq), wseq (last waiter seq)
--   REC   rec    hash  id -> "seq kind enqueued avail attempts max_attempts state deadline died"
--   BODY  body   hash  id -> payload bytes
--   KEY   key    hash  id -> key (keyed messages only)
--   RCPT  rcpt   hash  id -> receipt (in-flight messages only)
--   ERR   err    hash  id -> last error
--   CAND  cand   zset  deliverable candidates by seq: ready messages that are keyless or
--                      the oldest pending message (the head) of their key
--   DUE   due    zset  ready messages by avail (due time)
--   FLY   fly    zset  in-flight messages by deadline
--   DEAD  dead   zset  dead letters by seq
--   ENQ   enq    zset  pending (ready or in flight) messages by enqueued time
--   DEPTH depth  zset  key -> number of pending messages
--   DD    dd     hash  dedup_id -> id;   DDX  ddx  zset  dedup_id by expiry
--   WQ    w      zset  registered waiters by registration seq;  WX  wx  zset  by expiry
-- Not in KEYS but in the same slot (same tag): BASE .. "k:" .. key, a zset of the key's
-- pending ids by seq, and BASE .. "s:" .. waiter, the wake-up list one waiter BLPOPs.
-- state: 0 ready, 1 in flight, 2 dead. kind: 0 JSON, 1 bytes.

-- The keys, the key base and NOW are set per step by begin() (below), which each operation
-- calls first: a script makes these helpers for one step, a function library (see
-- stores/redis/scripts.py) once for every step.
local META, REC, BODY, KEY, RCPT, ERR
local CAND, DUE, FLY, DEAD, ENQ, DEPTH
local DD, DDX, WQ, WX
local BASE
local EXPIRED = 'visibility timeout passed before ack'
local NACKED = 'nacked'
local WAITER_TTL_US = 6000000 -- queue_machine.WAITER_TTL
local SCAN = 200

local NOW

-- The start of a step: every variable above as a new step finds it.
local function begin()
  META, REC, BODY, KEY, RCPT, ERR = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]
  CAND, DUE, FLY, DEAD, ENQ, DEPTH = KEYS[7], KEYS[8], KEYS[9], KEYS[10], KEYS[11], KEYS[12]
  DD, DDX, WQ, WX = KEYS[13], KEYS[14], KEYS[15], KEYS[16]
  BASE = ARGV[1]
  NOW = server_us()
end

local function get_rec(id)
  local s = redis.call('HGET', REC, id)
  if not s then return nil end
  local seq, kind, enq, avail, att, max, state, deadline, died =
    string.match(s, '^(%d+) (%d) (%d+) (%d+) (%d+) (%d+) (%d) (%d+) (%d+)$')
  return {seq = tonumber(seq), kind = tonumber(kind), enq = tonumber(enq),
          avail = tonumber(avail), attempts = tonumber(att), max = tonumber(max),
          state = tonumber(state), deadline = tonumber(deadline), died = tonumber(died)}
end

local function put_rec(id, r)
  redis.call('HSET', REC, id, table.concat({fmt(r.seq), fmt(r.kind), fmt(r.enq), fmt(r.avail),
    fmt(r.attempts), fmt(r.max), fmt(r.state), fmt(r.deadline), fmt(r.died)}, ' '))
end

local function key_zset(key)
  return BASE .. 'k:' .. key
end

local function check_name(name)
  local stored = redis.call('HGET', META, 'name')
  if stored and stored ~= name then
    return redis.error_reply('TURNSTILE name-collision: two queues share one key hash')
  end
  if not stored then redis.call('HSET', META, 'name', name) end
  return nil
end

-- The key's head (its pending message with the smallest seq) becomes a candidate if ready.
local function promote_head(key)
  local head = redis.call('ZRANGE', key_zset(key), 0, 0)
  if #head == 0 then return end
  local r = get_rec(head[1])
  if r and r.state == 0 then redis.call('ZADD', CAND, fmt(r.seq), head[1]) end
end

-- A message leaves the pending set (acked or dead): its key moves on.
local function leave_pending(id)
  redis.call('ZREM', ENQ, id)
  redis.call('ZREM', CAND, id)
  redis.call('ZREM', DUE, id)
  redis.call('ZREM', FLY, id)
  redis.call('HDEL', RCPT, id)
  local key = redis.call('HGET', KEY, id)
  if key then
    redis.call('ZREM', key_zset(key), id)
    if tonumber(redis.call('ZINCRBY', DEPTH, -1, key)) <= 0 then
      redis.call('ZREM', DEPTH, key)
    end
    promote_head(key)
  end
end

local function kill(id, r, at)
  r.state, r.died = 2, at
  put_rec(id, r)
  redis.call('ZADD', DEAD, fmt(r.seq), id)
  leave_pending(id)
end

-- Ready again, due at `at`; it is still its key's head (or keyless), so a candidate.
local function make_ready(id, r, at)
  r.state, r.avail = 0, at
  put_rec(id, r)
  redis.call('ZREM', FLY, id)
  redis.call('HDEL', RCPT, id)
  redis.call('ZADD', DUE, fmt(at), id)
  redis.call('ZADD', CAND, fmt(r.seq), id)
end

-- queue_machine.purge: time out in-flight messages; drop expired dedup entries and waiters.
local function purge()
  local freed = 0
  local gone = redis.call('ZRANGEBYSCORE', FLY, '-inf', fmt(NOW))
  for _, id in ipairs(gone) do
    local r = get_rec(id)
    redis.call('HSET', ERR, id, EXPIRED)
    if r.attempts >= r.max then kill(id, r, r.deadline) else make_ready(id, r, r.deadline) end
    freed = freed + 1
  end
  gone = redis.call('ZRANGEBYSCORE', DDX, '-inf', fmt(NOW))
  for _, d in ipairs(gone) do
    redis.call('HDEL', DD, d)
    redis.call('ZREM', DDX, d)
  end
  gone = redis.call('ZRANGEBYSCORE', WX, '-inf', fmt(NOW))
  for _, w in ipairs(gone) do
    redis.call('ZREM', WQ, w)
    redis.call('ZREM', WX, w)
  end
  return freed
end

-- queue_machine.take_waiters: wake the `count` oldest registered waiters, one push each.
local function wake(count)
  if count <= 0 then return 0 end
  local front = redis.call('ZRANGE', WQ, 0, count - 1)
  for _, w in ipairs(front) do
    redis.call('ZREM', WQ, w)
    redis.call('ZREM', WX, w)
    local list = BASE .. 's:' .. w
    redis.call('RPUSH', list, '1')
    redis.call('PEXPIRE', list, fmt(2 * WAITER_TTL_US / 1000))
  end
  return #front
end

local function register(waiter)
  if not redis.call('ZSCORE', WQ, waiter) then
    redis.call('ZADD', WQ, fmt(redis.call('HINCRBY', META, 'wseq', 1)), waiter)
  end
  redis.call('ZADD', WX, fmt(NOW + WAITER_TTL_US), waiter)
end

local function unregister(waiter)
  redis.call('ZREM', WQ, waiter)
  redis.call('ZREM', WX, waiter)
end

-- The in-flight message `id` if `receipt` is its current delivery's, else nil.
local function holding(id, receipt)
  local r = get_rec(id)
  if not r or r.state ~= 1 or redis.call('HGET', RCPT, id) ~= receipt then return nil end
  return r
end

-- queue_machine.ack without its purge and wake-ups: delete `id` if `receipt` is its current
-- delivery's. True if it did.
local function ack_one(id, receipt)
  if not holding(id, receipt) then return false end
  leave_pending(id)
  redis.call('HDEL', REC, id)
  redis.call('HDEL', BODY, id)
  redis.call('HDEL', KEY, id)
  redis.call('HDEL', ERR, id)
  return true
end

-- queue_machine.claim's hand-out without its purge, waiter and wake-ups: the first due
-- candidate (the oldest ready message that is keyless or heads its key) goes in flight with
-- `receipt` until NOW + vt, unless `cap` (>= 0) are in flight. Its id and record, or nil.
local function claim_one(receipt, vt, cap, max_attempts)
  if cap >= 0 and redis.call('ZCARD', FLY) >= cap then return nil end
  local chosen, r = nil, nil
  local start = 0
  while chosen == nil do
    local batch = redis.call('ZRANGE', CAND, start, start + SCAN - 1)
    if #batch == 0 then return nil end
    for _, id in ipairs(batch) do
      local c = get_rec(id)
      if c.avail <= NOW then
        chosen, r = id, c
        break
      end
    end
    start = start + SCAN
  end
  r.state, r.attempts, r.max, r.deadline = 1, r.attempts + 1, max_attempts, NOW + vt
  put_rec(chosen, r)
  redis.call('ZREM', CAND, chosen)
  redis.call('ZREM', DUE, chosen)
  redis.call('ZADD', FLY, fmt(r.deadline), chosen)
  redis.call('HSET', RCPT, chosen, receipt)
  return chosen, r
end

-- queue_machine.retry_after in microseconds: until the next delayed message comes due or the
-- next in-flight message times out; -1 if neither.
local function retry_after_us()
  local times = {}
  local due = redis.call('ZRANGEBYSCORE', DUE, '(' .. fmt(NOW), '+inf', 'WITHSCORES', 'LIMIT', 0, 1)
  if #due > 0 then times[#times + 1] = tonumber(due[2]) end
  local fly = redis.call('ZRANGE', FLY, 0, 0, 'WITHSCORES')
  if #fly > 0 then times[#times + 1] = tonumber(fly[2]) end
  if #times == 0 then return -1 end
  return math.max(0, math.min(unpack(times)) - NOW)
end

-- Dead letters named in ARGV[from..] (or all when none are named), in seq order.
local function dead_ids(from)
  if #ARGV < from then return redis.call('ZRANGE', DEAD, 0, -1) end
  local found, seen = {}, {}
  for i = from, #ARGV do
    local id = ARGV[i]
    local score = redis.call('ZSCORE', DEAD, id)
    if score and not seen[id] then
      seen[id] = true
      found[#found + 1] = {tonumber(score), id}
    end
  end
  table.sort(found, function(a, b) return a[1] < b[1] end)
  local ids = {}
  for i, pair in ipairs(found) do ids[i] = pair[2] end
  return ids
end

-- ---- operation ------------------------------------------------------------------------
