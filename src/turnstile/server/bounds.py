"""What bounds one instance's time and memory per client: the connection limit, the header
and body read timeouts, the memory all bodies being read may take together, and a log that
a storm of identical errors cannot flood.

* **Headers**: a connection must deliver a request's headers within ``header_timeout``
  seconds of opening (or of its previous answer, on a kept-alive connection), else it is
  closed. An idle kept-alive connection is closed after ``keep_alive`` seconds (uvicorn).
* **Bodies**: the whole body must arrive within ``body_timeout`` seconds of the headers
  (``408 request_timeout``), and all bodies being read at once may hold at most
  ``max_body_memory`` bytes; a request that would go beyond answers ``503 overloaded``
  with ``Retry-After`` at once (it holds nothing).
* **Connections**: beyond ``max_connections`` open connections, a new one is answered
  ``503 overloaded`` with ``Retry-After`` and closed; the default leaves half of the
  process's file descriptors (``ulimit -n``) to the store and the rest of the process.
"""

from __future__ import annotations

import asyncio
import json
import logging
import resource
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .errors import ApiError

if TYPE_CHECKING:
    from uvicorn.protocols.http.h11_impl import H11Protocol

OVERLOADED_RETRY_AFTER = "1"


def default_max_connections() -> int:
    """Half the file descriptors this process may open (the rest: the store's connections,
    the database files, wake-up sockets, the log), at least 16 and at most 10,000."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft <= 0:
        return 10_000
    return max(16, min(10_000, soft // 2))


def overloaded(message: str) -> ApiError:
    return ApiError("overloaded", message, {"Retry-After": OVERLOADED_RETRY_AFTER})


async def _answer_overloaded(scope: Any, receive: Any, send: Any) -> None:
    """The ASGI app a connection beyond the limit gets: 503 with Retry-After, then close."""
    body = json.dumps({"error": {
        "code": "overloaded",
        "message": "too many connections to this instance; retry later (or elsewhere)",
    }}).encode()
    await send({
        "type": "http.response.start",
        "status": 503,
        "headers": [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
            (b"retry-after", OVERLOADED_RETRY_AFTER.encode()),
            (b"connection", b"close"),
        ],
    })
    await send({"type": "http.response.body", "body": body, "more_body": False})


def protocol_class(*, header_timeout: float, max_connections: int) -> type[H11Protocol]:
    """uvicorn's HTTP/1.1 protocol with a header read timeout and a connection limit."""
    from uvicorn.protocols.http.h11_impl import H11Protocol

    class BoundedH11Protocol(H11Protocol):
        _header_timer: asyncio.TimerHandle | None = None
        _cycle_seen: object = None

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            if len(self.connections) > max_connections:
                self.app = _answer_overloaded  # this connection only: answered, then closed
            self._arm()

        def data_received(self, data: bytes) -> None:
            if self._header_timer is None and self._between_requests():
                self._arm()  # the first bytes of the next request on a kept-alive connection
            super().data_received(data)
            self._check_headers_done()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            self._check_headers_done()

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            super().connection_lost(exc)

        def _between_requests(self) -> bool:
            return self.cycle is None or self.cycle.response_complete

        def _check_headers_done(self) -> None:
            if self.cycle is not None and self.cycle is not self._cycle_seen:
                self._cycle_seen = self.cycle  # a request's headers arrived: stop the clock
                self._disarm()

        def _arm(self) -> None:
            self._disarm()
            self._header_timer = self.loop.call_later(header_timeout, self._headers_late)

        def _disarm(self) -> None:
            if self._header_timer is not None:
                self._header_timer.cancel()
                self._header_timer = None

        def _headers_late(self) -> None:
            self._header_timer = None
            if self._between_requests() and not self.transport.is_closing():
                self.logger.debug("closing a connection whose request headers were late")
                self.transport.close()

    return BoundedH11Protocol


class BodyBudget:
    """The bytes of request bodies being read at once, instance-wide, and their cap."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.used = 0

    def take(self, size: int) -> None:
        if self.used + size > self.capacity:
            raise overloaded(
                "this instance is reading as many request bodies as it may hold at once; "
                "retry later"
            )
        self.used += size

    def give(self, size: int) -> None:
        self.used -= size


class RepeatFilter(logging.Filter):
    """Lets the same message (logger, level and text) through at most ``burst`` times per
    ``window`` seconds; the next one after a quiet spell says how many were dropped. An
    error that repeats thousands of times a second (a full descriptor table) then costs a few
    lines, not megabytes."""

    def __init__(
        self,
        burst: int = 5,
        window: float = 10.0,
        max_keys: int = 1000,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__()
        self._clock = clock
        self.burst = burst
        self.window = window
        self.max_keys = max_keys
        self._seen: dict[tuple[str, int, str], list[float]] = {}  # key -> [start, count, dropped]

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            text = record.getMessage()
        except Exception:
            text = str(record.msg)
        key = (record.name, record.levelno, text[:500])
        now = self._clock()
        entry = self._seen.get(key)
        if entry is None or now - entry[0] >= self.window:
            dropped = int(entry[2]) if entry is not None else 0
            if len(self._seen) >= self.max_keys:
                self._seen.clear()
            self._seen[key] = [now, 1, 0]
            if dropped:
                record.msg = f"{text} (and {dropped} more like it in the last {self.window:g} s)"
                record.args = None
            return True
        entry[1] += 1
        if entry[1] <= self.burst:
            return True
        entry[2] += 1
        return False


def install_repeat_filter(
    logger_names: tuple[str, ...] = ("", "uvicorn", "uvicorn.error"),
) -> RepeatFilter:
    """Put one :class:`RepeatFilter` on every handler of these loggers (root included). The
    access log (``uvicorn.access``, its own handler) is left whole: one line per request."""
    repeat = RepeatFilter()
    for name in logger_names:
        for handler in logging.getLogger(name).handlers:
            if not any(isinstance(f, RepeatFilter) for f in handler.filters):
                handler.addFilter(repeat)
    return repeat
