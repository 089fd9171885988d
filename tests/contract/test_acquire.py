"""Blocking acquire with a timeout, acquire_nowait and the basics of a lease."""

from __future__ import annotations

import os
import socket
import threading
import time

import pytest

import turnstile

from .lock_harness import LONG_TTL, Spawner, wait_until


def test_timeout_raises_and_leaves_no_waiting_entry(client: turnstile.Client) -> None:
    lock = client.lock("acq:timeout", ttl=LONG_TTL)
    with lock.acquire(timeout=5, holder="boss") as boss:
        assert lock.try_acquire("queued").position == 0
        started = time.monotonic()
        with pytest.raises(turnstile.AcquireTimeout) as info:
            lock.acquire(timeout=0.3, holder="impatient")
        elapsed = time.monotonic() - started
        assert isinstance(info.value, TimeoutError)
        assert "acq:timeout" in str(info.value)
        assert 0.3 <= elapsed < 0.3 + 10  # and not much longer
        st = lock.status()
        assert [w.holder for w in st.waiters] == ["queued"]  # the line is as it was
        assert [(h.holder, h.token) for h in st.holders] == [("boss", boss.token)]
    lock.release("queued")


def test_timeout_zero_does_not_wait_or_queue(client: turnstile.Client) -> None:
    lock = client.lock("acq:zero", ttl=LONG_TTL)
    with lock.acquire(timeout=0) as lease:  # free: granted at once
        started = time.monotonic()
        with pytest.raises(turnstile.AcquireTimeout):
            lock.acquire(timeout=0)
        assert time.monotonic() - started < 10  # one round trip
        assert lock.status().waiters == ()
        assert [h.token for h in lock.status().holders] == [lease.token]


def test_timed_out_waiter_in_another_process_leaves_the_line(
    client: turnstile.Client, workers: Spawner
) -> None:
    name = "acq:timeout-remote"
    lock = client.lock(name, ttl=LONG_TTL)
    with lock.acquire(timeout=5, holder="boss"):
        w = workers.spawn(
            "wait_grant", name=name, limit=1, ttl=LONG_TTL, holder="remote", timeout=0.5
        )
        w.wait_for("ready")
        w.send("go")
        wait_until(lambda: lock.status().waiters, 30, what="remote waiter in line")
        out = w.wait_for("timeout", timeout=30)
        assert 0.5 <= out["waited"] < 0.5 + 10  # and not much longer
        w.join()
        assert lock.status().waiters == ()
    assert lock.status().holders == ()  # no grant was left to the waiter that gave up


def test_acquire_nowait(client: turnstile.Client) -> None:
    sem = client.semaphore("acq:nowait", 2, ttl=LONG_TTL)
    a = sem.acquire_nowait()
    b = sem.acquire_nowait(holder="b")
    assert b.holder == "b" and b.token > a.token
    with pytest.raises(turnstile.AcquireTimeout):
        sem.acquire_nowait(holder="c")
    assert sem.status().waiters == ()  # it did not join the line
    a.release()
    # a slot freed while somebody waits is handed to that waiter, not to acquire_nowait
    sem.try_acquire("x")  # takes the free slot
    assert sem.try_acquire("y").position == 0
    b.release()  # hands the slot to y, which has not claimed it yet
    with pytest.raises(turnstile.AcquireTimeout):
        sem.acquire_nowait(holder="c")
    assert [h.holder for h in sem.status().holders] == ["x", "y"]
    sem.release("x")
    sem.release("y")
    with sem.acquire_nowait(holder="c") as c:
        assert [h.holder for h in sem.status().holders] == [c.holder]


def test_lease_fields_and_default_holder(client: turnstile.Client) -> None:
    lock = client.lock("acq:fields", ttl=LONG_TTL)
    assert not lock.locked()
    with lock.acquire(timeout=5) as lease:
        assert lease.name == "acq:fields"
        assert lease.holder.startswith(f"{socket.gethostname()}/{os.getpid()}/")
        assert isinstance(lease.token, int)
        assert lease.expires_at == pytest.approx(lease.acquired_at + LONG_TTL, abs=0.01)
        assert not lease.lost
        assert 0 < lease.remaining <= LONG_TTL
        assert lock.locked()
        assert "acq:fields" in repr(lease)
    assert not lock.locked()
    assert "released" in repr(lease)
    another = lock.acquire(timeout=5)
    assert another.holder != lease.holder  # default holders are unique per call
    another.release()


def test_exception_in_block_releases_and_propagates(client: turnstile.Client) -> None:
    lock = client.lock("acq:raise", ttl=LONG_TTL)
    with pytest.raises(KeyError), lock.acquire(timeout=5):
        raise KeyError("inside")
    assert lock.status().holders == ()


def test_blocked_acquire_in_threads_of_one_client(client: turnstile.Client) -> None:
    """Many threads of one process on one client wait in line and all get through."""
    lock = client.lock("acq:threads", ttl=LONG_TTL)
    tokens: list[int] = []
    guard = threading.Lock()
    inside = [0]

    def run() -> None:
        for _ in range(3):
            with lock.acquire(timeout=30) as lease:
                with guard:
                    inside[0] += 1
                    assert inside[0] == 1
                    tokens.append(lease.token)
                time.sleep(0.002)
                with guard:
                    inside[0] -= 1

    threads = [threading.Thread(target=run) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert len(tokens) == 18 and tokens == sorted(tokens) and len(set(tokens)) == 18
