-- Declared ahead of everything else in a lock script, for the fast paths (_fast_*.lua) and
-- the library (_lib.lua) alike: a fast path runs before the library is built, and both read
-- the name's record, the server clock and the keys' expiry the same way.

-- What a fast path that fell through already read of the name (read_name()), so the
-- library's load() does not read it again.
local PRELOAD = false
-- Every key expires by itself KEEP_US after the latest entry in it (the token counter must
-- outlive the name's leases); "=exp", how far the keys' expiry already reaches, moves
-- SLACK_US ahead at a time, so a busy name's keys are not given a new expiry on every step.
local KEEP_US = 3600 * 1000000
local SLACK_US = 300 * 1000000

-- "=layout" in D marks a name that a later release keeps in another key layout (its holders
-- and line are no longer where this release looks). A step of this release must neither read
-- nor write such a name: it would find no holder and grant it a second time. It fails with
-- this error instead, which the client reports as a configuration error (upgrade it).
local function refuse_layout(layout)
  if layout then
    error({err = 'TURNSTILE layout ' .. layout .. ': the name is kept in a newer key layout'})
  end
end

-- The name's record as a step first reads it, for `holder` (one HMGET; load() in _lib.lua
-- names each field). Refuses a name in a newer layout (refuse_layout()).
local function read_name(holder)
  local r = redis.call('HMGET', KEYS[1], '=name', '=limit', '=last', '=seq', '=exp', '=cb',
                       'h:' .. holder, 'w:' .. holder, '=pk', '=fast', '=due', '=all', '=layout')
  refuse_layout(r[13])
  return r
end

-- How far the keys' expiry must reach once an entry expiring at `newest` is written, when it
-- reaches `exp` now: `exp`, or SLACK_US past `newest` if that is later; and whether it moved.
local function coverage(exp, newest)
  if newest > exp then return newest + SLACK_US, true end
  return exp, false
end

-- The PEXPIREAT time (ms) of keys covered up to `covered` (us).
local function expiry_at(covered)
  return fmt(math.floor((covered + KEEP_US) / 1000) + 2)
end
