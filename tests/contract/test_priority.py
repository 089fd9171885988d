"""Priorities (docs/admission.md, _core/ranking.py), on every store: a larger priority is
served first, in arrival order within a level; ageing lifts a waiter one level per
``ageing`` seconds waited; positions in tickets and status reflect the order; an entry asked
about again keeps its place whatever priority it names. Locks, semaphores and rate limits."""

from __future__ import annotations

import random
import time

import pytest

import turnstile
from tests.conftest import BackendUnderTest

from .lock_harness import Spawner, require_processes, wait_until

LONG = 120.0  # leases and places that outlast every test here


def _line(sem: turnstile.Semaphore) -> list[str]:
    return [w.holder for w in sem.status().waiters]


def test_a_larger_priority_is_served_first_and_fifo_within_a_level(
    client: turnstile.Client,
) -> None:
    sem = client.semaphore("prio:order", 1, ttl=LONG)
    first = sem.acquire(timeout=10, holder="first")
    asks = [("a", 0), ("b", 5), ("c", 0), ("d", 5), ("e", -3), ("f", 10), ("g", 0)]
    positions = {}
    for holder, priority in asks:
        ticket = sem.try_acquire(holder, wait_ttl=LONG, priority=priority)
        assert not ticket.acquired
        positions[holder] = ticket.position
    # Each ticket told where the newcomer went at the time it asked.
    assert positions == {"a": 0, "b": 0, "c": 2, "d": 1, "e": 4, "f": 0, "g": 5}
    expected = ["f", "b", "d", "a", "c", "g", "e"]
    assert _line(sem) == expected
    assert [w.position for w in sem.status().waiters] == list(range(len(expected)))
    # Grants follow the line: each release hands the name to the next by rank.
    order = []
    holder, token = "first", first.token
    for _ in expected:
        assert sem.release(holder, token)
        granted = [h for h in sem.status().holders]
        assert len(granted) == 1
        holder, token = granted[0].holder, granted[0].token
        order.append(holder)
    assert order == expected


def test_asking_again_keeps_the_place_whatever_priority_it_names(
    client: turnstile.Client,
) -> None:
    lock = client.lock("prio:keep", ttl=LONG)
    lock.acquire(timeout=10, holder="holder")
    assert lock.try_acquire("low", wait_ttl=LONG, priority=0).position == 0
    assert lock.try_acquire("high", wait_ttl=LONG, priority=3).position == 0
    # "low" raising its priority later does not move it: the place is fixed at joining.
    assert lock.try_acquire("low", wait_ttl=LONG, priority=1000).position == 1
    assert _line(lock) == ["high", "low"]
    # A higher priority joining later moves those behind it one place back.
    assert lock.try_acquire("top", wait_ttl=LONG, priority=4).position == 0
    assert lock.try_acquire("low", wait_ttl=LONG).position == 2


def test_a_waiter_rises_one_level_per_ageing_seconds(client: turnstile.Client) -> None:
    ageing = 0.4
    sem = client.semaphore("prio:ageing", 1, ttl=LONG, ageing=ageing)
    sem.acquire(timeout=10, holder="holder")
    old = sem.try_acquire("old", wait_ttl=LONG, priority=0)
    assert old.position == 0
    joined = sem.status().waiters[0].joined_at
    # Once it has waited more than one level's worth (store clock), a newcomer one level
    # up ranks behind it ...
    wait_until(lambda: sem.status().now - joined > ageing * 1.5, timeout=30, what="ageing")
    assert sem.try_acquire("up-one", wait_ttl=LONG, priority=1).position == 1
    # ... while one two levels up, whose lead the old waiter has not made up, goes ahead
    # (unless the machine stalled for a whole further level: then it is behind, correctly).
    ahead = sem.try_acquire("up-two", wait_ttl=LONG, priority=2)
    now = sem.status().now
    if now - joined < ageing * 2:
        assert ahead.position == 0
        assert _line(sem) == ["up-two", "old", "up-one"]


def test_without_ageing_a_lower_level_never_passes(client: turnstile.Client) -> None:
    lock = client.lock("prio:strict", ttl=LONG)
    lock.acquire(timeout=10, holder="holder")
    lock.try_acquire("low", wait_ttl=LONG, priority=-1000)
    time.sleep(0.2)
    assert lock.try_acquire("high", wait_ttl=LONG, priority=-999).position == 0


def test_ageing_true_is_ten_seconds_per_level(client: turnstile.Client) -> None:
    lock = client.lock("prio:ten", ttl=LONG, ageing=True)
    assert lock.ageing == 10.0
    lock.acquire(timeout=10, holder="holder")
    lock.try_acquire("old", wait_ttl=LONG)
    # Well inside ten seconds, one level up is still ahead.
    assert lock.try_acquire("new", wait_ttl=LONG, priority=1).position == 0


def test_many_waiters_in_random_order_are_sorted_by_level_then_arrival(
    client: turnstile.Client,
) -> None:
    rng = random.Random(7)
    sem = client.semaphore("prio:many", 2, ttl=LONG)
    sem.acquire(timeout=10, holder="h1")
    sem.acquire(timeout=10, holder="h2")
    asks = [(f"w{i:02d}", rng.randint(-2, 2)) for i in range(30)]
    for holder, priority in asks:
        sem.try_acquire(holder, wait_ttl=LONG, priority=priority)
    expected = [h for h, _ in sorted(asks, key=lambda a: -a[1])]  # stable: arrival within
    assert _line(sem) == expected


def test_rate_limit_admits_by_priority(client: turnstile.Client) -> None:
    limiter = client.rate_limit("prio:rate", rate=1, per=60, burst=1)
    assert limiter.try_acquire("first").acquired
    low = limiter.try_acquire("low", priority=0)
    high = limiter.try_acquire("high", priority=2)
    assert (low.position, high.position) == (0, 0)
    status = limiter.status()
    assert [w.holder for w in status.waiters] == ["high", "low"]
    assert status.waiters[0].slot < status.waiters[1].slot
    # "low" was passed: asking again it learns its later slot.
    again = limiter.try_acquire("low")
    assert again.position == 1 and again.retry_after > low.retry_after


def test_rate_limit_newcomer_ahead_of_everyone_is_admitted_when_its_slot_has_come(
    client: turnstile.Client,
) -> None:
    per = 0.5
    limiter = client.rate_limit("prio:rate-now", rate=1, per=per, burst=1)
    assert limiter.try_acquire("first").acquired
    # "slow" joins and does not come back at its slot: an urgent caller that ranks ahead
    # of it and asks once the slot has come is admitted in that very step.
    waiting = limiter.try_acquire("slow", wait_ttl=LONG)
    assert not waiting.acquired
    time.sleep(waiting.retry_after + 0.05)
    assert limiter.try_acquire("urgent", priority=1).acquired
    assert [w.holder for w in limiter.status().waiters] == ["slow"]


@pytest.mark.slow
def test_blocked_processes_are_granted_by_priority(
    backend: BackendUnderTest, client: turnstile.Client, workers: Spawner
) -> None:
    require_processes(backend, "waiting in other processes")
    name = "prio:processes"
    lock = client.lock(name, ttl=LONG)
    held = lock.acquire(timeout=10, holder="holder")
    plan = [("p0", 0), ("p1", 1), ("p2", 0), ("p3", 2), ("p4", 1)]
    started = []
    for holder, priority in plan:
        worker = workers.spawn(
            "wait_grant", label=holder, name=name, limit=1, ttl=30.0, holder=holder,
            hold=0.02, priority=priority,
        )
        worker.wait_for("ready")
        worker.send("go")
        wait_until(lambda h=holder: h in _line(lock), timeout=30, what=f"{holder} in line")
        started.append(worker)
    assert _line(lock) == ["p3", "p1", "p4", "p0", "p2"]
    held.release()
    grants = [w.wait_for("granted", timeout=60) for w in started]
    for w in started:
        w.join()
    by_token = [g["holder"] for g in sorted(grants, key=lambda g: g["token"])]
    assert by_token == ["p3", "p1", "p4", "p0", "p2"]


@pytest.mark.parametrize(
    ("value", "words"),
    [
        (1001, "between -1000 and 1000"),
        (-1001, "between -1000 and 1000"),
        (True, "must be an integer"),
        (1.5, "must be an integer"),
        ("1", "must be an integer"),
        (10**40, "between -1000 and 1000"),
    ],
)
def test_a_bad_priority_is_refused_by_name(
    client: turnstile.Client, value: object, words: str
) -> None:
    with pytest.raises(turnstile.InvalidArgument, match="priority") as caught:
        client.lock("prio:bad", priority=value)  # type: ignore[arg-type]
    assert words in str(caught.value)
    lock = client.lock("prio:bad")
    with pytest.raises(turnstile.InvalidArgument, match=words):
        lock.try_acquire("h", priority=value)  # type: ignore[arg-type]
    with pytest.raises(turnstile.InvalidArgument, match=words):
        client.rate_limit("prio:bad-rate", 1).try_acquire("h", priority=value)  # type: ignore[arg-type]
    assert lock.status().waiters == ()


@pytest.mark.parametrize("value", [0, 0.001, -1, float("nan"), float("inf"), "10", 10**9])
def test_a_bad_ageing_is_refused_by_name(client: turnstile.Client, value: object) -> None:
    with pytest.raises(turnstile.InvalidArgument, match="ageing"):
        client.semaphore("prio:bad-ageing", 2, ageing=value)  # type: ignore[arg-type]
