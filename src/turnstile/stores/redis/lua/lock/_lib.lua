-- Turnstile on Redis: helpers shared by every operation script.
--
-- This file is prepended to each operation script when it is loaded (one EVALSHA per
-- operation; Redis has no includes). It implements the steps of turnstile/_core/lock_machine.py.
--
-- Keys of one name, all under one hash tag {T} (T = a hash of the name, never the name
-- itself) so they share a Cluster slot; every script gets them in this order:
--   KEYS[1] D   hash  "=name" the name, "=limit", "=last" last fencing token,
--                     "=seq" the newest waiter's arrival stamp (us, strictly increasing
--                     per name; a plain counter before priorities), "=exp" time up to
--                     which the keys' own expiry covers every entry (us), "=cb" "1" while
--                     the name may have callback waiters or pending deliveries (CW, PD
--                     kept up to date), "=pk" a semaphore group's per-key limit (absent:
--                     a plain lock or semaphore; "=limit" is then the group's total),
--                     "=fast" "<last> <seq> <kind>" and "=due" "<due_us> <last> <seq>":
--                     what a step knew at its end, stamped with "=last" and "=seq" then
--                     (see FAST, HMAX and DUE below; a stamp that no longer matches is
--                     ignored), "=all" a time (us) up to which every one of D, HX, WX, WQ
--                     that exists is known to expire after its entries (see ALL below),
--                     "=layout" never written here: a name a later release keeps in
--                     another layout, which every step refuses (refuse_layout(), _head.lua),
--                     "h:"..holder -> "token acquired_us expires_us claimed(0|1)", or for a
--                       callback grant "token acquired_us expires_us claimed pending(0|1)
--                       claimed_until_us attempts callback" (the callback text last: it may
--                       hold spaces),
--                     "w:"..holder -> "ttl_us wait_ttl_us joined_us expires_us" (joined_us:
--                       the arrival stamp), followed for a waiter to be woken by
--                       " @<bytes> <channel>" (its client's channel, see wake()), or for a
--                       callback waiter by " callback" (a JSON object);
--                     a group's holder or waiter record starts with its key, length first:
--                       "k<bytes> <key> " then the record above (a key may hold spaces and
--                       anything but NUL; a record without it, as every record written
--                       before groups, has no key)
--   KEYS[2] HX  zset  holder scored by its lease's expires_us
--   KEYS[3] WX  zset  waiter scored by its waiting entry's expires_us
--   KEYS[4] WQ  zset  waiter scored by rank (turnstile/_core/ranking.py: its arrival stamp
--                     less priority x level, fixed when it joins): the line, smallest
--                     first, FIFO within a rank (see join(); entries from before
--                     priorities are scored by a small counter, so they stay first)
--   KEYS[5] CW  zset  callback waiters scored by their waiting entry's expires_us
--   KEYS[6] PD  zset  holders whose delivery is pending, scored by the deliverer's claim on
--                     it (claimed_until_us; 0: nobody's)
-- CW and PD are touched only while "=cb" is set, so a name that never had a callback waiter
-- sends exactly the commands it sent before callbacks existed.
-- ARGV[1] is the common key base "<prefix>{T}:". A waiter is woken by a PUBLISH on its
-- client's channel (wake()), which is not a key: nothing to keep, expire or clean up.
--
-- Times are integer microseconds on the server clock (TIME). Redis 5+ replicates a script's
-- effects, not the script, so reading TIME before writing is safe on replicas and in AOF.
-- Every key expires by itself KEEP_US after the latest entry in it (the token counter must
-- outlive the name's leases); the Redis commands an operation sends do not depend on the
-- number of waiters.

-- Per step, as every variable below that a step changes: set by begin() (at the end of this
-- file's declarations), which each operation calls first, after its fast path if it has one.
-- The helpers below see the values of the step running: a script (EVALSHA) makes them for
-- one step, a function library (FCALL, see stores/redis/scripts.py) once for every step.
local D, HX, WX, WQ, CW, PD
local BASE
local CHUNK = 1000 -- stay well below Lua's unpack() limit
-- KEEP_US, SLACK_US, read_name(), coverage() and expiry_at() are declared in _head.lua, ahead
-- of the fast paths; fmt() and server_us() in lua/_common.lua, ahead of everything.

local NOW

-- State read at the start of an operation (one HMGET), written back by finish().
local S
local pending    -- D fields to write in finish(): field -> value
local dropped    -- D fields to delete in finish(), all in one HDEL: field -> true
local extend     -- keys whose expiry must cover an entry: key -> latest such expiry
local made       -- keys this step may have made (Redis drops empty zsets): key -> true
local newest     -- latest expiry written by this operation
-- Known to be empty (learnt by purge(), kept up to date after), so commands can be skipped.
local NO_HOLDERS, NO_WAITERS
-- HX as last read (read_hx()) and kept up to date after: its number of entries (nil:
-- unknown) and its earliest expiry (false: empty; nil: unknown).
local HELD, FIRST_HX
-- A lower bound on every expiry in HX and WX (us; EMPTY_DUE when both are empty), or false
-- when unknown. Stored in "=due" stamped with "=last" and "=seq": every step that adds a
-- holder takes a token and every join takes a stamp, whichever release's client runs it,
-- and the rest only removes entries or moves expiries later, so while the stamp matches the
-- bound holds, and a step before it need not look for expired entries (purge()).
local DUE
local EMPTY_DUE = 4503599627370496 -- 2^52 us: later than any expiry
-- "=all": every one of D, HX, WX and WQ that exists expires no earlier than
-- expiry_at(ALL) (0: nothing known). A step that moves "=exp" to `covered` gives all four
-- that expiry, written by it or not, and stores "=all" = covered (finish()). It stays true
-- for good, whichever release's client runs the steps after: none ever moves a key's expiry
-- earlier ("=exp" only grows), and every step that makes a key gives it an expiry at least
-- expiry_at("=exp"). So a zset this step did not make (see `made`) needs no PEXPIREAT for
-- entries expiring by ALL. (CW and PD are left out: they always get theirs.)
local ALL
-- Set when this step made a callback grant (a pending delivery), or granted anything on a
-- name with callbacks (a new lease whose expiry the deliverer's schedule does not know):
-- the reply then carries NOW - NOTIFY_SHIFT, which the client adds to the store's index of
-- names with callbacks (lua/lock/index.lua) as "due now".
local NOTIFY
local NOTIFY_SHIFT = 1000000000000000 -- 1e15 us: notifications score below any real time
-- What this step knows the name to be at its end, for the fast paths (_fast_acquire.lua,
-- _fast_release.lua): "0" no holder and nobody in line, "1" one holder and nobody in line;
-- false when it does not know. finish() stamps it with "=last" and "=seq" into "=fast".
local FAST
-- "=fast" as read, and what it tells while its stamp matches (plain names only, as only
-- they write it; a step without "=fast" may have dropped holders or waiters since, never
-- added one: every grant takes a token, every join a stamp):
--   "0", "1"  at most 0 / 1 holder, and nobody in line (the fast paths' kinds);
--   "1q"      at most 1 holder, and nobody in line has a negative lead;
--   "q"       nobody in line has a negative lead;
--   "1w"      at most 1 holder.
-- A client of an earlier release matches "0" and "1" only, so it ignores the other kinds.
-- HMAX: an upper bound on the holders (nil: none known). NONEG: nobody in line has a
-- negative lead (priority), so every rank in line is at most "=seq" (see join()).
local HMAX
local NONEG
-- The only holder, dropped by this step (drop_holder()) but left in HX until after the
-- grants' ZADD (put_holders()) or finish(), so that HX, never empty in between, keeps its
-- expiry; and that holder's lease expiry, up to which HX's own expiry is known to cover
-- entries (whoever wrote that entry gave HX an expiry KEEP_US past it, and no step moves a
-- key's expiry earlier). False when none.
local HX_OUT, HX_COVER

-- The start of a step: every variable above as a new step finds it (see D above).
local function begin()
  D, HX, WX, WQ, CW, PD = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]
  BASE = ARGV[1]
  NOW = server_us()
  S = {name = false, limit = false, last = 0, seq = 0, exp = 0, mine = false, waiting = false,
       cb = false, pk = false, due = false, fast = false}
  pending, dropped, extend, made, newest = {}, {}, {}, {}, 0
  NO_HOLDERS, NO_WAITERS = false, false
  HELD, FIRST_HX = nil, nil
  DUE, ALL, NOTIFY, FAST = false, 0, false, false
  HMAX, NONEG = nil, false
  HX_OUT, HX_COVER = false, false
end

local function load(holder)
  -- A fast path that fell through read these already, for this same holder (_head.lua).
  local r = PRELOAD or read_name(holder)
  S.name, S.limit = r[1], r[2] and tonumber(r[2])
  S.last, S.seq, S.exp = tonumber(r[3] or '0'), tonumber(r[4] or '0'), tonumber(r[5] or '0')
  S.cb, S.mine, S.waiting = r[6] and true or false, r[7], r[8]
  S.pk = r[9] and tonumber(r[9]) or false
  ALL = tonumber(r[12] or '0') or 0
  S.fast = r[10] or false
  if S.fast and not S.cb and not S.pk then
    local last, seq, kind = string.match(S.fast, '^(%d+) (%d+) (%w+)$')
    if last == (r[3] or '0') and seq == (r[4] or '0') then
      if kind == '0' or kind == '1' then
        HMAX, NONEG, NO_WAITERS = tonumber(kind), true, true
        if kind == '0' then HELD, FIRST_HX, NO_HOLDERS = 0, false, true end
      elseif kind == '1q' then
        HMAX, NONEG = 1, true
      elseif kind == 'q' then
        NONEG = true
      elseif kind == '1w' then
        HMAX = 1
      end
    end
  end
  S.due = r[11] or false
  if S.due then
    local due, last, seq = string.match(S.due, '^(%d+) (%d+) (%d+)$')
    if due and last == (r[3] or '0') and seq == (r[4] or '0') then DUE = tonumber(due) end
  end
end

-- An entry expiring at `expires` was written to HX or WX.
local function lower_due(expires)
  if DUE then DUE = math.min(DUE, expires) end
end

-- Take the holder drop_holder() left in HX out of it (ZREM).
local function flush_hx()
  if HX_OUT then
    redis.call('ZREM', HX, HX_OUT)
    HX_OUT, HX_COVER = false, false
  end
end

-- Read HX's size and earliest expiry in one command (a second for a name of over 32).
local function read_hx()
  flush_hx()
  local r = redis.call('ZRANGE', HX, 0, 32, 'WITHSCORES')
  local n = #r / 2
  FIRST_HX = n > 0 and tonumber(r[2])
  if n > 32 then n = redis.call('ZCARD', HX) end
  HELD = n
  NO_HOLDERS = n == 0
end

-- A record's key (a group's holder or waiter: "k<bytes> <key> <record>"), and the rest;
-- nil and the whole record without one.
local function split_key(s)
  if string.byte(s, 1) ~= 107 then return nil, s end -- "k"
  local n, at = string.match(s, '^k(%d+) ()')
  n = tonumber(n)
  return string.sub(s, at, at + n - 1), string.sub(s, at + n + 1)
end

local function with_key(key, s)
  if key == nil then return s end
  return 'k' .. #key .. ' ' .. key .. ' ' .. s
end

local function parse_holder(record)
  local key, s = split_key(record)
  local token, acquired, expires, claimed = string.match(s, '^(%d+) (%d+) (%d+) ([01])$')
  if token then
    return {token = token, acquired = tonumber(acquired), expires = tonumber(expires),
            claimed = claimed == '1', key = key}
  end
  local p, cu, att, cb
  token, acquired, expires, claimed, p, cu, att, cb =
    string.match(s, '^(%d+) (%d+) (%d+) ([01]) ([01]) (%d+) (%d+) (.*)$')
  return {token = token, acquired = tonumber(acquired), expires = tonumber(expires),
          claimed = claimed == '1', pending = p == '1', cu = tonumber(cu),
          attempts = tonumber(att), cb = cb, key = key}
end

local function pack_holder(h)
  local s = h.token .. ' ' .. fmt(h.acquired) .. ' ' .. fmt(h.expires) .. ' ' ..
            (h.claimed and '1' or '0')
  if h.cb then
    s = s .. ' ' .. (h.pending and '1' or '0') .. ' ' .. fmt(h.cu) .. ' ' .. fmt(h.attempts) ..
        ' ' .. h.cb
  end
  return with_key(h.key, s)
end

local function parse_waiter(record)
  local key, s = split_key(record)
  local ttl, wait_ttl, joined, expires, rest = string.match(s, '^(%d+) (%d+) (%d+) (%d+)(.*)$')
  local w = {ttl = tonumber(ttl), wait_ttl = tonumber(wait_ttl), joined = tonumber(joined),
             expires = tonumber(expires), key = key}
  if string.sub(rest, 1, 2) == ' @' then
    local n, at = string.match(rest, '^ @(%d+) ()')
    n = tonumber(n)
    w.ch = string.sub(rest, at, at + n - 1)
    rest = string.sub(rest, at + n)
  end
  if rest ~= '' then w.cb = string.sub(rest, 2) end
  return w
end

local function pack_waiter(w)
  local s = fmt(w.ttl) .. ' ' .. fmt(w.wait_ttl) .. ' ' .. fmt(w.joined) .. ' ' .. fmt(w.expires)
  if w.ch then s = s .. ' @' .. #w.ch .. ' ' .. w.ch end
  if w.cb then s = s .. ' ' .. w.cb end
  return with_key(w.key, s)
end

-- The name has (or is about to have) callbacks: keep CW and PD from now on.
local function mark_callbacks()
  if not S.cb then
    S.cb = true
    pending['=cb'] = '1'
  end
end

local function wrote(expires, ...)
  newest = math.max(newest, expires)
  for _, k in ipairs({...}) do extend[k] = math.max(extend[k] or 0, expires) end
end

local function unpack_chunks(list, fn)
  for i = 1, #list, CHUNK do
    fn({unpack(list, i, math.min(i + CHUNK - 1, #list))})
  end
end

-- Field names of D, without touching `pending` (prefixed() is for deletions).
local function fields(p, members)
  local out = {}
  for i, m in ipairs(members) do out[i] = p .. m end
  return out
end

local function prefixed(p, members)
  local out = {}
  for i, m in ipairs(members) do
    out[i] = p .. m
    pending[p .. m] = nil
  end
  return out
end

-- Delete these D fields in finish(), in the same HDEL as every other field this step drops
-- (a field written again later in the step is kept: finish() writes it instead). Only for
-- steps that end in finish(); purge() deletes at once, as a step may return right after it.
local function drop_fields(p, members)
  for _, m in ipairs(members) do
    pending[p .. m] = nil
    dropped[p .. m] = true
  end
end

-- Store holders {holder, record} as D fields and in the expiry index (one call each).
-- While the holder drop_holder() dropped is still in HX (HX_OUT), HX is not empty, so it
-- keeps its expiry through the ZADD, which then needs no new one for entries expiring no
-- later than HX_COVER; HX_OUT leaves HX right after.
local function put_holders(list)
  local z = {}
  local first = nil
  for _, item in ipairs(list) do
    if item[1] == HX_OUT then flush_hx() end -- the same member again: no longer "kept"
  end
  for _, item in ipairs(list) do
    pending['h:' .. item[1]] = pack_holder(item[2])
    dropped['h:' .. item[1]] = nil
    table.insert(z, fmt(item[2].expires))
    table.insert(z, item[1])
    if HX_COVER and item[2].expires <= HX_COVER then
      wrote(item[2].expires) -- HX's expiry already covers it
    else
      wrote(item[2].expires, HX)
    end
    lower_due(item[2].expires)
    first = math.min(first or item[2].expires, item[2].expires)
  end
  if #z > 0 then
    -- HX existed before the ZADD when it kept HX_OUT or had holders, or if a member was
    -- there already (a renewal, a claim).
    local existed = HX_OUT or (not NO_HOLDERS and HELD ~= nil and HELD > 0)
    local added = redis.call('ZADD', HX, unpack(z))
    if not existed and added == #list then made[HX] = true end
    flush_hx()
    if NO_HOLDERS then HELD, FIRST_HX = 0, false end
    NO_HOLDERS = false
    if HELD then HELD = HELD + added end
    if HMAX then HMAX = HMAX + added end
    if added < #list then
      FIRST_HX = nil -- an entry moved: it may have been the earliest
    elseif FIRST_HX ~= nil then
      FIRST_HX = FIRST_HX and math.min(FIRST_HX, first) or first
    end
  end
end

local function put_waiter(holder, w)
  pending['w:' .. holder] = pack_waiter(w)
  -- 0: the waiter was in WX already (keeping its place), so WX was not made here.
  if redis.call('ZADD', WX, fmt(w.expires), holder) > 0 then made[WX] = true end
  lower_due(w.expires)
  NO_WAITERS = false
  wrote(w.expires, WX, WQ)
  if w.cb then
    redis.call('ZADD', CW, fmt(w.expires), holder) -- CW always gets its expiry (see ALL)
    wrote(w.expires, CW)
  end
end

-- A callback grant's delivery is pending again (score: the deliverer's claim, 0 for none).
local function put_pending(holder, h)
  redis.call('ZADD', PD, fmt(h.cu), holder)
  wrote(h.expires, PD)
end

-- Drop a holder (h: its record, when it is the caller's, S.mine). When the caller is known
-- to be the only holder (HELD or HMAX is 1 and its record is in D; purge() ran or nothing
-- had expired), HX is empty once it goes: it goes last (HX_OUT), see put_holders().
local function drop_holder(holder, h)
  drop_fields('h:', {holder})
  if h and not S.cb and not S.pk and not HX_OUT and (HELD or HMAX) == 1 then
    HX_OUT, HX_COVER = holder, h.expires
    HELD, HMAX, FIRST_HX, NO_HOLDERS = 0, 0, false, true
    return
  end
  local gone = redis.call('ZREM', HX, holder)
  if HELD then HELD = HELD - gone end
  FIRST_HX = nil -- it may have been the earliest
  NO_HOLDERS = false -- maybe empty now: count again if needed
  if S.cb then redis.call('ZREM', PD, holder) end
end

local function drop_waiter(holder)
  drop_fields('w:', {holder})
  redis.call('ZREM', WQ, holder)
  redis.call('ZREM', WX, holder)
  if S.cb then redis.call('ZREM', CW, holder) end
end

-- The earliest score of a zset, or nil when it is empty (or missing).
local function first_score(z)
  local r = redis.call('ZRANGE', z, 0, 0, 'WITHSCORES')
  if #r == 0 then return nil end
  return tonumber(r[2])
end

-- model.purge: drop expired leases and waiting entries (expires <= now). Skipped when DUE
-- shows nothing can have expired; else it learns DUE afresh.
local function purge(holder)
  if DUE and DUE > NOW then return end
  flush_hx()
  read_hx()
  local first = FIRST_HX or nil
  local due = first or EMPTY_DUE
  if first ~= nil and first <= NOW then
    HELD, FIRST_HX = nil, nil
    due = NOW + 1 -- what is left expires later; exactly when is not read
    local gone = redis.call('ZRANGEBYSCORE', HX, '-inf', fmt(NOW))
    unpack_chunks(gone, function(c)
      redis.call('HDEL', D, unpack(prefixed('h:', c)))
      if S.cb then redis.call('ZREM', PD, unpack(c)) end -- an undelivered grant expires too
    end)
    redis.call('ZREMRANGEBYSCORE', HX, '-inf', fmt(NOW))
    for _, g in ipairs(gone) do if g == holder then S.mine = false end end
  end
  first = first_score(WX)
  NO_WAITERS = first == nil
  if first ~= nil then due = math.min(due, first > NOW and first or NOW + 1) end
  if first ~= nil and first <= NOW then
    local gone = redis.call('ZRANGEBYSCORE', WX, '-inf', fmt(NOW))
    unpack_chunks(gone, function(c)
      redis.call('HDEL', D, unpack(prefixed('w:', c)))
      redis.call('ZREM', WQ, unpack(c))
    end)
    redis.call('ZREMRANGEBYSCORE', WX, '-inf', fmt(NOW))
    if S.cb then redis.call('ZREMRANGEBYSCORE', CW, '-inf', fmt(NOW)) end
    for _, g in ipairs(gone) do if g == holder then S.waiting = false end end
  end
  DUE = due
end

local function held()
  if NO_HOLDERS then return 0 end
  if HELD == nil then read_hx() end
  return HELD
end

-- After purge(): whether the name has a live holder or waiter (model: not state.empty).
local function busy()
  if held() > 0 then return true end
  if NO_WAITERS then return false end
  return redis.call('ZCARD', WQ) > 0
end

-- model.clock_token: max(last + 1, now_us), the counter kept per name in D "=last".
local function next_token()
  S.last = math.max(S.last + 1, NOW)
  pending['=last'] = fmt(S.last)
  return fmt(S.last)
end

-- Wake exactly this waiter: a PUBLISH on its client's channel (its record's "@"), carrying
-- the grant "g <token> <acquired_us> <expires_us> <joined_us> <base><holder>" (joined_us:
-- the waiting entry it was made for, the wait_id of that entry's acquire replies; then
-- which waiter, by the name's key base and the holder), so the waiter holds it without
-- another step (the grant is unclaimed: it lasts min(ttl, wait_ttl) until a renewal claims
-- it). Its client's one subscriber connection hands it to the waiter (redis_listen.py). A
-- wake-up nobody hears (the client gone, its connection down) costs nothing: the waiter's
-- next step finds the grant, and an unclaimed grant lapses by itself. A waiter whose record
-- names no channel is not woken: it asks again with steps.
local function wake(holder, h, w)
  if not w.ch then return end
  redis.call('PUBLISH', w.ch, 'g ' .. h.token .. ' ' .. fmt(h.acquired) .. ' ' ..
             fmt(h.expires) .. ' ' .. fmt(w.joined) .. ' ' .. BASE .. holder)
end

-- Grant the waiters `front` (their records `recs`, in line order) and take them out of the
-- line. A callback waiter gets a grant claimed for its full ttl with its delivery pending
-- (in PD), and no wake-up; the claimant (the caller) gets a claimed grant for its full ttl;
-- anyone else an unclaimed grant lasting min(ttl, wait_ttl), and a wake-up. Returns the
-- records granted, by holder.
local function grant_waiters(front, recs, claimant)
  local granted = {}
  drop_fields('w:', front)
  redis.call('ZREM', WQ, unpack(front))
  redis.call('ZREM', WX, unpack(front))
  if S.cb then
    redis.call('ZREM', CW, unpack(front))
    NOTIFY = true -- a new lease the deliverer's schedule of this name does not know
  end
  local grants = {}
  for i, holder in ipairs(front) do
    local w = parse_waiter(recs[i])
    local h
    if w.cb then
      h = {token = next_token(), acquired = NOW, expires = NOW + w.ttl, claimed = true,
           cb = w.cb, pending = true, cu = 0, attempts = 0, key = w.key}
      put_pending(holder, h)
      NOTIFY = true
    else
      local claimed = holder == claimant
      local lease = claimed and w.ttl or math.min(w.ttl, w.wait_ttl)
      h = {token = next_token(), acquired = NOW, expires = NOW + lease, claimed = claimed,
           key = w.key}
      if not claimed then wake(holder, h, w) end
    end
    granted[holder] = h
    table.insert(grants, {holder, h})
  end
  put_holders(grants)
  return granted
end

-- A group's holders by key (lock_machine.NameState.key_counts; no key counts as `false`),
-- recounted from the holder records: 1 ZRANGE and 1 HMGET per CHUNK holders. Counting
-- rather than keeping counts means no step that drops a holder (release, expiry, a refused
-- delivery, a key that expires) can leave a count behind.
local function key_counts()
  local counts = {}
  if NO_HOLDERS then return counts end
  flush_hx()
  local members = redis.call('ZRANGE', HX, 0, -1)
  unpack_chunks(members, function(c)
    local recs = redis.call('HMGET', D, unpack(fields('h:', c)))
    for i, m in ipairs(c) do
      local rec = pending['h:' .. m] or recs[i] -- a grant of this step may be unwritten
      if rec then
        local k = split_key(rec) or false
        counts[k] = (counts[k] or 0) + 1
      end
    end
  end)
  return counts
end

-- lock_machine.NameState.has_room for a group: a grant to `key` keeps the per-key limit
-- (the total is the caller's to check).
local function key_has_room(key)
  return (key_counts()[key or false] or 0) < S.pk
end

-- model.promote in a semaphore group ("=pk"): walk the line from the front, granting every
-- waiter whose key has fewer than per_key holders while the total has room, skipping those
-- whose key is full (no head-of-line blocking). Costs key_counts() and, per slice of the
-- line read (a few waiters first, then growing to CHUNK), 1 ZRANGE and 1 HMGET: a line whose
-- front is all full keys is read up to the first grantable waiter, or to its end (the
-- worst case: O(waiters) per step). Returns as promote() does, except that free slots may
-- be left with waiters in line (all of full keys).
local function promote_group(limit, claimant)
  local free = limit - held()
  if free <= 0 or NO_WAITERS then return math.max(free, 0), {} end
  local counts = key_counts()
  local front, recs = {}, {}
  local start, size, skipped, rest = 0, math.min(CHUNK, math.max(8, 2 * free)), 0, true
  while free > 0 and rest do
    local slice = redis.call('ZRANGE', WQ, start, start + size - 1)
    rest = #slice == size -- there may be more of the line behind this slice
    if #slice > 0 then
      local got = redis.call('HMGET', D, unpack(fields('w:', slice)))
      for i, holder in ipairs(slice) do
        if free == 0 then
          rest = true -- waiters left behind the last grant
          break
        end
        local rec = pending['w:' .. holder] or got[i]
        local k = split_key(rec) or false
        if (counts[k] or 0) < S.pk then
          counts[k] = (counts[k] or 0) + 1
          free = free - 1
          table.insert(front, holder)
          table.insert(recs, rec)
        else
          skipped = skipped + 1 -- its key is full: the waiters behind it go on
        end
      end
    end
    start, size = start + size, math.min(CHUNK, size * 4)
  end
  if #front == 0 then return free, {} end
  local granted = grant_waiters(front, recs, claimant)
  if not rest and skipped == 0 then NO_WAITERS = true end
  return free, granted
end

-- model.promote: grant free slots to waiters from the front (grant_waiters()). Returns the
-- free slots left (0, or > 0 only when the line is now empty; in a group, see
-- promote_group()) and the records granted, by holder.
local function promote(limit, claimant)
  if S.pk then return promote_group(limit, claimant) end
  local free = limit - held()
  if free <= 0 or NO_WAITERS then return math.max(free, 0), {} end
  -- One waiter more than the free slots: whether the line is empty once they are granted,
  -- so that a hand-over to the last waiter leaves the name on the fast paths (FAST).
  local front = redis.call('ZRANGE', WQ, 0, free)
  local more = #front > free
  if more then table.remove(front) end
  if #front == 0 then
    NO_WAITERS = true
    return free, {}
  end
  local recs = redis.call('HMGET', D, unpack(prefixed('w:', front)))
  local granted = grant_waiters(front, recs, claimant)
  if not more then NO_WAITERS = true end
  return free - #front, granted
end

-- ranking.join: put a new waiting entry in line by rank = stamp - lead, where the
-- stamp is its arrival on the server clock, strictly increasing per name (max(NOW, the
-- newest stamp + 1)) and lead = priority x level (ARGV, from ranking.lead). It goes behind
-- every waiter of its rank or better, ahead of the rest. A sorted set orders equal scores by
-- member, not by arrival, so a rank some waiter already has (only possible between waiters
-- of different leads) is avoided by arriving 1 us later: the line is then exactly the one
-- the model gives with that stamp. Nobody need be asked (ZCOUNT) when the line is empty,
-- or when nobody in it has a negative lead (NONEG) and this lead is not positive: every
-- rank in line is then at most its stamp, at most "=seq", and this rank is above "=seq".
-- Returns the stamp (the record's joined_us).
local function join(holder, lead)
  local stamp = math.max(S.seq + 1, NOW)
  if not (NO_WAITERS or (NONEG and lead <= 0)) then
    while redis.call('ZCOUNT', WQ, fmt(stamp - lead), fmt(stamp - lead)) > 0 do
      stamp = stamp + 1
    end
  end
  NONEG = (NO_WAITERS or NONEG) and lead >= 0
  S.seq = stamp
  pending['=seq'] = fmt(stamp)
  redis.call('ZADD', WQ, fmt(stamp - lead), holder)
  made[WQ] = true -- unless the caller learns someone is ahead (acquire.lua)
  return stamp
end

-- Microseconds until the earliest lease expires, or -1 without holders.
local function retry_after()
  if NO_HOLDERS then return -1 end
  if FIRST_HX == nil then read_hx() end
  if not FIRST_HX then return -1 end
  return math.max(0, FIRST_HX - NOW)
end

-- Write back D's changed fields and keep every key alive past its newest entry, plus KEEP_US
-- for the token counter: a name nobody touches again leaves nothing behind. "=exp" is the
-- time up to which the keys' expiry already covers entries; it moves SLACK_US ahead at a time,
-- so a busy name's D is not given a new expiry on every step, and when it moves every key
-- is given the new expiry ("=all", see ALL). A zset this step may have made (Redis drops
-- empty ones and makes them again without an expiry) is given its expiry every time; one it
-- did not make only for an entry expiring after ALL (CW and PD: for every entry).
local function finish()
  if not S.cb and not S.pk then
    -- "=fast" (see HMAX): what this step knows the name to be at its end.
    local bound = HELD or HMAX
    local kind = FAST
    if not kind and NO_WAITERS and bound and bound <= 1 then kind = fmt(bound) end
    if not kind and (NONEG or NO_WAITERS) then kind = (bound and bound <= 1) and '1q' or 'q' end
    if not kind and bound and bound <= 1 then kind = '1w' end
    if kind then
      local fast = fmt(S.last) .. ' ' .. fmt(S.seq) .. ' ' .. kind
      if fast ~= S.fast then pending['=fast'] = fast end
    end
  end
  if DUE then
    local due = fmt(DUE) .. ' ' .. fmt(S.last) .. ' ' .. fmt(S.seq)
    if due ~= S.due then pending['=due'] = due end
  end
  local covered, moved = coverage(S.exp, newest)
  if moved then
    pending['=exp'] = fmt(covered)
    pending['=all'] = fmt(covered)
    for _, k in ipairs({D, HX, WX, WQ}) do
      -- A sorted set known to be empty does not exist (Redis drops empty ones): no expiry
      -- to give it (a new name's first step, or one whose line is empty).
      local empty = (k == HX and NO_HOLDERS) or ((k == WX or k == WQ) and NO_WAITERS)
      if not empty then extend[k] = extend[k] or covered end
    end
  end
  flush_hx()
  -- Every field this step dropped, in one HDEL (a hand-over drops the old holder's record
  -- and the granted waiter's), and every field it wrote, in one HSET.
  local gone = {}
  for f, _ in pairs(dropped) do
    if pending[f] == nil then table.insert(gone, f) end
  end
  unpack_chunks(gone, function(c) redis.call('HDEL', D, unpack(c)) end)
  local fields = {}
  for f, v in pairs(pending) do
    table.insert(fields, f)
    table.insert(fields, v)
  end
  if #fields > 0 then redis.call('HSET', D, unpack(fields)) end
  local at = expiry_at(covered)
  for k, latest in pairs(extend) do
    if moved or made[k] or latest > ALL or not (k == HX or k == WX or k == WQ) then
      redis.call('PEXPIREAT', k, at)
    end
  end
end

-- The score of this step's notification, or nil.
local function notify_score()
  if NOTIFY then return fmt(NOW - NOTIFY_SHIFT) end
  return nil
end

-- A reply list, with the notification's score appended when there is one.
local function noted(reply)
  if NOTIFY then table.insert(reply, notify_score()) end
  return reply
end

local function grant_reply(h)
  return noted({1, h.token, h.acquired, h.expires, NOW, -1, -1, ''})
end

-- The kind of a stored callback ("sfn", "http"; "unknown" if unreadable): all that status
-- shows, never the text (a task token is a credential).
local function callback_kind(cb)
  if not cb then return '' end
  local ok, v = pcall(cjson.decode, cb)
  if ok and type(v) == 'table' and (v.kind == 'sfn' or v.kind == 'http') then return v.kind end
  return 'unknown'
end


-- ---- operation ------------------------------------------------------------------------
