"""Queue endpoints (``/v1/queues/*``, the admin requeue and purge of dead letters): each
checks the token and makes one call on the public client API's queue, which checks the
arguments' ranges. :func:`endpoints` is their part of the endpoint table.

Payloads travel as JSON: ``payload`` is any JSON value; a bytes payload travels as
``payload_base64`` instead (and is answered the same way).
"""

from __future__ import annotations

import base64
import binascii
from typing import TYPE_CHECKING, Any

from starlette.responses import Response

from .._async.queue import MAX_PREFETCH
from .._core import validate
from .._core.payload import decode_payload
from .._core.records import Delivery
from ..aio import AsyncQueue
from ..errors import InvalidArgument
from .common import CLOSING, DONE, Ctx, long_poll, shutting_down
from .openapi import BASE64, LISTING, QUEUE, TEXT_ID, TIME, obj, queue_settings, ref
from .table import Endpoint, Field, Schema

if TYPE_CHECKING:
    from .config import ServerConfig


def _queue(ctx: Ctx, *, write: bool) -> AsyncQueue:
    """The client API's queue the request names, with the caller's settings (its
    constructor checks them), once the token may use it."""
    args = ctx.args
    q = ctx.client.queue(
        args["queue"],
        visibility_timeout=args.get("visibility_timeout", 30.0),
        max_attempts=args.get("max_attempts", 5),
        concurrency=args.get("concurrency"),
        dedup_window=args.get("dedup_window", validate.DEFAULT_DEDUP_WINDOW),
    )
    if write:
        ctx.may_write(q.name)
    else:
        ctx.may_read(q.name)
    return q


def _payload(ctx: Ctx) -> Any:
    has_json = "payload" in ctx.args.raw
    encoded = ctx.args.get("payload_base64")
    if has_json == (encoded is not None):
        raise InvalidArgument(
            "give exactly one of payload (any JSON value) or payload_base64 (bytes, base64)"
        )
    if has_json:
        return ctx.args.raw["payload"]
    try:
        return base64.b64decode(encoded, validate=True)
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
    q = _queue(ctx, write=True)
    args = ctx.args
    result = await q.put_message(
        _payload(ctx), args.get("key"), args.get("delay", 0.0), args.get("dedup_id"),
        id=args.get("id"),
    )
    ctx.tracker.queue_event(
        "put" if result.created else "put_deduplicated", q.name, result.id, args.get("key")
    )
    return {"id": result.id, "created": result.created, "now": result.now}


async def get(ctx: Ctx) -> Any:
    """Long poll for the next deliverable message."""
    q = _queue(ctx, write=True)
    name = q.name
    # The service's own bound on a long poll, not a rule of the primitive.
    wait = validate.seconds(ctx.args.get("wait", 0.0), "wait", high=ctx.service.config.max_wait)
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
    q = _queue(ctx, write=True)
    result = await q.claim(ctx.args.get("receipt"))
    delivery = result.delivery
    if delivery is not None:
        ctx.tracker.queue_event("delivered", q.name, delivery.id, delivery.key, delivery.attempt)
    return {
        "message": None if delivery is None else message_dict(delivery),
        "now": result.now,
        "retry_after": result.retry_after,
    }


def _batch_lists(args: Any) -> tuple[list[tuple[str, str]], list[str]]:
    """The acks (``[{"id", "receipt"}]``) and the receipts of a batch step, checked: each
    an id or receipt as ``ack`` and ``claim`` take them, at most MAX_PREFETCH of each."""
    raw_acks = args.get("acks") or []
    raw_receipts = args.get("receipts")
    if not isinstance(raw_acks, list) or len(raw_acks) > MAX_PREFETCH:
        raise InvalidArgument(f"acks must be a list of at most {MAX_PREFETCH} items")
    if not isinstance(raw_receipts, list) or not 1 <= len(raw_receipts) <= MAX_PREFETCH:
        raise InvalidArgument(f"receipts must be a list of 1 to {MAX_PREFETCH} receipts")
    acks = []
    for i, item in enumerate(raw_acks):
        if not isinstance(item, dict) or set(item) != {"id", "receipt"}:
            raise InvalidArgument(f"acks[{i}] must be an object with exactly id and receipt")
        acks.append((
            validate.message_id(item["id"], f"acks[{i}].id"),
            validate.receipt(item["receipt"], f"acks[{i}].receipt"),
        ))  # fmt: skip
    receipts = [validate.receipt(r, f"receipts[{i}]") for i, r in enumerate(raw_receipts)]
    if len(set(receipts)) != len(receipts):
        raise InvalidArgument("receipts must be distinct (each names one delivery)")
    return acks, receipts


async def ack_claim(ctx: Ctx) -> Any:
    """Low level: acks, then up to one claim per receipt, in one store step (never waits):
    what ``work(prefetch=)`` does between two batches."""
    q = _queue(ctx, write=True)
    acks, receipts = _batch_lists(ctx.args)
    acked, batch = await q._ack_claim_many(acks, receipts, None)
    for (message_id, _), ok in zip(acks, acked, strict=True):
        if ok:
            ctx.tracker.queue_event("acked", q.name, message_id, None)
    for d in batch.deliveries:
        ctx.tracker.queue_event("delivered", q.name, d.id, d.key, d.attempt)
    return {
        "acked": acked,
        "messages": [message_dict(d) for d in batch.deliveries],
        "now": batch.now,
        "retry_after": batch.retry_after,
    }


async def ack(ctx: Ctx) -> Any:
    q = _queue(ctx, write=True)
    ok = await q.ack(ctx.args["id"], ctx.args["receipt"])
    if ok:
        ctx.tracker.queue_event("acked", q.name, ctx.args["id"], None)
    return {"acked": ok}


async def nack(ctx: Ctx) -> Any:
    q = _queue(ctx, write=True)
    args = ctx.args
    ok = await q.nack(args["id"], args["receipt"], args.get("delay", 0.0), args.get("error"))
    if ok:
        ctx.tracker.queue_event("nacked", q.name, args["id"], None)
    return {"nacked": ok}


async def extend(ctx: Ctx) -> Any:
    q = _queue(ctx, write=True)
    deadline = await q.extend(ctx.args["id"], ctx.args["receipt"], ctx.args["seconds"])
    return {"extended": deadline is not None, "deadline": deadline}


async def stats(ctx: Ctx) -> Any:
    q = _queue(ctx, write=False)
    found = await q.stats(ctx.args.get("top_keys", 10))
    result: dict[str, Any] = found.to_dict()
    return result


async def dead(ctx: Ctx) -> Any:
    q = _queue(ctx, write=False)
    letters = await q.dead_letters(ctx.args.get("limit", 100))
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
    q = _queue(ctx, write=True)
    ctx.admin()
    count = await q.requeue(ctx.args.get("ids"))
    ctx.tracker.queue_event("requeued", q.name, None, None, detail=f"{count} dead letter(s)")
    return {"requeued": count}


async def purge_dead(ctx: Ctx) -> Any:
    q = _queue(ctx, write=True)
    ctx.admin()
    count = await q.purge_dead(ctx.args.get("ids"))
    ctx.tracker.queue_event("purged", q.name, None, None, detail=f"{count} dead letter(s)")
    return {"purged": count}


async def names(ctx: Ctx) -> Any:
    """Queues that hold messages (and the ones configured with ``--queue``) whose names
    start with ``prefix``, that the token may read."""
    prefix = ctx.args.get("prefix", "")
    max_count = ctx.args.get("max_count", 1000)
    listed, truncated = await ctx.service.queue_names(ctx.principal, prefix, max_count)
    return {"queues": listed, "truncated": truncated}


# -- the endpoint table ----------------------------------------------------------------------


def endpoints(config: ServerConfig) -> list[Endpoint]:
    """The queue part of the endpoint table."""
    tag = "queues"
    queue = Field("queue", QUEUE, required=True)
    settle = (queue, Field("id", TEXT_ID, required=True), Field("receipt", TEXT_ID, required=True))
    settings = tuple(Field(k, v) for k, v in queue_settings().items())
    count: Schema = {"type": "integer", "minimum": 1, "maximum": validate.MAX_LIST}
    ids = Field("ids", {
        "type": ["array", "null"], "maxItems": validate.MAX_LIST, "items": TEXT_ID,
        "description": "Dead letters by id (default: all).",
    })
    message: Schema = {"oneOf": [ref("QueueMessage"), {"type": "null"}]}
    table = [
        Endpoint(
            "/v1/queues", names, "queues_list", tag,
            "Queues that hold messages (ready, delayed, in flight or dead), and "
            "those configured with --queue, whose names start with `prefix`, that the token "
            "may read; in code-point order.",
            methods=("GET",),
            fields=LISTING,
            response=obj(["queues", "truncated"], {
                "queues": {"type": "array", "items": {"type": "string"}},
                "truncated": {"type": "boolean"},
            }),
        ),
        Endpoint(
            "/v1/queues/put", put, "queues_put", tag,
            "Put a message",
            "One message per key is in flight at a time, in put order; keyless messages are "
            f"plain FIFO. The encoded payload may be at most {validate.MAX_PAYLOAD_BYTES} "
            "bytes. The same `dedup_id` within `dedup_window` seconds stores nothing and "
            "answers the first message's id with `created: false`. A caller-chosen `id` makes "
            "retries safe.",
            fields=(
                queue,
                Field("payload", {"description": "Any JSON value."}),
                Field("payload_base64", BASE64),
                Field("key", {**TEXT_ID, "type": ["string", "null"],
                              "maxLength": validate.MAX_KEY_BYTES,
                              "description": f"1 to {validate.MAX_KEY_BYTES} bytes of UTF-8."}),
                Field("delay", {"type": "number", "minimum": 0, "maximum": validate.MAX_DELAY,
                                "default": 0}),
                Field("dedup_id", {**TEXT_ID, "type": ["string", "null"],
                                   "maxLength": validate.MAX_DEDUP_ID_BYTES}),
                Field("id", TEXT_ID),
                Field("max_attempts", queue_settings()["max_attempts"]),
                Field("dedup_window", {"type": "number", "minimum": validate.MIN_DEDUP_WINDOW,
                                       "maximum": validate.MAX_DEDUP_WINDOW,
                                       "default": validate.DEFAULT_DEDUP_WINDOW}),
            ),
            body_extra={"oneOf": [{"required": ["payload"]}, {"required": ["payload_base64"]}]},
            response=obj(["id", "created", "now"], {
                "id": {"type": "string"}, "created": {"type": "boolean"}, "now": TIME,
            }),
        ),
        Endpoint(
            "/v1/queues/get", get, "queues_get", tag,
            "Take the next deliverable message, waiting up to `wait` seconds",
            "The oldest ready message whose key has nothing in flight, while fewer than "
            "`concurrency` are in flight. `message: null` if none came within `wait` (at most "
            f"{config.max_wait:g} s on this service). Settle it with ack, nack or extend before "
            "its `deadline`. If the client disconnects while a message is being handed to it, "
            "the message is returned to the queue at once.",
            fields=(
                queue,
                Field("wait", {"type": "number", "minimum": 0, "maximum": config.max_wait,
                               "default": 0}),
                *settings,
            ),
            response=obj(["message"], {"message": message}),
        ),
        Endpoint(
            "/v1/queues/claim", claim, "queues_claim", tag,
            "Low level: one claim step (never waits), with the store's `now` and `retry_after`",
            "Used by the Python client.",
            fields=(queue, Field("receipt", TEXT_ID), *settings),
            response=obj(["message", "now", "retry_after"], {
                "message": message,
                "now": TIME,
                "retry_after": {"type": ["number", "null"], "minimum": 0},
            }),
        ),
        Endpoint(
            "/v1/queues/ack-claim", ack_claim, "queues_ack_claim", tag,
            "Low level: acks, then up to one claim per receipt, in one store step (never "
            "waits)",
            "Used by the Python client's `work(prefetch=)`: the messages of a batch are acked "
            "and the next batch claimed in one request (on PostgreSQL one transaction). "
            "`acked[i]` answers `acks[i]` as `ack` would; `messages` are the ones claimed, "
            "oldest first, each with its own receipt (of distinct keys); none if nothing was "
            "deliverable, and then `retry_after` says when to look again. A repeat after a "
            "lost reply claims again: the lost deliveries come back after their visibility "
            f"timeout. At most {MAX_PREFETCH} acks and {MAX_PREFETCH} receipts.",
            fields=(
                queue,
                Field("acks", {
                    "type": ["array", "null"], "maxItems": MAX_PREFETCH,
                    "items": obj(["id", "receipt"], {"id": TEXT_ID, "receipt": TEXT_ID}),
                    "description": "Messages to ack first: their id and receipt.",
                }),
                Field("receipts", {
                    "type": "array", "minItems": 1, "maxItems": MAX_PREFETCH,
                    "uniqueItems": True, "items": TEXT_ID,
                    "description": "One per message to claim: the receipt it is given.",
                }, required=True),
                *settings,
            ),
            response=obj(["acked", "messages", "now", "retry_after"], {
                "acked": {"type": "array", "items": {"type": "boolean"}},
                "messages": {"type": "array", "items": ref("QueueMessage")},
                "now": TIME,
                "retry_after": {"type": ["number", "null"], "minimum": 0},
            }),
        ),
        Endpoint(
            "/v1/queues/ack", ack, "queues_ack", tag,
            "Done: delete the message (from any process)",
            "`acked: false` if the receipt is stale (the message timed out and is, or will "
            "be, delivered again) or it was already settled.",
            fields=settle,
            response=obj(["acked"], {"acked": {"type": "boolean"}}),
        ),
        Endpoint(
            "/v1/queues/nack", nack, "queues_nack", tag,
            "Failed: deliver again after `delay` (before later messages of its key)",
            "After `max_attempts` deliveries the message becomes a dead letter with `error`.",
            fields=(
                *settle,
                Field("delay", {"type": "number", "minimum": 0, "maximum": validate.MAX_DELAY,
                                "default": 0}),
                Field("error", {"type": ["string", "null"], "description": "Why (kept, "
                                f"truncated to {validate.MAX_ERROR_CHARS} characters)."}),
            ),
            response=obj(["nacked"], {"nacked": {"type": "boolean"}}),
        ),
        Endpoint(
            "/v1/queues/extend", extend, "queues_extend", tag,
            "Keep a message invisible for `seconds` from now",
            fields=(
                *settle,
                Field("seconds", {k: v for k, v in queue_settings()["visibility_timeout"].items()
                                  if k != "default"}, required=True),
            ),
            response=obj(["extended", "deadline"], {
                "extended": {"type": "boolean"}, "deadline": {"type": ["number", "null"]},
            }),
        ),
        Endpoint(
            "/v1/queues/stats", stats, "queues_stats", tag,
            "Counts: ready, delayed, in flight, dead; oldest age; deepest keys",
            "Read-only.",
            methods=("GET", "POST"),
            fields=(queue, Field("top_keys", count)),
            response=ref("QueueStats"),
        ),
        Endpoint(
            "/v1/queues/dead", dead, "queues_dead", tag,
            "Dead letters in put order",
            "Read-only.",
            methods=("GET", "POST"),
            fields=(queue, Field("limit", count)),
            response=obj(["dead_letters"], {"dead_letters": {"type": "array",
                                                             "items": ref("DeadLetter")}}),
        ),
    ]
    for path, handler, op, summary, key in (
        ("/v1/admin/requeue-dead", requeue_dead, "requeue_dead", "Admin: put dead letters back "
         "at the end of the queue, attempts reset", "requeued"),
        ("/v1/admin/purge-dead", purge_dead, "purge_dead", "Admin: delete dead letters",
         "purged"),
    ):
        table.append(Endpoint(
            path, handler, op, "admin", summary, "Needs an admin token that may write the queue.",
            fields=(queue, ids),
            response=obj([key], {key: {"type": "integer", "minimum": 0}}),
        ))
    return table
