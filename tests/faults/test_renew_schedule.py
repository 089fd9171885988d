"""Issue 17.2: renewals are scheduled from the lease's real remaining time, not ``ttl/3``
regardless. A lease that reaches its holder with less than its ttl left (a hand-over answered
late, a reply that took long) is renewed within a third of what it has left, so it is not
declared lost before its first renewal. Store-independent (the memory store); both flavours.
"""

from __future__ import annotations

import time

import pytest

import turnstile
import turnstile.aio

pytestmark = pytest.mark.slow

LEFT = 1.5  # the lease reaches its holder with this much of its 30 s left


def test_a_lease_handed_over_late_is_renewed_in_time() -> None:
    client = turnstile.connect("memory://")
    try:
        lease = client.lock("late", ttl=30).acquire()
        # As if the answer had taken 28.5 s to arrive: the local deadline (which only ever
        # errs early) is LEFT seconds away. Renewing every ttl/3 = 10 s would lose it.
        lease._deadline = time.monotonic() + LEFT
        with lease:
            time.sleep(LEFT + 0.5)
            assert not lease.lost
            assert lease.remaining > 25  # renewed for its full ttl
    finally:
        client.close()


async def test_async_a_lease_handed_over_late_is_renewed_in_time() -> None:
    import asyncio

    client = await turnstile.aio.connect("memory://")
    try:
        lease = await client.lock("late", ttl=30).acquire()
        lease._deadline = time.monotonic() + LEFT
        async with lease:
            await asyncio.sleep(LEFT + 0.5)
            assert not lease.lost
            assert lease.remaining > 25
    finally:
        await client.close()
