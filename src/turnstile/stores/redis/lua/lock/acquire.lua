-- acquire: one atomic step of model.acquire: hold, join the line, or keep one's place.
-- Idempotent per holder.
--
-- KEYS: D L CW PD (see _lib.lua)
-- ARGV: [1] key base "<prefix>{T}:"  [2] name  [3] holder  [4] limit
--       [5] ttl_us  [6] wait_ttl_us  [7] enqueue: "1" join the line, "0" take a free slot
--       only if nobody waits  [8] a callback ("" or absent: none): wait as a callback
--       waiter (with enqueue "1"); the grant, now or later, carries a pending delivery to it
--       [9] (optional, default 0) lead_us: priority x level (ranking.lead), how far ahead of
--       its arrival a new waiting entry ranks in line (see join() in _lib.lua); a waiter
--       asking again keeps its place whatever lead it names
--       [10] (optional; "" or absent: none) per_key: the name is a semaphore group whose
--       total is the limit (lock_machine.acquire: an idle name takes it, a newcomer naming
--       another one on a busy name is refused)  [11] (optional; "" or absent: none) the key
--       the caller asks for in the group (never empty: validate.group_key)  [12] (optional;
--       "" or absent: none) the channel of the caller's client, on which a grant to this
--       waiting entry is published (wake() in _lib.lua); a waiter asking again names it anew
--       [13] (optional; "" or absent: none) the caller's waiting entry as an earlier reply
--       gave it ("entry" below): how a caller whose entry is not indexed is found in line
--       [14] (optional, default "1") "1": index the caller's waiting entry under its holder
--       ("w:"..holder in D), so that a step naming the holder alone finds it; "0": the
--       caller gives its entry back in every step (a blocking acquire's own holder)
-- Returns {granted, token, acquired_us, expires_us, now_us, position, retry_after_us,
--          wait_id, notify, entry}:
--   granted = 1: token (a decimal string), acquired_us and expires_us describe the lease;
--   granted = 0: position in line (0 = next) or -1 when not in line, and retry_after_us
--   until the earliest lease expires or -1 without holders; wait_id (a decimal string, ""
--   when not in line): the caller's waiting entry (its arrival stamp), which the wake-up
--   carrying its grant names (wake() in _lib.lua); entry: that entry's member in line
--   (for ARGV 13), "" when not in line;
--   granted = 2: refused, the name is busy under another limit or per_key, given in place
--   of position and retry_after_us (-1: not a group): a newcomer naming another shape; see
--   lock_machine.limit_conflict and group_conflict;
--   notify ("" for none): the score under which the client must add the name to the index
--   of names with callbacks (index.lua), see NOTIFY in _lib.lua. Always set for a callback
--   ask.
-- Error "TURNSTILE name-collision" if the keys belong to another name (a hash collision).

local name, holder = ARGV[2], ARGV[3]
local limit, ttl, wait_ttl = tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6])
local enqueue = ARGV[7] == '1'
local callback = ARGV[8]
if callback == '' then callback = nil end
local lead = tonumber(ARGV[9] or '0')
local per_key = ARGV[10] ~= nil and ARGV[10] ~= '' and tonumber(ARGV[10]) or false
local key = ARGV[11]
if key == '' then key = nil end
local channel = ARGV[12]
if channel == '' or callback then channel = nil end -- a callback waiter is never woken
local given = ARGV[13] or ''
local index = ARGV[14] ~= '0' or callback ~= nil

load(holder)
if S.name and S.name ~= name then
  return redis.error_reply('TURNSTILE name-collision: two names share one key hash')
end
if callback then
  mark_callbacks()
  NOTIFY = true -- the deliverer learns of the name, and reschedules it, at once
end
purge(holder)
local waiting = find_waiting(holder, given)
-- model.acquire: a busy name keeps its limit and per_key; a newcomer naming another shape
-- is refused (nothing written but the purge); an idle name takes the caller's.
if busy() and S.limit then
  if S.limit ~= limit or S.pk ~= per_key then
    if not (S.mine or waiting) then
      finish_purge()
      return {2, '', 0, 0, NOW, S.limit, S.pk or -1, '', '', ''}
    end
    limit = S.limit
  end
else
  if S.limit ~= limit then pending['=limit'] = fmt(limit) end
  if S.pk ~= per_key then
    -- Only a name that was (or becomes) a group pays for this.
    if per_key then pending['=pk'] = fmt(per_key) else drop_fields({'=pk'}) end
    S.pk = per_key
  end
end
if not S.name then pending['=name'] = name end
local free, granted = promote(limit, nil) -- expiries may free slots

local mine = granted[holder] or S.mine
if mine then
  local changed = false
  if not mine.claimed then
    -- Our own grant, handed over while we waited: claim it for the full ttl.
    mine.claimed = true
    mine.expires = NOW + ttl
    changed = true
  end
  if callback and callback ~= mine.cb then
    -- A new callback (a new task token) for the grant we hold: deliver it there.
    mine.cb, mine.pending, mine.cu, mine.attempts = callback, true, 0, 0
    put_pending(holder, mine)
    changed = true
  end
  if changed then put_holder(holder, mine) end
  finish()
  return acquire_reply(1, mine)
end

local wait_id, entry, position = '', '', -1
if waiting then
  -- Keep our place (a waiter is never behind free slots: promote left free = 0, or in a
  -- group no free slot its key could take).
  local w = {holder = holder, ttl = ttl, wait_ttl = wait_ttl, joined = waiting.joined,
             expires = NOW + wait_ttl, key = waiting.key, cb = callback or waiting.cb,
             ix = waiting.ix or index}
  w.ch = not w.cb and channel or nil -- the client that asked last is woken
  position, entry = keep_place(waiting, w)
  wait_id = fmt(w.joined)
elseif free > 0 and (not S.pk or key_has_room(key)) then
  -- A slot is free and the line empty: joining and being promoted at once, in one go.
  -- (In a group the line may hold waiters, all of full keys, and a grant to this key
  -- leaves them full: the model's join-then-promote grants this caller and nobody else.)
  local h = {token = next_token(), acquired = NOW, expires = NOW + ttl, claimed = true,
             key = key}
  if callback then
    h.cb, h.pending, h.cu, h.attempts = callback, true, 0, 0
    put_pending(holder, h)
  end
  put_holder(holder, h)
  finish()
  return acquire_reply(1, h)
elseif enqueue then
  position, entry = join({holder = holder, ttl = ttl, wait_ttl = wait_ttl,
                          expires = NOW + wait_ttl, cb = callback, key = key, ch = channel,
                          ix = index}, lead)
  wait_id = fmt(S.seq)
end
local retry = retry_after()
finish()
return acquire_reply(0, nil, position, retry, wait_id, entry)
