"""The one subscriber connection of a Redis client, and the lock waiters it wakes.

A waiting entry names its client's channel (acquire.lua's ARGV 12); the step that grants it
PUBLISHes the grant there (``wake()`` in ``lua/lock/_lib.lua``), and this client's
subscriber connection hands it to the local waiter it names. However many waiters a client
has, it keeps this one connection: a waiter holds no connection of its own while it waits.
In a Cluster, PUBLISH reaches every node, so the subscriber connects to any one of them.
What every store's listener does (waiters, early wake-ups, epochs, reconnecting) is in
``wakeups.py``.
"""

from __future__ import annotations

import contextlib
import logging
import secrets
import time
from typing import TYPE_CHECKING

from ..._core.records import Grant
from ...stores.redis import replies
from .wakeups import LISTEN_PING, LISTEN_TICK, AsyncWakeListener, AsyncWakeWaiter

if TYPE_CHECKING:
    from .redis_connection import AsyncRedisConnection

log = logging.getLogger("turnstile.redis")


class AsyncRedisListener(AsyncWakeListener):
    """SUBSCRIBE on the client's own channel (:attr:`channel`: the key prefix, ``w:`` and a
    random id), on a connection of its own."""

    thread_name = "turnstile-redis-listen"

    def __init__(self, connection: AsyncRedisConnection) -> None:
        super().__init__(f"Redis at {connection.config.shown}", log)
        self._connection = connection
        self.channel = f"{connection.config.prefix}w:{secrets.token_hex(16)}"

    def _split(self, payload: str) -> tuple[str, str]:
        """``g <token> <acquired_us> <expires_us> <joined_us> <key base><holder>``: the wake
        key is the last part (a holder may hold spaces), the grant the rest."""
        parts = payload.split(" ", 5)
        if len(parts) != 6:
            return "", payload
        return parts[5], " ".join(parts[:5])

    def _describe(self, exc: BaseException) -> str:
        return str(self._connection.unavailable("SUBSCRIBE", exc))

    async def _session(self) -> None:
        client = await self._connection.subscriber_client()
        pubsub = client.pubsub()
        try:
            await pubsub.subscribe(self.channel)
            quiet_since = time.monotonic()
            pinged: float | None = None
            while not self._stop.is_set():
                message = await pubsub.get_message(timeout=LISTEN_TICK)
                now = time.monotonic()
                if message is None:
                    if pinged is not None and now - pinged > LISTEN_PING:
                        raise ConnectionError("the subscriber connection stopped answering")
                    if pinged is None and now - quiet_since > LISTEN_PING:
                        await pubsub.ping()
                        pinged = now
                    continue
                quiet_since, pinged = now, None
                kind = message.get("type")
                if kind == "message":
                    self._dispatch(replies.text(message["data"]))
                elif kind == "subscribe":
                    self._listening()
        finally:
            with contextlib.suppress(Exception):
                await pubsub.aclose()
            with contextlib.suppress(Exception):
                await client.aclose()


class AsyncRedisWaiter(AsyncWakeWaiter):
    """A lock waiter of a Redis client: woken by its subscriber connection, with the grant
    the wake-up carried (``g <token> <acquired_us> <expires_us> <joined_us>``)."""

    log = log

    def _parse(self, grant: str) -> tuple[int, Grant] | None:
        return replies.handed_grant(self._name, self._holder, grant)
