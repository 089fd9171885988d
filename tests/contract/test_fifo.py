"""SPEC guarantee 2 (FIFO): waiters are granted in the order they first asked; a waiter that
stops asking loses its place once its waiting entry expires."""

from __future__ import annotations

import signal
import time
from typing import Any

import pytest

import turnstile
from tests.conftest import BackendUnderTest

from .lock_harness import Spawner, Worker, require_processes, wait_until

WAITERS = 6
# A live waiter keeps its place by asking again every third of its wait_ttl (= ttl here): it
# would have to stall for two thirds of it to lose its place.
WAITER_TTL = 10.0


def _queue_up(
    client: turnstile.Client, workers: Spawner, name: str, limit: int, ttl: float, count: int
) -> list[Worker]:
    """Start ``count`` waiters and let each ask only after the previous one is in line, so
    the order in which they first asked is known: w0, w1, ..."""
    sem = client.semaphore(name, limit, ttl)
    started = [
        workers.spawn(
            "wait_grant", label=f"w{i}", name=name, limit=limit, ttl=ttl, holder=f"w{i}", hold=0.02
        )
        for i in range(count)
    ]
    for w in started:
        w.wait_for("ready")
    for i, w in enumerate(started):
        w.send("go")
        wait_until(
            lambda i=i: f"w{i}" in [x.holder for x in sem.status().waiters],
            timeout=30,
            what=f"w{i} in line",
        )
    line = sem.status().waiters
    assert [x.holder for x in line] == [f"w{i}" for i in range(count)]
    assert [x.position for x in line] == list(range(count))
    return started


def _grant_order(started: list[Worker], limit: int) -> list[str]:
    """Holders in the order they were granted (tokens strictly increase with grants)."""
    grants = [w.wait_for("granted", timeout=60) for w in started]
    by_token = [g["holder"] for g in sorted(grants, key=lambda g: g["token"])]
    assert len({g["token"] for g in grants}) == len(grants)
    if limit == 1:  # one at a time: the order in which they ran is the order of their tokens
        by_time = [g["holder"] for g in sorted(grants, key=lambda g: g["t"])]
        assert by_token == by_time, "grants were not issued with increasing tokens"
    for w in started:
        w.join()
    return by_token


@pytest.mark.slow
def test_lock_grants_in_arrival_order(client: turnstile.Client, workers: Spawner) -> None:
    lock = client.lock("fifo:lock", ttl=WAITER_TTL)
    with lock.acquire(timeout=10, holder="first"):
        started = _queue_up(client, workers, "fifo:lock", 1, WAITER_TTL, WAITERS)
        time.sleep(0.1)
        assert not any(w.all("granted") for w in started), "granted while the lock was held"
    assert _grant_order(started, 1) == [f"w{i}" for i in range(WAITERS)]


@pytest.mark.slow
def test_semaphore_grants_in_arrival_order(client: turnstile.Client, workers: Spawner) -> None:
    sem = client.semaphore("fifo:sem", 2, ttl=WAITER_TTL)
    a = sem.acquire(timeout=10, holder="a")
    b = sem.acquire(timeout=10, holder="b")
    with a, b:
        started = _queue_up(client, workers, "fifo:sem", 2, WAITER_TTL, WAITERS)
    assert _grant_order(started, 2) == [f"w{i}" for i in range(WAITERS)]


@pytest.mark.slow
def test_killed_waiter_loses_its_place(
    backend: BackendUnderTest, client: turnstile.Client, workers: Spawner
) -> None:
    """kill -9 of a waiter in the middle of the line: the waiters behind it are still served,
    in order, soon after ``wait_ttl`` (here = ttl) past the handover it would have got."""
    require_processes(backend, "kill -9 of a waiting process")
    ttl = 3.0  # the live waiters ask every second: they keep their places however loaded
    lock = client.lock("fifo:dead", ttl=ttl)
    with lock.acquire(timeout=10, holder="first"):
        w0, w1, w2 = _queue_up(client, workers, "fifo:dead", 1, ttl, 3)
        w1.signal(signal.SIGKILL)
        assert isinstance(w1.pid, int)
    g0 = w0.wait_for("granted", timeout=30)
    r0 = w0.wait_for("released", timeout=30)
    g2 = w2.wait_for("granted", timeout=30)
    assert g0["token"] < g2["token"]
    stalled = g2["t"] - r0["t"]
    assert stalled <= 2 * ttl, f"the dead waiter blocked the line for {stalled:.2f} s"
    assert not w1.all("granted")
    assert "w1" not in [h.holder for h in lock.status().holders]


def test_status_reports_holders_and_line(client: turnstile.Client) -> None:
    ttl = 120.0  # a and b are not renewed: they last the whole test
    sem = client.semaphore("fifo:status", 2, ttl=ttl)
    a = sem.acquire(timeout=5, holder="a")
    b = sem.acquire(timeout=5, holder="b")
    for h in ("x", "y", "z"):
        assert not sem.try_acquire(h).acquired
    st = sem.status()
    assert st.name == "fifo:status"
    assert st.limit == 2
    assert st.free == 0
    assert [(h.holder, h.token) for h in st.holders] == [("a", a.token), ("b", b.token)]
    for h in st.holders:
        assert h.acquired_at <= st.now < h.expires_at
        assert h.expires_at - h.acquired_at == pytest.approx(ttl, abs=0.05)
    assert [(w.holder, w.position) for w in st.waiters] == [("x", 0), ("y", 1), ("z", 2)]
    assert [w.joined_at for w in st.waiters] == sorted(w.joined_at for w in st.waiters)
    d: dict[str, Any] = st.to_dict()
    assert [h["holder"] for h in d["holders"]] == ["a", "b"]
    assert [w["holder"] for w in d["waiters"]] == ["x", "y", "z"]
    # status of the client and of the primitive agree
    assert client.status("fifo:status").holders == st.holders
    assert "fifo:status" in client.names("fifo:")
    for h in ("x", "y", "z"):
        sem.release(h)
    a.release()
    b.release()
    st = sem.status()
    assert st.holders == () and st.waiters == ()
    assert "fifo:status" not in client.names("fifo:")
