"""``http://host:port`` and ``https://…``: a Turnstile HTTP service (``turnstile serve``) as
the store, for hosts that cannot or should not reach Redis or PostgreSQL directly.

Every protocol operation is one request to API v1; the service runs it on its own store, so
the guarantees are that store's (the service keeps no state of its own). A blocking acquire
waits with long polls (``/v1/semaphores/wait``) between try-acquire steps, so a hand-over
reaches the waiter as fast as the service's store wakes the service.

The bearer token comes from ``connect(url, token=…)``, else the URL's password
(``http://:TOKEN@host:8080``; never printed), else ``$TURNSTILE_TOKEN``. A path in the URL is
kept as the API's base (``https://proxy.example/turnstile``). Options: ``token``,
``timeout`` (seconds per call, retries included, default 10), ``verify`` (TLS: ``False`` or
a CA bundle path; default: the system's trust store).

While the service restarts or is overloaded (refused or reset connections, 503), calls are
retried with capped backoff and jitter within their budget (see :meth:`AsyncHTTPBackend.call`);
a blocking acquire's long polls within the caller's timeout, keeping its place in line.
"""

from __future__ import annotations

import base64
import dataclasses
import json
import logging
import math
import os
import random
import re
import ssl
import time
from collections.abc import Callable
from typing import Any
from urllib.parse import SplitResult, urlunsplit

import httpx

from ..._core import forks
from ..._core.payload import decode_payload, encode_payload
from ..._core.records import (
    KIND_BYTES,
    AcquireResult,
    BatchClaim,
    CallbackDelivery,
    Characteristics,
    ClaimResult,
    DeadLetterRow,
    Delivery,
    Grant,
    HolderInfo,
    KeyDepth,
    NewMessage,
    PutResult,
    QueueStats,
    RateResult,
    RateStatus,
    RateWaiterInfo,
    Status,
    WaiterInfo,
)
from ..._core.urls import redact
from ...errors import (
    AccessDenied,
    AcquireTimeout,
    BackendUnavailable,
    ConfigurationError,
    InvalidArgument,
    LeaseLost,
    LimitConflict,
    NotSupported,
)
from .. import _compat
from .protocol import AsyncQueueWaiter, AsyncStepwiseBatches

log = logging.getLogger("turnstile.http")

ENV_TOKEN = "TURNSTILE_TOKEN"
DEFAULT_TIMEOUT = 10.0
# A long poll may take its whole timeout on the service; allow this much more on the wire.
POLL_SLACK = 10.0
MAX_LIST = 10_000

# The capabilities of this client; the handshake fills in the facts of the store behind the
# service (durable, woken_by_store, description), which never change a capability here.
CHARACTERISTICS = Characteristics(
    scheme="http",
    cross_process=True,
    cross_host=True,
    durable=False,
    woken_by_store=True,
    description="Turnstile HTTP service",
    queues=True,
    long_poll_gets=True,  # /v1/queues/get waits on the service, woken by its store
    local_deliveries=False,  # the service runs its own deliverer
)

# Retrying while the service is away (a restart, an overload): capped exponential backoff
# with jitter, within each call's budget; a Retry-After is honoured up to RETRY_AFTER_CAP.
RETRY_FIRST = 0.05
RETRY_CAP = 1.0
RETRY_AFTER_CAP = 5.0
# 503s answered before the service did anything: safe to repeat any request.
_NOTHING_DONE = {"overloaded", "shutting_down", None}
# A blocking acquire's waiter waits at most this long per step (its caller bounds it anyway).
MAX_WAIT_STEP = 24 * 3600.0
# A long poll answered "not woken" this long before its time was up was ended by the service.
EARLY = 0.25

_SERVICE_DELIVERS = (
    "the Turnstile service delivers its own callback grants (turnstile serve runs a "
    "deliverer over its store): run no deliverer against an http:// URL; run one against "
    "the service's store instead if the service was started with --no-deliver"
)

# The limits in a limit_conflict message (turnstile._core.lock_machine.limit_conflict).
LIMITS_IN_CONFLICT = re.compile(
    r"has limit (\d+) while it has holders or waiters; this call asked for limit (\d+)"
)
_INVALID = {"invalid_argument", "bad_json", "payload_too_large", "unsupported_media_type"}
_DENIED = {"forbidden", "read_only", "admin_required"}


def _error(shown: str, response: httpx.Response) -> Exception:
    """The Turnstile exception for an error answer of the service."""
    try:
        body = response.json()
        code = str(body["error"]["code"])
        message = str(body["error"]["message"])
    except (ValueError, KeyError, TypeError):
        return BackendUnavailable(
            f"the Turnstile service at {shown} answered HTTP {response.status_code} "
            "without a Turnstile error body (a proxy in between?)"
        )
    if code == "limit_conflict":
        found = LIMITS_IN_CONFLICT.search(message)
        if found is None:
            return LimitConflict(message)
        return LimitConflict(message, int(found.group(1)), int(found.group(2)))
    if code in _INVALID:
        return InvalidArgument(message)
    if code == "unauthorized":
        return ConfigurationError(
            f"the Turnstile service at {shown} refused the token ({message}); fix: pass "
            f"token=… to connect(), put it in the URL (http://:TOKEN@host) or set ${ENV_TOKEN}"
        )
    if code in _DENIED:
        return AccessDenied(message)
    if code == "acquire_timeout":
        return AcquireTimeout(message)
    if code == "lease_lost":
        return LeaseLost(message)
    if code in ("not_supported", "not_found", "method_not_allowed"):
        return NotSupported(f"the Turnstile service at {shown} cannot do this: {message}")
    return BackendUnavailable(f"the Turnstile service at {shown}: {message}")


def _retriable(response: httpx.Response, idempotent: bool) -> bool:
    """Whether an error answer may be retried (see :meth:`AsyncHTTPBackend.call`)."""
    status = response.status_code
    if status == 503:
        try:
            code = response.json()["error"]["code"]
        except (ValueError, KeyError, TypeError):
            code = None  # a proxy's 503: the service was not reached
        return code in _NOTHING_DONE or idempotent
    return idempotent and status in (502, 504)  # a proxy in front of a restarting service


def _retry_after(response: httpx.Response) -> float | None:
    value = response.headers.get("retry-after", "")
    try:
        seconds = float(value)
    except ValueError:
        return None  # absent, or an HTTP date (no clock to trust here): back off as usual
    return min(max(seconds, 0.0), RETRY_AFTER_CAP) if math.isfinite(seconds) else None


def _ranked(priority: int, ageing: float | None) -> dict[str, Any]:
    """The request fields of a place in line by priority: none when it is the default, so a
    service that predates priorities still answers the plain asks."""
    fields: dict[str, Any] = {}
    if priority:
        fields["priority"] = priority
    if ageing is not None:
        fields["ageing"] = ageing
    return fields


def _grouped(key: str | None, per_key: int | None) -> dict[str, Any]:
    """The request fields of a semaphore group's ask: none for a plain semaphore."""
    return {} if per_key is None else {"key": key, "per_key": per_key}


def _grant(data: dict[str, Any]) -> Grant:
    return Grant(
        data["name"],
        data["holder"],
        int(data["token"]),
        float(data["acquired_at"]),
        float(data["expires_at"]),
    )


class AsyncHTTPWaiter:
    """Waits with a long poll that the service answers when the hand-over wakes it."""

    def __init__(self, backend: AsyncHTTPBackend, name: str, holder: str) -> None:
        self._backend = backend
        self._name = name
        self._holder = holder

    async def wait(self, timeout: float) -> bool:
        """Long-poll until woken or ``timeout``. While the service restarts (refused or reset
        connections, 503, an instance that ends its long polls to stop) it keeps trying
        within ``timeout``, then answers "not woken": the caller's next try-acquire step
        keeps its place in line (its holder's entry lives in the store, not the service)."""
        deadline = time.monotonic() + min(max(0.0, timeout), MAX_WAIT_STEP)
        while True:
            left = min(deadline - time.monotonic(), self._backend.max_wait)
            if left <= 0:
                return False
            try:
                data = await self._backend.call(
                    "POST",
                    "/v1/semaphores/wait",
                    {"name": self._name, "holder": self._holder, "timeout": round(left, 3)},
                    timeout=left + POLL_SLACK,
                    poll=True,
                    budget=left,
                )
            except BackendUnavailable:
                return False  # out of time while the service was away
            if data["woken"]:
                return True
            if deadline - time.monotonic() < EARLY:
                return False
            # Answered "not woken" well before the time asked for: an instance that is
            # stopping ended the long poll. Wait on for the rest (on the next instance).

    def handed(self, wait_id: int) -> Grant | None:
        return None  # the long poll answers "woken" only: the next try-acquire claims it

    async def close(self) -> None:
        return None


class AsyncHTTPQueueBackend(AsyncStepwiseBatches):
    """The queue protocol over API v1 (``/v1/queues/*``). Blocking gets are long polls that
    the service answers from its own wake-ups (``long_poll``), so no waiter lives here.
    ``ack_claim_many`` (the worker loop's step, ``work(prefetch=)``) is one request to
    ``/v1/queues/ack-claim``, the store's batch step; a service of an earlier release,
    which has no such endpoint, gets a request per ack and per claim."""

    def __init__(self, backend: AsyncHTTPBackend) -> None:
        self._backend = backend
        self._batches = True  # until a service answers that it has no /v1/queues/ack-claim

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
        if not receipts:
            raise ValueError("ack_claim_many needs at least one receipt")
        if self._batches:
            try:
                data = await self._backend.call(
                    "POST",
                    "/v1/queues/ack-claim",
                    {
                        "queue": name,
                        "acks": [{"id": i, "receipt": r} for i, r in acks],
                        "receipts": receipts,
                        "visibility_timeout": visibility_timeout,
                        "concurrency": concurrency,
                        "max_attempts": max_attempts,
                    },
                    # Repeated only when the service surely did nothing: a repeat would ack
                    # again (answering False) and claim other messages.
                    idempotent=False,
                )
            except NotSupported:
                self._batches = False  # a service of an earlier release
            else:
                acked = [bool(a) for a in data["acked"]]
                deliveries = [_delivery(m) for m in data["messages"]]
                return acked, BatchClaim(deliveries, float(data["now"]), data.get("retry_after"))
        return await super().ack_claim_many(
            name, acks, receipts=receipts, visibility_timeout=visibility_timeout,
            concurrency=concurrency, max_attempts=max_attempts, waiter=waiter,
        )  # fmt: skip

    async def put(self, name: str, message: NewMessage, *, dedup_window: float) -> PutResult:
        body: dict[str, Any] = {
            "queue": name,
            "id": message.id,
            "key": message.key,
            "delay": message.delay,
            "dedup_id": message.dedup_id,
            "max_attempts": message.max_attempts,
            "dedup_window": dedup_window,
        }
        if message.kind == KIND_BYTES:
            body["payload_base64"] = base64.b64encode(message.body).decode("ascii")
        else:
            body["payload"] = decode_payload(message.body, message.kind)
        data = await self._backend.call("POST", "/v1/queues/put", body)
        return PutResult(str(data["id"]), bool(data["created"]), float(data["now"]))

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
        data = await self._backend.call(
            "POST",
            "/v1/queues/claim",
            {
                "queue": name,
                "receipt": receipt,
                "visibility_timeout": visibility_timeout,
                "concurrency": concurrency,
                "max_attempts": max_attempts,
            },
            # Repeated after a lost reply: the next message is handed out, the lost one
            # delivered again after its visibility timeout (at least once, nothing lost).
            idempotent=True,
        )
        message = data.get("message")
        return ClaimResult(
            _delivery(message) if message else None, float(data["now"]), data.get("retry_after")
        )

    async def long_poll(
        self,
        name: str,
        *,
        wait: float,
        visibility_timeout: float,
        concurrency: int | None,
        max_attempts: int,
    ) -> Delivery | None:
        wait = min(max(0.0, wait), self._backend.max_wait)
        data = await self._backend.call(
            "POST",
            "/v1/queues/get",
            {
                "queue": name,
                "wait": wait,
                "visibility_timeout": visibility_timeout,
                "concurrency": concurrency,
                "max_attempts": max_attempts,
            },
            timeout=wait + POLL_SLACK,
            poll=True,
            idempotent=False,
        )
        message = data.get("message")
        return _delivery(message) if message else None

    async def ack(self, name: str, id: str, receipt: str) -> bool:
        data = await self._backend.call(
            "POST", "/v1/queues/ack", {"queue": name, "id": id, "receipt": receipt},
            idempotent=False,  # a repeat after a lost reply would answer "stale receipt"
        )
        return bool(data["acked"])


    async def nack(
        self, name: str, id: str, receipt: str, *, delay: float, error: str | None
    ) -> bool:
        data = await self._backend.call(
            "POST",
            "/v1/queues/nack",
            {"queue": name, "id": id, "receipt": receipt, "delay": delay, "error": error},
            idempotent=False,
        )
        return bool(data["nacked"])

    async def extend(self, name: str, id: str, receipt: str, seconds: float) -> float | None:
        data = await self._backend.call(
            "POST",
            "/v1/queues/extend",
            {"queue": name, "id": id, "receipt": receipt, "seconds": seconds},
            idempotent=False,
        )
        deadline = data.get("deadline")
        return None if deadline is None else float(deadline)

    async def stats(self, name: str, *, top_keys: int) -> QueueStats:
        data = await self._backend.call(
            "POST", "/v1/queues/stats", {"queue": name, "top_keys": top_keys}
        )
        return QueueStats(
            name=data["name"],
            ready=int(data["ready"]),
            delayed=int(data["delayed"]),
            in_flight=int(data["in_flight"]),
            dead=int(data["dead"]),
            oldest_age=data["oldest_age"],
            deepest_keys=tuple(
                KeyDepth(k["key"], int(k["pending"])) for k in data["deepest_keys"]
            ),
            now=float(data["now"]),
        )

    async def dead_letters(self, name: str, *, limit: int) -> list[DeadLetterRow]:
        data = await self._backend.call(
            "POST", "/v1/queues/dead", {"queue": name, "limit": limit}
        )
        rows = []
        for d in data["dead_letters"]:
            body, kind = _encoded(d)
            rows.append(
                DeadLetterRow(
                    d["id"], d["key"], body, kind, int(d["attempts"]), d["enqueued_at"],
                    d["died_at"], d["error"],
                )
            )
        return rows

    async def requeue(self, name: str, ids: list[str] | None) -> int:
        data = await self._backend.call(
            "POST", "/v1/admin/requeue-dead", {"queue": name, "ids": ids}, idempotent=False
        )
        return int(data["requeued"])

    async def purge_dead(self, name: str, ids: list[str] | None) -> int:
        data = await self._backend.call(
            "POST", "/v1/admin/purge-dead", {"queue": name, "ids": ids}, idempotent=False
        )
        return int(data["purged"])

    async def names(self, prefix: str, max_count: int) -> list[str]:
        data = await self._backend.call(
            "GET", "/v1/queues", params={"prefix": prefix, "max_count": min(max_count, MAX_LIST)}
        )
        return list(data["queues"])

    async def open_waiter(self, name: str) -> AsyncQueueWaiter:
        raise NotSupported(
            "blocking gets over HTTP are long polls on the service (long_poll), not local waiters"
        )


def _encoded(message: dict[str, Any]) -> tuple[bytes, int]:
    """A payload as the service answered it, encoded again as the store keeps it."""
    if message.get("payload_base64") is not None:
        return base64.b64decode(message["payload_base64"]), KIND_BYTES
    return encode_payload(message.get("payload"))


def _delivery(message: dict[str, Any]) -> Delivery:
    body, kind = _encoded(message)
    return Delivery(
        id=message["id"],
        key=message["key"],
        body=body,
        kind=kind,
        attempt=int(message["attempt"]),
        enqueued_at=float(message["enqueued_at"]),
        receipt=message["receipt"],
        deadline=float(message["deadline"]),
    )


def _rate_status(data: dict[str, Any]) -> RateStatus:
    def optional(value: Any, kind: Callable[[Any], Any]) -> Any:
        return None if value is None else kind(value)

    return RateStatus(
        name=data["name"],
        rate=optional(data["rate"], int),
        per=optional(data["per"], float),
        burst=optional(data["burst"], int),
        waiters=tuple(
            RateWaiterInfo(
                w["holder"], int(w["position"]), float(w["joined_at"]), float(w["slot"])
            )
            for w in data["waiters"]
        ),
        admitted=tuple(float(t) for t in data["admitted"]),
        next_slot=float(data["next_slot"]),
        now=float(data["now"]),
    )


class AsyncHTTPBackend:
    characteristics = CHARACTERISTICS

    def __init__(
        self,
        http: httpx.AsyncClient,
        poll: httpx.AsyncClient,
        base: str,
        shown: str,
        scheme: str,
        timeout: float,
        reopen: Callable[[], tuple[httpx.AsyncClient, httpx.AsyncClient]] | None = None,
    ) -> None:
        self._http = http  # operations: acquire steps, renewals, releases, status
        self._poll = poll  # long polls only, so waiters never hold up a renewal
        # New clients like these two, for a forked child (see _core/forks.py).
        self._reopen = reopen
        self._forks = forks.generation()
        self._closed = False
        self._queues = AsyncHTTPQueueBackend(self)
        self._base = base
        self._shown = shown
        self._timeout = timeout
        self.max_wait = 50.0
        self.info: dict[str, Any] = {}
        self.characteristics = dataclasses.replace(
            CHARACTERISTICS, scheme=scheme, description=f"Turnstile HTTP service at {shown}"
        )

    async def call(
        self,
        method: str,
        path: str,
        body: dict[str, Any] | None = None,
        *,
        params: dict[str, Any] | None = None,
        timeout: float | None = None,
        poll: bool = False,
        idempotent: bool = True,
        budget: float | None = None,
    ) -> Any:
        """One request, retried while the service is away (a restart, an overload), with
        capped exponential backoff and jitter, for at most ``budget`` seconds (default: the
        client's ``timeout``). Connection refusals and 503 ``overloaded``/``shutting_down``
        (answered before anything was done) are always retried; a reset connection, a timeout
        and other 503s only when repeating the request is harmless (``idempotent``: every
        lock operation, by holder or token; the reads)."""
        if self._closed:
            raise BackendUnavailable(f"the client of {self._shown} is closed")
        self._check_fork()
        per_request = self._timeout if timeout is None else timeout
        deadline = time.monotonic() + (self._timeout if budget is None else budget)
        attempt = 0
        while True:
            http = self._poll if poll else self._http
            retry_after: float | None = None
            try:
                response = await http.request(
                    method, self._base + path, json=body, params=params, timeout=per_request
                )
            except httpx.TimeoutException as exc:
                failure: Exception = BackendUnavailable(
                    f"the Turnstile service at {self._shown} did not answer in time"
                )
                failure.__cause__ = exc
                again = idempotent or isinstance(exc, httpx.ConnectTimeout)
            except httpx.HTTPError as exc:
                failure = BackendUnavailable(
                    f"cannot reach the Turnstile service at {self._shown}: "
                    f"{type(exc).__name__}: {exc}"
                )
                failure.__cause__ = exc
                again = idempotent or isinstance(exc, httpx.ConnectError)
            else:
                if response.status_code == 200:
                    try:
                        return response.json()
                    except ValueError as exc:
                        raise BackendUnavailable(
                            f"the Turnstile service at {self._shown} answered something other "
                            "than JSON"
                        ) from exc
                failure = _error(self._shown, response)
                again = _retriable(response, idempotent)
                retry_after = _retry_after(response)
            left = deadline - time.monotonic()
            if not again or left <= 0:
                raise failure
            attempt += 1
            pause = min(RETRY_CAP, RETRY_FIRST * 2 ** min(attempt, 16))
            pause *= random.uniform(0.5, 1.0)  # jitter: a restart's waiters do not return in step
            if retry_after is not None:
                pause = max(pause, retry_after)
            log.debug("retrying %s %s in %.2f s: %s", method, path, min(pause, left), failure)
            await _compat.sleep(min(pause, left))
            self._check_fork()

    def _check_fork(self) -> None:
        """In a forked child: connections of its own. Keep-alive connections copied from the
        parent would carry both processes' requests; they are abandoned, never closed."""
        if self._forks == forks.generation() or self._reopen is None:
            return
        self._forks = forks.generation()
        forks.abandon(self._http, self._poll)
        self._http, self._poll = self._reopen()

    async def handshake(self) -> None:
        """Check that a Turnstile service answers and accepts the token; learn its store."""
        try:
            # No retries: a service that is not there at connect() is reported at once.
            info = await self.call("GET", "/v1/info", budget=0.0)
        except NotSupported:
            raise ConfigurationError(
                f"{self._shown} does not look like a Turnstile service (no /v1/info); "
                "check the URL (and any path behind a proxy)"
            ) from None
        except BackendUnavailable as exc:
            raise BackendUnavailable(
                f"{exc}; is `turnstile serve` running there?"
            ) from exc.__cause__
        if not isinstance(info, dict) or info.get("service") != "turnstile":
            raise ConfigurationError(f"{self._shown} does not look like a Turnstile service")
        self.info = info
        store = info.get("backend", {})
        self.max_wait = float(info.get("limits", {}).get("max_wait", self.max_wait))
        self.characteristics = dataclasses.replace(
            self.characteristics,
            durable=bool(store.get("durable", False)),
            woken_by_store=bool(store.get("woken_by_store", True)),
            description=f"Turnstile HTTP service at {self._shown} over "
            f"{store.get('description', 'an unknown store')}",
        )

    def queues(self) -> AsyncHTTPQueueBackend:
        """The queue operations of the service (``/v1/queues/*``)."""
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
        # Cancelled while the request is in flight, the step may still be applied by the
        # service after the caller's clean-up (a release, on another connection) and leave a
        # grant behind for its ttl: it is answered first, then the cancellation goes on.
        data = await _compat.finish_then_cancel(
            self.call(
                "POST",
                "/v1/semaphores/try-acquire",
                {
                    "name": name,
                    "holder": holder,
                    "limit": limit,
                    "ttl": ttl,
                    "wait_ttl": wait_ttl,
                    "enqueue": enqueue,
                    **_ranked(priority, ageing),
                    **_grouped(key, per_key),
                },
                # A place in line lapses after wait_ttl: retrying longer would not keep it.
                budget=min(self._timeout, wait_ttl),
            )
        )
        lease = data.get("lease")
        return AcquireResult(
            _grant(lease) if lease else None,
            data.get("position"),
            float(data["now"]),
            data.get("retry_after"),
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
        # The stored text is the API's JSON form already (_core/callbacks.py).
        data = await _compat.finish_then_cancel(
            self.call(
                "POST",
                "/v1/semaphores/try-acquire",
                {
                    "name": name,
                    "holder": holder,
                    "limit": limit,
                    "ttl": ttl,
                    "wait_ttl": wait_ttl,
                    "callback": json.loads(callback),
                    **_ranked(priority, ageing),
                    **_grouped(key, per_key),
                },
                budget=min(self._timeout, wait_ttl),
            )
        )
        lease = data.get("lease")
        return AcquireResult(
            _grant(lease) if lease else None,
            data.get("position"),
            float(data["now"]),
            data.get("retry_after"),
        )

    async def take_deliveries(self, *, lease: float, max_count: int) -> list[CallbackDelivery]:
        raise NotSupported(_SERVICE_DELIVERS)

    async def settle_delivery(
        self, name: str, token: int, *, outcome: str, retry_in: float
    ) -> bool:
        raise NotSupported(_SERVICE_DELIVERS)

    async def pending_deliveries(self) -> int:
        data = await self.call("GET", "/v1/deliveries")
        pending = data.get("pending")
        if pending is None:
            raise BackendUnavailable(
                f"the Turnstile service at {self._shown} cannot count pending deliveries now"
            )
        return int(pending)

    async def release(self, name: str, holder: str, token: int | None) -> bool:
        body: dict[str, Any] = {"name": name, "holder": holder}
        if token is not None:
            body["token"] = token
        data = await self.call("POST", "/v1/semaphores/release", body)
        return bool(data["released"])

    async def renew(self, name: str, holder: str, token: int, ttl: float) -> Grant | None:
        try:
            data = await self.call(
                "POST",
                "/v1/semaphores/renew",
                {"name": name, "holder": holder, "token": token, "ttl": ttl},
                # The renewer tries again sooner on its own; never retry past half a lease.
                budget=min(self._timeout, ttl / 2),
            )
        except LeaseLost:
            return None
        return _grant(data["lease"])

    async def set_limit(self, name: str, limit: int) -> int | None:
        data = await self.call("POST", "/v1/semaphores/limit", {"name": name, "limit": limit})
        previous = data["previous"]
        return None if previous is None else int(previous)

    async def status(self, name: str) -> Status:
        data = await self.call("POST", "/v1/semaphores/status", {"name": name})
        return Status(
            name=data["name"],
            limit=data["limit"],
            per_key=data.get("per_key"),
            holders=tuple(
                HolderInfo(
                    h["holder"],
                    int(h["token"]),
                    h["acquired_at"],
                    h["expires_at"],
                    h.get("callback"),
                    h.get("delivery"),
                    h.get("key"),
                )
                for h in data["holders"]
            ),
            waiters=tuple(
                WaiterInfo(
                    w["holder"],
                    int(w["position"]),
                    w["joined_at"],
                    w["expires_at"],
                    w.get("callback"),
                    w.get("key"),
                )
                for w in data["waiters"]
            ),
            now=float(data["now"]),
        )

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
        # One step: a try-acquire whose place lasts `grace` past its slot. Repeating it is
        # harmless while the holder waits (it keeps its place); after an admission whose
        # answer was lost, a repeat joins the line again: a later admission, never more.
        data = await self.call(
            "POST",
            "/v1/rates/try-acquire",
            {
                "name": name,
                "holder": holder,
                "rate": rate,
                "per": per,
                "burst": burst,
                "wait_ttl": grace,
                "enqueue": enqueue,
                **_ranked(priority, ageing),
            },
            # A place in line lapses `grace` after its slot: retrying longer would not keep it.
            budget=min(self._timeout, grace),
        )
        position = data.get("position")
        return RateResult(
            bool(data["acquired"]),
            None if position is None else int(position),
            float(data["now"]),
            float(data["retry_after"]),
        )

    async def rate_leave(self, name: str, holder: str) -> bool:
        data = await self.call("POST", "/v1/rates/leave", {"name": name, "holder": holder})
        return bool(data["left"])

    async def rate_status(self, name: str) -> RateStatus:
        data = await self.call("POST", "/v1/rates/status", {"name": name})
        return _rate_status(data)

    async def names(self, prefix: str, max_count: int) -> list[str]:
        data = await self.call(
            "GET",
            "/v1/names",
            params={"prefix": prefix, "max_count": min(max_count, MAX_LIST)},
        )
        return list(data["names"])

    async def open_waiter(self, name: str, holder: str) -> AsyncHTTPWaiter:
        return AsyncHTTPWaiter(self, name, holder)

    async def ping(self) -> None:
        self._check_fork()
        try:
            response = await self._http.get(self._base + "/healthz", timeout=self._timeout)
        except httpx.HTTPError as exc:
            raise BackendUnavailable(
                f"cannot reach the Turnstile service at {self._shown}: {type(exc).__name__}"
            ) from exc
        if response.status_code != 200:
            raise _error(self._shown, response)

    async def close(self) -> None:
        self._closed = True
        if self._forks != forks.generation():
            # A forked child closing a client it never used: the connections are the
            # parent's (closing a TLS one would send its close_notify on the parent's behalf).
            forks.abandon(self._http, self._poll)
            return
        await self._http.aclose()
        await self._poll.aclose()


async def open_backend(
    url: str,
    parts: SplitResult,
    *,
    token: str | None = None,
    timeout: float = DEFAULT_TIMEOUT,
    verify: bool | str = True,
) -> AsyncHTTPBackend:
    scheme = parts.scheme.lower()
    if not parts.hostname:
        raise ConfigurationError(f"{redact(url)!r} names no host; e.g. http://127.0.0.1:8080")
    if parts.query or parts.fragment:
        raise ConfigurationError(
            f"{redact(url)!r}: the HTTP backend takes no query or fragment; pass options "
            "as keyword arguments of connect() (token=, timeout=, verify=)"
        )
    if isinstance(timeout, bool) or not isinstance(timeout, int | float) or not timeout > 0:
        raise ConfigurationError("timeout must be a positive number of seconds")
    secret = token or parts.password or os.environ.get(ENV_TOKEN) or None
    host = parts.hostname if ":" not in parts.hostname else f"[{parts.hostname}]"
    netloc = host if parts.port is None else f"{host}:{parts.port}"
    base = urlunsplit((scheme, netloc, parts.path.rstrip("/"), "", ""))
    headers = {"Accept": "application/json", "User-Agent": "turnstile-python"}
    if secret:
        headers["Authorization"] = f"Bearer {secret}"
    tls: bool | ssl.SSLContext = verify if isinstance(verify, bool) else _tls(verify)
    def clients() -> tuple[httpx.AsyncClient, httpx.AsyncClient]:
        http = httpx.AsyncClient(headers=headers, verify=tls, timeout=timeout)
        # One connection per waiting long poll, however many wait at once.
        unbounded = httpx.Limits(max_connections=None, max_keepalive_connections=20)
        poll = httpx.AsyncClient(headers=headers, verify=tls, timeout=timeout, limits=unbounded)
        return http, poll

    backend = AsyncHTTPBackend(*clients(), base, base, scheme, float(timeout), clients)
    try:
        await backend.handshake()
    except BaseException:
        await backend.close()
        raise
    return backend


def _tls(cafile: str) -> ssl.SSLContext:
    try:
        return ssl.create_default_context(cafile=cafile)
    except (OSError, ssl.SSLError) as exc:
        raise ConfigurationError(f"cannot load the CA bundle {cafile!r}: {exc}") from None
