"""Every exception Turnstile raises derives from :class:`TurnstileError`.

Driver exceptions (redis-py, psycopg, sqlite3) never escape a backend: they are translated at
the backend boundary and kept as ``__cause__``.
"""

from __future__ import annotations

__all__ = [
    "AccessDenied",
    "AcquireTimeout",
    "BackendUnavailable",
    "ConfigurationError",
    "InvalidArgument",
    "LeaseLost",
    "LimitConflict",
    "NotSupported",
    "TurnstileError",
]


class TurnstileError(Exception):
    """Root of every Turnstile error."""


class ConfigurationError(TurnstileError):
    """A URL, option or missing optional dependency makes the client unusable.

    The message names the problem and the fix; passwords in URLs are never included.
    """


class InvalidArgument(TurnstileError, ValueError):
    """An argument is outside its accepted range. The message names it and the range."""


class LimitConflict(InvalidArgument):
    """An acquire named another limit than the one of a name in use (with holders or
    waiters): a name has one limit. The message names the name, its limit, and how to change
    it (``Semaphore.set_limit``, ``POST /v1/semaphores/limit``, ``turnstile limit``).
    Nothing was granted and the caller is not in line. ``current`` and ``asked`` are the
    name's limit and the one the call named (``None`` where the store did not say)."""

    def __init__(self, message: str, current: int | None = None, asked: int | None = None):
        super().__init__(message)
        self.current = current
        self.asked = asked


class BackendUnavailable(TurnstileError):
    """The store cannot be reached or did not answer. Retrying later may succeed."""


class AcquireTimeout(TurnstileError, TimeoutError):
    """A grant was not obtained within ``timeout`` (``acquire_nowait``: not at once).

    The caller has left the line: no waiting entry is left behind.
    """


class LeaseLost(TurnstileError):
    """A lease expired or was taken over while its holder still ran.

    Raised when a ``with`` block ends on a lease that was lost: whatever the block wrote to a
    protected resource may have overlapped with a newer holder (whose fencing token is larger).
    """


class NotSupported(TurnstileError):
    """The backend cannot offer this feature (see ``client.characteristics``)."""


class AccessDenied(TurnstileError, PermissionError):
    """The credentials in use may not do this (e.g. an HTTP service token limited to other
    name prefixes, or read-only). The message says which permission is missing."""
