"""Prepared statements named by a hash of their text (``stores/postgres/prepared.py``): on by
default, and correct when the server connection behind a client connection changes, as it
does behind a transaction pooler (emulated here by dropping or pre-creating statements on the
server connection behind psycopg's back; ``test_pgbouncer.py`` runs through a real one)."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import pytest

import turnstile
from turnstile._sync.backends.postgres import IDLE_STREAK
from turnstile.stores.postgres import prepared, wire

from ._util import client_connection, small_client

pytestmark = pytest.mark.postgres


@pytest.fixture
def client(pg_url: str) -> Iterator[turnstile.Client]:
    """A client with one pooled connection, so every statement runs on the same one."""
    with small_client(pg_url, 1) as c:
        yield c


_connection = client_connection


def _on_the_connection(client: turnstile.Client, sql: bytes) -> list[tuple[Any, ...]]:
    """Run ``sql`` on the pooled connection through libpq directly: psycopg's statement cache
    does not see it, as it would not see another client's statements behind a pooler."""
    with _connection(client).borrow() as conn:
        result = conn.pgconn.exec_(sql)
        assert result.error_message == b"", result.error_message
        return [
            tuple(result.get_value(r, c) for c in range(result.nfields))
            for r in range(result.ntuples)
        ]


def _server_names(client: turnstile.Client) -> set[str]:
    rows = _on_the_connection(client, b"SELECT name FROM pg_prepared_statements")
    return {bytes(r[0]).decode() for r in rows}


def test_names_are_a_hash_of_the_text() -> None:
    a = prepared.statement_name(b"SELECT $1::text")
    assert a == prepared.statement_name(b"SELECT $1::text")
    assert a != prepared.statement_name(b"SELECT $1::int8")
    assert a != prepared.statement_name(b"SELECT $1::text ")
    assert a.startswith(b"_ts_") and len(a) == 36  # well within PostgreSQL's 63 bytes


def test_statements_are_prepared_by_default_under_hashed_names(
    client: turnstile.Client,
) -> None:
    lock = client.lock("p", ttl=30)
    for _ in range(3):
        with lock.acquire(timeout=5):
            pass
    names = _server_names(client)
    assert names and all(n.startswith("_ts_") for n in names), names
    assert _connection(client).prepare_misses == 0


def test_prepare_off_prepares_nothing(pg_url: str) -> None:
    c = turnstile.connect(f"{pg_url}&pool_min=1&pool_max=1&prepare=off")
    try:
        with c.lock("p", ttl=30).acquire(timeout=5):
            pass
        assert _server_names(c) == set()
    finally:
        c.close()


def test_a_statement_the_server_connection_lost_is_prepared_again(
    client: turnstile.Client,
) -> None:
    """26000 (a server connection without the statement): nothing ran, so it is sent again,
    prepared anew, and the caller sees only the result."""
    lock = client.lock("lost", ttl=30)
    first = lock.acquire(timeout=5)
    first.release()
    _on_the_connection(client, b"DEALLOCATE ALL")
    second = lock.acquire(timeout=5)
    assert second.token > first.token
    assert second.release() is True
    assert _connection(client).prepare_misses >= 1
    assert not lock.status().holders


def test_a_statement_the_server_connection_already_has_is_used(
    client: turnstile.Client,
) -> None:
    """42P05 (a server connection that already has the name, as another client connection
    behind the same pooler may have left it): same name, same text, so it is adopted."""
    lock = client.lock("dup", ttl=30)
    lock.acquire(timeout=5).release()  # acquire_fresh: the client had not seen the name
    for _ in range(IDLE_STREAK):  # acquire_fast, then acquire_idle after a streak of fast grants
        lock.acquire(timeout=5).release()
    before = _server_names(client)
    with _connection(client).borrow() as conn:
        prepared.recover(conn, prepared.MISSING)  # the cache forgets; the server keeps them
    lease = lock.acquire(timeout=5)
    assert lease.release() is True
    assert _connection(client).prepare_misses >= 1
    assert _server_names(client) == before  # adopted, nothing prepared twice


def test_a_server_side_that_keeps_losing_statements_turns_preparing_off(
    client: turnstile.Client, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(prepared, "MAX_MISSES", 3)
    lock = client.lock("flaky", ttl=30)
    tokens = []
    with caplog.at_level(logging.WARNING, logger="turnstile.postgres"):
        for _ in range(6):
            lease = lock.acquire(timeout=5)
            tokens.append(lease.token)
            assert lease.release() is True
            _on_the_connection(client, b"DEALLOCATE ALL")
    assert tokens == sorted(set(tokens))
    conn = _connection(client)
    assert conn.preparing is False and conn.prepare_misses == 3
    warnings = [r for r in caplog.records if "unprepared" in r.getMessage()]
    assert len(warnings) == 1
    assert "prepare=off" in warnings[0].getMessage()
    # From now on nothing is prepared, and acquire and release are the function calls, for
    # a name the client knows (acquire_fast) and for one it has not seen (acquire_fresh).
    _on_the_connection(client, b"DEALLOCATE ALL")
    sent: list[str] = []
    parse = wire.parse

    def recording(query: str) -> Any:
        sent.append(query)
        return parse(query)

    monkeypatch.setattr(wire, "parse", recording)
    with lock.acquire(timeout=5):
        pass
    with client.lock("flaky-new", ttl=30).acquire(timeout=5):
        pass
    monkeypatch.undo()
    assert _server_names(client) == set()
    assert conn.prepare_misses == 3
    steps = [q for q in sent if ".acquire(" in q or ".release(" in q]
    assert len(steps) == 4 and all(q.lstrip().startswith("SELECT") for q in steps), sent
