"""Rate limit endpoints (``/v1/rates/*``): rate limits whose callers wait in line. Each
checks the token and makes one call on the public client API (a rate limit object, whose
constructor checks the rate, ``per`` and ``burst``). :func:`endpoints` is their part of the
endpoint table."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from starlette.responses import Response

from .._async.rate_limit import AsyncRateLimit
from .._core import validate
from ..errors import AcquireTimeout
from .common import CLOSING, DONE, Ctx, long_poll, new_holder, shutting_down
from .openapi import AGEING, HOLDER, NAME, PRIORITY, RATE_FIELDS, TTL, obj, ref
from .table import Endpoint, Field

if TYPE_CHECKING:
    from .config import ServerConfig


def _limiter(ctx: Ctx) -> AsyncRateLimit:
    """The rate limit the request names (its constructor checks name, rate, per, burst),
    once the token may write it."""
    args = ctx.args
    limiter = ctx.client.rate_limit(
        args["name"],
        args["rate"],
        args.get("per", 1.0),
        args.get("burst", 1),
        priority=args.get("priority", 0),
        ageing=args.get("ageing"),
    )
    ctx.may_write(limiter.name)
    return limiter


async def try_acquire(ctx: Ctx) -> Any:
    limiter = _limiter(ctx)
    ticket = await limiter.try_acquire(
        ctx.args["holder"], ctx.args.get("wait_ttl"), enqueue=ctx.args.get("enqueue", True)
    )
    return {
        "acquired": ticket.acquired,
        "position": ticket.position,
        "retry_after": round(ticket.retry_after, 6),
        "now": ticket.now,
    }


async def acquire(ctx: Ctx) -> Any:
    limiter = _limiter(ctx)
    given = ctx.args.get("holder")
    holder = new_holder() if given is None else given
    # The service's own bound on a long poll, not a rule of the primitive.
    wait = validate.seconds(ctx.args.get("wait", 0.0), "wait", high=ctx.service.config.max_wait)
    # Cancelled (the client left, the instance stops), the primitive leaves the line.
    try:
        outcome, admitted_at = await long_poll(
            ctx.request, ctx.service.closing, limiter.acquire(wait, holder)
        )
    except AcquireTimeout as exc:
        raise AcquireTimeout(f"{exc}; the caller left the line") from None
    if outcome == CLOSING and admitted_at is None:
        raise shutting_down()
    if outcome not in (DONE, CLOSING):
        return Response(status_code=499)  # the client left; nobody reads this
    # Admitted (also while this instance stops: the client is still there to hear it).
    return {"admitted": True, "holder": holder, "now": admitted_at}


async def leave(ctx: Ctx) -> Any:
    name = validate.name(ctx.args["name"])
    ctx.may_write(name)
    left = await ctx.client.backend.rate_leave(name, validate.holder(ctx.args["holder"]))
    return {"left": left}


async def status(ctx: Ctx) -> Any:
    name = validate.name(ctx.args["name"])
    ctx.may_read(name)
    found = await ctx.client.backend.rate_status(name)
    return found.to_dict()


# -- the endpoint table ----------------------------------------------------------------------


def endpoints(config: ServerConfig) -> list[Endpoint]:
    """The rate limit part of the endpoint table."""
    name = Field("name", NAME, required=True)
    spec = tuple(
        Field(field, schema, required=field == "rate") for field, schema in RATE_FIELDS.items()
    )
    wait = {
        "type": "number",
        "minimum": 0,
        "maximum": config.max_wait,
        "default": 0,
        "description": "Seconds to wait in line for the admission within this request (a "
        f"long poll, at most {config.max_wait:g} s on this service). 0: only if admitted "
        "now.",
    }
    conflict = (
        "`limit_conflict` (409) if the name is in use (someone waits, or its last slot is "
        "still ahead) under another rate, `per` or `burst`."
    )
    return [
        Endpoint(
            "/v1/rates/acquire", acquire, "rates_acquire", "rates",
            "Be admitted by a rate limit, waiting in line up to `wait` seconds",
            "Joins the line and waits (long poll) until the caller's slot, in arrival order. "
            "`acquire_timeout` (409) at once if the slot would come after `wait`: the "
            "caller has left the line. If the client disconnects while waiting, it leaves "
            "the line. An admission is an instant: nothing to release. " + conflict,
            fields=(
                name, *spec,
                Field("holder", {
                    **HOLDER, "description": HOLDER["description"] + " Default: a new random id.",
                }),
                Field("wait", wait),
                Field("priority", PRIORITY),
                Field("ageing", AGEING),
            ),
            response=obj(["admitted", "holder", "now"], {
                "admitted": {"const": True},
                "holder": {"type": "string"},
                "now": {"type": "number", "description": "When it was admitted (store clock)."},
            }),
            errors=(409,),
        ),
        Endpoint(
            "/v1/rates/try-acquire", try_acquire, "rates_try_acquire", "rates",
            "Ask a rate limit once, never wait (admitted, or a place in line and its slot)",
            "Admitted now, or joins the line (first call) and answers the position (0 = next) "
            "and `retry_after`, the seconds until its slot: ask again then, with the same "
            "`holder`, to be admitted. Idempotent per `holder`: asking again keeps the place. "
            "The place lapses `wait_ttl` seconds after its slot unless the holder asks again. "
            "`enqueue: false` is admitted only if nobody waits and the rate allows it now, "
            "without joining. " + conflict,
            fields=(
                name, *spec, Field("holder", HOLDER, required=True),
                Field("wait_ttl", {
                    **TTL, "default": 60, "description": "How long the place in line lasts "
                    "past its slot without asking again.",
                }),
                Field("enqueue", {"type": "boolean", "default": True}),
                Field("priority", PRIORITY),
                Field("ageing", AGEING),
            ),
            response=ref("RateTicket"),
            errors=(409,),
        ),
        Endpoint(
            "/v1/rates/leave", leave, "rates_leave", "rates",
            "Give up a holder's place in a rate limit's line",
            "Harmless if it has none (`left: false`).",
            fields=(name, Field("holder", HOLDER, required=True)),
            response=obj(["left"], {"left": {"type": "boolean"}}),
        ),
        Endpoint(
            "/v1/rates/status", status, "rates_status", "rates",
            "A rate limit's rate, its line with each waiter's slot, and recent admissions",
            "Read-only. `rate`, `per` and `burst` are null while the name is idle. GET takes "
            "`name` as a query parameter.",
            methods=("GET", "POST"),
            fields=(name,),
            response=ref("RateStatus"),
        ),
    ]
