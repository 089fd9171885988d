"""A settlement's work does not grow with the number of messages in flight (schema version
14): ack, the worker loop's ack-then-claim, nack and extend find their message by id in the
unique index and read a few pages, whether one message or a thousand are in flight.

Counted, not timed: the buffer pages each call touches, nested statements included
(``EXPLAIN (ANALYZE, BUFFERS)`` of the call), in a fresh session. Before version 14 the ack's
plan could walk the deadline index past every message in flight (with statistics taken
while few were), touching a page per message."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

import turnstile
from turnstile.stores.postgres import sql as pg

pytestmark = pytest.mark.postgres

HELD = 1000
# Measured with 1,000 in flight: 21 to 48 pages per call by id (index levels, heap pages,
# the queue's row, the time-out probe, a claim's walk to the next ready message); 531 and
# 556 for ack and ack_claim when the plan walked the deadline index (schema version 13).
FEW = 150


def _pages(conn: psycopg.Connection[Any], call: str, params: tuple[Any, ...]) -> int:
    row = conn.execute(f"EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) {call}", params).fetchone()
    assert row is not None
    plan = row[0][0]["Plan"]
    return int(plan["Shared Hit Blocks"]) + int(plan["Shared Read Blocks"])


def test_settling_reads_a_few_pages_however_many_messages_are_in_flight(pg_url: str) -> None:
    client = turnstile.connect(pg_url)
    config = client.backend.config  # type: ignore[attr-defined]
    schema = pg.quote_ident(config.schema)
    try:
        q = client.queue("held", visibility_timeout=600)
        for n in range(HELD + 2):
            q.put(n)
        held = [q.get(timeout=0) for _ in range(HELD)]
        assert all(m is not None for m in held)
        calls = {
            "ack": f"SELECT {schema}.queue_ack('held', %s, %s)",
            "ack_claim": f"SELECT * FROM {schema}.queue_ack_claim('held', %s, %s, 'r-next', 600,"
                         " NULL, 5, NULL, NULL, NULL)",
            "nack": f"SELECT {schema}.queue_nack('held', %s, %s, 0, 'boom')",
            "extend": f"SELECT {schema}.queue_extend('held', %s, %s, 60)",
        }  # fmt: skip
        with psycopg.connect(config.conninfo, autocommit=True) as conn:  # a fresh session
            # Each call twice, on two messages: the first compiles and plans it (catalog
            # pages) and the plans stay for the session; the second is counted.
            pages = {}
            for i, (what, call) in enumerate(calls.items()):
                for m in (held[2 * i], held[2 * i + 1]):
                    assert m is not None
                    pages[what] = _pages(conn, call, (m.id, m.receipt))
        assert all(n < FEW for n in pages.values()), pages
        # Every call settled its message (the counts are of calls that worked): 2 acked,
        # 2 acked by ack_claim and the 2 ready ones taken, 2 nacked back.
        stats = q.stats()
        assert (stats.ready, stats.in_flight) == (2, HELD - 4)
    finally:
        client.close()
