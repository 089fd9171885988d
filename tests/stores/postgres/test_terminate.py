"""Backend connections killed mid-operation with pg_terminate_backend (only this test's own,
found by application_name): workers keep taking a lock in turn with no overlap, no repeated or
decreasing token, and no grant that nobody learned of (the line would stall for a ttl)."""

from __future__ import annotations

import json
import os
import random
import threading
import time
from typing import Any

import psycopg
import pytest

from ._cluster import Cluster
from ._util import check_intervals, schema_url, spawn_worker, unique

pytestmark = [pytest.mark.postgres, pytest.mark.slow]

WORKERS = 4
ITERATIONS = 100
TTL = 4.0


def test_killed_connections_lose_no_grant_and_grant_nothing_twice(pg_cluster: Cluster) -> None:
    uid = unique()
    app = f"ttkill-{uid}"
    url = schema_url(pg_cluster.url, uid, application_name=app, retry_timeout="20")
    procs = [
        spawn_worker({"url": url, "name": "killed", "iterations": ITERATIONS, "ttl": TTL,
                      "hold": 0.003})
        for _ in range(WORKERS)
    ]
    events: list[dict[str, Any]] = []
    lock = threading.Lock()

    def read(proc: Any) -> None:
        for line in proc.stdout:
            with lock:
                events.append(json.loads(line))

    readers = [threading.Thread(target=read, args=(p,), daemon=True) for p in procs]
    for r in readers:
        r.start()
    kills: dict[str, int] = {"active": 0, "idle": 0, "listen": 0}
    rng = random.Random(7)
    try:
        # Connecting is not retried (an unreachable server fails at once): start killing
        # once every worker is connected.
        deadline = time.monotonic() + 60
        while sum(e["event"] == "ready" for e in list(events)) < WORKERS:
            assert time.monotonic() < deadline and all(p.poll() is None for p in procs), (
                f"workers did not start: {events} "
                f"{[p.stderr.read() for p in procs if p.poll() is not None]}"
            )
            time.sleep(0.02)
        with psycopg.connect(pg_cluster.url, autocommit=True) as admin:
            deadline = time.monotonic() + float(os.environ.get("TT_KILL_LIMIT", "240"))
            while any(p.poll() is None for p in procs):
                assert time.monotonic() < deadline, (
                    f"workers did not finish: {sum(e['event'] == 'held' for e in events)} "
                    f"critical sections, kills {kills}"
                )
                rows = admin.execute(
                    "SELECT pid, state, application_name FROM pg_stat_activity"
                    " WHERE application_name LIKE %s AND pid <> pg_backend_pid()",
                    (app + "%",),
                ).fetchall()
                active = [r for r in rows if r[1] == "active" and not r[2].endswith(":listen")]
                # Mostly connections caught running a statement; now and then any of ours,
                # including the LISTEN connections.
                victims = active[:1] if active else []
                if rng.random() < 0.15 and rows:
                    victims.append(rng.choice(rows))
                for pid, state, name in victims:
                    if admin.execute("SELECT pg_terminate_backend(%s)", (pid,)).fetchone()[0]:
                        kind = "listen" if name.endswith(":listen") else (
                            "active" if state == "active" else "idle")
                        kills[kind] += 1
                time.sleep(rng.uniform(0.01, 0.05))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.wait(10)
    for r in readers:
        r.join(10)
    errors = [e for e in events if e["event"] == "error"]
    assert not errors, errors[0]["traceback"]
    assert sum(e["event"] == "done" for e in events) == WORKERS
    assert sum(e["event"] == "held" for e in events) == WORKERS * ITERATIONS
    print(f"kills: {kills}")
    check_intervals(events, TTL)
    assert kills["active"] >= 5, f"too few statements were interrupted to mean much: {kills}"
    # Nothing left behind: no holder, no waiter.
    with psycopg.connect(pg_cluster.url, autocommit=True) as admin:
        left = admin.execute(
            f'SELECT (SELECT count(*) FROM "tt_{uid}".holders),'
            f' (SELECT count(*) FROM "tt_{uid}".waiters)'
        ).fetchone()
        assert left == (0, 0)
        admin.execute(f'DROP SCHEMA "tt_{uid}" CASCADE')
