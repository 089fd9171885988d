-- release, fast path: runs before the library (_lib.lua) is even set up for the step, and
-- answers alone the two commonest releases of the only holder of a plain lock or semaphore:
-- when nobody waits (HMGET, TIME, HSET, as the library would), and a plain lock's hand-over
-- to the waiter at the front of its line (HMGET, TIME, ZPOPMIN, PUBLISH, HSET, as the
-- library would, without its tables: the grant and its wake-up as grant_entries() and wake()
-- make them, the record as finish() writes it). Anything else (a stale token, a lease that
-- expired, a semaphore's line, entries that may have lapsed, callbacks on the name, a
-- group) falls through to the library and release.lua, with what was read here (and, should
-- the front of the line be anything but a waiting entry, what was popped put back).
do
  local holder, token = ARGV[2], ARGV[3]
  if token ~= '' then
    local r = read_name(holder) -- fields as load() in _lib.lua names them
    PRELOAD = r
    if r[9] == #holder .. ':' .. holder and not r[6] and not r[7] then
      local mine, expires = string.match(r[10] or '', '^%d+:(%d+) %d+ (%d+) [01]$')
      local now = mine == token and server_us()
      r.now = now -- the library's clock for this step, if it goes on (begin() in _lib.lua)
      local waiting = tonumber(r[11] or '0')
      local live = now and tonumber(expires) > now -- the caller's own lease, not expired
      if live and waiting == 0 then
        redis.call('HSET', KEYS[1], '=hn', '', '=hr', '')
        return 1
      end
      -- A plain lock's hand-over: every entry in line is live ("=wdue", a lower bound on
      -- their expiries, is ahead), so the front one is granted.
      if live and r[2] == '1' and r[8] == LAYOUT
          and r[12] and tonumber(r[12]) > now then
        local popped = redis.call('ZPOPMIN', KEYS[2], 1)
        local m = popped[1]
        -- The entry as parse_member() in _lib.lua reads it: "[i]<bytes>:<holder>" then
        -- "<ttl> <wait_ttl> <joined> <expires>" and " @<bytes> <channel>" for a waiter to
        -- wake; no group key and no callback here (the name has neither).
        local ix = m and string.byte(m, 1) == 105 -- "i": indexed in D as "w:"..holder
        local n, at = string.match(m or '', '^(%d+):()', ix and 2 or 1)
        local w, ttl, wait_ttl, joined, tail
        if n then
          n = tonumber(n)
          w = string.sub(m, at, at + n - 1)
          ttl, wait_ttl, joined, tail =
            string.match(string.sub(m, at + n), '^(%d+) (%d+) (%d+) %d+(.*)$')
        end
        local ch = false
        if tail and tail ~= '' then
          local chn, chat = string.match(tail, '^ @(%d+) ()')
          ch = chat and string.sub(tail, chat)
          if ch and #ch ~= tonumber(chn) then ch = nil end
        end
        if tail and ch ~= nil then
          local last = fmt(math.max(tonumber(r[3] or '0') + 1, now))
          local until_us = now + math.min(tonumber(ttl), tonumber(wait_ttl))
          local rec = last .. ' ' .. fmt(now) .. ' ' .. fmt(until_us) .. ' 0'
          if ch then
            redis.call('PUBLISH', ch, 'g ' .. last .. ' ' .. fmt(now) .. ' ' ..
                       fmt(until_us) .. ' ' .. joined .. ' ' .. ARGV[1] .. w)
          end
          if ix then redis.call('HDEL', KEYS[1], 'w:' .. w) end
          local fields = {'=hn', #w .. ':' .. w, '=hr', #rec .. ':' .. rec, '=last', last,
                          '=n', fmt(waiting - 1)}
          write_name(fields, tonumber(r[5] or '0'), until_us, r[14] == '1')
          return 1
        end
        if m then redis.call('ZADD', KEYS[2], popped[2], m) end -- as it was: the library goes on
      end
    end
  end
end
