-- release, fast path: runs before the library (_lib.lua) is even built, and answers alone
-- the commonest release, of the one holder of a name nobody waits for, in 5 commands.
-- Anything else (a stale token, a lease that expired, waiters, callbacks) falls through to
-- the library and release.lua. See _fast_acquire.lua for "=fast": kind "1" stamped with
-- the current "=last" and "=seq" means nothing was added since the name had one holder and
-- nobody in line, so if that holder is the caller's record, the caller is its only holder.
do
  local holder, token = ARGV[2], ARGV[3]
  if token ~= '' then
    local d = KEYS[1]
    local r = read_name(holder) -- fields as load() in _lib.lua names them
    PRELOAD = r
    local last, seq = r[3] or '0', r[4] or '0'
    if r[10] == last .. ' ' .. seq .. ' 1' and not r[6] and r[7] then
      local mine, expires = string.match(r[7], '^(%d+) %d+ (%d+) [01]$')
      if mine == token then
        if tonumber(expires) > server_us() then
          redis.call('HDEL', d, 'h:' .. holder)
          redis.call('ZREM', KEYS[2], holder)
          redis.call('HSET', d, '=fast', last .. ' ' .. seq .. ' 0')
          return 1
        end
      end
    end
  end
end
