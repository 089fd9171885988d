"""Lock and semaphore endpoints (``/v1/locks/*``, ``/v1/semaphores/*``, ``/v1/names``,
the admin force release): each checks the token and makes one call on the public client API
(a lock or semaphore object), which checks the arguments' ranges. :func:`endpoints` is their
part of the endpoint table."""

from __future__ import annotations

import functools
import time
from collections.abc import Awaitable
from typing import TYPE_CHECKING, Any, TypeVar

from starlette.responses import Response

from .._core import validate
from ..aio import AsyncSemaphore
from ..errors import AcquireTimeout, InvalidArgument, LeaseLost
from .common import (
    CLOSING,
    DONE,
    GONE,
    Ctx,
    grant_of,
    lease_dict,
    listed,
    long_poll,
    new_holder,
    shutting_down,
)
from .deliveries import check_callback
from .openapi import (
    AGEING,
    GROUP_KEY,
    HOLDER,
    LIMIT,
    LISTING,
    NAME,
    PER_KEY,
    PRIORITY,
    RATE_FIELDS,
    TOKEN,
    TTL,
    callback_schema,
    obj,
    ref,
)
from .table import Endpoint, Field, Schema

if TYPE_CHECKING:
    from .config import ServerConfig

T = TypeVar("T")
KINDS = ("locks", "semaphores")


def _primitive(ctx: Ctx, kind: str, *, ttl: float = 30.0) -> AsyncSemaphore:
    """The lock or semaphore the request names (its constructor checks name, limit, ttl),
    once the token may write it."""
    args = ctx.args
    rank = {"priority": args.get("priority", 0), "ageing": args.get("ageing")}
    if kind == "locks":
        sem: AsyncSemaphore = ctx.client.lock(args["name"], ttl, **rank)
    elif "per_key" in args.values or "key" in args.values:
        # A semaphore group: `limit` is its total, `key` the slot asked for.
        if "per_key" not in args.values or "key" not in args.values:
            raise InvalidArgument("a semaphore group's ask needs both key and per_key")
        if any(field in args.values for field in ("rate", "per", "burst")):
            raise InvalidArgument("a semaphore group takes no rate (rate, per, burst)")
        group = ctx.client.semaphore_group(
            args["name"], args["per_key"], args["limit"], ttl, **rank
        )
        sem = group.key(args["key"])
    else:
        rated: dict[str, Any] = {}
        if "rate" in args.values:
            rated = {"rate": args["rate"], "per": args.get("per", 1.0),
                     "burst": args.get("burst", 1)}
        elif "per" in args.values or "burst" in args.values:
            raise InvalidArgument("per and burst go with rate (a semaphore's start rate)")
        sem = ctx.client.semaphore(args["name"], args["limit"], ttl, **rank, **rated)
    ctx.may_write(sem.name)
    return sem


async def acquire(ctx: Ctx, kind: str) -> Any:
    sem = _primitive(ctx, kind, ttl=ctx.args.get("ttl", 30.0))
    given = ctx.args.get("holder")
    holder = new_holder() if given is None else given
    # The service's own bound on a long poll, not a rule of the primitive.
    wait = validate.seconds(ctx.args.get("wait", 0.0), "wait", high=ctx.service.config.max_wait)
    started = time.monotonic()
    try:
        outcome, lease = await long_poll(
            ctx.request, ctx.service.closing, _await(sem.acquire(wait, holder))
        )
    except AcquireTimeout:
        ctx.tracker.timed_out(sem.name, holder, wait)
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
    claimed_at = lease.expires_at - sem.ttl
    grant = grant_of(lease)
    ctx.tracker.granted(grant, claimed_at, waited=time.monotonic() - started)
    return {"acquired": True, "lease": lease_dict(grant, claimed_at)}


async def _await(awaitable: Awaitable[T]) -> T:
    return await awaitable


async def try_acquire(ctx: Ctx, kind: str) -> Any:
    sem = _primitive(ctx, kind, ttl=ctx.args.get("ttl", 30.0))
    callback = None
    if "callback" in ctx.args.values:
        service = ctx.service
        callback = check_callback(
            ctx.args["callback"],
            secret=service.callback_secret,
            allow=service.config.callback_hosts,
        )
    ticket = await sem.try_acquire(
        ctx.args["holder"],
        ctx.args.get("wait_ttl"),
        enqueue=ctx.args.get("enqueue", True),
        callback=callback,
    )
    if callback is not None:
        ctx.service.deliveries.nudge()  # granted now: deliver it now
    assert ticket.now is not None
    lease = None
    if ticket.lease is not None:
        grant = grant_of(ticket.lease)
        ctx.tracker.granted(grant, ticket.now)
        lease = lease_dict(grant, ticket.now)
    elif ticket.position is not None:
        ctx.tracker.asked(sem.name, ctx.args["holder"])
    return {
        "acquired": ticket.acquired,
        "position": ticket.position,
        "lease": lease,
        "now": ticket.now,
        "retry_after": ticket.retry_after,
    }


async def renew(ctx: Ctx, kind: str) -> Any:
    lock = _primitive(ctx, "locks")
    holder, token = ctx.args["holder"], ctx.args["token"]
    try:
        lease = await lock.renew(holder, token, ctx.args["ttl"])
    except LeaseLost:
        ctx.tracker.lost(lock.name, holder, token)
        raise
    return {"lease": lease_dict(grant_of(lease), lease.expires_at - lease.ttl)}


async def release(ctx: Ctx, kind: str) -> Any:
    lock = _primitive(ctx, "locks")
    holder, token = ctx.args["holder"], ctx.args.get("token")
    released = await lock.release(holder, token)
    ctx.service.deliveries.nudge()  # the next in line may be a callback waiter
    ctx.tracker.released(lock.name, holder, token, released)
    return {"released": released}


async def set_limit(ctx: Ctx) -> Any:
    """Change the limit of a name for its next grants (``AsyncSemaphore.set_limit``)."""
    sem = _primitive(ctx, "semaphores")
    previous = await sem.set_limit(ctx.args["limit"])
    ctx.service.deliveries.nudge()  # a raised limit may grant callback waiters
    return {"name": sem.name, "limit": sem.limit, "previous": previous}


async def status(ctx: Ctx, kind: str) -> Any:
    name = ctx.args["name"]
    ctx.may_read(name)
    found = await ctx.client.status(name)
    ctx.tracker.observe(found)
    return found.to_dict()


async def wait(ctx: Ctx) -> Any:
    """Low-level: block until (name, holder) is woken by a hand-over, or ``timeout``."""
    lock = _primitive(ctx, "locks")
    # The service's own bound on a long poll, not a rule of the primitive.
    timeout = validate.seconds(ctx.args["timeout"], "timeout", high=ctx.service.config.max_wait)
    outcome, woken = await long_poll(
        ctx.request, ctx.service.closing, lock.wait(ctx.args["holder"], timeout)
    )
    if outcome == GONE:
        return Response(status_code=499)
    # Shutting down: answer "not woken"; the client's next step finds another instance.
    return {"woken": bool(woken)}


async def names(ctx: Ctx) -> Any:
    prefix = ctx.args.get("prefix", "")
    max_count = ctx.args.get("max_count", 1000)
    found, truncated = await listed(ctx.principal, prefix, max_count, ctx.client.names)
    return {"names": found, "truncated": truncated}


async def force_release(ctx: Ctx) -> Any:
    lock = _primitive(ctx, "locks")
    ctx.admin()
    holder = ctx.args.get("holder")
    if holder is not None:
        targets = [holder]
    else:
        found = await ctx.client.status(lock.name)
        targets = [h.holder for h in found.holders] + [w.holder for w in found.waiters]
    released = []
    for target in targets:
        if await lock.release(target):
            released.append(target)
            ctx.tracker.released(lock.name, target, None, True, kind="force_released")
    ctx.service.deliveries.nudge()
    return {"released": released}


async def stepfunctions_event(ctx: Ctx) -> Any:
    """An EventBridge "Step Functions Execution Status Change" event (an API destination):
    an execution that ended loses every grant and place it has, at once
    (``workflows/lifecycle.py``); any other event is acknowledged and ignored."""
    ctx.admin()  # it may free grants on any name
    from ..workflows import lifecycle

    event = dict(ctx.args.values)
    arn = lifecycle.ended_execution(event)
    if arn is None:
        return {"execution": None, "grants": [], "places": [], "names_read": 0}
    freed = await lifecycle.free_execution(ctx.client, arn)
    for name, token in freed.grants:
        ctx.tracker.released(name, arn, token, True, kind="force_released")
    ctx.service.deliveries.nudge()  # a freed slot may grant a callback waiter
    return {"execution": arn, **freed.as_dict()}


# -- the endpoint table ----------------------------------------------------------------------


def _bound(handler: Any, kind: str) -> Any:
    return functools.partial(handler, kind=kind)


def _kind_endpoints(kind: str, config: ServerConfig) -> list[Endpoint]:
    sem = kind == "semaphores"
    what = "semaphore" if sem else "lock"
    limit = (Field("limit", LIMIT, required=True),) if sem else ()
    group = (Field("key", GROUP_KEY), Field("per_key", PER_KEY)) if sem else ()
    # A semaphore's start rate (RATE_FIELDS, none required): not with a group's key.
    rated = tuple(
        Field(field, {**schema, "description": "A start rate: " + schema["description"]})
        for field, schema in RATE_FIELDS.items()
    ) if sem else ()
    # A group's ask names both.
    # A group's ask names both key and per_key; per and burst go with rate; a group has no
    # start rate (yet).
    paired: Schema = {
        "dependentRequired": {
            "key": ["per_key"], "per_key": ["key"], "per": ["rate"], "burst": ["rate"],
        },
        "allOf": [{"not": {"required": ["key", "rate"]}}],
    } if sem else {}
    name = Field("name", NAME, required=True)
    holder = Field("holder", HOLDER, required=True)
    lease: Schema = obj(["lease"], {"lease": ref("Lease")})
    wait: Schema = {
        "type": "number",
        "minimum": 0,
        "maximum": config.max_wait,
        "default": 0,
        "description": "Seconds to wait in line for the grant within this request (a long "
        f"poll, at most {config.max_wait:g} s on this service). 0: only if free now.",
    }
    status_summary = "Holders and waiters of a name, in order"
    return [
        Endpoint(
            f"/v1/{kind}/acquire", _bound(acquire, kind), f"{kind}_acquire", kind,
            f"Acquire a {what}, waiting up to `wait` seconds",
            "Joins the line and waits (long poll) until granted, in arrival order. On "
            "`acquire_timeout` the caller has left the line. The lease is not renewed by "
            "the service: renew it before `expires_in` passes, or release it when done. "
            "If the client disconnects while waiting, it leaves the line. "
            "`limit_conflict` (409) if the name is in use under another limit.",
            fields=(
                name, *limit, Field("ttl", {**TTL, "default": 30}),
                Field("holder", {
                    **HOLDER, "description": HOLDER["description"] + " Default: a new random id.",
                }),
                Field("wait", wait),
                Field("priority", PRIORITY),
                Field("ageing", AGEING),
                *group,
                *rated,
            ),
            body_extra=paired,
            response=obj(["acquired", "lease"],
                         {"acquired": {"const": True}, "lease": ref("Lease")}),
            errors=(409,),
        ),
        Endpoint(
            f"/v1/{kind}/try-acquire", _bound(try_acquire, kind), f"{kind}_try_acquire", kind,
            f"Ask for a {what} once, never wait (a ticket with a position in line)",
            "Holds, or joins the line (first call) and answers the position (0 = next). "
            "Idempotent per `holder`: asking again keeps the place and, once granted, "
            "returns the same lease. A place not asked about within `wait_ttl` lapses. "
            "`enqueue: false` takes a free slot only if nobody waits, without joining. "
            "`limit_conflict` (409) if the name is in use under another limit. "
            "With `callback` nobody needs to ask again: the grant, now or when the turn "
            "comes, is delivered there by the service (at least once), with the lease as "
            "`{name, holder, token, expires_at, limit}`; see docs/http.md.",
            fields=(
                name, *limit, Field("ttl", {**TTL, "default": 30}), holder,
                Field("wait_ttl", {
                    **TTL, "description": "How long the place in line lasts without asking "
                    "again (default: `ttl`; with `callback`, one day).",
                }),
                Field("enqueue", {"type": "boolean", "default": True}),
                Field("callback", callback_schema(config.callback_secret is not None)),
                Field("priority", PRIORITY),
                Field("ageing", AGEING),
                *group,
                *rated,
            ),
            body_extra={
                **paired,
                "allOf": [
                    *paired.get("allOf", []),
                    # A callback waits in line: not with `enqueue: false`, nor with a rate.
                    {"not": {"required": ["callback", "enqueue"],
                             "properties": {"enqueue": {"const": False}}}},
                    *([{"not": {"required": ["callback", "rate"]}}] if sem else []),
                ],
            },
            response=ref("Ticket"),
            errors=(409,),
        ),
        Endpoint(
            f"/v1/{kind}/renew", _bound(renew, kind), f"{kind}_renew", kind,
            "Extend a lease to `ttl` seconds from now (store clock)",
            "`lease_lost` (409) if the lease expired or was taken over: work done under it "
            "may have overlapped with a newer holder.",
            fields=(name, holder, Field("token", TOKEN, required=True),
                    Field("ttl", TTL, required=True)),
            response=lease,
            errors=(409,),
        ),
        Endpoint(
            f"/v1/{kind}/release", _bound(release, kind), f"{kind}_release", kind,
            "Release a holder's lease (and, without `token`, its place in line)",
            "From any process; a stale `token` never releases a newer grant; repeating it is "
            "harmless (`released: false`).",
            fields=(name, holder, Field("token", TOKEN)),
            response=obj(["released"], {"released": {"type": "boolean"}}),
        ),
        Endpoint(
            f"/v1/{kind}/status", _bound(status, kind), f"{kind}_status", kind,
            status_summary,
            "Read-only. `limit` is null when nobody holds or waits. GET takes `name` as a "
            "query parameter.",
            methods=("GET", "POST"),
            fields=(name,),
            response=ref("Status"),
        ),
    ]


def endpoints(config: ServerConfig) -> list[Endpoint]:
    """The lock and semaphore part of the endpoint table."""
    return [
        *_kind_endpoints("locks", config),
        *_kind_endpoints("semaphores", config),
        Endpoint(
            "/v1/semaphores/wait", wait, "semaphores_wait", "semaphores",
            "Low level: block until a hand-over wakes `holder`, or `timeout`",
            "Used by the Python client's blocking acquire between try-acquire steps. Answers "
            "at once if `holder` already holds the name. It does not keep a place in line: "
            "the try-acquire steps do.",
            fields=(
                Field("name", NAME, required=True),
                Field("holder", HOLDER, required=True),
                Field("timeout", {"type": "number", "minimum": 0, "maximum": config.max_wait},
                      required=True),
            ),
            response=obj(["woken"], {"woken": {"type": "boolean"}}),
        ),
        Endpoint(
            "/v1/semaphores/limit", set_limit, "semaphores_set_limit", "semaphores",
            "Change the limit of a name (for its next grants)",
            "A name has one limit while it has holders or waiters: an acquire or try-acquire "
            "naming another one is refused (`limit_conflict`, 409). This changes it, "
            "atomically: a raised limit grants waiters at once, in line order; a lowered one "
            "never revokes a held lease (nobody more is granted until fewer than `limit` "
            "hold). `previous` is the limit replaced, or null when the name is idle: nothing "
            "is stored for an idle name, and its next acquire sets its limit.",
            fields=(Field("name", NAME, required=True), Field("limit", LIMIT, required=True)),
            response=obj(["name", "limit", "previous"], {
                "name": {"type": "string"},
                "limit": {"type": "integer", "minimum": 1},
                "previous": {"type": ["integer", "null"], "minimum": 1},
            }),
        ),
        Endpoint(
            "/v1/names", names, "names", ("locks", "semaphores"),
            "Names that have holders or waiters now (only those the token may read)",
            methods=("GET",),
            fields=LISTING,
            response=obj(["names", "truncated"], {
                "names": {"type": "array", "items": {"type": "string"}},
                "truncated": {"type": "boolean"},
            }),
        ),
        Endpoint(
            "/v1/admin/force-release", force_release, "force_release", "admin",
            "Admin: release a holder (or, without `holder`, every holder and waiter) of a name",
            "Needs an admin token that may write the name.",
            fields=(Field("name", NAME, required=True), Field("holder", HOLDER)),
            response=obj(["released"], {"released": {"type": "array",
                                                     "items": {"type": "string"}}}),
        ),
        Endpoint(
            "/v1/events/stepfunctions", stepfunctions_event, "stepfunctions_event", "admin",
            "Admin: an execution ended (an EventBridge status-change event): free its permits",
            "The body is an EventBridge \"Step Functions Execution Status Change\" event as "
            "an API destination sends it. When `detail.status` is final (SUCCEEDED, FAILED, "
            "TIMED_OUT, ABORTED), every grant held by `detail.executionArn` (the holder "
            "`$$.Execution.Id`) is released, each scoped by its token, and every place it "
            "waits in is left, at once; the next in line is served. Other events are "
            "answered with `execution: null` and change nothing. Needs an admin token. "
            "See docs/workflows.md.",
            fields=(
                # EventBridge's envelope, as it sends it; only detail-type and detail are
                # read (the body's size is bounded like every body's).
                Field("detail-type", {"type": "string"}, required=True),
                Field("detail", {"type": "object"}, required=True),
                *(Field(f, {"type": "string"})
                  for f in ("source", "version", "id", "account", "time", "region")),
                Field("resources", {"type": "array"}),
            ),
            response=obj(["execution", "grants", "places", "names_read"], {
                "execution": {"type": ["string", "null"]},
                "grants": {"type": "array", "items": obj(["name", "token"], {
                    "name": {"type": "string"}, "token": {"type": "integer"},
                })},
                "places": {"type": "array", "items": {"type": "string"}},
                "names_read": {"type": "integer", "minimum": 0},
            }),
        ),
    ]
