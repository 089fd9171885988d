"""Where Turnstile's data lives in Redis, for locks and queues (no I/O; both flavours).

These names are data: a release must keep every one byte for byte, or it would not see the
locks and queues an older one left.

Key layout (``docs/redis.md``): every key lives under the URL's ``prefix`` (default
``turnstile:``); the keys of one name share the hash tag ``{T}``, where ``T`` is a hash of
the name (names may hold ``{``, ``}`` and anything else, so the name itself is never part of
a key, only stored as data), so a name lives in one Redis Cluster slot::

    <prefix>{T}:d    hash  the name, limit, last fencing token, newest arrival stamp, a
                           semaphore group's per-key limit ("=pk"), the key layout
                           ("=layout" 2), every holder ("=hn" names, "=hr" records), the
                           line's count ("=n") and a lower bound on its entries' expiries
                           ("=wdue"), how far the keys' expiry reaches ("=exp"), and
                           w:<holder> = the score of an indexed waiting entry (see
                           lua/lock/_lib.lua)
    <prefix>{T}:l    zset  the line: one member per waiting entry (the entry itself), by rank
                           (priority, then arrival); a sentinel "~" scored +inf
    <prefix>{T}:cw   zset  callback waiters by waiting-entry expiry (only while D has "=cb")
    <prefix>{T}:pd   zset  holders whose callback delivery is pending, by the deliverer's
                           claim on it (0: unclaimed; only while D has "=cb")

A lock waiter is woken by a PUBLISH on its client's channel, ``<prefix>w:<random id>``
(``_async/backends/redis_listen.py``): a channel, not a key, so nothing to expire or clean.

The store-wide index of names with callbacks (``lua/lock/index.lua``) shares one hash tag of
its own, ``{callbacks}``, never a name's (those are 32 hex digits)::

    <prefix>{callbacks}:due   zset  T by when the name next needs a deliverer's take
    <prefix>{callbacks}:idle  hash  T -> 1 once a take found the name without callbacks

A queue's keys live under ``<prefix>{T}:q:`` (same tag as a lock of that name, so one Cluster
slot too), one per entry of :data:`QUEUE_KEY_SUFFIXES` (see ``lua/queue/_lib.lua``), and a
blocked consumer's wake-up list is ``<prefix>{T}:q:s:<waiter id>``.

A rate limit's keys live under ``<prefix>{T}:r:`` (same tag again), one per entry of
:data:`RATE_KEY_SUFFIXES` (see ``lua/rate/_lib.lua``)::

    <prefix>{T}:r:m  hash  the name, rate, per, burst, tat, counters, and the time each
                           waiter joined (j:<holder>)
    <prefix>{T}:r:l  zset  waiters in line order (by rank: priority, then arrival)
    <prefix>{T}:r:x  zset  waiters by when their place lapses
    <prefix>{T}:r:a  zset  recent admissions by time (the last ``per`` seconds)
"""

from __future__ import annotations

import hashlib


def name_tag(name: str) -> str:
    """The hash tag of a name: 128 bits of SHA-256, hex. Braces in names never matter."""
    return hashlib.sha256(name.encode("utf-8")).hexdigest()[:32]


def key_base(prefix: str, name: str) -> str:
    return f"{prefix}{{{name_tag(name)}}}:"


LOCK_KEY_SUFFIXES = ("d", "l", "cw", "pd")


def name_keys(base: str) -> list[str]:
    return [base + suffix for suffix in LOCK_KEY_SUFFIXES]


class KeyCache:
    """Key base and keys of recently used names (hashing a name is not free)."""

    SIZE = 1024

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self._cache: dict[str, tuple[str, list[str]]] = {}

    def get(self, name: str) -> tuple[str, list[str]]:
        found = self._cache.get(name)
        if found is None:
            base = key_base(self.prefix, name)
            found = (base, name_keys(base))
            if len(self._cache) >= self.SIZE:
                self._cache.clear()
            self._cache[name] = found
        return found


def tag_base(prefix: str, tag: str) -> str:
    """The key base of the name whose hash tag is ``tag`` (as the callback index keeps it)."""
    return f"{prefix}{{{tag}}}:"


def tag_of_base(prefix: str, base: str) -> str:
    return base[len(prefix) + 1 : -2]


def callback_index_keys(prefix: str) -> list[str]:
    """The store-wide index of names with callbacks: ``due`` (zset) and ``idle`` (hash)."""
    return [f"{prefix}{{callbacks}}:due", f"{prefix}{{callbacks}}:idle"]


def signal_key(base: str, owner: str) -> str:
    """The wake-up list of a blocked queue consumer, under its queue's base."""
    return f"{base}s:{owner}"


def glob_escape(text: str) -> str:
    return "".join("\\" + c if c in "*?[]\\" else c for c in text)


def lock_meta_pattern(prefix: str) -> str:
    """SCAN pattern matching the metadata key of every lock name under ``prefix``."""
    return glob_escape(prefix) + "{*}:d"


def lease_micros(seconds: float) -> int:
    """A lock's time-to-live in microseconds: never 0, which the scripts would read as none."""
    return max(1, round(seconds * 1_000_000))


QUEUE_KEY_SUFFIXES = (
    "meta",
    "rec",
    "body",
    "key",
    "rcpt",
    "err",
    "cand",
    "due",
    "fly",
    "dead",
    "enq",
    "depth",
    "dd",
    "ddx",
    "w",
    "wx",
)

def queue_base(prefix: str, name: str) -> str:
    return key_base(prefix, name) + "q:"


def queue_keys(base: str) -> list[str]:
    return [base + suffix for suffix in QUEUE_KEY_SUFFIXES]


def queue_meta_pattern(prefix: str) -> str:
    """SCAN pattern matching the ``meta`` key of every queue under ``prefix``."""
    return glob_escape(prefix) + "{*}:q:meta"


RATE_KEY_SUFFIXES = ("m", "l", "x", "a")


def rate_keys(base: str) -> list[str]:
    """The keys of the rate limit whose name has key base ``base`` (see ``key_base``)."""
    return [f"{base}r:{suffix}" for suffix in RATE_KEY_SUFFIXES]


def micros(seconds: float) -> int:
    """A queue's delay, window or timeout in microseconds (0 allowed: no delay)."""
    return max(0, round(seconds * 1_000_000))
