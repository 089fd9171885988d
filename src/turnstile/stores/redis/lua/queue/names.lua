-- queue_names: the name of the queue under these keys if it holds messages (ready, delayed,
-- KEYS: every key of the queue, in the order _lib.lua names them (META REC BODY ... WX)
-- in flight or dead), else '' (for listing queues). ARGV: [1] base. Reads only.
-- Returns the name (string) or ''.
local name = redis.call('HGET', META, 'name')
if name and redis.call('HLEN', REC) > 0 then return name end
return ''
