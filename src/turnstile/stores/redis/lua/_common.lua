-- Helpers every folder's steps share (lock, queue, rate): scripts.py puts this file first in
-- every script and every function library, ahead of the folder's own files.

-- An integer as Redis stores it: all its digits (tostring() would give 14 significant ones).
local function fmt(n)
  return string.format('%d', n)
end

-- The server clock (TIME) in integer microseconds. Redis 5+ replicates a step's effects, not
-- the step, so reading TIME before writing is safe on replicas and in the append-only file.
local function server_us()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000000 + tonumber(t[2])
end
