-- index: the store-wide index of names with callbacks, for deliverers (not a name's
-- script: the keys of _lib.lua's header do not apply, only its NOW and helpers).
--
-- KEYS: [1] I     zset  "<prefix>{callbacks}:due": a name's hash tag T scored by when it
--                       next needs a take (us, the name's server clock), or by
--                       notify - 1e15 when a step on the name asked for one now (_lib.lua,
--                       NOTIFY: every such score is below any real time, and unique)
--       [2] IDLE  hash  "<prefix>{callbacks}:idle": T -> "1" once a take found the name
--                       without callbacks; a second such take removes it from I
-- ARGV: [1] mode, then
--   "due", max_count:          the entries due now, {T, score, ...} earliest first;
--   "all":                     every T (pending_deliveries counts over them);
--   "notify", T, score, ...:   add or move each T to score, when that is earlier, or when
--                              both are notifications (a new one replaces an older one:
--                              its score changed, so a deliverer's reschedule based on the
--                              older one is refused);
--   "reschedule", linger_us, T, seen, next, ...:  for each T whose score is still `seen`
--                              (nobody notified since the deliverer read it), move it to
--                              next, or when next is -1 (no callbacks) mark it idle and
--                              keep it linger_us longer, or remove it if it was idle.
-- Every write keeps both keys 30 days past now (a store nobody delivers for is cleaned).

local I, IDLE = KEYS[1], KEYS[2]
local LINE = 1000000000000000 -- scores below are notifications
local mode = ARGV[1]

local function keep()
  local at = fmt(math.floor(NOW / 1000) + 30 * 86400 * 1000)
  redis.call('PEXPIREAT', I, at)
  redis.call('PEXPIREAT', IDLE, at)
end

if mode == 'due' then
  return redis.call('ZRANGEBYSCORE', I, '-inf', fmt(NOW), 'WITHSCORES', 'LIMIT', 0,
                    tonumber(ARGV[2]))
elseif mode == 'all' then
  return redis.call('ZRANGE', I, 0, -1)
elseif mode == 'notify' then
  for i = 2, #ARGV, 2 do
    local member, score = ARGV[i], tonumber(ARGV[i + 1])
    local cur = redis.call('ZSCORE', I, member)
    if cur then cur = tonumber(cur) else cur = nil end
    if cur == nil or score < cur or (score < LINE and cur < LINE and score ~= cur) then
      redis.call('ZADD', I, fmt(score), member)
    end
  end
  keep()
  return 1
elseif mode == 'reschedule' then
  local linger = tonumber(ARGV[2])
  for i = 3, #ARGV, 3 do
    local member, seen, nxt = ARGV[i], tonumber(ARGV[i + 1]), tonumber(ARGV[i + 2])
    local cur = redis.call('ZSCORE', I, member)
    if cur and tonumber(cur) == seen then
      if nxt >= 0 then
        redis.call('ZADD', I, fmt(nxt), member)
        redis.call('HDEL', IDLE, member)
      elseif redis.call('HEXISTS', IDLE, member) == 1 then
        redis.call('ZREM', I, member)
        redis.call('HDEL', IDLE, member)
      else
        redis.call('HSET', IDLE, member, '1')
        redis.call('ZADD', I, fmt(NOW + linger), member)
      end
    end
  end
  keep()
  return 1
end
return redis.error_reply('TURNSTILE index: unknown mode')
