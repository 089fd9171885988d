"""The narrow queue protocol: the atomic operations a backend offers for :class:`AsyncQueue`.

A backend that supports queues returns an object of this shape from ``backend.queues()``
(a backend without that method raises :class:`~turnstile.NotSupported` from
``client.queue``). Each operation is atomic on the store, judged by the store's clock, and
follows the reference state machine :mod:`turnstile._core.queue_machine` step for step; the
contract suite (``tests/contract/test_queue_*.py``) holds every backend to it.

Ids and receipts are chosen by the client (random), never by the store, so the store's side
stays deterministic (Lua scripts, SQL) and a client can retry a ``put`` without duplicating.
"""

from __future__ import annotations

from typing import Protocol

from ..._core.records import ClaimResult, DeadLetterRow, NewMessage, PutResult, QueueStats


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

    async def open_waiter(self, name: str) -> AsyncQueueWaiter: ...

    async def names(self, prefix: str, max_count: int) -> list[str]:
        """Queues that hold messages (ready, delayed, in flight or dead) and whose names
        start with ``prefix``: the first ``max_count`` in code-point order."""
        ...

    # Optional: a backend whose store side can wait itself (the HTTP service) may offer
    #
    #     async def get(self, name, *, wait, visibility_timeout, concurrency, max_attempts)
    #         -> Delivery | None
    #
    # one long poll of up to ``wait`` seconds; the queue then uses it for blocking gets
    # instead of open_waiter/claim/wait.
