"""Queues on ``postgresql://``: one SQL function per operation (``stores/postgres/schema.sql``;
their calls are the ``queue_*`` queries of ``queries.sql``), run through the client's shared
connection (``postgres_connection.py``: pool and retry loop); a blocked consumer is woken by
a NOTIFY naming it on its client's own channel, dispatched by the client's one LISTEN
connection (``postgres_listen.py``; it polls with a short backoff while that is down)."""

from __future__ import annotations

import secrets
from typing import TYPE_CHECKING, Any

from ..._core.records import (
    BatchClaim,
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
    "put", "claim", "ack_claim", "ack_claim_many", "ack", "nack", "extend", "stats", "dead",
    "requeue", "purge", "unregister", "names",
)

def _claim_result(row: Any, receipt: str) -> ClaimResult:
    found, mid, key, body, kind, attempt, enq, deadline, now, retry = row
    if not found:
        return ClaimResult(None, now, retry)
    delivery = Delivery(mid, key, bytes(body), kind, attempt, enq, receipt, deadline)
    return ClaimResult(delivery, now, None)


# Spare waiters kept per queue name for the next get (see AsyncPostgresQueueWaiter.close).
SPARE_WAITERS = 16


class AsyncPostgresQueueWaiter:
    """A consumer's wake-up channel. Closed unregistered after a claim that delivered (the
    claim deleted its registration: nothing on the store's side names it), it is kept as a
    spare and handed to the next get of the same queue by this client instead of a new one
    (no new id, wake key and listener entry per message). A wake-up that reaches a spare or
    reused waiter late only makes its next wait return early: the get claims again."""

    def __init__(
        self, queues: AsyncPostgresQueueBackend, name: str, listener: AsyncListener | None
    ) -> None:
        self.id = secrets.token_hex(8)
        self._queues = queues
        self._name = name
        self._listener = listener
        self._inner = AsyncPostgresWaiter(listener, pg.wake_key(name, self.id, queue=True))
        # Whether the store surely holds no registration of it: set by a claim that
        # delivered, cleared by every claim before it is sent (a claim whose outcome is
        # unknown may have registered it).
        self.clean = True

    async def wait(self, timeout: float) -> bool:
        return await self._inner.wait(timeout)

    async def close(self, registered: bool = True) -> None:
        if not registered and self.clean and self._queues._keep(self):
            return
        self._queues._open.pop(self.id, None)
        await self._inner.close()
        if registered:
            await self._queues._one("unregister", {"name": self._name, "waiter": self.id})


class AsyncPostgresQueueBackend(AsyncLocalQueueWaits):
    def __init__(self, connection: AsyncPostgresConnection) -> None:
        self.connection = connection
        self._q = {op: connection.query(f"queue_{op}") for op in OPERATIONS}
        self._spare: dict[str, list[AsyncPostgresQueueWaiter]] = {}
        # The waiters handed out and not closed, by id: a claim naming one marks it.
        self._open: dict[str, AsyncPostgresQueueWaiter] = {}

    def _keep(self, waiter: AsyncPostgresQueueWaiter) -> bool:
        """Keep a closed, unregistered waiter as a spare for its queue. False: no room."""
        self._open.pop(waiter.id, None)
        spare = self._spare.setdefault(waiter._name, [])
        if len(spare) >= SPARE_WAITERS:
            return False
        spare.append(waiter)
        return True

    def _claiming(self, waiter: str | None) -> AsyncPostgresQueueWaiter | None:
        """The open waiter a claim names, marked as maybe registered until it answers."""
        if waiter is None:
            return None
        found = self._open.get(waiter)
        if found is not None:
            found.clean = False
        return found

    async def _claim_step(
        self, op: str, params: dict[str, Any], waiter: str | None, *, found: int
    ) -> Any:
        """Run a step that claims (``claim``, ``ack_claim``) for ``waiter``, if any: woken on
        its client's own LISTEN channel (schema version 4; None: on the schema's channel),
        and marked as maybe registered until a reply whose column ``found`` says it
        delivered, which deleted the registration."""
        channel = (self.connection.wake_channel() or None) if waiter is not None else None
        armed = self._claiming(waiter)
        row = await self._one(op, {**params, "waiter": waiter, "channel": channel})
        if armed is not None and row[found]:
            armed.clean = True
        return row

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
        row = await self._claim_step(
            "claim",
            {
                "name": name, "receipt": receipt, "vt": visibility_timeout, "cap": concurrency,
                "max": max_attempts,
            },
            waiter,
            found=0,
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
        row = await self._claim_step(
            "ack_claim",
            {
                "name": name, "id": id, "ack_receipt": ack_receipt, "receipt": receipt,
                "vt": visibility_timeout, "cap": concurrency, "max": max_attempts,
            },
            waiter,
            found=1,
        )
        return bool(row[0]), _claim_result(row[1:], receipt)

    async def ack_claim_many(
        self,
        name: str,
        acks: list[tuple[str, str]],
        *,
        receipts: list[str],
        visibility_timeout: float,
        concurrency: int | None,
        max_attempts: int,
        waiter: str | None,
    ) -> tuple[list[bool], BatchClaim]:
        """The acks, then up to ``len(receipts)`` claims, in one transaction (one round trip,
        one commit: ``queue_ack_claim_many``). ``waiter`` must not be registered yet."""
        if not receipts:
            raise ValueError("ack_claim_many needs at least one receipt")
        row = await self._claim_step(
            "ack_claim_many",
            {
                "name": name, "ids": [i for i, _ in acks], "ack_receipts": [r for _, r in acks],
                "receipts": receipts, "vt": visibility_timeout, "cap": concurrency,
                "max": max_attempts,
            },
            waiter,
            found=1,
        )
        acked, ids, keys, bodies, kinds, attempts, enqueued, deadline, now, retry = row
        deliveries = [
            Delivery(ids[i], keys[i], bytes(bodies[i]), kinds[i], attempts[i], enqueued[i],
                     receipts[i], deadline)
            for i in range(len(ids))
        ]
        return [bool(a) for a in acked], BatchClaim(deliveries, now, retry)

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
        listener = await self.connection.listening()
        spare = self._spare.get(name)
        while spare:
            try:
                waiter = spare.pop()
            except IndexError:  # another thread took the last one
                break
            if waiter._listener is listener:
                self._open[waiter.id] = waiter
                return waiter
            # Made before a fork, on the parent's abandoned listener: dropped, untouched.
        waiter = AsyncPostgresQueueWaiter(self, name, listener)
        self._open[waiter.id] = waiter
        return waiter

