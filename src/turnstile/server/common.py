"""What every endpoint shares: the per-instance :class:`Service`, the request context
(:class:`Ctx`: who is asking and what they may do), long polls, the lease's JSON form."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import secrets
import time
from collections.abc import Awaitable, Callable, Coroutine, Iterable
from typing import Any, TypeVar

from starlette.requests import Request

from .._core.records import Grant, QueueStats, Status
from ..aio import AsyncClient, AsyncLease
from ..aio import connect as aio_connect
from ..errors import NotSupported
from ..workflows.deliverer import Deliverer
from . import deliveries
from .auth import Principal, bearer, is_loopback_host_header
from .bounds import BodyBudget
from .config import ServerConfig
from .deliveries import Deliveries
from .errors import ApiError
from .metrics import Metrics
from .observe import EventLog, Tracker
from .table import Args

log = logging.getLogger("turnstile.server")
T = TypeVar("T")

MAX_LIST = 10_000


class Service:
    """Everything one instance holds: the client, the token table and its counters."""

    def __init__(self, config: ServerConfig, client: AsyncClient | None = None) -> None:
        self.config = config
        self._client = client
        self._own_client = client is None
        self.metrics = Metrics()
        self.bodies = BodyBudget(config.max_body_memory)  # bytes of bodies being read
        self.events = EventLog(config.event_capacity)
        self.tracker = Tracker(self.events, self.metrics)
        self.started = time.time()
        self.closing = asyncio.Event()  # set when this instance starts shutting down
        # Queues configured with --queue: listed even while empty (the store lists only
        # queues that hold messages).
        self._configured = tuple(dict.fromkeys(config.queues))
        self._observer: asyncio.Task[None] | None = None
        # Callback grants: the secret signing HTTP callbacks, this instance's deliverer.
        self.callback_secret = config.callback_secret
        self.deliveries = Deliveries()

    @property
    def client(self) -> AsyncClient:
        if self._client is None:
            raise ApiError("backend_unavailable", "the service is starting", {"Retry-After": "1"})
        return self._client

    async def start(self) -> None:
        if self._client is None:
            self._client = await aio_connect(self.config.url)
        backend = self._client.backend
        if self.config.deliver and backend.characteristics.local_deliveries:
            deliverer = Deliverer(
                backend,
                secret=self.callback_secret,
                sender=deliveries.sender(self.callback_secret, self.config.callback_hosts),
            )
            await deliverer.start()
            self.deliveries.deliverer = deliverer
        if self.config.observe_interval > 0:
            self._observer = asyncio.get_running_loop().create_task(
                self._observe_loop(), name="turnstile-observer"
            )

    async def pending_deliveries(self) -> int:
        """The store's count of grants waiting for their delivery."""
        return await self.client.backend.pending_deliveries()

    def begin_shutdown(self) -> None:
        """End every long poll now (acquire answers ``shutting_down``; waits answer "not
        woken") instead of letting them run out while the server drains."""
        self.closing.set()

    async def stop(self) -> None:
        self.begin_shutdown()
        if self._observer is not None:
            self._observer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._observer
        deliverer, self.deliveries.deliverer = self.deliveries.deliverer, None
        if deliverer is not None:
            await deliverer.stop()
        if self._own_client and self._client is not None:
            await self._client.close()

    async def _observe_loop(self) -> None:
        everyone = Principal("observer")
        while True:
            await asyncio.sleep(self.config.observe_interval)
            try:
                await self.look(everyone, self.config.observe_max_names)
            except Exception as exc:  # the store may be down for a while; keep looking
                log.debug("background look failed: %s", exc)

    async def look(self, principal: Principal, max_names: int) -> tuple[list[Status], bool]:
        """Current status of the names ``principal`` may read (at most ``max_names``), fed to
        the tracker so that expiries and grants made elsewhere become events."""
        names, truncated = await listed(principal, "", max_names, self.client.names)
        listed_now = set(names)
        revisit = [n for n in self.tracker.known_names(principal) if n not in listed_now]
        statuses = await _gather(
            [self.client.status(n) for n in names + revisit[:max_names]], limit=8
        )
        for status in statuses:
            self.tracker.observe(status)
        return [s for s in statuses if s.holders or s.waiters], truncated

    async def queue_names(
        self, principal: Principal, prefix: str, max_count: int
    ) -> tuple[list[str], bool]:
        """Queues starting with ``prefix`` that ``principal`` may read: those holding
        messages in the store, and the configured ones. The first ``max_count`` in
        code-point order, and whether there were more."""
        configured = [n for n in self._configured if n.startswith(prefix) and principal.can_read(n)]
        try:
            return await listed(
                principal, prefix, max_count, self.client.queue_names, also=configured
            )
        except NotSupported:
            return sorted(configured)[:max_count], len(configured) > max_count

    async def queue_stats(self, principal: Principal, max_queues: int) -> list[QueueStats]:
        """Stats of the queues the principal may read (skipping any that fail)."""
        names, _ = await self.queue_names(principal, "", max_queues)

        async def one(name: str) -> QueueStats | None:
            try:
                stats: QueueStats = await self.client.queue(name).stats(5)
            except NotSupported:
                return None
            return stats

        found = await _gather([one(n) for n in names], limit=8)
        return [s for s in found if s is not None]

    def authenticate(self, request: Request) -> Principal:
        if self.config.tokens.open and not is_loopback_host_header(
            request.headers.get("host", "")
        ):
            raise ApiError(
                "forbidden",
                "this service has no tokens, so it only answers requests addressed to "
                "localhost or a loopback address (protection against DNS rebinding); "
                "configure tokens to serve other host names",
            )
        presented = bearer(request.headers.get("authorization"))
        principal = self.config.tokens.authenticate(presented)
        if principal is None:
            why = "missing bearer token" if presented is None else "unknown bearer token"
            raise ApiError(
                "unauthorized",
                f"{why}: send 'Authorization: Bearer <token>'",
                {"WWW-Authenticate": 'Bearer realm="turnstile"'},
            )
        return principal


async def listed(
    principal: Principal,
    prefix: str,
    max_count: int,
    fetch: Callable[[str, int], Awaitable[list[str]]],
    *,
    also: Iterable[str] = (),
) -> tuple[list[str], bool]:
    """A listing of the store's names starting with ``prefix`` that ``principal`` may read
    (``fetch(store_prefix, max_count)`` once per prefix it may read, plus ``also``): the
    first ``max_count`` in code-point order, and whether there were more."""
    found = set(also)
    more = False
    for allowed in principal.listing_prefixes(prefix):
        fetched = await fetch(allowed, max_count + 1)
        more = more or len(fetched) > max_count
        # The store lists by plain prefix; the token's prefixes match at a separator only.
        found.update(n for n in fetched if principal.can_read(n))
    names = sorted(found)
    return names[:max_count], more or len(names) > max_count


async def _gather(coros: list[Coroutine[Any, Any, T]], limit: int) -> list[T]:
    gate = asyncio.Semaphore(limit)

    async def one(coro: Coroutine[Any, Any, T]) -> T:
        async with gate:
            return await coro

    return list(await asyncio.gather(*(one(c) for c in coros)))


# -- request helpers -------------------------------------------------------------------------


class Ctx:
    """One request: the caller, its parsed fields and what it may do."""

    def __init__(
        self, request: Request, service: Service, principal: Principal, args: Args
    ) -> None:
        self.request = request
        self.service = service
        self.principal = principal
        self.args = args  # the request's fields, as the endpoint table declares them
        self.tracker = service.tracker

    @property
    def client(self) -> AsyncClient:
        # Looked up when used: while the service is starting it answers backend_unavailable,
        # which /healthz reports in its own form.
        return self.service.client

    def may_read(self, name: str) -> None:
        if not self.principal.can_read(name):
            raise ApiError(
                "forbidden",
                f"token {self.principal.name!r} may only use names starting with "
                f"{_show(self.principal.prefixes)}",
            )

    def may_write(self, name: str) -> None:
        self.may_read(name)
        if self.principal.read_only:
            raise ApiError("read_only", f"token {self.principal.name!r} is read-only")

    def admin(self) -> None:
        if not self.principal.admin:
            raise ApiError("admin_required", f"token {self.principal.name!r} is not an admin")


def _show(prefixes: tuple[str, ...]) -> str:
    return ", ".join(json.dumps(p, ensure_ascii=False) for p in prefixes)


def new_holder() -> str:
    return f"http/{secrets.token_hex(8)}"


DONE, GONE, CLOSING = "done", "gone", "closing"


async def long_poll(
    request: Request, closing: asyncio.Event, work: Coroutine[Any, Any, T]
) -> tuple[str, T | None]:
    """Run ``work`` (a long poll), but cancel it when the client goes away or this instance
    starts shutting down (so a rolling restart does not wait out every long poll).

    Returns ``(DONE, result)`` normally, else ``(GONE | CLOSING, result_or_None)``: a result
    produced anyway is returned so the caller can undo it."""
    task = asyncio.ensure_future(work)

    async def gone() -> None:
        while True:
            message = await request.receive()
            if message["type"] == "http.disconnect":
                return

    watchers = {asyncio.ensure_future(gone()): GONE, asyncio.ensure_future(closing.wait()): CLOSING}
    try:
        await asyncio.wait({task, *watchers}, return_when=asyncio.FIRST_COMPLETED)
    except BaseException:
        task.cancel()
        for watcher in watchers:
            watcher.cancel()
        raise
    for watcher in watchers:
        watcher.cancel()
    if task.done():
        return DONE, task.result()
    outcome = next(v for w, v in watchers.items() if w.done() and not w.cancelled())
    task.cancel()
    try:
        return outcome, await task
    except (asyncio.CancelledError, Exception):
        return outcome, None


def shutting_down() -> ApiError:
    return ApiError(
        "shutting_down",
        "this instance is shutting down; the request was abandoned (nothing is held); retry",
        {"Retry-After": "1"},
    )


def lease_dict(grant: Grant, now: float) -> dict[str, Any]:
    return {
        "name": grant.name,
        "holder": grant.holder,
        "token": grant.token,
        "acquired_at": grant.acquired_at,
        "expires_at": grant.expires_at,
        "expires_in": round(max(0.0, grant.expires_at - now), 6),
    }


def grant_of(lease: AsyncLease) -> Grant:
    """A lease as the store's record of it (what the tracker and :func:`lease_dict` take)."""
    return Grant(lease.name, lease.holder, lease.token, lease.acquired_at, lease.expires_at)
