"""The two narrow protocols every backend implements: locks and queues.

Primitives (:mod:`..semaphore`, :mod:`..queue`) are algorithms over these protocols and never
see a driver. Each operation is atomic on the store and judged by the store's clock. Lock
semantics are those of :mod:`turnstile._core.lock_machine`, queue semantics those of
:mod:`turnstile._core.queue_machine`; the contract suite (``tests/contract``) holds every
backend to them, and ``tests/unit/test_protocols.py`` checks that every backend class has
every member below with the same signature.

Nothing is optional and nothing is discovered by looking for attributes. A behaviour that
differs between stores is either

* a declared field of :class:`~turnstile.Characteristics` (``backend.characteristics``,
  declared once per backend module as ``CHARACTERISTICS``), read before acting:

  - ``cheap_waiters``: ``open_waiter`` costs no round trip, so a blocking acquire arms its
    waiter before its first step;
  - ``keeps_early_wakeups``: a lock waiter keeps a wake-up sent after the acquire step that
    preceded ``open_waiter``, so that step needs no repeating once the waiter is armed;
  - ``queues``: ``queues()`` returns the store's queue operations (else it raises
    :class:`~turnstile.NotSupported`);
  - ``long_poll_gets``: a blocking queue get is ``AsyncQueueBackend.long_poll`` (the store
    side waits), not ``open_waiter``/``claim``/``wait`` on this side;
  - ``local_deliveries``: ``take_deliveries``/``settle_delivery`` work here (every store);
    the HTTP client answers NotSupported, because the service delivers its own callbacks;

* or a method every backend implements, with the documented answer of a store that lacks the
  behaviour (``AsyncWaiter.handed`` returns ``None``; ``AsyncQueueBackend.long_poll`` and
  ``open_waiter`` raise ``NotSupported`` where the other one is the way to wait).

Queue ids and receipts are chosen by the client (random), never by the store, so the store's
side stays deterministic (Lua scripts, SQL) and a client can retry a ``put`` without
duplicating.
"""

from __future__ import annotations

from typing import Protocol, cast, runtime_checkable

from ..._core.records import (
    AcquireResult,
    BatchClaim,
    CallbackDelivery,
    Characteristics,
    ClaimResult,
    DeadLetterRow,
    Delivery,
    Grant,
    NewMessage,
    PutResult,
    QueueStats,
    RateResult,
    RateStatus,
    Status,
)
from ...errors import NotSupported


# -- locks and semaphores -----------------------------------------------------------------
@runtime_checkable
class AsyncWaiter(Protocol):
    """A wake-up channel for one waiting ``(name, holder)``, armed *before* the acquire step
    that may leave it waiting, so no hand-over signal can be missed."""

    async def wait(self, timeout: float) -> bool:
        """Block until woken or ``timeout`` seconds pass. True if woken."""
        ...

    def handed(self, wait_id: int) -> Grant | None:
        """The grant a wake-up carried for the waiting entry ``wait_id``
        (``AcquireResult.wait_id`` of the step that put or kept the caller in line), taken
        once; ``None`` if none came, which is always the answer of a store whose wake-ups
        carry no grant (every store but PostgreSQL and Redis).

        The grant is already durable on the store; the caller holds it from then on without
        another acquire step. It may be *unclaimed*: it lasts ``min(ttl, wait_ttl)`` until a
        renewal extends it (see ``semaphore.py``)."""
        ...

    async def close(self) -> None: ...


@runtime_checkable
class AsyncBackend(Protocol):
    characteristics: Characteristics

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
        """Hold, join the line, or keep one's place (lock_machine.acquire). Idempotent per
        holder. A new waiting entry is placed by ``priority`` and ``ageing``
        (_core/ranking.py). With ``per_key`` the name is a semaphore group whose total is
        ``limit`` and the caller asks for ``key`` (lock_machine: no head-of-line blocking).
        Raises ``lock_machine.limit_conflict`` (``group_conflict``) when a newcomer names
        another limit (``per_key``) than the busy name's. Waking the waiters this step
        granted on others' behalf is part of the operation. ``private``: ``holder`` is a
        blocking acquire's own, which no other call names (a store may then keep its
        waiting entry without an index by holder; see the Redis backend)."""
        ...

    async def release(self, name: str, holder: str, token: int | None) -> bool:
        """lock_machine.release, then wake whoever was granted."""
        ...

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
        """lock_machine.acquire with ``callback`` (and ``enqueue``): join or keep a place as a
        callback waiter; its grant, now or later, carries a pending delivery written in the
        same atomic step. ``callback`` is the text of ``_core.callbacks.encode``."""
        ...

    async def take_deliveries(self, *, lease: float, max_count: int) -> list[CallbackDelivery]:
        """lock_machine.take_deliveries over every name with callbacks that is due
        (``lock_machine.due``): expiries acted on (granting callback waiters), then up to
        ``max_count`` pending deliveries claimed for ``lease`` seconds. Atomic per name."""
        ...

    async def settle_delivery(
        self, name: str, token: int, *, outcome: str, retry_in: float
    ) -> bool:
        """lock_machine.settle_delivery, then wake whoever a refusal granted."""
        ...

    async def pending_deliveries(self) -> int:
        """How many grants wait for their delivery, over the whole store (metrics)."""
        ...

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
        """rate_machine.acquire: admit, or join / keep a place in line and answer the slot.
        Raises ``rate_machine.rate_conflict`` when a busy name has another rate."""
        ...

    async def rate_leave(self, name: str, holder: str) -> bool:
        """rate_machine.leave: give up a place in line."""
        ...

    async def rate_status(self, name: str) -> RateStatus:
        """rate_machine.status: the rate, the line with slots, recent admissions."""
        ...

    async def renew(self, name: str, holder: str, token: int, ttl: float) -> Grant | None:
        """lock_machine.renew: ``None`` means the lease is gone (lost)."""
        ...

    async def set_limit(self, name: str, limit: int) -> int | None:
        """lock_machine.set_limit, then wake whoever a raised limit granted: the limit
        replaced, or ``None`` when the name is idle (nothing stored, nothing changed)."""
        ...

    async def status(self, name: str) -> Status: ...

    async def names(self, prefix: str, max_count: int) -> list[str]:
        """Names that currently have holders or waiters, sorted, at most ``max_count``."""
        ...

    async def open_waiter(self, name: str, holder: str) -> AsyncWaiter: ...

    def queues(self) -> AsyncQueueBackend:
        """The queue operations of the same store, made once per backend. Raises
        :class:`~turnstile.NotSupported` when ``characteristics.queues`` is False."""
        ...

    async def ping(self) -> None:
        """Raise BackendUnavailable if the store cannot be reached."""
        ...

    async def close(self) -> None: ...


# -- queues -------------------------------------------------------------------------------
@runtime_checkable
class AsyncQueueWaiter(Protocol):
    """A wake-up channel for one blocked consumer, armed *before* the claim that registers
    it (``claim(..., waiter=waiter.id)``), so no wake-up can be missed."""

    id: str

    async def wait(self, timeout: float) -> bool:
        """Block until woken or ``timeout`` seconds pass. True if woken."""
        ...

    async def close(self, registered: bool = True) -> None:
        """Stop listening; if ``registered`` (the last claim found nothing), also unregister
        from the queue's waiters so no wake-up is spent on this one."""
        ...



class AsyncAckClaimByBatch:
    """``ack_claim`` as the batch step of one ack and one claim: one atomic step where
    ``ack_claim_many`` is one (Redis: one script; SQLite: one transaction), the ack then the
    claim where it runs as steps (:class:`AsyncStepwiseBatches`)."""

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
        acked, batch = await cast("AsyncQueueBackend", self).ack_claim_many(
            name,
            [(id, ack_receipt)],
            receipts=[receipt],
            visibility_timeout=visibility_timeout,
            concurrency=concurrency,
            max_attempts=max_attempts,
            waiter=waiter,
        )
        delivery = batch.deliveries[0] if batch.deliveries else None
        return acked[0], ClaimResult(delivery, batch.now, batch.retry_after)


class AsyncStepwiseBatches(AsyncAckClaimByBatch):
    """``ack_claim_many`` as separate steps, for the stores that have no batch step (the
    memory store and the HTTP backend): each ack, then claims until one finds nothing (only
    the first names ``waiter``, which it registers if it finds nothing). The answers one
    transaction would give, each step atomic on its own. Every store but PostgreSQL takes
    its ``ack_claim`` from here, as the batch of one."""

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
        if not receipts:
            raise ValueError("ack_claim_many needs at least one receipt")
        backend = cast("AsyncQueueBackend", self)  # every subclass is one
        acked = [await backend.ack(name, id, receipt) for id, receipt in acks]
        deliveries: list[Delivery] = []
        for receipt in receipts:
            result = await backend.claim(
                name,
                receipt=receipt,
                visibility_timeout=visibility_timeout,
                concurrency=concurrency,
                max_attempts=max_attempts,
                waiter=None if deliveries else waiter,
            )
            if result.delivery is None:
                break
            deliveries.append(result.delivery)
        return acked, BatchClaim(
            deliveries, result.now, None if deliveries else result.retry_after
        )


class AsyncLocalQueueWaits(AsyncStepwiseBatches):
    """The documented answer of ``long_poll`` for every store whose blocking gets wake a local
    waiter (``characteristics.long_poll_gets`` False): memory, SQLite, Redis, PostgreSQL.
    Their queue backends inherit it instead of each writing the same refusal, and the
    stepwise ``ack_claim_many`` and ``ack_claim`` (:class:`AsyncStepwiseBatches`; PostgreSQL,
    SQLite and Redis have their own batch step, PostgreSQL its own ``ack_claim`` too)."""


    async def long_poll(
        self,
        name: str,
        *,
        wait: float,
        visibility_timeout: float,
        concurrency: int | None,
        max_attempts: int,
    ) -> Delivery | None:
        raise NotSupported(
            "this store wakes a local waiter (open_waiter) and has no long poll; a queue "
            "long-polls only where characteristics.long_poll_gets is true"
        )

@runtime_checkable
class AsyncQueueBackend(Protocol):
    async def put(self, name: str, message: NewMessage, *, dedup_window: float) -> PutResult:
        """queue_machine.put; wakes the oldest waiter."""
        ...

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
        """queue_machine.claim: deliver the next message, or register ``waiter``."""
        ...

    async def ack(self, name: str, id: str, receipt: str) -> bool: ...

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
        """``ack`` of (``id``, ``ack_receipt``), then ``claim``: the worker loop's step
        between two messages. ``waiter`` is new (not registered yet). PostgreSQL does both in
        one transaction (one round trip, one commit), Redis in one script and SQLite in one
        transaction; the memory store and the HTTP backend run the two steps (all but
        PostgreSQL: :class:`AsyncAckClaimByBatch`)."""
        ...

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
        """``ack`` of each (id, receipt) of ``acks``, then up to ``len(receipts)`` claims
        (one per receipt, at least one), stopping at the first that finds nothing: the
        worker loop's step between two batches (``prefetch``). Each claimed message heads its
        key and counts against ``concurrency``; ``waiter`` (new) is registered only if
        nothing is claimed. PostgreSQL and SQLite do it all in one transaction, Redis in one
        script; the memory store and the HTTP backend run the steps one after another
        (:class:`AsyncStepwiseBatches`)."""
        ...

    async def nack(
        self, name: str, id: str, receipt: str, *, delay: float, error: str | None
    ) -> bool: ...

    async def extend(self, name: str, id: str, receipt: str, seconds: float) -> float | None:
        """The new deadline (store clock), or ``None`` if the receipt is stale."""
        ...

    async def stats(self, name: str, *, top_keys: int) -> QueueStats: ...

    async def dead_letters(self, name: str, *, limit: int) -> list[DeadLetterRow]: ...

    async def requeue(self, name: str, ids: list[str] | None) -> int: ...

    async def purge_dead(self, name: str, ids: list[str] | None) -> int: ...

    async def open_waiter(self, name: str) -> AsyncQueueWaiter:
        """A waiter for a blocking get. Raises :class:`~turnstile.NotSupported` when
        ``characteristics.long_poll_gets`` is True (the store side waits instead)."""
        ...

    async def long_poll(
        self,
        name: str,
        *,
        wait: float,
        visibility_timeout: float,
        concurrency: int | None,
        max_attempts: int,
    ) -> Delivery | None:
        """One claim that the store side holds open for up to ``wait`` seconds until a
        message is deliverable (the HTTP service). Raises :class:`~turnstile.NotSupported`
        when ``characteristics.long_poll_gets`` is False (every store that wakes a local
        waiter)."""
        ...

    async def names(self, prefix: str, max_count: int) -> list[str]:
        """Queues that hold messages (ready, delayed, in flight or dead) and whose names
        start with ``prefix``: the first ``max_count`` in code-point order."""
        ...
