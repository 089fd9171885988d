"""Turnstile: fair leased locks, semaphores and keyed FIFO queues for stateless workers.

    import turnstile
    client = turnstile.connect()                 # $TURNSTILE_URL, else the default file
    with client.lock("order:42", ttl=30).acquire(timeout=60) as lease:
        ...                                       # lease.token fences writes; auto-renewed

The async API mirrors every name under :mod:`turnstile.aio`.
"""

from __future__ import annotations

from typing import Any

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
from ._core.validate import MAX_NAME_BYTES, MAX_PAYLOAD_BYTES
from ._sync.client import Client
from ._sync.client import connect as _connect
from ._sync.group import SemaphoreGroup
from ._sync.queue import Message, Queue
from ._sync.rate_limit import RateLimit, RateTicket
from ._sync.semaphore import Lease, Lock, Semaphore, Ticket
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

__version__ = "0.1.0"

__all__ = [
    "MAX_NAME_BYTES",
    "MAX_PAYLOAD_BYTES",
    "AccessDenied",
    "AcquireTimeout",
    "BackendUnavailable",
    "Characteristics",
    "Client",
    "ConfigurationError",
    "DeadLetter",
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
    "__version__",
    "connect",
    "verify_signature",
]


def connect(url: str | None = None, **options: Any) -> Client:
    """Open a client for ``url``: ``memory://``, ``sqlite:///path``, ``redis://…``,
    ``redis+cluster://…``, ``postgresql://…``. Without a URL: ``$TURNSTILE_URL``, else one
    SQLite file per user and host (``$XDG_STATE_HOME/turnstile/turnstile.db``, by default
    ``~/.local/state/turnstile/turnstile.db``); an empty URL is refused. Fails at once,
    naming the fix, on an unknown scheme, a missing optional driver or an unreachable
    server."""
    return _connect(url, **options)


def __dir__() -> list[str]:
    """``dir(turnstile)`` lists the public API only, not the private modules it is built of."""
    return sorted(__all__)
