-- queue_unregister: a waiter stops waiting. ARGV: [1] base [2] waiter. Returns 0.
-- KEYS: every key of the queue, in the order _lib.lua names them (META REC BODY ... WX)
unregister(ARGV[2])
redis.call('DEL', BASE .. 's:' .. ARGV[2])
return 0
