-- queue_names: the name of the queue under these keys if it holds messages (ready, delayed,
-- in flight or dead), else '' (for listing queues). ARGV: [1] base. Reads only.
local name = redis.call('HGET', META, 'name')
if name and redis.call('HLEN', REC) > 0 then return name end
return ''
