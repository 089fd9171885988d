"""The queue payload codec: bytes as they are, anything else as compact JSON."""

from __future__ import annotations

import json
from typing import Any

from ..errors import InvalidArgument
from .records import KIND_BYTES, KIND_JSON
from .validate import MAX_PAYLOAD_BYTES, MAX_PAYLOAD_DEPTH


def nesting(value: Any, limit: int = MAX_PAYLOAD_DEPTH) -> int:
    """How deeply ``value``'s lists, tuples and dicts nest (a scalar is 0), found without
    recursion; counting stops past ``limit``, so a cyclic or absurdly deep value costs little."""
    deepest = 0
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            children: Any = item.values()
        elif isinstance(item, list | tuple):
            children = item
        else:
            continue
        depth += 1
        deepest = max(deepest, depth)
        if deepest > limit:
            break
        stack.extend((child, depth) for child in children)
    return deepest


def check_depth(value: Any, arg: str = "payload") -> None:
    if nesting(value) > MAX_PAYLOAD_DEPTH:
        raise InvalidArgument(
            f"{arg} nests arrays and objects more than {MAX_PAYLOAD_DEPTH} levels deep "
            f"(the accepted range is 0 to {MAX_PAYLOAD_DEPTH})"
        )


def encode_payload(payload: Any) -> tuple[bytes, int]:
    """``bytes``-like payloads are stored as they are; anything else as compact JSON."""
    if isinstance(payload, bytes | bytearray | memoryview):
        body, kind = bytes(payload), KIND_BYTES
    else:
        check_depth(payload)
        try:
            text = json.dumps(payload, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
        except (TypeError, ValueError, RecursionError) as exc:
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
