"""Rate limits whose callers wait in line, written once over the backend protocol.

See :mod:`turnstile._core.rate_machine` for the algorithm (GCRA, a line in arrival order,
each waiter due at its slot). A blocking :meth:`AsyncRateLimit.acquire` sleeps until its slot
on the store's clock and asks once more: one step per admission, no polling.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass
from types import TracebackType

from .._core import timing, validate
from .._core.records import RateResult, RateStatus
from ..errors import AcquireTimeout, BackendUnavailable, InvalidArgument
from . import _compat
from .backends.protocol import AsyncBackend

# A blocking waiter's place lasts this long past its slot: it is asleep until then, and a
# busy machine may wake it a little late.
BLOCKING_GRACE = 5.0
# A try_acquire caller's place lasts this long past its slot unless it says otherwise.
DEFAULT_WAIT_TTL = 60.0
MAX_RATE = 1_000_000
MIN_PER = 0.001
MAX_PER = 30 * 24 * 3600.0


@dataclass(frozen=True)
class AsyncRateTicket:
    """The answer to :meth:`AsyncRateLimit.try_acquire`: ``acquired`` (admitted now), or the
    caller's ``position`` in line (0 = next; ``None`` if it did not join) and ``retry_after``,
    the seconds until its slot: ask again then, with the same holder, to be admitted."""

    acquired: bool
    position: int | None
    retry_after: float
    now: float


class AsyncRateLimit:
    """At most ``burst`` admissions at once from idle and at most ``rate + burst`` in any
    window of ``per`` seconds, by the store's clock; callers wait in line, in arrival order.

    ``await limiter.acquire(timeout=5)`` blocks until the caller is admitted;
    ``async with limiter:`` does the same (nothing to release: an admission is an instant).
    """

    def __init__(
        self,
        backend: AsyncBackend,
        name: str,
        rate: int,
        per: float = 1.0,
        burst: int = 1,
        *,
        timeout: float | None = None,
        priority: int = 0,
        ageing: float | bool | None = None,
    ) -> None:
        self._backend = backend
        self.name = validate.name(name)
        self.priority = validate.priority(priority)
        self.ageing = validate.ageing(ageing)
        self.rate = validate.count(rate, "rate", MAX_RATE)
        self.per = validate.seconds(per, "per", low=MIN_PER, high=MAX_PER)
        self.burst = validate.count(burst, "burst", MAX_RATE)
        self.timeout = validate.timeout(timeout)

    def __repr__(self) -> str:
        return (
            f"<{type(self).__name__} name={self.name!r} rate={self.rate} per={self.per:g} "
            f"burst={self.burst}>"
        )

    async def _step(
        self, holder: str, enqueue: bool, grace: float, priority: int
    ) -> tuple[RateResult, float]:
        result = await self._backend.rate_acquire(
            self.name,
            holder,
            rate=self.rate,
            per=self.per,
            burst=self.burst,
            enqueue=enqueue,
            grace=grace,
            priority=priority,
            ageing=self.ageing,
        )
        # Read after the reply: the store's clock read `now` before this, so sleeping
        # `retry_after` from here never wakes before the slot.
        return result, time.monotonic()

    def _priority(self, priority: int | None) -> int:
        return self.priority if priority is None else validate.priority(priority)

    async def acquire(
        self,
        timeout: float | None = None,
        holder: str | None = None,
        *,
        priority: int | None = None,
    ) -> float:
        """Wait in line until admitted (``timeout=None``: the limiter's own, else no limit).
        Returns the admission time on the store's clock. Raises
        :class:`~turnstile.AcquireTimeout` (and leaves the line) if the slot would come after
        ``timeout``. ``priority`` (default: the limiter's) places the caller in line: larger
        first, FIFO within a level; a caller passed by a higher priority learns its later
        slot when it comes back at its earlier one."""
        timeout = self.timeout if timeout is None else validate.timeout(timeout)
        rank = self._priority(priority)
        holder = timing.default_holder() if holder is None else validate.holder(holder)
        deadline = None if timeout is None else time.monotonic() + timeout
        joined = False
        try:
            while True:
                try:
                    result, received = await self._step(holder, True, BLOCKING_GRACE, rank)
                except BaseException as exc:
                    # A signal or a cancellation can land after the store placed us in line.
                    joined = joined or not isinstance(exc, Exception)
                    raise
                if result.admitted:
                    joined = False
                    return result.now
                joined = True
                wake = received + result.retry_after
                if deadline is not None and wake > deadline:
                    away = validate.seconds_text(round(result.retry_after, 3))
                    raise AcquireTimeout(
                        f"{self.name!r}: the next slot for this caller is {away} away, "
                        "past the timeout"
                    )
                await _compat.sleep(max(0.0, wake - time.monotonic()))
        finally:
            if joined:
                with contextlib.suppress(BackendUnavailable):
                    await self._backend.rate_leave(self.name, holder)

    async def try_acquire(
        self,
        holder: str,
        wait_ttl: float | None = None,
        *,
        enqueue: bool = True,
        priority: int | None = None,
    ) -> AsyncRateTicket:
        """Ask once, never block: admitted now, or join the line (first call) and learn when
        to ask again (``retry_after``). Idempotent per ``holder``: asking again keeps the
        place. The place lapses ``wait_ttl`` seconds (default 60) after its slot if the
        holder has not asked again by then. With ``enqueue=False`` the caller is admitted
        only if it conforms now and nobody waits, and does not join. ``priority`` (default:
        the limiter's) places a new entry in line."""
        holder = validate.holder(holder)
        rank = self._priority(priority)
        grace = DEFAULT_WAIT_TTL if wait_ttl is None else validate.ttl(wait_ttl, "wait_ttl")
        if not isinstance(enqueue, bool):
            raise InvalidArgument("enqueue must be true or false")
        result, _ = await self._step(holder, enqueue, grace, rank)
        return AsyncRateTicket(result.admitted, result.position, result.retry_after, result.now)

    async def leave(self, holder: str) -> bool:
        """Give up ``holder``'s place in line (harmless if it has none)."""
        return await self._backend.rate_leave(self.name, validate.holder(holder))

    async def status(self) -> RateStatus:
        """The rate, the line with each waiter's slot, and recent admission times."""
        return await self._backend.rate_status(self.name)

    async def __aenter__(self) -> float:
        return await self.acquire()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        return None
