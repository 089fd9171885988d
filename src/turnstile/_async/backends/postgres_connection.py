"""What the PostgreSQL lock and queue backends of one client share: the connection pool and
its retry loop, the LISTEN connection (``postgres_listen.py``), the fork check, the test
clock, and the queue backend itself (made on first use).

The lock backend (``postgres.py``) and the queue backend (``postgres_queue.py``) each hold
the same connection and never import each other.
"""

from __future__ import annotations

import contextlib
import datetime
import logging
import time
from collections.abc import Callable
from typing import Any

import psycopg
from psycopg_pool import AsyncConnectionPool, PoolTimeout

from ..._core import forks
from ...errors import BackendUnavailable
from ...stores.postgres import prepared
from ...stores.postgres import sql as pg
from .. import _compat
from .postgres_listen import LISTEN_START_WAIT, AsyncListener
from .postgres_queue import AsyncPostgresQueueBackend

log = logging.getLogger("turnstile.postgres")

# A request for a connection waits this long at most before asking the pool to open one
# again: a connection attempt made while the server was down is given up at once (see
# new_pool), so a request queued then must not wait for it (see _getconn).
GETCONN_SLICE = 0.1

# A statement that met this many prepared-statement misses in one call is sent unprepared.
MISSES_PER_CALL = 3


def _utc(epoch: float | None) -> datetime.datetime | None:
    if epoch is None:
        return None
    return datetime.datetime.fromtimestamp(epoch, tz=datetime.UTC)


class AsyncPostgresConnection:
    def __init__(self, config: pg.PostgresConfig, pool: AsyncConnectionPool[Any]) -> None:
        self.config = config
        self._pool = pool
        self._forks = forks.generation()
        self._closed = False
        self.listener = AsyncListener(config) if config.listen_conninfo is not None else None
        # Tests only: a virtual store clock (epoch seconds) passed to the SQL functions.
        self.clock_override: Callable[[], float] | None = None
        self.statements = 0  # statements sent, retries included (benchmarks count them)
        self._queues: AsyncPostgresQueueBackend | None = None
        # Prepared statements (prepare=on, the default; stores/postgres/prepared.py): on
        # until this client has met MAX_MISSES statements its server connections lost or
        # already had, then off, with acquire and release sent as their function calls.
        self.preparing = config.prepare and prepared.COMPATIBLE
        self.prepare_misses = 0
        self._unprepared = {config.statement(n): config.query(n) for n in ("acquire", "release")}

    def queues(self) -> AsyncPostgresQueueBackend:
        """The queue operations in this schema, sharing this connection."""
        if self._queues is None:
            self._queues = AsyncPostgresQueueBackend(self)
        return self._queues

    def query(self, name: str) -> str:
        """The statement of operation ``name`` (``queries.sql``), for this schema."""
        return self.config.statement(name)

    async def check_fork(self) -> None:
        """In a forked child, before the first use: a pool and a LISTEN connection of its
        own. The parent's are abandoned, never closed: closing a connection would end the
        parent's session on the server (see ``_core/forks.py``)."""
        if self._forks == forks.generation():
            return
        self._forks = forks.generation()
        forks.abandon(self._pool, self.listener)
        self._pool = new_pool(self.config)
        self.listener = AsyncListener(self.config) if self.config.listen_conninfo else None
        await self._pool.open(wait=False)

    def now(self) -> datetime.datetime | None:
        return None if self.clock_override is None else _utc(self.clock_override())

    async def run(
        self, query: str, params: dict[str, Any], action: str, *, many: bool = False
    ) -> Any:
        """Run one statement (one autocommit transaction), retrying over dropped connections
        and restarts for up to ``retry_timeout``: every operation is idempotent per holder,
        so running it again after a failure whose outcome is unknown is safe. A prepared
        statement the server connection lost or already had (``prepared.miss_kind``: it
        did not run) is sent again at once."""
        await self.check_fork()
        deadline = time.monotonic() + self.config.retry_timeout
        pause = 0.0
        misses = 0
        while True:
            if self._closed:
                raise BackendUnavailable(
                    f"the PostgreSQL client for {self.config.display!r} is closed"
                )
            try:
                wait = min(max(deadline - time.monotonic(), 0.2), self.config.connect_timeout)
                conn = await self._getconn(wait)
                try:
                    self.statements += 1
                    if self.preparing and misses < MISSES_PER_CALL:
                        cursor = await conn.execute(query, params)
                    else:
                        query = self._unprepared.get(query, query)
                        cursor = await conn.execute(query, params, prepare=False)
                    if many:
                        return await cursor.fetchall()
                    return await cursor.fetchone()
                except psycopg.Error as exc:
                    kind = prepared.miss_kind(exc)
                    if kind is None:
                        raise
                    prepared.recover(conn, kind)
                    self._missed(kind, action)
                    misses += 1
                    continue
                finally:
                    await self._pool.putconn(conn)
            except psycopg.Error as exc:
                if self._closed or not pg.is_retryable(exc) or time.monotonic() + pause >= deadline:
                    raise pg.translate(exc, action, self.config) from exc
                log.info(
                    "PostgreSQL %s failed, retrying: %s", action, pg.describe(exc, self.config)
                )
                if pg.is_connection_error(exc):
                    # After a restart every pooled connection is dead: drop them all at once.
                    with contextlib.suppress(Exception):
                        await self._pool.check()
                await _compat.sleep(pause)
                pause = min(max(pause * 2, 0.02), 0.5)

    def _missed(self, kind: str, action: str) -> None:
        """Count a prepared-statement miss; after MAX_MISSES stop preparing (each miss
        costs a round trip, and a server side that keeps losing statements gains nothing
        from them). With preparing off no miss can happen, so the retry loop ends."""
        self.prepare_misses += 1
        log.debug("PostgreSQL %s: prepared statement miss (SQLSTATE %s)", action, kind)
        if self.preparing and self.prepare_misses >= prepared.MAX_MISSES:
            self.preparing = False
            log.warning(
                "PostgreSQL at %s: %d prepared statements were missing from, or already on, "
                "the server connection they ran on (a transaction pooler without "
                "prepared-statement support?); this client sends them unprepared from now "
                "on. Add prepare=off to the URL to start that way.",
                self.config.display,
                self.prepare_misses,
            )

    async def _getconn(self, timeout: float) -> Any:
        """A connection from the pool within ``timeout`` seconds.

        The pool opens connections in its background workers, and gives a failed attempt up
        at once (``reconnect_timeout=0``, see :func:`new_pool`). A request queued while the
        server is down would then wait for its whole timeout, served by nobody, although the
        server came back long before. So wait in short slices, and after each one ask the
        pool to grow again (``check()``: with no idle connection, it only starts one
        connection attempt; it is a no-op while one is under way or the pool is full)."""
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            try:
                return await self._pool.getconn(timeout=max(min(left, GETCONN_SLICE), 0.001))
            except PoolTimeout:
                if time.monotonic() >= deadline:
                    raise PoolTimeout(
                        f"couldn't get a connection after {timeout:.2f} sec"
                    ) from None
            await self._pool.check()

    def wake_channel(self) -> str:
        """The channel a hand-over to a waiter of this client is announced on ('': none)."""
        listener = self.listener
        return listener.channel if listener is not None and listener.started else ""

    async def listening(self) -> AsyncListener | None:
        """The LISTEN connection that wakes this client's waiters (None: ``listen=off``,
        waiters poll), started by the first waiter of this client, which gives it a moment
        to come up. Until it is up, waiters poll (and are all woken when it comes up)."""
        await self.check_fork()
        listener = self.listener
        if listener is not None and listener.start():
            await listener.wait_first_attempt(min(LISTEN_START_WAIT, self.config.connect_timeout))
        return listener

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._forks != forks.generation():
            # A forked child closing a client it never used: the pool and LISTEN connection
            # are the parent's, and closing them would end its sessions on the server.
            forks.abandon(self._pool, self.listener)
            return
        if self.listener is not None:
            await self.listener.close()
        await self._pool.close()


async def _prepare(conn: Any) -> None:
    """A new pooled connection prepares each statement at its first use, by hashed name."""
    prepared.install(conn)


def new_pool(config: pg.PostgresConfig) -> AsyncConnectionPool[Any]:
    """The client's connection pool, not opened yet."""
    return AsyncConnectionPool(
        config.conninfo,
        min_size=config.pool_min,
        max_size=config.pool_max,
        # prepare=on: every statement prepared on its first use on a connection, under a
        # name hashed from its text (stores/postgres/prepared.py, installed by configure);
        # off: never.
        kwargs={"autocommit": True, "prepare_threshold": None},
        configure=_prepare if config.prepare else None,
        open=False,
        name="turnstile",
        timeout=config.connect_timeout,
        # No background reconnection with the pool's own backoff (1 s, doubling, so up to
        # seconds late after a restart): a failed attempt gives up at once, and whoever
        # waits for a connection asks for a new attempt every GETCONN_SLICE (_getconn), so
        # a client is back within a tenth of a second of the server.
        reconnect_timeout=0.0,
    )
