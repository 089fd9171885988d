"""``q.work(prefetch=n)`` on PostgreSQL: one statement (one transaction) per batch, that
acks the batch before and claims the next (``queue_ack_claim_many``), counted at the
connection; and a batch step stays a few page reads however many messages are in flight
(its acks find each message by id, not through the deadline index)."""

from __future__ import annotations

import collections
from typing import Any

import psycopg
import pytest

import turnstile
from tests.stores.postgres.test_queue_in_flight import FEW, HELD, _pages
from turnstile.stores.postgres import sql as pg

pytestmark = pytest.mark.postgres


def test_a_batch_is_one_statement_that_also_acks_the_one_before(pg_url: str) -> None:
    client = turnstile.connect(pg_url)
    try:
        q = client.queue("batches", visibility_timeout=30)
        for i in range(30):
            q.put(i, key=f"k{i % 15}")
        connection = client.backend.queues().connection  # type: ignore[attr-defined]
        sent: collections.Counter[str] = collections.Counter()
        run = connection.run

        def counting(query: Any, params: Any, action: str) -> Any:
            sent[action] += 1
            return run(query, params, action)

        connection.run = counting
        seen: list[int] = []
        result = q.work(lambda m: seen.append(m.payload), prefetch=10, idle_timeout=0.3,
                        handle_signals=False)
        assert result.acked == 30 and sorted(seen) == list(range(30))
        # 15 keys: each batch of ten heads ten keys; the batches' acks ride on the next step.
        claims = sent["queue ack_claim_many"]
        assert 4 <= claims <= 6, sent  # 3 or 4 batches, the last acks and finds nothing
        assert sent["queue ack"] == sent["queue ack_claim"] == sent["queue claim"] == 0, sent
        assert q.stats().pending == 0
    finally:
        client.close()


def test_a_batch_step_reads_a_few_pages_per_message_however_many_are_in_flight(
    pg_url: str,
) -> None:
    """1,000 messages in flight; a batch step that acks three of them and claims two reads
    the pages of those five (index levels, heap pages, the queue's row), not a page per
    message in flight: its acks find each message by id (test_queue_in_flight.py)."""
    client = turnstile.connect(pg_url)
    config = client.backend.config  # type: ignore[attr-defined]
    schema = pg.quote_ident(config.schema)
    try:
        q = client.queue("held", visibility_timeout=600)
        for n in range(HELD + 4):
            q.put(n)
        held = [q.get(timeout=0) for _ in range(HELD)]
        assert all(m is not None for m in held)
        call = (f"SELECT * FROM {schema}.queue_ack_claim_many('held', %s, %s, %s, 600, NULL,"
                " 5, NULL, NULL, NULL)")
        with psycopg.connect(config.conninfo, autocommit=True) as conn:  # a fresh session
            # Twice: the first compiles and plans (catalog pages), the second is counted.
            for step in range(2):
                acked = [m for m in held[3 * step:3 * step + 3] if m is not None]
                pages = _pages(conn, call, ([m.id for m in acked], [m.receipt for m in acked],
                                            [f"r{step}a", f"r{step}b"]))
        # Measured: 84 pages. One walk of the deadline index past 1,000 in flight: 531.
        assert pages < 2 * FEW, pages
        stats = q.stats()
        assert (stats.ready, stats.in_flight) == (0, HELD - 6 + 4)
    finally:
        client.close()


def test_the_function_refuses_a_step_without_a_receipt(pg_url: str) -> None:
    client = turnstile.connect(pg_url)
    config = client.backend.config  # type: ignore[attr-defined]
    try:
        client.queue("empty").put(1)
        with (
            psycopg.connect(config.conninfo, autocommit=True) as conn,
            pytest.raises(psycopg.errors.InvalidParameterValue, match="receipt"),
        ):
            conn.execute(
                f"SELECT * FROM {pg.quote_ident(config.schema)}.queue_ack_claim_many("
                "'empty', '{}', '{}', '{}', 60, NULL, 5, NULL, NULL, NULL)"
            )
        assert client.queue("empty").stats().ready == 1
    finally:
        client.close()
