"""The one subscriber connection of a Redis client, and the lock waiters it wakes.

A waiting entry names its client's channel (acquire.lua's ARGV 12); the step that grants it
PUBLISHes the grant there (``wake()`` in ``lua/lock/_lib.lua``), and this client's
subscriber connection hands it to the local waiter it names. However many waiters a client
has, it keeps this one connection: a waiter holds no connection of its own while it waits.
In a Cluster, PUBLISH reaches every node, so the subscriber connects to any one of them.
What every store's listener does (waiters, early wake-ups, epochs) is in ``wakeups.py``.

No thread or task of its own reads the connection: the waiters take turns at it. One
waiter at a time reads (blocking in the read as a waiter blocked in BLPOP would, in slices
of at most ``READ_SLICE``), hands each message to the waiter it names, and when it is done
waiting offers the turn to another waiter. So the waiter a hand-over is for is usually the
one reading, and it holds the grant the moment the message arrives: no second thread (or
task) to wake on the hand-over's path. Messages that come while nobody waits stay in the
connection until the next waiter reads them.
"""

from __future__ import annotations

import contextlib
import logging
import secrets
import threading
import time
from typing import TYPE_CHECKING, Any

from redis.exceptions import TimeoutError as RedisTimeoutError

from ..._core.records import Grant
from ...stores.redis import replies
from .. import _compat
from .wakeups import (
    LISTEN_PING,
    POLL_MIN,
    RECONNECT_MAX,
    AsyncWakeListener,
    AsyncWakeWaiter,
)

if TYPE_CHECKING:
    from .redis_connection import AsyncRedisConnection

log = logging.getLogger("turnstile.redis")

# The longest one waiter reads the connection at a time (see _compat: the async flavour
# reads in short slices, so that a cancelled waiter stops reading soon).
READ_SLICE = _compat.LISTEN_READ_SLICE


class AsyncRedisListener(AsyncWakeListener):
    """SUBSCRIBE on the client's own channel (:attr:`channel`: the key prefix, ``w:`` and a
    random id), on a connection of its own, read by the waiters in turns."""

    def __init__(self, connection: AsyncRedisConnection) -> None:
        super().__init__(f"Redis at {connection.config.shown}", log)
        self._connection = connection
        self.channel = f"{connection.config.prefix}w:{secrets.token_hex(16)}"
        self._turn = threading.Lock()  # held by the waiter reading the connection
        self._client: Any = None
        self._conn: Any = None  # redis-py's connection, subscribed
        self._retry_at = 0.0  # after a failure, no new connection before this
        self._quiet_since = 0.0
        self._pinged: float | None = None

    @property
    def started(self) -> bool:
        return self._conn is not None

    def start(self) -> bool:
        return False  # no thread or task: the waiters read (read())

    def _split(self, payload: str) -> tuple[str, str]:
        """``g <token> <acquired_us> <expires_us> <joined_us> <key base><holder>``: the wake
        key is the last part (a holder may hold spaces), the grant the rest."""
        parts = payload.split(" ", 5)
        if len(parts) != 6:
            return "", payload
        return parts[5], " ".join(parts[:5])

    def _describe(self, exc: BaseException) -> str:
        return str(self._connection.unavailable("SUBSCRIBE", exc))

    async def connect(self, within: float) -> bool:
        """Have the subscriber connection up (the first waiter of this client makes it,
        waiting at most ``within`` for it); True if it is."""
        deadline = time.monotonic() + within
        while not self.up and not self._stop.is_set():
            left = deadline - time.monotonic()
            if left <= 0:
                break
            if not await self.read(min(left, READ_SLICE)) or not self.up:
                # Another waiter is making it, or it failed and waits out a pause.
                await _compat.sleep(min(left, 0.01))
        return self.up

    async def read(self, seconds: float, until: _compat.Event | None = None) -> bool:
        """Take the turn if it is free and read for at most ``seconds`` (making the
        connection first if there is none), handing each message to its waiter, and no
        further once ``until`` is set (the reader's own wake-up came). False if another
        waiter has the turn."""
        if not self._turn.acquire(blocking=False):
            return False
        try:
            # A read cut short (a cancelled waiter) would leave the connection mid-reply:
            # it runs to its end first, then the cancellation goes on.
            await _compat.finish_then_cancel(self._read(seconds, until))  # unasync: async-only
            # unasync: sync-only
            # self._read(seconds, until)
            # unasync: end
        finally:
            self._turn.release()
        return True

    async def _read(self, seconds: float, until: _compat.Event | None) -> None:
        conn = self._conn
        try:
            if conn is None:
                if not self._stop.is_set() and time.monotonic() >= self._retry_at:
                    await self._open()  # (else: closed, or waiting out a failure)
                return
            deadline = time.monotonic() + seconds
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                message = await _next_message(conn, left)
                if message is None:
                    break
                self._on_message(message)
                if until is not None and until.is_set():
                    break  # the reader's own: it goes at once (the rest stay for the next)
            now = time.monotonic()
            if self._pinged is not None and now - self._pinged > LISTEN_PING:
                raise ConnectionError("the subscriber connection stopped answering")
            if self._pinged is None and now - self._quiet_since > LISTEN_PING:
                await conn.send_command("PING")  # answered as a message: ["pong", ""]
                self._pinged = now
        except Exception as exc:
            if not self._stop.is_set():
                self._failed(exc)
            await self._drop()
            self._retry_at = time.monotonic() + self._delay
            self._delay = min(self._delay * 2, RECONNECT_MAX)

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
        self._quiet_since, self._pinged = time.monotonic(), None
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

    def offer_turn(self, leaving: AsyncWakeWaiter) -> None:
        """``leaving`` stops reading: another waiter of this client, if there is one,
        takes the turn (it may be waiting for a message that only a reader will see)."""
        alone = self._registry.get(leaving._key)
        if len(self._registry) == 1 and alone is not None and len(alone) == 1:
            return  # nobody else waits (a waiter registering now reads first thing)
        with self._lock:
            for waiters in self._registry.values():
                for waiter in waiters:
                    if waiter is not leaving and isinstance(waiter, AsyncRedisWaiter):
                        waiter.offer()
                        return

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

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._woken = False  # a wake-up (or a re-check) came, not just the turn to read
        self._offered = False  # the turn to read was offered to this waiter
        super().__init__(*args, **kwargs)
        if self._event.is_set():
            self._woken = True  # registered with a wake-up kept for it, or to re-check

    def _parse(self, grant: str) -> tuple[int, Grant] | None:
        return replies.handed_grant(self._name, self._holder, grant)

    def deliver(self, grant: str) -> None:
        self._woken = True
        super().deliver(grant)

    def offer(self) -> None:
        """The turn to read is free: take it if still waiting (not a wake-up)."""
        self._offered = True
        self._event.set()

    async def wait(self, timeout: float) -> bool:
        listener = self._listener
        if listener is None:
            return await super().wait(timeout)
        assert isinstance(listener, AsyncRedisListener)
        deadline = time.monotonic() + timeout
        read = False
        try:
            while True:
                if self._event.is_set():
                    self._event.clear()
                    if self._offered:
                        self._offered = False
                        read = True  # if it goes unused, it is offered on (finally)
                    if self._woken:
                        self._woken = False
                        return True
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                got = await listener.read(min(left, READ_SLICE), self._event)
                read = read or got
                if not listener.up:
                    # No subscriber connection (it failed, and is made again when its
                    # pause is over): look again with a step now and then (a few times a
                    # second), as no wake-up can be heard meanwhile.
                    woken = await super().wait(left)
                    self._woken = False
                    return woken
                self._pause = POLL_MIN
                if not got:
                    # Another waiter reads: it sets our event when a message is ours, or
                    # when it stops reading (the turn is offered to one waiter).
                    await _compat.wait_event(self._event, left)
        finally:
            if read:
                listener.offer_turn(self)

    async def close(self) -> None:
        listener = self._listener
        await super().close()
        if self._offered and isinstance(listener, AsyncRedisListener):
            listener.offer_turn(self)  # offered, never taken: on to another waiter
