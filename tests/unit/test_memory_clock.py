"""The memory backend with an injected store clock: expiry, hand-over and dead-waiter
skipping are judged by the store's clock alone (SPEC 3), checked without sleeping."""

from __future__ import annotations

import asyncio
import time

import pytest

from turnstile._async.backends.memory import AsyncMemoryBackend
from turnstile._async.semaphore import AsyncSemaphore
from turnstile._sync.backends.memory import MemoryBackend
from turnstile._sync.semaphore import Semaphore
from turnstile.errors import AcquireTimeout, LeaseLost


class Clock:
    def __init__(self, now: float = 1_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


async def test_expiry_follows_the_store_clock_not_wall_time() -> None:
    clock = Clock()
    backend = AsyncMemoryBackend(clock=clock)
    a = await backend.acquire("n", "a", limit=1, ttl=0.05, wait_ttl=0.05, enqueue=True)
    assert a.grant is not None and a.grant.expires_at == clock.now + 0.05
    await asyncio.sleep(0.1)  # wall time passes, the store clock does not
    st = await backend.status("n")
    assert [h.holder for h in st.holders] == ["a"]
    assert await backend.names("", 10) == ["n"]
    clock.now += 0.05
    st = await backend.status("n")
    assert st.holders == () and st.now == clock.now
    assert await backend.names("", 10) == []
    b = await backend.acquire("n", "b", limit=1, ttl=1.0, wait_ttl=1.0, enqueue=True)
    assert b.grant is not None and b.grant.token > a.grant.token


async def test_release_wakes_the_admitted_waiter_only() -> None:
    clock = Clock()
    backend = AsyncMemoryBackend(clock=clock)
    a = await backend.acquire("n", "a", limit=1, ttl=10.0, wait_ttl=5.0, enqueue=True)
    assert a.grant is not None
    wb = await backend.open_waiter("n", "b")
    wc = await backend.open_waiter("n", "c")
    for h in "bc":
        r = await backend.acquire("n", h, limit=1, ttl=10.0, wait_ttl=5.0, enqueue=True)
        assert r.grant is None
    assert await backend.release("n", "a", a.grant.token)
    assert await wb.wait(1.0)
    assert not await wc.wait(0.01)
    await wb.close()
    await wc.close()
    assert backend._events == {}


async def test_dead_waiter_is_skipped_after_wait_ttl() -> None:
    clock = Clock()
    backend = AsyncMemoryBackend(clock=clock)
    a = await backend.acquire("n", "a", limit=1, ttl=10.0, wait_ttl=5.0, enqueue=True)
    assert a.grant is not None
    await backend.acquire("n", "dead", limit=1, ttl=10.0, wait_ttl=1.0, enqueue=True)
    await backend.acquire("n", "c", limit=1, ttl=10.0, wait_ttl=5.0, enqueue=True)
    await backend.release("n", "a", a.grant.token)
    st = await backend.status("n")
    assert [h.holder for h in st.holders] == ["dead"]
    assert st.holders[0].expires_at == clock.now + 1.0  # unclaimed: only wait_ttl
    clock.now += 0.99
    r = await backend.acquire("n", "c", limit=1, ttl=10.0, wait_ttl=5.0, enqueue=True)
    assert r.grant is None and r.position == 0
    assert r.retry_after == pytest.approx(0.01)
    clock.now += 0.02
    r = await backend.acquire("n", "c", limit=1, ttl=10.0, wait_ttl=5.0, enqueue=True)
    assert r.grant is not None and r.grant.expires_at == clock.now + 10.0


async def test_semaphore_over_a_fake_clock_learns_it_lost() -> None:
    """The store refuses a renewal once its clock passed the lease's expiry, even though the
    client's own clock says the lease is fresh."""
    clock = Clock()
    backend = AsyncMemoryBackend(clock=clock)
    sem = AsyncSemaphore(backend, "n", 1, ttl=5.0)
    lease = await sem.acquire(timeout=1)
    with pytest.raises(AcquireTimeout):
        await sem.acquire_nowait()
    clock.now += 5.0
    other = await sem.acquire_nowait(holder="other")
    assert other.token > lease.token
    assert not lease.lost  # locally nothing says so yet
    with pytest.raises(LeaseLost):
        await lease.renew()
    assert lease.lost
    assert await lease.release() is False
    assert [h.holder for h in (await sem.status()).holders] == ["other"]


async def test_blocking_acquire_wakes_on_handover() -> None:
    clock = Clock()
    backend = AsyncMemoryBackend(clock=clock)
    sem = AsyncSemaphore(backend, "n", 1, ttl=30.0)
    holder = await sem.acquire(timeout=1)
    task = asyncio.create_task(sem.acquire(timeout=20, holder="w"))
    for _ in range(100):
        if (await sem.status()).waiters:
            break
        await asyncio.sleep(0.001)
    started = time.monotonic()
    await holder.release()
    lease = await task
    assert time.monotonic() - started < 1.0  # woken, not by its 1.7 s heartbeat
    assert lease.holder == "w" and lease.token > holder.token
    await lease.release()


def test_sync_memory_backend_with_clock() -> None:
    clock = Clock()
    backend = MemoryBackend(clock=clock)
    sem = Semaphore(backend, "n", 2, ttl=1.0)
    a = sem.acquire(timeout=0)
    b = sem.acquire(timeout=0)
    assert sem.try_acquire("c", wait_ttl=0.5).position == 0
    clock.now += 0.6
    st = sem.status()
    assert st.waiters == ()  # c stopped asking; its entry lapsed on the store clock
    assert [h.token for h in st.holders] == [a.token, b.token]
    clock.now += 0.4
    assert sem.status().holders == ()
    assert sem.try_acquire("c").acquired
    assert not a.release() and not b.release()
