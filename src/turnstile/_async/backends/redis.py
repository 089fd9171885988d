"""``redis://``, ``rediss://`` and ``redis+cluster://``: locks shared by every host that
reaches one Redis server or Redis Cluster.

Each operation is one Lua script (``turnstile/stores/redis/lua/lock/*.lua``) run with
EVALSHA, so it is atomic and judged by the server's clock (``TIME``). A waiting entry names
its client's channel; the script that hands a grant to a waiter PUBLISHes the grant there,
and the client's one subscriber connection (``redis_listen.py``) wakes that waiter only, so
one release wakes one waiter and a waiter holds no connection while it waits. The keys of
one name share a hash tag, so in a Cluster a name lives in one slot. See ``docs/redis.md``
for deployment, persistence and the key layout.

Callback grants (``acquire_callback``) are written, with their pending delivery, by the same
scripts that make any grant. A deliverer finds them through a store-wide index of names with
callbacks (``lua/lock/index.lua``), which in a Cluster lives in a slot of its own: a step
that makes a callback grant (or grants anything on a name with callbacks) answers a
notification, which the client adds to the index right after; the deliverer's take
reschedules each name it visits no further ahead than ``RECHECK``, so a notification lost
with a client that died in between delays a delivery by that much at most.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from typing import TYPE_CHECKING, Any
from urllib.parse import SplitResult

from redis.asyncio.cluster import RedisCluster

from ..._core import lock_machine, ranking
from ..._core.records import (
    AcquireResult,
    CallbackDelivery,
    Characteristics,
    Grant,
    RateResult,
    RateStatus,
    Status,
)
from ...errors import BackendUnavailable, ConfigurationError
from ...stores.redis import config as redis_config
from ...stores.redis import keys, replies, scripts
from ...stores.redis.driver import DRIVER_ERRORS, connect_error
from ...stores.redis.entries import Entries
from .redis_connection import AsyncRedisConnection
from .redis_listen import AsyncRedisListener, AsyncRedisWaiter
from .wakeups import WakeMarks

if TYPE_CHECKING:
    # Made by the shared connection: the lock and queue modules never import each other.
    from .redis_queue import AsyncRedisQueueBackend

log = logging.getLogger("turnstile.redis")

# The callback index (lua/lock/index.lua): a notification's score is its step's time less
# NOTIFY_SHIFT, below any real time (due at once, whatever the clocks of a Cluster's nodes).
NOTIFY_SHIFT_US = 10**15
# A take reschedules a name at most this far ahead, so a lost notification (a client that
# died between a step and its index update) delays a delivery by at most this much.
RECHECK_US = 2_000_000
# A name a take found without callbacks stays this long, and goes at the next such take.
LINGER_US = 2_000_000
# Names a take_deliveries looks at, at most, per call (the rest stay due for the next).
DUE_BATCH = 100


# One declaration for redis:// and redis+cluster://: they differ only in facts a backend
# learns from its URL and server (scheme, durable, description), never in a capability.
CHARACTERISTICS = Characteristics(
    scheme="redis",
    cross_process=True,
    cross_host=True,
    durable=False,  # until the server is seen to keep an append-only file
    woken_by_store=True,
    description="Redis",
    keeps_early_wakeups=True,  # the subscriber keeps a wake-up for a waiter not armed yet
    queues=True,
    local_deliveries=True,
)


def _acquire_args(
    name: str,
    holder: str,
    *,
    limit: int,
    ttl: float,
    wait_ttl: float,
    enqueue: bool,
    callback: str,
    priority: int,
    ageing: float | None,
    key: str | None,
    per_key: int | None,
    channel: str = "",
    entry: str | None = None,
    index: bool = True,
) -> list[int | str]:
    """acquire.lua's ARGV after the key base: ARGV 8 is the callback ("": none), 9 the lead
    of a new waiting entry (ranking.py), 10 and 11 a semaphore group's per_key and key ("":
    none), 12 the channel a grant to the caller's waiting entry is published on ("": none),
    13 the caller's waiting entry as an earlier reply gave it ("": none), 14 whether to index
    the entry under its holder ("1") or not ("0": the caller gives it back in each step)."""
    return [
        name,
        holder,
        limit,
        keys.lease_micros(ttl),
        keys.lease_micros(wait_ttl),
        1 if enqueue else 0,
        callback,
        ranking.lead(priority, ageing),
        "" if per_key is None else per_key,
        "" if key is None else key,
        channel,
        entry or "",
        1 if index else 0,
    ]


# The position of the caller's waiting entry in acquire.lua's ARGV after the key base.
ENTRY_ARG = 11


class AsyncRedisBackend:
    characteristics = CHARACTERISTICS

    def __init__(self, connection: AsyncRedisConnection) -> None:
        config = connection.config
        self.config = config
        self.connection = connection
        self.characteristics = dataclasses.replace(
            CHARACTERISTICS,
            scheme="redis+cluster" if config.cluster else "redis",
            description=f"Redis at {config.shown}",
        )
        # Read once per client; sent as EVALSHA, and loaded (SCRIPT LOAD) only when a server
        # answers NOSCRIPT: on first use, or after a restart or failover emptied its cache.
        self._scripts = scripts.load("lock")
        self._rate_scripts = scripts.load("rate")
        self._keys = keys.KeyCache(config.prefix)
        self._index_keys = keys.callback_index_keys(config.prefix)
        # Steps that put a holder in line, for the waiter it arms next (open_waiter).
        self._marks = WakeMarks()
        self._entries = Entries()

    @property
    def listener(self) -> AsyncRedisListener:
        """The subscriber connection that wakes this client's waiters."""
        return self.connection.listener

    def queues(self) -> AsyncRedisQueueBackend:
        """The queue operations on this server (see ``redis_queue.py``)."""
        return self.connection.queues()

    async def _run(
        self,
        op: str,
        name: str,
        args: list[Any],
        *,
        lead: bool = False,
        resend: list[Any] | None = None,
    ) -> Any:
        base, name_keys = self._keys.get(name)
        return await self.connection.run(
            self._scripts[op],
            name_keys,
            [base, *args],
            op,
            lead=lead,
            resend=None if resend is None else [base, *resend],
        )

    async def _index(self, args: list[Any]) -> Any:
        return await self.connection.run(
            self._scripts["index"], self._index_keys, args, "callback index"
        )

    def _tag(self, name: str) -> str:
        return keys.tag_of_base(self.config.prefix, self._keys.get(name)[0])

    async def _notify(self, name: str, scores: list[str], *, strict: bool = False) -> None:
        """Put ``name`` in the callback index at each score (index.lua "notify"). A step
        already done is not undone by a failure here (``strict`` False): the deliverer's
        recheck finds the name within RECHECK_US all the same."""
        tag = self._tag(name)
        args: list[Any] = ["notify"]
        for score in scores:
            args += [tag, score]
        try:
            await self._index(args)
        except BackendUnavailable as exc:
            if strict:
                raise
            log.debug("callback index update for a step on %r failed: %s", name, exc)

    # -- the protocol ------------------------------------------------------------------------
    async def acquire(
        self,
        name: str,
        holder: str,
        *,
        limit: int,
        ttl: float,
        wait_ttl: float,
        enqueue: bool,
        priority: int = 0,
        ageing: float | None = None,
        key: str | None = None,
        per_key: int | None = None,
        private: bool = False,
    ) -> AcquireResult:
        listener = self.connection.listener
        mark = listener.mark()
        args = _acquire_args(
            name,
            holder,
            limit=limit,
            ttl=ttl,
            wait_ttl=wait_ttl,
            enqueue=enqueue,
            callback="",
            priority=priority,
            ageing=ageing,
            key=key,
            per_key=per_key,
            channel=listener.channel,
            entry=self._entries.get(name, holder),
            index=not private,
        )
        if private:
            # A step whose reply was lost may have put the holder in line, under an entry
            # its client never learnt: from then on the store looks for it by holder
            # (Entries.UNKNOWN), in the resent step and in any later one.
            resend = [*args]
            resend[ENTRY_ARG] = Entries.UNKNOWN
            try:
                reply = await self._run("acquire", name, args, resend=resend)
            except BaseException:
                self._entries.remember(name, holder, Entries.UNKNOWN, wait_ttl)
                raise
        else:
            reply = await self._run("acquire", name, args)
        result = replies.acquire_result(name, holder, limit, reply, per_key)
        score = replies.notify_score(reply)
        if score is not None:
            await self._notify(name, [score])
        entry = replies.acquire_entry(reply)
        if entry is not None and private:
            self._entries.remember(name, holder, entry, wait_ttl)
        else:
            self._entries.forget(name, holder)
        if result.grant is not None:
            self._marks.forget(name, holder)
        elif result.wait_id is not None:
            self._marks.remember(name, holder, listener, mark, wait_ttl)
        return result

    async def release(self, name: str, holder: str, token: int | None) -> bool:
        entry = ""
        if token is None:
            self._marks.forget(name, holder)  # leaving the line: no waiter to arm
            entry = self._entries.get(name, holder) or ""
            self._entries.forget(name, holder)
        reply = await self._run(
            "release",
            name,
            [holder, "" if token is None else str(token), entry],
            lead=True,
        )
        if isinstance(reply, list):
            await self._notify(name, [replies.notify_score(reply) or ""])
            reply = reply[0]
        return int(reply) == 1

    async def acquire_callback(
        self,
        name: str,
        holder: str,
        *,
        limit: int,
        ttl: float,
        wait_ttl: float,
        callback: str,
        priority: int = 0,
        ageing: float | None = None,
        key: str | None = None,
        per_key: int | None = None,
    ) -> AcquireResult:
        # The name goes into the index before the step (so that a client dying right after
        # it strands nothing) and again after it (a deliverer may have found no callbacks
        # in between and be about to drop the entry: the new score makes it keep it).
        before = int(time.time() * 1_000_000) - NOTIFY_SHIFT_US
        await self._notify(name, [str(before)], strict=True)
        args = _acquire_args(
            name,
            holder,
            limit=limit,
            ttl=ttl,
            wait_ttl=wait_ttl,
            enqueue=True,
            callback=callback,
            priority=priority,
            ageing=ageing,
            key=key,
            per_key=per_key,
        )
        reply = await self._run("acquire", name, args)
        result = replies.acquire_result(name, holder, limit, reply, per_key)
        score = replies.notify_score(reply)
        if score is not None:
            await self._notify(name, [score])
        return result

    async def take_deliveries(self, *, lease: float, max_count: int) -> list[CallbackDelivery]:
        # One round trip when nothing is due: the index's due entries.
        due = await self._index(["due", DUE_BATCH])
        taken: list[CallbackDelivery] = []
        seen: list[Any] = []
        prefix = self.config.prefix
        for i in range(0, len(due), 2):
            if len(taken) >= max_count:
                break  # the rest stay due for the next call
            tag = replies.text(due[i])
            base = keys.tag_base(prefix, tag)
            reply = await self.connection.run(
                self._scripts["take"],
                keys.name_keys(base),
                [base, keys.lease_micros(lease), max_count - len(taken), RECHECK_US],
                "take",
            )
            _now, next_us, got = replies.take_result(reply)
            taken += got
            seen += [tag, replies.text(due[i + 1]), next_us]
        if seen:
            await self._index(["reschedule", LINGER_US, *seen])
        return taken

    async def settle_delivery(
        self, name: str, token: int, *, outcome: str, retry_in: float
    ) -> bool:
        if outcome not in lock_machine.OUTCOMES:
            raise ValueError(f"unknown delivery outcome {outcome!r}")
        reply = await self._run("settle", name, [str(token), outcome, keys.micros(retry_in)])
        settled, notify, retry_at = reply
        scores = [replies.text(notify)] if int(notify) else []
        if int(retry_at):
            scores.append(replies.text(retry_at))  # due again then, not at the next recheck
        if scores:
            await self._notify(name, scores)
        return int(settled) == 1

    async def pending_deliveries(self) -> int:
        members = await self._index(["all"])
        count = 0
        for tag in members:
            base = keys.tag_base(self.config.prefix, replies.text(tag))
            count += int(
                await self.connection.run(
                    self._scripts["pending"], keys.name_keys(base), [base], "pending"
                )
            )
        return count

    # -- rate limits (lua/rate/*.lua: keys <prefix>{T}:r:*, see keys.rate_keys) ------------
    async def _run_rate(self, op: str, name: str, args: list[Any]) -> Any:
        base = self._keys.get(name)[0]
        return await self.connection.run(
            self._rate_scripts[op], keys.rate_keys(base), args, f"rate limit {op}"
        )

    async def rate_acquire(
        self,
        name: str,
        holder: str,
        *,
        rate: int,
        per: float,
        burst: int,
        enqueue: bool,
        grace: float,
        priority: int = 0,
        ageing: float | None = None,
    ) -> RateResult:
        # per travels as Python's repr of the float: the script compares a busy name's rate
        # by that exact text, and Lua reads the same double back from it.
        per = float(per)
        args = [
            name,
            holder,
            rate,
            repr(per),
            burst,
            1 if enqueue else 0,
            keys.lease_micros(grace),
            ranking.lead(priority, ageing),
        ]
        reply = await self._run_rate("acquire", name, args)
        return replies.rate_result(name, (rate, per, burst), reply)

    async def rate_leave(self, name: str, holder: str) -> bool:
        return int(await self._run_rate("leave", name, [name, holder])) == 1

    async def rate_status(self, name: str) -> RateStatus:
        return replies.rate_status_result(name, await self._run_rate("status", name, []))

    async def renew(self, name: str, holder: str, token: int, ttl: float) -> Grant | None:
        reply = await self._run("renew", name, [holder, str(token), keys.lease_micros(ttl)])
        return replies.renew_result(name, holder, reply)

    async def set_limit(self, name: str, limit: int) -> int | None:
        reply = await self._run("set_limit", name, [name, limit])
        if isinstance(reply, list):
            await self._notify(name, [replies.notify_score(reply) or ""])
            reply = reply[0]
        previous = int(reply)
        return None if previous < 0 else previous

    async def status(self, name: str) -> Status:
        return replies.status_result(name, await self._run("status", name, []))

    async def names(self, prefix: str, max_count: int) -> list[str]:
        async def probe(base: str) -> Any:
            return await self.connection.run(
                self._scripts["probe"], keys.name_keys(base), [base], "probe"
            )

        # "<prefix>{T}:d" -> "<prefix>{T}:"
        pattern = keys.lock_meta_pattern(self.config.prefix)
        return await self.connection.scan_names(pattern, "d", probe, prefix, max_count)

    async def open_waiter(self, name: str, holder: str) -> AsyncRedisWaiter:
        """Armed after the step that put ``holder`` in line (``keeps_early_wakeups``): the
        wake-ups that came since are delivered on arming, and if one may be missing (the
        subscriber connection was not up at that step, or reconnected since) the waiter
        re-checks at once instead of waiting. Without a note of such a step (armed before
        its step, as ``Lock.wait`` and the backend protocol allow), it waits."""
        listener = await self.connection.listening()
        since = self._marks.since(name, holder, listener)
        key = self._keys.get(name)[0] + holder
        return AsyncRedisWaiter(listener, key, name, holder, since)

    async def ping(self) -> None:
        await self.connection.ping()

    async def close(self) -> None:
        await self.connection.close()

    # -- connecting --------------------------------------------------------------------------
    async def _check_server(self) -> None:
        """Reach the server at once, and refuse a server this URL cannot work with."""
        config = self.config
        try:
            if config.cluster:
                info = await self.connection.client.info("server", target_nodes=RedisCluster.RANDOM)
            else:
                info = await self.connection.client.info()
        except DRIVER_ERRORS as exc:
            raise connect_error(config, exc) from exc
        version = str(info.get("redis_version", "0"))
        if not config.cluster and info.get("redis_mode") == "cluster":
            raise ConfigurationError(
                f"{config.shown} is a Redis Cluster node; use redis+cluster:// so that each "
                "name is sent to the node that owns its slot"
            )
        try:
            major = int(version.split(".")[0])
        except ValueError:
            major = 0
        if major and major < 5:
            raise ConfigurationError(
                f"Redis at {config.shown} runs {version}; Turnstile needs Redis 5 or newer "
                "(scripts that read TIME before writing)"
            )
        if major and major < 7:
            self.connection.functions = False  # no FUNCTION or FCALL before Redis 7
        policy = str(info.get("maxmemory_policy", "noeviction"))
        if policy != "noeviction":
            log.warning(
                "Redis at %s evicts keys (maxmemory-policy %s): a lease could vanish under "
                "memory pressure; use noeviction for lock data (see docs/redis.md)",
                config.shown,
                policy,
            )
        aof = int(info.get("aof_enabled", 0) or 0) == 1
        kind = "Redis Cluster" if config.cluster else "Redis"
        persistence = "append-only file on" if aof else "no append-only file"
        if config.cluster:
            persistence = "persistence per node"
        self.characteristics = dataclasses.replace(
            self.characteristics,
            durable=aof,
            description=f"{kind} {version} at {config.shown} ({persistence})",
        )


async def open_backend(url: str, parts: SplitResult) -> AsyncRedisBackend:
    config = redis_config.parse_url(url, parts)
    try:
        backend = AsyncRedisBackend(AsyncRedisConnection(config))
    except DRIVER_ERRORS as exc:  # the sync Cluster client connects while it is made
        raise connect_error(config, exc) from exc
    except TypeError as exc:
        raise ConfigurationError(f"bad option in Redis URL {config.shown}: {exc}") from exc
    try:
        await backend._check_server()
    except BaseException:
        await backend.close()
        raise
    return backend
