"""Queues on PostgreSQL after schema versions 11 (the operations of a queue no longer wait for
one another on its row) and 13 (leaner claims and acks, new indexes): migrating a populated
version-10 or version-12 schema keeps every message where it was (ready, delayed, in flight
with its receipt, dead) and its dedup entries, a call of an unchanged signature (a client of
the previous release during an upgrade) still works, and the fused ack-then-claim step of the
worker loop answers what an ack then a claim would."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

import turnstile
from turnstile.stores.postgres import sql as pg

from ._util import schema_url, unique

pytestmark = pytest.mark.postgres


def _migrate_to(conn: psycopg.Connection[Any], schema: str, version: int) -> None:
    with conn.transaction():
        conn.execute(f"CREATE SCHEMA {pg.quote_ident(schema)}")
        conn.execute(pg.render(pg.QUERIES["create_version_table"], schema))
        for number, filename, script in pg.MIGRATIONS:
            if number > version:
                break
            conn.execute(pg.render(script, schema))
            conn.execute(
                pg.render(pg.QUERIES["record_version"], schema),
                {"version": number, "name": filename},
            )


def _put(conn: psycopg.Connection[Any], ident: str, mid: str, key: str | None,
         delay: float = 0.0, dedup: str | None = None) -> None:
    conn.execute(
        f"SELECT * FROM {ident}.queue_put('q', %s, %s, '\\x7b7d'::bytea, 0::smallint, %s,"
        " %s, 5, 300)",
        (mid, key, delay, dedup),
    )


def _claim(conn: psycopg.Connection[Any], ident: str, receipt: str, max_attempts: int = 5) -> Any:
    # The version-2 signature (7 arguments), kept for clients of older releases.
    return conn.execute(
        f"SELECT o_found, o_id FROM {ident}.queue_claim('q', %s, 600, NULL, %s, NULL)",
        (receipt, max_attempts),
    ).fetchone()


# 10: before version 11 (no row lock); 12: before version 13 (the indexes of queue_messages
# change: the ready, dead and key indexes are made from the rows already there).
@pytest.mark.parametrize("version", [10, 12])
def test_migrations_keep_a_populated_queue(pg_server: str, version: int) -> None:
    uid = unique()
    schema = f"tt_{uid}"
    ident = pg.quote_ident(schema)
    try:
        with psycopg.connect(pg_server, autocommit=True) as conn:
            _migrate_to(conn, schema, version)
            _put(conn, ident, "dead", None)
            assert _claim(conn, ident, "r-dead", max_attempts=1) == (True, "dead")
            assert conn.execute(
                f"SELECT {ident}.queue_nack('q', 'dead', 'r-dead', 0, 'boom')"
            ).fetchone() == (True,)
            _put(conn, ident, "a1", "A", dedup="d-a1")
            _put(conn, ident, "a2", "A")
            _put(conn, ident, "b1", "B", delay=600.0)
            _put(conn, ident, "n1", None)
            assert _claim(conn, ident, "r-a1") == (True, "a1")
        client = turnstile.connect(schema_url(pg_server, uid))
        try:
            q = client.queue("q")
            stats = q.stats()
            assert (stats.ready, stats.delayed, stats.in_flight, stats.dead) == (2, 1, 1, 1)
            # The dedup entry of a put before the upgrade still answers.
            again = q.put_message({"x": 1}, key="A", dedup_id="d-a1")
            assert (again.id, again.created) == ("a1", False)
            # a2 waits behind a1, in flight since before the upgrade: n1 goes first.
            first = q.get(timeout=0)
            assert first is not None and first.id == "n1"
            assert q.get(timeout=0) is None
            # The receipt handed out before the upgrade settles it; then a2 is A's head.
            assert q.ack("a1", "r-a1")
            second = q.get(timeout=0)
            assert second is not None and second.id == "a2" and second.key == "A"
            assert [d.id for d in q.dead_letters()] == ["dead"]
            assert q.requeue() == 1
            # The worker loop's fused step: ack a2 and claim the next (the requeued message;
            # n1 is still in flight, b1 is delayed).
            third = q._get(0, None, ack=second)
            assert second.settled and not second.lost
            assert third is not None and third.id == "dead" and third.attempt == 1
            assert first.ack() and third.ack()
            stats = q.stats()
            assert (stats.ready, stats.delayed, stats.in_flight, stats.dead) == (0, 1, 0, 0)
            with psycopg.connect(pg_server, autocommit=True) as conn:
                version = conn.execute(f"SELECT max(version) FROM {ident}.schema_version")
                assert version.fetchone() == (pg.SCHEMA_VERSION,)
        finally:
            client.close()
    finally:
        with psycopg.connect(pg_server, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA IF EXISTS {ident} CASCADE")
