-- acquire, fast path: runs before the library (_lib.lua) is even built, and answers alone
-- the commonest step, an acquire on a name that is idle (or new), in 5 commands. Anything
-- else falls through to the library and acquire.lua, which do the whole step.
--
-- "=fast" in D is "<last> <seq> <kind>": a step of the library wrote it knowing the name,
-- at the end of that step, to have kind "0" (no holder, nobody in line) or "1" (one holder,
-- nobody in line), with "=last" and "=seq" as given. Every step that adds a holder takes a
-- new token ("=last"), every step that adds a waiter a new stamp ("=seq"), whoever's client
-- and release runs it; so while both still read as stamped, nothing was added since, and
-- kind "0" still holds (nothing can have been removed from an idle name). A callback name
-- ("=cb") or a semaphore group ("=pk") never takes this path. "=due" (_lib.lua, DUE) is
-- written as the new lease's expiry: the only entry of the name. The library also writes
-- kinds "1q", "q" and "1w" (a busy line; see HMAX in _lib.lua), which no fast path takes.
do
  local name, holder, limit, ttl = ARGV[2], ARGV[3], ARGV[4], tonumber(ARGV[5])
  if (ARGV[8] or '') == '' and (ARGV[10] or '') == '' then
    local d = KEYS[1]
    local r = read_name(holder) -- fields as load() in _lib.lua names them
    PRELOAD = r
    local last, seq = r[3] or '0', r[4] or '0'
    -- A new name (no record at all: every field read is missing) is idle too: each order of a
    -- webhook feed is one. Its keys expired together, KEEP_US after the latest entry, so no
    -- holder, waiter or token of it is left anywhere (tokens come from the clock again).
    local new = not (r[1] or r[2] or r[3] or r[4] or r[5] or r[6] or r[7] or r[8] or r[9]
                     or r[10] or r[11] or r[12])
    if new or (r[10] == last .. ' ' .. seq .. ' 0' and r[1] == name and not r[6] and not r[9]
        and not r[7] and not r[8]) then
      local now = server_us()
      local token = fmt(math.max(tonumber(last) + 1, now))
      local expires = now + ttl
      local fe = fmt(expires)
      local fields = {'h:' .. holder, token .. ' ' .. fmt(now) .. ' ' .. fe .. ' 1',
                      '=last', token, '=fast', token .. ' ' .. seq .. ' 1',
                      '=due', fe .. ' ' .. token .. ' ' .. seq}
      if r[2] ~= limit then
        table.insert(fields, '=limit')
        table.insert(fields, limit)
      end
      if new then
        table.insert(fields, '=name')
        table.insert(fields, name)
      end
      -- As finish() in _lib.lua: D's expiry moves SLACK_US ahead at a time; HX was empty
      -- (so Redis had dropped it) and is made again here, so it gets its expiry now.
      local covered, move = coverage(tonumber(r[5] or '0'), expires)
      if move then
        table.insert(fields, '=exp')
        table.insert(fields, fmt(covered))
        if new then
          -- "=all" (ALL in _lib.lua), as the library writes it for a new name: of D, HX, WX
          -- and WQ, the two that exist (WX and WQ of a new name do not) get the expiry here.
          table.insert(fields, '=all')
          table.insert(fields, fmt(covered))
        end
      end
      redis.call('HSET', d, unpack(fields))
      redis.call('ZADD', KEYS[2], fe, holder)
      local at = expiry_at(covered)
      redis.call('PEXPIREAT', KEYS[2], at)
      if move then redis.call('PEXPIREAT', d, at) end
      return {1, token, now, expires, now, -1, -1, ''}
    end
  end
end
