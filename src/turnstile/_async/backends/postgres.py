"""``postgresql://`` (and ``postgres://``): durable leases as rows, woken by LISTEN/NOTIFY.

Every operation is one call of a SQL function (``stores/postgres/``) in autocommit
mode: one statement, one transaction, one round trip, no session state, so it works through
a transaction pooler. The function locks the name's row, reads the database clock and follows
:mod:`turnstile._core.lock_machine`; a hand-over ends with one ``NOTIFY`` on the waiting
client's own channel, whose payload names the waiter
(:func:`~turnstile.stores.postgres.sql.wake_key`) and carries the grant, so the waiter holds
the lease on receipt.

One LISTEN connection per client (opened on first need, outside the pool, optionally on its
own ``listen_url``) dispatches those notifications to the local waiters. When it drops, every
local waiter is woken to re-check, waiters poll with a short backoff until it is back, and it
reconnects by itself. See ``docs/postgres.md``.
"""

from __future__ import annotations

import contextlib
import datetime
import logging
import secrets
import threading
import time
from collections.abc import Callable
from typing import Any
from urllib.parse import SplitResult

import psycopg
from psycopg import AsyncConnection
from psycopg_pool import AsyncConnectionPool

from ..._core import forks
from ..._core.records import (
    AcquireResult,
    Characteristics,
    Grant,
    HolderInfo,
    Status,
    WaiterInfo,
)
from ...errors import BackendUnavailable, ConfigurationError
from ...stores.postgres import sql as pg
from .. import _compat

log = logging.getLogger("turnstile.postgres")

CHARACTERISTICS = Characteristics(
    scheme="postgresql",
    cross_process=True,
    cross_host=True,
    durable=True,
    woken_by_store=True,
    description="PostgreSQL: durable leases as rows, woken by LISTEN/NOTIFY",
    cheap_waiters=True,  # one LISTEN connection per client; arming a waiter is local
    queues=True,
)

# The sync LISTEN thread looks at its stop flag this often (the async task is cancelled).
LISTEN_TICK = 0.25
# A LISTEN connection that has been silent this long is checked with a round trip.
LISTEN_PING = 15.0
RECONNECT_MIN = 0.05
RECONNECT_MAX = 2.0
# Without a working LISTEN connection a waiter looks again after these pauses (doubling).
POLL_MIN = 0.005
POLL_MAX = 0.2
# How long the first waiter of a client waits for the LISTEN connection to come up.
LISTEN_START_WAIT = 2.0


class AsyncListener:
    """The one LISTEN connection of a client, dispatching NOTIFY payloads to local waiters.

    It listens on two channels: the client's own (:attr:`channel`, random, named by this
    client's waiting entries: lock hand-overs, with the grant in the payload) and the schema's
    (queue wake-ups, and lock waiters that joined through an older release's function)."""

    def __init__(self, config: pg.PostgresConfig) -> None:
        assert config.listen_conninfo is not None
        self._config = config
        self._conninfo = config.listen_conninfo
        self.channel = pg.client_channel(secrets.token_hex(16))
        self._registry: dict[str, list[AsyncPostgresWaiter]] = {}
        self._lock = threading.Lock()
        self._ready = _compat.Event()
        self._tried = _compat.Event()  # the first connection attempt has ended, either way
        self._stop = _compat.Event()
        self._handle: _compat.Handle | None = None
        self.connects = 0  # successful LISTENs so far (tests and diagnostics)

    @property
    def up(self) -> bool:
        """Whether a LISTEN is active right now: a hand-over NOTIFY will reach us."""
        return self._ready.is_set()

    @property
    def started(self) -> bool:
        """Whether this client listens (or is trying to): waiting entries name its channel
        only then, so a client that never blocks costs the store no NOTIFY."""
        return self._handle is not None

    def start(self) -> bool:
        """Start the listening task/thread if it is not running. True if this call did."""
        with self._lock:
            if self._handle is not None or self._stop.is_set():
                return False
            self._handle = _compat.spawn(self._run, "turnstile-postgres-listen")
            return True

    async def wait_first_attempt(self, within: float) -> bool:
        """Wait until the first connection attempt succeeded or failed; True if up."""
        await _compat.wait_event(self._tried, within)
        return self.up

    def register(self, key: str, waiter: AsyncPostgresWaiter) -> None:
        with self._lock:
            self._registry.setdefault(key, []).append(waiter)

    def unregister(self, key: str, waiter: AsyncPostgresWaiter) -> None:
        with self._lock:
            waiters = self._registry.get(key)
            if waiters is None:
                return
            with contextlib.suppress(ValueError):
                waiters.remove(waiter)
            if not waiters:
                del self._registry[key]

    def _dispatch(self, payload: str) -> None:
        key, _, grant = payload.partition(" ")
        with self._lock:
            waiters = list(self._registry.get(key, ()))
        for waiter in waiters:
            waiter.deliver(grant)

    def _wake_all(self) -> None:
        with self._lock:
            waiters = [w for group in self._registry.values() for w in group]
        for waiter in waiters:
            waiter.deliver("")

    async def _run(self) -> None:
        delay = RECONNECT_MIN
        listens = [
            f"LISTEN {pg.quote_ident(self.channel)}",
            f"LISTEN {pg.quote_ident(self._config.channel)}",
        ]
        complained = False
        while not self._stop.is_set():
            conn: AsyncConnection[Any] | None = None
            try:
                conn = await AsyncConnection.connect(
                    self._conninfo, autocommit=True, prepare_threshold=None
                )
                for listen in listens:
                    await conn.execute(listen)
                self.connects += 1
                self._ready.set()
                self._tried.set()
                if complained:
                    log.warning("LISTEN connection to %r is back", self._config.display)
                    complained = False
                # Hand-overs while we were not listening were not heard: everyone re-checks.
                self._wake_all()
                delay = RECONNECT_MIN
                quiet_since = time.monotonic()
                while not self._stop.is_set():
                    async for notify in conn.notifies(timeout=LISTEN_TICK):
                        self._dispatch(notify.payload)
                        quiet_since = time.monotonic()
                    if time.monotonic() - quiet_since > LISTEN_PING:
                        await conn.execute("SELECT 1")
                        quiet_since = time.monotonic()
            except Exception as exc:
                if not self._stop.is_set():
                    # Once per outage at warning level, then quietly until it is back.
                    log.log(
                        logging.DEBUG if complained else logging.WARNING,
                        "no LISTEN connection to PostgreSQL at %r (waiters re-check and poll "
                        "until it is back; retrying in %.2f s): %s",
                        self._config.display,
                        delay,
                        pg.describe(exc, self._config),
                    )
                    complained = True
            finally:
                self._tried.set()
                if self._ready.is_set():
                    self._ready.clear()
                    self._wake_all()
                if conn is not None:
                    with contextlib.suppress(Exception):
                        await conn.close()
            if await _compat.wait_event(self._stop, delay):
                return
            delay = min(delay * 2, RECONNECT_MAX)

    async def close(self) -> None:
        self._stop.set()
        with self._lock:
            handle = self._handle
        if handle is not None:
            handle.cancel()  # unasync: async-only
            await _compat.join(handle)
        self._wake_all()


class AsyncPostgresWaiter:
    """Woken by the NOTIFY that hands it the grant, and keeps the grant it carried (see
    :meth:`handed`); polls with a backoff while there is no working LISTEN connection
    (``listen=off``, or the connection is down)."""

    def __init__(
        self, listener: AsyncListener | None, key: str, name: str = "", holder: str = ""
    ) -> None:
        self._listener = listener
        self._key = key
        self._name = name
        self._holder = holder
        self._event = _compat.Event()
        self._pause = POLL_MIN
        # Grants carried by wake-ups, by the waiting entry (seq) they were made for: one made
        # for an earlier wait of the same (name, holder) must never be taken for this one.
        self._handed: dict[int, Grant] = {}
        if listener is not None:
            listener.register(key, self)

    def deliver(self, grant: str) -> None:
        """Called by the listener: ``grant`` is the payload after the wake key ("seq token
        acquired_at expires_at"), or "" for a plain wake-up (re-check)."""
        if grant:
            try:
                seq, token, acquired_at, expires_at = grant.split(" ")
                self._handed[int(seq)] = Grant(
                    self._name, self._holder, int(token), float(acquired_at), float(expires_at)
                )
            except ValueError:
                log.warning("ignoring a malformed wake-up payload %r", grant)
        self._event.set()

    def handed(self, wait_id: int) -> Grant | None:
        """The grant a wake-up carried for the waiting entry ``wait_id``, if one came."""
        return self._handed.pop(wait_id, None)

    async def wait(self, timeout: float) -> bool:
        listener = self._listener
        if listener is not None and listener.up:
            self._pause = POLL_MIN
            woken = await _compat.wait_event(self._event, timeout)
        else:
            pause = min(timeout, self._pause)
            self._pause = min(self._pause * 2, POLL_MAX)
            woken = await _compat.wait_event(self._event, pause) or pause < timeout
        self._event.clear()
        return woken

    async def close(self) -> None:
        if self._listener is not None:
            self._listener.unregister(self._key, self)
            self._listener = None


def _utc(epoch: float | None) -> datetime.datetime | None:
    if epoch is None:
        return None
    return datetime.datetime.fromtimestamp(epoch, tz=datetime.UTC)


class AsyncPostgresBackend:
    characteristics = CHARACTERISTICS

    def __init__(self, config: pg.PostgresConfig, pool: AsyncConnectionPool[Any]) -> None:
        self.config = config
        self._pool = pool
        self._forks = forks.generation()
        self._closed = False
        self._q = {name: config.query(name) for name in pg.QUERIES}
        self.listener = AsyncListener(config) if config.listen_conninfo is not None else None
        # Tests only: a virtual store clock (epoch seconds) passed to the SQL functions.
        self.clock_override: Callable[[], float] | None = None
        self.statements = 0  # statements sent, retries included (benchmarks count them)
        self._queues: Any = None

    def queues(self) -> Any:
        """The queue operations in this schema (see ``postgres_queue.py``)."""
        if self._queues is None:
            from .postgres_queue import AsyncPostgresQueueBackend

            self._queues = AsyncPostgresQueueBackend(self)
        return self._queues

    async def _check_fork(self) -> None:
        """In a forked child, before the first use: a pool and a LISTEN connection of its
        own. The parent's are abandoned, never closed: closing a connection would end the
        parent's session on the server (see ``_core/forks.py``)."""
        if self._forks == forks.generation():
            return
        self._forks = forks.generation()
        forks.abandon(self._pool, self.listener)
        self._pool = _new_pool(self.config)
        self.listener = AsyncListener(self.config) if self.config.listen_conninfo else None
        await self._pool.open(wait=False)

    def _now(self) -> datetime.datetime | None:
        return None if self.clock_override is None else _utc(self.clock_override())

    async def _run(
        self, query: str, params: dict[str, Any], action: str, *, many: bool = False
    ) -> Any:
        """Run one statement (one autocommit transaction), retrying over dropped connections
        and restarts for up to ``retry_timeout``: every operation is idempotent per holder,
        so running it again after a failure whose outcome is unknown is safe."""
        await self._check_fork()
        deadline = time.monotonic() + self.config.retry_timeout
        pause = 0.0
        while True:
            if self._closed:
                raise BackendUnavailable(
                    f"the PostgreSQL client for {self.config.display!r} is closed"
                )
            try:
                wait = min(max(deadline - time.monotonic(), 0.2), self.config.connect_timeout)
                async with self._pool.connection(timeout=wait) as conn:
                    self.statements += 1
                    cursor = await conn.execute(query, params)
                    if many:
                        return await cursor.fetchall()
                    return await cursor.fetchone()
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

    async def acquire(
        self, name: str, holder: str, *, limit: int, ttl: float, wait_ttl: float, enqueue: bool
    ) -> AcquireResult:
        await self._check_fork()  # before naming this client's LISTEN channel
        channel = self._wake_channel()
        row = await self._run(
            self._q["acquire"],
            {
                "name": name,
                "holder": holder,
                "limit": limit,
                "ttl": ttl,
                "wait_ttl": wait_ttl,
                "enqueue": enqueue,
                "now": self._now(),
                "channel": channel,
                "wake": pg.wake_key(name, holder) if channel else None,
            },
            "acquire",
        )
        granted, token, acquired_at, expires_at, position, now, retry_after, wait_id = row
        if granted:
            return AcquireResult(Grant(name, holder, token, acquired_at, expires_at), None, now)
        return AcquireResult(None, position, now, retry_after, wait_id)

    def _wake_channel(self) -> str:
        """The channel a hand-over to a waiter of this client is announced on ('': none)."""
        listener = self.listener
        return listener.channel if listener is not None and listener.started else ""

    async def release(self, name: str, holder: str, token: int | None) -> bool:
        row = await self._run(
            self._q["release"],
            {"name": name, "holder": holder, "token": token, "now": self._now()},
            "release",
        )
        return bool(row[0])

    async def renew(self, name: str, holder: str, token: int, ttl: float) -> Grant | None:
        row = await self._run(
            self._q["renew"],
            {"name": name, "holder": holder, "token": token, "ttl": ttl, "now": self._now()},
            "renew",
        )
        renewed, acquired_at, expires_at = row
        if not renewed:
            return None
        return Grant(name, holder, token, acquired_at, expires_at)

    async def status(self, name: str) -> Status:
        row = await self._run(self._q["status"], {"name": name, "now": self._now()}, "read status")
        limit, now, holders, waiters = row
        return Status(
            name=name,
            limit=limit,
            holders=tuple(HolderInfo(h, t, a, e) for h, t, a, e in holders),
            waiters=tuple(WaiterInfo(h, i, j, e) for i, (h, j, e) in enumerate(waiters)),
            now=now,
        )

    async def names(self, prefix: str, max_count: int) -> list[str]:
        rows = await self._run(
            self._q["names"],
            {"prefix": prefix, "max_count": max_count, "now": self._now()},
            "list names",
            many=True,
        )
        return [r[0] for r in rows]

    async def open_waiter(self, name: str, holder: str) -> AsyncPostgresWaiter:
        await self._check_fork()
        listener = self.listener
        if listener is None:
            return AsyncPostgresWaiter(None, "")
        if listener.start():
            # The first waiter of this client: give the LISTEN connection a moment to come
            # up. Until it is up, waiters poll (and are all woken when it comes up).
            await listener.wait_first_attempt(min(LISTEN_START_WAIT, self.config.connect_timeout))
        return AsyncPostgresWaiter(listener, pg.wake_key(name, holder), name, holder)

    async def ping(self) -> None:
        await self._run(self._q["ping"], {}, "answer a ping")

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


async def _migrate(conn: AsyncConnection[Any], config: pg.PostgresConfig) -> None:
    """Bring the schema to :data:`pg.SCHEMA_VERSION`: created on first use, each migration
    once, safe when many processes start at once (an advisory transaction lock serialises
    them; the version table says what is done). Nothing outside the schema is touched."""
    q = config.query
    cursor = await conn.execute(q("server_info"))
    encoding, version = await cursor.fetchone() or ("", 0)
    if str(encoding).upper() not in ("UTF8", "UTF-8"):
        raise ConfigurationError(
            f"PostgreSQL database at {config.display!r} has encoding {encoding}; Turnstile "
            "needs a UTF8 database (names may hold any Unicode text)"
        )
    if int(version) < pg.MIN_SERVER_VERSION:
        raise ConfigurationError(
            f"PostgreSQL at {config.display!r} is version {version}; Turnstile needs 12 or later"
        )
    version_table = f"{pg.quote_ident(config.schema)}.schema_version"
    cursor = await conn.execute(q("version_table_exists"), {"version_table": version_table})
    exists = (await cursor.fetchone() or (False,))[0]
    if exists:
        cursor = await conn.execute(q("applied_version"))
        current = int((await cursor.fetchone() or (0,))[0])
        if current == pg.SCHEMA_VERSION:
            return
        if current > pg.SCHEMA_VERSION:
            raise ConfigurationError(
                f"schema {config.schema!r} at {config.display!r} is at Turnstile schema "
                f"version {current}, newer than this release understands "
                f"({pg.SCHEMA_VERSION}); upgrade turnstile"
            )
    async with conn.transaction():
        await conn.execute(q("migrate_lock"), {"key": pg.migrate_lock_key(config.schema)})
        cursor = await conn.execute(
            "SELECT 1 FROM pg_catalog.pg_namespace WHERE nspname = %(schema)s",
            {"schema": config.schema},
        )
        if await cursor.fetchone() is None:
            await conn.execute(q("create_schema"))
        await conn.execute(q("create_version_table"))
        cursor = await conn.execute(q("applied_version"))
        current = int((await cursor.fetchone() or (0,))[0])
        for number, filename, script in pg.MIGRATIONS:
            if number > current:
                log.info("applying %s to schema %r", filename, config.schema)
                await conn.execute(pg.render(script, config.schema))
                await conn.execute(q("record_version"), {"version": number, "name": filename})


def _new_pool(config: pg.PostgresConfig) -> AsyncConnectionPool[Any]:
    """The client's connection pool, not opened yet."""
    return AsyncConnectionPool(
        config.conninfo,
        min_size=config.pool_min,
        max_size=config.pool_max,
        kwargs={"autocommit": True, "prepare_threshold": None},
        open=False,
        name="turnstile",
        timeout=config.connect_timeout,
        # No background reconnection with the pool's own backoff (1 s, doubling): a failed
        # attempt gives up at once and the next operation that needs a connection opens one,
        # so a client is back within milliseconds of the server (see _run's retries).
        reconnect_timeout=0.0,
    )


async def open_backend(url: str, parts: SplitResult) -> AsyncPostgresBackend:
    config = pg.parse_url(url, parts)
    try:
        conn = await AsyncConnection.connect(
            config.conninfo, autocommit=True, prepare_threshold=None
        )
    except psycopg.Error as exc:
        raise pg.translate_connect(exc, config) from exc
    try:
        await _migrate(conn, config)
    except psycopg.Error as exc:
        raise pg.translate_connect(exc, config) from exc
    finally:
        with contextlib.suppress(Exception):
            await conn.close()
    pool = _new_pool(config)
    try:
        await pool.open(wait=False)
    except psycopg.Error as exc:
        raise pg.translate_connect(exc, config) from exc
    return AsyncPostgresBackend(config, pool)
