"""Lock and semaphore endpoints (``/v1/locks/*``, ``/v1/semaphores/*``, ``/v1/names``,
the admin force release): each validates, checks the token, and makes one call on the
client API (or one backend protocol step)."""

from __future__ import annotations

import time
from collections.abc import Awaitable
from typing import Any, TypeVar

from starlette.responses import Response

from .._core import validate
from .._core.records import Grant
from ..errors import AcquireTimeout, LeaseLost
from .common import (
    CLOSING,
    DONE,
    GONE,
    MAX_LIST,
    Body,
    Ctx,
    bool_field,
    integral,
    lease_dict,
    listed,
    long_poll,
    new_holder,
    query_int,
    shutting_down,
)

T = TypeVar("T")
KINDS = ("locks", "semaphores")


def _limit(kind: str, body: Body) -> int:
    if kind == "locks":
        return 1
    return validate.limit(integral(body.required("limit")))


def _fields(kind: str, *names: str) -> set[str]:
    """The body fields of an acquire step: semaphores also take ``limit``."""
    return set(names) | ({"limit"} if kind == "semaphores" else set())


async def acquire(ctx: Ctx, kind: str) -> Any:
    body = await ctx.body(_fields(kind, "name", "ttl", "holder", "wait"))
    name = validate.name(body.required("name"))
    ctx.may_write(name)
    limit = _limit(kind, body)
    ttl = validate.ttl(body.get("ttl", 30.0))
    given = body.get("holder")
    holder = new_holder() if given is None else validate.holder(given)
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
    body = await ctx.body(
        _fields(kind, "name", "ttl", "holder", "wait_ttl", "enqueue")
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
    body = await ctx.body({"name", "holder", "token", "ttl"})
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
    body = await ctx.body({"name", "holder", "token"})
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
        body = await ctx.body({"name"})
        name = validate.name(body.required("name"))
    ctx.may_read(name)
    found = await ctx.client.status(name)
    ctx.tracker.observe(found)
    return found.to_dict()


async def wait(ctx: Ctx, kind: str) -> Any:
    """Low-level: block until (name, holder) is woken by a hand-over, or ``timeout``."""
    body = await ctx.body({"name", "holder", "timeout"})
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
    names, truncated = await listed(ctx.principal, prefix, max_count, ctx.client.names)
    return {"names": names, "truncated": truncated}


async def force_release(ctx: Ctx) -> Any:
    body = await ctx.body({"name", "holder"})
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
