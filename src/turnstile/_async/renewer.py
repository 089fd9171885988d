"""One long-lived renewer per backend: keeps every held lease renewed from a timer heap.

Starting and joining a thread (sync) or task (async) per ``with lease:`` block cost more than
the acquire and release themselves. Instead each backend has one renewer per process (sync:
a daemon thread, started on first use and stopped when the client closes or after a while
with nothing to renew) or per running event loop (async: a task that ends once nothing is
held). A lease is due ``ttl * RENEW_FRACTION`` after its last renewal; the heap keeps the
earliest due first, so a lease never waits for one that is due later.
"""

from __future__ import annotations

import heapq
import itertools
import os
import threading
import time
import weakref
from typing import TYPE_CHECKING, Any

from .._core import forks, timing
from . import _compat

if TYPE_CHECKING:
    from .semaphore import AsyncLease

# unasync: async-only
import asyncio

# unasync: end


class AsyncRenewer:
    def __init__(self) -> None:
        self._seq = itertools.count()
        self._closed = False
        self._reset()

    def _reset(self) -> None:
        """A fresh state: at creation, and in a forked child (whose copy of the lock may be
        held, whose thread does not exist, and whose parent keeps renewing its own leases)."""
        self._lock = threading.Lock()
        self._heap: list[tuple[float, int, AsyncLease]] = []
        self._stale = 0
        self._wake = _compat.Event()
        self._handle: _compat.Handle | None = None
        self._inflight = 0
        # When the renewer will look at the heap again by itself (None: it is busy and will
        # look before sleeping). An add() due earlier wakes it; any other add() needs not.
        self._sleep_until: float | None = None
        self._generation = forks.generation()  # changes in a forked child (no syscall)
        # unasync: async-only
        self._tasks: set[asyncio.Task[None]] = set()
        # unasync: end

    def add(self, lease: AsyncLease, delay: float) -> None:
        """Renew ``lease`` in ``delay`` seconds (sooner if its real remaining time asks for
        it, see :func:`_due_in`), then every ``ttl * RENEW_FRACTION``."""
        if self._generation != forks.generation():
            self._reset()
        with self._lock:
            if self._closed:
                return
            due = time.monotonic() + _due_in(lease, delay)
            self._push(lease, due)
            if self._handle is None or not _compat.alive(self._handle):
                self._sleep_until = None
                self._handle = _compat.spawn(self._run, "turnstile-renewer")
            elif self._sleep_until is not None and due < self._sleep_until:
                self._sleep_until = due
                self._wake.set()

    def discard(self, lease: AsyncLease) -> None:
        """Stop renewing ``lease`` (a renewal already running finishes, and is ignored)."""
        with self._lock:
            if lease._renew_seq is not None:
                lease._renew_seq = None
                self._stale += 1
                if self._stale >= len(self._heap) and _compat.RENEWER_IDLE == 0:
                    self._heap = []  # nothing left to renew: let the task end now
                    self._stale = 0
                    self._wake.set()
                elif self._stale > 64 and self._stale * 2 > len(self._heap):
                    self._heap = [e for e in self._heap if e[2]._renew_seq == e[1]]
                    heapq.heapify(self._heap)
                    self._stale = 0

    def _push(self, lease: AsyncLease, due: float) -> None:
        seq = next(self._seq)
        lease._renew_seq = seq
        heapq.heappush(self._heap, (due, seq, lease))

    def _take_due(self) -> tuple[list[AsyncLease], float | None]:
        """Pop the leases due now; return them and the seconds until the next one is due
        (``None``: nothing scheduled)."""
        due: list[AsyncLease] = []
        now = time.monotonic()
        heap = self._heap
        while heap:
            when, seq, lease = heap[0]
            # Entries of released leases are dropped only once due (or by the compaction in
            # discard): the renewer then keeps sleeping until about ttl/3 from now, so the
            # add() of the next lease, due later, need not wake it.
            if when > now:
                return due, when - now
            heapq.heappop(heap)
            if lease._renew_seq != seq:  # discarded
                self._stale = max(0, self._stale - 1)
                continue
            lease._renew_seq = None
            due.append(lease)
        return due, None

    async def _renew_one(self, lease: AsyncLease) -> None:
        delay: float | None = None
        try:
            delay = await lease._renew_step()
        finally:
            with self._lock:
                self._inflight -= 1
                if delay is not None and not self._closed and lease._wants_renewal():
                    self._push(lease, time.monotonic() + _due_in(lease, delay))
                self._wake.set()

    async def _run(self) -> None:
        idle_until: float | None = None
        while True:
            with self._lock:
                if self._closed or self._generation != forks.generation():
                    return
                self._wake.clear()
                self._sleep_until = None
                due, wait = self._take_due()
                self._inflight += len(due)
                if due or wait is not None or self._inflight:
                    idle_until = None
                else:
                    now = time.monotonic()
                    if idle_until is None:
                        idle_until = now + _compat.RENEWER_IDLE
                    if now >= idle_until:
                        self._handle = None  # add() starts a new one
                        return
                    wait = idle_until - now
                if not due:
                    self._sleep_until = time.monotonic() + (3600.0 if wait is None else wait)
            for lease in due:
                # unasync: async-only
                task = asyncio.get_running_loop().create_task(self._renew_one(lease))
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)
                continue
                # unasync: end
                # unasync: sync-only
                # self._renew_one(lease)  # one at a time, earliest due first
                # unasync: end
            if due:
                continue  # (sync) renewals took time: look again before sleeping
            await _compat.wait_event(self._wake, 3600.0 if wait is None else wait)

    async def close(self) -> None:
        """Stop renewing (client closed): wait for the renewer to finish."""
        with self._lock:
            self._closed = True
            handle, self._handle = self._handle, None
            self._heap = []
            self._wake.set()
        # unasync: async-only
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        for task in tasks:
            await _compat.stop(task)
        # unasync: end
        if handle is not None:
            await _compat.stop(handle)


def _due_in(lease: AsyncLease, delay: float) -> float:
    """When to renew ``lease``: after ``delay`` (a third of its ttl), but never later than
    a third of the time it really has left (its local deadline). A lease that started with
    less than its ttl ahead (a hand-over answered late, a slow reply) is renewed in time,
    not declared lost before its first renewal."""
    return max(0.0, min(delay, lease.remaining * timing.RENEW_FRACTION))


# backend -> context (sync: the process; async: the running event loop) -> renewer
_RENEWERS: weakref.WeakKeyDictionary[Any, dict[Any, AsyncRenewer]] = (
    weakref.WeakKeyDictionary()
)
_RENEWERS_LOCK = threading.Lock()


def renewer_for(backend: object) -> AsyncRenewer:
    key = _compat.context_key()
    per_backend = _RENEWERS.get(backend)
    if per_backend is not None:
        renewer = per_backend.get(key)
        if renewer is not None:
            return renewer
    with _RENEWERS_LOCK:
        per_backend = _RENEWERS.setdefault(backend, {})
        for stale in [k for k in per_backend if _compat.context_gone(k)]:
            del per_backend[stale]
        renewer = per_backend.get(key)
        if renewer is None:
            renewer = per_backend[key] = AsyncRenewer()
        return renewer


async def close_renewers(backend: object) -> None:
    """Stop the renewers of ``backend`` (called when its client closes)."""
    with _RENEWERS_LOCK:
        per_backend = _RENEWERS.pop(backend, {})
    for renewer in per_backend.values():
        await renewer.close()


def _after_fork_in_child() -> None:
    global _RENEWERS_LOCK
    _RENEWERS_LOCK = threading.Lock()
    for per_backend in list(_RENEWERS.values()):
        for renewer in per_backend.values():
            renewer._reset()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
