-- queue_stats: queue_machine.stats. ARGV: [1] base [2] top_keys
-- KEYS: every key of the queue, in the order _lib.lua names them (META REC BODY ... WX)
-- Returns {ready, delayed, in_flight, dead, oldest_enqueued_us or -1, now_us,
--          {key1, n1, key2, n2, ...}} with the deepest keys first (ties by key).
local top = tonumber(ARGV[2])
local freed = purge()
local ready = redis.call('ZCOUNT', DUE, '-inf', fmt(NOW))
local delayed = redis.call('ZCOUNT', DUE, '(' .. fmt(NOW), '+inf')
local oldest = redis.call('ZRANGE', ENQ, 0, 0, 'WITHSCORES')
local deepest = {}
local best = redis.call('ZREVRANGE', DEPTH, 0, top - 1, 'WITHSCORES')
if #best > 0 then
  local cutoff = best[#best]
  for i = 1, #best, 2 do
    if tonumber(best[i + 1]) > tonumber(cutoff) then
      deepest[#deepest + 1] = {best[i], tonumber(best[i + 1])}
    end
  end
  table.sort(deepest, function(a, b)
    if a[2] ~= b[2] then return a[2] > b[2] end
    return a[1] < b[1]
  end)
  local ties = redis.call('ZRANGEBYSCORE', DEPTH, cutoff, cutoff)
  table.sort(ties)
  for _, k in ipairs(ties) do
    if #deepest >= top then break end
    deepest[#deepest + 1] = {k, tonumber(cutoff)}
  end
end
local flat = {}
for _, pair in ipairs(deepest) do
  flat[#flat + 1] = pair[1]
  flat[#flat + 1] = pair[2]
end
wake(freed)
return {ready, delayed, redis.call('ZCARD', FLY), redis.call('ZCARD', DEAD),
        #oldest > 0 and tonumber(oldest[2]) or -1, NOW, flat}
