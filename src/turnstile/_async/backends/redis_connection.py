"""What the Redis lock and queue backends of one client share: the clients (the one the
scripts run on, the ones blocked queue consumers BLPOP on, and the subscriber connection that
wakes lock waiters, ``redis_listen.py``), the one path that runs a Lua script,
SCAN over hash tags, and the queue backend itself (made on first use). Every script reaches
the server through :meth:`AsyncRedisConnection.run` (EVALSHA, SCRIPT LOAD on NOSCRIPT).

The lock backend (``redis.py``) and the queue backend (``redis_queue.py``) each hold the
same connection and never import each other.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable
from typing import Any

from redis.asyncio import Redis
from redis.asyncio.cluster import ClusterNode, RedisCluster
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialBackoff, NoBackoff
from redis.exceptions import (
    AuthenticationError,
    ClusterDownError,
    NoScriptError,
    RedisClusterException,
    ResponseError,
    TryAgainError,
)
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from ..._core import forks
from ...errors import TurnstileError
from ...stores.redis import driver, scripts
from ...stores.redis.config import RedisConfig
from ...stores.redis.driver import DRIVER_ERRORS
from .. import _compat
from .redis_listen import AsyncRedisListener
from .redis_queue import AsyncRedisQueueBackend
from .wakeups import LISTEN_START_WAIT

log = logging.getLogger("turnstile.redis")

# Every script is idempotent (acquire per holder, release/renew per token, queue operations
# per id and receipt), so a command whose connection dropped is simply sent again, briefly.
RETRIES = 3


# How long an operation keeps being sent while the server refuses connections or drops
# them (a restart, a failover), like PostgreSQL's default retry_timeout; a blocked waiter
# waits as long for the server to answer again. Timeouts are not retried here (redis-py's
# own retries cover them): a black-holed server must not hold a caller for minutes.
RIDE_OUT = 5.0


def _server_away(exc: BaseException) -> bool:
    """A refused, reset or still-loading connection (not bad credentials, not a timeout), or
    a Cluster that is re-forming after its nodes restarted (CLUSTERDOWN, TRYAGAIN, no node
    reachable yet): the command did not run and will, once the servers answer again."""
    if isinstance(exc, (ClusterDownError, TryAgainError, RedisClusterException)):
        return True
    return isinstance(exc, (RedisConnectionError, OSError)) and not isinstance(
        exc, (AuthenticationError, RedisTimeoutError, TimeoutError)
    )


def _retry() -> Retry:
    return Retry(ExponentialBackoff(cap=0.25, base=0.01), RETRIES)


def _no_retry() -> Retry:
    """For the clients that block in BLPOP: a blocking command is never sent again blindly.
    Its wake-up, with the grant it carried, may have been consumed before the reply was
    lost: sent again, the BLPOP would block until its timeout on an empty list while that
    unclaimed grant runs out. A failed wait returns instead, and the caller looks with an
    acquire step at once (per holder, it claims the grant already made, with its real
    expiry)."""
    return Retry(NoBackoff(), 0)


def make_client(
    config: RedisConfig, options: dict[str, Any], retry: Retry | None = None
) -> Any:
    if config.cluster:
        return RedisCluster(
            startup_nodes=[
                ClusterNode(host, port)  # type: ignore[no-untyped-call,unused-ignore]
                for host, port in config.startup_nodes
            ],
            username=config.username,
            password=config.password,
            ssl=config.ssl,
            retry=retry if retry is not None else _retry(),
            **options,
        )
    return Redis.from_url(config.url, retry=retry if retry is not None else _retry(), **options)


# The PING a release sends ahead of its script (see AsyncRedisConnection._call), packed once.
_PING = b"*1\r\n$4\r\nPING\r\n"


def _direct_pool(client: Any) -> Any:
    """The pool :meth:`AsyncRedisConnection.run` takes its connections from itself, or None
    (every script then goes through ``client.evalsha``).

    redis-py's command path wraps each command in its retry object and observability hooks,
    and checks a connection out of its pool under a lock (polling the socket for stray
    data, except with maintenance notifications on); for the two scripts of an uncontended
    ``with lock:`` block that costs about as much CPU as their round trips. A connection
    whose last reply was read in full is in step, so run() keeps such connections aside and
    sends EVALSHA on them directly: the same connection methods redis-py calls (they connect,
    reconnect, time out and process RESP3 push messages the same way). Every case it does
    not cover is left to redis-py: a Cluster, one shared connection, client-side caching,
    and redis-py's own command metrics when they are enabled."""
    if isinstance(client, RedisCluster) or getattr(client, "connection", None) is not None:
        return None
    pool = getattr(client, "connection_pool", None)
    if pool is None or getattr(pool, "cache", None) is not None:
        return None
    if pool.connection_kwargs.get("cache_config") is not None:
        return None
    try:
        from redis.observability.recorder import is_enabled
    except ImportError:
        pass
    else:
        if is_enabled():
            return None
    return pool


class AsyncRedisConnection:
    def __init__(self, config: RedisConfig) -> None:
        self.config = config
        self.client = make_client(config, config.options)
        self._blocking: Any = None
        self._blocking_nodes: dict[tuple[str, int], Any] = {}
        self._queues: AsyncRedisQueueBackend | None = None
        # The subscriber connection that wakes this client's lock waiters (made on first
        # need): one per process, by fork generation (see listener).
        self._listeners: dict[int, AsyncRedisListener] = {}
        # Until when operations keep retrying a server that refuses connections (see run).
        self._away_until: float | None = None
        # Connections run() took from this pool and keeps aside between scripts, each one
        # in step (its last reply read in full); see _direct_pool. Per process.
        self._direct = _direct_pool(self.client)
        self._spare: list[Any] = []
        self._generation = forks.generation()
        # Whether the steps run as functions of their library (FCALL): until the server is
        # seen unable to (see _loaded) or known to be older than Redis 7 (the backend's
        # check at connect); the URL's functions=off says never.
        self.functions = config.functions

    def queues(self) -> AsyncRedisQueueBackend:
        """The queue operations on this server, sharing this connection."""
        if self._queues is None:
            self._queues = AsyncRedisQueueBackend(self)
        return self._queues

    def unavailable(self, what: str, exc: BaseException) -> TurnstileError:
        return driver.unavailable(self.config, what, exc)

    @property
    def listener(self) -> AsyncRedisListener:
        """The subscriber connection of this client (not started until a waiter needs it).
        A forked child gets its own: the parent's connection and thread are not its."""
        generation = forks.generation()
        listener = self._listeners.get(generation)
        if listener is None:
            # Threads that get here at once agree on one listener (dict.setdefault is
            # atomic): a second one would open a second subscriber connection that close()
            # never closes. A listener that has not read yet has no connection to drop.
            listener = self._listeners.setdefault(generation, AsyncRedisListener(self))
            for other in [g for g in self._listeners if g != generation]:
                inherited = self._listeners.pop(other, None)
                if inherited is not None:
                    forks.abandon(inherited)  # a forked child: the parent's
        return listener

    async def listening(self) -> AsyncRedisListener:
        """The subscriber connection, made by the first waiter of this client, which gives
        it a moment to come up. Until it is up, waiters poll (and are all woken when it
        comes up)."""
        listener = self.listener
        if not listener.up:
            timeout = float(self.config.options.get("socket_connect_timeout") or 2.0)
            await listener.connect(min(LISTEN_START_WAIT, timeout))
        return listener

    async def subscriber_client(self) -> Any:
        """A new plain client for the subscriber connection. In a Cluster, of a node that
        the Cluster client knows (PUBLISH reaches every node, so any one will do)."""
        if not self.config.cluster:
            return make_client(self.config, self.config.blocking_options(), _no_retry())
        await self.client.initialize()  # unasync: async-only
        node = self.client.get_random_node()
        return Redis(
            host=str(node.host),
            port=int(node.port),
            username=self.config.username,
            password=self.config.password,
            ssl=self.config.ssl,
            retry=_no_retry(),
            **self.config.blocking_options(),
        )

    def blocking_client(self, key: str) -> Any:
        """A client of its own for BLPOP, so blocked waiters never hold the connections the
        scripts run on; created on the first wait (the fast path never needs it). In a
        Cluster, a plain client of the node that owns ``key``'s slot (as the Cluster client
        last saw it; a MOVED answer makes the waiter fall back to an acquire step through
        the Cluster client, which learns the new owner)."""
        if not self.config.cluster:
            if self._blocking is None:
                self._blocking = make_client(
                    self.config, self.config.blocking_options(), _no_retry()
                )
            return self._blocking
        node = self.client.get_node_from_key(key)
        address = (str(node.host), int(node.port))
        client = self._blocking_nodes.get(address)
        if client is None:
            client = Redis(
                host=address[0],
                port=address[1],
                username=self.config.username,
                password=self.config.password,
                ssl=self.config.ssl,
                retry=_no_retry(),
                **self.config.blocking_options(),
            )
            self._blocking_nodes[address] = client
        return client

    async def run(
        self,
        script: scripts.Script,
        keys: list[str],
        args: list[Any],
        what: str,
        *,
        cancellable: bool = True,
        lead: bool = False,
        resend: list[Any] | None = None,
    ) -> Any:
        """Run one script: EVALSHA, and on NOSCRIPT (first use, or a restart or failover
        emptied the server's cache) SCRIPT LOAD and EVALSHA again. ``what`` names the
        operation in the error a driver failure becomes. ``cancellable``: a reply that
        arrives after the caller was cancelled counts as interrupted (the lock steps, whose
        callers clean up after a cancelled step). ``lead``: a step that may wake a waiter
        (see :meth:`_call`). ``resend``: the arguments to send instead of ``args`` once a
        send failed with its outcome unknown (a step that is idempotent only when told it
        may have run already)."""
        cancels = _compat.cancel_count()
        pause = 0.02
        while True:
            try:
                reply = await self._loaded(script, keys, args, lead)
                self._away_until = None
                break
            except DRIVER_ERRORS as exc:
                if cancellable:
                    _compat.raise_if_cancelled_since(cancels)
                if not _server_away(exc):
                    raise self.unavailable(what, exc) from exc
                # Refused or reset (a restart, a failover): every script is idempotent, so
                # keep sending it, a few times a second, until RIDE_OUT after the first
                # failure of this outage (one window for every operation of this client:
                # once it has passed, operations fail at once until the server answers).
                now = time.monotonic()
                if self._away_until is None or now > self._away_until + RIDE_OUT:
                    self._away_until = now + RIDE_OUT
                if now + pause >= self._away_until:
                    raise self.unavailable(what, exc) from exc
                await _compat.sleep(pause)
                pause = min(pause * 2, 0.1)
                if resend is not None:
                    args = resend
        if cancellable:
            # redis-py may finish a command although its task was cancelled meanwhile.
            _compat.raise_if_cancelled_since(cancels)
        return reply

    async def _loaded(
        self, script: scripts.Script, keys: list[str], args: list[Any], lead: bool = False
    ) -> Any:
        """Run ``script`` as its function (FCALL) while the server has functions, else as a
        script (EVALSHA); load it first if the server does not have it (the first use, or a
        restart, failover or flush emptied it): SCRIPT LOAD on NOSCRIPT, FUNCTION LOAD when
        the function is not found. A server that cannot load or run functions (before Redis
        7, or a user without the right) runs the scripts from then on."""
        for _ in range(2):
            try:
                return await self._call(script, keys, args, lead)
            except NoScriptError:
                await self.client.script_load(script.text)
            except ResponseError as exc:
                if not (script.library and self.functions):
                    raise
                missing = scripts.function_missing(str(exc))
                if missing is None:
                    raise
                if missing:
                    await self._load_library(script.library)
                else:
                    self._no_functions(exc)
        return await self._call(script, keys, args, lead)

    async def _load_library(self, library: scripts.Library) -> None:
        """FUNCTION LOAD (every master of a Cluster). REPLACE: a library's name carries a hash
        of its text, so whatever has that name is this very text (loaded meanwhile by
        another client of this release); anything else stays."""
        try:
            await self.client.function_load(library.text, replace=True)
        except ResponseError as exc:
            self._no_functions(exc)

    def _no_functions(self, exc: BaseException) -> None:
        log.info(
            "Redis at %s runs no Turnstile functions (%s): sending scripts instead",
            self.config.shown,
            driver.safe_message(exc, self.config),
        )
        self.functions = False

    async def _call(
        self, script: scripts.Script, keys: list[str], args: list[Any], lead: bool = False
    ) -> Any:
        """FCALL or EVALSHA ``script`` (see :meth:`_loaded`), on a connection kept aside when
        there is one (see :func:`_direct_pool`), else through redis-py's command path.

        ``lead``: the step may wake a waiter with a PUBLISH (a release), so a PING goes
        ahead of it in the same write. Redis writes the replies of an event-loop turn to the
        clients in the reverse order they were queued in, and the script's PUBLISH queues
        the waiter's subscriber connection before the script's own reply queues this one: so
        the releaser would be written first, and on a busy host its next step would take the
        CPU the woken waiter needs (0.2 ms later at p50 on two cores, where a BLPOP waiter,
        served after the command, is written first). The PING's reply queues this connection
        first, and the waiter is written first. One command more, no round trip more; both
        go in one ``sendall`` (one segment, read by the server in one go: two could arrive
        in two reads, the PING answered before the script came). (Not
        through redis-py's command path, so not in a Cluster, where a PUBLISH reaches the
        subscriber's node over the cluster bus and this order does not apply.)"""
        if script.library and self.functions:
            command: tuple[str, str] = ("FCALL", script.function)
        else:
            command = ("EVALSHA", script.sha)
        pool = self._direct
        if pool is None:
            return await self.client.execute_command(*command, len(keys), *keys, *args)
        if self._generation != forks.generation():
            # A forked child: the connections kept aside are the parent's (its pool starts
            # afresh by itself). Never used, never closed here.
            forks.abandon(*self._spare)
            self._spare = []
            self._generation = forks.generation()
        spare = self._spare
        try:
            conn = spare.pop()
        except IndexError:
            conn = await pool.get_connection()
        try:
            packed = driver.pack(conn, (*command, len(keys), *keys, *args))
            await conn.send_packed_command([b"".join([_PING, *packed])] if lead else packed)
            if lead:
                # PONG. An error here (an ACL that refuses PING, a connection that lost its
                # authentication) is not the script's: its reply is read next all the same,
                # so the connection stays in step.
                with contextlib.suppress(ResponseError):
                    await conn.read_response()
            reply = await conn.read_response()
        except ResponseError:
            spare.append(conn)  # an error reply, read in full: the connection is in step
            raise
        except BaseException as exc:
            # A broken connection, a timeout, or an interruption in the middle of a command:
            # redis-py disconnected it (a half-sent command or an unread reply never reaches
            # a later caller). Back to the pool; a driver failure is then handled as redis-py
            # handles any: sent again on a connection of the pool, with its retries. With a
            # lead PING two replies were asked for: one interrupted between them is closed
            # here, so that nobody reads the other as the reply to a command of its own.
            if lead:
                await conn.disconnect()
            await pool.release(conn)
            if isinstance(exc, (RedisConnectionError, RedisTimeoutError)):
                return await self.client.execute_command(*command, len(keys), *keys, *args)
            raise
        if conn.should_reconnect():  # a maintenance notification asked: the pool sees to it
            await pool.release(conn)
        else:
            spare.append(conn)
        return reply

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
            async for raw in self.client.scan_iter(match=pattern, count=1000):
                key = raw.decode("utf-8") if isinstance(raw, bytes) else str(raw)
                bases.append(key[: -len(suffix)])
        except DRIVER_ERRORS as exc:
            raise self.unavailable("SCAN", exc) from exc
        found: set[str] = set()
        for base in bases:
            reply = await probe(base)
            name = reply.decode("utf-8") if isinstance(reply, bytes) else str(reply)
            if name and name.startswith(prefix):
                found.add(name)
        return sorted(found)[:max_count]

    async def ping(self) -> None:
        try:
            await self.client.ping()
        except DRIVER_ERRORS as exc:
            raise self.unavailable("PING", exc) from exc

    async def close(self) -> None:
        listeners, self._listeners = self._listeners, {}
        for generation, listener in listeners.items():
            if generation == forks.generation():
                await listener.close()
            else:
                forks.abandon(listener)  # a forked child: the parent's
        clients = [self.client, self._blocking, *self._blocking_nodes.values()]
        self._spare = []  # closing the client's pool disconnects them too
        self._blocking = None
        self._blocking_nodes = {}
        for client in clients:
            if client is not None:
                with contextlib.suppress(*DRIVER_ERRORS):
                    await client.aclose()
