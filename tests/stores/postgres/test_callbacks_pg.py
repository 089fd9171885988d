"""Callback grants, PostgreSQL specifics (the contract is tests/contract/test_callbacks.py):
concurrent deliverers never claim one delivery twice, an idle poll writes nothing, a
callback's text never leaves the database through status, and migration 0006 keeps the
leases and lines of a populated version-5 schema."""

from __future__ import annotations

import threading
from collections import Counter
from typing import Any

import psycopg
import pytest

import turnstile
from turnstile._core import callbacks
from turnstile.stores.postgres import sql as pg

from ._util import schema_url, unique

pytestmark = pytest.mark.postgres

LONG = 600.0


def _sfn(i: object) -> str:
    return callbacks.encode(callbacks.StepFunctionsCallback(f"secret-task-token-{i}"))


def test_concurrent_deliverers_never_claim_a_delivery_twice(pg_url: str) -> None:
    owner = turnstile.connect(pg_url)
    clients = [turnstile.connect(pg_url) for _ in range(4)]
    try:
        for n in range(60):
            owner.backend.acquire_callback(
                f"many:{n % 20}", f"h{n}", limit=3, ttl=LONG, wait_ttl=LONG, callback=_sfn(n)
            )
        assert owner.backend.pending_deliveries() == 60
        taken: list[tuple[str, int]] = []
        lock = threading.Lock()
        barrier = threading.Barrier(len(clients))

        def deliverer(client: turnstile.Client) -> None:
            barrier.wait()
            for _ in range(200):
                got = client.backend.take_deliveries(lease=LONG, max_count=4)
                with lock:
                    taken.extend((d.name, d.token) for d in got)
                    if len(taken) >= 60:
                        return

        threads = [threading.Thread(target=deliverer, args=(c,)) for c in clients]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert [k for k, v in Counter(taken).items() if v > 1] == []
        assert len(taken) == 60
        assert owner.backend.take_deliveries(lease=LONG, max_count=100) == []
    finally:
        for c in [owner, *clients]:
            c.close()


def test_an_idle_poll_writes_nothing(pg_url: str) -> None:
    client = turnstile.connect(pg_url)
    try:
        backend: Any = client.backend
        sem = client.semaphore("idle:poll", 1, ttl=LONG)
        sem.try_acquire("holder")
        for i in range(5):
            backend.acquire_callback(
                "idle:poll", f"w{i}", limit=1, ttl=LONG, wait_ttl=LONG, callback=_sfn(i)
            )
        backend.acquire_callback(
            "idle:claimed", "x", limit=1, ttl=LONG, wait_ttl=LONG, callback=_sfn("x")
        )
        assert len(backend.take_deliveries(lease=LONG, max_count=10)) == 1
        # The deliverer's own query, in a transaction of ours: when nothing is due it must
        # not have been given a transaction id (it wrote nothing). Judged on this one
        # transaction, not by counting ids server-wide (other tests run meanwhile).
        with psycopg.connect(backend.config.conninfo) as conn:
            for _ in range(5):
                rows = conn.execute(
                    backend._q["take_deliveries"],
                    {"lease": LONG, "max_count": 10, "now": None},
                ).fetchall()
                assert rows == []
                (assigned,) = conn.execute(
                    "SELECT pg_current_xact_id_if_assigned()"
                ).fetchone()  # type: ignore[misc]
                assert assigned is None
                conn.rollback()
    finally:
        client.close()


def test_status_shows_the_kind_never_the_callback(pg_url: str) -> None:
    client = turnstile.connect(pg_url)
    try:
        backend: Any = client.backend
        backend.acquire_callback(
            "kind", "a", limit=1, ttl=LONG, wait_ttl=LONG, callback=_sfn("a")
        )
        url = callbacks.encode(callbacks.HttpCallback("https://example.com/secret-path"))
        backend.acquire_callback("kind", "b", limit=1, ttl=LONG, wait_ttl=LONG, callback=url)
        status = client.semaphore("kind", 1).status()
        assert [(h.holder, h.callback, h.delivery) for h in status.holders] == [
            ("a", "sfn", "pending")
        ]
        assert [(w.holder, w.callback) for w in status.waiters] == [("b", "http")]
        with psycopg.connect(backend.config.conninfo, autocommit=True) as conn:
            row = conn.execute(
                pg.render(pg.QUERIES["status"], backend.config.schema),
                {"name": "kind", "now": None},
            ).fetchone()
        assert "secret" not in repr(row)
    finally:
        client.close()


def test_migration_6_keeps_a_populated_version_5_schema(pg_server: str) -> None:
    uid = unique()
    schema = f"tt_{uid}"
    ident = pg.quote_ident(schema)
    try:
        with psycopg.connect(pg_server, autocommit=True) as conn:
            with conn.transaction():
                conn.execute(f"CREATE SCHEMA {ident}")
                conn.execute(pg.render(pg.QUERIES["create_version_table"], schema))
                for number, filename, script in pg.MIGRATIONS:
                    if number > 5:
                        break
                    conn.execute(pg.render(script, schema))
                    conn.execute(
                        pg.render(pg.QUERIES["record_version"], schema),
                        {"version": number, "name": filename},
                    )
            # A busy version-5 schema: a holder and two waiters in line.
            first = conn.execute(
                f"SELECT granted, token FROM {ident}.acquire('old', 'h', 1, 600, 600, true, "
                "NULL, '', NULL)"
            ).fetchone()
            assert first is not None and first[0]
            for w in ("w1", "w2"):
                conn.execute(
                    f"SELECT * FROM {ident}.acquire('old', %s, 1, 600, 600, true, NULL, '', "
                    "NULL)",
                    (w,),
                )
        client = turnstile.connect(schema_url(pg_server, uid))
        try:
            backend: Any = client.backend
            sem = client.semaphore("old", 1, ttl=LONG)
            status = sem.status()
            assert [(h.holder, h.token, h.callback) for h in status.holders] == [
                ("h", first[1], None)
            ]
            assert [(w.holder, w.callback) for w in status.waiters] == [
                ("w1", None),
                ("w2", None),
            ]
            # w2 becomes a callback waiter; the old rows carry on under the new functions.
            backend.acquire_callback(
                "old", "w2", limit=1, ttl=LONG, wait_ttl=LONG, callback=_sfn("w2")
            )
            assert sem.release("h", first[1])
            assert sem.release("w1", None)  # its hand-over, unclaimed, released
            (delivery,) = backend.take_deliveries(lease=LONG, max_count=10)
            assert (delivery.name, delivery.holder) == ("old", "w2")
        finally:
            client.close()
    finally:
        with psycopg.connect(pg_server, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA IF EXISTS {ident} CASCADE")
