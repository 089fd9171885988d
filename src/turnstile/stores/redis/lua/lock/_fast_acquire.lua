-- acquire, fast path: runs before the library (_lib.lua) is even set up for the step, and
-- answers alone the commonest step, an acquire of a plain lock or semaphore on a name with
-- no holder and nobody in line (or a new name), with the commands the library would send
-- (HMGET, TIME, HSET; a new name's PEXPIREAT) and none of its tables. Anything else falls
-- through to the library and acquire.lua, which do the whole step with what was read here.
do
  local name, holder, limit, ttl = ARGV[2], ARGV[3], ARGV[4], tonumber(ARGV[5])
  if (ARGV[8] or '') == '' and (ARGV[10] or '') == '' then
    local r = read_name(holder) -- fields as load() in _lib.lua names them
    PRELOAD = r
    if (not r[1] or r[1] == name) and not r[6] and not r[7] and (r[9] or '') == ''
        and (r[11] or '0') == '0' then
      local now = server_us()
      local token = fmt(math.max(tonumber(r[3] or '0') + 1, now))
      local expires = now + ttl
      local rec = token .. ' ' .. fmt(now) .. ' ' .. fmt(expires) .. ' 1'
      local fields = {'=hn', #holder .. ':' .. holder, '=hr', #rec .. ':' .. rec, '=last', token}
      if r[2] ~= limit then
        table.insert(fields, '=limit')
        table.insert(fields, limit)
      end
      if not r[1] then
        table.insert(fields, '=name')
        table.insert(fields, name)
      end
      if not r[8] then
        table.insert(fields, '=layout')
        table.insert(fields, LAYOUT)
      end
      write_name(fields, tonumber(r[5] or '0'), expires, r[14] == '1')
      return {1, token, now, expires, now, -1, -1, '', '', ''}
    end
  end
end
