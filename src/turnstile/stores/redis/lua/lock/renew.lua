-- renew: model.renew: extend the lease (holder, token) to now + ttl.
--
-- KEYS: D L CW PD (see _lib.lua)
-- ARGV: [1] key base  [2] holder  [3] token (decimal string)  [4] ttl_us
-- Returns {1, token, acquired_us, expires_us, now_us}, or {0} if the lease is gone (lost).

local holder, token, ttl = ARGV[2], ARGV[3], tonumber(ARGV[4])
load(holder)
local h = S.mine
if not h then return {0} end
if h.token ~= token or h.expires <= NOW then return {0} end
h.expires = NOW + ttl
h.claimed = true
put_holder(holder, h)
finish()
return {1, h.token, h.acquired, h.expires, NOW}
