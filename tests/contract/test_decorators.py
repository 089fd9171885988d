"""``client.sequential`` and ``client.limited``: sync client + plain functions, async client +
coroutine functions; the wrong kind is refused."""

from __future__ import annotations

import asyncio
import itertools
import threading
import time
from typing import Any

import pytest

import turnstile
import turnstile.aio

from .lock_harness import check_exclusive, max_concurrency


def _record(log: list[dict[str, Any]], guard: threading.Lock, key: str, hold: float) -> None:
    start = time.monotonic()
    time.sleep(hold)
    with guard:
        log.append({"key": key, "start": start, "end": time.monotonic(), "token": len(log)})


def test_sequential_sync(client: turnstile.Client) -> None:
    log: list[dict[str, Any]] = []
    guard = threading.Lock()

    @client.sequential(key=lambda event: event["order"], ttl=2.0, timeout=30, prefix="dec:order:")
    def handle(event: dict[str, str]) -> str:
        _record(log, guard, event["order"], 0.5)  # long enough for A and B to overlap
        return event["order"] + "!"

    assert handle.__name__ == "handle"
    barrier = threading.Barrier(4)
    results: list[str] = []

    def call(order: str) -> None:
        barrier.wait(10)
        results.append(handle({"order": order}))

    threads = [threading.Thread(target=call, args=(o,)) for o in ("A", "A", "B", "B")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert sorted(results) == ["A!", "A!", "B!", "B!"]
    for key in ("A", "B"):  # one at a time per key
        mine = sorted((iv for iv in log if iv["key"] == key), key=lambda iv: iv["start"])
        assert all(a["end"] <= b["start"] for a, b in itertools.pairwise(mine))
    assert max_concurrency(log) == 2  # different keys in parallel
    assert client.status("dec:order:A").holders == ()


def test_sequential_key_by_parameter_name(client: turnstile.Client) -> None:
    seen: list[str] = []

    @client.sequential(key="order_id", ttl=2.0, timeout=10)
    def handle(order_id: int, payload: str = "") -> int:
        names = client.names("")
        seen.extend(n for n in names if n.endswith(f":{order_id}"))
        return order_id

    assert handle(7) == 7
    assert handle(payload="x", order_id=8) == 8
    assert seen and seen[0].endswith("handle:7") and seen[1].endswith("handle:8")
    with pytest.raises(turnstile.InvalidArgument, match="nope"):

        @client.sequential(key="nope")
        def other(order_id: int) -> None: ...


def test_limited_sync(client: turnstile.Client) -> None:
    log: list[dict[str, Any]] = []
    guard = threading.Lock()

    @client.limited("dec:limited", 2, ttl=2.0, timeout=30)
    def work(i: int) -> int:
        _record(log, guard, "x", 0.15)
        return i * 2

    threads = []
    results: list[int] = []
    for i in range(5):
        threads.append(threading.Thread(target=lambda i=i: results.append(work(i))))
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert sorted(results) == [0, 2, 4, 6, 8]
    assert max_concurrency(log) == 2


def test_sequential_serializes_one_key(client: turnstile.Client) -> None:
    log: list[dict[str, Any]] = []
    guard = threading.Lock()

    @client.sequential(key=lambda k: k, ttl=2.0, timeout=30)
    def handle(k: str) -> None:
        _record(log, guard, k, 0.02)

    threads = [threading.Thread(target=handle, args=("same",)) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert len(log) == 6
    check_exclusive(log)


async def test_sequential_and_limited_async(aclient: turnstile.aio.AsyncClient) -> None:
    log: list[dict[str, Any]] = []

    async def record(key: str) -> None:
        start = time.monotonic()
        await asyncio.sleep(0.3)  # long enough for the parallel ones to overlap
        log.append({"key": key, "start": start, "end": time.monotonic(), "token": len(log)})

    @aclient.sequential(key=lambda order: order, ttl=2.0, timeout=30, prefix="adec:")
    async def handle(order: str) -> str:
        await record(order)
        return order

    assert await asyncio.gather(*(handle(o) for o in "AABB")) == list("AABB")
    for key in "AB":
        mine = sorted((iv for iv in log if iv["key"] == key), key=lambda iv: iv["start"])
        assert mine[0]["end"] <= mine[1]["start"]
    assert max_concurrency(log) == 2

    log.clear()

    @aclient.limited("adec:limited", 3, ttl=2.0, timeout=30)
    async def work(i: int) -> int:
        await record("x")
        return i

    assert await asyncio.gather(*(work(i) for i in range(7))) == list(range(7))
    assert max_concurrency(log) == 3


def test_wrong_kind_of_function_is_refused(client: turnstile.Client) -> None:
    async def coro() -> None: ...

    with pytest.raises(turnstile.InvalidArgument, match=r"turnstile\.aio\.connect"):
        client.sequential(key=lambda: "k")(coro)
    with pytest.raises(turnstile.InvalidArgument, match=r"turnstile\.aio\.connect"):
        client.limited("dec:wrong", 2)(coro)


async def test_wrong_kind_of_function_is_refused_async(
    aclient: turnstile.aio.AsyncClient,
) -> None:
    def plain() -> None: ...

    with pytest.raises(turnstile.InvalidArgument, match=r"turnstile\.connect"):
        aclient.sequential(key=lambda: "k")(plain)
    with pytest.raises(turnstile.InvalidArgument, match=r"turnstile\.connect"):
        aclient.limited("adec:wrong", 2)(plain)


def test_decorator_arguments_are_validated(client: turnstile.Client) -> None:
    with pytest.raises(turnstile.InvalidArgument, match="ttl"):
        client.sequential(key="x", ttl=0)
    with pytest.raises(turnstile.InvalidArgument, match="timeout"):
        client.sequential(key="x", timeout=-1)
    with pytest.raises(turnstile.InvalidArgument, match="key"):
        client.sequential(key=3)  # type: ignore[arg-type]
    with pytest.raises(turnstile.InvalidArgument, match="limit"):
        client.limited("dec:bad", 0)
    with pytest.raises(turnstile.InvalidArgument, match="name"):
        client.limited("", 1)
    with pytest.raises(turnstile.InvalidArgument, match="timeout"):
        client.limited("dec:bad", 1, timeout=float("inf"))


def test_sequential_timeout_raises(client: turnstile.Client) -> None:
    @client.sequential(key=lambda: "k", ttl=2.0, timeout=0.2, prefix="dec:to:")
    def f() -> None: ...

    with (
        client.lock("dec:to:k", ttl=2.0).acquire(timeout=5),
        pytest.raises(turnstile.AcquireTimeout),
    ):
        f()
