"""Queues on ``postgresql://``: one SQL function per operation (migrations
``stores/postgres/migrations/0002_queue.sql`` and ``0004_queue_wake_channel.sql``), run through
the lock backend's pool and retry loop; a blocked consumer is woken by a NOTIFY naming it on
its client's own channel, dispatched by the client's one LISTEN connection (and polls with a
short backoff while that connection is down)."""

from __future__ import annotations

import hashlib
import secrets
from typing import Any

from ..._core.records import (
    ClaimResult,
    DeadLetterRow,
    Delivery,
    KeyDepth,
    NewMessage,
    PutResult,
    QueueStats,
)
from ...errors import NotSupported
from ...stores.postgres import sql as pg
from .postgres import LISTEN_START_WAIT, AsyncPostgresBackend, AsyncPostgresWaiter

QUERIES = {
    "put": "SELECT o_id, o_created, o_now FROM __SCHEMA__.queue_put(%(name)s::text, %(id)s::text,"
    " %(key)s::text, %(body)s::bytea, %(kind)s::smallint, %(delay)s::float8, %(dedup)s::text,"
    " %(max)s::integer, %(window)s::float8, %(now)s::timestamptz)",
    "claim": "SELECT o_found, o_id, o_key, o_body, o_kind, o_attempt, o_enqueued_at, o_deadline,"
    " o_now, o_retry_after FROM __SCHEMA__.queue_claim(%(name)s::text, %(receipt)s::text,"
    " %(vt)s::float8, %(cap)s::integer, %(max)s::integer, %(waiter)s::text, %(now)s::timestamptz,"
    " %(channel)s::text)",
    "ack": "SELECT __SCHEMA__.queue_ack(%(name)s::text, %(id)s::text, %(receipt)s::text,"
    " %(now)s::timestamptz)",
    "nack": "SELECT __SCHEMA__.queue_nack(%(name)s::text, %(id)s::text, %(receipt)s::text,"
    " %(delay)s::float8, %(error)s::text, %(now)s::timestamptz)",
    "extend": "SELECT __SCHEMA__.queue_extend(%(name)s::text, %(id)s::text, %(receipt)s::text,"
    " %(seconds)s::float8, %(now)s::timestamptz)",
    "stats": "SELECT o_ready, o_delayed, o_in_flight, o_dead, o_oldest, o_now, o_keys, o_counts"
    " FROM __SCHEMA__.queue_stats(%(name)s::text, %(top)s::integer, %(now)s::timestamptz)",
    "dead": "SELECT o_id, o_key, o_body, o_kind, o_attempts, o_enqueued_at, o_died_at, o_error"
    " FROM __SCHEMA__.queue_dead(%(name)s::text, %(limit)s::integer, %(now)s::timestamptz)",
    "requeue": "SELECT __SCHEMA__.queue_requeue(%(name)s::text, %(ids)s::text[],"
    " %(now)s::timestamptz)",
    "purge": "SELECT __SCHEMA__.queue_purge_dead(%(name)s::text, %(ids)s::text[],"
    " %(now)s::timestamptz)",
    "unregister": "SELECT __SCHEMA__.queue_unregister(%(name)s::text, %(waiter)s::text)",
    # A plain read (no function: it changes nothing and needs no migration).
    "names": "SELECT q.name FROM __SCHEMA__.queues q WHERE starts_with(q.name, %(prefix)s::text)"
    " AND EXISTS (SELECT 1 FROM __SCHEMA__.queue_messages m WHERE m.queue_id = q.id)"
    " ORDER BY q.name LIMIT %(max)s::integer",
}


def wake_key(name: str, waiter: str) -> str:
    """Must equal the SQL function ``queue_wake_key`` of migration 0002."""
    data = b"\0queue\0" + name.encode("utf-8") + b"\0" + waiter.encode("utf-8")
    return hashlib.sha256(data).hexdigest()[:32]


class AsyncPostgresQueueWaiter:
    def __init__(self, queues: AsyncPostgresQueueBackend, name: str) -> None:
        self.id = secrets.token_hex(8)
        self._queues = queues
        self._name = name
        self._inner = AsyncPostgresWaiter(queues.backend.listener, wake_key(name, self.id))

    async def wait(self, timeout: float) -> bool:
        return await self._inner.wait(timeout)

    async def close(self, registered: bool = True) -> None:
        await self._inner.close()
        if registered:
            await self._queues._one("unregister", {"name": self._name, "waiter": self.id})


class AsyncPostgresQueueBackend:
    def __init__(self, backend: AsyncPostgresBackend) -> None:
        self.backend = backend
        self._q = {op: pg.render(text, backend.config.schema) for op, text in QUERIES.items()}

    async def _one(self, op: str, params: dict[str, Any]) -> Any:
        # "now": a virtual store clock in tests (backend.clock_override), else None.
        return await self.backend._run(
            self._q[op], {**params, "now": self.backend._now()}, f"queue {op}"
        )

    async def put(self, name: str, message: NewMessage, *, dedup_window: float) -> PutResult:
        row = await self._one(
            "put",
            {
                "name": name, "id": message.id, "key": message.key, "body": message.body,
                "kind": message.kind, "delay": message.delay, "dedup": message.dedup_id,
                "max": message.max_attempts, "window": dedup_window,
            },
        )
        return PutResult(row[0], bool(row[1]), row[2])

    async def claim(
        self,
        name: str,
        *,
        receipt: str,
        visibility_timeout: float,
        concurrency: int | None,
        max_attempts: int,
        waiter: str | None,
    ) -> ClaimResult:
        # A consumer that may wait is woken on its client's own LISTEN channel (schema
        # version 4); None: on the schema's channel.
        channel = (self.backend._wake_channel() or None) if waiter is not None else None
        row = await self._one(
            "claim",
            {
                "name": name, "receipt": receipt, "vt": visibility_timeout, "cap": concurrency,
                "max": max_attempts, "waiter": waiter, "channel": channel,
            },
        )
        found, mid, key, body, kind, attempt, enq, deadline, now, retry = row
        if not found:
            return ClaimResult(None, now, retry)
        delivery = Delivery(mid, key, bytes(body), kind, attempt, enq, receipt, deadline)
        return ClaimResult(delivery, now, None)

    async def ack(self, name: str, id: str, receipt: str) -> bool:
        row = await self._one("ack", {"name": name, "id": id, "receipt": receipt})
        return bool(row[0])

    async def nack(
        self, name: str, id: str, receipt: str, *, delay: float, error: str | None
    ) -> bool:
        row = await self._one(
            "nack", {"name": name, "id": id, "receipt": receipt, "delay": delay, "error": error}
        )
        return bool(row[0])

    async def extend(self, name: str, id: str, receipt: str, seconds: float) -> float | None:
        row = await self._one(
            "extend", {"name": name, "id": id, "receipt": receipt, "seconds": seconds}
        )
        return None if row[0] is None else float(row[0])

    async def stats(self, name: str, *, top_keys: int) -> QueueStats:
        ready, delayed, flying, dead, oldest, now, keys, counts = await self._one(
            "stats", {"name": name, "top": top_keys}
        )
        return QueueStats(
            name=name, ready=int(ready), delayed=int(delayed), in_flight=int(flying),
            dead=int(dead), oldest_age=None if oldest is None else max(0.0, now - oldest),
            deepest_keys=tuple(KeyDepth(k, int(n)) for k, n in zip(keys, counts, strict=True)),
            now=now,
        )

    async def dead_letters(self, name: str, *, limit: int) -> list[DeadLetterRow]:
        rows = await self.backend._run(
            self._q["dead"],
            {"name": name, "limit": limit, "now": self.backend._now()},
            "queue dead",
            many=True,
        )
        return [
            DeadLetterRow(r[0], r[1], bytes(r[2]), r[3], r[4], r[5], r[6], r[7]) for r in rows
        ]

    async def requeue(self, name: str, ids: list[str] | None) -> int:
        return int((await self._one("requeue", {"name": name, "ids": ids}))[0])

    async def purge_dead(self, name: str, ids: list[str] | None) -> int:
        return int((await self._one("purge", {"name": name, "ids": ids}))[0])

    async def names(self, prefix: str, max_count: int) -> list[str]:
        rows = await self.backend._run(
            self._q["names"], {"prefix": prefix, "max": max_count}, "list queues", many=True
        )
        return [r[0] for r in rows]

    async def open_waiter(self, name: str) -> AsyncPostgresQueueWaiter:
        await self.backend._check_fork()
        listener = self.backend.listener
        if listener is not None and listener.start():
            await listener.wait_first_attempt(
                min(LISTEN_START_WAIT, self.backend.config.connect_timeout)
            )
        return AsyncPostgresQueueWaiter(self, name)

    async def long_poll(
        self,
        name: str,
        *,
        wait: float,
        visibility_timeout: float,
        concurrency: int | None,
        max_attempts: int,
    ) -> Delivery | None:
        raise NotSupported("PostgreSQL wakes a local waiter (open_waiter); it has no long poll")
