"""A PostgreSQL restart (clean, and a crash with recovery) while leases are held and waiters
wait: nothing is lost. Holders keep their tokens and expiry, waiters their order, a lease
renewed in a ``with`` block rides through, a blocked ``acquire`` gets its turn, and tokens
issued afterwards are larger than every earlier one."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

import turnstile

from ._cluster import Cluster
from ._util import schema_url, unique

pytestmark = [pytest.mark.postgres, pytest.mark.slow]


@pytest.mark.parametrize("mode", ["fast", "immediate"])
def test_restart_loses_nothing(pg_cluster: Cluster, mode: str) -> None:
    url = schema_url(pg_cluster.url, unique(), retry_timeout="60")
    client = turnstile.connect(url)
    try:
        sem = client.semaphore("restart:sem", limit=2, ttl=120)
        for holder in ("h1", "h2"):
            assert sem.try_acquire(holder).acquired
        for holder in ("w1", "w2", "w3"):
            assert not sem.try_acquire(holder, wait_ttl=120).acquired
        before = sem.status()
        assert [w.holder for w in before.waiters] == ["w1", "w2", "w3"]

        # A lease kept renewed by its with-block, and a blocked acquire waiting behind it.
        lock = client.lock("restart:lock", ttl=6)
        lease = lock.acquire()
        lease.__enter__()
        got: dict[str, Any] = {}

        def blocked() -> None:
            try:
                with lock.acquire(timeout=90) as second:
                    got["token"] = second.token
            except BaseException as exc:
                got["error"] = exc

        thread = threading.Thread(target=blocked)
        thread.start()
        deadline = time.monotonic() + 20
        while not lock.status().waiters:
            assert time.monotonic() < deadline, "the blocked acquire never joined the line"
            time.sleep(0.01)

        pg_cluster.restart(mode)

        after = sem.status()
        assert [(h.holder, h.token, h.acquired_at, h.expires_at) for h in after.holders] == [
            (h.holder, h.token, h.acquired_at, h.expires_at) for h in before.holders
        ]
        assert [(w.holder, w.joined_at) for w in after.waiters] == [
            (w.holder, w.joined_at) for w in before.waiters
        ]
        assert after.limit == 2

        time.sleep(2.5)  # past a renewal (every ttl/3 = 2 s), which had to reach the new server
        assert not lease.lost
        lease.renew()
        assert lock.status().waiters, "the blocked acquire lost its place"
        lease.__exit__(None, None, None)
        thread.join(30)
        assert "error" not in got, got.get("error")
        assert got["token"] > lease.token

        # Hand-overs go on in order, with tokens above every earlier one.
        highest = max(h.token for h in before.holders)
        assert sem.release("h1")
        ticket = sem.try_acquire("w1")
        assert ticket.acquired and ticket.lease is not None
        assert ticket.lease.token > highest
        assert [w.holder for w in sem.status().waiters] == ["w2", "w3"]
    finally:
        client.close()


def test_stopped_server_fails_cleanly_then_recovers(pg_cluster: Cluster) -> None:
    """While the server is down an operation fails with BackendUnavailable (after its
    retry_timeout), never a psycopg exception; once it is back the same client works."""
    client = turnstile.connect(schema_url(pg_cluster.url, unique(), retry_timeout="0.5"))
    try:
        sem = client.semaphore("down", limit=1, ttl=30)
        assert sem.try_acquire("a").acquired
        pg_cluster.stop("fast")
        try:
            started = time.monotonic()
            with pytest.raises(turnstile.BackendUnavailable) as info:
                sem.try_acquire("b")
            assert time.monotonic() - started < 5
            assert info.value.__cause__ is not None
            assert "psycopg" in type(info.value.__cause__).__module__
        finally:
            pg_cluster.start()
        assert [h.holder for h in sem.status().holders] == ["a"]
        assert not sem.try_acquire("b").acquired
    finally:
        client.close()
