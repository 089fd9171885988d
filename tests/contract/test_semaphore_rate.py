"""A semaphore with a rate (``client.semaphore(name, limit, rate=, per=, burst=)``), on every
store: at most ``limit`` hold at once and at most ``rate + burst`` *start* in any window of
``per`` seconds, judged from the store's own admission times; a granted caller keeps its
slot, renewed, until its start; timeouts give the slot back."""

from __future__ import annotations

import time

import pytest

import turnstile
from turnstile._core.rate_machine import max_in_window

from .lock_harness import Spawner, check_bounded


@pytest.mark.slow
def test_processes_keep_the_limit_and_the_rate(client: turnstile.Client, workers: Spawner) -> None:
    name, limit, rate, per, burst = "srate:procs", 3, 8, 1.0, 2
    started = [
        workers.spawn(
            "rated_critical", label=f"w{i}", name=name, limit=limit, rate=rate, per=per,
            burst=burst, ttl=10.0, iterations=4, hold=0.05,
        )
        for i in range(5)
    ]
    for w in started:
        w.wait_for("ready")
    for w in started:
        w.send("go")
    for w in started:
        w.wait_for("done", timeout=120)
        w.join()
    intervals = [iv for w in started for iv in w.all("interval")]
    assert len(intervals) == 20 and not any(iv["lost"] for iv in intervals)
    check_bounded(intervals, limit)
    starts = [iv["started_at"] for iv in intervals]
    assert all(isinstance(t, float) for t in starts)
    assert max_in_window(starts, per) <= rate + burst
    assert max_in_window(starts, 1e-9) <= burst
    # 20 starts at 8/s after a burst of 2: at least (20 - 2) / 8 s from the first to the last.
    assert max(starts) - min(starts) >= (20 - burst) / rate - 1e-6


def test_a_granted_caller_keeps_its_slot_until_its_start(client: turnstile.Client) -> None:
    sem = client.semaphore("srate:slot", 2, ttl=1.0, rate=1, per=3.0, burst=1)
    assert repr(sem) == "<Semaphore name='srate:slot' limit=2 ttl=1.0 rate=1 per=3 burst=1>"
    with sem.acquire(timeout=10, holder="first") as first:  # renewed by its block
        assert first.started_at is not None
        began = time.monotonic()
        # The second slot is free, but the next start is 3 s away: the caller holds the slot
        # (renewed past its 1 s ttl) while it waits, and starts then.
        second = sem.acquire(timeout=30, holder="second")
        assert second.started_at is not None
        assert second.started_at - first.started_at >= 3.0 - 1e-6
        assert time.monotonic() - began >= 2.5
        assert not second.lost
        holders = {h.holder for h in sem.status().holders}
        assert holders == {"first", "second"}
        second.release()


def test_a_start_past_the_timeout_gives_the_slot_back(client: turnstile.Client) -> None:
    sem = client.semaphore("srate:timeout", 2, ttl=30, rate=1, per=60.0, burst=1)
    sem.acquire(timeout=10, holder="first")
    with pytest.raises(turnstile.AcquireTimeout, match="past the timeout"):
        sem.acquire(timeout=1, holder="late")
    assert [h.holder for h in sem.status().holders] == ["first"]
    with pytest.raises(turnstile.AcquireTimeout):
        sem.acquire_nowait(holder="nowait")
    assert [h.holder for h in sem.status().holders] == ["first"]


def test_tickets_wait_for_their_start_at_position_zero(client: turnstile.Client) -> None:
    sem = client.semaphore("srate:ticket", 2, ttl=30, rate=1, per=0.5, burst=1)
    assert sem.try_acquire("a").acquired
    waiting = sem.try_acquire("b")
    assert (waiting.acquired, waiting.position) == (False, 0)
    assert 0 < waiting.retry_after <= 0.5
    # The slot is held meanwhile: a third caller waits in the semaphore's line.
    assert sem.try_acquire("c").position == 0
    time.sleep(waiting.retry_after + 0.05)
    assert sem.try_acquire("b").acquired
    with pytest.raises(turnstile.InvalidArgument, match="takes no callback"):
        sem.try_acquire("d", callback=turnstile.HttpCallback("https://example.com/hook"))


@pytest.mark.parametrize(
    ("kwargs", "words"),
    [
        ({"rate": 0}, "rate must be between 1 and 1000000"),
        ({"rate": 1, "per": 0}, "per must be between 0.001"),
        ({"rate": 1, "burst": 0}, "burst must be between 1"),
        ({"rate": 1.5}, "rate must be an integer"),
    ],
)
def test_bad_rates_are_named(client: turnstile.Client, kwargs: dict, words: str) -> None:
    with pytest.raises(turnstile.InvalidArgument, match=words):
        client.semaphore("srate:bad", 2, **kwargs)
