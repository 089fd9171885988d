"""The ASGI app: a thin JSON layer over the public client API.

Every request is answered by calling the store through one :class:`turnstile.aio.Client`;
the app keeps nothing that correctness depends on (only counters, recent events and the last
look at each name, for the dashboard and ``/metrics``), so any number of instances can run
behind a load balancer on one Redis or PostgreSQL.

Names travel in JSON bodies (``POST``) or in a query parameter (``GET …?name=``), never in
the path: any characters work (``/``, ``?``, ``%``, spaces, emoji) with no path
normalisation by proxies or clients to worry about, and a workflow engine can build the body
from its state without URL-encoding.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import secrets
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Mapping
from importlib import resources
from typing import Any, TypeVar

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from .. import __version__
from .._core import validate
from .._core.models import Grant, Status
from ..aio import AsyncClient
from ..aio import connect as aio_connect
from ..errors import AcquireTimeout, InvalidArgument, LeaseLost
from . import openapi
from .auth import Principal, bearer
from .config import DEFAULT_MAX_BODY, DEFAULT_MAX_WAIT, ServerConfig
from .errors import ApiError, error_response, from_exception
from .metrics import Gauge, Metrics
from .observe import EventLog, Tracker

log = logging.getLogger("turnstile.server")
T = TypeVar("T")

MAX_LIST = 10_000
KINDS = ("locks", "semaphores")


class Service:
    """Everything one instance holds: the client, the token table and its counters."""

    def __init__(self, config: ServerConfig, client: AsyncClient | None = None) -> None:
        self.config = config
        self._client = client
        self._own_client = client is None
        self.metrics = Metrics()
        self.events = EventLog(config.event_capacity)
        self.tracker = Tracker(self.events, self.metrics)
        self.started = time.time()
        self.closing = asyncio.Event()  # set when this instance starts shutting down
        self._observer: asyncio.Task[None] | None = None

    @property
    def client(self) -> AsyncClient:
        if self._client is None:
            raise ApiError("backend_unavailable", "the service is starting", {"Retry-After": "1"})
        return self._client

    async def start(self) -> None:
        if self._client is None:
            self._client = await aio_connect(self.config.url)
        if self.config.observe_interval > 0:
            self._observer = asyncio.get_running_loop().create_task(
                self._observe_loop(), name="turnstile-observer"
            )

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
        found: set[str] = set()
        for prefix in principal.listing_prefixes(""):
            found.update(await self.client.names(prefix, max_names + 1))
        names = sorted(found)
        truncated = len(names) > max_names
        names = names[:max_names]
        listed = set(names)
        revisit = [n for n in self.tracker.known_names(principal) if n not in listed]
        statuses = await _gather(
            [self.client.status(n) for n in names + revisit[:max_names]], limit=8
        )
        for status in statuses:
            self.tracker.observe(status)
        return [s for s in statuses if s.holders or s.waiters], truncated

    def authenticate(self, request: Request) -> Principal:
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


async def _gather(coros: list[Coroutine[Any, Any, T]], limit: int) -> list[T]:
    gate = asyncio.Semaphore(limit)

    async def one(coro: Coroutine[Any, Any, T]) -> T:
        async with gate:
            return await coro

    return list(await asyncio.gather(*(one(c) for c in coros)))


# -- request helpers -------------------------------------------------------------------------


class Ctx:
    """One request: the caller, its body and what it may do."""

    def __init__(self, request: Request, service: Service, principal: Principal) -> None:
        self.request = request
        self.service = service
        self.principal = principal
        self.client = service.client
        self.tracker = service.tracker

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


def _reject_constant(value: str) -> Any:
    raise ValueError(f"{value} is not valid JSON")


class Body:
    """A JSON object body with a fixed set of fields; unknown fields are refused."""

    def __init__(self, data: Mapping[str, Any], allowed: set[str]) -> None:
        unknown = sorted(set(data) - allowed)
        if unknown:
            raise InvalidArgument(
                f"unknown field(s) {', '.join(map(repr, unknown))}; "
                f"accepted: {', '.join(sorted(allowed))}"
            )
        self.data = data

    def required(self, key: str) -> Any:
        value = self.data.get(key)
        if value is None:
            raise InvalidArgument(f"{key} is required")
        return value

    def get(self, key: str, default: Any = None) -> Any:
        value = self.data.get(key)
        return default if value is None else value


async def read_body(request: Request, max_body: int, allowed: set[str]) -> Body:
    ctype = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if ctype != "application/json":
        raise ApiError(
            "unsupported_media_type",
            "send the body as JSON with 'Content-Type: application/json'",
        )
    declared = request.headers.get("content-length")
    if declared is not None:
        if not declared.isdigit():
            raise ApiError("bad_json", "invalid Content-Length header")
        if int(declared) > max_body:
            raise ApiError("payload_too_large", f"the body may be at most {max_body} bytes")
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > max_body:
            raise ApiError("payload_too_large", f"the body may be at most {max_body} bytes")
        chunks.append(chunk)
    try:
        data = json.loads(b"".join(chunks), parse_constant=_reject_constant)
    except (ValueError, RecursionError) as exc:
        message = str(exc) if isinstance(exc, json.JSONDecodeError) else "not valid JSON"
        raise ApiError("bad_json", f"the body is not valid JSON: {message}") from None
    if not isinstance(data, dict):
        raise InvalidArgument(f"the body must be a JSON object, got {_json_type(data)}")
    return Body(data, allowed)


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    return "an array"


def query_int(request: Request, key: str, default: int, low: int, high: int) -> int:
    raw = request.query_params.get(key)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise InvalidArgument(f"{key} must be an integer from {low} to {high}") from None
    if not low <= value <= high:
        raise InvalidArgument(f"{key} must be an integer from {low} to {high}, got {value}")
    return value


def integral(value: Any) -> Any:
    """JSON has numbers, not ints and floats: ``5.0`` is the integer 5 (as in JSON Schema)."""
    if isinstance(value, float) and value.is_integer() and abs(value) < 2**63:
        return int(value)
    return value


def bool_field(value: Any, arg: str) -> bool:
    if not isinstance(value, bool):
        raise InvalidArgument(f"{arg} must be true or false")
    return value


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


# -- lock and semaphore endpoints ------------------------------------------------------------


def _limit(kind: str, body: Body) -> int:
    if kind == "locks":
        return 1
    return validate.limit(integral(body.required("limit")))


def _fields(kind: str, *names: str) -> set[str]:
    """The body fields of an acquire step: semaphores also take ``limit``."""
    return set(names) | ({"limit"} if kind == "semaphores" else set())


async def acquire(ctx: Ctx, kind: str) -> Any:
    body = await ctx_body(ctx, _fields(kind, "name", "ttl", "holder", "wait"))
    name = validate.name(body.required("name"))
    ctx.may_write(name)
    limit = _limit(kind, body)
    ttl = validate.ttl(body.get("ttl", 30.0))
    holder = validate.holder(body.get("holder") or new_holder())
    wait = validate.seconds(body.get("wait", 0.0), "wait", high=ctx.service.config.max_wait)
    sem = ctx.client.semaphore(name, limit, ttl)
    started = time.monotonic()
    try:
        outcome, lease = await long_poll(
            ctx.request, ctx.service.closing, _await(sem.acquire(wait, holder))
        )
    except AcquireTimeout:
        ctx.tracker.timed_out(name, holder, wait)
        raise
    if outcome != DONE:
        if lease is not None:
            # The grant arrived as the request was abandoned: hand the slot on rather than
            # strand it for a whole ttl.
            await sem.release(lease.holder, lease.token)
        if outcome == CLOSING:
            raise shutting_down()
        return Response(status_code=499)  # the client left; nobody reads this
    assert lease is not None
    claimed_at = lease.expires_at - ttl
    grant = Grant(name, lease.holder, lease.token, lease.acquired_at, lease.expires_at)
    ctx.tracker.granted(grant, claimed_at, waited=time.monotonic() - started)
    return {"acquired": True, "lease": lease_dict(grant, claimed_at)}


async def _await(awaitable: Awaitable[T]) -> T:
    return await awaitable


async def try_acquire(ctx: Ctx, kind: str) -> Any:
    body = await ctx_body(
        ctx, _fields(kind, "name", "ttl", "holder", "wait_ttl", "enqueue")
    )
    name = validate.name(body.required("name"))
    ctx.may_write(name)
    limit = _limit(kind, body)
    ttl = validate.ttl(body.get("ttl", 30.0))
    holder = validate.holder(body.required("holder"))
    wait_ttl = validate.ttl(body.get("wait_ttl", ttl), "wait_ttl")
    enqueue = bool_field(body.get("enqueue", True), "enqueue")
    # The raw protocol step (what Semaphore.try_acquire does), answering its full result.
    result = await ctx.client.backend.acquire(
        name, holder, limit=limit, ttl=ttl, wait_ttl=wait_ttl, enqueue=enqueue
    )
    if result.grant is not None:
        ctx.tracker.granted(result.grant, result.now)
        lease = lease_dict(result.grant, result.now)
    else:
        lease = None
        if result.position is not None:
            ctx.tracker.asked(name, holder)
    return {
        "acquired": result.grant is not None,
        "position": result.position,
        "lease": lease,
        "now": result.now,
        "retry_after": result.retry_after,
    }


async def renew(ctx: Ctx, kind: str) -> Any:
    body = await ctx_body(ctx, {"name", "holder", "token", "ttl"})
    name = validate.name(body.required("name"))
    ctx.may_write(name)
    holder = validate.holder(body.required("holder"))
    token = validate.token(integral(body.required("token")))
    assert token is not None
    ttl = validate.ttl(body.required("ttl"))
    grant = await ctx.client.backend.renew(name, holder, token, ttl)
    if grant is None:
        ctx.tracker.lost(name, holder, token)
        raise LeaseLost(f"the lease on {name!r} (token {token}) expired or was taken over")
    now = grant.expires_at - ttl
    return {"lease": lease_dict(grant, now)}


async def release(ctx: Ctx, kind: str) -> Any:
    body = await ctx_body(ctx, {"name", "holder", "token"})
    name = validate.name(body.required("name"))
    ctx.may_write(name)
    holder = validate.holder(body.required("holder"))
    token = validate.token(integral(body.get("token")))
    released = await ctx.client.lock(name).release(holder, token)
    ctx.tracker.released(name, holder, token, released)
    return {"released": released}


async def status(ctx: Ctx, kind: str) -> Any:
    if ctx.request.method == "GET":
        name = validate.name(ctx.request.query_params.get("name"))
    else:
        body = await ctx_body(ctx, {"name"})
        name = validate.name(body.required("name"))
    ctx.may_read(name)
    found = await ctx.client.status(name)
    ctx.tracker.observe(found)
    return found.to_dict()


async def wait(ctx: Ctx, kind: str) -> Any:
    """Low-level: block until (name, holder) is woken by a hand-over, or ``timeout``."""
    body = await ctx_body(ctx, {"name", "holder", "timeout"})
    name = validate.name(body.required("name"))
    ctx.may_write(name)
    holder = validate.holder(body.required("holder"))
    timeout = validate.seconds(body.required("timeout"), "timeout",
                               high=ctx.service.config.max_wait)
    backend = ctx.client.backend

    async def watch() -> bool:
        waiter = await backend.open_waiter(name, holder)
        try:
            # Armed first, then look: a hand-over before the arming shows in the status.
            found = await backend.status(name)
            if any(h.holder == holder for h in found.holders):
                return True
            return await waiter.wait(timeout)
        finally:
            await waiter.close()

    outcome, woken = await long_poll(ctx.request, ctx.service.closing, watch())
    if outcome == GONE:
        return Response(status_code=499)
    # Shutting down: answer "not woken"; the client's next step finds another instance.
    return {"woken": bool(woken)}


async def names(ctx: Ctx) -> Any:
    prefix = ctx.request.query_params.get("prefix", "")
    max_count = query_int(ctx.request, "max_count", 1000, 1, MAX_LIST)
    found: set[str] = set()
    for allowed in ctx.principal.listing_prefixes(prefix):
        found.update(await ctx.client.names(allowed, max_count))
    listed = sorted(found)
    return {"names": listed[:max_count], "truncated": len(listed) > max_count}


async def force_release(ctx: Ctx) -> Any:
    body = await ctx_body(ctx, {"name", "holder"})
    name = validate.name(body.required("name"))
    ctx.may_write(name)
    ctx.admin()
    holder = body.get("holder")
    if holder is not None:
        targets = [validate.holder(holder)]
    else:
        found = await ctx.client.status(name)
        targets = [h.holder for h in found.holders] + [w.holder for w in found.waiters]
    released = []
    lock = ctx.client.lock(name)
    for target in targets:
        if await lock.release(target):
            released.append(target)
            ctx.tracker.released(name, target, None, True, kind="force_released")
    return {"released": released}


# -- service endpoints -----------------------------------------------------------------------


async def info(ctx: Ctx) -> Any:
    chars = ctx.client.characteristics
    config = ctx.service.config
    return {
        "service": "turnstile",
        "version": __version__,
        "api": "v1",
        "backend": {
            "scheme": chars.scheme,
            "cross_process": chars.cross_process,
            "cross_host": chars.cross_host,
            "durable": chars.durable,
            "woken_by_store": chars.woken_by_store,
            "description": chars.description,
        },
        "limits": {
            "max_wait": config.max_wait,
            "max_body": config.max_body,
            "max_name_bytes": validate.MAX_NAME_BYTES,
            "max_holder_bytes": validate.MAX_HOLDER_BYTES,
            "min_ttl": validate.MIN_TTL,
            "max_ttl": validate.MAX_TTL,
            "max_limit": validate.MAX_LIMIT,
        },
        "auth": {"required": not config.tokens.open},
        "principal": ctx.principal.to_dict(),
    }


async def dashboard_data(ctx: Ctx) -> Any:
    since = query_int(ctx.request, "since", 0, 0, 2**62)
    service = ctx.service
    statuses, truncated = await service.look(ctx.principal, service.config.dashboard_max_names)
    items = [s.to_dict() for s in statuses]
    return {
        "now": time.time(),
        "principal": ctx.principal.to_dict(),
        "names": items,
        "truncated": truncated,
        "queues": [],
        "events": [e.to_dict() for e in service.events.since(since, ctx.principal)],
        "cursor": service.events.last_seq,
        "instance": {"started": service.started, "version": __version__},
    }


async def healthz(service: Service) -> Response:
    try:
        await service.client.ping()
    except Exception as exc:
        api = from_exception(exc)
        return JSONResponse(
            {"status": "unavailable", "error": {"code": api.code, "message": api.message}},
            status_code=503,
            headers={"Retry-After": "1"},
        )
    return JSONResponse({"status": "ok", "backend": service.client.characteristics.scheme})


async def metrics(ctx: Ctx) -> Response:
    gauges: list[Gauge] = []
    return PlainTextResponse(
        ctx.service.metrics.render(gauges),
        media_type="text/plain; version=0.0.4; charset=utf-8",
    )


async def ctx_body(ctx: Ctx, allowed: set[str]) -> Body:
    return await read_body(ctx.request, ctx.service.config.max_body, allowed)


# -- assembling the app ----------------------------------------------------------------------

Handler = Callable[[Ctx], Awaitable[Any]]


def _endpoint(
    service: Service, route: str, handler: Handler, query: frozenset[str]
) -> Callable[[Request], Awaitable[Response]]:
    async def endpoint(request: Request) -> Response:
        try:
            principal = service.authenticate(request)
            unknown = sorted(set(request.query_params) - query)
            if unknown:
                raise InvalidArgument(
                    f"unknown query parameter(s) {', '.join(map(repr, unknown))}"
                    + (f"; accepted: {', '.join(sorted(query))}" if query else "")
                )
            result = await handler(Ctx(request, service, principal))
            response = result if isinstance(result, Response) else JSONResponse(result)
        except Exception as exc:
            api = from_exception(exc)
            response = error_response(api.code, api.message, api.headers)
        service.metrics.request(request.method, route, response.status_code)
        return response

    return endpoint


def _kind(handler: Callable[[Ctx, str], Awaitable[Any]], kind: str) -> Handler:
    async def bound(ctx: Ctx) -> Any:
        return await handler(ctx, kind)

    return bound


def create_app(config: ServerConfig | None = None, client: AsyncClient | None = None) -> Starlette:
    """The ASGI app. Without ``client`` it connects to ``config.url`` on startup."""
    config = config or ServerConfig()
    service = Service(config, client)
    dashboard_html = resources.files("turnstile.server").joinpath("dashboard.html").read_text(
        "utf-8"
    )
    document = openapi.document(config)

    routes: list[Route] = []

    def add(path: str, handler: Handler, methods: list[str], query: tuple[str, ...] = ()) -> None:
        endpoint = _endpoint(service, path, handler, frozenset(query))
        routes.append(Route(path, endpoint, methods=methods))

    for kind in KINDS:
        add(f"/v1/{kind}/acquire", _kind(acquire, kind), ["POST"])
        add(f"/v1/{kind}/try-acquire", _kind(try_acquire, kind), ["POST"])
        add(f"/v1/{kind}/renew", _kind(renew, kind), ["POST"])
        add(f"/v1/{kind}/release", _kind(release, kind), ["POST"])
        add(f"/v1/{kind}/status", _kind(status, kind), ["GET", "POST"], ("name",))
    add("/v1/semaphores/wait", _kind(wait, "semaphores"), ["POST"])
    add("/v1/names", names, ["GET"], ("prefix", "max_count"))
    add("/v1/info", info, ["GET"])
    add("/v1/dashboard", dashboard_data, ["GET"], ("since",))
    add("/v1/admin/force-release", force_release, ["POST"])
    add("/metrics", metrics, ["GET"])

    async def health(request: Request) -> Response:
        response = await healthz(service)
        service.metrics.request(request.method, "/healthz", response.status_code)
        return response

    async def openapi_json(request: Request) -> Response:
        return JSONResponse(document)

    async def dashboard(request: Request) -> Response:
        return HTMLResponse(
            dashboard_html,
            headers={
                "Content-Security-Policy": "default-src 'self'; script-src 'unsafe-inline'; "
                "style-src 'unsafe-inline'; img-src data:; frame-ancestors 'none'",
                "X-Content-Type-Options": "nosniff",
                "Referrer-Policy": "no-referrer",
                "Cache-Control": "no-store",
            },
        )

    routes.append(Route("/healthz", health, methods=["GET"]))
    routes.append(Route("/openapi.json", openapi_json, methods=["GET"]))
    routes.append(Route("/", dashboard, methods=["GET"]))

    async def not_found(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        if exc.status_code == 405:
            return error_response("method_not_allowed", f"{request.method} is not allowed here")
        return error_response("not_found", f"no endpoint {request.url.path!r}; see /openapi.json")

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        await service.start()
        try:
            yield
        finally:
            await service.stop()

    app = Starlette(
        routes=routes,
        exception_handlers={404: not_found, 405: not_found},
        lifespan=lifespan,
    )
    app.state.service = service
    return app


__all__ = ["DEFAULT_MAX_BODY", "DEFAULT_MAX_WAIT", "ServerConfig", "Service", "create_app"]
