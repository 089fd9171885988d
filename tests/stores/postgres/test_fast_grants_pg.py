"""Fast grants on PostgreSQL (schema version 12): a grant of an idle name kept in the name's
row, freed by its holder's release from that row alone, moved into holders by every other
step. Migrating a populated version-10 schema keeps every lease and place; a client of the
previous release (its calls of the functions) sees fast grants as holders; an idle name is
still forgotten after a day, never before. (The state machine, fast grants included, is held
to lock_machine.py by test_model_equivalence.py, with and without prepare=on.)"""

from __future__ import annotations

import datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import psycopg
import pytest

import turnstile
from turnstile.stores.postgres import sql as pg

from ._util import schema_url, unique
from .test_groups_pg import _migrate_to

pytestmark = pytest.mark.postgres

LONG = 600.0


def _row(conn: psycopg.Connection[Any], schema: str, name: str) -> Any:
    return conn.execute(
        f"SELECT busy, h_holder, last_token, idle_since FROM {pg.quote_ident(schema)}.names"
        " WHERE name = %s",
        (name,),
    ).fetchone()


def _holders(conn: psycopg.Connection[Any], schema: str, name: str) -> list[str]:
    ident = pg.quote_ident(schema)
    return [
        r[0]
        for r in conn.execute(
            f"SELECT h.holder FROM {ident}.holders h JOIN {ident}.names n ON n.id = h.name_id"
            " WHERE n.name = %s ORDER BY h.token",
            (name,),
        )
    ]


@pytest.mark.parametrize("prepare", ["off", "on"])
def test_migration_12_keeps_a_populated_version_10_schema(pg_server: str, prepare: str) -> None:
    uid = unique()
    schema = f"tt_{uid}"
    ident = pg.quote_ident(schema)
    call = (
        f"SELECT granted, token FROM {ident}.acquire(%s, %s, 1, {LONG}, {LONG}, true, NULL,"
        " '', NULL)"
    )
    try:
        with psycopg.connect(pg_server, autocommit=True) as conn:
            _migrate_to(conn, schema, 10)
            # Version 10: a lock held with one waiter, and a name used and idle again.
            held = conn.execute(call, ("busy", "h")).fetchone()
            assert conn.execute(call, ("busy", "w")).fetchone() == (False, None)
            idle = conn.execute(call, ("idle", "a")).fetchone()
            assert held is not None and idle is not None
            conn.execute(f"SELECT {ident}.release('idle', 'a', %s)", (idle[1],))
        client = turnstile.connect(schema_url(pg_server, uid, prepare=prepare))
        try:
            backend: Any = client.backend
            with psycopg.connect(pg_server, autocommit=True) as conn:
                assert _row(conn, schema, "busy")[0] is True
                assert _row(conn, schema, "idle")[0] is False
            # The line goes on as before: the release hands over to the waiter.
            assert backend.release("busy", "h", held[1])
            assert [h.holder for h in client.status("busy").holders] == ["w"]
            # The idle name is granted fast, with a token above its last one.
            lease = client.lock("idle", ttl=LONG).acquire(holder="b")
            assert lease.token > idle[1]
            with psycopg.connect(pg_server, autocommit=True) as conn:
                assert _row(conn, schema, "idle")[:2] == (True, "b")
                assert _holders(conn, schema, "idle") == []
            assert [h.holder for h in client.status("idle").holders] == ["b"]
            assert lease.release()
            with psycopg.connect(pg_server, autocommit=True) as conn:
                busy, fast, _, since = _row(conn, schema, "idle")
                assert (busy, fast) == (False, None) and since is not None
        finally:
            client.close()
    finally:
        with psycopg.connect(pg_server, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA IF EXISTS {ident} CASCADE")


@pytest.mark.parametrize("prepare", ["off", "on"])
def test_a_fast_grant_moves_into_holders_when_anything_else_happens(
    pg_url: str, prepare: str
) -> None:
    client = turnstile.connect(f"{pg_url}&prepare={prepare}")
    backend: Any = client.backend
    schema = backend.config.schema
    ident = pg.quote_ident(schema)
    try:
        # A name's first grant makes its row (the function); the next ones, idle, are fast.
        for name in "abcde":
            g = backend.acquire(name, "w", limit=1, ttl=LONG, wait_ttl=LONG, enqueue=True)
            assert backend.release(name, "w", g.grant.token)
        with psycopg.connect(backend.config.conninfo, autocommit=True) as conn:
            # A waiter joining: the fast grant moves into holders, the line forms behind it,
            # and the holder's release hands over (through the function).
            first = backend.acquire("a", "h1", limit=1, ttl=LONG, wait_ttl=LONG, enqueue=True)
            assert first.grant is not None and _row(conn, schema, "a")[1] == "h1"
            second = backend.acquire("a", "h2", limit=1, ttl=LONG, wait_ttl=LONG, enqueue=True)
            assert second.grant is None and second.position == 0
            assert _row(conn, schema, "a")[1] is None
            assert _holders(conn, schema, "a") == ["h1"]
            assert backend.release("a", "h1", first.grant.token)
            assert [h.holder for h in client.status("a").holders] == ["h2"]

            # A renewal moves it too (the lease goes on, renewed); then the release frees it.
            lease = client.lock("b", ttl=LONG).acquire(holder="r")
            assert _row(conn, schema, "b")[1] == "r"
            lease.renew()
            assert _row(conn, schema, "b")[1] is None and _holders(conn, schema, "b") == ["r"]
            assert lease.release() and _row(conn, schema, "b")[0] is False

            # set_limit of a semaphore held fast: the grant kept, the next one granted.
            sem = client.semaphore("c", 1, ttl=LONG)
            one = sem.acquire(holder="s1")
            assert _row(conn, schema, "c")[1] == "s1"
            assert backend.set_limit("c", 2) == 1
            two = client.semaphore("c", 2, ttl=LONG).acquire(holder="s2", timeout=0)
            assert [h.holder for h in client.status("c").holders] == ["s1", "s2"]
            assert one.release() and two.release()

            # A client of the previous release: its release() frees a fast grant, status() and
            # names_in_use() show one.
            fast = backend.acquire("d", "o", limit=1, ttl=LONG, wait_ttl=LONG, enqueue=True)
            assert fast.grant is not None
            old_status = conn.execute(f"SELECT holders::text FROM {ident}.status('d')").fetchone()
            assert old_status is not None and '"o"' in old_status[0]
            names = [r[0] for r in conn.execute(f"SELECT * FROM {ident}.names_in_use('', 10)")]
            assert "d" in names
            released = conn.execute(
                f"SELECT {ident}.release('d', 'o', %s)", (fast.grant.token,)
            ).fetchone()
            assert released == (True,) and _row(conn, schema, "d")[:2] == (False, None)

            # A release with a stale token or another holder's name releases nothing (the
            # function, which moves the fast grant into holders); the holder's own does.
            fast = backend.acquire("e", "x", limit=1, ttl=LONG, wait_ttl=LONG, enqueue=True)
            assert fast.grant is not None
            assert not backend.release("e", "x", fast.grant.token - 1)
            assert not backend.release("e", "y", fast.grant.token)
            assert [(h.holder, h.token) for h in client.status("e").holders] == [
                ("x", fast.grant.token)
            ]
            assert backend.release("e", "x", fast.grant.token)
            assert _row(conn, schema, "e")[0] is False and client.status("e").holders == ()
    finally:
        client.close()


@pytest.mark.parametrize("prepare", ["off", "on"])
def test_an_expired_fast_grant_is_taken_over_with_a_larger_token(
    pg_url: str, prepare: str
) -> None:
    client = turnstile.connect(f"{pg_url}&prepare={prepare}")
    backend: Any = client.backend
    clock = [1_900_000_000.0]
    backend.clock_override = lambda: clock[0]
    try:
        for name in "nm":
            g = backend.acquire(name, "w", limit=1, ttl=10.0, wait_ttl=10.0, enqueue=True)
            assert backend.release(name, "w", g.grant.token)
        old = backend.acquire("n", "old", limit=1, ttl=10.0, wait_ttl=10.0, enqueue=True)
        assert old.grant is not None
        clock[0] += 11.0
        new = backend.acquire("n", "new", limit=1, ttl=10.0, wait_ttl=10.0, enqueue=True)
        assert new.grant is not None and new.grant.token > old.grant.token
        assert not backend.release("n", "old", old.grant.token)  # expired, then taken over
        assert [h.holder for h in client.status("n").holders] == ["new"]
        # An expired fast grant released by its holder, nobody else having come: freed, and
        # reported as not released (it had expired).
        clock[0] += 1.0
        assert backend.release("n", "new", new.grant.token)
        lone = backend.acquire("m", "l", limit=1, ttl=10.0, wait_ttl=10.0, enqueue=True)
        assert lone.grant is not None
        clock[0] += 11.0
        assert not backend.release("m", "l", lone.grant.token)
        assert client.status("m").holders == ()
        again = backend.acquire("m", "l2", limit=1, ttl=10.0, wait_ttl=10.0, enqueue=True)
        assert again.grant is not None and again.grant.token > lone.grant.token
    finally:
        client.close()


@pytest.mark.parametrize("prepare", ["on", "off"])
def test_idle_names_are_forgotten_after_a_day_only(pg_url: str, prepare: str) -> None:
    """A name idle with no grant for a day is forgotten when new names are made; one whose
    idle_since hint is old but which was granted (fast) recently is kept, and moved out of
    the forgetter's way. prepare=on makes the new name with acquire_fresh (one INSERT),
    prepare=off with the acquire function."""
    client = turnstile.connect(f"{pg_url}{'&' if '?' in pg_url else '?'}prepare={prepare}")
    backend: Any = client.backend
    schema = backend.config.schema
    day = 86400.0
    clock = [1_900_000_000.0]
    backend.clock_override = lambda: clock[0]
    try:
        for name in ("old", "used"):
            g = backend.acquire(name, "h", limit=1, ttl=10.0, wait_ttl=10.0, enqueue=True)
            assert backend.release(name, "h", g.grant.token)
        clock[0] += 2 * day
        g = backend.acquire("used", "h", limit=1, ttl=10.0, wait_ttl=10.0, enqueue=True)
        assert backend.release("used", "h", g.grant.token)  # fast both ways: hint unchanged
        with psycopg.connect(backend.config.conninfo, autocommit=True) as conn:
            hint = _row(conn, schema, "used")[3]
            assert hint.timestamp() == pytest.approx(clock[0] - 2 * day, abs=1)
        backend.acquire("fresh", "h", limit=1, ttl=10.0, wait_ttl=10.0, enqueue=True)
        with psycopg.connect(backend.config.conninfo, autocommit=True) as conn:
            assert _row(conn, schema, "old") is None  # forgotten
            busy, _, token, hint = _row(conn, schema, "used")
            assert busy is False and token == g.grant.token  # kept
            # its hint moved to its last grant, out of the forgetter's way for a day
            assert hint == datetime.datetime.fromtimestamp(token / 1e6, tz=datetime.UTC)
    finally:
        client.close()


def test_a_new_name_is_made_and_granted_by_one_insert(pg_url: str) -> None:
    """prepare=on: a name the client has not acquired goes by acquire_fresh. A new name's row
    is made with the fast grant in it (no holders row: the acquire function did not run); on
    a name that has its row, another client's first acquire is a fast grant when it is idle
    and waits in line when it is busy, as acquire_fast would."""
    one = turnstile.connect(f"{pg_url}&prepare=on")
    two = turnstile.connect(f"{pg_url}&prepare=on")
    a: Any = one.backend
    b: Any = two.backend
    schema = a.config.schema
    try:
        with psycopg.connect(a.config.conninfo, autocommit=True) as conn:
            g = a.acquire("new", "h1", limit=1, ttl=LONG, wait_ttl=LONG, enqueue=True)
            assert g.grant is not None and "new" in a._known
            busy, inline, token, hint = _row(conn, schema, "new")
            assert (busy, inline, token, hint) == (True, "h1", g.grant.token, None)
            assert _holders(conn, schema, "new") == []
            # Busy: the other client (which has not seen the name) joins the line.
            w = b.acquire("new", "h2", limit=1, ttl=LONG, wait_ttl=LONG, enqueue=True)
            assert w.grant is None and w.position == 0 and "new" in b._known
            assert a.release("new", "h1", g.grant.token)
            assert [h.holder for h in one.status("new").holders] == ["h2"]
            assert b.release("new", "h2", None)
            # Idle, with its row: a third client's first acquire is a fast grant, token up.
            three = turnstile.connect(f"{pg_url}&prepare=on")
            try:
                again = three.backend.acquire(
                    "new", "h3", limit=2, ttl=LONG, wait_ttl=LONG, enqueue=True
                )
                assert again.grant is not None and again.grant.token > g.grant.token
                assert _row(conn, schema, "new")[:2] == (True, "h3")
                assert one.status("new").limit == 2  # an idle name takes the caller's limit
            finally:
                three.close()
    finally:
        one.close()
        two.close()


def test_the_names_a_client_remembers_are_bounded(pg_url: str, monkeypatch: Any) -> None:
    from turnstile._sync.backends import postgres as backend_module

    monkeypatch.setattr(backend_module, "KNOWN_MAX", 3)
    client = turnstile.connect(f"{pg_url}&prepare=on")
    backend: Any = client.backend
    try:
        for name in "abcde":
            g = backend.acquire(name, "h", limit=1, ttl=LONG, wait_ttl=LONG, enqueue=True)
            assert backend.release(name, "h", g.grant.token)
        assert list(backend._known) == ["c", "d", "e"]
    finally:
        client.close()
    off = turnstile.connect(f"{pg_url}&prepare=off")
    try:
        g = off.backend.acquire("f", "h", limit=1, ttl=LONG, wait_ttl=LONG, enqueue=True)
        assert g.grant is not None and not off.backend._known  # the function: no hint kept
    finally:
        off.close()


def test_a_name_idle_at_its_last_acquires_is_granted_by_the_bare_update(pg_url: str) -> None:
    """prepare=on: a name whose last IDLE_STREAK acquires by this client were fast grants goes
    by acquire_idle, the UPDATE alone (one statement, the function never planned in). When
    another client took the name meanwhile, that UPDATE changes nothing and the function does
    the whole step (the caller joins the line: one statement more), and the streak starts
    again: the caller's next steps are acquire_fast, one statement each."""
    from turnstile._sync.backends.postgres import IDLE_STREAK

    assert IDLE_STREAK >= 2
    one = turnstile.connect(f"{pg_url}&prepare=on")
    two = turnstile.connect(f"{pg_url}&prepare=on")
    a: Any = one.backend
    b: Any = two.backend

    def cycle(expect_statements: int, expect_streak: int) -> int:
        sent = a.statements
        g = a.acquire("n", "h1", limit=1, ttl=LONG, wait_ttl=LONG, enqueue=True)
        assert g.grant is not None
        assert (a.statements - sent, a._known["n"]) == (expect_statements, expect_streak)
        sent = a.statements
        assert a.release("n", "h1", g.grant.token)
        assert a.statements - sent == 1  # release_fast, or release_idle after a streak
        return int(g.grant.token)

    try:
        tokens = [cycle(1, 1)]  # acquire_fresh: a fast grant
        for streak in range(2, IDLE_STREAK + 1):
            tokens.append(cycle(1, streak))  # acquire_fast: fast grants in a row
        tokens.append(cycle(1, IDLE_STREAK))  # acquire_idle
        assert tokens == sorted(set(tokens))
        # Another client holds it now: the bare UPDATE grants nothing, the function queues.
        other = b.acquire("n", "h2", limit=1, ttl=LONG, wait_ttl=LONG, enqueue=True)
        assert other.grant is not None
        sent = a.statements
        w = a.acquire("n", "h1", limit=1, ttl=LONG, wait_ttl=LONG, enqueue=True)
        assert w.grant is None and w.position == 0 and w.wait_id is not None
        assert a.statements - sent == 2 and a._known["n"] == 0
        sent = a.statements
        still = a.acquire("n", "h1", limit=1, ttl=LONG, wait_ttl=LONG, enqueue=True)
        assert still.grant is None and still.position == 0 and still.wait_id == w.wait_id
        assert a.statements - sent == 1  # acquire_fast, which calls the function itself
        # The holder leaves: the waiter's next step finds its grant (by the function); the
        # name's next fast grants build the streak again.
        assert b.release("n", "h2", other.grant.token)
        mine = a.acquire("n", "h1", limit=1, ttl=LONG, wait_ttl=LONG, enqueue=True)
        assert mine.grant is not None and a._known["n"] == 0  # granted by the function
        assert a.release("n", "h1", mine.grant.token)
        for streak in range(1, IDLE_STREAK + 1):
            cycle(1, streak)
        cycle(1, IDLE_STREAK)
        # A waiter came while this client held a grant taken by the bare UPDATE: the bare
        # release frees nothing (the grant is a holder now), the function hands it over.
        held = a.acquire("n", "h1", limit=1, ttl=LONG, wait_ttl=LONG, enqueue=True)
        assert held.grant is not None and a._known["n"] == IDLE_STREAK
        queued = b.acquire("n", "h2", limit=1, ttl=LONG, wait_ttl=LONG, enqueue=True)
        assert queued.grant is None and queued.position == 0
        sent = a.statements
        assert a.release("n", "h1", held.grant.token)
        assert a.statements - sent == 2
        assert [h.holder for h in one.status("n").holders] == ["h2"]
        handed = b.acquire("n", "h2", limit=1, ttl=LONG, wait_ttl=LONG, enqueue=True)
        assert handed.grant is not None and handed.grant.token > held.grant.token
        assert b.release("n", "h2", handed.grant.token)
        # A token that is not the grant's: the bare release frees nothing, and the function
        # answers False.
        lapsed = a.acquire("n", "h1", limit=1, ttl=LONG, wait_ttl=LONG, enqueue=True)
        assert lapsed.grant is not None
        assert not a.release("n", "h1", lapsed.grant.token + 1)  # not this holder's token
        assert a.release("n", "h1", lapsed.grant.token)
        # A try-acquire (no line) of a busy name: refused, nothing left behind.
        other = b.acquire("n", "h2", limit=1, ttl=LONG, wait_ttl=LONG, enqueue=True)
        refused = a.acquire("n", "h1", limit=1, ttl=LONG, wait_ttl=LONG, enqueue=False)
        assert refused.grant is None and refused.wait_id is None and a._known["n"] == 0
        assert [h.holder for h in one.status("n").holders] == ["h2"]
        assert not one.status("n").waiters
    finally:
        one.close()
        two.close()


def test_a_fast_grants_times_are_the_functions(pg_url: str) -> None:
    """The fast paths answer a grant's times with date_part('epoch', ...) (queries.sql), the
    functions with extract(epoch ...): the same floats, to the last bit, whichever answered
    (acquire_fresh, acquire_fast, acquire_idle), as status reads them back."""
    from turnstile._sync.backends.postgres import IDLE_STREAK

    client = turnstile.connect(f"{pg_url}&prepare=on")
    backend: Any = client.backend
    try:
        for _ in range(IDLE_STREAK + 2):
            g = backend.acquire("t", "h1", limit=1, ttl=LONG, wait_ttl=LONG, enqueue=True)
            assert g.grant is not None
            (held,) = client.lock("t").status().holders
            assert (held.token, held.acquired_at, held.expires_at) == (
                g.grant.token, g.grant.acquired_at, g.grant.expires_at
            )
            assert g.now == g.grant.acquired_at
            assert backend.release("t", "h1", g.grant.token)
        assert backend._known["t"] == IDLE_STREAK  # the last ones went by acquire_idle
    finally:
        client.close()


def test_acquire_idle_is_acquire_fasts_update() -> None:
    """acquire_idle and acquire_fast share their UPDATE (queries.sql's FAST_GRANT part), and
    acquire_fresh's ON CONFLICT branch repeats its SET. They must grant alike."""
    import re

    def update(name: str) -> str:
        text = pg.QUERIES[name]
        body = text[text.index("UPDATE __SCHEMA__.names n") : text.index("RETURNING")]
        return re.sub(r"\s+", " ", body).strip()

    assert update("acquire_idle") == update("acquire_fast")
    fresh = re.sub(r"\s+", " ", pg.QUERIES["acquire_fresh"])
    fast_set = update("acquire_fast").split(" SET ", 1)[1].split(" WHERE ")[0]
    fresh_set = fresh[fresh.index("DO UPDATE SET ") + len("DO UPDATE SET ") :]
    # The token and times alike (the rest names excluded.*, the same values).
    assert fresh_set.startswith(fast_set.split(" lim = ")[0])


@pytest.mark.parametrize("name", ["n", "ünïcødé", "名前/🔒", "a" * 4096, "quote's \\ \"x\""])
def test_the_clients_name_key_is_the_functions(pg_url: str, name: str) -> None:
    """The plain statements find a name's row by the key the client computed (name_key);
    the functions and acquire_fresh make it in SQL. They must agree on every name."""
    client = turnstile.connect(pg_url)
    try:
        backend: Any = client.backend
        with psycopg.connect(backend.config.conninfo, autocommit=True) as conn:
            row = conn.execute("SELECT sha256(convert_to(%s::text, 'UTF8'))", (name,)).fetchone()
        assert row is not None and bytes(row[0]) == pg.name_key(name)
    finally:
        client.close()


def test_a_wrong_name_key_only_misses(pg_url: str) -> None:
    """The plain statements check the row's name as well as its key: a key that is not the
    name's (a bug, or another name's key) grants and frees nothing."""
    client = turnstile.connect(f"{pg_url}&prepare=on")
    backend: Any = client.backend
    try:
        g = backend.acquire("k1", "h", limit=1, ttl=LONG, wait_ttl=LONG, enqueue=True)
        assert backend.release("k1", "h", g.grant.token)
        backend.acquire("k2", "h", limit=1, ttl=LONG, wait_ttl=LONG, enqueue=True)
        with psycopg.connect(backend.config.conninfo, autocommit=True) as conn:
            params = {"name": "k2", "name_key": pg.name_key("k1"), "holder": "x", "limit": 1,
                      "ttl": LONG, "now": None, "key": None, "per_key": None}
            assert conn.execute(backend._q["acquire_idle"], params).fetchone() is None
            params = {"name": "k1", "name_key": pg.name_key("k2"), "holder": "h",
                      "token": g.grant.token, "now": None}
            assert conn.execute(backend._q["release_idle"], params).fetchone() is None
        assert [h.holder for h in client.status("k1").holders] == []
        assert [h.holder for h in client.status("k2").holders] == ["h"]
    finally:
        client.close()


def test_a_small_names_table_is_read_through_the_keys_index(pg_url: str) -> None:
    """Schema version 19 keeps the names table's file at a few dozen pages (padding rows
    written and deleted, vacuum_truncate off): with only five names and fresh statistics the
    planner still finds a name by the key's index in the fast statements and the functions'
    key lookup, instead of reading every row (its choice on a file of a few pages)."""
    client = turnstile.connect(f"{pg_url}&prepare=on")
    backend: Any = client.backend
    try:
        for i in range(5):
            lease = client.lock(f"small-{i}", ttl=LONG).acquire(holder="h")
            lease.release()
        ident = pg.quote_ident(backend.config.schema)
        with psycopg.connect(backend.config.conninfo, autocommit=True) as conn:
            conn.execute(f"VACUUM ANALYZE {ident}.names")
            pages = conn.execute(
                f"SELECT pg_relation_size('{ident}.names') / current_setting('block_size')::int"
            ).fetchone()
            live = conn.execute(f"SELECT count(*) FROM {ident}.names").fetchone()
            assert pages is not None and pages[0] >= 16
            assert live == (5,)  # the padding rows are gone, their pages are not
            cur = psycopg.ClientCursor(conn)
            grant = {"name": "small-1", "name_key": pg.name_key("small-1"), "holder": "x",
                     "limit": 1, "ttl": LONG, "now": None, "key": None, "per_key": None}
            free = {"name": "small-1", "name_key": pg.name_key("small-1"), "holder": "x",
                    "token": 1, "now": None}
            lookup = f"SELECT id FROM {ident}.names WHERE key = %(name_key)s::bytea"
            for text, params in [
                (backend._q["acquire_idle"], grant),
                (backend._q["release_idle"], free),
                (lookup, grant),
            ]:
                plan = "\n".join(r[0] for r in cur.execute(f"EXPLAIN {text}", params))
                assert "Index Scan" in plan and "Seq Scan" not in plan, plan
    finally:
        client.close()


def test_release_idle_is_release_fasts_update() -> None:
    """release_idle and release_fast share their UPDATE (queries.sql's FAST_FREE part) and
    return the same column. They must free alike."""
    import re

    def update(name: str) -> str:
        text = pg.QUERIES[name]
        body = text[text.index("UPDATE __SCHEMA__.names n") : text.index("RETURNING")]
        return re.sub(r"\s+", " ", body).strip()

    def returning(name: str) -> str:
        text = pg.QUERIES[name]
        line = text[text.index("RETURNING") :].split(")\nSELECT")[0].splitlines()[0]
        return re.sub(r"\s+", " ", line).strip()

    assert update("release_idle") == update("release_fast")
    assert returning("release_idle") == returning("release_fast")


def test_acquire_idle_is_relaxed_and_has_a_function_to_fall_back_to(pg_url: str) -> None:
    """With durability=relaxed the bare UPDATE commits without waiting for the disk, as
    acquire_fast does; a connection that stops preparing sends the function in its place."""
    relaxed = pg.parse_url(f"{pg_url}&durability=relaxed", urlsplit(f"{pg_url}&durability=relaxed"))
    durable = pg.parse_url(pg_url, urlsplit(pg_url))
    assert pg.RELAXED_FILTER in relaxed.query("acquire_idle")
    assert pg.RELAXED_FILTER not in durable.query("acquire_idle")
    assert pg.UNPREPARED["acquire_idle"] == "acquire"
    assert pg.RELAXED_FILTER in relaxed.query("release_idle")
    # The setting is in the RETURNING, evaluated once for the row changed: never in the WHERE
    # clause, which a sequential scan (the planner's choice on a small table) would
    # evaluate for every row it reads.
    for name in ("acquire_idle", "release_idle"):
        where, returning = relaxed.query(name).split("RETURNING")
        assert "synchronous_commit" not in where and pg.RELAXED_FILTER in returning
    # Durable: the release that frees an idle name (granting nobody) does not wait either,
    # its setting in the RETURNING; strict: it waits.
    assert pg.UNFLUSHED_TEST in durable.query("release_idle").split("RETURNING")[1]
    assert pg.RELAXED_FILTER not in durable.query("release_idle").split("RETURNING")[0]
    strict = pg.parse_url(f"{pg_url}&durability=strict", urlsplit(f"{pg_url}&durability=strict"))
    assert "synchronous_commit" not in strict.query("release_idle")
    assert pg.UNPREPARED["release_idle"] == "release"
    client = turnstile.connect(f"{pg_url}&prepare=on&durability=relaxed")
    backend: Any = client.backend
    try:
        from turnstile._sync.backends.postgres import IDLE_STREAK

        # acquire_fresh, acquire_fast, then acquire_idle
        for streak in [*range(1, IDLE_STREAK + 1), IDLE_STREAK, IDLE_STREAK]:
            g = backend.acquire("r", "h", limit=1, ttl=LONG, wait_ttl=LONG, enqueue=True)
            assert g.grant is not None and backend._known["r"] == streak
            assert backend.release("r", "h", g.grant.token)
    finally:
        client.close()


def test_queries_sql_parts_are_filled_in_and_never_queries(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A "-- part:" block is shared text: every __NAME__ of it in a query (or a later part) is
    replaced, it is no query itself, and a query naming a part nobody defined is refused at
    load."""
    parts = ["FAST_TIMES", "FAST_GRANT", "FAST_FREE", "FAST_ROW", "ACQUIRE_FALLBACK"]
    for part in parts:
        assert part not in pg.QUERIES
        for text in pg.QUERIES.values():
            assert f"__{part}__" not in text
    (tmp_path / "queries.sql").write_text(
        "-- part: ROW\n-- a comment\nSELECT 1\n\n-- part: ROWS\n__ROW__ UNION ALL __ROW__\n\n"
        "-- name: one\n__ROW__ AS a\n\n"
        "-- name: two\nSELECT (__ROW__) FROM __SCHEMA__.t WHERE __RELAXED__\n\n"
        "-- name: three\n__ROWS__\n",
        "utf-8",
    )
    monkeypatch.setattr(pg, "_sql_folder", lambda: tmp_path)
    assert pg._load_queries() == {
        "one": "SELECT 1 AS a",
        "two": "SELECT (SELECT 1) FROM __SCHEMA__.t WHERE __RELAXED__",
        "three": "SELECT 1 UNION ALL SELECT 1",
    }
    (tmp_path / "queries.sql").write_text("-- name: one\nSELECT __NOPE__\n", "utf-8")
    with pytest.raises(RuntimeError, match="NOPE"):
        pg._load_queries()
