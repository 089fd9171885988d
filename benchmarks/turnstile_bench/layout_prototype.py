"""The prototype of Turnstile's Redis key layout 2 for locks, measured beside the real one
(``bench_redis_layout.py``): it was measured first, then adopted with everything below it
leaves out (docs/redis.md, "Constant work per hand-over").

It is *not* Turnstile: a plain lock or semaphore only (no priorities, no callbacks, no
semaphore groups, no status), written to count what a hand-over costs when

- the holders live in one field of the name's hash (``=h``: every lease on one line, at most
  ``limit`` of them), so an expired lease is dropped by reading that field, with no index of
  holders to keep;
- the line is one sorted set scored by arrival, whose members carry the waiting entry itself
  (``"<expires_us> <ttl_us> <wait_ttl_us> <channel> <holder>"``), so a hand-over pops the
  front with one ``ZPOPMIN`` and has nothing else of the waiter to read or delete. A waiter
  that stopped renewing its place is not swept: it is dropped when it reaches the front
  (``=n`` counts the members, dead or alive, so a position counts them too). A sentinel
  member scored +inf keeps the set from vanishing when the line empties, so it keeps its
  expiry;
- the wake-up is a ``PUBLISH`` of the grant on the waiting client's own channel (one
  subscription per client process, opened once), not a list per waiter that needs an expiry
  and a ``BLPOP``;
- optionally (``waiter_fields=True``), a field per waiter in the name's hash (``w:<holder>``:
  its member in line), written in the join's ``HSET`` and dropped by one ``HDEL`` when the
  entry leaves the line, so a holder can leave the line by name from another process.

What it keeps from the real layout: leases that expire on the server clock, waiting entries
that expire unless renewed (here every ``wait_ttl / 3``), fencing tokens ``max(last + 1,
now_us)`` that never repeat, a grant carried by the wake-up (unclaimed: it lasts
``min(ttl, wait_ttl)`` until the holder's next step), strict arrival order, and keys that
expire by themselves an hour after their newest entry (the expiry moved 300 s ahead at a
time, so a busy name's keys are not given a new one on every step).
"""

from __future__ import annotations

import contextlib
import hashlib
import math
import secrets
import time
from typing import Any

from .adapters import TTL, LockAdapter

LIBRARY = "tsproto"

# Redis function library (FUNCTION LOAD, FCALL): KEYS = D (hash), L (zset).
LUA = r"""#!lua name=tsproto
local KEEP_US = 3600 * 1000000
local SLACK_US = 300 * 1000000
local SENTINEL = '~'

local function fmt(n) return string.format('%d', n) end

local function now_us()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000000 + tonumber(t[2])
end

-- "=h": one line per lease, "<holder> <token> <acquired_us> <expires_us> <claimed 0|1>".
local function live_holders(text, now)
  local hs, dropped = {}, false
  if text then
    for line in string.gmatch(text, '[^\n]+') do
      local holder, token, acq, exp, cl = string.match(line, '^(%S+) (%d+) (%d+) (%d+) ([01])$')
      if tonumber(exp) > now then
        table.insert(hs, {holder = holder, token = token, acquired = tonumber(acq),
                          expires = tonumber(exp), claimed = cl == '1'})
      else
        dropped = true
      end
    end
  end
  return hs, dropped
end

local function pack_holders(hs)
  local out = {}
  for _, h in ipairs(hs) do
    table.insert(out, h.holder .. ' ' .. h.token .. ' ' .. fmt(h.acquired) .. ' ' ..
                 fmt(h.expires) .. ' ' .. (h.claimed and '1' or '0'))
  end
  return table.concat(out, '\n')
end

-- One step's view of a name: read with one HMGET and one TIME.
local function load(keys)
  local r = redis.call('HMGET', keys[1], '=last', '=seq', '=h', '=n', '=exp', '=limit')
  local st = {D = keys[1], L = keys[2], now = now_us(), last = tonumber(r[1] or '0'),
              seq = tonumber(r[2] or '0'), n = tonumber(r[4] or '0'),
              exp = tonumber(r[5] or '0'), limit = tonumber(r[6] or '0'), fields = {},
              newest = 0, made = r[5] == false}
  st.hs, st.dirty = live_holders(r[3], st.now)
  return st
end

local function token(st)
  st.last = math.max(st.last + 1, st.now)
  st.fields['=last'] = fmt(st.last)
  return fmt(st.last)
end

-- Grant free slots to the front of the line: pop it, drop the dead, publish the grants.
local function promote(st, chan_prefix)
  local free = st.limit - #st.hs
  local gone = {}
  while free > 0 and st.n > 0 do
    local popped = redis.call('ZPOPMIN', st.L, math.min(free, st.n))
    if #popped == 0 then st.n = 0 break end
    for i = 1, #popped, 2 do
      local m, stamp = popped[i], popped[i + 1]
      if m == SENTINEL then
        redis.call('ZADD', st.L, '+inf', SENTINEL) -- =n was wrong; never happens
        st.n = 0
        break
      end
      st.n = st.n - 1
      local wexp, wttl, wwait, chan, holder = string.match(m, '^(%d+) (%d+) (%d+) (%S+) (.+)$')
      table.insert(gone, 'w:' .. holder)
      if tonumber(wexp) > st.now then
        local h = {holder = holder, token = token(st), acquired = st.now,
                   expires = st.now + math.min(tonumber(wttl), tonumber(wwait)), claimed = false}
        table.insert(st.hs, h)
        st.newest = math.max(st.newest, h.expires)
        free = free - 1
        redis.call('PUBLISH', chan_prefix .. chan, 'g ' .. holder .. ' ' .. h.token .. ' ' ..
                   fmt(h.acquired) .. ' ' .. fmt(h.expires) .. ' ' .. stamp)
      end
    end
    st.dirty = true
    st.fields['=n'] = fmt(st.n)
  end
  -- With waiter fields, the popped entries' fields go too (one HDEL).
  if st.wf and #gone > 0 then redis.call('HDEL', st.D, unpack(gone)) end
end

-- Write the step back: one HSET; the keys' expiry only when it must move.
local function finish(st)
  if st.dirty then st.fields['=h'] = pack_holders(st.hs) end
  local covered = false
  if st.newest > st.exp then
    covered = st.newest + SLACK_US
    st.fields['=exp'] = fmt(covered)
  end
  local flat = {}
  for f, v in pairs(st.fields) do
    table.insert(flat, f)
    table.insert(flat, v)
  end
  if #flat > 0 then redis.call('HSET', st.D, unpack(flat)) end
  if covered then -- after the HSET and the sentinel: both keys exist
    if st.made then redis.call('ZADD', st.L, '+inf', SENTINEL) end
    local at = fmt(math.floor((covered + KEEP_US) / 1000) + 2)
    redis.call('PEXPIREAT', st.D, at)
    redis.call('PEXPIREAT', st.L, at)
  end
end

-- ARGV: channel prefix, holder, limit, ttl_us, wait_ttl_us, the caller's channel, the
-- caller's member in line when it is waiting ("" otherwise), "1" to keep a field per waiter
-- ("w:<holder>" = its member, so a holder can leave the line from another process).
-- Returns {1, token, acquired_us, expires_us} or {0, member, position, stamp}.
local function acquire(keys, args)
  local chan_prefix, holder = args[1], args[2]
  local limit, ttl, wait_ttl = tonumber(args[3]), tonumber(args[4]), tonumber(args[5])
  local chan, member = args[6], args[7]
  local st = load(keys)
  st.wf = args[8] == '1'
  if #st.hs == 0 and st.n == 0 and st.limit ~= limit then
    st.limit = limit
    st.fields['=limit'] = fmt(limit)
  end
  for _, h in ipairs(st.hs) do
    if h.holder == holder then
      if not h.claimed then
        h.claimed, h.expires, st.dirty = true, st.now + ttl, true
        st.newest = h.expires
      end
      finish(st)
      return {1, h.token, h.acquired, h.expires}
    end
  end
  promote(st, chan_prefix)
  for _, h in ipairs(st.hs) do
    if h.holder == holder then -- granted just now, from its place in line
      h.claimed, h.expires = true, st.now + ttl
      st.newest = math.max(st.newest, h.expires)
      finish(st)
      return {1, h.token, h.acquired, h.expires}
    end
  end
  if member ~= '' then
    local stamp = redis.call('ZSCORE', st.L, member)
    if stamp then -- keep its place: the same score, a new expiry
      local fresh = fmt(st.now + wait_ttl) .. ' ' .. fmt(ttl) .. ' ' .. fmt(wait_ttl) .. ' ' ..
                    chan .. ' ' .. holder
      redis.call('ZREM', st.L, member)
      redis.call('ZADD', st.L, stamp, fresh)
      if st.wf then st.fields['w:' .. holder] = fresh end
      st.newest = math.max(st.newest, st.now + wait_ttl)
      finish(st)
      return {0, fresh, -1, stamp}
    end
  end
  if #st.hs < st.limit and st.n == 0 then
    local h = {holder = holder, token = token(st), acquired = st.now, expires = st.now + ttl,
               claimed = true}
    table.insert(st.hs, h)
    st.dirty = true
    st.newest = math.max(st.newest, h.expires)
    finish(st)
    return {1, h.token, h.acquired, h.expires}
  end
  local stamp = math.max(st.seq + 1, st.now)
  local fresh = fmt(st.now + wait_ttl) .. ' ' .. fmt(ttl) .. ' ' .. fmt(wait_ttl) .. ' ' ..
                chan .. ' ' .. holder
  redis.call('ZADD', st.L, fmt(stamp), fresh)
  st.fields['=seq'] = fmt(stamp)
  if st.wf then st.fields['w:' .. holder] = fresh end -- in the same HSET
  st.fields['=n'] = fmt(st.n + 1)
  st.newest = math.max(st.newest, st.now + wait_ttl)
  finish(st)
  return {0, fresh, st.n, fmt(stamp)}
end

-- ARGV: channel prefix, holder, token ("" for none), the caller's member in line ("";
-- found by its field with waiter fields on and no token), "1" for waiter fields.
-- Returns 1 if something was released, else 0.
local function release(keys, args)
  local chan_prefix, holder, tok, member = args[1], args[2], args[3], args[4]
  local st = load(keys)
  st.wf = args[5] == '1'
  if st.wf and tok == '' and member == '' then
    -- Leaving the line by holder alone (from another process): the field finds the entry.
    member = redis.call('HGET', st.D, 'w:' .. holder) or ''
  end
  local released = 0
  for i, h in ipairs(st.hs) do
    if h.holder == holder and (tok == '' or h.token == tok) then
      table.remove(st.hs, i)
      st.dirty, released = true, 1
      break
    end
  end
  if member ~= '' and redis.call('ZREM', st.L, member) == 1 then
    if st.wf then redis.call('HDEL', st.D, 'w:' .. holder) end
    st.n = st.n - 1
    st.fields['=n'] = fmt(st.n)
    released = 1
  end
  promote(st, chan_prefix)
  finish(st)
  return released
end

redis.register_function('tsproto_acquire', acquire)
redis.register_function('tsproto_release', release)
"""


def load_library(client: Any) -> None:
    """Load (or replace) the prototype's function library on ``client``'s server."""
    client.function_load(LUA, replace=True)


def delete_library(client: Any) -> None:
    import redis

    with contextlib.suppress(redis.ResponseError):  # not loaded
        client.function_delete(LIBRARY)


class LayoutPrototypeLock(LockAdapter):
    """The prototype, used as the benchmarks use every lock: block until held, release.

    One client per worker process: a command connection, and one pub/sub connection
    subscribed (once, in the constructor) to the process's own channel, on which the
    releaser publishes the grant. While waiting it renews its place every ``wait_ttl / 3``.
    """

    def __init__(
        self, url: str, prefix: str, wait_ttl: float = 30.0, waiter_fields: bool = False
    ) -> None:
        import redis

        self.redis = redis.Redis.from_url(url)
        load_library(self.redis)
        self.prefix = prefix
        self.chan_prefix = prefix + "c:"
        self.client_id = secrets.token_hex(6)
        self.pubsub = self.redis.pubsub(ignore_subscribe_messages=True)
        self.pubsub.subscribe(self.chan_prefix + self.client_id)
        self.ttl_us = int(TTL * 1e6)
        self.wait_ttl = wait_ttl
        self.waiter_fields = "1" if waiter_fields else "0"
        self.count = 0
        self.held: tuple[list[str], str, str] | None = None
        self._names: dict[str, list[str]] = {}
        self._conn = self.redis.connection_pool.get_connection()

    def _keys(self, name: str) -> list[str]:
        keys = self._names.get(name)
        if keys is None:
            tag = hashlib.sha256(name.encode()).hexdigest()[:32]
            keys = self._names[name] = [f"{self.prefix}{{{tag}}}:d", f"{self.prefix}{{{tag}}}:l"]
        return keys

    def _fcall(self, function: str, keys: list[str], *args: Any) -> Any:
        """FCALL on a connection of the adapter's own, past redis-py's command path (as
        Turnstile's client sends its steps), so the comparison is of the layouts."""
        conn = self._conn
        conn.send_packed_command(conn.pack_command("FCALL", function, len(keys), *keys, *args))
        return conn.read_response()

    def _acquire_step(self, keys: list[str], holder: str, member: str) -> list[Any]:
        wait_ttl_us = int(self.wait_ttl * 1e6)
        return list(
            self._fcall(
                "tsproto_acquire",
                keys,
                self.chan_prefix,
                holder,
                1,
                self.ttl_us,
                wait_ttl_us,
                self.client_id,
                member,
                self.waiter_fields,
            )
        )

    def acquire(self, name: str) -> None:
        self.count += 1
        holder = f"{self.client_id}/{self.count}"
        keys = self._keys(name)
        self.queued_at = math.nan
        reply = self._acquire_step(keys, holder, "")
        while reply[0] != 1:
            member = reply[1].decode()
            if math.isnan(self.queued_at):
                self.queued_at = time.monotonic()
            heartbeat = time.monotonic() + self.wait_ttl / 3
            while True:
                left = heartbeat - time.monotonic()
                if left <= 0:
                    reply = self._acquire_step(keys, holder, member)  # keep my place
                    break
                message = self.pubsub.get_message(timeout=left)
                if message is None or message.get("type") != "message":
                    continue
                grant = message["data"].decode().split(" ")
                if grant[0] == "g" and grant[1] == holder:
                    self.held = (keys, holder, grant[2])
                    return
        self.held = (keys, holder, reply[1].decode())

    def release(self) -> None:
        assert self.held is not None
        keys, holder, token = self.held
        self.held = None
        self._fcall(
            "tsproto_release", keys, self.chan_prefix, holder, token, "", self.waiter_fields
        )

    def close(self) -> None:
        self.redis.connection_pool.release(self._conn)
        self.pubsub.close()
        self.redis.close()
