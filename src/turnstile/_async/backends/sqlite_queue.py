"""Queues on ``sqlite:///``: :class:`turnstile.stores.sqlite.queue_store.SQLiteQueueStore` (blocking
SQL, run in a worker thread by the async flavour) plus the datagram wake-up channel."""

from __future__ import annotations

import secrets
import socket
import time

from ..._core.records import (
    BatchClaim,
    ClaimResult,
    DeadLetterRow,
    NewMessage,
    PutResult,
    QueueStats,
)
from ...stores.sqlite.lock_store import SQLiteStore
from ...stores.sqlite.queue_store import SQLiteQueueStore
from .. import _compat
from .protocol import AsyncLocalQueueWaits

POLL_MIN = 0.001
POLL_MAX = 0.05


class AsyncSQLiteQueueWaiter:
    def __init__(self, store: SQLiteQueueStore, name: str) -> None:
        self.id = secrets.token_hex(8)
        self._store = store
        self._name = name
        self._sock: socket.socket | None = store.bind_wake_socket(name, self.id)
        if self._sock is not None:
            _compat.prepare_socket(self._sock)

    async def wait(self, timeout: float) -> bool:
        if self._sock is not None:
            return await _compat.recv_datagram(self._sock, timeout)
        # No wake channel on this platform: watch the file's data_version with a backoff.
        deadline = time.monotonic() + timeout
        version = await _compat.run_blocking(self._store.store.data_version)
        delay = POLL_MIN
        while time.monotonic() < deadline:
            await _compat.sleep(min(delay, max(0.0, deadline - time.monotonic())))
            if await _compat.run_blocking(self._store.store.data_version) != version:
                return True
            delay = min(delay * 2, POLL_MAX)
        return False

    async def close(self, registered: bool = True) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None
        if registered:
            await _compat.run_blocking(self._store.unregister, self._name, self.id)


class AsyncSQLiteQueueBackend(AsyncLocalQueueWaits):
    def __init__(self, store: SQLiteStore) -> None:
        self.store = SQLiteQueueStore(store)

    async def put(self, name: str, message: NewMessage, *, dedup_window: float) -> PutResult:
        return await _compat.run_blocking(self.store.put, name, message, dedup_window)

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
        return await _compat.run_blocking(
            self.store.claim, name, receipt, visibility_timeout, concurrency, max_attempts, waiter
        )

    async def ack(self, name: str, id: str, receipt: str) -> bool:
        return await _compat.run_blocking(self.store.ack, name, id, receipt)

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
        """The acks, then up to ``len(receipts)`` claims, in one transaction; the worker
        loop's ``ack_claim`` is the batch of one (:class:`AsyncAckClaimByBatch`)."""
        return await _compat.run_blocking(
            self.store.ack_claim_many, name, acks, receipts, visibility_timeout, concurrency,
            max_attempts, waiter,
        )

    async def nack(
        self, name: str, id: str, receipt: str, *, delay: float, error: str | None
    ) -> bool:
        return await _compat.run_blocking(self.store.nack, name, id, receipt, delay, error)

    async def extend(self, name: str, id: str, receipt: str, seconds: float) -> float | None:
        return await _compat.run_blocking(self.store.extend, name, id, receipt, seconds)

    async def stats(self, name: str, *, top_keys: int) -> QueueStats:
        return await _compat.run_blocking(self.store.stats, name, top_keys)

    async def dead_letters(self, name: str, *, limit: int) -> list[DeadLetterRow]:
        return await _compat.run_blocking(self.store.dead_letters, name, limit)

    async def requeue(self, name: str, ids: list[str] | None) -> int:
        return await _compat.run_blocking(self.store.requeue, name, ids)

    async def purge_dead(self, name: str, ids: list[str] | None) -> int:
        return await _compat.run_blocking(self.store.purge_dead, name, ids)

    async def open_waiter(self, name: str) -> AsyncSQLiteQueueWaiter:
        return AsyncSQLiteQueueWaiter(self.store, name)


    async def names(self, prefix: str, max_count: int) -> list[str]:
        return await _compat.run_blocking(self.store.names, prefix, max_count)

    def close(self) -> None:
        self.store.close()
