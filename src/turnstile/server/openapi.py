"""The OpenAPI 3.1 document served at ``/openapi.json``, written by hand next to the handlers.

Limits that depend on the configuration (the longest long-poll, the largest body) are filled
in from it, so the document describes the running service exactly. ``tests/server`` checks it
against the running service with schemathesis.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .. import __version__
from .._core import validate
from .errors import CODES

if TYPE_CHECKING:
    from .app import ServerConfig

Schema = dict[str, Any]


def _ref(name: str) -> Schema:
    return {"$ref": f"#/components/schemas/{name}"}


NAME: Schema = {
    "type": "string",
    "minLength": 1,
    "maxLength": validate.MAX_NAME_BYTES,
    "pattern": "^[^\\u0000]+$",
    "description": f"Any text of 1 to {validate.MAX_NAME_BYTES} bytes of UTF-8 except NUL. "
    "Names are data: ':', '/', '{', '}', spaces, quotes and emoji are fine.",
    "examples": ["order:42"],
}
# Query parameters of the listings (/v1/names, /v1/queues).
LISTING: list[Schema] = [
    {
        "name": "prefix",
        "in": "query",
        "required": False,
        "schema": {"type": "string"},
        "description": "Only names starting with this text, taken literally (default: all).",
    },
    {
        "name": "max_count",
        "in": "query",
        "required": False,
        "schema": {"type": "integer", "minimum": 1, "maximum": 10_000, "default": 1000},
    },
]
HOLDER: Schema = {
    "type": "string",
    "minLength": 1,
    "maxLength": validate.MAX_HOLDER_BYTES,
    "pattern": "^[^\\u0000]+$",
    "description": f"Who holds or waits: 1 to {validate.MAX_HOLDER_BYTES} bytes of UTF-8, "
    "e.g. a workflow execution id. Reusing it makes steps idempotent.",
    "examples": ["execution-7f3a"],
}
TTL: Schema = {
    "type": "number",
    "minimum": validate.MIN_TTL,
    "maximum": validate.MAX_TTL,
    "description": "Lease time in seconds (store clock); the lease expires unless renewed.",
}
LIMIT: Schema = {
    "type": "integer",
    "minimum": 1,
    "maximum": validate.MAX_LIMIT,
    "description": "At most this many holders at once.",
}
TOKEN: Schema = {
    "type": "integer",
    "minimum": 1,
    "maximum": 2**63 - 1,
    "description": "Fencing token: strictly increasing per name.",
}
TIME: Schema = {"type": "number", "description": "Seconds since the epoch, on the store's clock."}


def _error_schema() -> Schema:
    return {
        "type": "object",
        "required": ["error"],
        "additionalProperties": False,
        "properties": {
            "error": {
                "type": "object",
                "required": ["code", "message"],
                "additionalProperties": False,
                "properties": {
                    "code": {"type": "string", "enum": sorted(CODES)},
                    "message": {"type": "string"},
                },
            }
        },
    }


def _ok(schema: Schema) -> Schema:
    return {"description": "OK", "content": {"application/json": {"schema": schema}}}


def _errors(*codes: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for status in sorted(codes):
        meaning = "; ".join(
            f"`{code}`: {text}" for code, (st, text) in sorted(CODES.items()) if st == status
        )
        out[str(status)] = {
            "description": meaning,
            "content": {"application/json": {"schema": _ref("Error")}},
        }
    return out


AUTH_ERRORS = (401, 403)
BODY_ERRORS = (400, 413, 415, 422)
STORE_ERRORS = (503,)


def _post(
    summary: str,
    description: str,
    request: Schema,
    response: Schema,
    errors: tuple[int, ...],
    tag: str,
    op_id: str,
) -> Schema:
    return {
        "post": {
            "operationId": op_id,
            "tags": [tag],
            "summary": summary,
            "description": description,
            "requestBody": {
                "required": True,
                "content": {"application/json": {"schema": request}},
            },
            "responses": {
                "200": _ok(response),
                **_errors(*AUTH_ERRORS, *BODY_ERRORS, *STORE_ERRORS, *errors),
            },
        }
    }


def _obj(required: list[str], properties: dict[str, Schema]) -> Schema:
    return {
        "type": "object",
        "required": required,
        "additionalProperties": False,
        "properties": properties,
    }


def _lock_paths(kind: str, config: ServerConfig) -> dict[str, Any]:
    sem = kind == "semaphores"
    what = "semaphore" if sem else "lock"
    tag = "semaphores" if sem else "locks"
    limit = {"limit": LIMIT} if sem else {}
    need_limit = ["limit"] if sem else []
    wait = {
        "type": "number",
        "minimum": 0,
        "maximum": config.max_wait,
        "default": 0,
        "description": "Seconds to wait in line for the grant within this request (a long "
        f"poll, at most {config.max_wait:g} s on this service). 0: only if free now.",
    }
    paths: dict[str, Any] = {
        f"/v1/{kind}/acquire": _post(
            f"Acquire a {what}, waiting up to `wait` seconds",
            "Joins the line and waits (long poll) until granted, in arrival order. On "
            "`acquire_timeout` the caller has left the line. The lease is not renewed by "
            "the service: renew it before `expires_in` passes, or release it when done. "
            "If the client disconnects while waiting, it leaves the line.",
            _obj(
                ["name", *need_limit],
                {
                    "name": NAME,
                    **limit,
                    "ttl": {**TTL, "default": 30},
                    "holder": {
                        **HOLDER,
                        "description": HOLDER["description"] + " Default: a new random id.",
                    },
                    "wait": wait,
                },
            ),
            _obj(["acquired", "lease"], {"acquired": {"const": True}, "lease": _ref("Lease")}),
            (409,),
            tag,
            f"{kind}_acquire",
        ),
        f"/v1/{kind}/try-acquire": _post(
            f"Ask for a {what} once, never wait (a ticket with a position in line)",
            "Holds, or joins the line (first call) and answers the position (0 = next). "
            "Idempotent per `holder`: asking again keeps the place and, once granted, "
            "returns the same lease. A place not asked about within `wait_ttl` lapses. "
            "`enqueue: false` takes a free slot only if nobody waits, without joining.",
            _obj(
                ["name", "holder", *need_limit],
                {
                    "name": NAME,
                    **limit,
                    "ttl": {**TTL, "default": 30},
                    "holder": HOLDER,
                    "wait_ttl": {
                        **TTL,
                        "description": "How long the place in line lasts without asking "
                        "again (default: `ttl`).",
                    },
                    "enqueue": {"type": "boolean", "default": True},
                },
            ),
            _ref("Ticket"),
            (),
            tag,
            f"{kind}_try_acquire",
        ),
        f"/v1/{kind}/renew": _post(
            "Extend a lease to `ttl` seconds from now (store clock)",
            "`lease_lost` (409) if the lease expired or was taken over: work done under it "
            "may have overlapped with a newer holder.",
            _obj(
                ["name", "holder", "token", "ttl"],
                {"name": NAME, "holder": HOLDER, "token": TOKEN, "ttl": TTL},
            ),
            _obj(["lease"], {"lease": _ref("Lease")}),
            (409,),
            tag,
            f"{kind}_renew",
        ),
        f"/v1/{kind}/release": _post(
            "Release a holder's lease (and, without `token`, its place in line)",
            "From any process; a stale `token` never releases a newer grant; repeating it is "
            "harmless (`released: false`).",
            _obj(["name", "holder"], {"name": NAME, "holder": HOLDER, "token": TOKEN}),
            _obj(["released"], {"released": {"type": "boolean"}}),
            (),
            tag,
            f"{kind}_release",
        ),
    }
    status_path = _post(
        "Holders and waiters of a name, in order",
        "Read-only. `limit` is null when nobody holds or waits.",
        _obj(["name"], {"name": NAME}),
        _ref("Status"),
        (),
        tag,
        f"{kind}_status",
    )
    status_path["get"] = {
        "operationId": f"{kind}_status_get",
        "tags": [tag],
        "summary": "Holders and waiters of a name (name as a query parameter)",
        "parameters": [
            {"name": "name", "in": "query", "required": True, "schema": NAME},
        ],
        "responses": {
            "200": _ok(_ref("Status")),
            **_errors(*AUTH_ERRORS, 422, *STORE_ERRORS),
        },
    }
    paths[f"/v1/{kind}/status"] = status_path
    return paths


def document(config: ServerConfig) -> dict[str, Any]:
    paths: dict[str, Any] = {}
    paths.update(_lock_paths("locks", config))
    paths.update(_lock_paths("semaphores", config))
    paths["/v1/semaphores/wait"] = _post(
        "Low level: block until a hand-over wakes `holder`, or `timeout`",
        "Used by the Python client's blocking acquire between try-acquire steps. Answers "
        "at once if `holder` already holds the name. It does not keep a place in line: "
        "the try-acquire steps do.",
        _obj(
            ["name", "holder", "timeout"],
            {
                "name": NAME,
                "holder": HOLDER,
                "timeout": {"type": "number", "minimum": 0, "maximum": config.max_wait},
            },
        ),
        _obj(["woken"], {"woken": {"type": "boolean"}}),
        (),
        "semaphores",
        "semaphores_wait",
    )
    paths["/v1/names"] = {
        "get": {
            "operationId": "names",
            "tags": ["locks", "semaphores"],
            "summary": "Names that have holders or waiters now (only those the token may read)",
            "parameters": LISTING,
            "responses": {
                "200": {
                    "description": "OK",
                    "content": {
                        "application/json": {
                            "schema": _obj(
                                ["names", "truncated"],
                                {
                                    "names": {"type": "array", "items": {"type": "string"}},
                                    "truncated": {"type": "boolean"},
                                },
                            )
                        }
                    },
                },
                **_errors(*AUTH_ERRORS, 422, *STORE_ERRORS),
            },
        }
    }
    paths["/v1/info"] = {
        "get": {
            "operationId": "info",
            "tags": ["service"],
            "summary": "Version, the store behind the service, limits, and who the token is",
            "responses": {
                "200": _ok(_ref("Info")),
                **_errors(401, *STORE_ERRORS),
            },
        }
    }
    paths["/v1/dashboard"] = {
        "get": {
            "operationId": "dashboard_data",
            "tags": ["service"],
            "summary": "What the dashboard shows: names, queues and events after `since`",
            "parameters": [
                {
                    "name": "since",
                    "in": "query",
                    "required": False,
                    "schema": {"type": "integer", "minimum": 0, "maximum": 2**62},
                }
            ],
            "responses": {
                "200": {
                    "description": "OK",
                    "content": {"application/json": {"schema": _ref("Dashboard")}},
                },
                **_errors(401, 422, *STORE_ERRORS),
            },
        }
    }
    paths["/v1/admin/force-release"] = _post(
        "Admin: release a holder (or, without `holder`, every holder and waiter) of a name",
        "Needs an admin token that may write the name.",
        _obj(["name"], {"name": NAME, "holder": HOLDER}),
        _obj(["released"], {"released": {"type": "array", "items": {"type": "string"}}}),
        (),
        "admin",
        "force_release",
    )
    paths.update(_queue_paths(config))
    paths["/healthz"] = {
        "get": {
            "operationId": "healthz",
            "tags": ["service"],
            "summary": "Whether the store answers (no token needed)",
            "security": [],
            "responses": {
                "200": {
                    "description": "The store answers",
                    "content": {
                        "application/json": {
                            "schema": _obj(
                                ["status", "backend"],
                                {"status": {"const": "ok"}, "backend": {"type": "string"}},
                            )
                        }
                    },
                },
                "503": {
                    "description": "The store does not answer",
                    "content": {
                        "application/json": {
                            "schema": _obj(
                                ["status", "error"],
                                {
                                    "status": {"const": "unavailable"},
                                    "error": _error_schema()["properties"]["error"],
                                },
                            )
                        }
                    },
                },
            },
        }
    }
    paths["/metrics"] = {
        "get": {
            "operationId": "metrics",
            "tags": ["service"],
            "summary": "Prometheus metrics of this instance (text format 0.0.4)",
            "responses": {
                "200": {
                    "description": "OK",
                    "content": {"text/plain": {"schema": {"type": "string"}}},
                },
                **_errors(401),
            },
        }
    }

    lease = _obj(
        ["name", "holder", "token", "acquired_at", "expires_at", "expires_in"],
        {
            "name": {"type": "string"},
            "holder": {"type": "string"},
            "token": TOKEN,
            "acquired_at": TIME,
            "expires_at": TIME,
            "expires_in": {"type": "number", "minimum": 0, "description": "Seconds left."},
        },
    )
    ticket = _obj(
        ["acquired", "position", "lease", "now", "retry_after"],
        {
            "acquired": {"type": "boolean"},
            "position": {
                "type": ["integer", "null"],
                "minimum": 0,
                "description": "Place in line (0 = next) while not acquired; null when "
                "acquired, or with `enqueue: false` when not granted.",
            },
            "lease": {"oneOf": [_ref("Lease"), {"type": "null"}]},
            "now": TIME,
            "retry_after": {
                "type": ["number", "null"],
                "minimum": 0,
                "description": "Seconds until the earliest current lease expires.",
            },
        },
    )
    status = _obj(
        ["name", "limit", "now", "holders", "waiters"],
        {
            "name": {"type": "string"},
            "limit": {"type": ["integer", "null"], "minimum": 1},
            "now": TIME,
            "holders": {
                "type": "array",
                "items": _obj(
                    ["holder", "token", "acquired_at", "expires_at", "age", "expires_in"],
                    {
                        "holder": {"type": "string"},
                        "token": TOKEN,
                        "acquired_at": TIME,
                        "expires_at": TIME,
                        "age": {"type": "number"},
                        "expires_in": {"type": "number"},
                    },
                ),
            },
            "waiters": {
                "type": "array",
                "items": _obj(
                    ["holder", "position", "joined_at", "expires_at", "waiting"],
                    {
                        "holder": {"type": "string"},
                        "position": {"type": "integer", "minimum": 0},
                        "joined_at": TIME,
                        "expires_at": TIME,
                        "waiting": {"type": "number"},
                    },
                ),
            },
        },
    )
    principal = _obj(
        ["name", "prefixes", "read_only", "admin"],
        {
            "name": {"type": "string"},
            "prefixes": {"type": "array", "items": {"type": "string"}},
            "read_only": {"type": "boolean"},
            "admin": {"type": "boolean"},
        },
    )
    event = _obj(
        ["seq", "at", "kind", "name", "holder", "token", "via", "detail"],
        {
            "seq": {"type": "integer"},
            "at": TIME,
            "kind": {"type": "string"},
            "name": {"type": "string"},
            "holder": {"type": ["string", "null"]},
            "token": {"type": ["integer", "null"]},
            "via": {"type": "string", "enum": ["this instance", "observed"]},
            "detail": {"type": "string"},
        },
    )
    info = _obj(
        ["service", "version", "api", "backend", "limits", "auth", "principal"],
        {
            "service": {"const": "turnstile"},
            "version": {"type": "string"},
            "api": {"const": "v1"},
            "backend": {"type": "object"},
            "limits": {"type": "object"},
            "auth": _obj(["required"], {"required": {"type": "boolean"}}),
            "principal": _ref("Principal"),
        },
    )
    dashboard = _obj(
        ["now", "principal", "names", "truncated", "queues", "events", "cursor", "instance"],
        {
            "now": {"type": "number"},
            "principal": _ref("Principal"),
            "names": {"type": "array", "items": _ref("Status")},
            "truncated": {"type": "boolean"},
            "queues": {"type": "array", "items": _ref("QueueStats")},
            "events": {"type": "array", "items": _ref("Event")},
            "cursor": {"type": "integer"},
            "instance": {"type": "object"},
        },
    )
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "Turnstile",
            "version": __version__,
            "description": "Fair leased locks, semaphores and keyed FIFO queues over HTTP. "
            "Every error answers `{\"error\": {\"code\", \"message\"}}`; POST bodies are JSON "
            f"(`Content-Type: application/json`) of at most {config.max_body} bytes. "
            "Names travel in bodies or query parameters, never in paths. See docs/http.md.",
        },
        "servers": [{"url": "/"}],
        "security": [{"bearer": []}],
        "tags": [
            {"name": "locks", "description": "One holder at a time, in arrival order."},
            {"name": "semaphores", "description": "At most `limit` holders, in arrival order."},
            {"name": "admin", "description": "Needs an admin token."},
            {"name": "queues", "description": "Keyed FIFO queues: one message per key in "
             "flight, in put order; at least once."},
            {"name": "service", "description": "Health, metrics, discovery."},
        ],
        "paths": paths,
        "components": {
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
            "schemas": {
                "Error": _error_schema(),
                "Lease": lease,
                "Ticket": ticket,
                "Status": status,
                "Principal": principal,
                "Event": event,
                "Info": info,
                "Dashboard": dashboard,
                **_queue_schemas(),
            },
        },
    }


# -- queues ----------------------------------------------------------------------------------

QUEUE: Schema = {**NAME, "description": "The queue's name. " + NAME["description"],
                 "examples": ["webhooks"]}
BASE64: Schema = {
    "type": "string",
    "pattern": "^(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?$",
    "contentEncoding": "base64",
    "description": "A bytes payload, base64-encoded (instead of `payload`).",
}
TEXT_ID: Schema = {"type": "string", "minLength": 1, "maxLength": 256, "pattern": "^[^\\u0000]+$"}


def _settings() -> dict[str, Schema]:
    return {
        "visibility_timeout": {
            "type": "number",
            "minimum": validate.MIN_VISIBILITY,
            "maximum": validate.MAX_VISIBILITY,
            "default": 30,
            "description": "Seconds a delivered message stays invisible unless settled.",
        },
        "max_attempts": {
            "type": "integer", "minimum": 1, "maximum": validate.MAX_ATTEMPTS, "default": 5,
            "description": "Deliveries before a message becomes a dead letter.",
        },
        "concurrency": {
            "type": ["integer", "null"], "minimum": 1, "maximum": validate.MAX_LIMIT,
            "description": "At most this many messages of the queue in flight (null: no cap).",
        },
    }


def _queue_paths(config: ServerConfig) -> dict[str, Any]:
    tag = "queues"
    paths: dict[str, Any] = {}
    settle = {"queue": QUEUE, "id": TEXT_ID, "receipt": TEXT_ID}
    count = {"type": "integer", "minimum": 1, "maximum": validate.MAX_LIST}
    ids = {
        "type": ["array", "null"], "maxItems": validate.MAX_LIST, "items": TEXT_ID,
        "description": "Dead letters by id (default: all).",
    }
    paths["/v1/queues"] = {
        "get": {
            "operationId": "queues_list",
            "tags": [tag],
            "summary": "Queues that hold messages (ready, delayed, in flight or dead), and "
            "those configured with --queue, whose names start with `prefix`, that the token "
            "may read; in code-point order.",
            "parameters": LISTING,
            "responses": {
                "200": _ok(_obj(["queues", "truncated"], {
                    "queues": {"type": "array", "items": {"type": "string"}},
                    "truncated": {"type": "boolean"},
                })),
                **_errors(*AUTH_ERRORS, 422, *STORE_ERRORS),
            },
        }
    }
    paths["/v1/queues/put"] = _post(
        "Put a message",
        "One message per key is in flight at a time, in put order; keyless messages are "
        f"plain FIFO. The encoded payload may be at most {validate.MAX_PAYLOAD_BYTES} bytes. The "
        "same `dedup_id` within `dedup_window` seconds stores nothing and answers the first "
        "message's id with `created: false`. A caller-chosen `id` makes retries safe.",
        {
            **_obj(["queue"], {
                "queue": QUEUE,
                "payload": {"description": "Any JSON value."},
                "payload_base64": BASE64,
                "key": {**TEXT_ID, "maxLength": validate.MAX_KEY_BYTES,
                        "description": f"1 to {validate.MAX_KEY_BYTES} bytes of UTF-8."},
                "delay": {"type": "number", "minimum": 0, "maximum": validate.MAX_DELAY,
                          "default": 0},
                "dedup_id": {**TEXT_ID, "maxLength": validate.MAX_DEDUP_ID_BYTES},
                "id": TEXT_ID,
                "max_attempts": _settings()["max_attempts"],
                "dedup_window": {"type": "number", "minimum": validate.MIN_DEDUP_WINDOW,
                                 "maximum": validate.MAX_DEDUP_WINDOW,
                                 "default": validate.DEFAULT_DEDUP_WINDOW},
            }),
            "oneOf": [{"required": ["payload"]}, {"required": ["payload_base64"]}],
        },
        _obj(["id", "created", "now"], {"id": {"type": "string"},
                                        "created": {"type": "boolean"}, "now": TIME}),
        (),
        tag,
        "queues_put",
    )
    paths["/v1/queues/get"] = _post(
        "Take the next deliverable message, waiting up to `wait` seconds",
        "The oldest ready message whose key has nothing in flight, while fewer than "
        "`concurrency` are in flight. `message: null` if none came within `wait` (at most "
        f"{config.max_wait:g} s on this service). Settle it with ack, nack or extend before "
        "its `deadline`. If the client disconnects while a message is being handed to it, "
        "the message is returned to the queue at once.",
        _obj(["queue"], {
            "queue": QUEUE,
            "wait": {"type": "number", "minimum": 0, "maximum": config.max_wait, "default": 0},
            **_settings(),
        }),
        _obj(["message"], {"message": {"oneOf": [_ref("QueueMessage"), {"type": "null"}]}}),
        (),
        tag,
        "queues_get",
    )
    paths["/v1/queues/claim"] = _post(
        "Low level: one claim step (never waits), with the store's `now` and `retry_after`",
        "Used by the Python client.",
        _obj(["queue"], {"queue": QUEUE, "receipt": TEXT_ID, **_settings()}),
        _obj(["message", "now", "retry_after"], {
            "message": {"oneOf": [_ref("QueueMessage"), {"type": "null"}]},
            "now": TIME,
            "retry_after": {"type": ["number", "null"], "minimum": 0},
        }),
        (),
        tag,
        "queues_claim",
    )
    paths["/v1/queues/ack"] = _post(
        "Done: delete the message (from any process)",
        "`acked: false` if the receipt is stale (the message timed out and is, or will be, "
        "delivered again) or it was already settled.",
        _obj(["queue", "id", "receipt"], settle),
        _obj(["acked"], {"acked": {"type": "boolean"}}),
        (),
        tag,
        "queues_ack",
    )
    paths["/v1/queues/nack"] = _post(
        "Failed: deliver again after `delay` (before later messages of its key)",
        "After `max_attempts` deliveries the message becomes a dead letter with `error`.",
        _obj(["queue", "id", "receipt"], {
            **settle,
            "delay": {"type": "number", "minimum": 0, "maximum": validate.MAX_DELAY, "default": 0},
            "error": {"type": ["string", "null"], "description": "Why (kept, truncated to "
                      f"{validate.MAX_ERROR_CHARS} characters)."},
        }),
        _obj(["nacked"], {"nacked": {"type": "boolean"}}),
        (),
        tag,
        "queues_nack",
    )
    paths["/v1/queues/extend"] = _post(
        "Keep a message invisible for `seconds` from now",
        "",
        _obj(["queue", "id", "receipt", "seconds"], {
            **settle, "seconds": {k: v for k, v in _settings()["visibility_timeout"].items()
                                  if k != "default"},
        }),
        _obj(["extended", "deadline"], {"extended": {"type": "boolean"},
                                        "deadline": {"type": ["number", "null"]}}),
        (),
        tag,
        "queues_extend",
    )
    for path, op, summary, fields, response in (
        ("/v1/queues/stats", "queues_stats", "Counts: ready, delayed, in flight, dead; oldest "
         "age; deepest keys", {"top_keys": count}, _ref("QueueStats")),
        ("/v1/queues/dead", "queues_dead", "Dead letters in put order", {"limit": count},
         _obj(["dead_letters"], {"dead_letters": {"type": "array",
                                                  "items": _ref("DeadLetter")}})),
    ):
        (extra,) = fields
        entry = _post(summary, "Read-only.", _obj(["queue"], {"queue": QUEUE, **fields}),
                      response, (), tag, op)
        entry["get"] = {
            "operationId": op + "_get",
            "tags": [tag],
            "summary": summary + " (as query parameters)",
            "parameters": [
                {"name": "queue", "in": "query", "required": True, "schema": QUEUE},
                {"name": extra, "in": "query", "required": False, "schema": count},
            ],
            "responses": {"200": _ok(response), **_errors(*AUTH_ERRORS, 422, *STORE_ERRORS)},
        }
        paths[path] = entry
    for path, op, summary, key in (
        ("/v1/admin/requeue-dead", "requeue_dead", "Admin: put dead letters back at the end "
         "of the queue, attempts reset", "requeued"),
        ("/v1/admin/purge-dead", "purge_dead", "Admin: delete dead letters", "purged"),
    ):
        paths[path] = _post(
            summary, "Needs an admin token that may write the queue.",
            _obj(["queue"], {"queue": QUEUE, "ids": ids}),
            _obj([key], {key: {"type": "integer", "minimum": 0}}),
            (), "admin", op,
        )
    return paths


def _queue_schemas() -> dict[str, Schema]:
    payload: dict[str, Schema] = {
        "payload": {"description": "The JSON payload (null for a bytes payload)."},
        "payload_base64": {"type": ["string", "null"],
                           "description": "A bytes payload, base64; else null."},
    }
    return {
        "QueueMessage": _obj(
            ["id", "key", "payload", "payload_base64", "attempt", "enqueued_at", "receipt",
             "deadline"],
            {
                "id": {"type": "string"},
                "key": {"type": ["string", "null"]},
                **payload,
                "attempt": {"type": "integer", "minimum": 1},
                "enqueued_at": TIME,
                "receipt": {"type": "string"},
                "deadline": {**TIME, "description": "When it is delivered again unless "
                             "settled or extended (store clock)."},
            },
        ),
        "QueueStats": _obj(
            ["name", "ready", "delayed", "in_flight", "dead", "oldest_age", "deepest_keys",
             "now"],
            {
                "name": {"type": "string"},
                "ready": {"type": "integer", "minimum": 0},
                "delayed": {"type": "integer", "minimum": 0},
                "in_flight": {"type": "integer", "minimum": 0},
                "dead": {"type": "integer", "minimum": 0},
                "oldest_age": {"type": ["number", "null"]},
                "deepest_keys": {"type": "array", "items": _obj(
                    ["key", "pending"],
                    {"key": {"type": "string"}, "pending": {"type": "integer", "minimum": 1}},
                )},
                "now": TIME,
            },
        ),
        "DeadLetter": _obj(
            ["id", "key", "payload", "payload_base64", "attempts", "enqueued_at", "died_at",
             "error"],
            {
                "id": {"type": "string"},
                "key": {"type": ["string", "null"]},
                **payload,
                "attempts": {"type": "integer", "minimum": 1},
                "enqueued_at": TIME,
                "died_at": TIME,
                "error": {"type": ["string", "null"]},
            },
        ),
    }
