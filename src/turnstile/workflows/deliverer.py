"""The deliverer: sends callback grants, at least once, and never leaks a permit.

A grant to a callback waiter is written by the store together with a *pending delivery*
(``_core/lock_machine.py``). A deliverer loops:

1. ``take_deliveries``: the store acts on expiries of names with callback waiters (nobody
   else would: those waiters do not poll), then claims pending deliveries for this deliverer
   for ``claim`` seconds. A deliverer killed mid-delivery (``kill -9``) holds nothing: its
   claims lapse and another deliverer (or itself, restarted) takes them again.
2. Sends each: Step Functions ``SendTaskSuccess`` with the lease as output, or an HTTP POST
   of the lease signed with HMAC-SHA256 (``_core/callbacks.py``).
3. Settles it: *delivered*; *refused* when the far side can never take it
   (``TaskDoesNotExist``, ``InvalidToken``, ``TaskTimedOut``, HTTP 4xx other than 408 and
   429), which releases the grant and grants the next in line in the same store step; or
   *retry* with exponential backoff while the grant lasts (an undelivered grant expires like
   any lease).

Any number of deliverers may run on one store (``turnstile serve`` runs one, so does
``turnstile bridge sqs``, and ``turnstile deliver`` runs one alone); each delivery is claimed
by one at a time. Between rounds a deliverer sleeps ``interval`` or until :meth:`nudge` (the
service and the bridge nudge it after every step that may have granted someone).

At least once means a deliverer that dies after sending but before settling lets another
send again. A second ``SendTaskSuccess`` to a token already used is refused by Step
Functions; a refusal on a *repeated* attempt for an execution that is still running is taken
as delivered, not as a reason to release (the first attempt evidently resumed it).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .._async.backends.protocol import AsyncBackend
from .._core import callbacks, lock_machine, validate
from .._core.records import CallbackDelivery
from ..errors import ConfigurationError, InvalidArgument, TurnstileError
from . import aws, threads

log = logging.getLogger("turnstile.deliver")

SECRET_ENV = "TURNSTILE_CALLBACK_SECRET"
DEFAULT_INTERVAL = 0.05
DEFAULT_CLAIM = 30.0
DEFAULT_BATCH = 32
DEFAULT_CONCURRENCY = 16
HTTP_TIMEOUT = 10.0
STOP_GRACE = 2.0
MAX_BACKOFF = 30.0

# The answer of one send.
DELIVERED = lock_machine.DELIVERED
REFUSED = lock_machine.REFUSED
RETRY = lock_machine.RETRY


@dataclass(frozen=True, slots=True)
class Outcome:
    result: str  # DELIVERED, REFUSED or RETRY
    why: str = ""


@dataclass
class DeliveryStats:
    """What one deliverer did since it started (``/metrics``, the dashboard, ``status``)."""

    delivered: int = 0
    refused: int = 0
    retried: int = 0
    # Not delivered and settled by nobody: the grant expired or was released meanwhile
    # (a delivery the target accepted counts as delivered, even if its holder released the
    # grant before the deliverer could mark it done).
    lost: int = 0
    rounds: int = 0
    latencies: list[float] = field(default_factory=list)  # grant -> delivered, seconds

    def latency(self, q: float) -> float | None:
        if not self.latencies:
            return None
        ordered = sorted(self.latencies)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))]

    def as_dict(self) -> dict[str, Any]:
        return {
            "delivered": self.delivered,
            "refused": self.refused,
            "retried": self.retried,
            "lost": self.lost,
            "latency_p50": self.latency(0.5),
            "latency_p99": self.latency(0.99),
        }


Sender = Callable[[CallbackDelivery, callbacks.Callback, bytes], Outcome]


def secret_from_env() -> bytes | None:
    value = os.environ.get(SECRET_ENV)
    return value.encode("utf-8") if value else None


class NoRedirects(urllib.request.HTTPRedirectHandler):
    """A delivery is never redirected: a 3xx is answered as an HTTPError, a refusal (a
    redirected POST would arrive as a GET without the lease, and its 2xx mean nothing)."""

    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


_OPENER = urllib.request.build_opener(NoRedirects)


def send_http(url: str, body: bytes, secret: bytes | None) -> Outcome:
    if secret is None:
        return Outcome(RETRY, f"no shared secret to sign HTTP callbacks: set {SECRET_ENV}")
    request = urllib.request.Request(
        url,
        data=body,
        method="POST",
        headers={
            "Content-Type": "application/json",
            "User-Agent": "turnstile-deliverer",
            callbacks.SIGNATURE_HEADER: callbacks.sign(secret, body),
        },
    )
    try:
        with _OPENER.open(request, timeout=HTTP_TIMEOUT) as response:
            response.read(65536)
            status = response.status
    except urllib.error.HTTPError as exc:
        status = exc.code
        exc.close()
    except (OSError, ValueError) as exc:
        return Outcome(RETRY, f"POST failed: {type(exc).__name__}")
    if 200 <= status < 300:
        return Outcome(DELIVERED)
    if 300 <= status < 400:
        return Outcome(REFUSED, f"HTTP {status}: redirects are not followed")
    if 400 <= status < 500 and status not in (408, 429):
        return Outcome(REFUSED, f"HTTP {status}")
    return Outcome(RETRY, f"HTTP {status}")


def send_sfn(delivery: CallbackDelivery, task_token: str, body: bytes) -> Outcome:
    try:
        sfn = aws.client("stepfunctions")
    except ConfigurationError as exc:
        return Outcome(RETRY, str(exc))
    try:
        sfn.send_task_success(taskToken=task_token, output=body.decode("utf-8"))
    except Exception as exc:  # botocore's errors, the network's
        code = aws.error_code(exc)
        if code in aws.PERMANENT_TASK_ERRORS:
            if delivery.attempts > 1:
                # An earlier attempt may have been sent and resumed the execution before its
                # deliverer died unsettled: then this token is spent and the grant in use.
                return _after_repeated_refusal(delivery.holder, code)
            return Outcome(REFUSED, code or "refused")
        return Outcome(RETRY, code or type(exc).__name__)
    return Outcome(DELIVERED)


def _after_repeated_refusal(holder: str, code: str | None) -> Outcome:
    """A spent token on a repeated attempt: delivered if the execution still runs (an
    earlier attempt resumed it), refused if it is gone or ended, retried if we cannot tell
    (never settle a grant as delivered to nobody)."""
    if not aws.is_execution(holder):
        return Outcome(REFUSED, code or "refused")
    try:
        found = aws.client("stepfunctions").describe_execution(executionArn=holder)
    except Exception as exc:
        if aws.error_code(exc) in ("ExecutionDoesNotExist", "InvalidArn"):
            return Outcome(REFUSED, f"{code}; execution does not exist")
        return Outcome(RETRY, f"{code}; cannot describe the execution")
    if found.get("status") == "RUNNING":
        return Outcome(DELIVERED, f"{code} on a repeated attempt; execution running")
    return Outcome(REFUSED, f"{code}; execution {found.get('status')}")


def default_sender(secret: bytes | None) -> Sender:
    def send(delivery: CallbackDelivery, callback: callbacks.Callback, body: bytes) -> Outcome:
        if isinstance(callback, callbacks.StepFunctionsCallback):
            return send_sfn(delivery, callback.task_token, body)
        return send_http(callback.url, body, secret)

    return send


class Deliverer:
    """Delivers the callback grants of one store. Use as an async context manager, or call
    :meth:`start`/:meth:`stop` (``turnstile serve`` and ``turnstile bridge sqs`` do)."""

    def __init__(
        self,
        backend: AsyncBackend,
        *,
        secret: bytes | None = None,
        interval: float = DEFAULT_INTERVAL,
        claim: float = DEFAULT_CLAIM,
        batch: int = DEFAULT_BATCH,
        concurrency: int = DEFAULT_CONCURRENCY,
        sender: Sender | None = None,
    ) -> None:
        if not backend.characteristics.local_deliveries:
            raise ConfigurationError(
                f"{backend.characteristics.scheme}:// stores deliver their own callbacks "
                "(the service runs a deliverer): run none here"
            )
        self._backend = backend
        self._interval = validate.seconds(interval, "interval", low=0.001, high=60.0)
        self._claim = validate.seconds(claim, "claim", low=1.0, high=3600.0)
        if not isinstance(batch, int) or not 1 <= batch <= 1000:
            raise InvalidArgument("batch must be an integer from 1 to 1000")
        self._batch = batch
        if not isinstance(concurrency, int) or not 1 <= concurrency <= 1000:
            raise InvalidArgument("concurrency must be an integer from 1 to 1000")
        self._concurrency = concurrency
        self._secret = secret if secret is not None else secret_from_env()
        self._send = sender or default_sender(self._secret)
        self._nudged = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._inflight: set[asyncio.Task[None]] = set()
        self.stats = DeliveryStats()
        self._warned: set[str] = set()

    def __repr__(self) -> str:
        return f"<Deliverer {self._backend.characteristics.scheme}:// running={self.running}>"

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done()

    def nudge(self) -> None:
        """Look for deliveries now rather than at the next interval (call after any step that
        may have granted a callback waiter: a release, a set_limit, a callback ask)."""
        self._nudged.set()

    async def start(self) -> None:
        if not self.running:
            self._task = asyncio.get_running_loop().create_task(self._loop(), name="deliverer")

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        # Sends under way get a moment to finish and settle; one still hanging after that is
        # abandoned unsettled: its claim lapses and a deliverer sends it again.
        if self._inflight:
            await asyncio.wait(set(self._inflight), timeout=STOP_GRACE)
        for pending in list(self._inflight):
            pending.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await pending

    async def __aenter__(self) -> Deliverer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def _loop(self) -> None:
        """Take what is due while there is room, send each in its own task, and look again
        at once when a send ends or a nudge comes: one slow receiver (an HTTP endpoint that
        hangs until its timeout) never holds up the other deliveries."""
        failures = 0
        while True:
            room = self._concurrency - len(self._inflight)
            wanted = min(self._batch, room)
            taken = 0
            if wanted > 0:
                self._nudged.clear()
                try:
                    found = await self._take(wanted)
                    failures = 0
                except TurnstileError as exc:
                    failures += 1
                    found = []
                    self._warn("store", f"deliverer cannot reach the store: {exc}")
                for delivery in found:
                    task = asyncio.get_running_loop().create_task(self._deliver(delivery))
                    self._inflight.add(task)
                    task.add_done_callback(self._sent)
                taken = len(found)
                if taken >= wanted:
                    continue  # more may be waiting
            pause = self._interval if failures == 0 else min(5.0, 0.1 * 2**failures)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(pause):
                    await self._nudged.wait()
            self._nudged.clear()

    def _sent(self, task: asyncio.Task[None]) -> None:
        self._inflight.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("delivery failed unexpectedly", exc_info=task.exception())
        self._nudged.set()  # room for more

    async def _take(self, count: int) -> list[CallbackDelivery]:
        self.stats.rounds += 1
        return await self._backend.take_deliveries(lease=self._claim, max_count=count)

    async def round(self) -> int:
        """One round: take what is due and deliver it, waiting for those sends. Returns how
        many deliveries were taken. For tests and tools; :meth:`start` runs the loop."""
        taken = await self._take(self._batch)
        if taken:
            await asyncio.gather(*(self._deliver(d) for d in taken))
        return len(taken)

    async def _deliver(self, delivery: CallbackDelivery) -> None:
        try:
            callback = callbacks.decode(delivery.callback)
        except InvalidArgument:
            outcome = Outcome(REFUSED, "stored callback is unreadable")
        else:
            body = json.dumps(
                callbacks.lease_document(
                    delivery.name,
                    delivery.holder,
                    delivery.token,
                    delivery.expires_at,
                    delivery.limit,
                ),
                separators=(",", ":"),
            ).encode("utf-8")
            try:
                # Sends block (boto3, urllib): each in a thread that a stopping deliverer may
                # abandon (threads.py); at most `concurrency` run at once (see _loop).
                outcome = await threads.call(self._send, delivery, callback, body)
            except Exception as exc:  # a sender's own bug must not lose the delivery
                outcome = Outcome(RETRY, f"sender failed: {type(exc).__name__}")
        retry_in = min(MAX_BACKOFF, 0.2 * 2 ** min(delivery.attempts - 1, 10))
        try:
            settled = await self._backend.settle_delivery(
                delivery.name, delivery.token, outcome=outcome.result, retry_in=retry_in
            )
        except TurnstileError as exc:
            # Not settled: the claim lapses and the delivery is taken again.
            self._warn("settle", f"cannot settle a delivery on {delivery.name!r}: {exc}")
            return
        self._count(delivery, outcome, settled)

    def _count(self, delivery: CallbackDelivery, outcome: Outcome, settled: bool) -> None:
        if not settled and outcome.result != DELIVERED:
            self.stats.lost += 1
            return
        if outcome.result == DELIVERED:
            self.stats.delivered += 1
            self.stats.latencies.append(max(0.0, time.time() - delivery.acquired_at))
            del self.stats.latencies[:-10_000]
            log.debug("delivered %r token %d to %r", delivery.name, delivery.token, delivery.holder)
        elif outcome.result == REFUSED:
            self.stats.refused += 1
            log.info(
                "callback of %r on %r refused (%s): grant %d released",
                delivery.holder,
                delivery.name,
                outcome.why,
                delivery.token,
            )
        else:
            self.stats.retried += 1
            self._warn(
                outcome.why, f"delivery to {delivery.holder!r} will be retried: {outcome.why}"
            )

    def _warn(self, key: str, message: str) -> None:
        """Log a problem once per kind, not once per round (quiet logs on a bad day)."""
        if key not in self._warned:
            self._warned.add(key)
            log.warning("%s", message)
        else:
            log.debug("%s", message)
