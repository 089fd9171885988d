"""``memory://``: the reference state machine in one process, for tests and single-process
apps. Each ``connect("memory://")`` gets its own store; nothing is kept after close."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from urllib.parse import SplitResult

from ..._core import lock_machine, rate_machine
from ..._core.records import (
    AcquireResult,
    CallbackDelivery,
    Characteristics,
    Grant,
    RateResult,
    RateStatus,
    Status,
)
from .. import _compat
from .memory_queue import AsyncMemoryQueueBackend

CHARACTERISTICS = Characteristics(
    scheme="memory",
    cross_process=False,
    cross_host=False,
    durable=False,
    woken_by_store=True,
    description="in-process memory: one process only, nothing stored",
    queues=True,
    local_deliveries=True,
)


class AsyncMemoryWaiter:
    def __init__(self, backend: AsyncMemoryBackend, key: tuple[str, str]) -> None:
        self._backend = backend
        self._key = key
        self._event = _compat.Event()
        backend._events[key] = self._event

    async def wait(self, timeout: float) -> bool:
        woken = await _compat.wait_event(self._event, timeout)
        self._event.clear()
        return woken

    def handed(self, wait_id: int) -> Grant | None:
        return None  # a wake-up here carries no grant: the next acquire step claims it

    async def close(self) -> None:
        if self._backend._events.get(self._key) is self._event:
            del self._backend._events[self._key]


class AsyncMemoryBackend:
    characteristics = CHARACTERISTICS

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        # Every state change happens under _lock, which makes each operation atomic.
        self._lock = threading.Lock()
        self._clock = clock
        self._states: dict[str, lock_machine.NameState] = {}
        self._last_token = 0
        self._events: dict[tuple[str, str], _compat.Event] = {}
        self._queues: AsyncMemoryQueueBackend | None = None
        self._rates: dict[str, rate_machine.RateState] = {}

    def queues(self) -> AsyncMemoryQueueBackend:
        """The queue operations of this store (see ``memory_queue.py``)."""
        if self._queues is None:
            self._queues = AsyncMemoryQueueBackend(self._clock)
        return self._queues

    def _next_token(self) -> int:
        self._last_token += 1
        return self._last_token

    def _settle(self, name: str, state: lock_machine.NameState, woken: list[str]) -> None:
        if state.empty:
            self._states.pop(name, None)
        for holder in woken:
            event = self._events.get((name, holder))
            if event is not None:
                event.set()

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
        return self._acquire(
            name, holder, limit, ttl, wait_ttl, enqueue, None, priority, ageing, key, per_key
        )

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
        return self._acquire(
            name, holder, limit, ttl, wait_ttl, True, callback, priority, ageing, key, per_key
        )

    def _acquire(
        self,
        name: str,
        holder: str,
        limit: int,
        ttl: float,
        wait_ttl: float,
        enqueue: bool,
        callback: str | None,
        priority: int,
        ageing: float | None,
        key: str | None,
        per_key: int | None,
    ) -> AcquireResult:
        with self._lock:
            state = self._states.setdefault(name, lock_machine.NameState(limit=limit))
            try:
                result, woken = lock_machine.acquire(
                    state,
                    name=name,
                    holder=holder,
                    limit=limit,
                    ttl=ttl,
                    wait_ttl=wait_ttl,
                    enqueue=enqueue,
                    now=self._clock(),
                    next_token=self._next_token,
                    callback=callback,
                    priority=priority,
                    ageing=ageing,
                    key=key,
                    per_key=per_key,
                )
            finally:
                if state.empty:
                    self._states.pop(name, None)
            self._settle(name, state, woken)
            return result

    async def take_deliveries(self, *, lease: float, max_count: int) -> list[CallbackDelivery]:
        taken: list[CallbackDelivery] = []
        with self._lock:
            now = self._clock()
            for name, state in list(self._states.items()):
                if len(taken) >= max_count:
                    break
                if not state.has_callbacks or not lock_machine.due(state, now):
                    continue
                got, woken = lock_machine.take_deliveries(
                    state,
                    name=name,
                    now=now,
                    lease=lease,
                    max_count=max_count - len(taken),
                    next_token=self._next_token,
                )
                taken += got
                self._settle(name, state, woken)
        return taken

    async def settle_delivery(
        self, name: str, token: int, *, outcome: str, retry_in: float
    ) -> bool:
        with self._lock:
            state = self._states.get(name)
            if state is None:
                return False
            settled, woken = lock_machine.settle_delivery(
                state,
                token=token,
                outcome=outcome,
                retry_in=retry_in,
                now=self._clock(),
                next_token=self._next_token,
            )
            self._settle(name, state, woken)
            return settled

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
        with self._lock:
            now = self._clock()
            state = self._rates.get(name) or rate_machine.RateState(rate, per, burst)
            result = rate_machine.acquire(
                state,
                name=name,
                holder=holder,
                rate=rate,
                per=per,
                burst=burst,
                enqueue=enqueue,
                grace=grace,
                now=now,
                priority=priority,
                ageing=ageing,
            )
            self._keep_rate(name, state, now)
            return result

    async def rate_leave(self, name: str, holder: str) -> bool:
        with self._lock:
            state = self._rates.get(name)
            if state is None:
                return False
            now = self._clock()
            left = rate_machine.leave(state, holder=holder, now=now)
            self._keep_rate(name, state, now)
            return left

    async def rate_status(self, name: str) -> RateStatus:
        with self._lock:
            now = self._clock()
            state = self._rates.get(name) or rate_machine.RateState()
            found = rate_machine.status(state, name=name, now=now)
            self._keep_rate(name, state, now)
            return found

    def _keep_rate(self, name: str, state: rate_machine.RateState, now: float) -> None:
        if state.idle(now):
            self._rates.pop(name, None)
        else:
            self._rates[name] = state

    async def pending_deliveries(self) -> int:
        now = self._clock()
        with self._lock:
            return sum(
                1
                for state in self._states.values()
                for h in state.holders.values()
                if h.pending and h.expires_at > now
            )

    async def release(self, name: str, holder: str, token: int | None) -> bool:
        with self._lock:
            state = self._states.get(name)
            if state is None:
                return False
            released, woken = lock_machine.release(
                state, holder=holder, token=token, now=self._clock(), next_token=self._next_token
            )
            self._settle(name, state, woken)
            return released

    async def renew(self, name: str, holder: str, token: int, ttl: float) -> Grant | None:
        with self._lock:
            state = self._states.get(name)
            if state is None:
                return None
            return lock_machine.renew(
                state, name=name, holder=holder, token=token, ttl=ttl, now=self._clock()
            )

    async def set_limit(self, name: str, limit: int) -> int | None:
        with self._lock:
            state = self._states.get(name)
            if state is None:
                return None
            previous, woken = lock_machine.set_limit(
                state, limit=limit, now=self._clock(), next_token=self._next_token
            )
            self._settle(name, state, woken)
            return previous

    async def status(self, name: str) -> Status:
        with self._lock:
            state = self._states.get(name) or lock_machine.NameState()
            return lock_machine.status(state, name=name, now=self._clock())

    async def names(self, prefix: str, max_count: int) -> list[str]:
        now = self._clock()
        with self._lock:
            live = [
                n
                for n, s in self._states.items()
                if n.startswith(prefix)
                and (
                    any(h.expires_at > now for h in s.holders.values())
                    or any(w.expires_at > now for w in s.waiters)
                )
            ]
        return sorted(live)[:max_count]

    async def open_waiter(self, name: str, holder: str) -> AsyncMemoryWaiter:
        return AsyncMemoryWaiter(self, (name, holder))

    async def ping(self) -> None:
        return None

    async def close(self) -> None:
        return None


async def open_backend(url: str, parts: SplitResult) -> AsyncMemoryBackend:
    return AsyncMemoryBackend()
