"""Semaphore groups (``client.semaphore_group(name, per_key, total)``), on every store: at
most ``per_key`` holders per key and ``total`` in all at every instant; arrival order among
the waiters whose key has room, and a busy key never holds up the keys behind it (no
head-of-line blocking); leases, fencing tokens, crashed holders, priorities and the shape of
a busy name (``LimitConflict``) as for semaphores."""

from __future__ import annotations

import signal
import time
from typing import Any

import pytest

import turnstile
from tests.conftest import BackendUnderTest

from .lock_harness import Spawner, check_bounded, require_processes, wait_until

LONG = 120.0


def _view(group: turnstile.SemaphoreGroup) -> tuple[list[tuple[str, str | None]], list[str]]:
    status = group.status()
    return [(h.holder, h.key) for h in status.holders], [w.holder for w in status.waiters]


def test_a_busy_key_does_not_hold_up_the_keys_behind_it(client: turnstile.Client) -> None:
    group = client.semaphore_group("group:hol", per_key=1, total=3, ttl=LONG)
    assert repr(group) == "<SemaphoreGroup name='group:hol' per_key=1 total=3 ttl=120.0>"
    a1 = group.acquire("tenant-a", timeout=10, holder="a1")
    # tenant-a is at its own limit: a2 waits, and b1 behind it starts at once.
    a2 = group.try_acquire("tenant-a", "a2", wait_ttl=LONG)
    assert (a2.acquired, a2.position) == (False, 0)
    assert group.try_acquire("tenant-b", "b1", wait_ttl=LONG).acquired
    assert not group.try_acquire("tenant-a", "a3", wait_ttl=LONG).acquired
    assert group.try_acquire("tenant-c", "c1", wait_ttl=LONG).acquired
    # The total is reached: d1 waits behind a2 and a3, whatever its key.
    d1 = group.try_acquire("tenant-d", "d1", wait_ttl=LONG)
    assert (d1.acquired, d1.position) == (False, 2)
    status = group.status()
    assert (status.limit, status.per_key, status.free) == (3, 1, 0)
    assert _view(group) == (
        [("a1", "tenant-a"), ("b1", "tenant-b"), ("c1", "tenant-c")],
        ["a2", "a3", "d1"],
    )
    assert [w.key for w in status.waiters] == ["tenant-a", "tenant-a", "tenant-d"]
    # a1 leaves: the first waiter whose key has room is a2 (tenant-a is free again).
    a1.release()
    holders, line = _view(group)
    assert ("a2", "tenant-a") in holders and line == ["a3", "d1"]
    # b1 leaves: tenant-a is full (a2), so d1 goes before a3, who arrived earlier.
    assert group.release("b1")
    holders, line = _view(group)
    assert ("d1", "tenant-d") in holders and line == ["a3"]


def test_per_key_above_one(client: turnstile.Client) -> None:
    group = client.semaphore_group("group:two", per_key=2, total=3, ttl=LONG)
    got = [group.try_acquire("k", f"k{i}", wait_ttl=LONG).acquired for i in range(3)]
    assert got == [True, True, False]
    assert group.try_acquire("j", "j0", wait_ttl=LONG).acquired
    assert not group.try_acquire("j", "j1", wait_ttl=LONG).acquired  # the total
    assert _view(group)[1] == ["k2", "j1"]


def test_the_key_view_is_a_semaphore_for_with_blocks(client: turnstile.Client) -> None:
    group = client.semaphore_group("group:with", per_key=1, total=2, ttl=LONG)
    tenant = group.key("t")
    with tenant as lease:
        assert lease.name == "group:with"
        assert _view(group)[0] == [(lease.holder, "t")]
        assert not group.try_acquire("t", "other", enqueue=False).acquired
        assert group.try_acquire("u", "other", enqueue=False).acquired
    assert _view(group)[0] == [("other", "u")]


def test_priorities_order_the_group_line(client: turnstile.Client) -> None:
    group = client.semaphore_group("group:prio", per_key=1, total=1, ttl=LONG)
    group.acquire("x", timeout=10, holder="first")
    group.try_acquire("a", "low", wait_ttl=LONG)
    group.try_acquire("b", "high", wait_ttl=LONG, priority=3)
    assert _view(group)[1] == ["high", "low"]


def test_a_busy_name_keeps_its_shape(client: turnstile.Client) -> None:
    group = client.semaphore_group("group:shape", per_key=1, total=2, ttl=LONG)
    group.acquire("a", timeout=10, holder="h")
    with pytest.raises(turnstile.LimitConflict, match="semaphore group of per_key=1 total=2"):
        client.semaphore("group:shape", 2).try_acquire("s")
    with pytest.raises(turnstile.LimitConflict, match="asked for a semaphore group of per_key=2"):
        client.semaphore_group("group:shape", 2, 2).try_acquire("k", "g")
    with pytest.raises(turnstile.LimitConflict):
        client.semaphore_group("group:shape", 1, 5).try_acquire("k", "g")
    plain = client.semaphore("group:plain", 2, ttl=LONG)
    plain.acquire(timeout=10, holder="p")
    with pytest.raises(turnstile.LimitConflict, match="is a semaphore of limit 2"):
        client.semaphore_group("group:plain", 1, 2).try_acquire("k", "g")
    # Once idle, a name takes the next caller's shape.
    group.release("h")
    assert client.semaphore("group:shape", 2).try_acquire("s").acquired


@pytest.mark.parametrize(
    ("call", "words"),
    [
        (lambda c: c.semaphore_group("g", 0, 2), "per_key must be between 1 and 1000000"),
        (lambda c: c.semaphore_group("g", 1, 0), "total must be between 1 and 1000000"),
        (lambda c: c.semaphore_group("g", 1.5, 2), "per_key must be an integer"),
        (lambda c: c.semaphore_group("g", 1, 2).key(""), "key must be 1 to 1024 bytes"),
        (lambda c: c.semaphore_group("g", 1, 2).key(7), "key must be a string"),
        (lambda c: c.semaphore_group("g", 1, 2).key("a\x00b"), "key must not contain NUL"),
        (lambda c: c.semaphore_group("g", 1, 2).key("x" * 1025), "key must be 1 to 1024"),
        (lambda c: c.semaphore_group("g", 1, 2).try_acquire("k", ""), "holder"),
    ],
)
def test_bad_arguments_are_named(client: turnstile.Client, call: Any, words: str) -> None:
    with pytest.raises(turnstile.InvalidArgument, match=words):
        call(client)


@pytest.mark.slow
def test_processes_never_exceed_per_key_or_total(
    backend: BackendUnderTest, client: turnstile.Client, workers: Spawner
) -> None:
    name, per_key, total = "group:safety", 1, 2
    started = [
        workers.spawn(
            "group_critical", label=f"{key}{i}", name=name, key=key, per_key=per_key,
            total=total, ttl=10.0, iterations=4, hold=0.02,
        )
        for key in ("a", "b", "c")
        for i in range(2)
    ]
    for w in started:
        w.wait_for("ready")
    for w in started:
        w.send("go")
    for w in started:
        w.wait_for("done", timeout=120)
        w.join()
    intervals = [iv for w in started for iv in w.all("interval")]
    assert len(intervals) == 6 * 4 and not any(iv["lost"] for iv in intervals)
    check_bounded(intervals, total)
    for key in ("a", "b", "c"):
        check_bounded([iv for iv in intervals if iv["key"] == key], per_key)


@pytest.mark.slow
def test_a_killed_holder_frees_its_key_when_its_lease_expires(
    backend: BackendUnderTest, client: turnstile.Client, workers: Spawner
) -> None:
    require_processes(backend, "kill -9")
    ttl = 2.0
    name = "group:crash"
    holder = workers.spawn(
        "hold", label="holder", name=name, limit=2, ttl=ttl, holder="doomed", key="a", per_key=1
    )
    held = holder.wait_for("holding")
    group = client.semaphore_group(name, per_key=1, total=2, ttl=ttl)
    waiting = group.try_acquire("a", "next", wait_ttl=LONG)
    assert not waiting.acquired
    holder.signal(signal.SIGKILL)
    killed = time.monotonic()
    lease = group.acquire("a", timeout=ttl * 10, holder="next")
    # Granted once the dead holder's lease ran out (at most ttl after the kill, plus the
    # store's step), with a larger token.
    assert lease.token > held["token"]
    assert time.monotonic() - killed <= ttl * 10
    assert _view(group)[0] == [("next", "a")]
    lease.release()
    wait_until(lambda: group.status().holders == (), timeout=10, what="released")


@pytest.mark.slow
def test_a_paused_holder_is_replaced_and_learns_it_lost(
    backend: BackendUnderTest, client: turnstile.Client, workers: Spawner
) -> None:
    require_processes(backend, "SIGSTOP of the holding process")
    ttl = 3.0
    name = "group:pause"
    victim = workers.spawn(
        "hold", label="victim", name=name, limit=2, ttl=ttl, holder="victim", key="a", per_key=1
    )
    held = victim.wait_for("holding")
    victim.signal(signal.SIGSTOP)  # teardown sends SIGCONT should an assertion fail first
    group = client.semaphore_group(name, per_key=1, total=2, ttl=ttl)
    # Another key is not held up meanwhile.
    assert group.try_acquire("b", "other").acquired
    with group.acquire("a", timeout=ttl * 10, holder="successor") as lease:
        assert lease.token > held["token"]
        victim.signal(signal.SIGCONT)
        victim.send("finish")
        assert victim.wait_for("finishing", timeout=30)["lost"] is True
        assert victim.wait_for("exit", timeout=30)["raised"] == "LeaseLost"
        holders = {(h.holder, h.key) for h in group.status().holders}
        assert ("successor", "a") in holders and ("victim", "a") not in holders
    victim.join()


@pytest.mark.slow
def test_a_killed_waiter_loses_its_place_and_the_key_moves_on(
    backend: BackendUnderTest, client: turnstile.Client, workers: Spawner
) -> None:
    require_processes(backend, "kill -9 of a waiting process")
    ttl = 2.0  # a blocked acquire keeps its place by asking every ttl / 3
    name = "group:dead-waiter"
    group = client.semaphore_group(name, per_key=1, total=2, ttl=LONG)
    first = group.acquire("a", timeout=10, holder="first")
    doomed = workers.spawn(
        "hold", label="doomed", name=name, limit=2, ttl=ttl, holder="doomed", key="a", per_key=1
    )
    wait_until(lambda: "doomed" in [w.holder for w in group.status().waiters], 30, what="line")
    doomed.signal(signal.SIGKILL)
    later = group.try_acquire("a", "later", wait_ttl=LONG)
    assert later.position == 1
    # The dead waiter's entry lapses (it stops asking); the key's next grant goes to "later".
    first.release()
    lease = group.acquire("a", timeout=ttl * 15, holder="later")
    assert lease.token > first.token
    assert [(h.holder, h.key) for h in group.status().holders] == [("later", "a")]
