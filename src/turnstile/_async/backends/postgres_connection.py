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
import threading
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import psycopg
from psycopg import generators, pq
from psycopg.adapt import Transformer
from psycopg.errors import error_from_result
from psycopg_pool import AsyncConnectionPool, PoolTimeout

from ..._core import forks
from ...errors import BackendUnavailable
from ...stores.postgres import prepared, wire
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

# At most this many connections a statement just used wait for the next statement outside
# the pool (see _take), and every RECYCLE_EVERY-th return goes through the pool, which
# retires connections past their lifetime.
SPARE_MAX = 2
RECYCLE_EVERY = 256

_IDLE = pq.TransactionStatus.IDLE
_TUPLES_OK = pq.ExecStatus.TUPLES_OK
_FATAL_ERROR = pq.ExecStatus.FATAL_ERROR


def _loader(conn: Any) -> Any:
    """The row loader of a pooled connection for the short path (psycopg's own loaders)."""
    loader = getattr(conn, "_turnstile_loader", None)
    if loader is None:
        loader = conn._turnstile_loader = Transformer(conn)
    return loader


def _utc(epoch: float | None) -> datetime.datetime | None:
    if epoch is None:
        return None
    return datetime.datetime.fromtimestamp(epoch, tz=datetime.UTC)


class AsyncPostgresConnection:
    def __init__(self, config: pg.PostgresConfig, pool: AsyncConnectionPool[Any]) -> None:
        self.config = config
        self._pool = pool
        # Connections returned by the last statements, taken again without the pool's
        # bookkeeping (_take, _give); _pool_waiters counts callers waiting on the pool, who
        # are served first.
        self._spare: list[Any] = []
        self._spare_lock = threading.Lock()
        self._pool_waiters = 0
        self._returns = 0
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
        self.preparing = config.prepare
        self.prepare_misses = 0
        self._unprepared = {config.query(p): config.query(f) for p, f in pg.UNPREPARED.items()}

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
        forks.abandon(self._pool, self.listener, *self._spare)
        self._spare = []
        self._spare_lock = threading.Lock()
        self._pool_waiters = 0
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
                conn = await self._take(deadline)
                try:
                    self.statements += 1
                    prepare = self.preparing and misses < MISSES_PER_CALL
                    if not prepare:
                        query = self._unprepared.get(query, query)
                    statement = wire.parse(query)
                    if statement is not None:
                        try:
                            values = wire.values(statement, params)
                        except wire.Unsupported:
                            statement = None
                    if statement is not None:
                        return await self._send(conn, statement, values, prepare, many, action)
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
                    await self._give(conn)
            except psycopg.Error as exc:
                if self._closed or not pg.is_retryable(exc) or time.monotonic() + pause >= deadline:
                    raise pg.translate(exc, action, self.config) from exc
                log.info(
                    "PostgreSQL %s failed, retrying: %s", action, pg.describe(exc, self.config)
                )
                if pg.is_connection_error(exc):
                    # After a restart every pooled connection is dead: drop them all at once.
                    await self._return_spares()
                    with contextlib.suppress(Exception):
                        await self._pool.check()
                await _compat.sleep(pause)
                pause = min(max(pause * 2, 0.02), 0.5)

    async def _send(
        self,
        conn: Any,
        statement: wire.Statement,
        values: list[bytes | None],
        prepare: bool,
        many: bool,
        action: str,
    ) -> Any:
        """One statement by the short path (``stores/postgres/wire.py``): prepared under its
        hashed name at its first use on this connection (a server connection that already
        has the name holds the same text: adopted), then executed; or sent unprepared. The
        first row (all rows with ``many``), or None."""
        pgconn = conn.pgconn
        if prepare:
            names = prepared.short_path_names(conn)
            if statement.name not in names:
                pgconn.send_prepare(statement.name, statement.text)
                result = (await conn.wait(generators.execute(pgconn)))[-1]
                if result.status == _FATAL_ERROR:
                    exc = error_from_result(result, encoding=conn.info.encoding)
                    if prepared.miss_kind(exc) != prepared.DUPLICATE:
                        raise exc
                    self._missed(prepared.DUPLICATE, action)
                names.add(statement.name)
            pgconn.send_query_prepared(statement.name, values)
        else:
            pgconn.send_query_params(statement.text, values)
        result = (await conn.wait(generators.execute(pgconn)))[-1]
        status = result.status
        if status == _TUPLES_OK:
            loader = _loader(conn)
            loader.set_pgresult(result)
            if many:
                return loader.load_rows(0, result.ntuples, tuple)
            return loader.load_row(0, tuple) if result.ntuples else None
        if status == _FATAL_ERROR:
            raise error_from_result(result, encoding=conn.info.encoding)
        return None

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

    async def _take(self, deadline: float) -> Any:
        """A connection for one statement: a spare one if there is, else from the pool
        (:meth:`_getconn`), waiting for it until ``deadline`` (monotonic) but at least 0.2 s
        and at most ``connect_timeout``. The pool's own checkout and return cost about as
        much client CPU as the statement's send and receive; a spare costs a list pop."""
        with self._spare_lock:
            if self._spare:
                return self._spare.pop()
            self._pool_waiters += 1
        try:
            timeout = min(max(deadline - time.monotonic(), 0.2), self.config.connect_timeout)
            return await self._getconn(timeout)
        finally:
            with self._spare_lock:
                self._pool_waiters -= 1

    async def _give(self, conn: Any) -> None:
        """Return a connection after one statement: kept as a spare if it is idle and
        healthy, nobody waits on the pool and fewer than SPARE_MAX are kept; else to the
        pool (which also retires a connection past its lifetime: one return in
        RECYCLE_EVERY goes there anyway)."""
        self._returns += 1
        if (
            conn.pgconn.transaction_status == _IDLE
            and self._returns % RECYCLE_EVERY
            and not self._closed
        ):
            with self._spare_lock:
                if not self._pool_waiters and len(self._spare) < SPARE_MAX:
                    self._spare.append(conn)
                    return
        await self._pool.putconn(conn)

    async def _return_spares(self) -> None:
        """Give every spare connection back to the pool (closing the client, or after a
        connection error: the pool's check then drops the dead ones)."""
        with self._spare_lock:
            spare, self._spare = self._spare, []
        for conn in spare:
            with contextlib.suppress(Exception):
                await self._pool.putconn(conn)

    @contextlib.asynccontextmanager
    async def borrow(self) -> AsyncIterator[Any]:
        """One of this client's connections, for tests and tools that must run something on
        the very connection statements use."""
        await self.check_fork()
        conn = await self._take(time.monotonic() + self.config.connect_timeout)
        try:
            yield conn
        finally:
            await self._give(conn)

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
        waiters poll), made by the first waiter of this client that finds none, which gives
        it a moment to come up (read by the waiters in turns: postgres_listen.py). Until it
        is up, waiters poll (and are all woken when it comes up)."""
        await self.check_fork()
        listener = self.listener
        if listener is not None and not listener.started:
            await listener.connect(min(LISTEN_START_WAIT, self.config.connect_timeout))
        return listener

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._forks != forks.generation():
            # A forked child closing a client it never used: the pool and LISTEN connection
            # are the parent's, and closing them would end its sessions on the server.
            forks.abandon(self._pool, self.listener, *self._spare)
            return
        if self.listener is not None:
            await self.listener.close()
        await self._return_spares()
        await self._pool.close()


def new_pool(config: pg.PostgresConfig) -> AsyncConnectionPool[Any]:
    """The client's connection pool, not opened yet."""
    return AsyncConnectionPool(
        config.conninfo,
        min_size=config.pool_min,
        max_size=config.pool_max,
        # prepare_threshold=None: psycopg prepares nothing; with prepare=on the short path
        # (stores/postgres/wire.py) prepares each statement at its first use on a
        # connection, under a name hashed from its text (stores/postgres/prepared.py).
        # client_encoding: the short path writes UTF-8.
        kwargs={"autocommit": True, "prepare_threshold": None, "client_encoding": "utf8"},
        open=False,
        name="turnstile",
        timeout=config.connect_timeout,
        # No background reconnection with the pool's own backoff (1 s, doubling, so up to
        # seconds late after a restart): a failed attempt gives up at once, and whoever
        # waits for a connection asks for a new attempt every GETCONN_SLICE (_getconn), so
        # a client is back within a tenth of a second of the server.
        reconnect_timeout=0.0,
    )
