"""``redis://``, ``rediss://`` and ``redis+cluster://``: locks shared by every host that
reaches one Redis server or Redis Cluster.

Each operation is one Lua script (``turnstile/stores/redis/lua/lock/*.lua``) run with
EVALSHA, so it is atomic and judged by the server's clock (``TIME``). A waiter blocks in
``BLPOP`` on its own wake-up list, on a connection kept apart from the one that runs the
scripts; the script that hands a grant to a waiter pushes to that waiter's list only, so one
release wakes one waiter. The keys of one name share a hash tag, so in a Cluster a name lives
in one slot. See ``docs/redis.md`` for deployment, persistence and the key layout.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from typing import TYPE_CHECKING, Any
from urllib.parse import SplitResult

from redis.asyncio.cluster import RedisCluster

from ..._core.records import AcquireResult, Characteristics, Grant, Status
from ...errors import ConfigurationError
from ...stores.redis import config as redis_config
from ...stores.redis import keys, replies, scripts
from ...stores.redis.config import MAX_BLOCK
from ...stores.redis.driver import DRIVER_ERRORS, connect_error
from .. import _compat
from .redis_connection import RIDE_OUT, AsyncRedisConnection

if TYPE_CHECKING:
    # Made by the shared connection: the lock and queue modules never import each other.
    from .redis_queue import AsyncRedisQueueBackend

log = logging.getLogger("turnstile.redis")



# One declaration for redis:// and redis+cluster://: they differ only in facts a backend
# learns from its URL and server (scheme, durable, description), never in a capability.
CHARACTERISTICS = Characteristics(
    scheme="redis",
    cross_process=True,
    cross_host=True,
    durable=False,  # until the server is seen to keep an append-only file
    woken_by_store=True,
    description="Redis",
    keeps_early_wakeups=True,  # a waiter's own list keeps what was pushed before its BLPOP
    queues=True,
)


class AsyncRedisWaiter:
    """Blocks in BLPOP on the waiter's own list, which the granting script pushes to.

    The list keeps a wake-up pushed before the waiter started waiting (until the grant it
    announces lapses), so the acquire step made before this waiter was opened needs no
    repeating (``Characteristics.keeps_early_wakeups``).

    The acquire step that follows every wait is sent right behind the BLPOP, on the same
    connection: Redis runs it the moment the BLPOP returns, so a woken waiter gets its grant
    claimed without another round trip; the backend hands that answer to the caller's next
    ``acquire`` (see ``AsyncRedisBackend.acquire``)."""

    def __init__(
        self, backend: AsyncRedisBackend, name: str, holder: str, step: tuple[int, ...] | None
    ) -> None:
        self._backend = backend
        self._name = name
        self._holder = holder
        self._key = keys.signal_key(backend._keys.get(name)[0], holder)
        self._step = step  # the args of the caller's acquire step, if known

    async def wait(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            # Redis reads the timeout in milliseconds and 0 means forever: round up.
            block = max(0.001, min(left, MAX_BLOCK))
            block = int(block * 1000 + 0.999) / 1000
            if self._step is None:  # the caller's step may come after open_waiter
                self._step = self._backend._waiting_steps.pop((self._name, self._holder), None)
            cancels = _compat.cancel_count()
            try:
                client = self._backend.connection.blocking_client(self._key)
                if self._step is None:
                    popped = await client.blpop([self._key], timeout=block)
                else:
                    popped = await self._pop_and_step(client, block)
                _compat.raise_if_cancelled_since(cancels)
                if popped is not None:
                    return True
            except DRIVER_ERRORS as exc:
                _compat.raise_if_cancelled_since(cancels)
                # The caller re-checks with an acquire step, which reports a store that is
                # really gone. A restarting server is given RIDE_OUT (or the rest of this
                # wait, if longer) to answer again, so a short restart costs nothing.
                log.debug("BLPOP on %s failed: %s", self._backend.config.shown, exc)
                await self._until_answering(max(deadline, time.monotonic() + RIDE_OUT))
                return True

    async def _until_answering(self, deadline: float) -> None:
        """PING the server (on the blocking connection, never retried) until it answers or
        ``deadline`` passes: a few times a second, so it is seen back within 0.1 s."""
        pause = 0.01
        while True:
            await _compat.sleep(max(0.0, min(pause, deadline - time.monotonic())))
            if time.monotonic() >= deadline:
                return
            try:
                await self._backend.connection.blocking_client(self._key).ping()
                return
            except DRIVER_ERRORS:
                pause = min(pause * 2, 0.1)

    async def _pop_and_step(self, client: Any, block: float) -> Any:
        assert self._step is not None
        backend = self._backend
        base, name_keys = backend._keys.get(self._name)
        popped, step, sent = await backend.connection.blpop_then_run(
            client,
            self._key,
            block,
            backend._scripts["acquire"],
            name_keys,
            [base, self._name, self._holder, *self._step],
        )
        if isinstance(step, list):
            backend._prefetched[(self._name, self._holder)] = (
                self._step,
                step,
                sent,
                time.monotonic(),
            )
        return popped

    def handed(self, wait_id: int) -> Grant | None:
        return None  # the list carries a bare wake-up; the next acquire step claims the grant

    async def close(self) -> None:
        # An answer nobody asked for (the caller left on an error) must never be handed to a
        # later acquire of the same holder.
        self._backend._prefetched.pop((self._name, self._holder), None)


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
        self._keys = keys.KeyCache(config.prefix)
        # The args of the last acquire step of each (name, holder) that left it waiting, for
        # the waiter opened next (bounded: try_acquire callers never open one).
        self._waiting_steps: dict[tuple[str, str], tuple[int, ...]] = {}
        # Answers of acquire steps a waiter sent behind its BLPOP: (args, reply, local send
        # and receive times), taken by the next matching acquire.
        self._prefetched: dict[tuple[str, str], tuple[tuple[int, ...], Any, float, float]] = {}

    def queues(self) -> AsyncRedisQueueBackend:
        """The queue operations on this server (see ``redis_queue.py``)."""
        return self.connection.queues()

    async def _run(self, op: str, name: str, args: list[Any]) -> Any:
        base, name_keys = self._keys.get(name)
        return await self.connection.run(self._scripts[op], name_keys, [base, *args], op)

    # -- the protocol ------------------------------------------------------------------------
    async def acquire(
        self, name: str, holder: str, *, limit: int, ttl: float, wait_ttl: float, enqueue: bool
    ) -> AcquireResult:
        step = (limit, keys.lease_micros(ttl), keys.lease_micros(wait_ttl), 1 if enqueue else 0)
        if self._prefetched:
            found = self._prefetched.pop((name, holder), None)
            if found is not None and found[0] == step and time.monotonic() - found[3] < 1.0:
                # The step a waiter sent right behind its BLPOP (AsyncRedisWaiter): it ran on
                # the server after `sent`. Shift `now` by the time since, so that the local
                # deadline the caller derives (its send time + expires - now) counts from
                # `sent`: conservative, never late.
                result = replies.acquire_result(name, holder, limit, found[1])
                result = dataclasses.replace(
                    result, now=result.now + (time.monotonic() - found[2])
                )
                grant = result.grant
                if grant is None or grant.expires_at - result.now >= ttl / 2:
                    return result
                # Sent long before it ran (its BLPOP blocked for most of the lease): rather
                # than start on a lease that looks nearly over, ask again. Per holder the step
                # answers the same grant, with the store's clock read now.
        reply = await self._run("acquire", name, [name, holder, *step])
        result = replies.acquire_result(name, holder, limit, reply)
        if result.grant is None and result.position is not None:
            if len(self._waiting_steps) >= keys.KeyCache.SIZE:
                self._waiting_steps.clear()
            self._waiting_steps[(name, holder)] = step
        return result

    async def release(self, name: str, holder: str, token: int | None) -> bool:
        reply = await self._run("release", name, [holder, "" if token is None else str(token)])
        return int(reply) == 1

    async def renew(self, name: str, holder: str, token: int, ttl: float) -> Grant | None:
        reply = await self._run("renew", name, [holder, str(token), keys.lease_micros(ttl)])
        return replies.renew_result(name, holder, reply)

    async def set_limit(self, name: str, limit: int) -> int | None:
        previous = int(await self._run("set_limit", name, [name, limit]))
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
        return AsyncRedisWaiter(self, name, holder, self._waiting_steps.pop((name, holder), None))

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
