"""Semaphore groups: at most ``per_key`` holders per key and at most ``total`` in all, in one
fair line with no head-of-line blocking (``_core/lock_machine.py``).

A group is one name on the store whose limit is the total; every holder and waiter names a
key. Each key's view is an :class:`AsyncSemaphore` (leases, renewal, tickets, callbacks,
priorities work as they do for a semaphore), so this module only binds keys.
"""

from __future__ import annotations

from collections.abc import Callable

from .._core import callbacks, validate
from .._core.records import Status
from .backends.protocol import AsyncBackend
from .semaphore import (
    AsyncLease,
    AsyncSemaphore,
    AsyncTicket,
    _AcquireContext,  # unasync: async-only
)


class AsyncSemaphoreGroup:
    """At most ``per_key`` holders per key and at most ``total`` across keys, granted in
    arrival order among the waiters whose key has room: a busy key never holds up the keys
    behind it in line.

    ``async with group.acquire("tenant-42", timeout=30) as lease:`` waits in line for a slot
    of that key (sync: ``with``); ``group.try_acquire("tenant-42", holder)`` asks once and
    never blocks; ``group.key("tenant-42")`` is the key's own :class:`AsyncSemaphore`
    (usable as ``async with``). A holder id stands for one lease in the group.
    """

    def __init__(
        self,
        backend: AsyncBackend,
        name: str,
        per_key: int,
        total: int,
        ttl: float = 30.0,
        *,
        on_lost: Callable[[AsyncLease], object] | None = None,
        timeout: float | None = None,
        priority: int = 0,
        ageing: float | bool | None = None,
    ) -> None:
        self._backend = backend
        self.name = validate.name(name)
        self.per_key, self.total = validate.group_limits(per_key, total)
        self.ttl = validate.ttl(ttl)
        self.timeout = validate.timeout(timeout)
        self.priority = validate.priority(priority)
        self.ageing = validate.ageing(ageing)
        self._on_lost = on_lost

    def __repr__(self) -> str:
        return (
            f"<{type(self).__name__} name={self.name!r} per_key={self.per_key} "
            f"total={self.total} ttl={self.ttl}>"
        )

    def key(self, key: str) -> AsyncSemaphore:
        """The semaphore of one key of the group: its leases count against the key's
        ``per_key`` and the group's ``total``."""
        member = AsyncSemaphore(
            self._backend,
            self.name,
            self.total,
            self.ttl,
            on_lost=self._on_lost,
            timeout=self.timeout,
            priority=self.priority,
            ageing=self.ageing,
        )
        member._key = validate.group_key(key)
        member._per_key = self.per_key
        return member

    # unasync: async-only
    def acquire(
        self,
        key: str,
        timeout: float | None = None,
        holder: str | None = None,
        *,
        priority: int | None = None,
    ) -> _AcquireContext:
        """Wait in line for a slot of ``key`` (``timeout=None``: without a time limit). Await
        it for the lease, or use it as ``async with group.acquire(key) as lease:``."""
        return self.key(key).acquire(timeout, holder, priority=priority)

    # unasync: end
    # unasync: sync-only
    # def acquire(
    #     self,
    #     key: str,
    #     timeout: float | None = None,
    #     holder: str | None = None,
    #     *,
    #     priority: int | None = None,
    # ) -> Lease:
    #     """Wait in line for a slot of ``key`` (``timeout=None``: without a time limit). Use
    #     the lease as ``with group.acquire(key) as lease:`` to keep it renewed."""
    #     return self.key(key).acquire(timeout, holder, priority=priority)
    # unasync: end

    async def try_acquire(
        self,
        key: str,
        holder: str,
        wait_ttl: float | None = None,
        *,
        enqueue: bool = True,
        callback: callbacks.Callback | None = None,
        priority: int | None = None,
    ) -> AsyncTicket:
        """Ask once for a slot of ``key``, never block (see
        :meth:`AsyncSemaphore.try_acquire`): hold, or join the line and learn the position
        (in the group's whole line)."""
        return await self.key(key).try_acquire(
            holder, wait_ttl, enqueue=enqueue, callback=callback, priority=priority
        )

    async def renew(self, holder: str, token: int, ttl: float | None = None) -> AsyncLease:
        """Extend ``holder``'s lease (see :meth:`AsyncSemaphore.renew`)."""
        return await self._any().renew(holder, token, ttl)

    async def release(self, holder: str, token: int | None = None) -> bool:
        """Release ``holder``'s lease and, without a token, its place in line."""
        return await self._any().release(holder, token)

    async def wait(self, holder: str, timeout: float) -> bool:
        """Block until ``holder`` may have been granted, or ``timeout`` seconds pass."""
        return await self._any().wait(holder, timeout)

    async def status(self) -> Status:
        """Holders and waiters in line order, each with its key; ``limit`` is the total."""
        return await self._any().status()

    def _any(self) -> AsyncSemaphore:
        # Operations by holder: the key does not matter.
        member = AsyncSemaphore(self._backend, self.name, self.total, self.ttl)
        member._per_key = self.per_key
        return member
