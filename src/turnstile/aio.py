"""The async API: every name of :mod:`turnstile`, awaited.

import turnstile.aio
client = await turnstile.aio.connect()
async with client.lock("order:42", ttl=30).acquire(timeout=60) as lease:
    ...
"""

from __future__ import annotations

from typing import Any

from ._async.client import AsyncClient
from ._async.client import connect as _connect
from ._async.group import AsyncSemaphoreGroup
from ._async.queue import AsyncMessage, AsyncQueue
from ._async.rate_limit import AsyncRateLimit, AsyncRateTicket
from ._async.semaphore import AsyncLease, AsyncLock, AsyncSemaphore, AsyncTicket
from ._core.callbacks import HttpCallback, StepFunctionsCallback
from ._core.callbacks import verify as verify_signature
from ._core.records import (
    Characteristics,
    DeadLetter,
    HolderInfo,
    KeyDepth,
    QueueStats,
    RateStatus,
    Status,
    WaiterInfo,
    WorkResult,
)
from ._core.validate import MAX_PAYLOAD_BYTES
from .errors import (
    AccessDenied,
    AcquireTimeout,
    BackendUnavailable,
    ConfigurationError,
    InvalidArgument,
    LeaseLost,
    LimitConflict,
    NotSupported,
    TurnstileError,
)
from .workflows.deliverer import Deliverer

Client = AsyncClient
Lease = AsyncLease
Lock = AsyncLock
Message = AsyncMessage
Queue = AsyncQueue
RateLimit = AsyncRateLimit
RateTicket = AsyncRateTicket
Semaphore = AsyncSemaphore
SemaphoreGroup = AsyncSemaphoreGroup
Ticket = AsyncTicket

__all__ = [
    "MAX_PAYLOAD_BYTES",
    "AccessDenied",
    "AcquireTimeout",
    "AsyncClient",
    "AsyncLease",
    "AsyncLock",
    "AsyncMessage",
    "AsyncQueue",
    "AsyncRateLimit",
    "AsyncRateTicket",
    "AsyncSemaphore",
    "AsyncSemaphoreGroup",
    "AsyncTicket",
    "BackendUnavailable",
    "Characteristics",
    "Client",
    "ConfigurationError",
    "DeadLetter",
    "Deliverer",
    "HolderInfo",
    "HttpCallback",
    "InvalidArgument",
    "KeyDepth",
    "Lease",
    "LeaseLost",
    "LimitConflict",
    "Lock",
    "Message",
    "NotSupported",
    "Queue",
    "QueueStats",
    "RateLimit",
    "RateStatus",
    "RateTicket",
    "Semaphore",
    "SemaphoreGroup",
    "Status",
    "StepFunctionsCallback",
    "Ticket",
    "TurnstileError",
    "WaiterInfo",
    "WorkResult",
    "connect",
    "verify_signature",
]


async def connect(url: str | None = None, **options: Any) -> AsyncClient:
    """Async twin of :func:`turnstile.connect`."""
    return await _connect(url, **options)


def __dir__() -> list[str]:
    """``dir(turnstile.aio)`` lists the public API only."""
    return sorted(__all__)
