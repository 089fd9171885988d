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

import contextlib
import dataclasses
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from importlib import resources
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import HTMLResponse, JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from .. import __version__
from .._core import validate
from ..aio import AsyncClient
from ..workflows.deliverer import secret_from_env
from . import lock_endpoints, openapi, queue_endpoints, rate_endpoints
from .auth import Principal
from .common import Ctx, Service
from .config import DEFAULT_MAX_BODY, DEFAULT_MAX_WAIT, ServerConfig
from .deliveries import OUTCOMES
from .errors import error_response, from_exception
from .metrics import Gauge, histogram_lines
from .openapi import error_schema, obj, ref
from .table import Args, Endpoint, Field, parse

log = logging.getLogger("turnstile.server")

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
            "queues": chars.queues,
        },
        "limits": {
            "max_wait": config.max_wait,
            "max_body": config.max_body,
            "max_name_bytes": validate.MAX_NAME_BYTES,
            "max_holder_bytes": validate.MAX_HOLDER_BYTES,
            "min_ttl": validate.MIN_TTL,
            "max_ttl": validate.MAX_TTL,
            "max_limit": validate.MAX_LIMIT,
            "max_payload_bytes": validate.MAX_PAYLOAD_BYTES,
        },
        "auth": {"required": not config.tokens.open},
        "principal": ctx.principal.to_dict(),
    }


async def dashboard_data(ctx: Ctx) -> Any:
    since = ctx.args.get("since", 0)
    service = ctx.service
    statuses, truncated = await service.look(ctx.principal, service.config.dashboard_max_names)
    items = [s.to_dict() for s in statuses]
    return {
        "now": time.time(),
        "principal": ctx.principal.to_dict(),
        "names": items,
        "truncated": truncated,
        "queues": [q.to_dict() for q in await service.queue_stats(ctx.principal, 50)],
        "events": [e.to_dict() for e in service.events.since(since, ctx.principal)],
        "cursor": service.events.last_seq,
        "instance": {
            "started": service.started,
            "version": __version__,
            "deliveries": service.deliveries.to_dict(),
        },
    }


async def deliveries(ctx: Ctx) -> Any:
    """Callback deliveries: pending over the store, and this instance's deliverer."""
    service = ctx.service
    pending = await service.deliveries.pending(service.pending_deliveries)
    return {"pending": pending, "deliverer": service.deliveries.to_dict()}


async def healthz(ctx: Ctx) -> Response:
    service = ctx.service
    try:
        await service.client.ping()
    except Exception as exc:
        api = from_exception(exc)
        message = api.message
        if not _authenticated(service, ctx.request):
            # The store's address (URL, host, port) is for the service's users only.
            message = "store unavailable"
        return JSONResponse(
            {"status": "unavailable", "error": {"code": api.code, "message": message}},
            status_code=503,
            headers={"Retry-After": "1"},
        )
    return JSONResponse({"status": "ok", "backend": service.client.characteristics.scheme})


def _authenticated(service: Service, request: Request) -> bool:
    """Whether ``request`` carries a token this service accepts (never raises)."""
    try:
        service.authenticate(request)
    except Exception:
        return False
    return True


QUEUE_GAUGES = (
    ("turnstile_queue_ready", "ready", "Messages due now, per queue."),
    ("turnstile_queue_delayed", "delayed", "Messages not yet due, per queue."),
    ("turnstile_queue_in_flight", "in_flight", "Messages handed out and not settled, per queue."),
    ("turnstile_queue_dead", "dead", "Dead letters, per queue."),
)


NAME_GAUGES = (
    ("turnstile_holders", "holders", "Leases held now, per name (the first --metrics-names)."),
    ("turnstile_waiters", "waiters", "Waiters in line now, per name (the first --metrics-names)."),
)


async def metrics(ctx: Ctx) -> Response:
    gauges: list[Gauge] = []
    cap = ctx.service.config.metrics_max_names
    if cap:
        statuses, truncated = await ctx.service.look(ctx.principal, cap)
        for status in statuses[:cap]:
            for metric, field, help_text in NAME_GAUGES:
                count = len(getattr(status, field))
                gauges.append(Gauge(metric, help_text, (("name", status.name),), count))
        gauges.append(Gauge(
            "turnstile_metrics_names_truncated",
            "1 if more names are held or awaited than --metrics-names shows per name.",
            (),
            1 if truncated or len(statuses) > cap else 0,
        ))
    service = ctx.service
    pending = await service.deliveries.pending(service.pending_deliveries)
    if pending is not None:
        gauges.append(Gauge(
            "turnstile_deliveries_pending",
            "Callback grants waiting for their delivery, over the whole store (sampled).",
            (),
            pending,
        ))
    service.deliveries.sync()
    for found in await ctx.service.queue_stats(ctx.principal, 200):
        labels = (("queue", found.name),)
        for metric, field, help_text in QUEUE_GAUGES:
            gauges.append(Gauge(metric, help_text, labels, getattr(found, field)))
        if found.oldest_age is not None:
            gauges.append(Gauge(
                "turnstile_queue_oldest_age_seconds",
                "Age of the oldest pending message, per queue.",
                labels,
                found.oldest_age,
            ))
    return PlainTextResponse(
        ctx.service.metrics.render(gauges) + _delivery_metrics(service),
        media_type="text/plain; version=0.0.4; charset=utf-8",
    )


def _delivery_metrics(service: Service) -> str:
    """This instance's deliverer: outcomes and grant-to-delivered latency."""
    stats = service.deliveries.stats
    metric = "turnstile_deliveries_total"
    out = [
        f"# HELP {metric} Callback deliveries settled by this instance's deliverer, by "
        "outcome (lost: the grant expired or was released before it was settled).",
        f"# TYPE {metric} counter",
    ]
    for outcome in OUTCOMES:
        out.append(f'{metric}{{outcome="{outcome}"}} {getattr(stats, outcome)}')
    metric = "turnstile_delivery_seconds"
    out.append(f"# HELP {metric} Time from a callback grant to its delivery (this instance).")
    out.append(f"# TYPE {metric} histogram")
    histogram_lines(out, metric, (), service.deliveries.latency)
    return "\n".join(out) + "\n"


# -- the service's part of the endpoint table ------------------------------------------------


def _service_endpoints() -> list[Endpoint]:
    error = error_schema()["properties"]["error"]
    return [
        Endpoint(
            "/v1/info", info, "info", "service",
            "Version, the store behind the service, limits, and who the token is",
            methods=("GET",), response=ref("Info"), reads_names=False,
        ),
        Endpoint(
            "/v1/dashboard", dashboard_data, "dashboard_data", "service",
            "What the dashboard shows: names, queues and events after `since`",
            methods=("GET",),
            fields=(Field("since", {"type": "integer", "minimum": 0, "maximum": 2**62}),),
            response=ref("Dashboard"), errors=(422,), reads_names=False,
        ),
        Endpoint(
            "/v1/deliveries", deliveries, "deliveries", "service",
            "Callback grants: how many wait for delivery, and this instance's deliverer",
            "`pending` counts over the whole store (no names); the deliverer's counts are "
            "this instance's since it started. Callback grants are asked for with "
            "`callback` on try-acquire.",
            methods=("GET",), response=ref("Deliveries"), reads_names=False,
        ),
        Endpoint(
            "/healthz", healthz, "healthz", "service",
            "Whether the store answers (no token needed)",
            methods=("GET",), authenticated=False,
            responses={
                "200": {
                    "description": "The store answers",
                    "content": {"application/json": {"schema": obj(
                        ["status", "backend"],
                        {"status": {"const": "ok"}, "backend": {"type": "string"}},
                    )}},
                },
                "503": {
                    "description": "The store does not answer",
                    "content": {"application/json": {"schema": obj(
                        ["status", "error"], {"status": {"const": "unavailable"}, "error": error},
                    )}},
                },
            },
        ),
        Endpoint(
            "/metrics", metrics, "metrics", "service",
            "Prometheus metrics of this instance (text format 0.0.4)",
            methods=("GET",),
            responses={
                "200": {
                    "description": "OK",
                    "content": {"text/plain": {"schema": {"type": "string"}}},
                },
                **openapi.error_responses(401),
            },
        ),
    ]


def endpoint_table(config: ServerConfig) -> list[Endpoint]:
    """Every endpoint the service answers (but ``/`` and ``/openapi.json``, which serve the
    dashboard page and the document of this table)."""
    return [
        *lock_endpoints.endpoints(config),
        *queue_endpoints.endpoints(config),
        *rate_endpoints.endpoints(config),
        *_service_endpoints(),
    ]


# -- assembling the app ----------------------------------------------------------------------

Handler = Callable[[Request], Awaitable[Response]]
_PROBE = Principal("probe", prefixes=(), read_only=True)


def _serve(service: Service, endpoint: Endpoint) -> Handler:
    async def serve(request: Request) -> Response:
        started = time.monotonic()
        try:
            if endpoint.authenticated:
                principal = service.authenticate(request)
                args = await parse(
                    request, endpoint, service.config.max_body,
                    body_timeout=service.config.body_timeout, budget=service.bodies,
                )
            else:  # a probe: answers whoever asks, whatever the query says
                principal, args = _PROBE, Args({}, {})
            result = await endpoint.handler(Ctx(request, service, principal, args))
            response = result if isinstance(result, Response) else JSONResponse(result)
        except ClientDisconnect:
            # The client left before its body arrived: nothing was done, nobody reads an
            # answer. Not a failure of the service: counted as 499 and logged quietly.
            log.debug("%s %s: the client disconnected mid-body", request.method, endpoint.path)
            response = Response(status_code=499)
        except Exception as exc:
            api = from_exception(exc)
            response = error_response(api.code, api.message, api.headers)
        service.metrics.request(
            request.method, endpoint.path, response.status_code, time.monotonic() - started
        )
        return response

    return serve


def create_app(config: ServerConfig | None = None, client: AsyncClient | None = None) -> Starlette:
    """The ASGI app. Without ``client`` it connects to ``config.url`` on startup."""
    config = config or ServerConfig()
    if config.callback_secret is None and (secret := secret_from_env()) is not None:
        config = dataclasses.replace(config, callback_secret=secret)
    service = Service(config, client)
    dashboard_html = resources.files("turnstile.server").joinpath("dashboard.html").read_text(
        "utf-8"
    )
    table = endpoint_table(config)
    document = openapi.document(config, table)
    routes = [Route(e.path, _serve(service, e), methods=list(e.methods)) for e in table]

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

    routes.append(Route("/openapi.json", openapi_json, methods=["GET"]))
    routes.append(Route("/", dashboard, methods=["GET"]))

    async def not_found(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        if exc.status_code == 405:
            allow = (exc.headers or {}).get("Allow", "")
            return error_response(
                "method_not_allowed",
                f"{request.method} is not allowed here; allowed: {allow}",
                {"Allow": allow},
            )
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
    # Never answer with a redirect built from the request's Host header ("/v1/info/" would
    # be sent to http://<Host>/v1/info): a path with a trailing slash is simply not found.
    app.router.redirect_slashes = False
    app.state.service = service
    return app


__all__ = ["DEFAULT_MAX_BODY", "DEFAULT_MAX_WAIT", "ServerConfig", "Service", "create_app"]
