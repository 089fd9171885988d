"""Records and limits of the keyed FIFO queue, shared by every backend and both flavours.

All times are seconds since the Unix epoch on the *store's* clock (compare them with the
``now`` field of the record that carries them, never with a client's clock).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any

from ..errors import InvalidArgument
from . import validate

# Documented limits (docs/queue.md).
MAX_PAYLOAD_BYTES = 256 * 1024  # encoded size: JSON text as UTF-8, or the raw bytes
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

KIND_JSON = 0
KIND_BYTES = 1


@dataclass(frozen=True, slots=True)
class NewMessage:
    """What a ``put`` sends to the store. ``id`` is chosen by the client."""

    id: str
    key: str | None
    body: bytes
    kind: int  # KIND_JSON or KIND_BYTES
    delay: float
    dedup_id: str | None
    max_attempts: int


@dataclass(frozen=True, slots=True)
class PutResult:
    """``id`` of the stored message; ``created`` is False when ``dedup_id`` matched a message
    put within the dedup window (the earlier message's id is returned, nothing is stored)."""

    id: str
    created: bool
    now: float


@dataclass(frozen=True, slots=True)
class Delivery:
    """A message as the store handed it out: in flight until ``deadline`` unless acked,
    nacked or extended with ``receipt``."""

    id: str
    key: str | None
    body: bytes
    kind: int
    attempt: int  # 1 on first delivery
    enqueued_at: float
    receipt: str
    deadline: float


@dataclass(frozen=True, slots=True)
class ClaimResult:
    """What one atomic claim step answered. Without a message, ``retry_after`` is how long
    until something may become deliverable without anyone saying so (a delayed message comes
    due, an in-flight message's visibility timeout passes); ``None`` if nothing is scheduled."""

    delivery: Delivery | None
    now: float
    retry_after: float | None = None


@dataclass(frozen=True, slots=True)
class KeyDepth:
    key: str
    pending: int  # messages of this key not yet acked (ready, delayed or in flight)


@dataclass(frozen=True, slots=True)
class QueueStats:
    """A snapshot of one queue.

    ``ready``: due now (some may wait behind an earlier message of their key);
    ``delayed``: not yet due (put with ``delay`` or nacked with one); ``in_flight``: handed
    out and neither acked nor timed out; ``dead``: dead letters; ``oldest_age``: seconds since
    the oldest pending (ready, delayed or in flight) message was put, ``None`` if none;
    ``deepest_keys``: the keys with the most pending messages, deepest first."""

    name: str
    ready: int
    delayed: int
    in_flight: int
    dead: int
    oldest_age: float | None
    deepest_keys: tuple[KeyDepth, ...] = field(default_factory=tuple)
    now: float = 0.0

    @property
    def pending(self) -> int:
        return self.ready + self.delayed + self.in_flight

    def to_dict(self) -> dict[str, object]:
        return {
            "name": self.name,
            "ready": self.ready,
            "delayed": self.delayed,
            "in_flight": self.in_flight,
            "dead": self.dead,
            "oldest_age": None if self.oldest_age is None else round(self.oldest_age, 6),
            "deepest_keys": [{"key": k.key, "pending": k.pending} for k in self.deepest_keys],
            "now": self.now,
        }


@dataclass(frozen=True, slots=True)
class DeadLetterRow:
    """A dead letter as stored (payload still encoded)."""

    id: str
    key: str | None
    body: bytes
    kind: int
    attempts: int
    enqueued_at: float
    died_at: float
    error: str | None


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """A message that used up its ``max_attempts``. ``error`` is the last failure recorded
    (the handler's exception, or that its visibility timeout passed)."""

    id: str
    key: str | None
    payload: Any
    attempts: int
    enqueued_at: float
    died_at: float
    error: str | None

    def to_dict(self) -> dict[str, object]:
        payload = self.payload
        if isinstance(payload, bytes):
            payload = {"bytes": payload.hex()}
        return {
            "id": self.id,
            "key": self.key,
            "payload": payload,
            "attempts": self.attempts,
            "enqueued_at": self.enqueued_at,
            "died_at": self.died_at,
            "error": self.error,
        }


# -- encoding ---------------------------------------------------------------------------------
def encode_payload(payload: Any) -> tuple[bytes, int]:
    """``bytes``-like payloads are stored as they are; anything else as compact JSON."""
    if isinstance(payload, bytes | bytearray | memoryview):
        body, kind = bytes(payload), KIND_BYTES
    else:
        try:
            text = json.dumps(payload, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
        except (TypeError, ValueError) as exc:
            raise InvalidArgument(
                f"payload must be JSON-serializable or bytes ({exc})"
            ) from None
        try:
            body = text.encode("utf-8")
        except UnicodeEncodeError:
            raise InvalidArgument(
                "payload must be valid Unicode text (lone surrogates are not)"
            ) from None
        kind = KIND_JSON
    if len(body) > MAX_PAYLOAD_BYTES:
        raise InvalidArgument(
            f"payload is {len(body)} bytes encoded; the accepted range is 0 to "
            f"{MAX_PAYLOAD_BYTES} bytes (256 KiB); store large data elsewhere and put a reference"
        )
    return body, kind


def decode_payload(body: bytes, kind: int) -> Any:
    if kind == KIND_BYTES:
        return bytes(body)
    return json.loads(bytes(body).decode("utf-8"))


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


def dedup_id(value: Any) -> str | None:
    return None if value is None else _text(value, "dedup_id", MAX_DEDUP_ID_BYTES)


def message_id(value: Any, arg: str = "id") -> str:
    return _text(value, arg, 256)


def receipt(value: Any) -> str:
    return _text(value, "receipt", 256)


def delay(value: Any, arg: str = "delay") -> float:
    result = validate.seconds(value, arg, low=0.0, high=MAX_DELAY)
    if math.isinf(result):
        raise InvalidArgument(f"{arg} must be finite")
    return result


def visibility_timeout(value: Any, arg: str = "visibility_timeout") -> float:
    return validate.seconds(value, arg, low=MIN_VISIBILITY, high=MAX_VISIBILITY)


def max_attempts(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidArgument(f"max_attempts must be an integer, got {type(value).__name__}")
    if not 1 <= value <= MAX_ATTEMPTS:
        raise InvalidArgument(f"max_attempts must be between 1 and {MAX_ATTEMPTS}, got {value!r}")
    return value


def concurrency(value: Any) -> int | None:
    if value is None:
        return None
    return validate.limit(value, "concurrency")


def dedup_window(value: Any) -> float:
    return validate.seconds(value, "dedup_window", low=MIN_DEDUP_WINDOW, high=MAX_DEDUP_WINDOW)


def count(value: Any, arg: str, high: int = MAX_LIST) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidArgument(f"{arg} must be an integer, got {type(value).__name__}")
    if not 1 <= value <= high:
        raise InvalidArgument(f"{arg} must be between 1 and {high}, got {value!r}")
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


@dataclass(slots=True)
class WorkResult:
    """What :meth:`Queue.work` did: messages handled successfully and acked, handlers that
    raised (the message was nacked with a backoff, or dead-lettered after ``max_attempts``),
    and settlements the store refused because the message's visibility timeout had passed
    (it will be delivered again)."""

    acked: int = 0
    failed: int = 0
    lost: int = 0
    stopped_by: str | None = None  # "signal", "stop()", "idle_timeout", "max_messages"

    @property
    def handled(self) -> int:
        return self.acked + self.failed + self.lost
