"""The OpenAPI 3.1 document served at ``/openapi.json``, generated from the endpoint table
(``table.py``; the entries live next to their handlers in ``lock_endpoints.py``,
``queue_endpoints.py`` and ``app.py``). Written by hand here, once: the schemas the entries
share (a name, a holder, a ttl...) and the component schemas of the answers (Lease, Ticket,
Status, Error...).

Limits that depend on the configuration (the longest long-poll, the largest body) are filled
in from it, so the document describes the running service exactly. ``tests/server`` checks it
against the running service with schemathesis.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from .. import __version__
from .._async import rate_limit
from .._core import callbacks, validate
from .errors import CODES
from .table import Endpoint, Field, Schema, error_statuses

if TYPE_CHECKING:
    from .config import ServerConfig


def ref(name: str) -> Schema:
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
LISTING: tuple[Field, ...] = (
    Field("prefix", {
        "type": "string",
        "description": "Only names starting with this text, taken literally (default: all).",
    }),
    Field("max_count", {"type": "integer", "minimum": 1, "maximum": 10_000, "default": 1000}),
)
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
GROUP_KEY: Schema = {
    "type": "string",
    "minLength": 1,
    "maxLength": validate.MAX_KEY_BYTES,
    "pattern": "^[^\\u0000]+$",
    "description": "A semaphore group's key (a tenant, an account): with `per_key`, the name "
    "is a group whose `limit` is the total, and this asks for a slot of this key.",
}
PER_KEY: Schema = {
    "type": "integer",
    "minimum": 1,
    "maximum": validate.MAX_LIMIT,
    "description": "A semaphore group: at most this many holders per key (with `key`; "
    "`limit` is the group's total).",
}
PRIORITY: Schema = {
    "type": "integer",
    "minimum": -validate.MAX_PRIORITY,
    "maximum": validate.MAX_PRIORITY,
    "default": 0,
    "description": "Where a new place in line goes: a larger number is served first, in "
    "arrival order within a level. Asking again keeps the place it has.",
}
AGEING: Schema = {
    "type": ["number", "boolean", "null"],
    "minimum": validate.MIN_AGEING,
    "maximum": validate.MAX_AGEING,
    "default": None,
    "description": "Seconds of waiting worth one priority level, so low priorities are not "
    f"starved; `true`: {validate.DEFAULT_AGEING:g} s; null or false: strict priorities.",
}
TOKEN: Schema = {
    "type": "integer",
    "minimum": 1,
    "maximum": 2**63 - 1,
    "description": "Fencing token: strictly increasing per name.",
}
TIME: Schema = {"type": "number", "description": "Seconds since the epoch, on the store's clock."}
# A rate limit's fields (``_async/rate_limit.py`` checks the same bounds).
RATE_FIELDS: dict[str, Schema] = {
    "rate": {
        "type": "integer",
        "minimum": 1,
        "maximum": rate_limit.MAX_RATE,
        "description": "Admissions per `per` seconds (beyond the `burst`).",
    },
    "per": {
        "type": "number",
        "minimum": rate_limit.MIN_PER,
        "maximum": rate_limit.MAX_PER,
        "default": 1,
        "description": "The window of `rate`, in seconds: one admission every `per / rate` "
        "seconds once the burst is spent.",
    },
    "burst": {
        "type": "integer",
        "minimum": 1,
        "maximum": rate_limit.MAX_RATE,
        "default": 1,
        "description": "Admissions at once from idle; at most `rate + burst` in any window "
        "of `per` seconds.",
    },
}
# A try-acquire's callback (``_core/callbacks.py``'s JSON form).
_SFN_CALLBACK: Schema = {
    "type": "object",
    "required": ["kind", "task_token"],
    "additionalProperties": False,
    "properties": {
        "kind": {"const": callbacks.SFN},
        "task_token": {
            "type": "string",
            "minLength": 1,
            "maxLength": callbacks.MAX_TASK_TOKEN_CHARS,
            "pattern": "^[^\\u0000-\\u001f\\u007f]+$",
            "description": "The task token of a `.waitForTaskToken` task (a credential: "
            "never shown by the service).",
        },
    },
}
_HTTP_CALLBACK: Schema = {
    "type": "object",
    "required": ["kind", "url"],
    "additionalProperties": False,
    "properties": {
        "kind": {"const": callbacks.HTTP},
        "url": {
            "type": "string",
            "minLength": 8,
            "maxLength": callbacks.MAX_URL_CHARS,
            "pattern": "^[Hh][Tt][Tt][Pp][Ss]?://[^\\u0000-\\u0020\\u007f@]+$",
            "description": "An http:// or https:// URL with no credentials, whose host the "
            "service accepts (`--callback-hosts`; by default any public host).",
        },
    },
}


def callback_schema(http: bool) -> Schema:
    """The ``callback`` field: Step Functions always; HTTP only on a service that has a
    callback secret to sign them with (else it refuses them, and the document says so)."""
    text = (
        "Wait with no connection: the grant, now or when the turn comes, is delivered here "
        "by the service, at least once. `sfn`: `SendTaskSuccess` with the lease as output "
        "(a `.waitForTaskToken` task)"
    )
    if not http:
        return {
            **_SFN_CALLBACK,
            "description": text + ". This service has no callback secret, so it accepts no "
            "HTTP callbacks. See docs/http.md.",
        }
    return {
        "type": "object",
        "description": text + "; `http`: a POST of the lease, signed "
        f"(`{callbacks.SIGNATURE_HEADER}: sha256=<hex HMAC-SHA256 of the body>`). See "
        "docs/http.md.",
        "oneOf": [_SFN_CALLBACK, _HTTP_CALLBACK],
    }


def error_schema() -> Schema:
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


def ok(schema: Schema) -> Schema:
    return {"description": "OK", "content": {"application/json": {"schema": schema}}}


def error_responses(*codes: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for status in sorted(codes):
        meaning = "; ".join(
            f"`{code}`: {text}" for code, (st, text) in sorted(CODES.items()) if st == status
        )
        out[str(status)] = {
            "description": meaning,
            "content": {"application/json": {"schema": ref("Error")}},
        }
    return out


def obj(required: list[str], properties: dict[str, Schema]) -> Schema:
    return {
        "type": "object",
        "required": required,
        "additionalProperties": False,
        "properties": properties,
    }


def _operation(endpoint: Endpoint, method: str) -> Schema:
    operation: Schema = {
        "operationId": endpoint.op_id if method == "POST" or len(endpoint.methods) == 1
        else endpoint.op_id + "_get",
        "tags": [endpoint.tag] if isinstance(endpoint.tag, str) else list(endpoint.tag),
        "summary": endpoint.summary if method == "POST" or len(endpoint.methods) == 1
        else endpoint.summary + " (fields as query parameters)",
    }
    if endpoint.description:
        operation["description"] = endpoint.description
    if not endpoint.authenticated:
        operation["security"] = []
    if method == "GET" and endpoint.fields:
        operation["parameters"] = [
            {"name": f.name, "in": "query", "required": f.required, "schema": f.schema}
            for f in endpoint.fields
        ]
    if method == "POST":
        body = obj([f.name for f in endpoint.fields if f.required],
                   {f.name: f.schema for f in endpoint.fields})
        operation["requestBody"] = {
            "required": True,
            "content": {"application/json": {"schema": {**body, **endpoint.body_extra}}},
        }
    if endpoint.responses is not None:
        operation["responses"] = endpoint.responses
    else:
        assert endpoint.response is not None, endpoint.path
        operation["responses"] = {
            "200": ok(endpoint.response), **error_responses(*error_statuses(endpoint, method))
        }
    return operation


def document(config: ServerConfig, table: Iterable[Endpoint]) -> dict[str, Any]:
    """The OpenAPI document of the endpoints in ``table``."""
    paths: dict[str, Any] = {}
    for endpoint in table:
        paths[endpoint.path] = {
            method.lower(): _operation(endpoint, method) for method in endpoint.methods
        }
    lease = obj(
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
    ticket = obj(
        ["acquired", "position", "lease", "now", "retry_after"],
        {
            "acquired": {"type": "boolean"},
            "position": {
                "type": ["integer", "null"],
                "minimum": 0,
                "description": "Place in line (0 = next) while not acquired; null when "
                "acquired, or with `enqueue: false` when not granted.",
            },
            "lease": {"oneOf": [ref("Lease"), {"type": "null"}]},
            "now": TIME,
            "retry_after": {
                "type": ["number", "null"],
                "minimum": 0,
                "description": "Seconds until the earliest current lease expires.",
            },
        },
    )
    status = obj(
        ["name", "limit", "now", "holders", "waiters"],
        {
            "name": {"type": "string"},
            "limit": {"type": ["integer", "null"], "minimum": 1},
            "per_key": {
                "type": "integer",
                "minimum": 1,
                "description": "A semaphore group (`limit` is its total): at most this many "
                "holders per key.",
            },
            "now": TIME,
            "holders": {
                "type": "array",
                "items": obj(
                    ["holder", "token", "acquired_at", "expires_at", "age", "expires_in"],
                    {
                        "holder": {"type": "string"},
                        "token": TOKEN,
                        "acquired_at": TIME,
                        "expires_at": TIME,
                        "age": {"type": "number"},
                        "expires_in": {"type": "number"},
                        "callback": {
                            "enum": ["sfn", "http", "unknown"],
                            "description": "A callback grant: its callback's kind (never "
                            "its task token or URL).",
                        },
                        "delivery": {
                            "enum": [callbacks.PENDING, callbacks.DELIVERED],
                            "description": "A callback grant: whether a deliverer has "
                            "delivered it yet.",
                        },
                        "key": {"type": "string", "description": "A group's: its key."},
                    },
                ),
            },
            "waiters": {
                "type": "array",
                "items": obj(
                    ["holder", "position", "joined_at", "expires_at", "waiting"],
                    {
                        "holder": {"type": "string"},
                        "position": {"type": "integer", "minimum": 0},
                        "joined_at": TIME,
                        "expires_at": TIME,
                        "waiting": {"type": "number"},
                        "callback": {
                            "enum": ["sfn", "http", "unknown"],
                            "description": "A callback waiter: its callback's kind.",
                        },
                        "key": {"type": "string", "description": "A group's: its key."},
                    },
                ),
            },
        },
    )
    principal = obj(
        ["name", "prefixes", "read_only", "admin"],
        {
            "name": {"type": "string"},
            "prefixes": {"type": "array", "items": {"type": "string"}},
            "read_only": {"type": "boolean"},
            "admin": {"type": "boolean"},
        },
    )
    event = obj(
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
    info = obj(
        ["service", "version", "api", "backend", "limits", "auth", "principal"],
        {
            "service": {"const": "turnstile"},
            "version": {"type": "string"},
            "api": {"const": "v1"},
            "backend": {"type": "object"},
            "limits": {"type": "object"},
            "auth": obj(["required"], {"required": {"type": "boolean"}}),
            "principal": ref("Principal"),
        },
    )
    dashboard = obj(
        ["now", "principal", "names", "truncated", "queues", "events", "cursor", "instance"],
        {
            "now": {"type": "number"},
            "principal": ref("Principal"),
            "names": {"type": "array", "items": ref("Status")},
            "truncated": {"type": "boolean"},
            "queues": {"type": "array", "items": ref("QueueStats")},
            "events": {"type": "array", "items": ref("Event")},
            "cursor": {"type": "integer"},
            "instance": {"type": "object"},
        },
    )
    deliveries = obj(
        ["pending", "deliverer"],
        {
            "pending": {
                "type": ["integer", "null"],
                "minimum": 0,
                "description": "Grants waiting for their delivery, over the whole store "
                "(sampled at most once a second; null if the store cannot say).",
            },
            "deliverer": obj(
                ["running", "delivered", "refused", "retried", "lost", "latency_p50",
                 "latency_p99"],
                {
                    "running": {"type": "boolean", "description": "This instance runs a "
                                "deliverer (not with `--no-deliver`)."},
                    "delivered": {"type": "integer", "minimum": 0},
                    "refused": {"type": "integer", "minimum": 0},
                    "retried": {"type": "integer", "minimum": 0},
                    "lost": {"type": "integer", "minimum": 0},
                    "latency_p50": {"type": ["number", "null"]},
                    "latency_p99": {"type": ["number", "null"]},
                },
            ),
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
            {"name": "rates", "description": "Rate limits whose callers wait in line, in "
             "arrival order, each admitted at its slot."},
            {"name": "service", "description": "Health, metrics, discovery."},
        ],
        "paths": paths,
        "components": {
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
            "schemas": {
                "Error": error_schema(),
                "Lease": lease,
                "Ticket": ticket,
                "Status": status,
                "Principal": principal,
                "Event": event,
                "Info": info,
                "Dashboard": dashboard,
                "Deliveries": deliveries,
                **_queue_schemas(),
                **_rate_schemas(),
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


def queue_settings() -> dict[str, Schema]:
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


def _queue_schemas() -> dict[str, Schema]:
    payload: dict[str, Schema] = {
        "payload": {"description": "The JSON payload (null for a bytes payload)."},
        "payload_base64": {"type": ["string", "null"],
                           "description": "A bytes payload, base64; else null."},
    }
    return {
        "QueueMessage": obj(
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
        "QueueStats": obj(
            ["name", "ready", "delayed", "in_flight", "dead", "oldest_age", "deepest_keys",
             "now"],
            {
                "name": {"type": "string"},
                "ready": {"type": "integer", "minimum": 0},
                "delayed": {"type": "integer", "minimum": 0},
                "in_flight": {"type": "integer", "minimum": 0},
                "dead": {"type": "integer", "minimum": 0},
                "oldest_age": {"type": ["number", "null"]},
                "deepest_keys": {"type": "array", "items": obj(
                    ["key", "pending"],
                    {"key": {"type": "string"}, "pending": {"type": "integer", "minimum": 1}},
                )},
                "now": TIME,
            },
        ),
        "DeadLetter": obj(
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


# -- rate limits -----------------------------------------------------------------------------


def _rate_schemas() -> dict[str, Schema]:
    return {
        "RateTicket": obj(
            ["acquired", "position", "retry_after", "now"],
            {
                "acquired": {"type": "boolean", "description": "Admitted now."},
                "position": {
                    "type": ["integer", "null"],
                    "minimum": 0,
                    "description": "Place in line (0 = next) while not admitted; null when "
                    "admitted, or with `enqueue: false` when not admitted.",
                },
                "retry_after": {
                    "type": "number",
                    "minimum": 0,
                    "description": "Seconds until the caller's slot (0 when admitted): ask "
                    "again then, with the same holder.",
                },
                "now": TIME,
            },
        ),
        "RateStatus": obj(
            ["name", "rate", "per", "burst", "now", "next_slot", "admitted", "waiters"],
            {
                "name": {"type": "string"},
                "rate": {"type": ["integer", "null"], "minimum": 1},
                "per": {"type": ["number", "null"]},
                "burst": {"type": ["integer", "null"], "minimum": 1},
                "now": TIME,
                "next_slot": {**TIME, "description": "When the next in line is due."},
                "admitted": {
                    "type": "array",
                    "items": TIME,
                    "description": "Admission times of the last `per` seconds, in order.",
                },
                "waiters": {
                    "type": "array",
                    "items": obj(
                        ["holder", "position", "joined_at", "slot", "due_in"],
                        {
                            "holder": {"type": "string"},
                            "position": {"type": "integer", "minimum": 0},
                            "joined_at": TIME,
                            "slot": {**TIME, "description": "When it is due."},
                            "due_in": {"type": "number", "minimum": 0},
                        },
                    ),
                },
            },
        ),
    }
