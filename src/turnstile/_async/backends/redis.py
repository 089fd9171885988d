"""``redis://``, ``rediss://`` and ``redis+cluster://``: locks shared by every host that
reaches one Redis server or Redis Cluster.

Each operation is one Lua script (``turnstile/backends/redis_scripts/*.lua``) run with
EVALSHA, so it is atomic and judged by the server's clock (``TIME``). A waiter blocks in
``BLPOP`` on its own wake-up list, on a connection kept apart from the one that runs the
scripts; the script that hands a grant to a waiter pushes to that waiter's list only, so one
release wakes one waiter. The keys of one name share a hash tag, so in a Cluster a name lives
in one slot. See ``docs/redis.md`` for deployment, persistence and the key layout.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Iterator
from typing import Any
from urllib.parse import SplitResult

from redis.asyncio import Redis
from redis.asyncio.cluster import ClusterNode, RedisCluster
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialBackoff
from redis.commands.core import AsyncScript
from redis.exceptions import AuthenticationError, RedisClusterException, RedisError, ResponseError

from ..._core.models import AcquireResult, Characteristics, Grant, Status
from ...backends import redis_common as common
from ...errors import BackendUnavailable, ConfigurationError, TurnstileError
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


def _characteristics(config: common.RedisConfig, durable: bool, detail: str) -> Characteristics:
    return Characteristics(
        scheme="redis+cluster" if config.cluster else "redis",
        cross_process=True,
        cross_host=True,
        durable=durable,
        woken_by_store=True,
        description=detail,
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
    """Blocks in BLPOP on the waiter's own list, which the granting script pushes to."""

    def __init__(self, backend: AsyncRedisBackend, key: str) -> None:
        self._backend = backend
        self._key = key

    async def wait(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            # Redis reads the timeout in milliseconds and 0 means forever: round up.
            block = max(0.001, min(left, common.MAX_BLOCK))
            block = int(block * 1000 + 0.999) / 1000
            try:
                client = self._backend._blocking_client()
                if await client.blpop([self._key], timeout=block) is not None:
                    return True
            except DRIVER_ERRORS as exc:
                # The caller re-checks with an acquire step, which reports a store that is
                # really gone; here only avoid spinning.
                log.debug("BLPOP on %s failed: %s", self._backend.config.shown, exc)
                await _compat.sleep(min(max(left, 0.0), 0.05))
                return True

    async def close(self) -> None:
        return None


class AsyncRedisBackend:
    def __init__(self, config: common.RedisConfig) -> None:
        self.config = config
        self.characteristics = _characteristics(config, False, f"Redis at {config.shown}")
        self._client = _make_client(config, config.options)
        self._blocking: Any = None
        self._queues: Any = None
        # Loaded once per client: EVALSHA, and SCRIPT LOAD only when a server answers
        # NOSCRIPT (first use, or after a restart / failover).
        self._scripts: dict[str, AsyncScript] = {
            op: self._client.register_script(common.script_text(op)) for op in common.OPERATIONS
        }

    def queues(self) -> Any:
        """The queue operations on this server (see ``redis_queue.py``)."""
        if self._queues is None:
            from .redis_queue import AsyncRedisQueueBackend

            self._queues = AsyncRedisQueueBackend(self)
        return self._queues

    # -- plumbing ----------------------------------------------------------------------------
    @contextlib.contextmanager
    def _translate(self, what: str) -> Iterator[None]:
        try:
            yield
        except DRIVER_ERRORS as exc:
            message = common.safe_message(exc, self.config)
            raise BackendUnavailable(
                f"Redis {what} failed on {self.config.shown}: {message}"
            ) from exc

    def _blocking_client(self) -> Any:
        # A separate client (and connections) for BLPOP, so blocked waiters never hold the
        # connections the scripts run on. Created on the first wait: the fast path never
        # needs it.
        if self._blocking is None:
            self._blocking = _make_client(self.config, self.config.blocking_options())
        return self._blocking

    async def _run(self, op: str, name: str, args: list[Any]) -> Any:
        base = common.key_base(self.config.prefix, name)
        with self._translate(op):
            return await self._scripts[op](keys=common.name_keys(base), args=[base, *args])

    # -- the protocol ------------------------------------------------------------------------
    async def acquire(
        self, name: str, holder: str, *, limit: int, ttl: float, wait_ttl: float, enqueue: bool
    ) -> AcquireResult:
        reply = await self._run(
            "acquire",
            name,
            [
                name,
                holder,
                limit,
                common.micros(ttl),
                common.micros(wait_ttl),
                1 if enqueue else 0,
            ],
        )
        return common.acquire_result(name, holder, reply)

    async def release(self, name: str, holder: str, token: int | None) -> bool:
        reply = await self._run("release", name, [holder, "" if token is None else str(token)])
        return int(reply) == 1

    async def renew(self, name: str, holder: str, token: int, ttl: float) -> Grant | None:
        reply = await self._run("renew", name, [holder, str(token), common.micros(ttl)])
        return common.renew_result(name, holder, reply)

    async def status(self, name: str) -> Status:
        return common.status_result(name, await self._run("status", name, []))

    async def names(self, prefix: str, max_count: int) -> list[str]:
        found: list[str] = []
        with self._translate("names"):
            async for raw in self._client.scan_iter(
                match=common.meta_pattern(self.config.prefix), count=1000
            ):
                key = raw.decode("utf-8") if isinstance(raw, bytes) else str(raw)
                base = key[:-1]  # "<prefix>{T}:m" -> "<prefix>{T}:"
                reply = await self._scripts["probe"](keys=common.name_keys(base), args=[base])
                name = reply.decode("utf-8") if isinstance(reply, bytes) else str(reply)
                if name and name.startswith(prefix):
                    found.append(name)
        return sorted(set(found))[:max_count]

    async def open_waiter(self, name: str, holder: str) -> AsyncRedisWaiter:
        return AsyncRedisWaiter(
            self, common.signal_key(common.key_base(self.config.prefix, name), holder)
        )

    async def ping(self) -> None:
        with self._translate("PING"):
            await self._client.ping()

    async def close(self) -> None:
        for client in (self._client, self._blocking):
            if client is not None:
                with contextlib.suppress(*DRIVER_ERRORS):
                    await client.aclose()
        self._blocking = None

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
        self.characteristics = _characteristics(
            config, aof, f"{kind} {version} at {config.shown} ({persistence})"
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
