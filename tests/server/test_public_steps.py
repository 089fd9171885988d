"""The public client calls the HTTP service is built on (it uses no other): a ticket with the
store's clock, renewing by holder and token, waiting for a hand-over, a put answering the
store's whole result, and one non-blocking claim step."""

from __future__ import annotations

import asyncio

import pytest

import turnstile
import turnstile.aio
from turnstile import InvalidArgument, LeaseLost


async def test_semaphore_steps() -> None:
    async with await turnstile.aio.connect("memory://") as client:
        sem = client.semaphore("steps", 1, ttl=5)
        first = await sem.try_acquire("a")
        assert first.acquired and first.lease is not None and first.now is not None
        assert first.retry_after is None
        second = await sem.try_acquire("b")
        assert (second.acquired, second.position, second.lease) == (False, 0, None)
        assert second.now is not None and second.retry_after is not None
        # Not joining the line: no place, and nothing left behind.
        third = await sem.try_acquire("c", enqueue=False)
        assert (third.acquired, third.position) == (False, None)
        assert [w.holder for w in (await sem.status()).waiters] == ["b"]

        renewed = await sem.renew("a", first.lease.token, 10)
        assert renewed.token == first.lease.token and renewed.ttl == 10
        with pytest.raises(LeaseLost):
            await sem.renew("a", first.lease.token + 1)
        with pytest.raises(InvalidArgument, match="ttl must be between"):
            await sem.renew("a", first.lease.token, 0)

        assert await sem.wait("a", 0) is True  # already holds: answered at once
        assert await sem.wait("b", 0.05) is False
        woken = asyncio.ensure_future(sem.wait("b", 5))
        await asyncio.sleep(0.05)
        await sem.release("a", first.lease.token)
        assert await woken is True
        assert (await sem.try_acquire("b")).acquired


def test_queue_steps_in_both_flavours() -> None:
    with turnstile.connect("memory://") as client:
        q = client.queue("steps")
        put = q.put_message({"n": 1}, key="k", id="m-1")
        assert (put.id, put.created) == ("m-1", True) and put.now > 0
        assert q.put_message({"n": 1}, key="k", id="m-1").created is False
        claimed = q.claim("r-1")
        assert claimed.delivery is not None
        assert (claimed.delivery.id, claimed.delivery.receipt) == ("m-1", "r-1")
        # The key has a message in flight: nothing more now, and no waiting.
        assert q.claim().delivery is None
        assert q.ack("m-1", "r-1")
        with pytest.raises(InvalidArgument):
            q.claim("")
