"""``postgresql://`` (and ``postgres://``): durable leases as rows, woken by LISTEN/NOTIFY.

Every operation is one call of a SQL function (``stores/postgres/``) in autocommit
mode: one statement, one transaction, one round trip, no session state, so it works through
a transaction pooler. The function locks the name's row, reads the database clock and follows
:mod:`turnstile._core.lock_machine`; a hand-over ends with one ``NOTIFY`` on the waiting
client's own channel, whose payload names the waiter
(:func:`~turnstile.stores.postgres.sql.wake_key`) and carries the grant, so the waiter holds
the lease on receipt.

One LISTEN connection per client (``postgres_listen.py``; opened on first need, outside the
pool, optionally on its own ``listen_url``) dispatches those notifications to the local
waiters. When it drops, every local waiter is woken to re-check, waiters poll with a short
backoff until it is back, and it reconnects by itself. See ``docs/postgres.md``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any
from urllib.parse import SplitResult

import psycopg
from psycopg import AsyncConnection

from ..._core import callbacks, lock_machine, ranking, rate_machine
from ..._core.records import (
    AcquireResult,
    CallbackDelivery,
    Characteristics,
    Grant,
    HolderInfo,
    RateResult,
    RateStatus,
    RateWaiterInfo,
    Status,
    WaiterInfo,
)
from ...errors import BackendUnavailable, ConfigurationError
from ...stores.postgres import sql as pg
from .postgres_connection import AsyncPostgresConnection, new_pool
from .postgres_listen import AsyncListener, AsyncPostgresWaiter
from .wakeups import WakeMarks

# Fast grants in a row after which a client sends a name acquire_idle (the bare UPDATE): one
# would already pay on a name used by one worker at a time, but a name that is sometimes
# contended (a webhook feed's orders) would then often pay a miss's extra round trip. A name
# used over and over by one worker reaches it after a few uses; an order of a webhook feed,
# which a worker sees a few times at most, practically never.
IDLE_STREAK = 4
# How many names a client remembers having acquired (AsyncPostgresBackend._known).
KNOWN_MAX = 4096
# The columns of acquire_idle's answer (queries.sql): a fast grant's token and times, and
# the relaxed setting's column.
IDLE_COLUMNS = 4

if TYPE_CHECKING:
    # Made by the shared connection: the lock and queue modules never import each other.
    from .postgres_queue import AsyncPostgresQueueBackend

log = logging.getLogger("turnstile.postgres")

CHARACTERISTICS = Characteristics(
    scheme="postgresql",
    cross_process=True,
    cross_host=True,
    durable=True,
    woken_by_store=True,
    description="PostgreSQL: durable leases as rows, woken by LISTEN/NOTIFY",
    # A lock waiter arms after its first step (an uncontended acquire never arms one, nor
    # opens the LISTEN connection): the LISTEN connection keeps a wake-up that comes before
    # its waiter registers, and a waiter whose step it may not have heard re-checks at once
    # (postgres_listen.py, AsyncListener.register).
    keeps_early_wakeups=True,
    queues=True,
    local_deliveries=True,
)

# The description of a store whose URL sets durability other than the default.
DESCRIPTIONS = {
    "relaxed": "PostgreSQL with durability=relaxed: leases as rows whose last grants before a "
    "server crash may be forgotten, woken by LISTEN/NOTIFY",
    "strict": "PostgreSQL with durability=strict: durable leases as rows, every release on "
    "disk too, woken by LISTEN/NOTIFY",
}


class AsyncPostgresBackend:
    characteristics = CHARACTERISTICS

    def __init__(self, connection: AsyncPostgresConnection) -> None:
        self.config = connection.config
        self.connection = connection
        self._q = {name: connection.query(name) for name in pg.QUERIES}
        # Names this client acquired lately (at most KNOWN_MAX, oldest dropped first), each
        # with how many of its last acquires here in a row were fast grants (the name was
        # idle; counted up to IDLE_STREAK). Their rows exist, so acquire sends acquire_idle
        # (the bare UPDATE) to a name idle at its last IDLE_STREAK acquires and acquire_fast
        # (the UPDATE, with the function when the name is busy) to the rest; any other name
        # gets acquire_fresh, which also makes the row of a new name in the same statement.
        # Only a hint: acquire_fast and acquire_fresh answer every case, and when acquire_idle
        # finds the name busy the function is called, a round trip more (queries.sql).
        self._known: dict[str, int] = {}
        self._known_max = KNOWN_MAX if self.config.prepare else 0
        self._acquire_call = self.config.query("acquire")  # the function, whatever prepare is
        self._release_call = self.config.query("release")
        # (name, holder) -> (listener, its mark before the step that put holder in line, when
        # that place lapses unless stepped again): what open_waiter checks, since the waiter
        # arms after that step.
        self._marks = WakeMarks()
        if self.config.durability in DESCRIPTIONS:
            self.characteristics = dataclasses.replace(
                CHARACTERISTICS,
                durable=not self.config.relaxed,
                description=DESCRIPTIONS[self.config.durability],
            )

    @property
    def listener(self) -> AsyncListener | None:
        return self.connection.listener

    @property
    def clock_override(self) -> Callable[[], float] | None:
        """Tests only: a virtual store clock (epoch seconds), for locks and queues alike."""
        return self.connection.clock_override

    @clock_override.setter
    def clock_override(self, clock: Callable[[], float] | None) -> None:
        self.connection.clock_override = clock

    @property
    def statements(self) -> int:
        """Statements sent by this client, retries included (benchmarks count them)."""
        return self.connection.statements

    def queues(self) -> AsyncPostgresQueueBackend:
        """The queue operations in this schema (see ``postgres_queue.py``)."""
        return self.connection.queues()

    def _now(self) -> datetime.datetime | None:
        return self.connection.now()

    async def _run(
        self, query: str, params: dict[str, Any], action: str, *, many: bool = False
    ) -> Any:
        return await self.connection.run(query, params, action, many=many)

    async def acquire(
        self,
        name: str,
        holder: str,
        *,
        limit: int,
        ttl: float,
        wait_ttl: float,
        enqueue: bool,
        priority: int = 0,
        ageing: float | None = None,
        key: str | None = None,
        per_key: int | None = None,
        private: bool = False,
    ) -> AcquireResult:
        await self.connection.check_fork()  # before naming this client's LISTEN channel
        channel = self._wake_channel()
        listener = self.connection.listener
        mark = listener.mark() if listener is not None and channel else None
        lead = ranking.lead(priority, ageing)
        try:
            row = await self._acquire_row(
                name, holder, limit, ttl, wait_ttl, enqueue, channel, lead, key, per_key
            )
        except BackendUnavailable as exc:
            _refuse(name, exc, limit, per_key)
            raise
        granted, token, acquired_at, expires_at, position, now, retry_after, wait_id = row[:8]
        if granted:
            self._marks.forget(name, holder)
            return AcquireResult(Grant(name, holder, token, acquired_at, expires_at), None, now)
        if wait_id is not None and listener is not None:
            self._marks.remember(name, holder, listener, mark, wait_ttl)
        return AcquireResult(None, position, now, retry_after, wait_id)

    async def _acquire_row(
        self,
        name: str,
        holder: str,
        limit: int,
        ttl: float,
        wait_ttl: float,
        enqueue: bool,
        channel: str,
        lead: int,
        key: str | None = None,
        per_key: int | None = None,
    ) -> Any:
        params = {
            "name": name,
            "holder": holder,
            "limit": limit,
            "ttl": ttl,
            "wait_ttl": wait_ttl,
            "enqueue": enqueue,
            "now": self._now(),
            "channel": channel,
            "wake": None,
            "lead": lead,
            "key": key,
            "per_key": per_key,
        }
        known = self._known
        if not self._known_max:
            params["wake"] = pg.wake_key(name, holder) if channel else None
            return await self._run(self._q["acquire"], params, "acquire")
        streak = known.get(name)
        params["name_key"] = pg.name_key(name)
        if streak is not None and streak >= IDLE_STREAK:
            # Idle at its last acquires here: the bare UPDATE, which grants on an idle name
            # and returns nothing on a busy one (then the function does the whole step).
            row = await self._run(self._q["acquire_idle"], params, "acquire")
            if row is None:
                params["wake"] = pg.wake_key(name, holder) if channel else None
                row = await self._run(self._acquire_call, params, "acquire")
            elif len(row) == IDLE_COLUMNS:
                # A fast grant, of which the statement returns the token and times only (a
                # connection that stopped preparing sent the function instead: a whole row).
                token, acquired_at, expires_at = row[:3]
                row = (True, token, acquired_at, expires_at, None, acquired_at, None, None, True)
        else:
            params["wake"] = pg.wake_key(name, holder) if channel else None
            statement = self._q["acquire_fast" if streak is not None else "acquire_fresh"]
            row = await self._run(statement, params, "acquire")
        # Whether a fast grant answered (the last column of the statements of queries.sql;
        # the function has no such column): the name's next acquire here picks by the streak.
        fast = len(row) > 8 and row[8] is True
        now_streak = min((streak or 0) + 1, IDLE_STREAK) if fast else 0
        if now_streak != streak:
            new = streak is None
            known[name] = now_streak
            if new:
                # Safe from several threads: a concurrent eviction is skipped.
                with contextlib.suppress(RuntimeError, KeyError, StopIteration):
                    while len(known) > self._known_max:
                        del known[next(iter(known))]
        return row

    async def acquire_callback(
        self,
        name: str,
        holder: str,
        *,
        limit: int,
        ttl: float,
        wait_ttl: float,
        callback: str,
        priority: int = 0,
        ageing: float | None = None,
        key: str | None = None,
        per_key: int | None = None,
    ) -> AcquireResult:
        try:
            row = await self._run(
                self._q["acquire_callback"],
                {
                    "name": name,
                    "holder": holder,
                    "limit": limit,
                    "ttl": ttl,
                    "wait_ttl": wait_ttl,
                    "now": self._now(),
                    "callback": callback,
                    "lead": ranking.lead(priority, ageing),
                    "key": key,
                    "per_key": per_key,
                },
                "acquire",
            )
        except BackendUnavailable as exc:
            _refuse(name, exc, limit, per_key)
            raise
        granted, token, acquired_at, expires_at, position, now, retry_after = row
        if granted:
            return AcquireResult(Grant(name, holder, token, acquired_at, expires_at), None, now)
        return AcquireResult(None, position, now, retry_after)

    async def take_deliveries(self, *, lease: float, max_count: int) -> list[CallbackDelivery]:
        rows = await self._run(
            self._q["take_deliveries"],
            {"lease": lease, "max_count": max_count, "now": self._now()},
            "take callback deliveries",
            many=True,
        )
        return [CallbackDelivery(*row) for row in rows]

    async def settle_delivery(
        self, name: str, token: int, *, outcome: str, retry_in: float
    ) -> bool:
        if outcome not in lock_machine.OUTCOMES:
            raise ValueError(f"unknown delivery outcome {outcome!r}")
        row = await self._run(
            self._q["settle_delivery"],
            {
                "name": name,
                "token": token,
                "outcome": outcome,
                "retry_in": retry_in,
                "now": self._now(),
            },
            "settle a callback delivery",
        )
        return bool(row[0])

    async def pending_deliveries(self) -> int:
        row = await self._run(
            self._q["pending_deliveries"], {"now": self._now()}, "count pending deliveries"
        )
        return int(row[0])

    def _wake_channel(self) -> str:
        """The channel a hand-over to a waiter of this client is announced on ('': none); a
        method of the lock backend so that the model-equivalence test can pin it."""
        return self.connection.wake_channel()

    async def rate_acquire(
        self,
        name: str,
        holder: str,
        *,
        rate: int,
        per: float,
        burst: int,
        enqueue: bool,
        grace: float,
        priority: int = 0,
        ageing: float | None = None,
    ) -> RateResult:
        try:
            row = await self._run(
                self._q["rate_acquire"],
                {
                    "name": name,
                    "holder": holder,
                    "rate": rate,
                    "per": per,
                    "burst": burst,
                    "enqueue": enqueue,
                    "grace": grace,
                    "now": self._now(),
                    "lead": ranking.lead(priority, ageing),
                },
                "acquire a rate limit",
            )
        except BackendUnavailable as exc:
            current = pg.conflicting_rate(exc.__cause__)
            if current is None:
                raise
            raise rate_machine.rate_conflict(name, current, (rate, per, burst)) from None
        admitted, position, now, retry_after, tat = row
        return RateResult(bool(admitted), position, now, retry_after, tat)

    async def rate_leave(self, name: str, holder: str) -> bool:
        row = await self._run(
            self._q["rate_leave"],
            {"name": name, "holder": holder, "now": self._now()},
            "leave the line of a rate limit",
        )
        return bool(row[0])

    async def rate_status(self, name: str) -> RateStatus:
        row = await self._run(
            self._q["rate_status"], {"name": name, "now": self._now()}, "read rate limit status"
        )
        rate, per, burst, now, next_slot, holders, joined, slots, admitted = row
        return RateStatus(
            name=name,
            rate=rate,
            per=per,
            burst=burst,
            waiters=tuple(
                RateWaiterInfo(h, i, j, s)
                for i, (h, j, s) in enumerate(zip(holders, joined, slots, strict=True))
            ),
            admitted=tuple(admitted),
            next_slot=next_slot,
            now=now,
        )

    async def release(self, name: str, holder: str, token: int | None) -> bool:
        if token is None:
            self._marks.forget(name, holder)  # leaving the line: no waiter to arm
        params: dict[str, Any] = {
            "name": name, "holder": holder, "token": token, "now": self._now()
        }
        statement = self._q["release"]
        if self._known_max:  # prepare=on: the plain statements find the row by its key
            params["name_key"] = pg.name_key(name)
            streak = self._known.get(name)
            if token is not None and streak is not None and streak >= IDLE_STREAK:
                # Granted on a name idle at its last acquires here: the bare UPDATE, which
                # frees the name if this is its fast holder and returns nothing otherwise
                # (then the function does the whole step: another holder or a waiter came).
                row = await self._run(self._q["release_idle"], params, "release")
                if row is not None:
                    return bool(row[0])
                statement = self._release_call
        row = await self._run(statement, params, "release")
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

    async def set_limit(self, name: str, limit: int) -> int | None:
        row = await self._run(
            self._q["set_limit"],
            {"name": name, "limit": limit, "now": self._now()},
            "set the limit",
        )
        return None if row[0] is None else int(row[0])

    async def status(self, name: str) -> Status:
        row = await self._run(self._q["status"], {"name": name, "now": self._now()}, "read status")
        (
            limit, now, holders, waiters, holder_callbacks, waiter_callbacks, per_key,
            holder_keys, waiter_keys,
        ) = row
        # Callback kinds only: the callback's text (a credential) never leaves the database.
        return Status(
            name=name,
            limit=limit,
            holders=tuple(
                HolderInfo(h, t, a, e, *_holder_callback(cb), k)
                for (h, t, a, e), cb, k in zip(
                    holders, holder_callbacks, holder_keys, strict=True
                )
            ),
            waiters=tuple(
                WaiterInfo(h, i, j, e, _kind(cb), k)
                for i, ((h, j, e), cb, k) in enumerate(
                    zip(waiters, waiter_callbacks, waiter_keys, strict=True)
                )
            ),
            now=now,
            per_key=per_key,
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
        """Armed after the step that put ``holder`` in line (``keeps_early_wakeups``): the
        wake-ups that came since are delivered on arming, and if one may be missing (the
        step named no channel, or the LISTEN connection was down or reconnected since) the
        waiter re-checks at once instead of waiting. Without a note of such a step (armed
        before its step, as ``Lock.wait`` and the backend protocol allow), as before."""
        listener = await self.connection.listening()
        if listener is None:
            self._marks.forget(name, holder)
            return AsyncPostgresWaiter(None, "")
        since = self._marks.since(name, holder, listener)
        return AsyncPostgresWaiter(listener, pg.wake_key(name, holder), name, holder, since)

    async def ping(self) -> None:
        await self._run(self._q["ping"], {}, "answer a ping")

    async def close(self) -> None:
        await self.connection.close()


def _refuse(name: str, exc: BackendUnavailable, limit: int, per_key: int | None) -> None:
    """Raise the shape refusal lock_machine.acquire makes, if ``exc`` is acquire's (its
    DETAIL is the busy name's limit and per_key); return otherwise."""
    current = pg.conflicting_shape(exc.__cause__)
    if current is None:
        return
    if current[1] != per_key:
        raise lock_machine.group_conflict(name, current, (limit, per_key)) from None
    raise lock_machine.limit_conflict(name, current[0], limit) from None


def _kind(kind: str | None) -> str | None:
    if kind is None:
        return None
    return kind if kind in callbacks.KINDS else "unknown"


def _holder_callback(entry: list[Any] | None) -> tuple[str | None, str | None]:
    """A holder's (callback kind, delivery state) from status's [kind, pending]."""
    if entry is None:
        return None, None
    kind, pending = entry
    return _kind(kind), callbacks.PENDING if pending else callbacks.DELIVERED


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
    try:
        async with conn.transaction():
            await conn.execute(q("migrate_lock"), {"key": pg.migrate_lock_key(config.schema)})
            cursor = await conn.execute(q("schema_exists"), {"schema": config.schema})
            if await cursor.fetchone() is None:
                await conn.execute(q("create_schema"))
            await conn.execute(q("create_version_table"))
            cursor = await conn.execute(q("applied_version"))
            current = int((await cursor.fetchone() or (0,))[0])
            for number, filename, script in pg.MIGRATIONS:
                if number > current:
                    log.info("applying %s to schema %r", filename, config.schema)
                    await conn.execute(pg.render(script, config.schema))
                    await conn.execute(
                        q("record_version"), {"version": number, "name": filename}
                    )
    except psycopg.errors.InsufficientPrivilege as exc:
        raise pg.cannot_migrate(exc, config) from exc


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
    pool = new_pool(config)
    try:
        await pool.open(wait=False)
    except psycopg.Error as exc:
        raise pg.translate_connect(exc, config) from exc
    return AsyncPostgresBackend(AsyncPostgresConnection(config, pool))
