"""Absurd arguments to the Python API are InvalidArgument, never a raw OverflowError or
RecursionError (issue 17, point 11), on both flavours' shared validation."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

import turnstile
from turnstile import InvalidArgument
from turnstile._core import validate
from turnstile._core.payload import encode_payload, nesting

HUGE = 10**400
ENORMOUS = 10**5000  # beyond what str() of an int may print (4300 digits)


@pytest.fixture
def client() -> Iterator[turnstile.Client]:
    c = turnstile.connect("memory://")
    yield c
    c.close()


def _nested(depth: int) -> Any:
    value: Any = "x"
    for _ in range(depth):
        value = [value] if depth % 2 else {"k": value}
    return value


def test_integers_beyond_any_float_are_invalid_arguments(client: turnstile.Client) -> None:
    lock = client.lock("n", ttl=5)
    queue = client.queue("q")
    calls: list[tuple[str, Callable[[Any], object]]] = [
        ("ttl", lambda v: client.lock("n", ttl=v)),
        ("ttl", lambda v: client.semaphore("n", 2, ttl=v)),
        ("limit", lambda v: client.semaphore("n", v)),
        ("wait_ttl", lambda v: lock.try_acquire("h", wait_ttl=v)),
        ("timeout", lambda v: lock.acquire(timeout=v)),
        ("ttl", lambda v: lock.renew("h", 1, v)),
        ("token", lambda v: lock.release("h", v)),
        ("visibility_timeout", lambda v: client.queue("q", visibility_timeout=v)),
        ("delay", lambda v: queue.put(1, delay=v)),
        ("dedup_window", lambda v: client.queue("q", dedup_window=v)),
        ("max_attempts", lambda v: client.queue("q", max_attempts=v)),
        ("timeout", lambda v: queue.get(timeout=v)),
        ("top_keys", lambda v: queue.stats(top_keys=v)),
        ("max_count", lambda v: client.names(max_count=v)),
    ]
    for arg, call in calls:
        for value in (HUGE, -HUGE, ENORMOUS):
            with pytest.raises(InvalidArgument) as caught:
                call(value)
            message = str(caught.value)
            assert arg in message, (arg, message)
            assert len(message) < 300, message  # described, not printed
    assert validate.shown(HUGE) == "an integer of about 401 digits"
    assert validate.shown(7) == "7"


def test_payload_nesting_is_bounded(client: turnstile.Client) -> None:
    queue = client.queue("deep")
    for depth in (validate.MAX_PAYLOAD_DEPTH + 1, 3000, 100_000):
        with pytest.raises(InvalidArgument, match="levels deep"):
            queue.put(_nested(depth))
    assert nesting(_nested(validate.MAX_PAYLOAD_DEPTH)) == validate.MAX_PAYLOAD_DEPTH
    queue.put(_nested(validate.MAX_PAYLOAD_DEPTH))
    message = queue.get(timeout=0)
    assert message is not None and message.payload == _nested(validate.MAX_PAYLOAD_DEPTH)
    # A cycle is refused as too deep too, not a RecursionError or a hang.
    cyclic: list[Any] = []
    cyclic.append(cyclic)
    with pytest.raises(InvalidArgument):
        encode_payload(cyclic)
