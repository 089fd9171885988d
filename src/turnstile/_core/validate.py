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

# Priorities (docs/admission.md): -MAX_PRIORITY..MAX_PRIORITY, larger first; ageing in
# seconds per level (True: DEFAULT_AGEING).
MAX_PRIORITY = 1000
DEFAULT_AGEING = 10.0
MIN_AGEING = 0.01
MAX_AGEING = 30 * 24 * 3600.0

# Queues (docs/queue.md).
MAX_PAYLOAD_BYTES = 256 * 1024  # encoded size: JSON text as UTF-8, or the raw bytes
MAX_PAYLOAD_DEPTH = 128  # nesting of JSON arrays and objects (as serde_json's default)
MAX_KEY_BYTES = 1024
MAX_DEDUP_ID_BYTES = 1024
MAX_ATTEMPTS = 1000
MAX_DELAY = 30 * 24 * 3600.0  # put(delay=) and nack(delay=)
MIN_VISIBILITY = 0.05
MAX_VISIBILITY = 12 * 3600.0  # like SQS: a handler that needs longer extends its message
DEFAULT_DEDUP_WINDOW = 300.0
MIN_DEDUP_WINDOW = 1.0
MAX_DEDUP_WINDOW = 7 * 24 * 3600.0
MAX_ERROR_CHARS = 2000
MAX_LIST = 10_000  # dead_letters(limit=), stats(top_keys=) upper bound


def shown(value: Any) -> str:
    """``repr(value)`` for an error message, short: an integer of hundreds of digits is
    described, not printed (and one of thousands cannot be printed at all)."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 64:
        digits = int(value.bit_length() * 0.30103) + 1
        return f"an integer of about {digits} digits"
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


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
        raise InvalidArgument(f"{arg} must be an integer from 1 to {MAX_LIMIT}, got {shown(value)}")
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
    try:
        result = float(value)
    except OverflowError:  # an int beyond any float: as far out of range as infinity
        result = math.inf if value > 0 else -math.inf
    if math.isnan(result):
        raise InvalidArgument(f"{arg} must be a number of seconds, got NaN")
    return result


def ttl(value: Any, arg: str = "ttl") -> float:
    result = _number(value, arg)
    if not MIN_TTL <= result <= MAX_TTL:
        raise InvalidArgument(
            f"{arg} must be between {MIN_TTL} and {MAX_TTL:.0f} seconds (30 days), "
            f"got {shown(value)}"
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
            f"got {shown(value)}"
        )
    return result


def seconds_text(value: float) -> str:
    """A bound in seconds as people read it: ``0.05 seconds``, ``43200 seconds (12 hours)``,
    ``2592000 seconds (30 days)``; never ``2.592e+06``."""
    text = f"{value:.0f}" if value == int(value) else repr(value)
    for unit, size in (("day", 86400), ("hour", 3600), ("minute", 60)):
        if value >= size and value % size == 0:
            count = int(value // size)
            return f"{text} seconds ({count} {unit}{'s' if count != 1 else ''})"
    return f"{text} seconds"


def seconds(value: Any, arg: str, *, low: float = 0.0, high: float = MAX_TIMEOUT) -> float:
    result = _number(value, arg)
    if not low <= result <= high:
        low_text = f"{low:.0f}" if low == int(low) else repr(low)
        raise InvalidArgument(
            f"{arg} must be between {low_text} and {seconds_text(high)}, got {shown(value)}"
        )
    return result


def limit(value: Any, arg: str = "limit") -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidArgument(f"{arg} must be an integer, got {type(value).__name__}")
    if not 1 <= value <= MAX_LIMIT:
        raise InvalidArgument(f"{arg} must be between 1 and {MAX_LIMIT}, got {shown(value)}")
    return value


def priority(value: Any, arg: str = "priority") -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidArgument(f"{arg} must be an integer, got {type(value).__name__}")
    if not -MAX_PRIORITY <= value <= MAX_PRIORITY:
        raise InvalidArgument(
            f"{arg} must be between {-MAX_PRIORITY} and {MAX_PRIORITY} (larger is served "
            f"first), got {shown(value)}"
        )
    return value


def ageing(value: Any, arg: str = "ageing") -> float | None:
    """``None``/``False``: strict priorities; ``True``: one level per
    :data:`DEFAULT_AGEING` seconds waited; a number: that many seconds per level."""
    if value is None or value is False:
        return None
    if value is True:
        return DEFAULT_AGEING
    if not isinstance(value, int | float):
        raise InvalidArgument(
            f"{arg} must be None, True or a number of seconds per priority level, "
            f"got {type(value).__name__}"
        )
    return seconds(value, arg, low=MIN_AGEING, high=MAX_AGEING)


def token(value: Any, arg: str = "token") -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidArgument(f"{arg} must be an integer or None, got {type(value).__name__}")
    if not 0 < value < 2**63:
        raise InvalidArgument(f"{arg} must be between 1 and 2**63-1, got {shown(value)}")
    return value


# -- validation -------------------------------------------------------------------------------
def _text(value: Any, arg: str, max_bytes: int) -> str:
    if not isinstance(value, str):
        hint = f" (convert it, e.g. {arg}=str(...))" if isinstance(value, int | float) else ""
        raise InvalidArgument(f"{arg} must be a string, got {type(value).__name__}{hint}")
    try:
        size = len(value.encode("utf-8"))
    except UnicodeEncodeError:
        raise InvalidArgument(
            f"{arg} must be valid Unicode text (lone surrogates are not)"
        ) from None
    if not 1 <= size <= max_bytes:
        raise InvalidArgument(
            f"{arg} must be 1 to {max_bytes} bytes of UTF-8 (got {size} bytes)"
        )
    if "\x00" in value:
        raise InvalidArgument(f"{arg} must not contain NUL characters")
    return value


def key(value: Any) -> str | None:
    return None if value is None else _text(value, "key", MAX_KEY_BYTES)


def group_key(value: Any, arg: str = "key") -> str:
    """A semaphore group's key: 1 to :data:`MAX_KEY_BYTES` bytes of UTF-8, no NUL."""
    return _text(value, arg, MAX_KEY_BYTES)


def group_limits(per_key: Any, total: Any) -> tuple[int, int]:
    """A semaphore group's limits (a ``per_key`` above ``total`` is allowed: the total
    bounds every key anyway)."""
    return limit(per_key, "per_key"), limit(total, "total")


def dedup_id(value: Any) -> str | None:
    return None if value is None else _text(value, "dedup_id", MAX_DEDUP_ID_BYTES)


def message_id(value: Any, arg: str = "id") -> str:
    return _text(value, arg, 256)


def receipt(value: Any, arg: str = "receipt") -> str:
    return _text(value, arg, 256)


def delay(value: Any, arg: str = "delay") -> float:
    result = seconds(value, arg, low=0.0, high=MAX_DELAY)
    if math.isinf(result):
        raise InvalidArgument(f"{arg} must be finite")
    return result


def visibility_timeout(value: Any, arg: str = "visibility_timeout") -> float:
    return seconds(value, arg, low=MIN_VISIBILITY, high=MAX_VISIBILITY)


def max_attempts(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidArgument(f"max_attempts must be an integer, got {type(value).__name__}")
    if not 1 <= value <= MAX_ATTEMPTS:
        raise InvalidArgument(
            f"max_attempts must be between 1 and {MAX_ATTEMPTS}, got {shown(value)}"
        )
    return value


def concurrency(value: Any) -> int | None:
    if value is None:
        return None
    return limit(value, "concurrency")


def dedup_window(value: Any, arg: str = "dedup_window") -> float:
    return seconds(value, arg, low=MIN_DEDUP_WINDOW, high=MAX_DEDUP_WINDOW)


def count(value: Any, arg: str, high: int = MAX_LIST) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidArgument(f"{arg} must be an integer, got {type(value).__name__}")
    if not 1 <= value <= high:
        raise InvalidArgument(f"{arg} must be between 1 and {high}, got {shown(value)}")
    return value


def ids(value: Any, arg: str = "ids") -> list[str] | None:
    if value is None:
        return None
    if isinstance(value, str | bytes):
        raise InvalidArgument(f"{arg} must be a list of message ids or None, not a single string")
    try:
        items = list(value)
    except TypeError:
        raise InvalidArgument(f"{arg} must be a list of message ids or None") from None
    if len(items) > MAX_LIST:
        raise InvalidArgument(f"{arg} may name at most {MAX_LIST} messages, got {len(items)}")
    return [message_id(item, arg) for item in items]


def error_text(value: Any) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str):
        raise InvalidArgument(f"error must be a string or None, got {type(value).__name__}")
    text = value.encode("utf-8", "replace").decode("utf-8").replace("\x00", "?")
    return text[:MAX_ERROR_CHARS]
