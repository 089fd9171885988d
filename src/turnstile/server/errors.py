"""One error body for every failure: ``{"error": {"code": "...", "message": "..."}}``.

``code`` is machine-readable and stable; ``message`` is for people and never holds a
traceback or a password.
"""

from __future__ import annotations

import errno
import logging

from starlette.responses import JSONResponse

from ..errors import (
    AccessDenied,
    AcquireTimeout,
    BackendUnavailable,
    ConfigurationError,
    InvalidArgument,
    LeaseLost,
    LimitConflict,
    NotSupported,
    TurnstileError,
)

log = logging.getLogger("turnstile.server")

# code -> (HTTP status, meaning). The OpenAPI document and docs/http.md list the same table.
CODES: dict[str, tuple[int, str]] = {
    "bad_json": (400, "the body is not valid JSON"),
    "unauthorized": (401, "no bearer token, or a token the service does not know"),
    "forbidden": (403, "the token may not use this name (outside its prefixes)"),
    "read_only": (403, "the token is read-only and the request writes"),
    "admin_required": (403, "the request is an admin action and the token is not admin"),
    "not_found": (404, "no such endpoint"),
    "method_not_allowed": (405, "the endpoint does not accept this method"),
    "request_timeout": (408, "the body did not arrive within the service's body timeout"),
    "acquire_timeout": (409, "not granted within `wait` seconds; the caller left the line"),
    "lease_lost": (409, "the lease expired or was taken over; it is no longer held"),
    "limit_conflict": (409, "the name is in use under another limit (change it: /limit) "
                       "or, for a rate limit, another rate"),
    "payload_too_large": (413, "the body exceeds the service's limit"),
    "unsupported_media_type": (415, "POST bodies must be sent as application/json"),
    "invalid_argument": (422, "an argument is missing, unknown or outside its accepted range"),
    "internal": (500, "an unexpected error; details are in the service's log"),
    "not_supported": (501, "the store behind the service cannot do this"),
    "backend_unavailable": (503, "the store cannot be reached; retry later"),
    "shutting_down": (503, "this instance is stopping; retry (on another instance)"),
    "overloaded": (503, "this instance is out of connections, descriptors or body memory; "
                   "nothing was done; retry after `Retry-After`"),
}

# Out of descriptors or memory for a socket or a file: the instance is overloaded, not broken.
_EXHAUSTED = {errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM}


class ApiError(Exception):
    def __init__(self, code: str, message: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.status = CODES[code][0]
        self.message = message
        self.headers = headers or {}


def error_response(code: str, message: str, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse(
        {"error": {"code": code, "message": message}},
        status_code=CODES[code][0],
        headers=headers,
    )


def from_exception(exc: BaseException) -> ApiError:
    """Map a Turnstile error to its API error."""
    if isinstance(exc, ApiError):
        return exc
    if isinstance(exc, LimitConflict):  # an InvalidArgument about the store's state
        return ApiError("limit_conflict", str(exc))
    if isinstance(exc, InvalidArgument):
        return ApiError("invalid_argument", str(exc))
    if isinstance(exc, AcquireTimeout):
        return ApiError("acquire_timeout", str(exc))
    if isinstance(exc, LeaseLost):
        return ApiError("lease_lost", str(exc))
    if isinstance(exc, AccessDenied):
        return ApiError("forbidden", str(exc))
    if isinstance(exc, BackendUnavailable):
        return ApiError("backend_unavailable", str(exc), {"Retry-After": "1"})
    if isinstance(exc, NotSupported):
        return ApiError("not_supported", str(exc))
    if isinstance(exc, OSError) and exc.errno in _EXHAUSTED:
        log.error("overloaded while serving a request: %s", exc)
        return ApiError(
            "overloaded", f"this instance is overloaded ({exc.strerror}); retry later",
            {"Retry-After": "1"},
        )
    if isinstance(exc, ConfigurationError | TurnstileError):
        log.error("turnstile error while serving a request: %s", exc)
        return ApiError("internal", "the service failed; see its log")
    log.error("unexpected error while serving a request", exc_info=exc)
    return ApiError("internal", "the service failed; see its log")
