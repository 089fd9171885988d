"""The one subscriber connection of a Redis client, and the lock waiters it wakes.

A waiting entry names its client's channel (acquire.lua's ARGV 12); the step that grants it
PUBLISHes the grant there (``wake()`` in ``lua/lock/_lib.lua``), and this client's
subscriber connection hands it to the local waiter it names. However many waiters a client
has, it keeps this one connection: a waiter holds no connection of its own while it waits.
In a Cluster, PUBLISH reaches every node, so the subscriber connects to any one of them.
What every store's listener does (waiters, early wake-ups, epochs) is in ``wakeups.py``.

The waiters read that connection in turns (``wakeups.py``): the waiter a hand-over is for is
usually the one reading, and holds the grant the moment the message arrives.
"""

from __future__ import annotations

import contextlib
import logging
import secrets
import time
from typing import TYPE_CHECKING, Any

from redis.exceptions import TimeoutError as RedisTimeoutError

from ..._core.records import Grant
from ...stores.redis import replies
from .wakeups import (
    LISTEN_PING,
    READ_SLICE,
    AsyncWakeListener,
    AsyncWakeWaiter,
)

if TYPE_CHECKING:
    from .redis_connection import AsyncRedisConnection

log = logging.getLogger("turnstile.redis")


class AsyncRedisListener(AsyncWakeListener):
    """SUBSCRIBE on the client's own channel (:attr:`channel`: the key prefix, ``w:`` and a
    random id), on a connection of its own, read by the waiters in turns."""

    def __init__(self, connection: AsyncRedisConnection) -> None:
        super().__init__(f"Redis at {connection.config.shown}", log)
        self._connection = connection
        self.channel = f"{connection.config.prefix}w:{secrets.token_hex(16)}"
        self._client: Any = None  # (self._conn: redis-py's connection, subscribed)
        self._pinged: float | None = None  # when a PING went unanswered so far

    def _split(self, payload: str) -> tuple[str, str]:
        """``g <token> <acquired_us> <expires_us> <joined_us> <key base><holder>``: the wake
        key is the last part (a holder may hold spaces), the grant the rest."""
        parts = payload.split(" ", 5)
        if len(parts) != 6:
            return "", payload
        return parts[5], " ".join(parts[:5])

    def _describe(self, exc: BaseException) -> str:
        return str(self._connection.unavailable("SUBSCRIBE", exc))

    async def _read_some(self, conn: Any, timeout: float) -> bool:
        message = await _next_message(conn, timeout)
        if message is None:
            return False
        self._on_message(message)
        return True

    async def _keep_alive(self, conn: Any) -> None:
        """A PING, whose answer (a message) clears :attr:`_pinged`; one still unanswered
        ``LISTEN_PING`` after it was sent means the connection is gone."""
        now = time.monotonic()
        if self._pinged is None:
            await conn.send_command("PING")  # answered as a message: ["pong", ""]
            self._pinged = now
        elif now - self._pinged > LISTEN_PING:
            raise ConnectionError("the subscriber connection stopped answering")

    async def _open(self) -> None:
        """Connect and SUBSCRIBE, and read up to the subscription's confirmation. The
        connection is redis-py's (its handshake, TLS and parser), read directly rather than
        through ``PubSub``, whose ``get_message`` costs about twice the time per message."""
        self._client = await self._connection.subscriber_client()
        conn = self._client.connection_pool.make_connection()
        self._conn = conn
        await conn.connect()
        await conn.send_command("SUBSCRIBE", self.channel)
        deadline = time.monotonic() + float(
            self._connection.config.options.get("socket_connect_timeout") or 5.0
        )
        while not self.up:
            left = deadline - time.monotonic()
            if left <= 0:
                raise ConnectionError("no confirmation of the SUBSCRIBE")
            message = await _next_message(conn, min(left, READ_SLICE))
            if message is not None:
                self._on_message(message)

    def _on_message(self, message: Any) -> None:
        """A reply read on the subscriber connection: ``[kind, channel, data]`` for a
        message or the SUBSCRIBE's confirmation, ``[b"pong", b""]`` for a PING."""
        self._pinged = None
        if not isinstance(message, list) or not message:
            return
        kind = message[0]
        if kind in (b"message", "message") and len(message) == 3:
            self._dispatch(replies.text(message[2]))
        elif kind in (b"subscribe", "subscribe"):
            self._listening()  # (which also resets the reconnect delay)

    async def _drop(self) -> None:
        """Close the connection (it failed, or the client closes): no longer listening."""
        conn, client = self._conn, self._client
        self._conn = self._client = None
        self._down()
        if conn is not None:
            with contextlib.suppress(Exception):
                await conn.disconnect()
        if client is not None:
            with contextlib.suppress(Exception):
                await client.aclose()

    async def close(self) -> None:
        # A waiter reading now finds the connection closed under it, and stops (stop set).
        self._stop.set()
        await self._drop()
        self._wake_all()


async def _next_message(conn: Any, timeout: float) -> Any:
    """The next reply on the subscriber connection ``conn``, or None if none came within
    ``timeout`` seconds. A read cut by the timeout keeps what it had read in the parser's
    buffer (redis-py reads a reply again from there), so no message is lost or torn."""
    try:
        # unasync: async-only
        return await conn.read_response(
            timeout=max(timeout, 0.001), disconnect_on_error=False, push_request=True
        )
        # unasync: end
        # unasync: sync-only
        # # Through the socket's own timeout: redis-py's sync read_response takes none
        # # before 8.x (it reads with whatever timeout the socket has).
        # sock = conn._sock
        # if sock is None:
        #     raise ConnectionError("the subscriber connection is closed")
        # sock.settimeout(max(timeout, 0.001))
        # return conn.read_response(disconnect_on_error=False, push_request=True)
        # unasync: end
    except RedisTimeoutError:
        return None


class AsyncRedisWaiter(AsyncWakeWaiter):
    """A lock waiter of a Redis client: woken by the message of its client's subscriber
    connection that carries its grant (``g <token> <acquired_us> <expires_us>
    <joined_us>``), reading that connection itself when its turn comes (see
    :class:`AsyncRedisListener`)."""

    log = log

    def _parse(self, grant: str) -> tuple[int, Grant] | None:
        return replies.handed_grant(self._name, self._holder, grant)
