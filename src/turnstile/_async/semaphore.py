"""Fair leased semaphores and locks, written once over the backend protocol.

A :class:`AsyncLock` is an :class:`AsyncSemaphore` with ``limit=1``: one code path.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Coroutine, Generator
from dataclasses import dataclass
from types import TracebackType
from typing import Any

from .._core import callbacks, telemetry, timing, validate
from .._core.records import AcquireResult, Grant, Status
from ..errors import AcquireTimeout, BackendUnavailable, InvalidArgument, LeaseLost
from . import _compat
from .backends.protocol import AsyncBackend, AsyncWaiter
from .rate_limit import AsyncRateLimit
from .renewer import AsyncRenewer, renewer_for

log_acquire = logging.getLogger("turnstile.lock.acquire")
log_release = logging.getLogger("turnstile.lock.release")
log_renew = logging.getLogger("turnstile.lock.renew")


class AsyncLease:
    """A grant: at most ``limit`` unexpired leases exist on a name at any store instant.

    Use it as a context manager to keep it renewed (every ``ttl/3``) while the block runs and
    released when it ends. If the lease is lost anyway (the process was paused or cut off
    past its ``ttl`` and someone else was granted the name), :attr:`lost` turns true,
    ``on_lost`` is called, and leaving the block raises :class:`~turnstile.LeaseLost`: work
    done in the block may have overlapped with the next holder, whose :attr:`token` is larger.
    """

    # One is made per acquire: fixed slots make it cheaper to build and to read.
    __slots__ = (
        "__weakref__",
        "_backend",
        "_claiming",
        "_deadline",
        "_lost",
        "_on_lost",
        "_released",
        "_renew_seq",
        "_renewer",
        "_renewing",
        "acquired_at",
        "expires_at",
        "holder",
        "name",
        "started_at",
        "token",
        "ttl",
    )

    def __init__(
        self,
        backend: AsyncBackend,
        grant: Grant,
        *,
        ttl: float,
        local_deadline: float,
        on_lost: Callable[[AsyncLease], object] | None = None,
    ) -> None:
        self._backend = backend
        self.name = grant.name
        self.holder = grant.holder
        self.token = grant.token
        self.acquired_at = grant.acquired_at
        self.expires_at = grant.expires_at
        self.ttl = ttl
        # Local monotonic time by which the store will have expired this lease unless renewed.
        # Computed from the send time of the request that set the expiry, so it is never late.
        self._deadline = local_deadline
        self._lost = False
        self._released = False
        self._on_lost = on_lost
        # Set while the backend's renewer has this lease in its heap (its heap entry's seq).
        self._renew_seq: int | None = None
        self._renewer: AsyncRenewer | None = None  # the renewer it was given to, if any
        self._renewing = False  # inside a with-block: the renewer keeps it renewed
        # An unclaimed grant (handed over with the wake-up, lasting only wait_ttl) that the
        # renewer is to claim for the full ttl once, with or without a with-block.
        self._claiming = False
        #: A semaphore with a rate: when the rate admitted this holder's start (store clock).
        self.started_at: float | None = None

    def __repr__(self) -> str:
        state = "lost" if self.lost else "released" if self._released else "held"
        return f"<Lease name={self.name!r} holder={self.holder!r} token={self.token} {state}>"

    @property
    def lost(self) -> bool:
        """True once this holder may no longer hold the name (expired, taken over, or not
        renewed in time). Never true while the lease is provably held."""
        if not self._lost and not self._released and time.monotonic() >= self._deadline:
            self._mark_lost("its ttl passed without a successful renewal")
        return self._lost

    @property
    def remaining(self) -> float:
        """Seconds left before the lease expires unless renewed (local, conservative)."""
        return max(0.0, self._deadline - time.monotonic())

    def _mark_lost(self, why: str) -> None:
        if self._lost or self._released:
            return
        self._lost = True
        log_renew.warning("lease on %r (token %d) lost: %s", self.name, self.token, why)
        telemetry.lease_lost(self.name, self.token, why)
        if self._on_lost is not None:
            try:
                self._on_lost(self)
            except Exception:  # a user callback must not kill the renewer
                log_renew.exception("on_lost callback failed")

    async def renew(self, ttl: float | None = None) -> None:
        """Extend the lease to ``ttl`` (default: its own) from now, on the store's clock.

        Raises :class:`~turnstile.LeaseLost` if the lease is gone (expired and possibly taken
        over, or released)."""
        new_ttl = self.ttl if ttl is None else validate.ttl(ttl)
        if self._lost or self._released:
            raise LeaseLost(f"lease on {self.name!r} (token {self.token}) is no longer held")
        sent = time.monotonic()
        grant = await self._backend.renew(self.name, self.holder, self.token, new_ttl)
        if grant is None:
            self._mark_lost("the store no longer has it")
            raise LeaseLost(
                f"lease on {self.name!r} (token {self.token}) expired or was taken over"
            )
        self.ttl = new_ttl
        self.expires_at = grant.expires_at
        self._deadline = sent + new_ttl

    async def release(self) -> bool:
        """Give the lease back and hand it to the next waiter. Idempotent; a stale lease can
        never release a newer grant. Returns whether this call released it."""
        self._stop_renewing()
        if self._released:
            return False
        # A renewal still in flight is refused by the store or ignored: it can neither
        # resurrect the lease nor mark it lost once it is released.
        self._released = True
        released = await self._backend.release(self.name, self.holder, self.token)
        log_release.debug("released %r token %d: %s", self.name, self.token, released)
        return released

    def _stop_renewing(self) -> None:
        if self._renewing or self._claiming:
            self._renewing = self._claiming = False
            if self._renewer is not None:
                self._renewer.discard(self)  # the renewer that has it

    def _renew_in(self, delay: float) -> None:
        """Hand this lease to the backend's renewer, first due in ``delay`` seconds; it is
        the renewer :meth:`_stop_renewing` then takes it back from."""
        self._renewer = renewer_for(self._backend)
        self._renewer.add(self, delay)

    def _wants_renewal(self) -> bool:
        return (self._renewing or self._claiming) and not self._released and not self._lost

    def _claim_soon(self) -> None:
        """Extend a grant that was handed over with its wake-up, and so lasts only the
        waiter's ``wait_ttl`` (a waiter that died must not stall the line for a whole ttl),
        to the full ``ttl``: one renewal by the renewer, off the hand-over's path, with or
        without a with-block. Until it lands, :attr:`remaining` tells the truth (the shorter
        lease)."""
        self._claiming = True
        # When a third of the short lease has passed, like any renewal: a short critical
        # section ends (and releases) before that, and then costs no claim at all.
        self._renew_in((self.expires_at - self.acquired_at) * timing.RENEW_FRACTION)

    async def _renew_step(self) -> float | None:
        """One turn of the backend's renewer: renew if still wanted. Returns the seconds
        until the next turn, or None to stop renewing this lease."""
        if not self._wants_renewal() or self.lost:
            return None
        interval = self.ttl * timing.RENEW_FRACTION
        try:
            await self.renew()
        except LeaseLost:
            return None
        except BackendUnavailable as exc:
            log_renew.warning("renewing %r failed, will retry: %s", self.name, exc)
            # Retry sooner; once the local deadline passes, `lost` reports it.
            return min(interval / 4, self.remaining)
        except Exception:  # never let the renewer die silently
            log_renew.exception("unexpected error renewing %r", self.name)
        self._claiming = False
        return self.ttl * timing.RENEW_FRACTION if self._renewing else None

    async def __aenter__(self) -> AsyncLease:
        if not self._renewing and not self._released:
            self._renewing = True
            if not self._claiming:  # else the claim's renewal schedules the next ones
                self._renew_in(self.ttl * timing.RENEW_FRACTION)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        lost = self.lost
        try:
            await self.release()
        except BackendUnavailable:
            if exc is None and not lost:
                raise
        if lost and exc is None:
            raise LeaseLost(
                f"lease on {self.name!r} (token {self.token}) was lost while the block ran; "
                "its work may have overlapped with a newer holder"
            )


@dataclass(frozen=True)
class AsyncTicket:
    """The answer to :meth:`AsyncSemaphore.try_acquire`.

    ``acquired`` with ``lease`` set, or ``position`` in line (0 = next). Asking again with the
    same holder keeps the place; a place not asked about within ``wait_ttl`` lapses.
    """

    acquired: bool
    position: int | None
    lease: AsyncLease | None
    #: The store's clock when it answered (seconds since the epoch).
    now: float | None = None
    #: Seconds until the earliest current lease expires, when not acquired (a hint for when
    #: to ask again if no hand-over wakes the caller first).
    retry_after: float | None = None


# unasync: async-only
class _AcquireContext(Coroutine[Any, Any, AsyncLease]):
    """What ``acquire()`` returns in the async API: await it for a lease, use it directly as
    ``async with sem.acquire(timeout=5) as lease:``, or hand it to ``asyncio.create_task``
    like any coroutine."""

    def __init__(self, coro: Coroutine[Any, Any, AsyncLease]) -> None:
        self._coro = coro
        self._lease: AsyncLease | None = None

    def __await__(self) -> Generator[Any, None, AsyncLease]:
        return self._coro.__await__()

    def send(self, value: Any) -> Any:
        return self._coro.send(value)

    def throw(self, *args: Any) -> Any:
        return self._coro.throw(*args)

    def close(self) -> None:
        self._coro.close()

    async def __aenter__(self) -> AsyncLease:
        self._lease = await self._coro
        return await self._lease.__aenter__()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        assert self._lease is not None
        await self._lease.__aexit__(exc_type, exc, tb)


# unasync: end


class AsyncSemaphore:
    """At most ``limit`` holders of ``name`` at a time; waiters granted in arrival order.

    Every grant is a lease with a ``ttl`` on the store's clock and a fencing token larger than
    any earlier token on the name. Objects are cheap handles: create them freely, from any
    process. The only state one keeps is the leases of its ``async with sem:`` blocks that
    are running, one per task (thread, in the sync API).

    ``async with sem as lease:`` (sync: ``with sem as lease:``) waits in line up to the
    semaphore's ``timeout`` (default ``None``: without a time limit, like ``threading.Lock``),
    keeps the lease renewed while the block runs and releases it when the block ends, exactly
    as ``async with sem.acquire(timeout) as lease:``. One object may be shared by many tasks
    or threads, each taking its own lease; the same task entering the same object again
    before leaving it raises :class:`~turnstile.InvalidArgument` (leases are not re-entrant:
    a lock would wait for itself).
    """

    def __init__(
        self,
        backend: AsyncBackend,
        name: str,
        limit: int,
        ttl: float = 30.0,
        *,
        on_lost: Callable[[AsyncLease], object] | None = None,
        timeout: float | None = None,
        priority: int = 0,
        ageing: float | bool | None = None,
        rate: int | None = None,
        per: float = 1.0,
        burst: int = 1,
    ) -> None:
        self._backend = backend
        self.name = validate.name(name)
        self.limit = validate.limit(limit)
        # With a rate, a grant is also a *start*: the holder then waits, keeping its slot
        # (renewed), for the admission of the name's rate limit (rate_limit.py), so at most
        # `limit` hold at once and at most `rate + burst` start in any window of `per`.
        self._starts = (
            None
            if rate is None
            else AsyncRateLimit(backend, name, rate, per, burst, priority=priority, ageing=ageing)
        )
        self.ttl = validate.ttl(ttl)
        self.timeout = validate.timeout(timeout)
        self.priority = validate.priority(priority)
        self.ageing = validate.ageing(ageing)
        # A member of a semaphore group (group.py): the key it asks for, and the group's
        # per-key limit (``limit`` is then the group's total).
        self._key: str | None = None
        self._per_key: int | None = None
        self._on_lost = on_lost
        # The leases of `async with sem:` blocks running now, by task (sync: by thread).
        self._held: dict[object, AsyncLease] = {}

    def __repr__(self) -> str:
        rate = ""
        if self._starts is not None:
            starts = self._starts
            rate = f" rate={starts.rate} per={starts.per:g} burst={starts.burst}"
        return (
            f"<{type(self).__name__} name={self.name!r} limit={self.limit} ttl={self.ttl}{rate}>"
        )

    def _lease(self, result: AcquireResult, sent: float) -> AsyncLease:
        assert result.grant is not None
        return AsyncLease(
            self._backend,
            result.grant,
            ttl=self.ttl,
            local_deadline=sent + (result.grant.expires_at - result.now),
            on_lost=self._on_lost,
        )

    def _handed(
        self, waiter: AsyncWaiter, result: AcquireResult, sent: float, wait_ttl: float
    ) -> AsyncLease | None:
        """The lease a wake-up handed over with the grant in it (see ``AsyncWaiter.handed``),
        or None: the caller then looks with an acquire step as usual."""
        if result.wait_id is None:
            return None
        grant = waiter.handed(result.wait_id)
        if grant is None:
            return None
        # The store's clock read `result.now` after we sent that step at `sent`, so it reaches
        # `expires_at` no earlier than this (never late, like every local deadline).
        deadline = sent + (grant.expires_at - result.now)
        if deadline - time.monotonic() < (grant.expires_at - grant.acquired_at) / 2:
            # We were slow to look (paused, or descheduled for long): claim it with a step
            # rather than start on a lease that may be nearly over.
            return None
        lease = AsyncLease(
            self._backend, grant, ttl=self.ttl, local_deadline=deadline, on_lost=self._on_lost
        )
        if wait_ttl < self.ttl:
            lease._claim_soon()
        return lease

    def _priority(self, priority: int | None) -> int:
        return self.priority if priority is None else validate.priority(priority)

    async def _step(
        self, holder: str, wait_ttl: float, enqueue: bool, priority: int = 0, private: bool = False
    ) -> tuple[AcquireResult, float]:
        sent = time.monotonic()
        result = await self._backend.acquire(
            self.name,
            holder,
            limit=self.limit,
            ttl=self.ttl,
            wait_ttl=wait_ttl,
            enqueue=enqueue,
            priority=priority,
            ageing=self.ageing,
            key=self._key,
            per_key=self._per_key,
            private=private,
        )
        return result, sent

    async def _leave(self, holder: str) -> None:
        # Drops our waiting entry and any grant handed to us meanwhile; harmless if neither.
        with contextlib.suppress(BackendUnavailable):
            await self._backend.release(self.name, holder, None)

    async def _acquire(
        self, timeout: float | None, holder: str | None, priority: int | None = None
    ) -> AsyncLease:
        if self._starts is None:
            return await self._acquire_slot(timeout, holder, priority)
        timeout = validate.timeout(timeout)
        began = time.monotonic()
        lease = await self._acquire_slot(timeout, holder, priority)
        left = None if timeout is None else max(0.0, timeout - (time.monotonic() - began))
        return await self._start(lease, left, priority)

    async def _start(
        self, lease: AsyncLease, timeout: float | None, priority: int | None
    ) -> AsyncLease:
        """Hold ``lease`` (renewed meanwhile) until the rate admits its start; on a timeout
        or any failure, give the slot back."""
        assert self._starts is not None
        renewing = lease._renewing
        if not renewing:
            await lease.__aenter__()  # keep the slot while waiting for the start
        try:
            lease.started_at = await self._starts.acquire(timeout, lease.holder, priority=priority)
        except BaseException:
            with contextlib.suppress(BackendUnavailable):
                await lease.release()
            raise
        finally:
            if not renewing:
                lease._stop_renewing()
        return lease

    async def _acquire_slot(
        self, timeout: float | None, holder: str | None, priority: int | None = None
    ) -> AsyncLease:
        timeout = validate.timeout(timeout)
        # A holder made here is this call's own: nobody else names it, so the store need not
        # find its waiting entry by holder alone (see Backend.acquire, ``private``).
        private = holder is None
        holder = timing.default_holder() if holder is None else validate.holder(holder)
        rank = self._priority(priority)
        wait_ttl = timing.blocking_wait_ttl(self.ttl)
        deadline = None if timeout is None else time.monotonic() + timeout
        waiter = None
        track = telemetry.acquire(self.name, self.limit)
        try:
            if timeout != 0 and self._backend.characteristics.cheap_waiters:
                # Arming costs nothing here: arm before the first step, so no hand-over can
                # slip past it and no second look is needed.
                waiter = await self._backend.open_waiter(self.name, holder)
            # Inside the try: a step interrupted (cancelled) after the store applied it must
            # not leave a lease or a place in line behind.
            result, sent = await self._step(holder, wait_ttl, True, rank, private)
            if result.grant is not None:
                log_acquire.debug(
                    "acquired %r token %d at once", self.name, result.grant.token
                )
                track.granted(result.grant.token)
                return self._lease(result, sent)
            if timeout != 0:
                # The store put us in line: a grant from here on is a hand-over, even one the
                # second look below finds (it may follow a release made in between).
                track.joined(result.position)
                if waiter is None:
                    # Arm the wake-up channel, then look again: no hand-over can slip between.
                    # A channel that keeps wake-ups sent before it was opened (a Redis list)
                    # needs no second look: the first step's answer stands until it wakes.
                    waiter = await self._backend.open_waiter(self.name, holder)
                    if not self._backend.characteristics.keeps_early_wakeups:
                        result, sent = await self._step(holder, wait_ttl, True, rank, private)
                if result.grant is None:
                    # The store has confirmed our place in line (benchmarks time it, via the
                    # extra field, to check FIFO order without guessing).
                    log_acquire.debug(
                        "waiting for %r at position %s",
                        self.name,
                        result.position,
                        extra={"turnstile_position": result.position},
                    )
                    track.joined(result.position)
                while True:
                    if result.grant is not None:
                        log_acquire.debug("acquired %r token %d", self.name, result.grant.token)
                        track.granted(result.grant.token)
                        return self._lease(result, sent)
                    now = time.monotonic()
                    if deadline is not None and now >= deadline:
                        break
                    delay = timing.heartbeat(wait_ttl)
                    if result.retry_after is not None:
                        delay = min(delay, result.retry_after + timing.EXPIRY_SLACK)
                    if deadline is not None:
                        delay = min(delay, deadline - now)
                    await waiter.wait(delay)
                    lease = self._handed(waiter, result, sent, wait_ttl)
                    if lease is not None:
                        log_acquire.debug("handed %r token %d", self.name, lease.token)
                        track.granted(lease.token, woken_with_grant=True)
                        return lease
                    result, sent = await self._step(holder, wait_ttl, True, rank, private)
        except BaseException as exc:
            track.failed(exc)
            await self._leave(holder)
            raise
        finally:
            if waiter is not None:
                await waiter.close()
        track.timed_out()
        await self._leave(holder)
        raise AcquireTimeout(
            f"{self.name!r} was not granted within {timeout:g} s (limit {self.limit})"
        )

    # unasync: async-only
    def acquire(
        self,
        timeout: float | None = None,
        holder: str | None = None,
        *,
        priority: int | None = None,
    ) -> _AcquireContext:
        """Wait in line for a lease (``timeout=None``: without a time limit).

        Waiters are granted by priority (larger first; default: the object's ``priority``),
        in the order they first asked within a level; a waiter is woken by the store when the
        grant is handed to it. Raises :class:`~turnstile.AcquireTimeout` (and leaves the
        line) when ``timeout`` passes. ``holder`` defaults to an id unique to this call.
        Await it for the lease, or use it as ``async with sem.acquire() as lease:``."""
        return _AcquireContext(self._acquire(timeout, holder, priority))

    # unasync: end
    # unasync: sync-only
    # def acquire(
    #     self,
    #     timeout: float | None = None,
    #     holder: str | None = None,
    #     *,
    #     priority: int | None = None,
    # ) -> Lease:
    #     """Wait in line for a lease (``timeout=None``: without a time limit).
    #
    #     Waiters are granted by priority (larger first; default: the object's ``priority``),
    #     in the order they first asked within a level; a waiter is woken by the store when the
    #     grant is handed to it. Raises :class:`~turnstile.AcquireTimeout` (and leaves the
    #     line) when ``timeout`` passes. ``holder`` defaults to an id unique to this call.
    #     Use the lease as ``with sem.acquire() as lease:`` to keep it renewed."""
    #     return self._acquire(timeout, holder, priority)
    # unasync: end

    async def acquire_nowait(self, holder: str | None = None) -> AsyncLease:
        """Take a free slot now, only if nobody is waiting; else raise
        :class:`~turnstile.AcquireTimeout` without joining the line."""
        holder = timing.default_holder() if holder is None else validate.holder(holder)
        try:
            result, sent = await self._step(holder, timing.blocking_wait_ttl(self.ttl), False)
        except BaseException:
            await self._leave(holder)  # interrupted after the store granted: give it back
            raise
        if result.grant is None:
            raise AcquireTimeout(f"{self.name!r} is at its limit ({self.limit}) or has waiters")
        lease = self._lease(result, sent)
        if self._starts is not None:
            return await self._start(lease, 0, None)  # its start too, now or never
        return lease

    async def try_acquire(
        self,
        holder: str,
        wait_ttl: float | None = None,
        *,
        enqueue: bool = True,
        callback: callbacks.Callback | None = None,
        priority: int | None = None,
    ) -> AsyncTicket:
        """Ask once, never block: hold, or join the line (first call) and learn the position.

        Idempotent per ``holder``: asking again keeps the place and, once granted, returns the
        same lease. The place lapses if not asked about again within ``wait_ttl`` (default:
        the semaphore's ``ttl``). With ``enqueue=False`` a free slot is taken only if nobody
        waits, and the line is not joined (``position`` is then None). Release with
        :meth:`release` from any process; block between steps with :meth:`wait`.

        With ``callback`` (:class:`~turnstile.StepFunctionsCallback` or
        :class:`~turnstile.HttpCallback`) nobody needs to ask again: the grant, now or
        whenever the caller's turn comes, is delivered there by a deliverer
        (:class:`~turnstile.Deliverer`, ``turnstile serve``, ``turnstile bridge sqs``), at
        least once, with the lease as ``{"name", "holder", "token", "expires_at", "limit"}``.
        The place then lasts ``wait_ttl`` (default one day) without asking again; asking again
        with the same callback is harmless, with another one delivers the grant there too.

        ``priority`` (default: the object's) places a new entry in line: larger first, FIFO
        within a level; asking again keeps the place it has."""
        holder = validate.holder(holder)
        rank = self._priority(priority)
        if not isinstance(enqueue, bool):
            raise InvalidArgument("enqueue must be true or false")
        if callback is not None and self._starts is not None:
            raise InvalidArgument(
                "a semaphore with a rate takes no callback: its grants wait for their start "
                "on the caller's side (ask without a rate, or use try_acquire and ask again)"
            )
        if callback is not None:
            checked = callbacks.check(callback)
            if not enqueue:
                raise InvalidArgument("a callback waits in line: enqueue=False is not allowed")
            wait = (
                callbacks.DEFAULT_WAIT if wait_ttl is None else validate.ttl(wait_ttl, "wait_ttl")
            )
            sent = time.monotonic()
            result = await self._backend.acquire_callback(
                self.name,
                holder,
                limit=self.limit,
                ttl=self.ttl,
                wait_ttl=wait,
                callback=callbacks.encode(checked),
                priority=rank,
                ageing=self.ageing,
                key=self._key,
                per_key=self._per_key,
            )
            if result.grant is not None:
                return AsyncTicket(True, None, self._lease(result, sent), result.now, None)
            return AsyncTicket(False, result.position, None, result.now, result.retry_after)
        wait = self.ttl if wait_ttl is None else validate.ttl(wait_ttl, "wait_ttl")
        result, sent = await self._step(holder, wait, enqueue, rank)
        if result.grant is not None:
            lease = self._lease(result, sent)
            if self._starts is not None:
                return await self._start_ticket(lease, result.now, wait, rank)
            return AsyncTicket(True, None, lease, result.now, None)
        return AsyncTicket(False, result.position, None, result.now, result.retry_after)

    async def _start_ticket(
        self, lease: AsyncLease, now: float, wait_ttl: float, priority: int
    ) -> AsyncTicket:
        """A ticket's start under the rate: admitted (the lease is the caller's), or the slot
        is kept (its lease renewed to the full ttl, as long as the place in the rate's line
        lasts) and the caller asks again in ``retry_after`` seconds, at position 0."""
        assert self._starts is not None
        start = await self._starts.try_acquire(lease.holder, wait_ttl, priority=priority)
        if start.acquired:
            lease.started_at = start.now
            return AsyncTicket(True, None, lease, now, None)
        await lease.renew()
        return AsyncTicket(False, 0, None, start.now, start.retry_after)

    async def renew(self, holder: str, token: int, ttl: float | None = None) -> AsyncLease:
        """Extend ``holder``'s lease with fencing ``token`` to ``ttl`` (default: the
        semaphore's) from now, on the store's clock, from any process (the lease object that
        was granted need not be at hand). Returns the renewed lease (not kept renewed).

        Raises :class:`~turnstile.LeaseLost` if that lease expired or was taken over."""
        holder = validate.holder(holder)
        checked = validate.token(token)
        if checked is None:
            raise InvalidArgument("token is required to renew a lease")
        new_ttl = self.ttl if ttl is None else validate.ttl(ttl)
        sent = time.monotonic()
        grant = await self._backend.renew(self.name, holder, checked, new_ttl)
        if grant is None:
            raise LeaseLost(
                f"the lease on {self.name!r} (token {checked}) expired or was taken over"
            )
        return AsyncLease(
            self._backend, grant, ttl=new_ttl, local_deadline=sent + new_ttl, on_lost=self._on_lost
        )

    async def wait(self, holder: str, timeout: float) -> bool:
        """Block until a hand-over wakes ``holder`` (a waiter placed in line by
        :meth:`try_acquire`), or ``timeout`` seconds pass. True if woken, or if ``holder``
        already holds a lease (answered at once); False on timeout.

        It neither joins nor keeps a place in line (the :meth:`try_acquire` steps do), and a
        True answer is a hint: the next :meth:`try_acquire` step is what grants."""
        holder = validate.holder(holder)
        timeout = validate.seconds(timeout, "timeout")
        waiter = await self._backend.open_waiter(self.name, holder)
        try:
            # Armed first, then look: a hand-over made before the arming shows in the status,
            # one made after it wakes the waiter; none slips between.
            found = await self._backend.status(self.name)
            if any(h.holder == holder for h in found.holders):
                return True
            return await waiter.wait(timeout)
        finally:
            await waiter.close()

    async def release(self, holder: str, token: int | None = None) -> bool:
        """Release ``holder``'s lease (only the one with ``token``, if given) and, without a
        token, its place in line. From any process; repeating it is harmless."""
        released = await self._backend.release(
            self.name, validate.holder(holder), validate.token(token)
        )
        log_release.debug("release %r by %r: %s", self.name, holder, released)
        return released

    async def status(self) -> Status:
        """Holders (with tokens and times) and waiters in order, on the store's clock."""
        status = await self._backend.status(self.name)
        if status.limit is None:
            status = Status(
                status.name,
                self.limit,
                status.holders,
                status.waiters,
                status.now,
                per_key=self._per_key,
            )
        return status

    async def locked(self) -> bool:
        """Whether every slot is taken right now (under the name's limit, which may differ
        from this object's after a :meth:`set_limit` elsewhere)."""
        status = await self.status()
        return status.free == 0

    async def set_limit(self, limit: int) -> int | None:
        """Change the limit of the name, atomically on the store, for the next grants.

        A name has one limit while it has holders or waiters (an acquire naming another one
        is refused with :class:`~turnstile.InvalidArgument`); this is the way to change it.
        Raising it grants waiters at once, in line order; lowering it never revokes a held
        lease: nobody more is granted until fewer than ``limit`` hold. This object's own
        ``limit`` becomes ``limit`` too.

        Returns the limit replaced, or ``None`` when the name is idle: an idle name keeps no
        state, and its next acquire sets its limit (this object's, from now on)."""
        limit = validate.limit(limit)
        previous = await self._backend.set_limit(self.name, limit)
        self.limit = limit
        log_acquire.debug("set_limit %r: %s -> %d", self.name, previous, limit)
        return previous

    async def __aenter__(self) -> AsyncLease:
        owner = _compat.current_owner()
        if owner in self._held:
            raise InvalidArgument(
                f"this {type(self).__name__} object for {self.name!r} is already held by the "
                "running block of this task: leases are not re-entrant; take a second one "
                "with acquire(), or use the object once per block"
            )
        lease = await self._acquire(self.timeout, None)
        self._held[owner] = lease
        return await lease.__aenter__()  # starts renewing; cannot fail

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        lease = self._held.pop(_compat.current_owner(), None)
        if lease is None:
            raise InvalidArgument(
                f"this {type(self).__name__} object for {self.name!r} is not held by this task"
            )
        await lease.__aexit__(exc_type, exc, tb)


class AsyncLock(AsyncSemaphore):
    """At most one holder of ``name`` at a time, granted in arrival order: a semaphore with
    ``limit=1``.

    Unlike a polling lock row, a waiter is handed the lock by the release that frees it, in
    the order waiters first asked; a crashed holder's lease lapses after ``ttl``."""

    def __init__(
        self,
        backend: AsyncBackend,
        name: str,
        ttl: float = 30.0,
        *,
        on_lost: Callable[[AsyncLease], object] | None = None,
        timeout: float | None = None,
        priority: int = 0,
        ageing: float | bool | None = None,
    ) -> None:
        super().__init__(
            backend,
            name,
            1,
            ttl,
            on_lost=on_lost,
            timeout=timeout,
            priority=priority,
            ageing=ageing,
        )

    def __repr__(self) -> str:
        return f"<{type(self).__name__} name={self.name!r} ttl={self.ttl}>"

    async def set_limit(self, limit: int) -> int | None:
        """Refused: a lock is a semaphore of one, and its name's limit is always 1 while it
        holds or waits. To let more in, use ``client.semaphore(name, limit=1)`` and its
        :meth:`AsyncSemaphore.set_limit` (every lock holder must then expect company)."""
        raise InvalidArgument(
            f"a Lock always has limit 1; to change the limit of {self.name!r} use "
            f"client.semaphore({self.name!r}, limit=1).set_limit({limit!r})"
        )
