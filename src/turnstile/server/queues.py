"""Queue endpoints (``/v1/queues/*``, the admin requeue and purge of dead letters): each
validates, checks the token, and makes one call on the client API's queue (or one step of
the queue protocol, for ``put`` with a caller-chosen id and ``claim``).

Payloads travel as JSON: ``payload`` is any JSON value; a bytes payload travels as
``payload_base64`` instead (and is answered the same way).
"""

from __future__ import annotations

import base64
import binascii
import secrets
from typing import Any

from starlette.responses import Response

from .._core import records, validate
from .._core.payload import decode_payload, encode_payload
from .._core.records import Delivery
from ..errors import InvalidArgument, NotSupported
from .common import (
    CLOSING,
    DONE,
    MAX_LIST,
    Body,
    Ctx,
    integral,
    long_poll,
    query_int,
    shutting_down,
)

SETTINGS = {"visibility_timeout", "max_attempts", "concurrency"}


def _name(ctx: Ctx, body: Body, *, write: bool) -> str:
    name = validate.name(body.required("queue"), "queue")
    if write:
        ctx.may_write(name)
    else:
        ctx.may_read(name)
    return name


def _queue(ctx: Ctx, name: str, body: Body) -> Any:
    """The client API's queue object, with the caller's settings (validated there)."""
    return ctx.client.queue(
        name,
        visibility_timeout=body.get("visibility_timeout", 30.0),
        max_attempts=integral(body.get("max_attempts", 5)),
        concurrency=integral(body.get("concurrency")),
        dedup_window=body.get("dedup_window", validate.DEFAULT_DEDUP_WINDOW),
    )


def _protocol(ctx: Ctx) -> Any:
    if not ctx.client.characteristics.queues:
        raise NotSupported("the store behind this service has no queues")
    return ctx.client.backend.queues()


def _payload(body: Body) -> Any:
    has_json = "payload" in body.data
    has_bytes = body.data.get("payload_base64") is not None
    if has_json == has_bytes:
        raise InvalidArgument(
            "give exactly one of payload (any JSON value) or payload_base64 (bytes, base64)"
        )
    if has_json:
        return body.data["payload"]
    text = body.data["payload_base64"]
    if not isinstance(text, str):
        raise InvalidArgument("payload_base64 must be a string of base64")
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise InvalidArgument("payload_base64 is not valid base64") from None


def payload_fields(value: Any) -> dict[str, Any]:
    if isinstance(value, bytes):
        return {"payload": None, "payload_base64": base64.b64encode(value).decode("ascii")}
    return {"payload": value, "payload_base64": None}


def message_dict(d: Delivery) -> dict[str, Any]:
    return {
        "id": d.id,
        "key": d.key,
        **payload_fields(decode_payload(d.body, d.kind)),
        "attempt": d.attempt,
        "enqueued_at": d.enqueued_at,
        "receipt": d.receipt,
        "deadline": d.deadline,
    }


async def put(ctx: Ctx) -> Any:
    body = await ctx.body(
        {"queue", "payload", "payload_base64", "key", "delay", "dedup_id", "id",
         "max_attempts", "dedup_window"}
    )
    name = _name(ctx, body, write=True)
    q = _queue(ctx, name, body)
    encoded, kind = encode_payload(_payload(body))
    given = body.get("id")
    message = records.NewMessage(
        id=secrets.token_hex(12) if given is None else validate.message_id(given),
        key=validate.key(body.get("key")),
        body=encoded,
        kind=kind,
        delay=validate.delay(body.get("delay", 0.0)),
        dedup_id=validate.dedup_id(body.get("dedup_id")),
        max_attempts=q.max_attempts,
    )
    result = await _protocol(ctx).put(name, message, dedup_window=q.dedup_window)
    ctx.tracker.queue_event(
        "put" if result.created else "put_deduplicated", name, result.id, message.key
    )
    return {"id": result.id, "created": result.created, "now": result.now}


async def get(ctx: Ctx) -> Any:
    """Long poll for the next deliverable message."""
    body = await ctx.body({"queue", "wait", *SETTINGS})
    name = _name(ctx, body, write=True)
    q = _queue(ctx, name, body)
    wait = validate.seconds(body.get("wait", 0.0), "wait", high=ctx.service.config.max_wait)
    outcome, message = await long_poll(ctx.request, ctx.service.closing, q.get(wait))
    if outcome != DONE:
        if message is not None:
            # Taken as the caller went away: return it at once rather than after its
            # visibility timeout (this delivery still counts as an attempt).
            await message.nack(0.0, "the HTTP client went away before receiving it")
        if outcome == CLOSING:
            raise shutting_down()
        return Response(status_code=499)
    if message is None:
        return {"message": None}
    ctx.tracker.queue_event("delivered", name, message.id, message.key, message.attempt)
    return {
        "message": {
            "id": message.id,
            "key": message.key,
            **payload_fields(message.payload),
            "attempt": message.attempt,
            "enqueued_at": message.enqueued_at,
            "receipt": message.receipt,
            "deadline": message.deadline,
        }
    }


async def claim(ctx: Ctx) -> Any:
    """Low level: one claim step, never waits (what a non-blocking get does)."""
    body = await ctx.body({"queue", "receipt", *SETTINGS})
    name = _name(ctx, body, write=True)
    q = _queue(ctx, name, body)
    given = body.get("receipt")
    result = await _protocol(ctx).claim(
        name,
        receipt=secrets.token_hex(12) if given is None else validate.receipt(given),
        visibility_timeout=q.visibility_timeout,
        concurrency=q.concurrency,
        max_attempts=q.max_attempts,
        waiter=None,
    )
    delivery = result.delivery
    if delivery is not None:
        ctx.tracker.queue_event("delivered", name, delivery.id, delivery.key, delivery.attempt)
    return {
        "message": None if delivery is None else message_dict(delivery),
        "now": result.now,
        "retry_after": result.retry_after,
    }


async def ack(ctx: Ctx) -> Any:
    body = await ctx.body({"queue", "id", "receipt"})
    name = _name(ctx, body, write=True)
    ok = await ctx.client.queue(name).ack(body.required("id"), body.required("receipt"))
    if ok:
        ctx.tracker.queue_event("acked", name, body.data["id"], None)
    return {"acked": ok}


async def nack(ctx: Ctx) -> Any:
    body = await ctx.body({"queue", "id", "receipt", "delay", "error"})
    name = _name(ctx, body, write=True)
    ok = await ctx.client.queue(name).nack(
        body.required("id"), body.required("receipt"), body.get("delay", 0.0), body.get("error")
    )
    if ok:
        ctx.tracker.queue_event("nacked", name, body.data["id"], None)
    return {"nacked": ok}


async def extend(ctx: Ctx) -> Any:
    body = await ctx.body({"queue", "id", "receipt", "seconds"})
    name = _name(ctx, body, write=True)
    deadline = await ctx.client.queue(name).extend(
        body.required("id"), body.required("receipt"), body.required("seconds")
    )
    return {"extended": deadline is not None, "deadline": deadline}


async def stats(ctx: Ctx) -> Any:
    if ctx.request.method == "GET":
        params = ctx.request.query_params
        body = Body({"queue": params.get("queue")}, {"queue"})
        top = query_int(ctx.request, "top_keys", 10, 1, validate.MAX_LIST)
    else:
        body = await ctx.body({"queue", "top_keys"})
        top = integral(body.get("top_keys", 10))
    name = _name(ctx, body, write=False)
    found = await ctx.client.queue(name).stats(top)
    result: dict[str, Any] = found.to_dict()
    return result


async def dead(ctx: Ctx) -> Any:
    if ctx.request.method == "GET":
        body = Body({"queue": ctx.request.query_params.get("queue")}, {"queue"})
        limit = query_int(ctx.request, "limit", 100, 1, validate.MAX_LIST)
    else:
        body = await ctx.body({"queue", "limit"})
        limit = integral(body.get("limit", 100))
    name = _name(ctx, body, write=False)
    letters = await ctx.client.queue(name).dead_letters(limit)
    return {
        "dead_letters": [
            {
                "id": d.id,
                "key": d.key,
                **payload_fields(d.payload),
                "attempts": d.attempts,
                "enqueued_at": d.enqueued_at,
                "died_at": d.died_at,
                "error": d.error,
            }
            for d in letters
        ]
    }


async def requeue_dead(ctx: Ctx) -> Any:
    body = await ctx.body({"queue", "ids"})
    name = _name(ctx, body, write=True)
    ctx.admin()
    count = await ctx.client.queue(name).requeue(body.get("ids"))
    ctx.tracker.queue_event("requeued", name, None, None, detail=f"{count} dead letter(s)")
    return {"requeued": count}


async def purge_dead(ctx: Ctx) -> Any:
    body = await ctx.body({"queue", "ids"})
    name = _name(ctx, body, write=True)
    ctx.admin()
    count = await ctx.client.queue(name).purge_dead(body.get("ids"))
    ctx.tracker.queue_event("purged", name, None, None, detail=f"{count} dead letter(s)")
    return {"purged": count}


async def names(ctx: Ctx) -> Any:
    """Queues that hold messages (and the ones configured with ``--queue``) whose names
    start with ``prefix``, that the token may read."""
    prefix = ctx.request.query_params.get("prefix", "")
    max_count = query_int(ctx.request, "max_count", 1000, 1, MAX_LIST)
    listed, truncated = await ctx.service.queue_names(ctx.principal, prefix, max_count)
    return {"queues": listed, "truncated": truncated}
