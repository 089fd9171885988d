"""``with client.lock(name):`` and ``with client.semaphore(name, limit):``, sync and async, on
every backend: the object itself acquires (waiting up to its ``timeout``), keeps the lease
renewed while the block runs and releases it when the block ends, as ``threading.Lock`` does.
One object may be shared by many threads or tasks; the same one entering twice is refused."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest

import turnstile
import turnstile.aio
from turnstile.aio import AsyncClient

from .lock_harness import check_bounded, check_exclusive


def test_with_lock_acquires_renews_and_releases(client: turnstile.Client) -> None:
    lock = client.lock("cm:lock", ttl=3.0)  # renewed every second; a late renewal is fine
    assert lock.timeout is None  # by default `with lock:` waits without a limit
    with lock as lease:
        assert isinstance(lease, turnstile.Lease)
        holders = lock.status().holders
        assert [(h.holder, h.token) for h in holders] == [(lease.holder, lease.token)]
        first_expiry = holders[0].expires_at
        # The block keeps it renewed: wait until the store shows a renewal (not a guess).
        deadline = time.monotonic() + 60
        while lock.status().holders[0].expires_at <= first_expiry:
            assert time.monotonic() < deadline, "the block never renewed its lease"
            time.sleep(0.05)
        with pytest.raises(turnstile.AcquireTimeout):
            lock.acquire_nowait()
        assert not lease.lost
    assert lock.status().holders == ()
    with lock as second:  # the same object, entered again after leaving: a new lease
        assert second.token > lease.token
    assert lock.status().holders == ()


def test_with_lock_releases_when_the_block_raises(client: turnstile.Client) -> None:
    lock = client.lock("cm:raise", ttl=2.0)
    with pytest.raises(KeyError), lock:
        assert len(lock.status().holders) == 1
        raise KeyError("boom")
    assert lock.status().holders == ()


def test_with_lock_waits_up_to_its_timeout(client: turnstile.Client) -> None:
    name = "cm:timeout"
    with client.lock(name, ttl=2.0).acquire(timeout=5, holder="boss"):
        impatient = client.lock(name, ttl=2.0, timeout=0.3)
        assert impatient.timeout == 0.3
        started = time.monotonic()
        with pytest.raises(turnstile.AcquireTimeout), impatient:
            pytest.fail("granted while held")
        assert 0.3 <= time.monotonic() - started < 0.3 + 2.0
        status = client.status(name)
        assert status.waiters == ()  # it left the line
        assert [h.holder for h in status.holders] == ["boss"]
    with pytest.raises(turnstile.InvalidArgument, match="timeout"):
        client.lock(name, timeout=-1)
    with pytest.raises(turnstile.InvalidArgument, match="timeout"):
        client.semaphore(name, 2, timeout=float("nan"))


def test_one_lock_object_shared_by_threads(client: turnstile.Client) -> None:
    lock = client.lock("cm:threads", ttl=2.0, timeout=60)
    intervals: list[dict[str, Any]] = []
    errors: list[BaseException] = []

    def worker() -> None:
        try:
            for _ in range(3):
                asked = time.monotonic()
                with lock as lease:
                    start = time.monotonic()
                    time.sleep(0.003)
                    intervals.append(
                        {
                            "asked": asked,
                            "start": start,
                            "end": time.monotonic(),
                            "token": lease.token,
                        }
                    )
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(90)
    assert errors == []
    assert len(intervals) == 12
    check_exclusive(intervals)
    assert lock.status().holders == ()


def test_semaphore_object_shared_by_threads_holds_up_to_its_limit(
    client: turnstile.Client,
) -> None:
    sem = client.semaphore("cm:sem", 3, ttl=2.0, timeout=60)
    inside = threading.Barrier(3, timeout=60)
    tokens: list[int] = []
    errors: list[BaseException] = []

    def worker() -> None:
        try:
            with sem as lease:
                tokens.append(lease.token)
                inside.wait()  # all three hold at once
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=worker) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(90)
    assert errors == []
    assert len(set(tokens)) == 3
    assert sem.status().holders == ()


def test_entering_the_same_object_twice_in_one_thread_is_refused(
    client: turnstile.Client,
) -> None:
    for primitive in (client.lock("cm:nested", ttl=2.0), client.semaphore("cm:nested2", 2)):
        with primitive as lease:
            with pytest.raises(turnstile.InvalidArgument, match="re-entrant"), primitive:
                pytest.fail("entered twice")
            # The outer block still holds its lease, and only it.
            assert [h.token for h in primitive.status().holders] == [lease.token]
        assert primitive.status().holders == ()


async def test_async_with_lock_acquires_renews_and_releases(aclient: AsyncClient) -> None:
    lock = aclient.lock("cm:aio", ttl=3.0)
    async with lock as lease:
        assert isinstance(lease, turnstile.aio.Lease)
        first_expiry = (await lock.status()).holders[0].expires_at
        deadline = time.monotonic() + 60
        while (await lock.status()).holders[0].expires_at <= first_expiry:
            assert time.monotonic() < deadline, "the block never renewed its lease"
            await asyncio.sleep(0.05)
        with pytest.raises(turnstile.AcquireTimeout):
            await lock.acquire_nowait()
        assert not lease.lost
        assert [h.token for h in (await lock.status()).holders] == [lease.token]
    assert (await lock.status()).holders == ()


async def test_async_with_lock_waits_up_to_its_timeout(aclient: AsyncClient) -> None:
    name = "cm:aio-timeout"
    async with aclient.lock(name, ttl=2.0).acquire(timeout=5, holder="boss"):
        with pytest.raises(turnstile.AcquireTimeout):
            async with aclient.lock(name, ttl=2.0, timeout=0.3):
                pytest.fail("granted while held")
        assert (await aclient.status(name)).waiters == ()


async def test_async_one_object_shared_by_tasks(aclient: AsyncClient) -> None:
    lock = aclient.lock("cm:aio-tasks", ttl=2.0, timeout=60)
    sem = aclient.semaphore("cm:aio-sem", 2, ttl=2.0, timeout=60)
    intervals: list[dict[str, Any]] = []
    sem_intervals: list[dict[str, Any]] = []

    async def task() -> None:
        for _ in range(3):
            asked = time.monotonic()
            async with lock as lease:
                start = time.monotonic()
                await asyncio.sleep(0.003)
                intervals.append(
                    {"asked": asked, "start": start, "end": time.monotonic(), "token": lease.token}
                )
            asked = time.monotonic()
            async with sem as lease:
                start = time.monotonic()
                await asyncio.sleep(0.003)
                sem_intervals.append(
                    {"asked": asked, "start": start, "end": time.monotonic(), "token": lease.token}
                )

    await asyncio.gather(*(task() for _ in range(5)))
    assert len(intervals) == len(sem_intervals) == 15
    check_exclusive(intervals)
    check_bounded(sem_intervals, 2)
    assert (await lock.status()).holders == () and (await sem.status()).holders == ()


async def test_async_entering_the_same_object_twice_in_one_task_is_refused(
    aclient: AsyncClient,
) -> None:
    lock = aclient.lock("cm:aio-nested", ttl=2.0)
    async with lock as lease:
        with pytest.raises(turnstile.InvalidArgument, match="re-entrant"):
            async with lock:
                pytest.fail("entered twice")
        assert [h.token for h in (await lock.status()).holders] == [lease.token]
    assert (await lock.status()).holders == ()
