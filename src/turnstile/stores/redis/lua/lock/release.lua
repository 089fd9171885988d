-- release: model.release, then wake whoever was granted the freed slots.
-- Only the lease with the given token is touched; without a token, also the holder's place
-- in line. A stale or repeated release changes nothing.
--
-- KEYS: D HX WX WQ CW PD (see _lib.lua)
-- ARGV: [1] key base  [2] holder  [3] token as a decimal string, or "" for none
-- Returns 1 if something was released, else 0; or {1 or 0, notify} when the step must be
-- reported to the index of names with callbacks (NOTIFY in _lib.lua).

local holder, token = ARGV[2], ARGV[3]
load(holder)
purge(holder)
local released = 0
if S.mine and (token == '' or parse_holder(S.mine).token == token) then
  drop_holder(holder, parse_holder(S.mine))
  released = 1
end
if token == '' then
  if S.waiting then
    drop_waiter(holder)
    released = 1
  end
end
if S.limit and not NO_WAITERS then promote(S.limit, nil) end
if NO_WAITERS and not S.cb and not S.pk then
  -- Nobody in line: with no holder or one left, the next acquire or release of the name
  -- can take a fast path (_fast_acquire.lua, _fast_release.lua).
  local n = held()
  if n <= 1 then FAST = fmt(n) end
end
finish()
if NOTIFY then return {released, notify_score()} end
return released
