"""Callbacks: how a waiter with no connection is told of its grant.

A callback waiter (a Step Functions execution waiting on a task token, any service that
takes an HTTP POST) joins a line like any other waiter, but its grant is *delivered*: the
store writes a pending delivery in the same atomic step as the grant, and a deliverer
(:mod:`turnstile.deliver`) sends it at least once. This module is the part every layer shares:
the callback values, their stored text, the lease document a delivery carries and the HMAC
signature of HTTP deliveries.

The stored text is JSON, ``{"kind": "sfn", "task_token": …}`` or
``{"kind": "http", "url": …}``. A task token is a credential (whoever has it can resume the
execution), so it is never part of a repr, a log line or a status: those show the kind only.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from ..errors import InvalidArgument

SFN = "sfn"
HTTP = "http"
KINDS = (SFN, HTTP)
# Step Functions task tokens are at most 1,024 characters (SendTaskSuccess's taskToken).
MAX_TASK_TOKEN_CHARS = 1024
MAX_URL_CHARS = 2048
SIGNATURE_HEADER = "X-Turnstile-Signature"
SIGNATURE_PREFIX = "sha256="
# How long a callback waiter keeps its place without asking again, by default.
DEFAULT_WAIT = 24 * 3600.0
PENDING = "pending"
DELIVERED = "delivered"


@dataclass(frozen=True, slots=True)
class StepFunctionsCallback:
    """Deliver the grant with ``SendTaskSuccess(taskToken=task_token, output=lease)``: the
    execution waiting on a ``.waitForTaskToken`` task resumes with the lease as its output."""

    task_token: str

    def __repr__(self) -> str:
        return f"StepFunctionsCallback(task_token=<{len(self.task_token)} characters>)"


@dataclass(frozen=True, slots=True)
class HttpCallback:
    """Deliver the grant as ``POST url`` with the lease as its JSON body, signed with
    HMAC-SHA256 over the body (header ``X-Turnstile-Signature: sha256=<hex>``) with the
    deliverer's shared secret. Any 2xx is delivered; 4xx other than 408 and 429 is a refusal
    (the grant is released and the next in line served); anything else is retried."""

    url: str

    def __repr__(self) -> str:
        parts = urlsplit(self.url)
        return f"HttpCallback(url='{parts.scheme}://{parts.hostname or ''}/…')"


Callback = StepFunctionsCallback | HttpCallback


def _text(value: Any, arg: str, max_chars: int) -> str:
    if not isinstance(value, str) or not value:
        raise InvalidArgument(f"{arg} must be a non-empty string")
    if len(value) > max_chars:
        raise InvalidArgument(f"{arg} must be at most {max_chars} characters, got {len(value)}")
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in value):
        raise InvalidArgument(f"{arg} must not contain control characters")
    return value


def check_url(value: Any, arg: str = "callback.url") -> str:
    url = _text(value, arg, MAX_URL_CHARS)
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises ValueError on a bad port
    except ValueError:
        raise InvalidArgument(f"{arg} is not a valid URL") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise InvalidArgument(f"{arg} must be an http:// or https:// URL with a host")
    if parts.username or parts.password:
        raise InvalidArgument(f"{arg} must not carry credentials (the body is signed instead)")
    return url


def check(value: Any, arg: str = "callback") -> Callback:
    """A callback argument of the Python API, checked."""
    if isinstance(value, StepFunctionsCallback):
        _text(value.task_token, f"{arg}.task_token", MAX_TASK_TOKEN_CHARS)
        return value
    if isinstance(value, HttpCallback):
        check_url(value.url, f"{arg}.url")
        return value
    raise InvalidArgument(
        f"{arg} must be turnstile.StepFunctionsCallback(task_token) or turnstile.HttpCallback(url)"
    )


def from_fields(fields: Any, arg: str = "callback") -> Callback:
    """A callback from its JSON form (HTTP API, CLI, bridge messages):
    ``{"kind": "sfn", "task_token": …}`` or ``{"kind": "http", "url": …}``."""
    if not isinstance(fields, dict):
        raise InvalidArgument(f"{arg} must be an object with 'kind' ('sfn' or 'http')")
    kind = fields.get("kind")
    allowed = {SFN: {"kind", "task_token"}, HTTP: {"kind", "url"}}
    if not isinstance(kind, str) or kind not in allowed:  # {} is no kind (and unhashable)
        raise InvalidArgument(f"{arg}.kind must be 'sfn' or 'http'")
    extra = sorted(set(fields) - allowed[kind])
    if extra:
        raise InvalidArgument(f"{arg} has unknown field(s): {', '.join(map(repr, extra))}")
    if kind == SFN:
        return check(StepFunctionsCallback(fields.get("task_token")), arg)  # type: ignore[arg-type]
    return check(HttpCallback(fields.get("url")), arg)  # type: ignore[arg-type]


def encode(callback: Callback) -> str:
    """The text a store keeps with the waiter and its grant."""
    if isinstance(callback, StepFunctionsCallback):
        fields = {"kind": SFN, "task_token": callback.task_token}
    else:
        fields = {"kind": HTTP, "url": callback.url}
    return json.dumps(fields, separators=(",", ":"), sort_keys=True)


def decode(text: str) -> Callback:
    try:
        fields = json.loads(text)
    except ValueError:
        raise InvalidArgument("stored callback is not JSON") from None
    return from_fields(fields)


def callback_kind(text: str | None) -> str | None:
    """``"sfn"``/``"http"`` of a stored callback, ``None`` for none (what status shows)."""
    if not text:
        return None
    try:
        kind = json.loads(text).get("kind")
    except (ValueError, AttributeError):
        return "unknown"
    return kind if kind in KINDS else "unknown"


def delivery_state(text: str | None, pending: bool) -> str | None:
    if not text:
        return None
    return PENDING if pending else DELIVERED


def lease_document(
    name: str, holder: str, token: int, expires_at: float, limit: int
) -> dict[str, object]:
    """What a delivery carries: the lease, as the execution or service will release it."""
    return {
        "name": name,
        "holder": holder,
        "token": token,
        "expires_at": expires_at,
        "limit": limit,
    }


def sign(secret: bytes, body: bytes) -> str:
    """The ``X-Turnstile-Signature`` header value of ``body``: ``sha256=<hex HMAC>``."""
    return SIGNATURE_PREFIX + hmac.new(secret, body, hashlib.sha256).hexdigest()


def verify(secret: bytes, body: bytes, header: str | None) -> bool:
    """Whether ``header`` (the request's ``X-Turnstile-Signature``) signs ``body`` with
    ``secret``; compares in constant time. Receivers call this before trusting a grant."""
    if not header or not header.startswith(SIGNATURE_PREFIX):
        return False
    return hmac.compare_digest(sign(secret, body), header)
