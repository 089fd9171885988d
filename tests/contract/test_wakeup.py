"""SPEC guarantee 7 (no polling storms): a blocked waiter is woken by the store, only the
waiter a handover admits is woken, and waiting does not burn CPU."""

from __future__ import annotations

import statistics
import time

import pytest

import turnstile
from turnstile._core import timing

from .lock_harness import Spawner, wait_until

# With this ttl a waiter re-asks on its own only every heartbeat (1.7 s): any faster handover
# was a wake-up by the store.
LONG_TTL = 30.0
HEARTBEAT = timing.heartbeat(timing.blocking_wait_ttl(LONG_TTL))


@pytest.mark.slow
def test_waiters_are_woken_by_the_handover(client: turnstile.Client, workers: Spawner) -> None:
    lock = client.lock("wake:chain", ttl=LONG_TTL)
    count = 4
    started = [
        workers.spawn(
            "wait_grant",
            label=f"w{i}",
            name="wake:chain",
            limit=1,
            ttl=LONG_TTL,
            holder=f"w{i}",
            hold=0.0,
        )
        for i in range(count)
    ]
    for w in started:
        w.wait_for("ready")
    with lock.acquire(timeout=10):
        for i, w in enumerate(started):
            w.send("go")
            wait_until(lambda i=i: len(lock.status().waiters) == i + 1, 30, what="in line")
        time.sleep(0.2)  # every waiter is now asleep on its wake-up channel
        released = time.monotonic()
    grants = [w.wait_for("granted", timeout=30) for w in started]
    releases = [w.wait_for("released", timeout=30) for w in started]
    handovers = [grants[0]["t"] - released] + [
        max(0.0, grants[i]["t"] - releases[i - 1]["t"]) for i in range(1, count)
    ]
    assert statistics.median(handovers) < min(0.5, HEARTBEAT / 3), (
        f"handovers {handovers}: waiters were not woken by the store"
    )
    for w in started:
        w.join()


def test_release_wakes_only_the_admitted_waiter(client: turnstile.Client) -> None:
    """The store's work per handover does not grow with the line: one release signals one
    waiter (checked on the backend protocol itself)."""
    backend = client.backend
    name = "wake:one"
    first = backend.acquire(name, "h0", limit=1, ttl=LONG_TTL, wait_ttl=5.0, enqueue=True)
    assert first.grant is not None
    channels = {}
    for h in ("h1", "h2", "h3"):
        channels[h] = backend.open_waiter(name, h)
        r = backend.acquire(name, h, limit=1, ttl=LONG_TTL, wait_ttl=5.0, enqueue=True)
        assert r.grant is None
    try:
        assert backend.release(name, "h0", first.grant.token)
        assert channels["h1"].wait(5.0), "the admitted waiter was not woken"
        assert not channels["h2"].wait(0.3), "a waiter still in line was woken"
        assert not channels["h3"].wait(0.05), "a waiter still in line was woken"
        assert [h.holder for h in backend.status(name).holders] == ["h1"]
    finally:
        for ch in channels.values():
            ch.close()
        for h in ("h1", "h2", "h3"):
            backend.release(name, h, None)


@pytest.mark.slow
def test_waiting_does_not_spin(client: turnstile.Client, workers: Spawner) -> None:
    lock = client.lock("wake:cpu", ttl=LONG_TTL)
    w = workers.spawn(
        "wait_grant", label="waiter", name="wake:cpu", limit=1, ttl=LONG_TTL, holder="waiter"
    )
    w.wait_for("ready")
    with lock.acquire(timeout=10):
        w.send("go")
        wait_until(lambda: lock.status().waiters, 30, what="waiter in line")
        time.sleep(2.0)
    g = w.wait_for("granted", timeout=30)
    assert g["waited"] >= 2.0
    assert g["cpu"] < 0.2 * g["waited"], f"waiting {g['waited']:.2f} s used {g['cpu']:.2f} s CPU"
    w.join()
