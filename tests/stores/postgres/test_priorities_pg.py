"""Priorities on PostgreSQL (schema version 9, _core/ranking.py): strict priority order and
FIFO within a level, for locks, semaphores and rate limits, on the database's own clock;
ageing (a waiter that has waited longer than ``ageing`` ranks ahead of a newcomer one level
up), with waits derived from the ageing value and checked against the times the store
reports, so a slow machine changes nothing; rank ties (exact, on a virtual clock) go to the
earlier arrival; and a newcomer that ranks first in a rate limit's line and conforms is
admitted at once."""

from __future__ import annotations

import datetime
import threading
import time
from typing import Any

import psycopg
import pytest

import turnstile
from turnstile._core import callbacks
from turnstile.stores.postgres import sql as pg

from ._util import schema_url, unique

pytestmark = pytest.mark.postgres

T0 = 1_700_000_000.0
LONG = 60.0  # ttl and wait_ttl: nothing here expires while the test runs


def _join(backend: Any, name: str, holder: str, limit: int = 1, **kw: Any) -> Any:
    return backend.acquire(
        name, holder, limit=limit, ttl=LONG, wait_ttl=LONG, enqueue=True, **kw
    )


def _line(client: Any, name: str) -> list[str]:
    return [w.holder for w in client.status(name).waiters]


def test_strict_priorities_and_fifo_within_a_level(pg_url: str) -> None:
    client = turnstile.connect(pg_url)
    backend: Any = client.backend
    try:
        assert _join(backend, "job", "holder").grant is not None
        arrivals = [("a0", 0), ("b1", 1), ("c0", 0), ("d2", 2), ("e1", 1), ("f-1", -1)]
        positions = []
        for holder, priority in arrivals:
            got = _join(backend, "job", holder, priority=priority)
            assert got.grant is None
            positions.append(got.position)
        # each joined behind every waiter of its level or above, ahead of the rest
        assert positions == [0, 0, 2, 0, 2, 5]
        want = ["d2", "b1", "e1", "a0", "c0", "f-1"]
        assert _line(client, "job") == want
        assert [w.position for w in client.status("job").waiters] == list(range(6))
        # asking again keeps the place, whatever priority it names
        again = _join(backend, "job", "c0", priority=5)
        assert again.position == 4 and _line(client, "job") == want
        # grants go in that order
        granted = []
        current = "holder"
        for _ in want:
            assert backend.release("job", current, None)
            (holder,) = [h.holder for h in client.status("job").holders]
            granted.append(holder)
            current = holder
        assert granted == want
    finally:
        client.close()


def test_blocked_acquires_are_granted_by_priority(pg_url: str) -> None:
    """Through the public API, with LISTEN wake-ups: waiters blocked in acquire() are
    handed the lease highest priority first, FIFO within a level."""
    client = turnstile.connect(pg_url)
    try:
        lock = client.lock("ordered", ttl=30)
        first = lock.acquire(timeout=10)
        order: list[str] = []
        done = threading.Lock()

        def wait(holder: str, priority: int) -> None:
            lease = lock.acquire(timeout=60, holder=holder, priority=priority)
            with done:
                order.append(holder)
            lease.release()

        threads = []
        for holder, priority in [("low", 0), ("high", 3), ("mid", 1), ("high2", 3), ("mid2", 1)]:
            t = threading.Thread(target=wait, args=(holder, priority))
            t.start()
            threads.append(t)
            deadline = time.monotonic() + 30
            while holder not in _line(client, "ordered"):  # in line before the next one
                assert time.monotonic() < deadline, f"{holder} never joined the line"
                time.sleep(0.01)
        assert _line(client, "ordered") == ["high", "high2", "mid", "mid2", "low"]
        first.release()
        for t in threads:
            t.join(timeout=60)
        assert order == ["high", "high2", "mid", "mid2", "low"]
    finally:
        client.close()


def test_a_semaphore_grants_by_priority(pg_url: str) -> None:
    client = turnstile.connect(pg_url)
    backend: Any = client.backend
    try:
        for holder in ("s1", "s2"):
            assert _join(backend, "sem", holder, limit=2).grant is not None
        for holder, priority in [("w0", 0), ("w2", 2), ("w1", 1), ("w2b", 2)]:
            assert _join(backend, "sem", holder, limit=2, priority=priority).grant is None
        assert _line(client, "sem") == ["w2", "w2b", "w1", "w0"]
        assert backend.set_limit("sem", 4) == 2  # two slots more: the two in front
        assert sorted(h.holder for h in client.status("sem").holders) == [
            "s1", "s2", "w2", "w2b"
        ]
        assert _line(client, "sem") == ["w1", "w0"]
    finally:
        client.close()


def test_ageing_lets_a_long_waiter_keep_ahead_of_a_newcomer_one_level_up(pg_url: str) -> None:
    ageing = 0.3
    client = turnstile.connect(pg_url)
    backend: Any = client.backend
    try:
        assert _join(backend, "aged", "holder").grant is not None
        assert _join(backend, "aged", "old", priority=0, ageing=ageing).position == 0
        # A newcomer one level up soon after: ahead of "old" unless a full level (ageing
        # seconds, by the store's clock) passed between their arrivals.
        _join(backend, "aged", "soon", priority=1, ageing=ageing)
        joined = {w.holder: w.joined_at for w in client.status("aged").waiters}
        gap = joined["soon"] - joined["old"]
        want = ["soon", "old"] if gap < ageing else ["old", "soon"]
        assert _line(client, "aged") == want
        # Wait until "old" has waited more than a level, by the store's clock: then a
        # newcomer one level up ranks behind it (and behind "soon", same level, earlier).
        deadline = time.monotonic() + 30
        while client.status("aged").now - joined["old"] <= ageing + 0.05:
            assert time.monotonic() < deadline
            time.sleep(ageing / 10)
        late = _join(backend, "aged", "late", priority=1, ageing=ageing)
        assert _line(client, "aged") == [*want, "late"]
        assert late.position == 2
        # ... but two levels up is ahead again, unless two levels passed as well.
        _join(backend, "aged", "two", priority=2, ageing=ageing)
        status = client.status("aged")
        waited = {w.holder: w.joined_at for w in status.waiters}
        line = [w.holder for w in status.waiters]
        for other, levels in (("old", 2), ("soon", 1), ("late", 1)):
            ahead = waited["two"] - waited[other] < levels * ageing
            assert (line.index("two") < line.index(other)) == ahead, other
    finally:
        client.close()


def test_rank_ties_go_to_the_earlier_arrival(pg_url: str) -> None:
    """On a virtual clock, exactly: a newcomer one level up arriving exactly one level
    (ageing) after a waiter ranks equal to it and stands behind it; with a level a
    microsecond longer it stands ahead. A clock that steps back still stamps a newcomer
    above everyone in line. The same in a rate limit's line."""
    client = turnstile.connect(pg_url)
    backend: Any = client.backend
    clock = [T0]
    backend.clock_override = lambda: clock[0]
    ageing = 0.25
    try:
        for name in ("tie", "sooner"):
            assert _join(backend, name, "holder").grant is not None
            assert _join(backend, name, "old", ageing=ageing).position == 0
        clock[0] = T0 + ageing
        assert _join(backend, "tie", "equal", priority=1, ageing=ageing).position == 1
        assert _join(backend, "tie", "next", priority=1, ageing=ageing).position == 2
        assert _join(backend, "sooner", "new", priority=1, ageing=ageing + 1e-6).position == 0
        clock[0] = T0 + 0.1  # the clock steps back
        assert _join(backend, "tie", "back", priority=1, ageing=ageing).position == 3
        waiters = client.status("tie").waiters
        assert [w.holder for w in waiters] == ["old", "equal", "next", "back"]
        stamps = [round(w.joined_at * 1e6) - round(T0 * 1e6) for w in waiters]
        assert stamps == [0, 250_000, 250_001, 250_002]
        assert _line(client, "sooner") == ["new", "old"]

        rate = {"rate": 1, "per": 100.0, "burst": 1, "enqueue": True, "grace": LONG}
        clock[0] = T0
        assert backend.rate_acquire("r", "first", **rate).admitted
        assert backend.rate_acquire("r", "old", ageing=ageing, **rate).position == 0
        clock[0] = T0 + ageing
        got = backend.rate_acquire("r", "equal", priority=1, ageing=ageing, **rate)
        assert (got.admitted, got.position) == (False, 1)
        # arriving in the same microsecond as "equal", "new" is stamped a microsecond later
        got = backend.rate_acquire("r", "new", priority=1, ageing=ageing + 1e-6, **rate)
        assert (got.admitted, got.position) == (False, 2)  # a tie with "old": behind
        got = backend.rate_acquire("r", "newer", priority=1, ageing=ageing + 3e-6, **rate)
        assert (got.admitted, got.position) == (False, 0)  # one microsecond ahead of "old"
        line = [w.holder for w in backend.rate_status("r").waiters]
        assert line == ["newer", "old", "equal", "new"]
    finally:
        client.close()


def test_rate_limit_line_by_priority(pg_url: str) -> None:
    client = turnstile.connect(pg_url)
    backend: Any = client.backend
    try:
        # one admission a minute: everyone after the first waits, however slow the machine
        rate = {"rate": 1, "per": 60.0, "burst": 1, "enqueue": True, "grace": LONG}
        assert backend.rate_acquire("rl", "first", **rate).admitted
        positions = []
        for holder, priority in [("a0", 0), ("b1", 1), ("c0", 0), ("d1", 1), ("e-1", -1)]:
            got = backend.rate_acquire("rl", holder, priority=priority, **rate)
            assert not got.admitted
            positions.append(got.position)
        assert positions == [0, 0, 2, 1, 4]
        status = backend.rate_status("rl")
        assert [w.holder for w in status.waiters] == ["b1", "d1", "a0", "c0", "e-1"]
        slots = [w.slot for w in status.waiters]
        assert slots == sorted(slots) and slots[1] - slots[0] == pytest.approx(60.0)
        # asking again keeps the place, whatever priority it names
        again = backend.rate_acquire("rl", "c0", priority=9, **rate)
        assert (again.admitted, again.position) == (False, 3)
    finally:
        client.close()


def test_rate_limit_newcomer_first_in_line_and_due_is_admitted_at_once(pg_url: str) -> None:
    client = turnstile.connect(pg_url)
    backend: Any = client.backend
    clock = [T0]
    backend.clock_override = lambda: clock[0]
    rate = {"rate": 1, "per": 1.0, "burst": 1, "enqueue": True, "grace": LONG}
    try:
        assert backend.rate_acquire("n", "first", **rate).admitted  # tat: T0 + 1
        assert backend.rate_acquire("n", "a0", **rate).position == 0
        assert backend.rate_acquire("n", "b1", priority=1, **rate).position == 0
        # The head's slot (T0 + 1) came and went without it coming back (it keeps its
        # place for grace): a newcomer that ranks ahead of everyone is admitted at once,
        # and the line is as it was.
        clock[0] = T0 + 1.5
        vip = backend.rate_acquire("n", "vip", priority=2, **rate)
        assert vip.admitted and vip.tat == pytest.approx(T0 + 2.5)
        assert [w.holder for w in backend.rate_status("n").waiters] == ["b1", "a0"]
        # One that ranks first but is not due joins at the front; one that does not rank
        # first joins behind those of its level or above.
        clock[0] = T0 + 1.75
        got = backend.rate_acquire("n", "vip2", priority=3, **rate)
        assert (got.admitted, got.position) == (False, 0)
        got = backend.rate_acquire("n", "c1", priority=1, **rate)
        assert (got.admitted, got.position) == (False, 2)
        # Without joining (enqueue=False) nobody is admitted past the line.
        peek = backend.rate_acquire("n", "peek", priority=5, **{**rate, "enqueue": False})
        assert not peek.admitted and peek.position is None
        assert [w.holder for w in backend.rate_status("n").waiters] == ["vip2", "b1", "c1", "a0"]
        clock[0] = T0 + 2.5
        assert backend.rate_acquire("n", "vip2", **rate).admitted
    finally:
        client.close()


def test_migration_9_keeps_the_lines_of_a_populated_version_8_schema(pg_server: str) -> None:
    """Entries in line before version 9 keep their order (even where two shared a
    microsecond or the clock stepped back) and rank as priority 0 by arrival; newcomers of
    priority 0 join behind them, higher ones ahead; calls of the previous signatures (a
    client of the previous release during an upgrade) still resolve."""
    uid = unique()
    schema = f"tt_{uid}"
    ident = pg.quote_ident(schema)
    try:
        with psycopg.connect(pg_server, autocommit=True) as conn:
            with conn.transaction():
                conn.execute(f"CREATE SCHEMA {ident}")
                conn.execute(pg.render(pg.QUERIES["create_version_table"], schema))
                for number, filename, script in pg.MIGRATIONS:
                    if number > 8:
                        break
                    conn.execute(pg.render(script, schema))
                    conn.execute(
                        pg.render(pg.QUERIES["record_version"], schema),
                        {"version": number, "name": filename},
                    )
            row = conn.execute(
                "SELECT date_trunc('second', clock_timestamp()) + interval '10 s'"
            ).fetchone()
            assert row is not None
            base: datetime.datetime = row[0]
            us = datetime.timedelta(microseconds=1)
            # w2 joined with a clock a microsecond behind w1's, w3 in w2's microsecond.
            arrivals = [("h", 0), ("w1", 2), ("w2", 1), ("w3", 1)]
            for holder, offset in arrivals:
                conn.execute(
                    f"SELECT * FROM {ident}.acquire('old', %s, 1, 600, 600, true, %s, '', "
                    "NULL)",
                    (holder, base + offset * us),
                )
                conn.execute(
                    f"SELECT * FROM {ident}.rate_acquire('rate', %s, 1, 60, 1, true, 600, %s)",
                    (holder, base + offset * us),
                )
        epoch = base.timestamp()
        client = turnstile.connect(schema_url(pg_server, uid))
        try:
            backend: Any = client.backend
            status = client.status("old")
            assert [w.holder for w in status.waiters] == ["w1", "w2", "w3"]
            stamps = [round((w.joined_at - epoch) * 1e6) for w in status.waiters]
            assert stamps == [2, 3, 4]  # strictly increasing, in their order
            rates = backend.rate_status("rate")
            assert [w.holder for w in rates.waiters] == ["w1", "w2", "w3"]
            assert [round((w.joined_at - epoch) * 1e6) for w in rates.waiters] == [2, 3, 4]
            with psycopg.connect(pg_server, autocommit=True) as conn:
                ranks = conn.execute(
                    f"SELECT w.holder, w.rank, n.newest_stamp FROM {ident}.waiters w"
                    f" JOIN {ident}.names n ON n.id = w.name_id ORDER BY w.rank, w.seq"
                ).fetchall()
            first = round(epoch * 1e6)
            assert ranks == [
                ("w1", first + 2, first + 4),
                ("w2", first + 3, first + 4),
                ("w3", first + 4, first + 4),
            ]
            # Newcomers (now, on the real clock: before base) are stamped after them.
            assert _join(backend, "old", "p0").position == 3
            assert _join(backend, "old", "p1", priority=1).position == 0
            assert _line(client, "old") == ["p1", "w1", "w2", "w3", "p0"]
            got = backend.rate_acquire(
                "rate", "r1", rate=1, per=60.0, burst=1, enqueue=True, grace=600.0, priority=1
            )
            assert (got.admitted, got.position) == (False, 0)
            got = backend.rate_acquire(
                "rate", "r0", rate=1, per=60.0, burst=1, enqueue=True, grace=600.0
            )
            assert (got.admitted, got.position) == (False, 4)
            # The previous signatures: acquire with 9 and 7 arguments, acquire_callback
            # with 7, rate_acquire with 8.
            callback = callbacks.encode(callbacks.StepFunctionsCallback("task-c"))
            with psycopg.connect(pg_server, autocommit=True) as conn:
                nine = conn.execute(
                    f"SELECT granted, queue_position FROM {ident}.acquire('x', 'a', 1, 60, 60,"
                    " true, NULL, '', NULL)"
                ).fetchone()
                seven = conn.execute(
                    f"SELECT granted, queue_position FROM {ident}.acquire('x', 'b', 1, 60, 60,"
                    " true)"
                ).fetchone()
                old_callback = conn.execute(
                    f"SELECT granted, queue_position FROM {ident}.acquire_callback('x', 'c', 1,"
                    " 60, 60, NULL, %s)",
                    (callback,),
                ).fetchone()
                eight = conn.execute(
                    f"SELECT admitted FROM {ident}.rate_acquire('y', 'a', 1, 60, 1, true, 1,"
                    " NULL)"
                ).fetchone()
            assert (nine, seven, old_callback, eight) == (
                (True, None), (False, 0), (False, 1), (True,)
            )
        finally:
            client.close()
    finally:
        with psycopg.connect(pg_server, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA IF EXISTS {ident} CASCADE")
