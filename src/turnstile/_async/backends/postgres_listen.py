"""The one LISTEN connection of a PostgreSQL client, and the waiters it wakes (lock waiters
and blocked queue consumers alike): a NOTIFY payload names one waiter by its wake key
(:func:`~turnstile.stores.postgres.sql.wake_key`) and, for a lock hand-over, carries the
grant. What every store's listener does (waiters, early wake-ups, epochs, reconnecting) is
in ``wakeups.py``.

The waiters read that connection in turns (``wakeups.py``): the waiter a hand-over is for is
usually the one reading, and holds the grant the moment the notification arrives, with no
thread of the client's to wake in between. Notifications that come while nobody waits stay
in the connection until the next waiter reads them (a client's channel is named only by its
own waiting entries, so few come then).
"""

from __future__ import annotations

import contextlib
import logging
import secrets
import socket
from typing import Any

from psycopg import AsyncConnection

from ..._core.records import Grant
from ...stores.postgres import sql as pg
from .wakeups import (
    ARMED_FIRST,
    EARLY_MAX,
    LISTEN_START_WAIT,
    POLL_MAX,
    AsyncWakeListener,
    AsyncWakeWaiter,
)

__all__ = [
    "ARMED_FIRST",
    "EARLY_MAX",
    "LISTEN_START_WAIT",
    "POLL_MAX",
    "AsyncListener",
    "AsyncPostgresWaiter",
]

log = logging.getLogger("turnstile.postgres")

# How long closing a client waits for a waiter reading the LISTEN connection to let go.
CLOSE_WAIT = 2.0


class AsyncListener(AsyncWakeListener):
    """LISTEN on two channels, on a connection of its own, read by the waiters in turns: the
    client's own (:attr:`channel`, random, named by this client's waiting entries: lock
    hand-overs, with the grant in the payload) and the schema's (queue wake-ups, and lock
    waiters that joined through an older release's function)."""

    def __init__(self, config: pg.PostgresConfig) -> None:
        assert config.listen_conninfo is not None
        super().__init__(f"PostgreSQL at {config.display!r}", log)
        self._config = config
        self._conninfo = config.listen_conninfo
        self.channel = pg.client_channel(secrets.token_hex(16))
        self._conn: AsyncConnection[Any] | None = None

    def _describe(self, exc: BaseException) -> str:
        return pg.describe(exc, self._config)

    async def _read_some(self, conn: Any, timeout: float) -> bool:
        heard = False
        # stop_after=1: the first batch that arrives, read to its end (a batch left
        # half-read would lose the rest).
        async for notify in conn.notifies(timeout=timeout, stop_after=1):
            self._dispatch(notify.payload)
            heard = True
        return heard

    async def _keep_alive(self, conn: Any) -> None:
        await conn.execute(pg.QUERIES["ping"])  # answers, or raises

    async def _open(self) -> None:
        """Connect and LISTEN on both channels: from then on, every notification for this
        client is kept in the connection until a waiter reads it."""
        conn = await AsyncConnection.connect(
            self._conninfo, autocommit=True, prepare_threshold=None
        )
        try:
            for listen in (pg.listen(self.channel), pg.listen(self._config.channel)):
                await conn.execute(listen)
        except BaseException:
            with contextlib.suppress(Exception):
                await conn.close()
            raise
        self._conn = conn
        self._listening()  # (which also resets the reconnect delay)

    async def _drop(self) -> None:
        """Close the connection (it failed, or the client closes): no longer listening."""
        conn, self._conn = self._conn, None
        self._down()
        if conn is not None:
            with contextlib.suppress(Exception):
                await conn.close()

    async def close(self) -> None:
        # A waiter reading now finds the connection shut under it, and stops (stop set).
        self._stop.set()
        conn = self._conn
        if conn is not None:
            _shut(conn)
        # unasync: sync-only
        # # libpq's connection is freed by close(): never under a thread still reading it,
        # # which (its read failing on the shut socket) drops it itself.
        # if not self._turn.acquire(timeout=CLOSE_WAIT):
        #     self._wake_all()
        #     return
        # try:
        #     self._drop()
        # finally:
        #     self._turn.release()
        # unasync: end
        await self._drop()  # unasync: async-only
        self._wake_all()


def _shut(conn: Any) -> None:
    """Shut the connection's socket down for reading and writing, so that a waiter blocked
    reading it (another thread) returns at once, where closing the descriptor under it
    would leave it blocked until its slice ends."""
    with contextlib.suppress(Exception):
        sock = socket.socket(fileno=conn.pgconn.socket)
        try:
            sock.shutdown(socket.SHUT_RDWR)
        finally:
            sock.detach()  # the descriptor stays libpq's, closed by conn.close()


class AsyncPostgresWaiter(AsyncWakeWaiter):
    """A lock waiter or blocked queue consumer of a PostgreSQL client: woken by the
    notification that names it (for a lock hand-over, carrying its grant: ``seq token
    acquired_at expires_at``), reading its client's LISTEN connection itself when its turn
    comes (see :class:`AsyncListener`)."""

    log = log

    def _parse(self, grant: str) -> tuple[int, Grant] | None:
        """``seq token acquired_at expires_at`` (times in epoch seconds)."""
        seq, token, acquired_at, expires_at = grant.split(" ")
        return int(seq), Grant(
            self._name, self._holder, int(token), float(acquired_at), float(expires_at)
        )
