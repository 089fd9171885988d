-- leave: rate_machine.leave: give up a place in line.
--
-- KEYS: M L X A (see _lib.lua)
-- ARGV: [1] name [2] holder
-- Returns 1 if the holder had a place, else 0. A name left idle is deleted at once.

local name, holder = ARGV[1], ARGV[2]
load()
if not S.exists then return 0 end
purge_waiters()
local left = 0
if S.nw > 0 and redis.call('ZSCORE', L, holder) then
  remove_waiter(holder)
  left = 1
end
if idle() then
  redis.call('DEL', M, L, X, A)
  return left
end
save(name)
return left
