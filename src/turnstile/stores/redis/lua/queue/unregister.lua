-- queue_unregister: a waiter stops waiting. ARGV: [1] base [2] waiter. Returns 0.
unregister(ARGV[2])
redis.call('DEL', BASE .. 's:' .. ARGV[2])
return 0
