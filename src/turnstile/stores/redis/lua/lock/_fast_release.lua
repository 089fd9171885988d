-- release, fast path: runs before the library (_lib.lua) is even set up for the step, and
-- answers alone the commonest release, of the only holder of a plain lock or semaphore that
-- nobody waits for (HMGET, TIME, HSET, as the library would). Anything else (a stale token,
-- a lease that expired, waiters, callbacks, a group) falls through to the library and
-- release.lua, with what was read here.
do
  local holder, token = ARGV[2], ARGV[3]
  if token ~= '' then
    local r = read_name(holder) -- fields as load() in _lib.lua names them
    PRELOAD = r
    if r[9] == #holder .. ':' .. holder and (r[11] or '0') == '0' and not r[6] and not r[7] then
      local mine, expires = string.match(r[10] or '', '^%d+:(%d+) %d+ (%d+) [01]$')
      if mine == token and tonumber(expires) > server_us() then
        redis.call('HSET', KEYS[1], '=hn', '', '=hr', '')
        return 1
      end
    end
  end
end
