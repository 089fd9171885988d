"""Queues on ``postgresql://``: one SQL function per operation (``stores/postgres/schema.sql``;
their calls are the ``queue_*`` queries of ``queries.sql``), run through the client's shared
connection (``postgres_connection.py``: pool and retry loop); a blocked consumer is woken by
a NOTIFY naming it on its client's own channel, dispatched by the client's one LISTEN
connection (``postgres_listen.py``; it polls with a short backoff while that is down)."""

from __future__ import annotations

import secrets
from typing import TYPE_CHECKING, Any

from ..._core.records import (
    ClaimResult,
    DeadLetterRow,
    Delivery,
    KeyDepth,
    NewMessage,
    PutResult,
    QueueStats,
)
from ...stores.postgres import sql as pg
from .postgres_listen import AsyncListener, AsyncPostgresWaiter
from .protocol import AsyncLocalQueueWaits

if TYPE_CHECKING:
    # The connection makes this backend (AsyncPostgresConnection.queues), so it is imported
    # for types only.
    from .postgres_connection import AsyncPostgresConnection

OPERATIONS = (
    "put", "claim", "ack_claim", "ack", "nack", "extend", "stats", "dead", "requeue", "purge",
    "unregister", "names",
)

def _claim_result(row: Any, receipt: str) -> ClaimResult:
    found, mid, key, body, kind, attempt, enq, deadline, now, retry = row
    if not found:
        return ClaimResult(None, now, retry)
    delivery = Delivery(mid, key, bytes(body), kind, attempt, enq, receipt, deadline)
    return ClaimResult(delivery, now, None)


class AsyncPostgresQueueWaiter:
    def __init__(
        self, queues: AsyncPostgresQueueBackend, name: str, listener: AsyncListener | None
    ) -> None:
        self.id = secrets.token_hex(8)
        self._queues = queues
        self._name = name
        self._inner = AsyncPostgresWaiter(listener, pg.wake_key(name, self.id, queue=True))

    async def wait(self, timeout: float) -> bool:
        return await self._inner.wait(timeout)

    async def close(self, registered: bool = True) -> None:
        await self._inner.close()
        if registered:
            await self._queues._one("unregister", {"name": self._name, "waiter": self.id})


class AsyncPostgresQueueBackend(AsyncLocalQueueWaits):
    def __init__(self, connection: AsyncPostgresConnection) -> None:
        self.connection = connection
        self._q = {op: connection.query(f"queue_{op}") for op in OPERATIONS}

    async def _one(self, op: str, params: dict[str, Any]) -> Any:
        # "now": a virtual store clock in tests (connection.clock_override), else None.
        return await self.connection.run(
            self._q[op], {**params, "now": self.connection.now()}, f"queue {op}"
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
        channel = (self.connection.wake_channel() or None) if waiter is not None else None
        row = await self._one(
            "claim",
            {
                "name": name, "receipt": receipt, "vt": visibility_timeout, "cap": concurrency,
                "max": max_attempts, "waiter": waiter, "channel": channel,
            },
        )
        return _claim_result(row, receipt)

    async def ack_claim(
        self,
        name: str,
        id: str,
        ack_receipt: str,
        *,
        receipt: str,
        visibility_timeout: float,
        concurrency: int | None,
        max_attempts: int,
        waiter: str | None,
    ) -> tuple[bool, ClaimResult]:
        """ack, then claim, in one transaction (one round trip, one commit): the worker
        loop's step between two messages. ``waiter`` must not be registered yet."""
        channel = (self.connection.wake_channel() or None) if waiter is not None else None
        row = await self._one(
            "ack_claim",
            {
                "name": name, "id": id, "ack_receipt": ack_receipt, "receipt": receipt,
                "vt": visibility_timeout, "cap": concurrency, "max": max_attempts,
                "waiter": waiter, "channel": channel,
            },
        )
        return bool(row[0]), _claim_result(row[1:], receipt)

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
        rows = await self.connection.run(
            self._q["dead"],
            {"name": name, "limit": limit, "now": self.connection.now()},
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
        rows = await self.connection.run(
            self._q["names"], {"prefix": prefix, "max": max_count}, "list queues", many=True
        )
        return [r[0] for r in rows]

    async def open_waiter(self, name: str) -> AsyncPostgresQueueWaiter:
        return AsyncPostgresQueueWaiter(self, name, await self.connection.listening())

