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

import contextlib
import dataclasses
import logging
import time
from collections.abc import Callable
from typing import Any
from urllib.parse import SplitResult

from redis.asyncio import Redis
from redis.asyncio.cluster import ClusterNode, RedisCluster
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialBackoff
from redis.exceptions import (
    AuthenticationError,
    NoScriptError,
    RedisClusterException,
    RedisError,
    ResponseError,
)

from ..._core.records import AcquireResult, Characteristics, Grant, Status
from ...errors import BackendUnavailable, ConfigurationError, TurnstileError
from ...stores.redis import locks as common
from .. import _compat

log = logging.getLogger("turnstile.redis")

# What the driver raises: redis-py's errors (its Cluster errors are not RedisErrors) and
# socket errors. Each is translated at this module's boundary.
DRIVER_ERRORS = (RedisError, RedisClusterException, OSError)
# Every script is idempotent (acquire per holder, release/renew per token), so a command
# whose connection dropped is simply sent again, briefly.
RETRIES = 3


def _retry() -> Retry:
    return Retry(ExponentialBackoff(cap=0.25, base=0.01), RETRIES)


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


def _make_client(config: common.RedisConfig, options: dict[str, Any]) -> Any:
    if config.cluster:
        return RedisCluster(
            startup_nodes=[
                ClusterNode(host, port)  # type: ignore[no-untyped-call,unused-ignore]
                for host, port in config.startup_nodes
            ],
            username=config.username,
            password=config.password,
            ssl=config.ssl,
            retry=_retry(),
            **options,
        )
    return Redis.from_url(config.url, retry=_retry(), **options)


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
        self._key = common.signal_key(backend._keys.get(name)[0], holder)
        self._step = step  # the args of the caller's acquire step, if known

    async def wait(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            # Redis reads the timeout in milliseconds and 0 means forever: round up.
            block = max(0.001, min(left, common.MAX_BLOCK))
            block = int(block * 1000 + 0.999) / 1000
            if self._step is None:  # the caller's step may come after open_waiter
                self._step = self._backend._waiting_steps.pop((self._name, self._holder), None)
            cancels = _compat.cancel_count()
            try:
                client = self._backend._blocking_client(self._key)
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
                # really gone; here only avoid spinning.
                log.debug("BLPOP on %s failed: %s", self._backend.config.shown, exc)
                await _compat.sleep(min(max(left, 0.0), 0.05))
                return True

    async def _pop_and_step(self, client: Any, block: float) -> Any:
        assert self._step is not None
        backend = self._backend
        base, keys = backend._keys.get(self._name)
        script = backend._scripts["acquire"]
        pipe = client.pipeline(transaction=False)
        pipe.blpop([self._key], timeout=block)
        pipe.evalsha(
            script.sha, len(keys), *keys, base, self._name, self._holder, *self._step
        )
        sent = time.monotonic()
        popped, step = await pipe.execute(raise_on_error=False)
        if isinstance(popped, BaseException):
            raise popped
        if isinstance(step, NoScriptError):
            await client.script_load(script.text)  # for the next time; this step is lost
        elif isinstance(step, list):
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

    def __init__(self, config: common.RedisConfig) -> None:
        self.config = config
        self.characteristics = dataclasses.replace(
            CHARACTERISTICS,
            scheme="redis+cluster" if config.cluster else "redis",
            description=f"Redis at {config.shown}",
        )
        self._client = _make_client(config, config.options)
        self._blocking: Any = None
        self._queues: Any = None
        self._blocking_nodes: dict[tuple[str, int], Any] = {}
        # Read once per client; sent as EVALSHA, and loaded (SCRIPT LOAD) only when a server
        # answers NOSCRIPT: on first use, or after a restart or failover emptied its cache.
        self._scripts = {op: common.Script(common.script_text(op)) for op in common.OPERATIONS}
        self._keys = common.KeyCache(config.prefix)
        # The args of the last acquire step of each (name, holder) that left it waiting, for
        # the waiter opened next (bounded: try_acquire callers never open one).
        self._waiting_steps: dict[tuple[str, str], tuple[int, ...]] = {}
        # Answers of acquire steps a waiter sent behind its BLPOP: (args, reply, local send
        # and receive times), taken by the next matching acquire.
        self._prefetched: dict[tuple[str, str], tuple[tuple[int, ...], Any, float, float]] = {}

    def queues(self) -> Any:
        """The queue operations on this server (see ``redis_queue.py``)."""
        if self._queues is None:
            from .redis_queue import AsyncRedisQueueBackend

            self._queues = AsyncRedisQueueBackend(self)
        return self._queues

    # -- plumbing ----------------------------------------------------------------------------
    def _unavailable(self, what: str, exc: BaseException) -> BackendUnavailable:
        message = common.safe_message(exc, self.config)
        return BackendUnavailable(f"Redis {what} failed on {self.config.shown}: {message}")

    def _blocking_client(self, key: str) -> Any:
        """A client of its own for BLPOP, so blocked waiters never hold the connections the
        scripts run on; created on the first wait (the fast path never needs it). In a
        Cluster, a plain client of the node that owns ``key``'s slot (as the Cluster client
        last saw it; a MOVED answer makes the waiter fall back to an acquire step through
        the Cluster client, which learns the new owner)."""
        if not self.config.cluster:
            if self._blocking is None:
                self._blocking = _make_client(self.config, self.config.blocking_options())
            return self._blocking
        node = self._client.get_node_from_key(key)
        address = (str(node.host), int(node.port))
        client = self._blocking_nodes.get(address)
        if client is None:
            client = Redis(
                host=address[0],
                port=address[1],
                username=self.config.username,
                password=self.config.password,
                ssl=self.config.ssl,
                retry=_retry(),
                **self.config.blocking_options(),
            )
            self._blocking_nodes[address] = client
        return client

    async def _eval(self, op: str, keys: list[str], args: list[Any]) -> Any:
        script = self._scripts[op]
        cancels = _compat.cancel_count()
        try:
            try:
                reply = await self._client.evalsha(script.sha, len(keys), *keys, *args)
            except NoScriptError:
                await self._client.script_load(script.text)
                reply = await self._client.evalsha(script.sha, len(keys), *keys, *args)
        except DRIVER_ERRORS as exc:
            _compat.raise_if_cancelled_since(cancels)
            raise self._unavailable(op, exc) from exc
        # redis-py may finish a command although its task was cancelled meanwhile: the step
        # then counts as interrupted (the caller cleans up, as after any cancelled step).
        _compat.raise_if_cancelled_since(cancels)
        return reply

    async def _run(self, op: str, name: str, args: list[Any]) -> Any:
        base, keys = self._keys.get(name)
        return await self._eval(op, keys, [base, *args])

    # -- the protocol ------------------------------------------------------------------------
    async def acquire(
        self, name: str, holder: str, *, limit: int, ttl: float, wait_ttl: float, enqueue: bool
    ) -> AcquireResult:
        step = (limit, common.micros(ttl), common.micros(wait_ttl), 1 if enqueue else 0)
        if self._prefetched:
            found = self._prefetched.pop((name, holder), None)
            if found is not None and found[0] == step and time.monotonic() - found[3] < 1.0:
                # The step a waiter sent right behind its BLPOP (AsyncRedisWaiter): it ran on
                # the server after `sent`. Shift `now` by the time since, so that the local
                # deadline the caller derives (its send time + expires - now) counts from
                # `sent`: conservative, never late.
                result = common.acquire_result(name, holder, found[1])
                return dataclasses.replace(result, now=result.now + (time.monotonic() - found[2]))
        reply = await self._run("acquire", name, [name, holder, *step])
        result = common.acquire_result(name, holder, reply)
        if result.grant is None and result.position is not None:
            if len(self._waiting_steps) >= common.KeyCache.SIZE:
                self._waiting_steps.clear()
            self._waiting_steps[(name, holder)] = step
        return result

    async def release(self, name: str, holder: str, token: int | None) -> bool:
        reply = await self._run("release", name, [holder, "" if token is None else str(token)])
        return int(reply) == 1

    async def renew(self, name: str, holder: str, token: int, ttl: float) -> Grant | None:
        reply = await self._run("renew", name, [holder, str(token), common.micros(ttl)])
        return common.renew_result(name, holder, reply)

    async def status(self, name: str) -> Status:
        return common.status_result(name, await self._run("status", name, []))

    async def names(self, prefix: str, max_count: int) -> list[str]:
        async def probe(base: str) -> Any:
            return await self._eval("probe", common.name_keys(base), [base])

        # "<prefix>{T}:d" -> "<prefix>{T}:"
        pattern = common.meta_pattern(self.config.prefix)
        return await self.scan_names(pattern, "d", probe, prefix, max_count)

    async def scan_names(
        self,
        pattern: str,
        suffix: str,
        probe: Callable[[str], Any],
        prefix: str,
        max_count: int,
    ) -> list[str]:
        """Names behind hash tags: SCAN (every master of a Cluster) for the keys matching
        ``pattern``, cut ``suffix`` off each to get its key base, and ask ``probe(base)``
        for the name ('' when it has nothing to show); the first ``max_count`` of those
        starting with ``prefix``, in code-point order."""
        bases: list[str] = []
        try:
            async for raw in self._client.scan_iter(match=pattern, count=1000):
                key = raw.decode("utf-8") if isinstance(raw, bytes) else str(raw)
                bases.append(key[: -len(suffix)])
        except DRIVER_ERRORS as exc:
            raise self._unavailable("SCAN", exc) from exc
        found: set[str] = set()
        for base in bases:
            reply = await probe(base)
            name = reply.decode("utf-8") if isinstance(reply, bytes) else str(reply)
            if name and name.startswith(prefix):
                found.add(name)
        return sorted(found)[:max_count]

    async def open_waiter(self, name: str, holder: str) -> AsyncRedisWaiter:
        return AsyncRedisWaiter(self, name, holder, self._waiting_steps.pop((name, holder), None))

    async def ping(self) -> None:
        try:
            await self._client.ping()
        except DRIVER_ERRORS as exc:
            raise self._unavailable("PING", exc) from exc

    async def close(self) -> None:
        clients = [self._client, self._blocking, *self._blocking_nodes.values()]
        self._blocking = None
        self._blocking_nodes = {}
        for client in clients:
            if client is not None:
                with contextlib.suppress(*DRIVER_ERRORS):
                    await client.aclose()

    # -- connecting --------------------------------------------------------------------------
    async def _check_server(self) -> None:
        """Reach the server at once, and refuse a server this URL cannot work with."""
        config = self.config
        try:
            if config.cluster:
                info = await self._client.info("server", target_nodes=RedisCluster.RANDOM)
            else:
                info = await self._client.info()
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


def connect_error(config: common.RedisConfig, exc: BaseException) -> TurnstileError:
    """What a driver error while connecting means, naming the problem and the fix."""
    message = common.safe_message(exc, config)
    if isinstance(exc, AuthenticationError) or any(
        code in message for code in ("NOAUTH", "WRONGPASS", "NOPERM", "invalid password")
    ):
        return ConfigurationError(
            f"Redis at {config.shown} refused the credentials or permissions: {message}; "
            "check the user and password in the URL"
        )
    if "not enabled" in message.lower() or "cluster support disabled" in message.lower():
        return ConfigurationError(
            f"{config.shown} is not a Redis Cluster ({message}); use redis:// instead"
        )
    if isinstance(exc, ResponseError):
        return BackendUnavailable(f"Redis at {config.shown} answered: {message}")
    return BackendUnavailable(
        f"cannot reach Redis at {config.shown}: {message}; "
        "check the host and port and that the server is running"
    )


async def open_backend(url: str, parts: SplitResult) -> AsyncRedisBackend:
    config = common.parse_url(url, parts)
    try:
        backend = AsyncRedisBackend(config)
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
