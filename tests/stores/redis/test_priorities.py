"""Priorities on Redis (lua/lock/acquire.lua, lua/rate/acquire.lua; _core/ranking.py): a
new waiter ranks at its arrival stamp less priority x level, so a larger priority is served
first and one level FIFO; with ``ageing``, a waiter that has waited ``ageing`` seconds ranks
with a newcomer one level above. Each scenario runs on the memory backend (the model) too.

Orders that depend on how long someone waited are derived from the stamps the store
reports (``joined_at``), never from how long the test slept, so a busy machine changes
which case a step falls in, never the verdict; only waits the test makes longer than the
ageing (a sleep is never shorter) are asserted outright.
"""

from __future__ import annotations

import os
import secrets
import time
from collections.abc import Iterator

import pytest
import redis

import turnstile
from turnstile._core import ranking
from turnstile.stores.redis import keys as redis_keys

pytestmark = pytest.mark.redis

AGEING = 0.3
# (holder, priority) in order of arrival, and the line they make: by priority, then arrival.
ARRIVALS = [("a", 0), ("b", 1), ("c", 0), ("d", 2), ("e", 1), ("f", -1), ("g", 2), ("h", 0)]
EXPECTED = ["d", "g", "b", "e", "a", "c", "h", "f"]


def _server() -> str:
    url = os.environ.get("TURNSTILE_TEST_REDIS_URL")
    if not url:
        if os.environ.get("CI"):
            pytest.fail("TURNSTILE_TEST_REDIS_URL is not set under CI")
        pytest.skip("TURNSTILE_TEST_REDIS_URL is not set (scripts/dev.py test sets it)")
    return url


@pytest.fixture(params=["memory", "redis"])
def client(request: pytest.FixtureRequest) -> Iterator[turnstile.Client]:
    if request.param == "memory":
        c = turnstile.connect("memory://")
        yield c
        c.close()
        return
    prefix = f"tt-prio-{secrets.token_hex(4)}:"
    c = turnstile.connect(f"{_server()}?prefix={prefix}")
    try:
        yield c
    finally:
        c.close()
        _cleanup(prefix)


def _cleanup(prefix: str) -> None:
    admin = redis.Redis.from_url(_server())
    for key in list(admin.scan_iter(match=f"{prefix}*", count=1000)):
        admin.delete(key)
    admin.close()


def _position(i: int) -> int:
    """Where the i-th arrival joins: behind everyone already there of its priority or more."""
    return sum(p >= ARRIVALS[i][1] for _, p in ARRIVALS[:i])


def _expected(joined: dict[str, float], leads: dict[str, int]) -> list[str]:
    """The line the ranks make: by stamp - lead (no two equal here), as the model orders."""
    return sorted(joined, key=lambda h: (ranking.stamp_of(joined[h]) - leads[h], joined[h]))


def test_lock_line_is_by_priority_then_arrival(client: turnstile.Client) -> None:
    lock = client.lock("prio", ttl=60)
    first = lock.try_acquire(holder="first")
    assert first.lease is not None
    for i, (holder, priority) in enumerate(ARRIVALS):
        ticket = lock.try_acquire(holder=holder, priority=priority)
        assert ticket.position == _position(i), holder
    # Asking again keeps the place, whatever priority it names.
    assert lock.try_acquire(holder="f", priority=5).position == len(EXPECTED) - 1
    assert lock.try_acquire(holder="d", priority=-5).position == 0
    status = lock.status()
    assert [w.holder for w in status.waiters] == EXPECTED
    assert [w.position for w in status.waiters] == list(range(len(EXPECTED)))
    joined = {w.holder: w.joined_at for w in status.waiters}
    assert [joined[h] for h, _ in ARRIVALS] == sorted(joined.values())  # arrival stamps
    # Grants follow the line.
    lease = first.lease
    for holder in EXPECTED:
        lease.release()
        ticket = lock.try_acquire(holder=holder)
        assert ticket.lease is not None, holder
        lease = ticket.lease
    lease.release()


def test_semaphore_grants_a_higher_priority_first(client: turnstile.Client) -> None:
    sem = client.semaphore("prio-sem", 2, ttl=60)
    held = [sem.try_acquire(holder=h).lease for h in ("x", "y")]
    assert sem.try_acquire(holder="low", priority=-1).position == 0
    assert sem.try_acquire(holder="mid").position == 0
    assert sem.try_acquire(holder="top", priority=3).position == 0
    assert sem.try_acquire(holder="mid2").position == 2
    assert [w.holder for w in sem.status().waiters] == ["top", "mid", "mid2", "low"]
    for lease in held:
        assert lease is not None
        lease.release()
    assert {h.holder for h in sem.status().holders} == {"top", "mid"}


def test_lock_ageing_lets_a_long_wait_rank_ahead_of_a_higher_priority(
    client: turnstile.Client,
) -> None:
    lock = client.lock("aged", ttl=60, ageing=AGEING)
    first = lock.try_acquire(holder="first")
    assert first.lease is not None
    leads = {"old": 0, "new": ranking.lead(1, AGEING)}
    lock.try_acquire(holder="old")
    time.sleep(AGEING * 1.5)  # never shorter: "old" has waited more than a level
    lock.try_acquire(holder="new", priority=1)
    # Two steps back to back: "eager" usually passes "fresh" (decided by their stamps).
    leads |= {"fresh": 0, "eager": ranking.lead(1, AGEING)}
    lock.try_acquire(holder="fresh")
    lock.try_acquire(holder="eager", priority=1)
    status = lock.status()
    line = [w.holder for w in status.waiters]
    joined = {w.holder: w.joined_at for w in status.waiters}
    assert joined["new"] - joined["old"] > AGEING
    assert line.index("old") < line.index("new")
    assert line == _expected(joined, leads), (line, joined)
    if joined["eager"] - joined["fresh"] < AGEING:
        assert line.index("eager") < line.index("fresh")


def test_rate_line_is_by_priority_then_arrival(client: turnstile.Client) -> None:
    limiter = client.rate_limit("prio-rate", rate=1, per=600.0)  # one slot per 10 minutes
    assert limiter.try_acquire("first").acquired
    for i, (holder, priority) in enumerate(ARRIVALS):
        ticket = limiter.try_acquire(holder, priority=priority)
        assert not ticket.acquired
        assert ticket.position == _position(i), holder
    assert limiter.try_acquire("f", priority=5).position == len(EXPECTED) - 1
    status = limiter.status()
    assert [w.holder for w in status.waiters] == EXPECTED
    slots = [w.slot for w in status.waiters]
    assert slots == sorted(slots)
    joined = {w.holder: w.joined_at for w in status.waiters}
    assert [joined[h] for h, _ in ARRIVALS] == sorted(joined.values())


def test_rate_ageing_lets_a_long_wait_rank_ahead(client: turnstile.Client) -> None:
    limiter = client.rate_limit("aged-rate", rate=1, per=600.0, ageing=AGEING)
    assert limiter.try_acquire("first").acquired
    leads = {"old": 0, "new": ranking.lead(1, AGEING)}
    limiter.try_acquire("old")
    time.sleep(AGEING * 1.5)
    limiter.try_acquire("new", priority=1)
    leads |= {"fresh": 0, "eager": ranking.lead(1, AGEING)}
    limiter.try_acquire("fresh")
    limiter.try_acquire("eager", priority=1)
    status = limiter.status()
    line = [w.holder for w in status.waiters]
    joined = {w.holder: w.joined_at for w in status.waiters}
    assert joined["new"] - joined["old"] > AGEING
    assert line.index("old") < line.index("new")
    assert line == _expected(joined, leads), (line, joined)
    if joined["eager"] - joined["fresh"] < AGEING:
        assert line.index("eager") < line.index("fresh")


def test_rate_newcomer_ahead_of_a_late_head_is_admitted_at_once(
    client: turnstile.Client,
) -> None:
    per = 0.3
    limiter = client.rate_limit("late-head", rate=1, per=per)
    assert limiter.try_acquire("first").acquired
    head = limiter.try_acquire("head", wait_ttl=60)
    assert head.position == 0
    time.sleep(head.retry_after + 0.05)  # the head's slot has come; it has not come back
    # A newcomer of its priority goes behind it: the order is kept.
    assert limiter.try_acquire("same", wait_ttl=60).position == 1
    # One of a higher priority ranks ahead of everyone, and its slot has come: admitted.
    vip = limiter.try_acquire("vip", wait_ttl=60, priority=1)
    assert vip.acquired and vip.position is None
    assert [w.holder for w in limiter.status().waiters] == ["head", "same"]
    # The head learns its later slot when it comes back (unless a stall outlasted it).
    again = limiter.try_acquire("head", wait_ttl=60)
    if again.now < vip.now + per - 0.01:
        assert not again.acquired and again.position == 0 and again.retry_after > 0
    assert limiter.leave("same")


def test_equal_ranks_are_served_in_arrival_order_on_redis() -> None:
    """Two waiters of different leads can rank equal (to the microsecond), and a sorted set
    orders equal scores by member: the later one arrives 1 us later instead. Forced here by
    moving the name's newest stamp ahead of the clock, so the stamps are known."""
    prefix = f"tt-prio-tie-{secrets.token_hex(4)}:"
    client = turnstile.connect(f"{_server()}?prefix={prefix}")
    backend = client.backend
    admin = redis.Redis.from_url(_server())
    try:
        start = int(time.time() * 1_000_000) + 60_000_000
        step = {"ttl": 60.0, "wait_ttl": 60.0, "ageing": 1e-6}  # lead = priority, in us
        assert backend.acquire("tie", "first", limit=1, enqueue=True, **step).grant is not None
        base = redis_keys.key_base(prefix, "tie")
        admin.hset(base + "d", "=seq", str(start))
        # ranks: start+1; start+2-1 = start+1 (taken: stamp start+3, rank start+2);
        # start+4-2 = start+2 (taken: stamp start+5, rank start+3); start+6.
        for holder, priority in [("zz", 0), ("aa", 1), ("mm", 2), ("bb", 0)]:
            backend.acquire("tie", holder, limit=1, enqueue=True, priority=priority, **step)
        status = backend.status("tie")
        assert [w.holder for w in status.waiters] == ["zz", "aa", "mm", "bb"]
        assert [ranking.stamp_of(w.joined_at) - start for w in status.waiters] == [1, 3, 5, 6]

        rate = {"rate": 1, "per": 600.0, "burst": 1, "grace": 60.0, "ageing": 1e-6}
        assert backend.rate_acquire("tie", "first", enqueue=True, **rate).admitted
        admin.hset(base + "r:m", "=seq", str(start))
        for holder, priority in [("zz", 0), ("aa", 1), ("mm", 2), ("bb", 0)]:
            backend.rate_acquire("tie", holder, enqueue=True, priority=priority, **rate)
        rate_status = backend.rate_status("tie")
        assert [w.holder for w in rate_status.waiters] == ["zz", "aa", "mm", "bb"]
        joined = [ranking.stamp_of(w.joined_at) - start for w in rate_status.waiters]
        assert joined == [1, 3, 5, 6]
    finally:
        client.close()
        admin.close()
        _cleanup(prefix)
