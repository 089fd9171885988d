-- Turnstile on Redis: helpers shared by every lock operation.
--
-- This file is prepended to each operation script when it is loaded (one EVALSHA per
-- operation; Redis has no includes), and built once into the lock function library (FCALL;
-- see stores/redis/scripts.py). It implements the steps of turnstile/_core/lock_machine.py.
--
-- Keys of one name, all under one hash tag {T} (T = a hash of the name, never the name
-- itself) so they share a Cluster slot; every script gets them in this order:
--   KEYS[1] D   hash  "=name" the name, "=limit", "=pk" a semaphore group's per-key limit
--                     (absent: a plain lock or semaphore; "=limit" is then the group's
--                     total), "=last" the last fencing token, "=seq" the newest waiter's
--                     arrival stamp (us, strictly increasing per name), "=exp" the time up
--                     to which the keys' own expiry covers every entry (us), "=layout" "2"
--                     (_head.lua), "=cb" "1" while the name may have callback waiters or
--                     pending deliveries (CW and PD kept up to date), and:
--                     "=hn" and "=hr" every holder, as two strings: in "=hn" each holder
--                       as "<bytes>:<holder>", in "=hr" its record, in the same order, as
--                       "<bytes>:<record>", the record "token acquired_us expires_us
--                       claimed(0|1)", or for a callback grant "token acquired_us expires_us
--                       claimed pending(0|1) claimed_until_us attempts callback"; a group's
--                       record starts with its key, "k<bytes> <key> " (see with_key());
--                       at most "=limit" holders, so a step reads and writes them all
--                       with the name's record: no index of holders to keep. (Two fields,
--                       so that a lock's stay under 64 bytes each, and Redis keeps the
--                       hash in its compact encoding, about half the memory);
--                     "=n" the number of entries in L; "=wdue" a lower bound on their
--                       expiries (a step finding it past sweeps the line, sweep()); "=neg"
--                       "1" when an entry in L may have a negative lead (see join());
--                       "=l" "1" once L exists (with its sentinel, see below);
--                     "w:"..holder the score of the holder's entry in L (no two entries
--                       share one), for an entry that may be asked for by holder alone (ARGV "index": a ticket, a holder named by the
--                       caller, a callback waiter); a blocking acquire's own entry is not
--                       indexed: its client gives the entry back in each step
--   KEYS[2] L   zset  the line: one member per waiting entry, scored by rank
--                     (turnstile/_core/ranking.py: its arrival stamp less priority x level,
--                     fixed when it joins; no two entries share a rank), smallest first. A
--                     member is the entry itself: "[i]<bytes>:<holder>" then the waiter
--                     record "ttl_us wait_ttl_us joined_us expires_us", followed for a
--                     waiter to be woken by " @<bytes> <channel>" (its client's channel, see
--                     wake()), or for a callback waiter by " callback" (a JSON object); a
--                     group's record starts with its key; a leading "i": the entry is
--                     indexed in D ("w:"..holder). A sentinel member "~" scored +inf keeps L
--                     in existence when the line is empty, so it keeps its expiry
--   KEYS[3] CW  zset  callback waiters scored by their waiting entry's expires_us
--   KEYS[4] PD  zset  holders whose delivery is pending, scored by the deliverer's claim on
--                     it (claimed_until_us; 0: nobody's)
-- CW and PD are touched only while "=cb" is set. ARGV[1] is the common key base
-- "<prefix>{T}:". A waiter is woken by a PUBLISH on its client's channel (wake()).
--
-- A hand-over costs the waiter's join HMGET, TIME, ZADD, HSET and the holder's release
-- HMGET, TIME, ZPOPMIN, PUBLISH, HSET: nothing else is read or written while no entry has
-- expired (then a sweep reads the line once) and the keys' expiry need not move (every
-- SLACK_US).
--
-- Times are integer microseconds on the server clock (TIME). Redis 5+ replicates a script's
-- effects, not the script, so reading TIME before writing is safe on replicas and in AOF.
-- Every key expires by itself KEEP_US after the latest entry in it.

-- Per step, as every variable below that a step changes: set by begin() (at the end of this
-- file's declarations), which each operation calls first. A script (EVALSHA) makes them for
-- one step, a function library (FCALL) once for every step.
local D, L, CW, PD
local BASE
local CHUNK = 1000 -- stay well below Lua's unpack() limit
local SENTINEL = '~'
local NOW

-- State read at the start of an operation (one HMGET), written back by finish().
local S
local H          -- holders: holder -> record (parse_holder())
local HORDER     -- the holders in H, in "=hn" order, then as added
local HDIRTY     -- H changed: "=hn" and "=hr" are written back
local N          -- entries in L (the sentinel not counted)
local WDUE       -- a lower bound on the expiry of every entry in L (meaningful while N > 0)
local NEG        -- an entry in L may have a negative lead (meaningful while N > 0)
local pending    -- D fields to write in finish(): field -> value
local dropped    -- D fields to delete in finish(), all in one HDEL: field -> true
local cbkeys     -- CW, PD written by this step: they get their expiry in finish()
local newest     -- latest expiry written by this operation
local LINE_MADE  -- this step made L (its sentinel was missing)
-- Set when this step made a callback grant (a pending delivery), or granted anything on a
-- name with callbacks (a new lease whose expiry the deliverer's schedule does not know):
-- the reply then carries NOW - NOTIFY_SHIFT, which the client adds to the store's index of
-- names with callbacks (lua/lock/index.lua) as "due now".
local NOTIFY
local NOTIFY_SHIFT = 1000000000000000 -- 1e15 us: notifications score below any real time

-- The start of a step: every variable above as a new step finds it (see D above).
local function begin()
  D, L, CW, PD = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
  BASE = ARGV[1]
  -- The clock a fast path that fell through read already (_fast_release.lua), or TIME.
  NOW = PRELOAD and PRELOAD.now or server_us()
  S = {name = false, limit = false, last = 0, seq = 0, exp = 0, cb = false, pk = false,
       layout = false, l = false, mine = false, indexed = false, n = '0', wdue = false,
       neg = false}
  H, HORDER, HDIRTY = {}, {}, false
  N, WDUE, NEG = 0, false, false
  pending, dropped, cbkeys, newest = {}, {}, {}, 0
  LINE_MADE, NOTIFY = false, false
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

-- "<bytes>:<text>" at `at` of `s`: the text and the position after it.
local function take_counted(s, at)
  local _, stop, n = string.find(s, '^(%d+):', at)
  n = tonumber(n)
  return string.sub(s, stop + 1, stop + n), stop + n + 1
end

-- "=hn" and "=hr" into H and HORDER.
local function parse_holders(names, records)
  if not names then return end
  local at, rat, size = 1, 1, #names
  while at <= size do
    local holder, rec
    holder, at = take_counted(names, at)
    rec, rat = take_counted(records, rat)
    H[holder] = parse_holder(rec)
    table.insert(HORDER, holder)
  end
end

-- H as "=hn" and "=hr".
local function pack_holders()
  local names, records = {}, {}
  for _, holder in ipairs(HORDER) do
    local rec = pack_holder(H[holder])
    table.insert(names, #holder .. ':' .. holder)
    table.insert(records, #rec .. ':' .. rec)
  end
  return table.concat(names), table.concat(records)
end

-- A waiting entry (a member of L) and back. Fields: holder, ttl, wait_ttl, joined, expires,
-- ch (its client's channel, or nil), cb (a callback, or nil), key (a group's, or nil), ix
-- (indexed in D as "w:"..holder), member (the text it was read from).
local function parse_member(m)
  local ix = string.byte(m, 1) == 105 -- "i"
  local holder, at = take_counted(m, ix and 2 or 1)
  local key, s = split_key(string.sub(m, at))
  local ttl, wait_ttl, joined, expires, rest = string.match(s, '^(%d+) (%d+) (%d+) (%d+)(.*)$')
  local w = {holder = holder, ttl = tonumber(ttl), wait_ttl = tonumber(wait_ttl),
             joined = tonumber(joined), expires = tonumber(expires), key = key, ix = ix,
             member = m}
  if string.sub(rest, 1, 2) == ' @' then
    local n, from = string.match(rest, '^ @(%d+) ()')
    n = tonumber(n)
    w.ch = string.sub(rest, from, from + n - 1)
    rest = string.sub(rest, from + n)
  end
  if rest ~= '' then w.cb = string.sub(rest, 2) end
  return w
end

local function pack_member(w)
  local s = fmt(w.ttl) .. ' ' .. fmt(w.wait_ttl) .. ' ' .. fmt(w.joined) .. ' ' .. fmt(w.expires)
  if w.ch then s = s .. ' @' .. #w.ch .. ' ' .. w.ch end
  if w.cb then s = s .. ' ' .. w.cb end
  return (w.ix and 'i' or '') .. #w.holder .. ':' .. w.holder .. with_key(w.key, s)
end

local function load(holder)
  -- A fast path that fell through read it already, for this same holder (_head.lua).
  local r = PRELOAD or read_name(holder)
  S.name, S.limit = r[1], r[2] and tonumber(r[2])
  S.last, S.seq, S.exp = tonumber(r[3] or '0'), tonumber(r[4] or '0'), tonumber(r[5] or '0')
  S.cb = r[6] and true or false
  S.pk = r[7] and tonumber(r[7]) or false
  S.layout, S.l = r[8], r[14] == '1'
  parse_holders(r[9], r[10])
  S.n, S.wdue, S.neg = r[11] or '0', r[12] or false, r[13] or false
  N = tonumber(S.n)
  WDUE = r[12] and tonumber(r[12]) or false
  NEG = r[13] == '1'
  S.indexed = r[15] or false
  S.mine = H[holder] or false
end

-- The name has (or is about to have) callbacks: keep CW and PD from now on.
local function mark_callbacks()
  if not S.cb then
    S.cb = true
    pending['=cb'] = '1'
  end
end

local function unpack_chunks(list, fn)
  for i = 1, #list, CHUNK do
    fn({unpack(list, i, math.min(i + CHUNK - 1, #list))})
  end
end

-- Delete these D fields in finish(), in one HDEL (a field written again later in the step
-- is kept: finish() writes it instead).
local function drop_fields(list)
  for _, f in ipairs(list) do
    pending[f] = nil
    dropped[f] = true
  end
end

local function put_field(f, v)
  pending[f] = v
  dropped[f] = nil
end

local function put_holder(holder, h)
  if not H[holder] then table.insert(HORDER, holder) end
  H[holder] = h
  HDIRTY = true
  newest = math.max(newest, h.expires)
end

-- A callback grant's delivery is pending again (score: the deliverer's claim, 0 for none).
local function put_pending(holder, h)
  redis.call('ZADD', PD, fmt(h.cu), holder)
  cbkeys[PD] = true
end

local function drop_holder(holder)
  if H[holder] then
    H[holder] = nil
    for i, h in ipairs(HORDER) do
      if h == holder then
        table.remove(HORDER, i)
        break
      end
    end
  end
  HDIRTY = true
  if S.cb then redis.call('ZREM', PD, holder) end
end

local function held()
  return #HORDER
end

-- Entries leave L (ZREM by the caller, or popped): their index fields and CW entries go.
local function forget_entries(list)
  local cw = {}
  for _, w in ipairs(list) do
    if w.ix then drop_fields({'w:' .. w.holder}) end
    if w.cb then table.insert(cw, w.holder) end
  end
  if S.cb and #cw > 0 then
    unpack_chunks(cw, function(c) redis.call('ZREM', CW, unpack(c)) end)
  end
end

-- model.purge, waiters: read the whole line, drop the entries that expired, learn the
-- earliest expiry left ("=wdue") and the exact count. Runs when "=wdue" is past: an entry
-- renewed since was given a later expiry, so about once per wait_ttl on a busy name.
local function sweep()
  local members = redis.call('ZRANGE', L, 0, -1)
  local dead, gone, due, live = {}, {}, false, 0
  for _, m in ipairs(members) do
    if m ~= SENTINEL then
      local w = parse_member(m)
      if w.expires <= NOW then
        table.insert(dead, m)
        table.insert(gone, w)
      else
        live = live + 1
        due = due and math.min(due, w.expires) or w.expires
      end
    end
  end
  unpack_chunks(dead, function(c) redis.call('ZREM', L, unpack(c)) end)
  forget_entries(gone)
  N, WDUE = live, due
end

-- model.purge: drop expired leases (read with the record) and, when one may have expired,
-- expired waiting entries.
local function purge(holder)
  local gone, live = {}, {}
  for _, h in ipairs(HORDER) do
    if H[h].expires <= NOW then
      H[h] = nil
      HDIRTY = true
      table.insert(gone, h)
    else
      table.insert(live, h)
    end
  end
  HORDER = live
  if S.cb and #gone > 0 then
    unpack_chunks(gone, function(c) redis.call('ZREM', PD, unpack(c)) end)
  end
  S.mine = H[holder] or false
  if N > 0 and not (WDUE and WDUE > NOW) then sweep() end
end

-- After purge(): whether the name has a live holder or waiter (model: not state.empty).
local function busy()
  return N > 0 or held() > 0
end

-- The caller's waiting entry in L, or nil: by its index field (its score: one
-- ZRANGEBYSCORE), else by the entry its client gave back (`given`, "" for none: one
-- ZSCORE); with its score. No command for a newcomer's first step. `given` "?": a step of
-- this holder may have run with its reply lost, so its entry, if any, is looked for in the
-- whole line (O(line), only after a failure).
local function find_waiting(holder, given)
  if given == '?' and not S.indexed then
    local line = redis.call('ZRANGE', L, 0, -1, 'WITHSCORES')
    for i = 1, #line, 2 do
      local m = line[i]
      if m ~= SENTINEL then
        local w = parse_member(m)
        if w.holder == holder then
          w.score = line[i + 1]
          return w
        end
      end
    end
    return nil
  end
  if S.indexed then
    local found = redis.call('ZRANGEBYSCORE', L, S.indexed, S.indexed)
    for _, m in ipairs(found) do
      local w = parse_member(m)
      if w.holder == holder then
        w.score = S.indexed
        return w
      end
    end
    return nil
  end
  if given == '' then return nil end
  local score = redis.call('ZSCORE', L, given)
  if not score then return nil end
  local w = parse_member(given)
  if w.holder ~= holder then return nil end
  w.score = score
  return w
end

-- model.clock_token: max(last + 1, now_us), the counter kept per name in D "=last".
local function next_token()
  S.last = math.max(S.last + 1, NOW)
  pending['=last'] = fmt(S.last)
  return fmt(S.last)
end

-- Wake exactly this waiter: a PUBLISH on its client's channel (its entry's "@"), carrying
-- the grant "g <token> <acquired_us> <expires_us> <joined_us> <base><holder>" (joined_us:
-- the waiting entry it was made for, the wait_id of that entry's acquire replies; then
-- which waiter, by the name's key base and the holder), so the waiter holds it without
-- another step (the grant is unclaimed: it lasts min(ttl, wait_ttl) until a renewal claims
-- it). Its client's one subscriber connection hands it to the waiter (redis_listen.py). A
-- wake-up nobody hears (the client gone, its connection down) costs nothing: the waiter's
-- next step finds the grant, and an unclaimed grant lapses by itself. A waiter whose entry
-- names no channel is not woken: it asks again with steps.
local function wake(h, w)
  if not w.ch then return end
  redis.call('PUBLISH', w.ch, 'g ' .. h.token .. ' ' .. fmt(h.acquired) .. ' ' ..
             fmt(h.expires) .. ' ' .. fmt(w.joined) .. ' ' .. BASE .. w.holder)
end

-- Grant the waiting entries `list` (out of L already, in line order). A callback waiter
-- gets a grant claimed for its full ttl with its delivery pending (in PD), and no wake-up;
-- the claimant (the caller) gets a claimed grant for its full ttl; anyone else an unclaimed
-- grant lasting min(ttl, wait_ttl), and a wake-up. Adds them to `granted` (by holder).
local function grant_entries(list, claimant, granted)
  forget_entries(list)
  if S.cb then NOTIFY = true end -- a new lease the deliverer's schedule does not know
  for _, w in ipairs(list) do
    local h
    if w.cb then
      h = {token = next_token(), acquired = NOW, expires = NOW + w.ttl, claimed = true,
           cb = w.cb, pending = true, cu = 0, attempts = 0, key = w.key}
      put_pending(w.holder, h)
      NOTIFY = true
    else
      local claimed = w.holder == claimant
      local lease = claimed and w.ttl or math.min(w.ttl, w.wait_ttl)
      h = {token = next_token(), acquired = NOW, expires = NOW + lease, claimed = claimed,
           key = w.key}
      if not claimed then wake(h, w) end
    end
    put_holder(w.holder, h)
    granted[w.holder] = h
  end
end

-- A group's holders by key (lock_machine.NameState.key_counts; no key counts as `false`).
local function key_counts()
  local counts = {}
  for _, holder in ipairs(HORDER) do
    local k = H[holder].key or false
    counts[k] = (counts[k] or 0) + 1
  end
  return counts
end

-- lock_machine.NameState.has_room for a group: a grant to `key` keeps the per-key limit
-- (the total is the caller's to check).
local function key_has_room(key)
  return (key_counts()[key or false] or 0) < S.pk
end

-- model.promote in a semaphore group ("=pk"): walk the line from the front, granting every
-- waiter whose key has fewer than per_key holders while the total has room, skipping those
-- whose key is full (no head-of-line blocking). Per slice of the line read (a few entries
-- first, then growing to CHUNK), one ZRANGE; the entries granted leave it in one ZREM. A
-- line whose front is all full keys is read up to the first grantable waiter, or to its end
-- (the worst case: O(waiters) per step). Returns as promote() does, except that free slots
-- may be left with waiters in line (all of full keys).
local function promote_group(limit, claimant)
  local free = limit - held()
  if free <= 0 or N == 0 then return math.max(free, 0), {} end
  local counts = key_counts()
  local chosen, members = {}, {}
  local start, size = 0, math.min(CHUNK, math.max(8, 2 * free))
  while free > 0 do
    local slice = redis.call('ZRANGE', L, start, start + size - 1)
    for _, m in ipairs(slice) do
      if free == 0 then break end
      if m ~= SENTINEL then
        local w = parse_member(m)
        local k = w.key or false
        if (counts[k] or 0) < S.pk then
          counts[k] = (counts[k] or 0) + 1
          free = free - 1
          table.insert(chosen, w)
          table.insert(members, m)
        end
      end
    end
    if #slice < size then break end
    start, size = start + size, math.min(CHUNK, size * 4)
  end
  local granted = {}
  if #chosen == 0 then return free, granted end
  unpack_chunks(members, function(c) redis.call('ZREM', L, unpack(c)) end)
  N = N - #chosen
  grant_entries(chosen, claimant, granted)
  return free, granted
end

-- model.promote: grant free slots to waiters from the front (grant_entries()), popping them
-- off L with one ZPOPMIN (the sentinel, scored +inf, is never reached: at most N are
-- popped). Returns the free slots left (0, or > 0 only when the line is now empty; in a
-- group, see promote_group()) and the records granted, by holder.
local function promote(limit, claimant)
  if S.pk then return promote_group(limit, claimant) end
  local free = limit - held()
  local granted = {}
  if free <= 0 or N == 0 then return math.max(free, 0), granted end
  local count = math.min(free, N)
  local popped = redis.call('ZPOPMIN', L, count)
  local list = {}
  for i = 1, #popped, 2 do
    if popped[i] == SENTINEL then
      redis.call('ZADD', L, '+inf', SENTINEL) -- "=n" was wrong (never expected): keep it
      break
    end
    table.insert(list, parse_member(popped[i]))
  end
  if #list < count then N = 0 else N = N - #list end
  grant_entries(list, claimant, granted)
  return free - #list, granted
end

-- ranking.join: put a new waiting entry in line by rank = stamp - lead, where the stamp is
-- its arrival on the server clock, strictly increasing per name (max(NOW, the newest stamp
-- + 1)) and lead = priority x level (ARGV, from ranking.lead). It goes behind every waiter
-- of its rank or better, ahead of the rest. A sorted set orders equal scores by member, not
-- by arrival, so a rank some entry already has (only possible between entries of different
-- leads) is avoided by arriving 1 us later. Nobody need be asked (ZCOUNT) when the line is
-- empty, or when nobody in it has a negative lead ("=neg") and this lead is not positive:
-- every rank in line is then at most its stamp, at most "=seq", and this rank is above
-- "=seq"; the new entry is then last, so its position is N, with no ZRANK. The ZADD
-- carries the sentinel too: it makes L with it when L has none (LINE_MADE).
-- `w` is the entry (holder, ttl, wait_ttl, expires, ch, cb, key, ix). Returns its position
-- (0 = next) and its member.
local function join(w, lead)
  local stamp = math.max(S.seq + 1, NOW)
  if N > 0 and (NEG or lead > 0) then
    while redis.call('ZCOUNT', L, fmt(stamp - lead), fmt(stamp - lead)) > 0 do
      stamp = stamp + 1
    end
  end
  local position = false
  if N == 0 then
    position, NEG, WDUE = 0, false, w.expires
  elseif not NEG and lead <= 0 then
    position = N
  end
  if lead < 0 then NEG = true end
  S.seq = stamp
  pending['=seq'] = fmt(stamp)
  w.joined = stamp
  local m = pack_member(w)
  if redis.call('ZADD', L, fmt(stamp - lead), m, '+inf', SENTINEL) > 1 then LINE_MADE = true end
  if not S.l then
    S.l = true
    pending['=l'] = '1'
  end
  N = N + 1
  WDUE = math.min(WDUE or w.expires, w.expires)
  newest = math.max(newest, w.expires)
  if w.ix then put_field('w:' .. w.holder, fmt(stamp - lead)) end
  if w.cb then
    redis.call('ZADD', CW, fmt(w.expires), w.holder)
    cbkeys[CW] = true
  end
  if not position then position = redis.call('ZRANK', L, m) end
  return position, m
end

-- Keep a waiting entry's place with a new expiry (and whatever else `w` now says): the same
-- score, a new member. Returns its position and its member.
local function keep_place(old, w)
  local m = pack_member(w)
  if m ~= old.member then
    redis.call('ZREM', L, old.member)
    redis.call('ZADD', L, old.score, m)
  end
  if w.ix and not old.ix then put_field('w:' .. w.holder, old.score) end
  WDUE = math.min(WDUE or w.expires, w.expires)
  newest = math.max(newest, w.expires)
  if w.cb then
    redis.call('ZADD', CW, fmt(w.expires), w.holder)
    cbkeys[CW] = true
  end
  return redis.call('ZRANK', L, m), m
end

-- The caller leaves the line (its entry `w`, from find_waiting()).
local function leave(w)
  redis.call('ZREM', L, w.member)
  N = N - 1
  forget_entries({w})
end

-- The earliest score of a zset, or nil when it is empty (or missing).
local function first_score(z)
  local r = redis.call('ZRANGE', z, 0, 0, 'WITHSCORES')
  if #r == 0 then return nil end
  return tonumber(r[2])
end

-- Microseconds until the earliest lease expires, or -1 without holders.
local function retry_after()
  local first = false
  for _, holder in ipairs(HORDER) do
    local expires = H[holder].expires
    if not first or expires < first then first = expires end
  end
  if not first then return -1 end
  return math.max(0, first - NOW)
end

-- Write back D's changed fields and keep every key alive past its newest entry, plus KEEP_US
-- for the token counter: a name nobody touches again leaves nothing behind. "=exp" is the
-- time up to which the keys' expiry already covers entries; it moves SLACK_US ahead at a
-- time, so a busy name's keys are not given a new expiry on every step; when it moves, D and
-- L get the new expiry. L made by this step gets it too (its sentinel keeps it from being
-- dropped when the line empties, so it keeps that expiry). CW and PD get theirs whenever
-- this step wrote to them.
local function finish()
  if HDIRTY then pending['=hn'], pending['=hr'] = pack_holders() end
  if fmt(N) ~= S.n then pending['=n'] = fmt(N) end
  if N > 0 then
    if WDUE and fmt(WDUE) ~= S.wdue then pending['=wdue'] = fmt(WDUE) end
    local neg = NEG and '1' or '0'
    if neg ~= (S.neg or '0') then pending['=neg'] = neg end
  end
  if not S.layout then pending['=layout'] = LAYOUT end
  local covered, moved = coverage(S.exp, newest)
  if moved then pending['=exp'] = fmt(covered) end
  local gone = {}
  for f, _ in pairs(dropped) do
    if pending[f] == nil then table.insert(gone, f) end
  end
  unpack_chunks(gone, function(c) redis.call('HDEL', D, unpack(c)) end)
  local flat = {}
  for f, v in pairs(pending) do
    table.insert(flat, f)
    table.insert(flat, v)
  end
  if #flat > 0 then redis.call('HSET', D, unpack(flat)) end
  local at = expiry_at(covered)
  if moved then redis.call('PEXPIREAT', D, at) end
  if LINE_MADE or (moved and S.l) then redis.call('PEXPIREAT', L, at) end
  for k, _ in pairs(cbkeys) do redis.call('PEXPIREAT', k, at) end
end

-- A step that ends early (a refusal, an idle name) still writes back what purge() dropped.
local function finish_purge()
  if HDIRTY or fmt(N) ~= S.n or next(dropped) then finish() end
end

-- The score of this step's notification, or "".
local function notify_score()
  if NOTIFY then return fmt(NOW - NOTIFY_SHIFT) end
  return ''
end

-- An acquire reply: {granted, token, acquired_us, expires_us, now_us, position,
-- retry_after_us, wait_id, notify, entry} (see acquire.lua).
local function acquire_reply(granted, h, position, retry, wait_id, entry)
  if h then
    return {granted, h.token, h.acquired, h.expires, NOW, -1, -1, '', notify_score(), ''}
  end
  return {granted, '', 0, 0, NOW, position, retry, wait_id, notify_score(), entry}
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
