"""A queue consumer's waiter is kept for the client's next get of the same queue when the
store surely holds no registration of it (its last claim delivered), and never otherwise; a
kept waiter still wakes its consumer."""

from __future__ import annotations

import threading
import time
from typing import Any

import psycopg
import pytest

import turnstile
from turnstile.stores.postgres import sql as pg

pytestmark = pytest.mark.postgres


def _waiters(client: Any, name: str) -> list[tuple[str]]:
    config = client.backend.config
    schema = pg.quote_ident(config.schema)
    with psycopg.connect(config.conninfo, autocommit=True) as conn:
        return conn.execute(
            f"SELECT w.waiter FROM {schema}.queue_waiters w JOIN {schema}.queues q"
            " ON q.id = w.queue_id WHERE q.name = %s",
            (name,),
        ).fetchall()


def test_a_waiter_whose_claim_delivered_is_kept_and_one_registered_is_not(pg_url: str) -> None:
    client = turnstile.connect(pg_url)
    producer = turnstile.connect(pg_url)
    try:
        queues = client.backend.queues()  # type: ignore[attr-defined]
        q = client.queue("jobs")
        q.put(1)
        q.put(2)
        first = q.get(timeout=5)
        assert first is not None and first.ack()
        kept = list(queues._spare["jobs"])
        assert len(kept) == 1 and not queues._open
        # The next get takes it back, and its claim delivers again: kept again.
        second = q._get(5, None, ack=None)
        assert second is not None and second.ack()
        assert queues._spare["jobs"] == kept
        # A get that registers and times out unregisters it: not kept.
        assert q.get(timeout=0.2) is None
        assert queues._spare["jobs"] == [] and not queues._open
        assert _waiters(client, "jobs") == []
        # A kept waiter still wakes its consumer when a message comes.
        q.put(3)
        third = q.get(timeout=5)
        assert third is not None and third.ack()
        assert len(queues._spare["jobs"]) == 1
        got: dict[str, Any] = {}
        thread = threading.Thread(target=lambda: got.setdefault("m", q.get(timeout=20)))
        thread.start()
        deadline = time.monotonic() + 10
        while not _waiters(client, "jobs"):
            assert time.monotonic() < deadline, "the consumer never registered"
            time.sleep(0.005)
        sent = time.monotonic()
        producer.queue("jobs").put(4)
        thread.join(10)
        assert got["m"] is not None and got["m"].payload == 4
        assert time.monotonic() - sent < 1.0  # woken, not found by a later look
        assert got["m"].ack()
    finally:
        producer.close()
        client.close()


def test_a_waiter_whose_claim_failed_is_not_kept(pg_url: str) -> None:
    client = turnstile.connect(pg_url)
    try:
        queues = client.backend.queues()  # type: ignore[attr-defined]
        waiter = queues.open_waiter("jobs")
        queues._claiming(waiter.id)  # a claim was sent and its answer never came
        waiter.close(registered=False)
        assert queues._spare.get("jobs", []) == [] and not queues._open
    finally:
        client.close()
