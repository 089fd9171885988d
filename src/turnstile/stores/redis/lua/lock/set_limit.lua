-- set_limit: model.set_limit, then wake whoever a raised limit granted. A lowered limit
-- revokes nothing: no grant until fewer than the new limit hold.
--
-- KEYS: D L CW PD (see _lib.lua)
-- ARGV: [1] key base  [2] name  [3] limit
-- Returns the limit replaced, or -1 when the name is idle (nothing changed: an idle name's
-- next acquire sets its limit); or {that, notify} when the step must be reported to the
-- index of names with callbacks (NOTIFY in _lib.lua).
-- Error "TURNSTILE name-collision" if the keys belong to another name (a hash collision).

local name, limit = ARGV[2], tonumber(ARGV[3])
load('')
if S.name and S.name ~= name then
  return redis.error_reply('TURNSTILE name-collision: two names share one key hash')
end
purge('')
if not busy() then
  finish_purge()
  return -1
end
local previous = S.limit or 1
if previous ~= limit then pending['=limit'] = fmt(limit) end
promote(limit, nil)
finish()
if NOTIFY then return {previous, notify_score()} end
return previous
