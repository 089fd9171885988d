"""The endpoint table: each endpoint is described once, as an :class:`Endpoint`, and that one
description drives its route (``app.py``), the fields its requests may carry and their JSON
types (:func:`parse`, here), and its part of the OpenAPI document (``openapi.py``).

The table checks only the shape of a request: JSON types, required fields, unknown fields.
Ranges and formats (a ttl's bounds, a name's bytes) are the primitives' to check: the client
API raises :class:`~turnstile.InvalidArgument` with the same message a Python caller gets,
answered as ``invalid_argument`` (422). The schemas' ``minimum``/``maximum`` are documentation
for clients (and schemathesis) of those same limits, read from ``_core.validate``. The only
ranges checked here are the service's own (the longest long poll) and the integer query
parameters, which are parsed from text against their documented bounds.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote_to_bytes

from starlette.requests import Request

from .._core import validate
from .._core.payload import nesting
from ..errors import InvalidArgument
from .errors import ApiError

if TYPE_CHECKING:
    from .bounds import BodyBudget
    from .common import Ctx

Schema = dict[str, Any]
Handler = Callable[["Ctx"], Awaitable[Any]]


@dataclass(frozen=True)
class Field:
    """A body field (POST) or query parameter (GET): its JSON schema (type, limits and
    description, as documented) and whether it must be given (``null`` counts as absent)."""

    name: str
    schema: Schema
    required: bool = False


@dataclass(frozen=True)
class Endpoint:
    """One endpoint: where it is served, what it takes, what it answers.

    ``fields`` travel in the JSON body of a POST and as query parameters of a GET.
    ``response`` is the 200 body's schema; ``errors`` the error statuses it may answer beyond
    the ones every request of its method may (see :func:`error_statuses`); ``responses``
    replaces all of that for the few endpoints whose answers are not the usual JSON."""

    path: str
    handler: Handler
    op_id: str
    tag: str | tuple[str, ...]
    summary: str
    description: str = ""
    methods: tuple[str, ...] = ("POST",)
    fields: tuple[Field, ...] = ()
    response: Schema | None = None
    errors: tuple[int, ...] = ()
    body_extra: Schema = field(default_factory=dict)
    responses: dict[str, Any] | None = None
    authenticated: bool = True
    reads_names: bool = True  # GET: may answer 403 and 422 (it takes a name or a listing)

    @property
    def query(self) -> frozenset[str]:
        """The query parameters accepted (the fields, when the endpoint serves GET)."""
        return frozenset(f.name for f in self.fields) if "GET" in self.methods else frozenset()


AUTH_ERRORS = (401, 403)
BODY_ERRORS = (400, 408, 413, 415, 422)
STORE_ERRORS = (503,)


def error_statuses(endpoint: Endpoint, method: str) -> tuple[int, ...]:
    """The error statuses ``method`` on ``endpoint`` may answer."""
    if method == "POST":
        base: tuple[int, ...] = (*AUTH_ERRORS, *BODY_ERRORS, *STORE_ERRORS)
    elif endpoint.reads_names:
        base = (*AUTH_ERRORS, 422, *STORE_ERRORS)
    else:
        base = (401, *STORE_ERRORS)
    return tuple(sorted(set(base) | set(endpoint.errors)))


class Args:
    """The parsed fields of one request: present, non-null values of the declared types
    (integral numbers as ``int``). ``raw`` is the body as sent, for the one field whose
    ``null`` is a value (a queue message's ``payload``)."""

    def __init__(self, values: Mapping[str, Any], raw: Mapping[str, Any]) -> None:
        self.values = values
        self.raw = raw

    def __getitem__(self, key: str) -> Any:
        return self.values[key]

    def get(self, key: str, default: Any = None) -> Any:
        return self.values.get(key, default)


def query_pairs(request: Request) -> list[tuple[str, str]]:
    """The query string's parameters, decoded strictly: percent-escapes that are not UTF-8
    are refused (``invalid_argument``) rather than read as U+FFFD, which would make a name
    other than the one sent."""
    raw: bytes = request.scope.get("query_string", b"")
    pairs = []
    for part in raw.split(b"&"):
        if not part:
            continue
        key, _, value = part.partition(b"=")
        try:
            pairs.append((_unquote(key), _unquote(value)))
        except UnicodeDecodeError:
            shown = unquote_to_bytes(key.replace(b"+", b" ")).decode("utf-8", "replace")
            raise InvalidArgument(
                f"query parameter {shown!r} is not valid UTF-8 once percent-decoded"
            ) from None
    return pairs


def _unquote(text: bytes) -> str:
    return unquote_to_bytes(text.replace(b"+", b" ")).decode("utf-8")


async def parse(
    request: Request,
    endpoint: Endpoint,
    max_body: int,
    *,
    body_timeout: float | None = None,
    budget: BodyBudget | None = None,
) -> Args:
    """The request's fields, checked against the table (types, required, unknown)."""
    pairs = query_pairs(request)
    unknown = sorted({k for k, _ in pairs} - endpoint.query)
    if unknown:
        accepted = sorted(endpoint.query)
        raise InvalidArgument(
            f"unknown query parameter(s) {', '.join(map(repr, unknown))}"
            + (f"; accepted: {', '.join(accepted)}" if accepted else "")
        )
    if request.method == "GET":
        return Args(_query(dict(pairs), endpoint), {})
    data = await read_json(request, max_body, body_timeout=body_timeout, budget=budget)
    names = {f.name for f in endpoint.fields}
    unknown = sorted(set(data) - names)
    if unknown:
        raise InvalidArgument(
            f"unknown field(s) {', '.join(map(repr, unknown))}; "
            f"accepted: {', '.join(sorted(names))}"
        )
    values: dict[str, Any] = {}
    for spec in endpoint.fields:
        value = data.get(spec.name)
        if value is None:
            if spec.name in data and not _nullable(spec.schema):
                # ``null`` stands for "absent" only where the document says the field may
                # be null; elsewhere it is a value of the wrong type.
                _typed(spec, value)
            if spec.required:
                raise InvalidArgument(f"{spec.name} is required")
            continue
        values[spec.name] = _typed(spec, value)
    return Args(values, data)


def _nullable(schema: Schema) -> bool:
    return "type" not in schema or "null" in _types(schema)


def _types(schema: Schema) -> set[str]:
    declared = schema.get("type")
    if declared is None:
        return set()
    return {declared} if isinstance(declared, str) else set(declared)


def _typed(spec: Field, value: Any) -> Any:
    types = _types(spec.schema) - {"null"}
    if not types:
        return value  # any JSON value
    if "integer" in types and isinstance(value, float) and value.is_integer() and abs(
        value
    ) < 2**63:
        return int(value)  # JSON has numbers, not ints and floats: 5.0 is 5 (as in JSON Schema)
    checks = {
        "string": lambda v: isinstance(v, str),
        "number": lambda v: isinstance(v, int | float) and not isinstance(v, bool),
        "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
        "boolean": lambda v: isinstance(v, bool),
        "array": lambda v: isinstance(v, list),
        "object": lambda v: isinstance(v, dict),
    }
    if any(checks[t](value) for t in types):
        return value
    if types == {"boolean"}:
        raise InvalidArgument(f"{spec.name} must be true or false, got {json_type(value)}")
    wanted = " or ".join(
        {"string": "a string", "number": "a number", "integer": "an integer",
         "boolean": "true or false", "array": "an array", "object": "an object"}[t]
        for t in sorted(types)
    )
    low, high = spec.schema.get("minimum"), spec.schema.get("maximum")
    bounds = "" if low is None or high is None else f" from {_show(low)} to {_show(high)}"
    raise InvalidArgument(f"{spec.name} must be {wanted}{bounds}, got {json_type(value)}")


def _show(bound: float) -> str:
    if isinstance(bound, float) and not bound.is_integer():
        return f"{bound:g}"
    return str(int(bound))


def _query(query: Mapping[str, str], endpoint: Endpoint) -> dict[str, Any]:
    values: dict[str, Any] = {}
    for spec in endpoint.fields:
        raw = query.get(spec.name)
        if raw is None:
            if spec.required:
                raise InvalidArgument(f"{spec.name} is required (a query parameter)")
            continue
        if "integer" in _types(spec.schema):
            low, high = spec.schema["minimum"], spec.schema["maximum"]
            try:
                number = int(raw)
            except ValueError:
                raise InvalidArgument(
                    f"{spec.name} must be an integer from {low} to {high}"
                ) from None
            if not low <= number <= high:
                raise InvalidArgument(
                    f"{spec.name} must be an integer from {low} to {high}, "
                    f"got {validate.shown(number)}"
                )
            values[spec.name] = number
        else:
            values[spec.name] = raw
    return values


_TOO_DEEP = (
    f"the body nests arrays and objects too deeply: a field's value may nest at most "
    f"{validate.MAX_PAYLOAD_DEPTH} levels"
)


def _reject_constant(value: str) -> Any:
    raise ValueError(f"{value} is not valid JSON")


async def read_json(
    request: Request,
    max_body: int,
    *,
    body_timeout: float | None = None,
    budget: BodyBudget | None = None,
) -> dict[str, Any]:
    """The body as a JSON object, read up to ``max_body`` bytes, within ``body_timeout``
    seconds, its bytes counted in the instance's ``budget`` while it is read."""
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
    try:
        async with asyncio.timeout(body_timeout):
            async for chunk in request.stream():
                if budget is not None:
                    budget.take(len(chunk))
                size += len(chunk)
                if size > max_body:
                    raise ApiError(
                        "payload_too_large", f"the body may be at most {max_body} bytes"
                    )
                chunks.append(chunk)
    except TimeoutError:
        raise ApiError(
            "request_timeout",
            f"the body did not arrive within {body_timeout:g} s; send it at once",
            {"Connection": "close"},
        ) from None
    finally:
        if budget is not None:
            budget.give(size)
    body = b"".join(chunks)
    del chunks
    try:
        data = json.loads(body, parse_constant=_reject_constant)
    except RecursionError:
        raise InvalidArgument(_TOO_DEEP) from None
    except ValueError as exc:
        message = str(exc) if isinstance(exc, json.JSONDecodeError) else "not valid JSON"
        raise ApiError("bad_json", f"the body is not valid JSON: {message}") from None
    if nesting(data) > validate.MAX_PAYLOAD_DEPTH + 1:  # the body object, then its fields
        raise InvalidArgument(_TOO_DEEP)
    if not isinstance(data, dict):
        raise InvalidArgument(f"the body must be a JSON object, got {json_type(data)}")
    return data


def json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, dict):
        return "an object"
    return "an array"
