"""Queues on ``memory://``: the reference state machine (:mod:`turnstile._core.queue_machine`)
run under one lock, with an in-process event per blocked consumer."""

from __future__ import annotations

import secrets
import threading
import time
from collections.abc import Callable
from typing import TypeVar

from ..._core import queue_machine
from ..._core.records import (
    ClaimResult,
    DeadLetterRow,
    NewMessage,
    PutResult,
    QueueStats,
)
from .. import _compat
from .protocol import AsyncLocalQueueWaits

T = TypeVar("T")


class AsyncMemoryQueueWaiter:
    def __init__(self, backend: AsyncMemoryQueueBackend, name: str) -> None:
        self.id = secrets.token_hex(8)
        self._backend = backend
        self._key = (name, self.id)
        self._event = _compat.Event()
        backend._events[self._key] = self._event

    async def wait(self, timeout: float) -> bool:
        woken = await _compat.wait_event(self._event, timeout)
        self._event.clear()
        return woken

    async def close(self, registered: bool = True) -> None:
        self._backend._events.pop(self._key, None)
        if registered:
            self._backend._step(self._key[0], self._unregister)

    def _unregister(self, state: queue_machine.QueueState, now: float) -> tuple[None, list[str]]:
        queue_machine.unregister(state, waiter=self.id)
        return None, []


class AsyncMemoryQueueBackend(AsyncLocalQueueWaits):
    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self._lock = threading.Lock()
        self._clock = clock
        self._states: dict[str, queue_machine.QueueState] = {}
        self._events: dict[tuple[str, str], _compat.Event] = {}

    def _step(
        self,
        name: str,
        fn: Callable[[queue_machine.QueueState, float], tuple[T, list[str]]],
    ) -> T:
        with self._lock:
            state = self._states.setdefault(name, queue_machine.QueueState())
            result, woken = fn(state, self._clock())
            if state.empty:
                del self._states[name]
            for waiter in woken:
                event = self._events.get((name, waiter))
                if event is not None:
                    event.set()
            return result

    async def put(self, name: str, message: NewMessage, *, dedup_window: float) -> PutResult:
        return self._step(
            name,
            lambda s, now: queue_machine.put(s, message, dedup_window=dedup_window, now=now),
        )

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
        return self._step(
            name,
            lambda s, now: queue_machine.claim(
                s,
                receipt=receipt,
                visibility_timeout=visibility_timeout,
                concurrency=concurrency,
                max_attempts=max_attempts,
                waiter=waiter,
                now=now,
            ),
        )

    async def ack(self, name: str, id: str, receipt: str) -> bool:
        return self._step(
            name, lambda s, now: queue_machine.ack(s, id=id, receipt=receipt, now=now)
        )

    async def nack(
        self, name: str, id: str, receipt: str, *, delay: float, error: str | None
    ) -> bool:
        return self._step(
            name,
            lambda s, now: queue_machine.nack(
                s, id=id, receipt=receipt, delay=delay, error=error, now=now
            ),
        )

    async def extend(self, name: str, id: str, receipt: str, seconds: float) -> float | None:
        return self._step(
            name,
            lambda s, now: queue_machine.extend(
                s, id=id, receipt=receipt, seconds=seconds, now=now
            ),
        )

    async def stats(self, name: str, *, top_keys: int) -> QueueStats:
        return self._step(
            name, lambda s, now: queue_machine.stats(s, name=name, top_keys=top_keys, now=now)
        )

    async def dead_letters(self, name: str, *, limit: int) -> list[DeadLetterRow]:
        return self._step(name, lambda s, now: queue_machine.dead_letters(s, limit=limit, now=now))

    async def requeue(self, name: str, ids: list[str] | None) -> int:
        return self._step(name, lambda s, now: queue_machine.requeue(s, ids=ids, now=now))

    async def purge_dead(self, name: str, ids: list[str] | None) -> int:
        return self._step(name, lambda s, now: queue_machine.purge_dead(s, ids=ids, now=now))

    async def open_waiter(self, name: str) -> AsyncMemoryQueueWaiter:
        return AsyncMemoryQueueWaiter(self, name)


    async def names(self, prefix: str, max_count: int) -> list[str]:
        with self._lock:
            found = [n for n, s in self._states.items() if s.messages and n.startswith(prefix)]
        return sorted(found)[:max_count]
