"""Semaphore groups on PostgreSQL (schema version 10): migrating a populated version-9
schema keeps every lease and place (all plain), calls of the previous signatures (a client
of the previous release during an upgrade) still resolve, and a busy group refuses such a
client's plain acquire with the DETAIL a current client turns into
``lock_machine.group_conflict``. (The state machine itself, skips included, is held to
lock_machine.py by test_model_equivalence.py; the public API by tests/contract/test_group.py.)"""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

import turnstile
from turnstile._core import callbacks, lock_machine
from turnstile.stores.postgres import sql as pg

from ._util import schema_url, unique

pytestmark = pytest.mark.postgres

LONG = 600.0


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


def test_migration_10_keeps_a_populated_version_9_schema(pg_server: str) -> None:
    uid = unique()
    schema = f"tt_{uid}"
    ident = pg.quote_ident(schema)
    try:
        with psycopg.connect(pg_server, autocommit=True) as conn:
            _migrate_to(conn, schema, 9)
            # Version 9's acquire (10 arguments): a semaphore of 2 with a line of two.
            for holder in ("h1", "h2", "w1", "w2"):
                conn.execute(
                    f"SELECT * FROM {ident}.acquire('sem', %s, 2, {LONG}, {LONG}, true, NULL,"
                    " '', NULL, 0)",
                    (holder,),
                )
            before = conn.execute(
                f"SELECT lim, holders::text, waiters::text FROM {ident}.status('sem')"
            ).fetchone()
        client = turnstile.connect(schema_url(pg_server, uid))
        try:
            backend: Any = client.backend
            status = client.status("sem")
            assert (status.limit, status.per_key) == (2, None)
            assert [(h.holder, h.key) for h in status.holders] == [("h1", None), ("h2", None)]
            assert [(w.holder, w.key) for w in status.waiters] == [("w1", None), ("w2", None)]
            # The line goes on as before.
            assert backend.release("sem", "h1", None)
            assert [h.holder for h in client.status("sem").holders] == ["h2", "w1"]
            with psycopg.connect(pg_server, autocommit=True) as conn:
                # A client of the previous release: status read by its columns, acquire with
                # 10, 9 and 7 arguments and acquire_callback with 8, 7: all plain.
                old_status = conn.execute(
                    f"SELECT lim, holders::text, waiters::text FROM {ident}.status('sem')"
                ).fetchone()
                assert old_status is not None and before is not None
                assert old_status[0] == before[0] == 2
                callback = callbacks.encode(callbacks.StepFunctionsCallback("task-c"))
                calls = [
                    f"SELECT granted, queue_position FROM {ident}.acquire('x', 'a', 2, 60, 60,"
                    " true, NULL, '', NULL, 0)",
                    f"SELECT granted, queue_position FROM {ident}.acquire('x', 'b', 2, 60, 60,"
                    " true, NULL, '', NULL)",
                    f"SELECT granted, queue_position FROM {ident}.acquire('x', 'c', 2, 60, 60,"
                    " true)",
                ]
                answers = [conn.execute(call).fetchone() for call in calls]
                for arity, holder in ((8, "d"), (7, "e")):
                    lead = ", 0" if arity == 8 else ""
                    answers.append(
                        conn.execute(
                            f"SELECT granted, queue_position FROM {ident}.acquire_callback("
                            f"'x', %s, 2, 60, 60, NULL, %s{lead})",
                            (holder, callback),
                        ).fetchone()
                    )
            assert answers == [(True, None), (True, None), (False, 0), (False, 1), (False, 2)]
            status = client.status("x")
            assert (status.limit, status.per_key) == (2, None)
            assert [h.key for h in status.holders] == [None, None]
        finally:
            client.close()
    finally:
        with psycopg.connect(pg_server, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA IF EXISTS {ident} CASCADE")


def test_a_busy_group_refuses_a_plain_call_of_the_previous_signature(pg_url: str) -> None:
    """The refusal's DETAIL is the group's total and per_key (a plain name's is its limit
    alone, as before); the current client answers it with lock_machine's own message."""
    client = turnstile.connect(pg_url)
    backend: Any = client.backend
    schema = pg.quote_ident(backend.config.schema)
    try:
        group = client.semaphore_group("grp", per_key=1, total=3, ttl=LONG)
        assert group.try_acquire("k", "g1").acquired
        with (
            psycopg.connect(backend.config.conninfo, autocommit=True) as conn,
            pytest.raises(psycopg.Error) as info,
        ):
            conn.execute(
                f"SELECT * FROM {schema}.acquire('grp', 'old', 3, 60, 60, true, NULL, '',"
                " NULL, 0)"
            )
        assert info.value.sqlstate == pg.LIMIT_CONFLICT
        assert info.value.diag.message_detail == "3 1"
        assert pg.conflicting_shape(info.value) == (3, 1)
        with pytest.raises(turnstile.LimitConflict) as refused:
            client.semaphore("grp", 3).try_acquire("new")
        assert str(refused.value) == str(lock_machine.group_conflict("grp", (3, 1), (3, None)))
        with pytest.raises(turnstile.LimitConflict) as refused:
            client.semaphore_group("grp", per_key=1, total=2).try_acquire("k", "new")
        assert str(refused.value) == str(lock_machine.limit_conflict("grp", 3, 2))
        # A plain name's DETAIL is unchanged: its limit alone.
        assert client.semaphore("plain", 2, ttl=LONG).try_acquire("p").acquired
        with (
            psycopg.connect(backend.config.conninfo, autocommit=True) as conn,
            pytest.raises(psycopg.Error) as info,
        ):
            conn.execute(
                f"SELECT * FROM {schema}.acquire('plain', 'old', 3, 60, 60, true, NULL, '',"
                " NULL, 0)"
            )
        assert info.value.diag.message_detail == "2"
        assert pg.conflicting_shape(info.value) == (2, None)
    finally:
        client.close()


def test_a_long_line_of_a_full_key_is_passed_over(pg_url: str) -> None:
    """A busy key's many waiters are left out of the promotion's scan (keys full from the
    start), and one further back is granted as soon as the total has room."""
    client = turnstile.connect(pg_url)
    backend: Any = client.backend
    try:
        kw: dict[str, Any] = {"limit": 3, "per_key": 1, "ttl": LONG, "wait_ttl": LONG}
        assert backend.acquire("busy", "a0", key="a", enqueue=True, **kw).grant is not None
        for i in range(1, 50):
            assert backend.acquire("busy", f"a{i}", key="a", enqueue=True, **kw).position == i - 1
        got = backend.acquire("busy", "b0", key="b", enqueue=True, **kw)
        assert got.grant is not None  # room for b: at once, whoever waits
        assert backend.acquire("busy", "c0", key="c", enqueue=True, **kw).grant is not None
        late = backend.acquire("busy", "d0", key="d", enqueue=True, **kw)
        assert late.position == 49  # the total is reached: behind the a's
        assert backend.release("busy", "b0", None)  # the total has room: d0, not a1
        status = client.status("busy")
        assert sorted((h.holder, h.key) for h in status.holders) == [
            ("a0", "a"), ("c0", "c"), ("d0", "d")
        ]
        assert [w.holder for w in status.waiters] == [f"a{i}" for i in range(1, 50)]
        assert backend.release("busy", "a0", None)  # a's turn: a1, the front
        assert sorted(h.holder for h in client.status("busy").holders) == ["a1", "c0", "d0"]
    finally:
        client.close()


def test_a_plain_grant_from_the_line_keeps_its_entrys_key(pg_url: str) -> None:
    """lock_machine.promote carries a waiting entry's key to its grant, in a plain semaphore
    too; the plain loop of _promote dropped it before schema version 16 (found by the
    model-equivalence test with more seeds), while a grant made at once kept it."""
    with turnstile.connect(pg_url) as client:
        backend: Any = client.backend
        name = f"plain-key-{unique()}"
        first = backend.acquire(name, "A", limit=1, ttl=LONG, wait_ttl=LONG, enqueue=True,
                                key="k0")
        assert first.grant is not None
        assert [h.key for h in backend.status(name).holders] == ["k0"]
        task = callbacks.encode(callbacks.StepFunctionsCallback("task-c"))
        for holder, callback in (("B", None), ("C", task)):
            if callback is None:
                backend.acquire(name, holder, limit=1, ttl=LONG, wait_ttl=LONG, enqueue=True,
                                key=f"k-{holder}")
            else:
                backend.acquire_callback(name, holder, limit=1, ttl=LONG, wait_ttl=LONG,
                                         callback=callback, key=f"k-{holder}")
        assert backend.release(name, "A", first.grant.token)
        assert [(h.holder, h.key) for h in backend.status(name).holders] == [("B", "k-B")]
        assert backend.release(name, "B", None)  # the callback waiter's grant, in the plain loop
        assert [(h.holder, h.key) for h in backend.status(name).holders] == [("C", "k-C")]
        backend.release(name, "C", None)
