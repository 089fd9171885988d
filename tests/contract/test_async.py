"""The async API (``turnstile.aio``) on every backend: the same guarantees through
``await`` and ``async with``; cancelling a waiting acquire leaves the line."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

import turnstile.aio
from turnstile.aio import AcquireTimeout, AsyncClient, InvalidArgument, LeaseLost

from .lock_harness import LONG_TTL, check_bounded, check_exclusive


async def _wait_until(predicate: Any, within: float, what: str) -> Any:
    deadline = time.monotonic() + within
    while True:
        value = await predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {within} s: {what}")
        await asyncio.sleep(0.01)


async def test_async_with_acquire(aclient: AsyncClient) -> None:
    sem = aclient.semaphore("aio:with", 2, ttl=LONG_TTL)
    async with sem.acquire(timeout=5) as lease:
        assert isinstance(lease, turnstile.aio.Lease)
        st = await sem.status()
        assert [(h.holder, h.token) for h in st.holders] == [(lease.holder, lease.token)]
        lease2 = await sem.acquire(timeout=5, holder="second")  # awaiting works too
        assert lease2.token > lease.token
        assert await lease2.release()
    assert (await sem.status()).holders == ()
    assert await lease.release() is False


async def test_async_tasks_never_overlap(aclient: AsyncClient) -> None:
    lock = aclient.lock("aio:lock", ttl=LONG_TTL)
    intervals: list[dict[str, Any]] = []

    async def task() -> None:
        for _ in range(4):
            asked = time.monotonic()
            async with lock.acquire(timeout=30) as lease:
                start = time.monotonic()
                await asyncio.sleep(0.003)
                intervals.append(
                    {"asked": asked, "start": start, "end": time.monotonic(), "token": lease.token}
                )

    await asyncio.gather(*(task() for _ in range(8)))
    assert len(intervals) == 32
    check_exclusive(intervals)


async def test_async_semaphore_bound_kept_and_used(aclient: AsyncClient) -> None:
    sem = aclient.semaphore("aio:sem", 3, ttl=LONG_TTL)
    intervals: list[dict[str, Any]] = []

    async def task() -> None:
        asked = time.monotonic()
        async with sem.acquire(timeout=30) as lease:
            start = time.monotonic()
            await asyncio.sleep(0.15)
            intervals.append(
                {"asked": asked, "start": start, "end": time.monotonic(), "token": lease.token}
            )

    await asyncio.gather(*(task() for _ in range(8)))
    assert check_bounded(intervals, 3) == 3


async def test_async_fifo(aclient: AsyncClient) -> None:
    lock = aclient.lock("aio:fifo", ttl=LONG_TTL)
    order: list[str] = []

    async def waiter(h: str) -> None:
        async with lock.acquire(timeout=30, holder=h):
            order.append(h)

    tasks = []
    async with lock.acquire(timeout=5):
        for i in range(5):
            tasks.append(asyncio.create_task(waiter(f"w{i}")))
            await _wait_until(lambda i=i: _in_line(lock, f"w{i}"), 30, f"w{i} in line")
    await asyncio.gather(*tasks)
    assert order == [f"w{i}" for i in range(5)]


async def _in_line(sem: Any, holder: str) -> bool:
    return holder in [w.holder for w in (await sem.status()).waiters]


async def test_async_try_acquire(aclient: AsyncClient) -> None:
    sem = aclient.semaphore("aio:ticket", 1, ttl=LONG_TTL)
    boss = await sem.acquire(timeout=5)
    assert [(await sem.try_acquire(h)).position for h in "abc"] == [0, 1, 2]
    assert (await sem.try_acquire("b")).position == 1
    assert await sem.release("b")
    assert [w.holder for w in (await sem.status()).waiters] == ["a", "c"]
    await boss.release()
    t = await sem.try_acquire("a")
    assert t.acquired and t.lease is not None
    assert (await sem.try_acquire("a")).lease.token == t.lease.token  # type: ignore[union-attr]
    assert await sem.release("a")
    t = await sem.try_acquire("c")
    assert t.acquired and t.lease is not None
    await t.lease.release()


async def test_async_timeout_leaves_no_waiting_entry(aclient: AsyncClient) -> None:
    lock = aclient.lock("aio:timeout", ttl=LONG_TTL)
    async with lock.acquire(timeout=5):
        started = time.monotonic()
        with pytest.raises(AcquireTimeout):
            async with lock.acquire(timeout=0.3):
                pass
        assert 0.3 <= time.monotonic() - started < 0.3 + 10  # and not much longer
        assert (await lock.status()).waiters == ()
        with pytest.raises(AcquireTimeout):
            await lock.acquire_nowait()
    assert (await lock.status()).holders == ()


async def test_cancelled_acquire_leaves_the_line(aclient: AsyncClient) -> None:
    lock = aclient.lock("aio:cancel", ttl=LONG_TTL)
    entered = []

    async def waiter() -> None:
        async with lock.acquire(timeout=30, holder="cancelled"):
            entered.append(True)

    async with lock.acquire(timeout=5, holder="boss"):
        task = asyncio.create_task(waiter())
        await _wait_until(lambda: _in_line(lock, "cancelled"), 30, "waiter in line")
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        st = await lock.status()
        assert st.waiters == ()
        assert [h.holder for h in st.holders] == ["boss"]
    st = await lock.status()
    assert st.holders == () and st.waiters == ()  # no grant was handed to the cancelled one
    assert not entered


async def test_cancel_racing_a_handover_leaks_no_grant(aclient: AsyncClient) -> None:
    """Cancel a waiter at about the moment the release hands it the lock, many times: every
    time the name ends up free (the cancelled waiter left the line and dropped any grant)."""
    lock = aclient.lock("aio:cancel-race", ttl=5.0)
    for i in range(15):
        boss = await lock.acquire(timeout=5, holder="boss")

        async def waiter() -> None:
            async with lock.acquire(timeout=30, holder="w"):
                await asyncio.sleep(10)

        task = asyncio.create_task(waiter())
        await _wait_until(lambda: _in_line(lock, "w"), 30, "waiter in line")
        release = asyncio.create_task(boss.release())
        await asyncio.sleep(0.0005 * (i % 5))
        task.cancel()
        await release
        with pytest.raises(asyncio.CancelledError):
            await task
        st = await lock.status()
        assert st.holders == () and st.waiters == (), f"round {i}: {st}"


async def test_async_lost_lease_raises_on_exit(aclient: AsyncClient) -> None:
    lost = []
    lock = aclient.lock("aio:lost", ttl=0.2, on_lost=lost.append)
    stale = await lock.acquire(timeout=5, holder="stale")
    await asyncio.sleep(0.3)
    async with aclient.lock("aio:lost", ttl=5).acquire(timeout=5, holder="new") as newer:
        assert newer.token > stale.token
        assert stale.lost and lost == [stale]
        with pytest.raises(LeaseLost):
            await stale.renew()
        with pytest.raises(LeaseLost):
            async with stale:
                pass
        assert [h.holder for h in (await lock.status()).holders] == ["new"]


async def test_async_renewal_keeps_the_lease(aclient: AsyncClient) -> None:
    ttl = 3.0  # renewed every second: a renewal may be two seconds late before it is lost
    lock = aclient.lock("aio:renew", ttl=ttl)
    async with lock.acquire(timeout=5) as lease:
        first_expiry = lease.expires_at
        deadline = time.monotonic() + 60
        while lease.expires_at < first_expiry + ttl and time.monotonic() < deadline:
            await asyncio.sleep(0.1)  # until renewed (at least) a whole ttl past the first
            with pytest.raises(AcquireTimeout):
                await lock.acquire_nowait()
        assert lease.expires_at >= first_expiry + ttl, "not renewed"
        assert not lease.lost


async def test_async_bad_arguments(aclient: AsyncClient) -> None:
    with pytest.raises(InvalidArgument, match="name"):
        aclient.lock("")
    with pytest.raises(InvalidArgument, match="limit"):
        aclient.semaphore("aio:bad", 0)
    with pytest.raises(InvalidArgument, match="ttl"):
        aclient.lock("aio:bad", ttl=float("nan"))
    sem = aclient.semaphore("aio:bad", 2, ttl=LONG_TTL)
    with pytest.raises(InvalidArgument, match="timeout"):
        await sem.acquire(timeout=-1)
    with pytest.raises(InvalidArgument, match="holder"):
        await sem.try_acquire("")
    with pytest.raises(InvalidArgument, match="token"):
        await sem.release("h", 0)
    with pytest.raises(InvalidArgument, match="name"):
        await aclient.status("x" * 5000)
    st = await sem.status()
    assert st.holders == () and st.waiters == ()


async def test_cancel_at_any_point_leaks_no_grant(aclient: AsyncClient) -> None:
    """Cancel an acquire of a free name after 0, 1, 2, ... turns of the event loop — before
    it starts, while its first request is in flight, after it got the lease: the name is
    free afterwards every time (no lease left behind for its ttl)."""
    lock = aclient.lock("aio:cancel-early", ttl=30.0)
    entered = 0
    for i in range(40):

        async def holder() -> None:
            nonlocal entered
            async with lock.acquire(timeout=30):
                entered += 1
                await asyncio.sleep(10)

        task = asyncio.create_task(holder())
        before = entered
        for _ in range(i % 10):
            await asyncio.sleep(0)
        if i in (9, 19):
            await asyncio.sleep(0.002 * (i // 10))
        elif i in (29, 39):  # surely after the grant, however long the acquire takes

            async def inside(before: int = before) -> bool:
                return entered > before

            await _wait_until(inside, 30, "the holder entered its block")
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        st = await lock.status()
        assert st.holders == () and st.waiters == (), f"round {i}: {st}"
    # the cancellations above hit the acquire at different points, some after the grant
    assert 0 < entered < 40


async def test_acquire_is_a_coroutine_for_tasks_and_wait_for(aclient: AsyncClient) -> None:
    lock = aclient.lock("aio:task", ttl=LONG_TTL)
    lease = await asyncio.create_task(lock.acquire(timeout=5))
    with pytest.raises(TimeoutError):  # asyncio's own timeout, around a waiting acquire
        await asyncio.wait_for(lock.acquire(holder="w"), 0.2)
    await asyncio.sleep(0.05)
    st = await lock.status()
    assert st.waiters == ()  # the cancelled acquire left the line
    assert [h.token for h in st.holders] == [lease.token]
    await lease.release()


async def test_async_groups_priorities_and_start_rates(aclient: AsyncClient) -> None:
    """Admission beyond a plain limit through ``turnstile.aio``: a group's key in ``async
    with``, a busy key not holding up another, priorities in a line, a semaphore's start
    rate."""
    group = aclient.semaphore_group("aio:group", per_key=1, total=2, ttl=LONG_TTL)
    assert isinstance(group, turnstile.aio.SemaphoreGroup)
    async with group.acquire("a", timeout=5) as lease:
        assert not (await group.try_acquire("a", "a2", wait_ttl=LONG_TTL)).acquired
        assert (await group.try_acquire("b", "b1", wait_ttl=LONG_TTL)).acquired
        status = await group.status()
        assert {(h.holder, h.key) for h in status.holders} == {(lease.holder, "a"), ("b1", "b")}
    lock = aclient.lock("aio:priority", ttl=LONG_TTL)
    held = await lock.acquire(timeout=5, holder="held")
    await lock.try_acquire("low", wait_ttl=LONG_TTL)
    waiter = asyncio.ensure_future(lock.acquire(timeout=30, holder="high", priority=5))
    await _wait_until(lambda: _line(lock), 30, "both in line")
    assert [w.holder for w in (await lock.status()).waiters] == ["high", "low"]
    await held.release()
    high = await waiter
    assert high.holder == "high"
    await high.release()
    rated = aclient.semaphore("aio:rated", 2, ttl=LONG_TTL, rate=1, per=0.3)
    first = await rated.acquire(timeout=5)
    second = await rated.acquire(timeout=10)
    assert first.started_at is not None and second.started_at is not None
    assert second.started_at - first.started_at >= 0.3 - 1e-6
    await first.release()
    await second.release()


async def _line(lock: Any) -> bool:
    return len((await lock.status()).waiters) == 2
