"""The narrow protocol every backend implements: a handful of atomic operations.

Primitives (:mod:`..semaphore`) are algorithms over this protocol and never see a driver.
Each operation is atomic on the store and judged by the store's clock. Semantics are those
of the reference state machine :mod:`turnstile._core.lock_machine`; the contract suite
(``tests/contract``) holds every backend to them.
"""

from __future__ import annotations

from typing import Protocol

from ..._core.records import AcquireResult, Characteristics, Grant, Status


class AsyncWaiter(Protocol):
    """A wake-up channel for one waiting ``(name, holder)``, armed *before* the acquire step
    that may leave it waiting, so no hand-over signal can be missed."""

    # Optional attribute ``keeps_early_wakeups = True``: a wake-up sent after the acquire step
    # that preceded ``open_waiter`` is kept until waited for, so that step needs no repeating.
    #
    # Optional method ``handed(wait_id: int) -> Grant | None``: the grant a wake-up carried for
    # the waiting entry ``wait_id`` (``AcquireResult.wait_id`` of the step that put or kept the
    # caller in line), if one came. The grant is already durable on the store; the caller
    # holds it from then on without another acquire step. It may be *unclaimed*: it lasts
    # ``min(ttl, wait_ttl)`` until a renewal extends it (see ``semaphore.py``).

    async def wait(self, timeout: float) -> bool:
        """Block until woken or ``timeout`` seconds pass. True if woken."""
        ...

    async def close(self) -> None: ...


class AsyncBackend(Protocol):
    characteristics: Characteristics

    async def acquire(
        self, name: str, holder: str, *, limit: int, ttl: float, wait_ttl: float, enqueue: bool
    ) -> AcquireResult:
        """Hold, join the line, or keep one's place (model.acquire). Idempotent per holder.
        Waking the waiters this step granted on others' behalf is part of the operation."""
        ...

    async def release(self, name: str, holder: str, token: int | None) -> bool:
        """model.release, then wake whoever was granted."""
        ...

    async def renew(self, name: str, holder: str, token: int, ttl: float) -> Grant | None:
        """model.renew: ``None`` means the lease is gone (lost)."""
        ...

    async def status(self, name: str) -> Status: ...

    async def names(self, prefix: str, max_count: int) -> list[str]:
        """Names that currently have holders or waiters, sorted, at most ``max_count``."""
        ...

    async def open_waiter(self, name: str, holder: str) -> AsyncWaiter: ...

    async def ping(self) -> None:
        """Raise BackendUnavailable if the store cannot be reached."""
        ...

    async def close(self) -> None: ...
