"""Through PgBouncer in transaction mode (2 server connections for many clients, no
prepared statements in PgBouncer 1.18): no session state is relied on, so locks stay safe,
fair and fenced. LISTEN goes to the server directly (``listen_url``), or is off (polling)."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from typing import Any

import pytest

import turnstile

from ._cluster import Bouncer, Cluster
from ._util import check_intervals, schema_url, spawn_worker, unique

pytestmark = [pytest.mark.postgres, pytest.mark.slow]

WORKERS = 4
ITERATIONS = 15
TTL = 4.0


@pytest.fixture
def bouncer(pg_cluster: Cluster) -> Iterator[Bouncer]:
    b = Bouncer(pg_cluster)
    try:
        yield b
    finally:
        b.close()


@pytest.mark.parametrize("listen", ["listen_url", "off"])
def test_locks_through_a_transaction_pooler(
    pg_cluster: Cluster, bouncer: Bouncer, listen: str
) -> None:
    uid = unique()
    params = {"listen_url": pg_cluster.url} if listen == "listen_url" else {"listen": "off"}
    url = schema_url(bouncer.url, uid, **params)
    procs = [
        spawn_worker({"url": url, "name": "pooled", "iterations": ITERATIONS, "ttl": TTL,
                      "hold": 0.002})
        for _ in range(WORKERS)
    ]
    events: list[dict[str, Any]] = []
    try:
        for p in procs:
            out, err = p.communicate(timeout=180)
            events += [json.loads(line) for line in out.splitlines()]
            assert p.returncode == 0, err[-3000:]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    assert sum(e["event"] == "held" for e in events) == WORKERS * ITERATIONS
    check_intervals(events, TTL)

    # FIFO and tickets through the pooler too.
    client = turnstile.connect(url)
    try:
        sem = client.semaphore("pooled:sem", limit=2, ttl=30)
        assert [sem.try_acquire(h).acquired for h in "abcde"] == [True, True, False, False, False]
        assert [w.holder for w in sem.status().waiters] == ["c", "d", "e"]
        got: list[str] = []

        def wait(holder: str) -> None:
            with sem.acquire(timeout=30, holder=holder):
                got.append(holder)

        # c, d and e wait by blocking (their places are kept by the same holder ids).
        threads = [threading.Thread(target=wait, args=(h,)) for h in "cde"]
        for t in threads:
            t.start()
        assert sem.release("a") and sem.release("b")
        for t in threads:
            t.join(60)
        assert sorted(got) == ["c", "d", "e"] and got[0] in "cd"
    finally:
        client.close()


def test_prepared_statements_through_a_pooler_without_support_for_them(
    pg_cluster: Cluster, bouncer: Bouncer
) -> None:
    """PgBouncer 1.18 in transaction mode does not track prepared statements: a statement
    prepared in one transaction may be executed in the next on another server connection.
    With names hashed from the text (prepare=on, the default) a statement found there is
    ours; one missing, or already there, is prepared again or adopted and sent again
    (stores/postgres/prepared.py). Three clients of 3 connections each over 2 server
    connections, interleaving every kind of statement: every reply is right. (Runs of this
    test met 15 to 20 misses per client, each handled as described.)"""
    uid = unique()
    url = schema_url(bouncer.url, uid, listen="off", pool_min="3", pool_max="3")
    clients = [turnstile.connect(url) for _ in range(3)]
    errors: list[BaseException] = []
    try:
        def work(client: turnstile.Client, me: int) -> None:
            try:
                lock = client.lock(f"prep:{me}", ttl=30)
                sem = client.semaphore("prep:shared", limit=2, ttl=30)
                queue = client.queue(f"prep:q{me}")
                last = 0
                for i in range(25):
                    lease = lock.acquire(timeout=30)
                    assert lease.token > last
                    last = lease.token
                    assert [h.holder for h in lock.status().holders] == [lease.holder]
                    lease.renew()  # raises LeaseLost if the renewal found no lease
                    with sem.acquire(timeout=30):
                        queue.put({"i": i})
                        message = queue.get(timeout=5)
                        assert message is not None and message.payload == {"i": i}
                        message.ack()
                    assert lease.release() is True
                    assert not lock.status().holders
            except BaseException as exc:  # reported below
                errors.append(exc)

        threads = [
            threading.Thread(target=work, args=(c, n)) for n, c in enumerate(clients)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert not errors, errors
    finally:
        for c in clients:
            c.close()
