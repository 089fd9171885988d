"""``sqlite:///path``: the embedded default. Every process on one host that opens the same
file shares the same locks; nothing else to run. See :mod:`turnstile.stores.sqlite.lock_store`
for the transactions and the wake-up channel."""

from __future__ import annotations

import socket
import time
from urllib.parse import SplitResult

from ..._core.records import (
    AcquireResult,
    CallbackDelivery,
    Characteristics,
    Grant,
    RateResult,
    RateStatus,
    Status,
)
from ...stores.sqlite.lock_store import SQLiteStore, parse_path
from ...stores.sqlite.rate_store import SQLiteRates
from .. import _compat
from .sqlite_queue import AsyncSQLiteQueueBackend

CHARACTERISTICS = Characteristics(
    scheme="sqlite",
    cross_process=True,
    cross_host=False,
    durable=True,
    woken_by_store=True,
    description="embedded SQLite file: every process on one host (not across hosts or NFS)",
    queues=True,
    local_deliveries=True,
)

POLL_MIN = 0.001
POLL_MAX = 0.05


class AsyncSQLiteWaiter:
    def __init__(self, store: SQLiteStore, name: str, holder: str) -> None:
        self._store = store
        self._sock: socket.socket | None = store.bind_wake_socket(name, holder)
        if self._sock is not None:
            _compat.prepare_socket(self._sock)

    async def wait(self, timeout: float) -> bool:
        if self._sock is not None:
            return await _compat.recv_datagram(self._sock, timeout)
        # No wake channel on this platform: watch the file's data_version with a backoff.
        deadline = time.monotonic() + timeout
        version = await _compat.run_blocking(self._store.data_version)
        delay = POLL_MIN
        while time.monotonic() < deadline:
            await _compat.sleep(min(delay, max(0.0, deadline - time.monotonic())))
            if await _compat.run_blocking(self._store.data_version) != version:
                return True
            delay = min(delay * 2, POLL_MAX)
        return False

    def handed(self, wait_id: int) -> Grant | None:
        return None  # a datagram carries no grant: the next acquire step claims it

    async def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None


class AsyncSQLiteBackend:
    characteristics = CHARACTERISTICS

    def __init__(self, store: SQLiteStore) -> None:
        self.store = store
        self._queues: AsyncSQLiteQueueBackend | None = None
        self._rates = SQLiteRates(store)

    def queues(self) -> AsyncSQLiteQueueBackend:
        """The queue operations on the same file (``stores/sqlite/queue_store.py``)."""
        if self._queues is None:
            self._queues = AsyncSQLiteQueueBackend(self.store)
        return self._queues

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
        return await _compat.run_blocking(
            self.store.acquire,
            name,
            holder,
            limit,
            ttl,
            wait_ttl,
            enqueue,
            None,
            priority,
            ageing,
            key,
            per_key,
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
        return await _compat.run_blocking(
            self.store.acquire,
            name,
            holder,
            limit,
            ttl,
            wait_ttl,
            True,
            callback,
            priority,
            ageing,
            key,
            per_key,
        )

    async def take_deliveries(self, *, lease: float, max_count: int) -> list[CallbackDelivery]:
        return await _compat.run_blocking(self.store.take_deliveries, lease, max_count)

    async def settle_delivery(
        self, name: str, token: int, *, outcome: str, retry_in: float
    ) -> bool:
        return await _compat.run_blocking(
            self.store.settle_delivery, name, token, outcome, retry_in
        )

    async def pending_deliveries(self) -> int:
        return await _compat.run_blocking(self.store.pending_deliveries)

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
        return await _compat.run_blocking(
            self._rates.acquire, name, holder, rate, per, burst, enqueue, grace, priority, ageing
        )

    async def rate_leave(self, name: str, holder: str) -> bool:
        return await _compat.run_blocking(self._rates.leave, name, holder)

    async def rate_status(self, name: str) -> RateStatus:
        return await _compat.run_blocking(self._rates.status, name)

    async def release(self, name: str, holder: str, token: int | None) -> bool:
        return await _compat.run_blocking(self.store.release, name, holder, token)

    async def renew(self, name: str, holder: str, token: int, ttl: float) -> Grant | None:
        return await _compat.run_blocking(self.store.renew, name, holder, token, ttl)

    async def set_limit(self, name: str, limit: int) -> int | None:
        return await _compat.run_blocking(self.store.set_limit, name, limit)

    async def status(self, name: str) -> Status:
        return await _compat.run_blocking(self.store.status, name)

    async def names(self, prefix: str, max_count: int) -> list[str]:
        return await _compat.run_blocking(self.store.names, prefix, max_count)

    async def open_waiter(self, name: str, holder: str) -> AsyncSQLiteWaiter:
        return AsyncSQLiteWaiter(self.store, name, holder)

    async def ping(self) -> None:
        await _compat.run_blocking(self.store.ping)

    async def close(self) -> None:
        if self._queues is not None:
            self._queues.close()
        self.store.close()


async def open_backend(url: str, parts: SplitResult) -> AsyncSQLiteBackend:
    path = parse_path(parts.path)
    store = await _compat.run_blocking(SQLiteStore, path)
    return AsyncSQLiteBackend(store)
