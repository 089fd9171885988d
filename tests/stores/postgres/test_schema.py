"""The schema Turnstile manages: created on first use by exactly one of many processes
starting at once, versioned, isolated (nothing outside it is created, same names in two
schemas stay apart, even their wake-ups), usable by a role with only the documented
privileges; and connection errors that name the problem without leaking a password."""

from __future__ import annotations

import subprocess
import sys
import time

import psycopg
import pytest

import turnstile
from turnstile.stores.postgres import sql as pg

from ._cluster import Cluster
from ._util import ROOT, schema_url, unique

pytestmark = pytest.mark.postgres

CONNECT = """
import sys, time, turnstile
start = float(sys.argv[2])
while time.time() < start:
    time.sleep(0.001)
client = turnstile.connect(sys.argv[1])
assert client.lock("migrated", ttl=5).try_acquire(sys.argv[3]) is not None
client.close()
"""


def test_concurrent_first_use_migrates_once(pg_cluster: Cluster) -> None:
    uid = unique()
    url = schema_url(pg_cluster.url, uid)
    start = time.time() + 3.0  # every process connects at this instant
    procs = [
        subprocess.Popen([sys.executable, "-c", CONNECT, url, str(start), f"p{i}"], cwd=ROOT,
                         stderr=subprocess.PIPE, text=True)
        for i in range(8)
    ]
    failures = []
    for p in procs:
        _, err = p.communicate(timeout=120)
        if p.returncode != 0:
            failures.append(err)
    assert not failures, failures[0]
    with psycopg.connect(pg_cluster.url, autocommit=True) as admin:
        versions = admin.execute(
            f'SELECT version, name FROM "tt_{uid}".schema_version ORDER BY version'
        ).fetchall()
        assert versions == [(v, n) for v, n, _ in pg.MIGRATIONS]
        waiting = admin.execute(f'SELECT count(*) FROM "tt_{uid}".waiters').fetchone()
        assert waiting == (7,)  # one holder, the seven others in line
        admin.execute(f'DROP SCHEMA "tt_{uid}" CASCADE')


def test_newer_schema_version_is_refused(pg_cluster: Cluster) -> None:
    uid = unique()
    url = schema_url(pg_cluster.url, uid)
    turnstile.connect(url).close()
    with psycopg.connect(pg_cluster.url, autocommit=True) as admin:
        admin.execute(f"INSERT INTO \"tt_{uid}\".schema_version VALUES (999, 'future')")
        try:
            with pytest.raises(turnstile.ConfigurationError, match="newer than this release"):
                turnstile.connect(url)
        finally:
            admin.execute(f'DROP SCHEMA "tt_{uid}" CASCADE')


def _objects_outside(admin: psycopg.Connection, schemas: list[str]) -> list[tuple[str, str]]:
    return admin.execute(
        """
        SELECT n.nspname, c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
        WHERE n.nspname NOT IN ('pg_catalog', 'information_schema', 'pg_toast')
          AND NOT n.nspname = ANY(%(schemas)s)
        UNION ALL
        SELECT n.nspname, p.proname FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
        WHERE n.nspname NOT IN ('pg_catalog', 'information_schema')
          AND NOT n.nspname = ANY(%(schemas)s)
        UNION ALL
        SELECT n.nspname, '' FROM pg_namespace n
        WHERE n.nspname NOT IN ('pg_catalog', 'information_schema', 'pg_toast', 'public')
          AND n.nspname NOT LIKE 'pg_temp%%' AND n.nspname NOT LIKE 'pg_toast_temp%%'
          AND NOT n.nspname = ANY(%(schemas)s)
        """,
        {"schemas": schemas},
    ).fetchall()


def test_schemas_are_isolated(pg_cluster: Cluster) -> None:
    uid = unique()
    database = f"tt_iso_{uid}"
    with psycopg.connect(pg_cluster.url, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{database}"')
    server = pg_cluster.url.rsplit("/", 1)[0] + "/" + database
    weird = 'Odd "schema"; DROP TABLE x; --'
    try:
        a = turnstile.connect(schema_url(server, "a"))
        b = turnstile.connect(server + "?schema=" + psycopg.sql.quote(weird)[1:-1]
                              .replace("%", "%25").replace("&", "%26").replace(" ", "%20"))
        try:
            assert b.backend.config.schema == weird  # type: ignore[attr-defined]
            assert a.lock("same", ttl=30).try_acquire("x").acquired
            assert b.lock("same", ttl=30).try_acquire("y").acquired
            assert [h.holder for h in a.lock("same").status().holders] == ["x"]
            assert [h.holder for h in b.lock("same").status().holders] == ["y"]
            # Hand-overs in b make no sound on a's channel.
            with psycopg.connect(server, autocommit=True) as listen:
                listen.execute(f"LISTEN {pg.quote_ident(a.backend.config.channel)}")  # type: ignore[attr-defined]
                assert not b.lock("same", ttl=30).try_acquire("z").acquired
                assert b.lock("same").release("y")
                assert list(listen.notifies(timeout=0.5)) == []
            assert b.lock("same", ttl=30).try_acquire("z").acquired
            with psycopg.connect(server, autocommit=True) as admin:
                assert _objects_outside(admin, ["tt_a", weird]) == []
        finally:
            a.close()
            b.close()
    finally:
        with psycopg.connect(pg_cluster.url, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE "{database}" WITH (FORCE)')


def test_least_privileged_role(pg_cluster: Cluster) -> None:
    """docs/postgres.md: a migrating role needs CREATE on the database (or an existing schema
    it owns); the application role needs only USAGE, table DML, sequence USAGE, EXECUTE."""
    uid = unique()
    schema, role = f"tt_{uid}", f"tt_app_{uid}"
    app_url = pg_cluster.url.replace("postgres@", f"{role}:secret-{uid}@", 1)
    with psycopg.connect(pg_cluster.url, autocommit=True) as admin:
        admin.execute(f"CREATE ROLE {role} LOGIN PASSWORD 'secret-{uid}'")
        admin.execute(f"REVOKE CREATE ON SCHEMA public FROM {role}")
    try:
        # No privilege to create the schema: a ConfigurationError that says so, no password.
        with pytest.raises(turnstile.ConfigurationError) as info:
            turnstile.connect(schema_url(app_url, uid))
        assert "privilege" in str(info.value).lower() or "permission" in str(info.value)
        assert f"secret-{uid}" not in str(info.value)
        # The owner migrates; the application role gets the documented grants.
        turnstile.connect(schema_url(pg_cluster.url, uid)).close()
        with psycopg.connect(pg_cluster.url, autocommit=True) as admin:
            for grant in (
                f"GRANT USAGE ON SCHEMA {schema} TO {role}",
                f"GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA {schema} TO {role}",
                f"GRANT USAGE ON ALL SEQUENCES IN SCHEMA {schema} TO {role}",
                f"GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA {schema} TO {role}",
            ):
                admin.execute(grant)
        client = turnstile.connect(schema_url(app_url, uid))
        try:
            lock = client.lock("least", ttl=5)
            with lock.acquire(timeout=5) as lease:
                assert lease.token > 0
            assert lock.try_acquire("a").acquired
            assert not lock.try_acquire("b").acquired
            assert lock.release("a")
            assert lock.try_acquire("b").acquired
            assert client.names() == ["least"]
        finally:
            client.close()
    finally:
        with psycopg.connect(pg_cluster.url, autocommit=True) as admin:
            admin.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
            admin.execute(f"DROP ROLE {role}")


def test_connection_errors_name_the_problem(pg_cluster: Cluster) -> None:
    started = time.monotonic()
    with pytest.raises(turnstile.BackendUnavailable) as info:
        turnstile.connect("postgresql://someone:hunter2@127.0.0.1:1/db")
    assert time.monotonic() - started < 3, "an unreachable server must fail at once"
    assert "hunter2" not in str(info.value) and "127.0.0.1" in str(info.value)
    assert isinstance(info.value.__cause__, psycopg.Error)

    with pytest.raises(turnstile.ConfigurationError, match="does not exist"):
        turnstile.connect(pg_cluster.url.rsplit("/", 1)[0] + f"/nodb_{unique()}")
    with pytest.raises(turnstile.ConfigurationError, match="invalid PostgreSQL URL") as info2:
        turnstile.connect(pg_cluster.url + "?no_such_libpq_option=1&password=hunter2")
    assert "hunter2" not in str(info2.value)
    for bad, match in [
        ("schema=", "schema"),
        ("schema=" + "x" * 64, "schema"),
        ("pool_max=0", "pool_max"),
        ("pool_min=5&pool_max=2", "pool_max"),
        ("retry_timeout=-1", "retry_timeout"),
        ("retry_timeout=nan", "retry_timeout"),
        ("listen=maybe", "listen"),
        ("listen_url=redis://x", "listen_url"),
    ]:
        with pytest.raises(turnstile.ConfigurationError, match=match):
            turnstile.connect(pg_cluster.url + "?" + bad)
