-- release: model.release, then wake whoever was granted the freed slots.
-- Only the lease with the given token is touched; without a token, also the holder's place
-- in line. A stale or repeated release changes nothing.
--
-- KEYS: D L CW PD (see _lib.lua)
-- ARGV: [1] key base  [2] holder  [3] token as a decimal string, or "" for none
--       [4] (optional; "" or absent: none) the holder's waiting entry as its acquire reply
--       gave it, for an entry that is not indexed (see acquire.lua, ARGV 13 and 14)
-- Returns 1 if something was released, else 0; or {1 or 0, notify} when the step must be
-- reported to the index of names with callbacks (NOTIFY in _lib.lua).

local holder, token, given = ARGV[2], ARGV[3], ARGV[4] or ''
load(holder)
purge(holder)
local released = 0
if S.mine and (token == '' or S.mine.token == token) then
  drop_holder(holder)
  released = 1
end
if token == '' then
  local waiting = find_waiting(holder, given)
  if waiting then
    leave(waiting)
    released = 1
  end
end
if S.limit and N > 0 then promote(S.limit, nil) end
finish()
if NOTIFY then return {released, notify_score()} end
return released
