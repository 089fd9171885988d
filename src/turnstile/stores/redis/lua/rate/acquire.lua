-- acquire: one step of rate_machine.acquire: admit, or join / keep a place in line.
--
-- KEYS: M L X A (see _lib.lua)
-- ARGV: [1] name [2] holder [3] rate [4] per (Python repr) [5] burst [6] enqueue (0|1)
--       [7] grace_us [8] (optional, default 0) lead_us: priority x level (ranking.lead), how
--       far ahead of its arrival a newcomer ranks in line (see place() in _lib.lua); a
--       waiter asking again keeps its place whatever lead it names
-- Returns {1, -1, now_us, "0", tat_us} when admitted; {0, position or -1, now_us,
-- retry_after_us, tat_us} otherwise (-1: did not join); {2, rate, per, burst} (the busy
-- name's own) when the name is in use with another rate. Fractional times are strings.

local name, holder = ARGV[1], ARGV[2]
local rate, per_text, burst = tonumber(ARGV[3]), ARGV[4], tonumber(ARGV[5])
local enqueue, grace = ARGV[6] == '1', tonumber(ARGV[7])
local lead = tonumber(ARGV[8] or '0')

load()
purge_waiters()
purge_admissions()
local same = S.rate == rate and S.per_text == per_text and S.burst == burst
if S.nw <= 0 and S.tat <= NOW then
  if not same then -- an idle name (or one whose tat has passed) takes the caller's rate
    S.rate, S.per_text, S.burst = rate, per_text, burst
    S.per = tonumber(per_text)
    derive()
    dirty = true
  end
elseif not same then
  save(name) -- keep what the purge removed
  return {2, fmt(S.rate), S.per_text, fmt(S.burst)}
end

local index = false
if S.nw > 0 then
  local r = redis.call('ZRANK', L, holder)
  if r then index = r end
end
local conforms = NOW >= S.tat - S.tolerance
if conforms and (index == 0 or (index == false and S.nw <= 0)) then
  if index == 0 then remove_waiter(holder) end
  admit()
  save(name)
  return {1, -1, NOW, '0', num(S.tat)}
end
if index == false then
  if not enqueue then
    save(name)
    return {0, -1, NOW, num(slot(S.nw) - NOW), num(S.tat)}
  end
  local stamp, rank
  stamp, rank, index = place(lead)
  if index == 0 and conforms then -- it ranks ahead of everyone and its slot has come
    admit()
    save(name)
    return {1, -1, NOW, '0', num(S.tat)}
  end
  join(holder, stamp, rank)
end
local due = slot(index)
redis.call('ZADD', X, num(due + grace), holder)
written[X] = true
covers(due + grace)
save(name)
return {0, index, NOW, num(math.max(0, due - NOW)), num(S.tat)}
