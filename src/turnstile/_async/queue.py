"""The keyed FIFO queue, written once over the queue protocol (``backends/protocol.py``).

Work is recorded when it *arrives* and handed out in that order: one message per key in
flight (per-key order), many keys in parallel, optionally at most ``concurrency`` in flight
in all. Delivery is at least once: a message not acked within its visibility timeout is
delivered again, before later messages of its key. Semantics: ``_core/queue_machine.py``.
"""

from __future__ import annotations

import asyncio  # unasync: async-only
import logging
import secrets
import signal
import threading
import time
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

from .._core import queue_machine, records, telemetry, timing, validate
from .._core.payload import decode_payload, encode_payload
from .._core.records import DeadLetter, Delivery, QueueStats, WorkResult
from ..errors import BackendUnavailable, InvalidArgument
from . import _compat
from .backends.protocol import AsyncQueueBackend, AsyncQueueWaiter

log = logging.getLogger("turnstile.queue")

# While q.work waits for a message, it looks at its stop flag this often (a local check; the
# store is asked again only when it wakes the worker or a heartbeat is due).
STOP_CHECK = 0.1
# After a store error, a worker waits this long (doubling up to the max) before trying again.
ERROR_BACKOFF = 0.2
ERROR_BACKOFF_MAX = 5.0
# The most messages a worker of Queue.work claims in one step (its prefetch).
MAX_PREFETCH = 1000
# A blocking get on a backend that waits on the store's side asks for this long per call
# (the backend may cap it, e.g. at the HTTP service's longest long poll).
REMOTE_POLL = 30.0

# What work() runs per message: a coroutine function here, a plain function in the sync twin.
# unasync: async-only
Handler = Callable[["AsyncMessage"], Awaitable[Any]]
# unasync: end
# unasync: sync-only
# Handler = Callable[["AsyncMessage"], Any]
# unasync: end


class AsyncMessage:
    """One delivery of a message. Settle it with :meth:`ack` (done) or :meth:`nack` (failed:
    deliver again, after ``delay``); keep it invisible longer with :meth:`extend`.

    ``receipt`` identifies this delivery: another process can settle it with
    ``queue.ack(message.id, message.receipt)``. Once the visibility timeout has passed the
    receipt is stale and every settlement with it is refused (returns ``False``): the message
    is, or will be, delivered again with a new receipt. ``deadline`` is when that happens
    unless extended (store clock); ``attempt`` is 1 on the first delivery."""

    def __init__(self, queue: AsyncQueue, delivery: Delivery) -> None:
        self.queue = queue
        self.id = delivery.id
        self.key = delivery.key
        self.payload: Any = decode_payload(delivery.body, delivery.kind)
        self.attempt = delivery.attempt
        self.enqueued_at = delivery.enqueued_at
        self.receipt = delivery.receipt
        self.deadline = delivery.deadline
        self.settled = False
        self.lost = False
        # True while a settlement of it is under way: an extension that finds the receipt
        # stale meanwhile was overtaken by that settlement (Queue.work's extender).
        self._settling = False
        telemetry.queue_delivered(queue.name, self.id, self.attempt)

    def __repr__(self) -> str:
        return (
            f"<Message id={self.id!r} key={self.key!r} attempt={self.attempt} "
            f"queue={self.queue.name!r}>"
        )

    async def ack(self) -> bool:
        """Done: delete the message; the next message of its key can go. False if the
        receipt is stale (the message timed out and is or will be delivered again)."""
        self._settling = True
        try:
            ok = await self.queue.ack(self.id, self.receipt)
            self.settled = True
            self.lost = self.lost or not ok
        finally:
            self._settling = False
        return ok

    async def nack(self, delay: float = 0.0, error: str | None = None) -> bool:
        """Failed: deliver again after ``delay`` seconds, still before later messages of its
        key; after ``max_attempts`` deliveries it becomes a dead letter (with ``error``)."""
        self._settling = True
        try:
            ok = await self.queue.nack(self.id, self.receipt, delay, error)
            self.settled = True
            self.lost = self.lost or not ok
        finally:
            self._settling = False
        return ok

    async def extend(self, seconds: float) -> bool:
        """Keep the message invisible for ``seconds`` from now (store clock). False if the
        receipt is stale."""
        deadline = await self.queue.extend(self.id, self.receipt, seconds)
        if deadline is None:
            self.lost = True
            return False
        self.deadline = deadline
        return True


class AsyncQueue:
    """A durable keyed FIFO queue named ``name``, shared by every process on the same store.

    ``visibility_timeout``: seconds a delivered message stays invisible before it is
    delivered again unless acked, nacked or extended. ``max_attempts``: deliveries before a
    message becomes a dead letter. ``concurrency``: at most this many messages of the queue in
    flight at once, across all consumers (``None``: no cap). ``dedup_window``: how long a
    ``dedup_id`` is remembered. These apply to what this object does (a put records
    ``max_attempts``, a get applies all); give every client of one queue the same values."""

    def __init__(
        self,
        backend: AsyncQueueBackend,
        name: str,
        visibility_timeout: float = 30.0,
        max_attempts: int = 5,
        concurrency: int | None = None,
        *,
        dedup_window: float = validate.DEFAULT_DEDUP_WINDOW,
        long_poll_gets: bool,
    ) -> None:
        self._backend = backend
        # The store's ``Characteristics.long_poll_gets``: blocking gets are its long polls.
        self._long_poll_gets = long_poll_gets
        self.name = validate.name(name)
        self.visibility_timeout = validate.visibility_timeout(visibility_timeout)
        self.max_attempts = validate.max_attempts(max_attempts)
        self.concurrency = validate.concurrency(concurrency)
        self.dedup_window = validate.dedup_window(dedup_window)
        self._stop: _compat.Event | None = None

    def __repr__(self) -> str:
        return (
            f"<{type(self).__name__} name={self.name!r} visibility_timeout="
            f"{self.visibility_timeout:g} max_attempts={self.max_attempts} "
            f"concurrency={self.concurrency}>"
        )

    # -- producing ------------------------------------------------------------------------
    async def put(
        self,
        payload: Any,
        key: str | None = None,
        delay: float = 0.0,
        dedup_id: str | None = None,
    ) -> str:
        """Record a message; returns its id.

        ``payload``: JSON-serializable, or ``bytes``; at most 256 KiB encoded. ``key``:
        messages of one key are delivered one at a time in put order (``None``: no key).
        ``delay``: seconds before it can be delivered (it also holds back later messages of
        its key). ``dedup_id``: a second put with the same id within ``dedup_window``
        seconds stores nothing and returns the first message's id."""
        result = await self.put_message(payload, key, delay, dedup_id)
        return result.id

    async def put_message(
        self,
        payload: Any,
        key: str | None = None,
        delay: float = 0.0,
        dedup_id: str | None = None,
        *,
        id: str | None = None,
    ) -> records.PutResult:
        """:meth:`put` answering the store's whole result: the id, whether this call
        ``created`` the message (False: deduplicated, or ``id`` already stored) and the store's
        ``now``. A caller-chosen ``id`` makes a retried put safe (default: a new random id)."""
        body, kind = encode_payload(payload)
        message = records.NewMessage(
            id=secrets.token_hex(12) if id is None else validate.message_id(id),
            key=validate.key(key),
            body=body,
            kind=kind,
            delay=validate.delay(delay),
            dedup_id=validate.dedup_id(dedup_id),
            max_attempts=self.max_attempts,
        )
        result = await self._backend.put(self.name, message, dedup_window=self.dedup_window)
        telemetry.queue_put(self.name, result.id, result.created)
        return result

    # -- consuming --------------------------------------------------------------------------
    async def get(self, timeout: float | None = None) -> AsyncMessage | None:
        """The oldest ready message whose key has nothing in flight, while fewer than
        ``concurrency`` messages are in flight; waits up to ``timeout`` seconds (``None``:
        without limit, ``0``: not at all) and returns ``None`` if none came. A blocked get is
        woken by the store when a message becomes deliverable."""
        return await self._get(validate.timeout(timeout), None)

    async def claim(self, receipt: str | None = None) -> records.ClaimResult:
        """One claim step, never waiting: the delivery if a message is deliverable now, with
        the store's ``now`` and ``retry_after`` (when a delayed or in-flight message may
        become deliverable). ``receipt`` names the delivery (default: a new random one).
        Settle it with :meth:`ack`, :meth:`nack` or :meth:`extend`. A non-blocking
        :meth:`get`, with the store's whole answer.

        A claim is not deduplicated by its receipt: one repeated after its reply was lost
        (a dropped connection) hands out the next deliverable message, and the delivery the
        lost reply carried stays in flight until its visibility timeout, then is delivered
        again. Nothing is lost, but that message (and its key) waits up to
        ``visibility_timeout``."""
        return await self._claim(None, None if receipt is None else validate.receipt(receipt))

    async def _claim(self, waiter: str | None, receipt: str | None = None) -> records.ClaimResult:
        return await self._backend.claim(
            self.name,
            receipt=secrets.token_hex(12) if receipt is None else receipt,
            visibility_timeout=self.visibility_timeout,
            concurrency=self.concurrency,
            max_attempts=self.max_attempts,
            waiter=waiter,
        )

    async def _ack_claim(
        self, message: AsyncMessage, waiter: str | None
    ) -> records.ClaimResult:
        """Ack ``message`` and claim the next (``ack_claim``); the ack's outcome is recorded
        on the message, as :meth:`AsyncMessage.ack` does."""
        ok: bool
        result: records.ClaimResult
        ok, result = await self._backend.ack_claim(
            self.name,
            message.id,
            message.receipt,
            receipt=secrets.token_hex(12),
            visibility_timeout=self.visibility_timeout,
            concurrency=self.concurrency,
            max_attempts=self.max_attempts,
            waiter=waiter,
        )
        self._record_ack(message, ok)
        return result

    async def _ack_claim_many(
        self, acks: list[tuple[str, str]], receipts: list[str], waiter: str | None
    ) -> tuple[list[bool], records.BatchClaim]:
        """The store's batch step with this queue's settings: ack ``acks`` (id, receipt),
        then claim one message per receipt (``ack_claim_many``). The worker loop's step
        between two batches, and the HTTP service's ``/v1/queues/ack-claim``."""
        return await self._backend.ack_claim_many(
            self.name,
            acks,
            receipts=receipts,
            visibility_timeout=self.visibility_timeout,
            concurrency=self.concurrency,
            max_attempts=self.max_attempts,
            waiter=waiter,
        )

    def _record_ack(self, message: AsyncMessage, ok: bool) -> None:
        """The outcome of an ack sent with a claim, recorded on the message as
        :meth:`AsyncMessage.ack` records its own."""
        telemetry.queue_settled(self.name, message.id, "ack", ok)
        message.settled = True
        message.lost = message.lost or not ok

    async def _get(
        self,
        timeout: float | None,
        stop: _compat.Event | None,
        ack: AsyncMessage | None = None,
    ) -> AsyncMessage | None:
        """One message (:meth:`_take` of one), after acking ``ack`` if given."""
        got = await self._take(1, timeout, stop, [] if ack is None else [ack])
        return got[0] if got else None

    async def _take(
        self,
        count: int,
        timeout: float | None,
        stop: _compat.Event | None,
        acks: list[AsyncMessage],
    ) -> list[AsyncMessage]:
        """Up to ``count`` messages, claimed in one store step, waiting up to ``timeout``
        for the first as :meth:`get` does (none: the time passed, or ``stop`` was set).
        ``acks``: messages to ack first (the worker loop's step between two messages or
        batches), in the same step as the first claim (on PostgreSQL one round trip and one
        commit instead of several). A store that long-polls its gets (the HTTP service)
        sends them with a look that never waits (one request), and long-polls for the first
        message only if that found nothing, then claims the rest of a batch without waiting.
        Once ``stop`` is set it acks them on their own and claims nothing."""
        stopped = stop is not None and stop.is_set()
        if acks and stopped:
            for message in acks:
                await message.ack()
            acks = []
        if stopped:  # take nothing more
            return []
        deadline = None if timeout is None else time.monotonic() + timeout
        if timeout == 0:
            return (await self._step(count, acks, None))[0]
        if self._long_poll_gets:
            if acks:
                got = (await self._step(count, acks, None))[0]
                if got:
                    return got
            first = await self._get_remote(deadline, stop)
            if first is None:
                return []
            more = (await self._step(count - 1, [], None))[0] if count > 1 else []
            return [first, *more]
        # Arm the wake-up channel first, then claim registering it as a waiter should nothing
        # be deliverable (a claim that delivers unregisters it): no wake-up can slip by, and
        # one store round trip per look.
        waiter = await self._backend.open_waiter(self.name)
        registered = False
        try:
            while True:
                # The acks go with the first look, when the waiter is new (as ack_claim
                # requires).
                got, retry_after = await self._step(count, acks, waiter.id)
                acks = []
                registered = not got
                if got:
                    return got
                now = time.monotonic()
                if deadline is not None and now >= deadline:
                    return []
                delay = queue_machine.WAITER_HEARTBEAT
                if retry_after is not None:
                    delay = min(delay, retry_after + timing.EXPIRY_SLACK)
                if deadline is not None:
                    delay = min(delay, deadline - now)
                if not await self._sleep(waiter, delay, stop):
                    return []
        finally:
            try:
                await waiter.close(registered)
            except BackendUnavailable as exc:  # it lapses by itself after WAITER_TTL
                log.debug("unregistering a waiter of %r failed: %s", self.name, exc)

    async def _step(
        self, count: int, acks: list[AsyncMessage], waiter: str | None
    ) -> tuple[list[AsyncMessage], float | None]:
        """One store step: ack ``acks``, then claim up to ``count`` messages (naming
        ``waiter``): a claim, an ``ack_claim``, or for a batch ``ack_claim_many``. The
        messages, and without one the store's ``retry_after``."""
        if count == 1 and len(acks) <= 1:
            if acks:
                result = await self._ack_claim(acks[0], waiter)
            else:
                result = await self._claim(waiter)
            if result.delivery is None:
                return [], result.retry_after
            return [AsyncMessage(self, result.delivery)], None
        acked, batch = await self._ack_claim_many(
            [(m.id, m.receipt) for m in acks],
            [secrets.token_hex(12) for _ in range(count)],
            waiter,
        )
        for message, ok in zip(acks, acked, strict=True):
            self._record_ack(message, ok)
        return [AsyncMessage(self, d) for d in batch.deliveries], batch.retry_after

    async def _get_remote(
        self, deadline: float | None, stop: _compat.Event | None
    ) -> AsyncMessage | None:
        """For a backend whose store side does the waiting (the HTTP service): each call is
        one long poll there. With a ``stop`` flag the polls last at most a heartbeat, so a
        stop is noticed about as soon as by a native waiter."""
        while True:
            wait = queue_machine.WAITER_HEARTBEAT if stop is not None else REMOTE_POLL
            if deadline is not None:
                wait = min(wait, deadline - time.monotonic())
                if wait <= 0:
                    return None
            delivery = await self._backend.long_poll(
                self.name,
                wait=wait,
                visibility_timeout=self.visibility_timeout,
                concurrency=self.concurrency,
                max_attempts=self.max_attempts,
            )
            if delivery is not None:
                return AsyncMessage(self, delivery)
            if stop is not None and stop.is_set():
                return None

    @staticmethod
    async def _sleep(waiter: AsyncQueueWaiter, delay: float, stop: _compat.Event | None) -> bool:
        """Wait to be woken or for ``delay``; False if ``stop`` was set meanwhile."""
        if stop is None:
            await waiter.wait(delay)
            return True
        end = time.monotonic() + delay
        while not stop.is_set():
            left = end - time.monotonic()
            if left <= 0 or await waiter.wait(min(left, STOP_CHECK)):
                return True
        return False

    # -- settling (from any process) --------------------------------------------------------
    async def ack(self, id: str, receipt: str) -> bool:
        """Settle delivery ``receipt`` of message ``id`` as done (delete it). Idempotent;
        False if the receipt is stale or the message already settled."""
        ok = await self._backend.ack(self.name, validate.message_id(id), validate.receipt(receipt))
        telemetry.queue_settled(self.name, id, "ack", ok)
        return ok

    async def nack(
        self, id: str, receipt: str, delay: float = 0.0, error: str | None = None
    ) -> bool:
        """Settle delivery ``receipt`` of message ``id`` as failed: deliver it again after
        ``delay`` (before later messages of its key), or dead-letter it after
        ``max_attempts``. False if the receipt is stale."""
        ok = await self._backend.nack(
            self.name,
            validate.message_id(id),
            validate.receipt(receipt),
            delay=validate.delay(delay),
            error=validate.error_text(error),
        )
        telemetry.queue_settled(self.name, id, "nack", ok)
        return ok

    async def extend(self, id: str, receipt: str, seconds: float) -> float | None:
        """Keep message ``id`` invisible for ``seconds`` from now; returns the new deadline
        (store clock), or ``None`` if the receipt is stale."""
        return await self._backend.extend(
            self.name,
            validate.message_id(id),
            validate.receipt(receipt),
            validate.visibility_timeout(seconds, "seconds"),
        )

    # -- inspecting -------------------------------------------------------------------------
    async def stats(self, top_keys: int = 10) -> QueueStats:
        """Counts of ready, delayed, in-flight and dead messages, the age of the oldest
        pending one and the ``top_keys`` keys with the most pending messages."""
        return await self._backend.stats(self.name, top_keys=validate.count(top_keys, "top_keys"))

    async def dead_letters(self, limit: int = 100) -> list[DeadLetter]:
        """Dead letters in put order, at most ``limit``."""
        rows = await self._backend.dead_letters(self.name, limit=validate.count(limit, "limit"))
        return [
            DeadLetter(
                r.id,
                r.key,
                decode_payload(r.body, r.kind),
                r.attempts,
                r.enqueued_at,
                r.died_at,
                r.error,
            )
            for r in rows
        ]

    async def requeue(self, ids: Iterable[str] | None = None) -> int:
        """Put dead letters (those in ``ids``, or all) back at the end of the queue with
        their attempts reset. Returns how many."""
        return await self._backend.requeue(self.name, validate.ids(ids))

    async def purge_dead(self, ids: Iterable[str] | None = None) -> int:
        """Delete dead letters (those in ``ids``, or all). Returns how many."""
        return await self._backend.purge_dead(self.name, validate.ids(ids))

    # -- the worker loop --------------------------------------------------------------------
    def stop(self) -> None:
        """Ask a running :meth:`work` to finish: each worker completes its current message
        and takes no new one."""
        if self._stop is not None:
            self._stop.set()

    async def work(
        self,
        handler: Handler,
        workers: int = 1,
        *,
        idle_timeout: float | None = None,
        max_messages: int | None = None,
        backoff: float = 1.0,
        max_backoff: float = 60.0,
        handle_signals: bool = True,
        prefetch: int = 1,
    ) -> WorkResult:
        """Run ``handler(message)`` on messages with ``workers`` concurrent workers.

        On return the message is acked; if the handler raises, it is nacked with a delay of
        ``backoff * 2 ** (attempt - 1)`` seconds (at most ``max_backoff``) and the error is
        recorded (a dead letter keeps it). While a handler runs, its message is extended every
        ``visibility_timeout / 3``. SIGTERM or SIGINT (with ``handle_signals``, in the main
        thread), or :meth:`stop`, stop gracefully: every worker finishes its current message
        and takes no new one (a second signal acts as usual). A worker also stops after
        ``idle_timeout`` seconds without a message, and the whole loop after ``max_messages``
        messages. Returns the counts.

        ``prefetch``: each worker claims up to this many messages in one store step and runs
        them one after another; their acks go with its next claim step. On PostgreSQL that
        step is one transaction, so a batch costs one commit instead of one per message.
        The messages of a batch head distinct keys and count against ``concurrency`` from
        their claim; each is extended while it waits or runs; a stop lets the worker finish
        the batch it holds. A batch's acks (and so the next message of each of its keys) wait
        until the whole batch has run: prefetch trades latency for throughput."""
        if not _compat.is_flavour_function(handler):
            other = "turnstile.connect" if _compat.FLAVOUR == "async" else "turnstile.aio.connect"
            kind = "coroutine function" if _compat.FLAVOUR == "async" else "plain function"
            raise InvalidArgument(
                f"handler must be a {kind} for a {_compat.FLAVOUR} queue "
                f"(or use a client from {other}())"
            )
        workers = validate.limit(workers, "workers")
        if workers > 1000:
            raise InvalidArgument(f"workers must be between 1 and 1000, got {workers}")
        idle = validate.timeout(idle_timeout, "idle_timeout")
        if max_messages is not None:
            validate.count(max_messages, "max_messages", 2**62)
        backoff = validate.seconds(backoff, "backoff", low=0.0, high=validate.MAX_DELAY)
        max_backoff = validate.seconds(max_backoff, "max_backoff", low=0.0, high=validate.MAX_DELAY)
        prefetch = validate.count(prefetch, "prefetch", MAX_PREFETCH)

        stop = _compat.Event()
        self._stop = stop
        loop = _WorkLoop(
            self, handler, stop, idle, max_messages, backoff, max_backoff, prefetch
        )
        restore = self._install_signals(loop) if handle_signals else None
        extender = _compat.spawn(loop.extend_loop, f"turnstile-extend:{self.name}")
        handles = [
            _compat.spawn(loop.worker, f"turnstile-worker-{i}:{self.name}") for i in range(workers)
        ]
        try:
            for handle in handles:
                await _compat.join(handle)
        # unasync: async-only
        except BaseException:
            stop.set()
            for handle in handles:
                handle.cancel()
            raise
        # unasync: end
        finally:
            stop.set()
            loop.extender_stop.set()
            await _compat.join(extender)
            if restore is not None:
                restore()
            self._stop = None
        if loop.result.stopped_by is None:
            loop.result.stopped_by = "stop()"
        return loop.result

    # unasync: async-only
    def _install_signals(self, loop: _WorkLoop) -> Callable[[], None]:
        event_loop = asyncio.get_running_loop()
        installed: list[signal.Signals] = []

        def on_signal(sig: signal.Signals) -> None:
            log.info("%s: finishing current messages, taking no new ones", sig.name)
            loop.halt("signal")
            for each in installed:  # a second signal acts as usual
                event_loop.remove_signal_handler(each)
            installed.clear()

        for sig in (signal.SIGTERM, signal.SIGINT):
            try:
                event_loop.add_signal_handler(sig, on_signal, sig)
            except (NotImplementedError, RuntimeError, ValueError):
                continue
            installed.append(sig)

        def restore() -> None:
            for each in installed:
                event_loop.remove_signal_handler(each)
            installed.clear()

        return restore

    # unasync: end
    # unasync: sync-only
    # def _install_signals(self, loop: _WorkLoop) -> Callable[[], None]:
    #     if threading.current_thread() is not threading.main_thread():
    #         return lambda: None
    #     previous: dict[int, Any] = {}
    #
    #     def restore() -> None:
    #         for sig, old in previous.items():
    #             signal.signal(sig, old)
    #         previous.clear()
    #
    #     def on_signal(signum: int, frame: Any) -> None:
    #         log.info("%s: finishing current messages, taking no new ones",
    #                  signal.Signals(signum).name)
    #         loop.halt("signal")
    #         restore()  # a second signal acts as usual
    #
    #     for sig in (signal.SIGTERM, signal.SIGINT):
    #         previous[sig] = signal.signal(sig, on_signal)
    #     return restore
    # unasync: end


class _WorkLoop:
    """The shared state of one :meth:`AsyncQueue.work` run: its workers and the extender."""

    def __init__(
        self,
        queue: AsyncQueue,
        handler: Handler,
        stop: _compat.Event,
        idle_timeout: float | None,
        max_messages: int | None,
        backoff: float,
        max_backoff: float,
        prefetch: int = 1,
    ) -> None:
        self.queue = queue
        self.handler = handler
        self.stop = stop
        self.extender_stop = _compat.Event()
        self.idle_timeout = idle_timeout
        self.max_messages = max_messages
        self.backoff = backoff
        self.max_backoff = max_backoff
        self.prefetch = prefetch
        self.result = WorkResult()
        self.taken = 0
        self.lock = threading.Lock()  # counters are shared by worker threads (sync flavour)
        # message -> local monotonic time its next extension is due: every message a worker
        # holds (waiting its turn in a batch, running, or run and not yet acked)
        self.running: dict[AsyncMessage, float] = {}

    def halt(self, why: str) -> None:
        if self.result.stopped_by is None:
            self.result.stopped_by = why
        self.stop.set()

    def _take_slots(self, wanted: int) -> int:
        """Slots for up to ``wanted`` more messages; 0: the other workers hold the remaining
        ones (this worker leaves; it must not stop one that still waits for its message)."""
        with self.lock:
            got = wanted
            if self.max_messages is not None:
                got = max(0, min(wanted, self.max_messages - self.taken))
            self.taken += got
            return got

    def _after_message(self) -> None:
        with self.lock:
            if self.max_messages is not None and self.result.handled >= self.max_messages:
                self.halt("max_messages")

    def _give_back_slots(self, count: int) -> None:
        with self.lock:
            self.taken -= count

    def _sending_acks(self, messages: list[AsyncMessage]) -> None:
        """``messages`` are about to be acked: no more extensions for them."""
        for message in messages:
            self.running.pop(message, None)
            message._settling = True

    async def worker(self) -> None:
        error_delay = ERROR_BACKOFF
        vt = self.queue.visibility_timeout
        # Messages whose handler returned, acked by the next claim step in the same store
        # step (AsyncQueue._take), or on their own when the loop ends; extended meanwhile.
        pending: list[AsyncMessage] = []
        while not self.stop.is_set():
            slots = self._take_slots(self.prefetch)
            if not slots:
                break
            self._sending_acks(pending)
            try:
                batch = await self.queue._take(slots, self.idle_timeout, self.stop, pending)
            except BackendUnavailable as exc:
                # Each ack went through (a backend without a combined step acks first) or is
                # unknown (a failed combined step): then the next step acks it again (a
                # second ack of one delivery is refused, and counted as lost).
                for message in pending:
                    message._settling = False
                    if message.settled:
                        self._acked(message)
                    else:
                        self.running[message] = time.monotonic()  # extend it meanwhile
                pending = [m for m in pending if not m.settled]
                self._give_back_slots(slots)
                log.warning("getting from %r failed, retrying: %s", self.queue.name, exc)
                if await _compat.wait_event(self.stop, error_delay):
                    break
                error_delay = min(error_delay * 2, ERROR_BACKOFF_MAX)
                continue
            for message in pending:
                self._acked(message)
            pending = []
            error_delay = ERROR_BACKOFF
            self._give_back_slots(slots - len(batch))
            if not batch:  # stopped, or idle_timeout passed: this worker is done
                with self.lock:
                    if not self.stop.is_set() and self.result.stopped_by is None:
                        self.result.stopped_by = "idle_timeout"
                break
            due = time.monotonic() + vt * timing.RENEW_FRACTION
            for message in batch:  # extended from their claim on, while they wait their turn
                self.running[message] = due
            for message in batch:  # a stop lets the batch finish: its messages are taken
                done = await self.handle(message)
                if done is None:
                    self._after_message()
                else:
                    pending.append(done)
        for message in pending:  # left by a stop or an error: acked on their own
            self.running.pop(message, None)
            if not message.settled:
                await self._settle(message, True, 0.0, None)
            self._acked(message)

    def _acked(self, message: AsyncMessage) -> None:
        """Count a message the loop acked (after its handler returned)."""
        if message.lost:
            log.warning(
                "message %s of %r: the store refused the ack (its visibility timeout passed); "
                "it is or will be delivered again",
                message.id,
                self.queue.name,
            )
        self._count("lost" if message.lost else "acked")
        self._after_message()

    async def handle(self, message: AsyncMessage) -> AsyncMessage | None:
        """Run the handler on ``message`` and settle it; a message the handler returned on
        and did not settle is returned instead, for the worker to ack with its next get (it
        stays extended until then)."""
        vt = self.queue.visibility_timeout
        self.running.setdefault(message, time.monotonic() + vt * timing.RENEW_FRACTION)
        kept = False
        try:
            try:
                with telemetry.processing(self.queue.name, message.id, message.attempt):
                    await self.handler(message)
            except Exception as exc:
                text = f"{type(exc).__name__}: {exc}"
                log.warning(
                    "handler failed on message %s of %r (attempt %d): %s",
                    message.id,
                    self.queue.name,
                    message.attempt,
                    text,
                    exc_info=True,
                )
                done = True
                if not message.settled:
                    delay = min(self.max_backoff, self.backoff * 2 ** (message.attempt - 1))
                    done = await self._settle(message, False, delay, text)
                self._count("failed" if done else "lost")
            else:
                if not message.settled:
                    kept = True
                    return message
                self._count("lost" if message.lost else "acked")
        finally:
            if not kept:
                self.running.pop(message, None)
        return None

    def _count(self, what: str) -> None:
        with self.lock:
            setattr(self.result, what, getattr(self.result, what) + 1)

    async def _settle(
        self, message: AsyncMessage, ok: bool, delay: float, error: str | None
    ) -> bool:
        try:
            done = await message.ack() if ok else await message.nack(delay, error)
        except BackendUnavailable as exc:
            log.warning(
                "settling message %s of %r failed; it will be delivered again after its "
                "visibility timeout: %s",
                message.id,
                self.queue.name,
                exc,
            )
            return False
        if not done:
            log.warning(
                "message %s of %r: the store refused the %s (its visibility timeout passed); "
                "it is or will be delivered again",
                message.id,
                self.queue.name,
                "ack" if ok else "nack",
            )
        return done

    async def extend_loop(self) -> None:
        vt = self.queue.visibility_timeout
        tick = max(0.02, min(vt * timing.RENEW_FRACTION / 2, 1.0))
        while not await _compat.wait_event(self.extender_stop, tick):
            now = time.monotonic()
            for message, due in list(self.running.items()):
                if due > now or message.settled or message.lost:
                    continue
                try:
                    deadline = await self.queue.extend(message.id, message.receipt, vt)
                except BackendUnavailable as exc:
                    log.warning("extending message %s failed, will retry: %s", message.id, exc)
                    continue
                except Exception:  # never let the extender die silently
                    log.exception("unexpected error extending message %s", message.id)
                    continue
                if deadline is not None:
                    message.deadline = deadline
                    if message in self.running:
                        self.running[message] = time.monotonic() + vt * timing.RENEW_FRACTION
                elif not (message.settled or message._settling):
                    # Not overtaken by its settlement: the visibility timeout passed.
                    message.lost = True
                    log.warning(
                        "message %s of %r: visibility timeout passed before it could be "
                        "extended; it will be delivered again",
                        message.id,
                        self.queue.name,
                    )
