"""A blocked queue consumer is woken on its own client's LISTEN channel (schema version 4):
no other client hears the wake-up. A waiter registered through the version-2 function (a
client of the previous release during an upgrade) is still woken on the schema's channel."""

from __future__ import annotations

import threading
import time
from typing import Any

import psycopg
import pytest

import turnstile
from turnstile.stores.postgres import sql as pg
from turnstile.stores.postgres.sql import wake_key

from ._util import wait_for

pytestmark = pytest.mark.postgres


def test_a_blocked_consumer_is_woken_on_its_clients_own_channel(pg_url: str) -> None:
    consumer = turnstile.connect(pg_url)
    producer = turnstile.connect(pg_url)
    config = consumer.backend.config  # type: ignore[attr-defined]
    schema = pg.quote_ident(config.schema)
    try:
        with psycopg.connect(config.conninfo, autocommit=True) as ears:
            ears.execute(f"LISTEN {pg.quote_ident(config.channel)}")  # the schema's channel
            got: dict[str, Any] = {}

            def consume() -> None:
                got["message"] = consumer.queue("jobs").get(timeout=20)

            thread = threading.Thread(target=consume)
            thread.start()
            channels: list[Any] = []

            def registered() -> bool:
                channels[:] = ears.execute(f"SELECT channel FROM {schema}.queue_waiters").fetchall()
                return bool(channels)

            wait_for(registered, "the consumer never registered as a waiter")
            assert channels == [(consumer.backend.listener.channel,)]  # type: ignore[attr-defined]
            sent = time.monotonic()
            producer.queue("jobs").put({"n": 1})
            thread.join(10)
            assert got["message"] is not None and got["message"].payload == {"n": 1}
            assert time.monotonic() - sent < 1.0  # woken, not found by a later look
            assert got["message"].ack()
            # Nobody else heard it: nothing on the schema's channel.
            assert list(ears.notifies(timeout=0.3)) == []
    finally:
        consumer.close()
        producer.close()


def test_a_waiter_of_the_version_2_function_is_woken_on_the_schema_channel(pg_url: str) -> None:
    client = turnstile.connect(pg_url)  # migrates the schema to the current version
    config = client.backend.config  # type: ignore[attr-defined]
    schema = pg.quote_ident(config.schema)
    try:
        with psycopg.connect(config.conninfo, autocommit=True) as old:
            old.execute(f"LISTEN {pg.quote_ident(config.channel)}")
            found = old.execute(
                f"SELECT o_found FROM {schema}.queue_claim("
                "'jobs', 'r1', 30::float8, NULL::integer, 5, 'old-waiter', NULL::timestamptz)"
            ).fetchone()
            assert found == (False,)
            assert old.execute(f"SELECT channel FROM {schema}.queue_waiters").fetchall() == [
                (None,)
            ]
            client.queue("jobs").put({"n": 2})
            heard = [n.payload for n in old.notifies(timeout=2.0, stop_after=1)]
            assert heard == [wake_key("jobs", "old-waiter", queue=True)]
    finally:
        client.close()
