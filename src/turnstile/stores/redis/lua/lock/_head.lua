-- Declared ahead of the fast paths (_fast_*.lua) and the library (_lib.lua) in every lock
-- script and in the lock function library: the keys' expiry, the layout check, and the one
-- read of the name's record that a step starts with.

-- What a fast path that fell through already read of the name (read_name()), so that the
-- library's load() does not read it again.
local PRELOAD = false

-- Every key expires by itself KEEP_US after the latest entry in it (the token counter must
-- outlive the name's leases); "=exp", how far the keys' expiry already reaches, moves
-- SLACK_US ahead at a time, so a busy name's keys are not given a new expiry on every step.
local KEEP_US = 3600 * 1000000
local SLACK_US = 300 * 1000000

-- The key layout this release keeps a name in: written as "=layout" by the first step that
-- writes the name. A name marked with another layout (a later release's) is refused, never
-- guessed at: its holders and line are not where this release looks, so it would find none
-- and grant the name a second time. A record without the mark but with "=exp" was written
-- by a build before this layout (its holders in an index of their own), refused as well;
-- such records expire by themselves KEEP_US after their last entry.
local LAYOUT = '2'

local function refuse_layout(layout, exp)
  if layout and layout ~= LAYOUT then
    error({err = 'TURNSTILE layout ' .. layout .. ': the name is kept in a newer key layout'})
  end
  if not layout and exp then
    error({err = 'TURNSTILE layout 1: the name is kept in an earlier key layout'})
  end
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

-- The name's record as a step first reads it, for `holder` (one HMGET; load() in _lib.lua
-- names each field). Refuses a name kept in another layout (refuse_layout()).
local function read_name(holder)
  local r = redis.call('HMGET', KEYS[1], '=name', '=limit', '=last', '=seq', '=exp', '=cb',
                       '=pk', '=layout', '=hn', '=hr', '=n', '=wdue', '=neg', '=l',
                       'w:' .. holder)
  refuse_layout(r[8], r[5])
  return r
end

-- A fast path's write of the name's record (_fast_*.lua): HSET `fields`, and, as finish() in
-- _lib.lua does, move the keys' expiry SLACK_US ahead when an entry expiring at `newest`
-- outruns the coverage read as "=exp" (`exp`); `line`: L exists ("=l" read as "1").
local function write_name(fields, exp, newest, line)
  local covered, move = coverage(exp, newest)
  if move then
    table.insert(fields, '=exp')
    table.insert(fields, fmt(covered))
  end
  redis.call('HSET', KEYS[1], unpack(fields))
  if move then
    local at = expiry_at(covered)
    redis.call('PEXPIREAT', KEYS[1], at)
    if line then redis.call('PEXPIREAT', KEYS[2], at) end
  end
end
