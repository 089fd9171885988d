"""The client's short path to PostgreSQL (``stores/postgres/wire.py``, ``_send`` and the spare
connections of ``postgres_connection.py``), on a real server: the values it writes read back
as psycopg's own would, what it leaves to psycopg's cursor still works, and the connections it
keeps outside the pool are never lost, never shared and never left open."""

from __future__ import annotations

import datetime
import threading
from collections.abc import Iterator

import pytest

import turnstile
from turnstile.errors import TurnstileError

from ._util import client_connection, small_client

pytestmark = pytest.mark.postgres

ROUND_TRIP = (
    "SELECT %(s)s::text, %(i)s::bigint, %(f)s::float8, %(b)s::boolean, %(n)s::text,"
    " %(y)s::bytea, %(t)s::timestamptz, %(s)s::text || '!'"
)


@pytest.fixture
def client(pg_url: str) -> Iterator[turnstile.Client]:
    with small_client(pg_url, 2) as c:
        yield c


_connection = client_connection


@pytest.mark.parametrize("prepare", ["on", "off"])
def test_values_read_back_as_sent(pg_url: str, prepare: str) -> None:
    c = turnstile.connect(f"{pg_url}&prepare={prepare}")
    try:
        conn = _connection(c)
        when = datetime.datetime(2026, 11, 26, 9, 30, 0, 123456, tzinfo=datetime.UTC)
        for s, i, f, b, y in [
            ("héllo ✓", 2**62, 0.1, True, b"\x00\xff\x10"),
            ("", -(2**63), float("inf"), False, b""),
            ("'; DROP TABLE x; --", 0, -1.5e-300, True, bytes(range(256))),
        ]:
            params = {"s": s, "i": i, "f": f, "b": b, "n": None, "y": y, "t": when}
            for _ in range(2):  # the first call prepares (with prepare=on), the second reuses
                row = conn.run(ROUND_TRIP, params, "test")
                assert row == (s, i, f, b, None, y, when, s + "!")
        many = conn.run("SELECT g FROM generate_series(1, %(n)s::int) g", {"n": 3}, "test",
                        many=True)
        assert many == [(1,), (2,), (3,)]
        assert conn.run("SELECT 1 WHERE %(x)s::boolean", {"x": False}, "test") is None
    finally:
        c.close()


@pytest.mark.parametrize("prepare", ["on", "off"])
def test_text_arrays_read_back_as_sent(pg_url: str, prepare: str) -> None:
    """What queue_requeue and queue_purge send (``%(ids)s::text[]``): every element read
    back as it was, whatever array syntax it holds, and prepared like every statement."""
    c = turnstile.connect(f"{pg_url}&prepare={prepare}")
    try:
        conn = _connection(c)
        for ids in [
            [],
            ["a"],
            ["a", None, "", "NULL", "null", 'q"b', "back\\slash", "x,y", "{}", " sp ", "é✓"],
            ("tuple", "too"),
        ]:
            for _ in range(2):
                row = conn.run(
                    "SELECT %(ids)s::text[], cardinality(%(ids)s::text[])", {"ids": ids}, "test"
                )
                assert row == (list(ids), len(ids))
    finally:
        c.close()


def test_what_the_short_path_leaves_to_psycopg_still_runs(client: turnstile.Client) -> None:
    conn = _connection(client)
    naive = datetime.datetime(2026, 1, 1, 12, 0)  # no time zone: psycopg's cursor sends it
    assert conn.run("SELECT %(t)s::timestamp", {"t": naive}, "test") == (naive,)
    assert conn.run("SELECT %(a)s::text LIKE 'x%%'", {"a": "xy"}, "test") == (True,)
    assert conn.run("SELECT %(a)s::int[]", {"a": [1, 2]}, "test") == ([1, 2],)


@pytest.mark.parametrize("bad", ["a\x00b", "\ud800"])
def test_text_the_protocol_cannot_carry_is_left_to_psycopg(
    client: turnstile.Client, bad: str
) -> None:
    """NUL (which the text protocol would cut the value at) and lone surrogates (not UTF-8)
    are never sent by the short path: psycopg's cursor refuses them as it always did (the
    public entry points refuse both before: test_hostile_arguments), and the connection
    stays usable."""
    conn = _connection(client)
    with pytest.raises((TurnstileError, ValueError)):
        conn.run("SELECT %(a)s::text", {"a": bad}, "test")
    assert conn.run("SELECT %(a)s::text", {"a": "fine"}, "test") == ("fine",)


def test_server_errors_are_translated(client: turnstile.Client) -> None:
    conn = _connection(client)
    with pytest.raises(TurnstileError, match="division by zero"):
        conn.run("SELECT 1 / %(z)s::int", {"z": 0}, "test")
    assert conn.run("SELECT 1 / %(z)s::int", {"z": 1}, "test") == (1,)


def test_many_threads_share_few_connections_without_waiting_on_a_spare(pg_url: str) -> None:
    """More threads than connections: a connection kept as a spare is never what another
    thread waits for (whoever waits on the pool is served first), so none of them stalls."""
    c = turnstile.connect(f"{pg_url}&pool_min=1&pool_max=2")
    try:
        conn = _connection(c)
        errors: list[BaseException] = []
        done: list[int] = []

        def work(i: int) -> None:
            try:
                lock = c.lock(f"n{i % 3}", ttl=30)
                for _ in range(40):
                    lock.acquire(timeout=30).release()
                    done.append(i)
            except BaseException as exc:
                errors.append(exc)

        threads = [threading.Thread(target=work, args=(i,)) for i in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert not errors, errors
        assert len(done) == 6 * 40
        assert len(conn._spare) <= 2
    finally:
        c.close()


def test_close_closes_the_spare_connections(pg_url: str) -> None:
    c = turnstile.connect(f"{pg_url}&pool_min=1&pool_max=3")
    conn = _connection(c)
    with c.lock("x", ttl=30).acquire(timeout=5):
        pass
    spare = list(conn._spare)
    assert spare, "a statement's connection is kept as a spare"
    c.close()
    assert all(s.closed for s in spare)
    assert conn._spare == []


def test_a_connection_left_in_a_transaction_is_not_kept(client: turnstile.Client) -> None:
    conn = _connection(client)
    with conn.borrow() as pooled:
        assert pooled.pgconn.exec_(b"BEGIN").error_message == b""
    assert pooled not in conn._spare  # the pool rolled it back (or dropped it)
    with client.lock("y", ttl=30).acquire(timeout=5):
        pass


async def test_a_cancelled_async_statement_leaves_a_usable_connection(
    pg_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """An async caller cancelled while its statement runs: psycopg cancels the query on the
    server and drains it, so the connection comes back idle (kept, not closed with a
    warning) and the next statement runs at once."""
    import asyncio
    import logging

    import turnstile.aio

    c = await turnstile.aio.connect(f"{pg_url}&pool_min=1&pool_max=1")
    try:
        conn = client_connection(c)
        assert await conn.run("SELECT 1", {}, "test") == (1,)
        task = asyncio.ensure_future(conn.run("SELECT pg_sleep(%(s)s::float8)", {"s": 30.0}, "t"))
        await asyncio.sleep(0.2)
        with caplog.at_level(logging.WARNING):
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            started = asyncio.get_running_loop().time()
            assert await conn.run("SELECT %(x)s::int", {"x": 7}, "test") == (7,)
        assert asyncio.get_running_loop().time() - started < 10  # not the 30 s sleep
        assert not [r for r in caplog.records if r.levelno >= logging.WARNING], caplog.text
    finally:
        await c.close()
