"""``turnstile migrate``: the schema version, the SQL a DBA reviews and applies (``--print-sql``)
and ``--apply``; a role that may not create the schema is told to use it. PostgreSQL with a
real restricted role of the test's own (and its own schemas), dropped afterwards; SQLite on
the test's own files. Redis 7: the function libraries shown, loaded (``--apply``) and other
releases' deleted (``--prune``), on a redis-server of the test's own."""

from __future__ import annotations

import json
import os
import secrets
import sqlite3
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import pytest

import turnstile
from tests.backends import with_query

from ._invoke import run


@dataclass
class PgSetup:
    admin: str  # the server's URL (a role that may create schemas)
    role: str
    password: str
    schema: str

    def url(self, *, as_role: bool, schema: str | None = None) -> str:
        base = self.admin
        if as_role:
            parts = urlsplit(self.admin)
            netloc = f"{self.role}:{self.password}@{parts.hostname}"
            if parts.port:
                netloc += f":{parts.port}"
            base = urlunsplit(parts._replace(netloc=netloc))
        return with_query(base, schema=schema or self.schema)


@pytest.fixture
def pg() -> Iterator[PgSetup]:
    psycopg = pytest.importorskip("psycopg")
    server = os.environ.get("TURNSTILE_TEST_POSTGRES_URL")
    if not server:
        if os.environ.get("CI"):
            pytest.fail("TURNSTILE_TEST_POSTGRES_URL is not set")
        pytest.skip("TURNSTILE_TEST_POSTGRES_URL is not set")
    uid = secrets.token_hex(5)
    setup = PgSetup(server, f"tt_mig_{uid}", f"secret-{uid}", f"tt_{uid}")
    with psycopg.connect(server, autocommit=True) as admin:
        # LOGIN only: no CREATE on the database, so it cannot create a schema.
        admin.execute(f"CREATE ROLE {setup.role} LOGIN PASSWORD '{setup.password}'")
    try:
        yield setup
    finally:
        with psycopg.connect(server, autocommit=True) as admin:
            for schema in (setup.schema, f"{setup.schema}b"):
                admin.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
            admin.execute(f"DROP OWNED BY {setup.role}")
            admin.execute(f"DROP ROLE {setup.role}")


def test_restricted_role_is_told_to_use_migrate_and_a_dba_applies_the_sql(pg: PgSetup) -> None:
    import psycopg

    role_url = pg.url(as_role=True)
    # The application's role may not create the schema: the error names the command.
    with pytest.raises(turnstile.ConfigurationError) as info:
        turnstile.connect(role_url)
    message = str(info.value)
    assert "turnstile migrate" in message and "--print-sql" in message
    assert pg.password not in message
    cli = run("status", "--url", role_url)
    assert cli.returncode == 78
    assert "turnstile migrate" in cli.stderr and pg.password not in cli.stderr

    # It may read the version (0: no schema yet); the command says what to do.
    shown = run("migrate", "--url", role_url)
    assert shown.returncode == 1, shown.stderr
    assert f"schema {pg.schema!r}: schema version 0 of " in shown.stdout
    assert "--apply" in shown.stdout
    data = json.loads(run("migrate", "--url", role_url, "--json").stdout)
    assert data["store"] == "postgresql" and data["where"] == pg.schema
    assert data["applied"] == 0 and data["up_to_date"] is False
    latest = data["latest"]

    # The SQL for a DBA: every migration, the bookkeeping, the grants, one transaction.
    printed = run("migrate", "--url", role_url, "--print-sql", "--grant", pg.role)
    assert printed.returncode == 0, printed.stderr
    sql = printed.stdout
    assert sql.count("BEGIN;") == 1 and sql.rstrip().endswith("COMMIT;")
    for number in range(1, latest + 1):
        assert f"VALUES ({number}, '{number:04d}_" in sql
    assert f'GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA "{pg.schema}" TO "{pg.role}";' in sql
    assert "__SCHEMA__" not in sql and pg.password not in sql
    # The same as --all, which needs no connection at all.
    unreachable = with_query("postgresql://nobody@127.0.0.1:1/none", schema=pg.schema)
    offline = run("migrate", "--url", unreachable, "--print-sql", "--all", "--grant", pg.role)
    assert offline.returncode == 0 and offline.stdout == sql

    # The restricted role cannot apply it itself ...
    denied = run("migrate", "--url", role_url, "--apply")
    assert denied.returncode == 78
    assert "--print-sql" in denied.stderr and pg.password not in denied.stderr
    # ... the DBA does, exactly as printed.
    with psycopg.connect(pg.admin, autocommit=True) as admin:
        admin.execute(sql)
        # Applying the same script again is refused: the schema is no longer at version 0.
        with pytest.raises(psycopg.Error, match="is not at version 0"):
            admin.execute(sql)

    # Now the application's role works, and sees the version.
    client = turnstile.connect(role_url)
    try:
        with client.lock("migrated", ttl=5) as lease:
            assert lease.token > 0
        assert client.semaphore("migrated-sem", 2).try_acquire("a").acquired
    finally:
        client.close()
    current = run("migrate", "--url", role_url)
    assert current.returncode == 0
    assert current.stdout.strip() == f"schema {pg.schema!r}: schema version {latest}, up to date"
    status = json.loads(run("status", "--url", role_url, "--json").stdout)
    assert status["schema"] == {
        "store": "postgresql",
        "where": pg.schema,
        "applied": latest,
        "latest": latest,
        "up_to_date": True,
    }
    assert f"store: schema version {latest}, up to date" in run("status", "--url", role_url).stdout
    # Up to date: nothing left to print but the empty transaction.
    rest = run("migrate", "--url", role_url, "--print-sql").stdout
    assert "-- 0001_" not in rest and "COMMIT;" in rest


def test_apply_as_a_privileged_role(pg: PgSetup) -> None:
    url = pg.url(as_role=False, schema=f"{pg.schema}b")
    applied = run("migrate", "--url", url, "--apply", "--json")
    assert applied.returncode == 0, applied.stderr
    assert applied.stdout.count("\n") == 1  # --json: one line when not on a terminal
    data = json.loads(applied.stdout)
    assert data["applied"] == data["latest"] and data["up_to_date"] is True
    again = run("migrate", "--url", url, "--apply")
    assert again.returncode == 0
    assert again.stdout.startswith("nothing to apply: ")
    client = turnstile.connect(url)  # a client finds nothing to do
    client.close()


def test_migrate_arguments(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/args.db"
    for args, needle in [
        (["--all"], "--all applies only with --print-sql"),
        (["--grant", "x"], "--grant applies only with --print-sql or --apply"),
        (["--print-sql", "--apply"], "not allowed with argument"),
        (["--print-sql", "--json"], "--json does not apply with --print-sql"),
        (["--apply", "--grant", "app"], "--grant applies only to PostgreSQL"),
    ]:
        out = run("migrate", "--url", url, *args)
        assert out.returncode == 2, (args, out.stderr)
        assert needle in out.stderr and "error:" in out.stderr
    other = run("migrate", "--url", "memory://")
    assert other.returncode == 78 and "memory:// keeps no schema" in other.stderr


def test_sqlite_print_sql_and_apply(tmp_path: Path) -> None:
    path = tmp_path / "by-hand.db"
    url = f"sqlite:///{path}"
    shown = run("migrate", "--url", url)
    assert shown.returncode == 1 and "schema version 0 of " in shown.stdout
    assert not path.exists()  # looking changes nothing
    sql = run("migrate", "--url", url, "--print-sql").stdout
    assert "BEGIN IMMEDIATE;" in sql and sql.rstrip().endswith("COMMIT;")
    conn = sqlite3.connect(path, isolation_level=None)
    conn.executescript(sql)
    conn.close()
    assert run("migrate", "--url", url).returncode == 0
    client = turnstile.connect(url)  # the file a DBA made is what a client expects
    try:
        with client.lock("by-hand", ttl=5) as lease:
            assert lease.token > 0
    finally:
        client.close()

    other = tmp_path / "applied.db"
    applied = run("migrate", "--url", f"sqlite:///{other}", "--apply")
    assert applied.returncode == 0, applied.stderr
    assert applied.stdout.startswith("applied: ") and "up to date" in applied.stdout


# -- Redis: function libraries ----------------------------------------------------------------
# Another release's lock library (a name of Turnstile's pattern, another hash), a library that
# only looks like Turnstile's, and a user's library: the last two are never touched.
OLD = "turnstile_lock_" + "0" * 20
LOOKALIKE = "turnstile_notours"


@pytest.fixture
def private_redis(tmp_path: Path) -> Iterator[Any]:
    """A redis-server of the test's own: --prune deletes every Turnstile library of another
    release on the server it is given, which on a shared server would be other runs' data."""
    from tests.stores.redis._tools import redis_process

    with redis_process(tmp_path / "redis", "--appendonly", "no") as server:
        yield server


def _library(name: str, function: str) -> str:
    return (
        f"#!lua name={name}\n"
        f"redis.register_function('{function}', function(keys, args) return 1 end)"
    )


def _library_names(server: Any) -> list[str]:
    with server.admin() as admin:
        listed = [dict(zip(lib[::2], lib[1::2], strict=True)) for lib in admin.function_list()]
    return sorted(lib[b"library_name"].decode() for lib in listed)


def test_redis_libraries_are_shown_loaded_and_pruned(private_redis: Any) -> None:
    from turnstile.stores.redis import scripts

    ours = sorted(scripts.library(folder)[0].name for folder in scripts.FOLDERS)
    with private_redis.admin() as admin:
        admin.function_load(_library(OLD, "turnstile_" + "0" * 20 + "_acquire"))
        admin.function_load(_library(LOOKALIKE, "lookalike_f"))
        admin.function_load(_library("mine", "mine_f"))
    url = private_redis.url
    shown = run("migrate", "--url", url, "--json")
    assert shown.returncode == 0, shown.stderr
    [entry] = json.loads(shown.stdout)
    assert entry["functions"] is True and entry["version"].startswith(("7", "8", "9"))
    assert entry["current"] == dict.fromkeys(ours, False)
    assert entry["others"] == [OLD] and entry["loaded"] == entry["deleted"] == []
    text = run("migrate", "--url", url)
    assert text.returncode == 0, text.stderr
    assert "0 of this release's 3 function libraries loaded" in text.stdout
    assert f"1 of other releases (--prune deletes them): {OLD}" in text.stdout
    assert _library_names(private_redis) == sorted([OLD, LOOKALIKE, "mine"])  # shown only
    done = run("migrate", "--url", url, "--apply", "--prune", "--json")
    assert done.returncode == 0, done.stderr
    [entry] = json.loads(done.stdout)
    assert entry["current"] == dict.fromkeys(ours, True)
    assert sorted(entry["loaded"]) == ours and entry["deleted"] == [OLD] and entry["others"] == []
    assert _library_names(private_redis) == sorted([*ours, LOOKALIKE, "mine"])
    again = run("migrate", "--url", url, "--apply", "--prune", "--json")
    [entry] = json.loads(again.stdout)
    assert entry["loaded"] == entry["deleted"] == [] and all(entry["current"].values())
    # A client of this release finds its libraries loaded: FCALL at once, no FUNCTION LOAD.
    loads = private_redis.commandstats(raw=True)["function|load"]
    client = turnstile.connect(f"{url}?prefix=tt-migrate:")
    try:
        client.lock("job", ttl=5).acquire(timeout=1).release()
        client.queue("q").put(1)
    finally:
        client.close()
    stats = private_redis.commandstats(raw=True)
    assert stats.get("fcall", 0) >= 3 and stats["function|load"] == loads


def test_redis_migrate_refusals(private_redis: Any) -> None:
    url = private_redis.url
    for args, needle in [
        (["--print-sql"], "--print-sql applies only to PostgreSQL and SQLite"),
        (["--apply", "--grant", "app"], "--grant applies only to PostgreSQL and SQLite"),
    ]:
        out = run("migrate", "--url", url, *args)
        assert out.returncode == 2 and needle in out.stderr, (args, out.stderr)
    # A user who may run the steps but not load functions: told what it could not do, the
    # password never shown, no traceback.
    with private_redis.admin() as admin:
        admin.acl_setuser(
            "app", enabled=True, passwords=["+pw-7d2e"], keys=["*"],
            commands=["+@all", "-function|load", "-function|delete"],
        )  # fmt: skip
    user_url = f"redis://app:pw-7d2e@127.0.0.1:{private_redis.port}/0"
    shown = run("migrate", "--url", user_url)
    assert shown.returncode == 0 and "0 of this release's 3" in shown.stdout, shown.stderr
    refused = run("migrate", "--url", user_url, "--apply")
    assert refused.returncode == 78, refused.stderr
    assert "could not load this release's function libraries (FUNCTION LOAD)" in refused.stderr
    assert "pw-7d2e" not in refused.stderr + refused.stdout
    assert "Traceback" not in refused.stderr


def test_redis_cluster_libraries_on_every_master() -> None:
    """Every master of the suite's own Cluster shows (and with --apply has) this release's
    libraries. No --prune here: the Cluster URL may be a user's."""
    url = os.environ.get("TURNSTILE_TEST_REDIS_CLUSTER_URL")
    if not url:
        if os.environ.get("CI"):
            pytest.fail("TURNSTILE_TEST_REDIS_CLUSTER_URL is not set under CI")
        pytest.skip("TURNSTILE_TEST_REDIS_CLUSTER_URL is not set (scripts/dev.py test sets it)")
    done = run("migrate", "--url", url, "--apply", "--json")
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout)
    assert len(found) >= 3 and len({e["server"] for e in found}) == len(found)
    assert all(all(e["current"].values()) and e["deleted"] == [] for e in found)
