"""Argument validation shared by every public entry point (Python API, CLI, HTTP).

Every check raises :class:`~turnstile.errors.InvalidArgument` naming the argument and the
accepted range. Names may hold any characters (``:``, ``{``, ``}``, spaces, quotes, emoji);
they are never interpolated into a script or a query, only passed as data.
"""

from __future__ import annotations

import math
from typing import Any

from ..errors import InvalidArgument

MAX_NAME_BYTES = 4096
MAX_HOLDER_BYTES = 1024
MIN_TTL = 0.05
MAX_TTL = 30 * 24 * 3600.0
MAX_TIMEOUT = 30 * 24 * 3600.0
MAX_LIMIT = 1_000_000


def _utf8_len(value: str, arg: str) -> int:
    try:
        return len(value.encode("utf-8"))
    except UnicodeEncodeError:
        raise InvalidArgument(
            f"{arg} must be valid Unicode text (lone surrogates are not)"
        ) from None


def name(value: Any, arg: str = "name") -> str:
    if not isinstance(value, str):
        raise InvalidArgument(f"{arg} must be a string, got {type(value).__name__}")
    size = _utf8_len(value, arg)
    if size == 0:
        raise InvalidArgument(f"{arg} must not be empty (1 to {MAX_NAME_BYTES} bytes of UTF-8)")
    if size > MAX_NAME_BYTES:
        raise InvalidArgument(
            f"{arg} is {size} bytes of UTF-8; the accepted range is 1 to {MAX_NAME_BYTES} bytes"
        )
    if "\x00" in value:
        raise InvalidArgument(f"{arg} must not contain NUL characters")
    return value


def prefix(value: Any, arg: str = "prefix") -> bool:
    """A name prefix for listings: any text ("" lists everything). Returns whether a name
    can start with it at all: one with NUL or over :data:`MAX_NAME_BYTES` matches nothing
    (a valid question with an empty answer, so the caller answers it without the store)."""
    if not isinstance(value, str):
        raise InvalidArgument(f"{arg} must be a string, got {type(value).__name__}")
    return _utf8_len(value, arg) <= MAX_NAME_BYTES and "\x00" not in value


def max_count(value: Any, arg: str = "max_count") -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_LIMIT:
        raise InvalidArgument(f"{arg} must be an integer from 1 to {MAX_LIMIT}, got {value!r}")
    return value


def holder(value: Any, arg: str = "holder") -> str:
    if not isinstance(value, str):
        raise InvalidArgument(f"{arg} must be a string, got {type(value).__name__}")
    size = _utf8_len(value, arg)
    if size == 0 or size > MAX_HOLDER_BYTES:
        raise InvalidArgument(
            f"{arg} must be 1 to {MAX_HOLDER_BYTES} bytes of UTF-8 (got {size} bytes)"
        )
    if "\x00" in value:
        raise InvalidArgument(f"{arg} must not contain NUL characters")
    return value


def _number(value: Any, arg: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidArgument(f"{arg} must be a number of seconds, got {type(value).__name__}")
    result = float(value)
    if math.isnan(result):
        raise InvalidArgument(f"{arg} must be a number of seconds, got NaN")
    return result


def ttl(value: Any, arg: str = "ttl") -> float:
    result = _number(value, arg)
    if not MIN_TTL <= result <= MAX_TTL:
        raise InvalidArgument(
            f"{arg} must be between {MIN_TTL} and {MAX_TTL:.0f} seconds (30 days), got {value!r}"
        )
    return result


def timeout(value: Any, arg: str = "timeout") -> float | None:
    """``None`` waits forever; otherwise 0 to 30 days (0 means: do not wait)."""
    if value is None:
        return None
    result = _number(value, arg)
    if math.isinf(result) and result > 0:
        raise InvalidArgument(f"{arg} must be finite; pass None to wait without a time limit")
    if not 0 <= result <= MAX_TIMEOUT:
        raise InvalidArgument(
            f"{arg} must be None or between 0 and {MAX_TIMEOUT:.0f} seconds (30 days), "
            f"got {value!r}"
        )
    return result


def seconds(value: Any, arg: str, *, low: float = 0.0, high: float = MAX_TIMEOUT) -> float:
    result = _number(value, arg)
    if not low <= result <= high:
        raise InvalidArgument(f"{arg} must be between {low:g} and {high:g} seconds, got {value!r}")
    return result


def limit(value: Any, arg: str = "limit") -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidArgument(f"{arg} must be an integer, got {type(value).__name__}")
    if not 1 <= value <= MAX_LIMIT:
        raise InvalidArgument(f"{arg} must be between 1 and {MAX_LIMIT}, got {value!r}")
    return value


def token(value: Any, arg: str = "token") -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidArgument(f"{arg} must be an integer or None, got {type(value).__name__}")
    if not 0 < value < 2**63:
        raise InvalidArgument(f"{arg} must be between 1 and 2**63-1, got {value!r}")
    return value
