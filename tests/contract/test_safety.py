"""SPEC guarantee 1 (safety): never more than ``limit`` holders of a name at once, checked
from intervals and tokens recorded by at least 8 competing processes."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest

import turnstile
from tests.conftest import BackendUnderTest

from .lock_harness import Spawner, check_bounded, check_exclusive, max_concurrency

WORKERS = 8


def _run(workers: Spawner, count: int, **params: Any) -> list[dict[str, Any]]:
    """Start ``count`` contenders (half of them on the async API when each has its own
    process), release them together, and return every recorded interval."""
    started = []
    for i in range(count):
        scenario = "async_critical" if workers.processes and i % 2 else "critical"
        started.append(workers.spawn(scenario, label=f"{scenario}#{i}", **params))
    for w in started:
        w.wait_for("ready")
    for w in started:
        w.send("go")
    intervals: list[dict[str, Any]] = []
    for w in started:
        w.wait_for("done", timeout=120)
        mine = w.all("interval")
        assert len(mine) == params["iterations"]
        intervals += mine
    assert not [iv for iv in intervals if iv["lost"]], "a lease was lost during a short hold"
    return intervals


@pytest.mark.slow
def test_lock_sections_never_overlap(
    backend: BackendUnderTest, workers: Spawner, tmp_path: Path
) -> None:
    counter = tmp_path / "counter"
    counter.write_text("0")
    iterations = 4
    intervals = _run(
        workers,
        WORKERS,
        name="safety:lock",
        limit=1,
        ttl=2.0,
        iterations=iterations,
        hold=0.005,
        counter=str(counter),
    )
    assert len(intervals) == WORKERS * iterations
    check_exclusive(intervals)
    # The racy read-modify-write inside the section lost no update.
    assert int(counter.read_text()) == WORKERS * iterations


@pytest.mark.slow
def test_semaphore_bound_kept_and_used(
    backend: BackendUnderTest, client: turnstile.Client, workers: Spawner
) -> None:
    limit = 3
    sem = client.semaphore("safety:sem", limit, ttl=2.0)
    seen: list[int] = []
    stop = threading.Event()

    def sample() -> None:  # the store's own view, on the store's clock, while they contend
        while not stop.wait(0.01):
            seen.append(len(sem.status().holders))

    sampler = threading.Thread(target=sample)
    sampler.start()
    try:
        intervals = _run(
            workers, WORKERS, name="safety:sem", limit=limit, ttl=2.0, iterations=3, hold=0.2
        )
    finally:
        stop.set()
        sampler.join(10)
    peak = check_bounded(intervals, limit)
    assert peak == limit, f"the semaphore never ran {limit} holders in parallel (peak {peak})"
    assert seen and max(seen) <= limit
    assert limit in seen


def test_semaphore_bound_under_renewal(client: turnstile.Client) -> None:
    """Holders that keep renewing (hold > ttl) still never exceed the limit, and none is lost."""

    ttl = 3.0  # renewed every second: a renewal may be two seconds late before it is lost
    sem = client.semaphore("safety:renewing", 2, ttl=ttl)
    intervals: list[dict[str, Any]] = []
    lock = threading.Lock()

    def run() -> None:
        asked = time.monotonic()
        with sem.acquire(timeout=60) as lease:
            start = time.monotonic()
            time.sleep(ttl + 0.5)  # more than a ttl: only renewal keeps the lease
            lost = lease.lost
            end = time.monotonic()
        with lock:
            intervals.append(
                {"asked": asked, "start": start, "end": end, "token": lease.token, "lost": lost}
            )

    threads = [threading.Thread(target=run) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert len(intervals) == 4
    assert not any(iv["lost"] for iv in intervals)
    assert check_bounded(intervals, 2) == 2
    assert max_concurrency(intervals) == 2
