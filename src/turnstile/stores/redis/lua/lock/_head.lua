-- Declared ahead of everything else in a lock script: what a fast path (_fast_*.lua) that
-- fell through already read of the name (the HMGET load() in _lib.lua would send), so the
-- library does not read it again.
local PRELOAD = false
