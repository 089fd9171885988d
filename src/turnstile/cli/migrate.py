"""``turnstile migrate``: the schema version of a store, and the SQL that brings it up to date
(``--print-sql``, for a DBA to review and apply) or applying it (``--apply``); on Redis 7+,
the function libraries of this release (``--apply`` loads them on every master) and of other
releases (``--prune`` deletes those).

A client migrates the schema itself on its first connection when its role may, and loads its
Redis libraries on first use when its user may; this command is for the roles and users that
may not (docs/postgres.md, "Permissions"; docs/redis.md, "Function libraries")."""

from __future__ import annotations

import argparse
import re
import sqlite3
from dataclasses import dataclass, field
from typing import Any

from .._core import urls
from ..errors import BackendUnavailable, ConfigurationError, InvalidArgument
from . import _support

EPILOG = """\
examples:
  turnstile migrate --url postgresql://app@db/prod                 # applied and latest version
  turnstile migrate --url postgresql://app@db/prod --print-sql > turnstile.sql
  psql -v ON_ERROR_STOP=1 -f turnstile.sql postgresql://dba@db/prod  # the DBA, after review
  turnstile migrate --url postgresql://dba@db/prod --apply --grant app

  turnstile migrate --url redis://admin:pw@cache:6379 --apply --prune  # Redis 7 libraries

--print-sql prints the migrations the schema lacks (all of them with --all, without
connecting) as one transaction, with the version bookkeeping; it refuses to run if the
schema moved on meanwhile. SQLite (sqlite:///path) can --apply and --print-sql too.

On Redis 7 or later (every master of a Cluster) it shows which of this release's function
libraries are loaded and which Turnstile libraries of other releases are there; --apply
loads this release's (for application users that may FCALL but not FUNCTION LOAD), --prune
deletes the others (a client of another release still running loads its own again at its
next step). Libraries that are not Turnstile's are never touched.
"""


@dataclass(frozen=True)
class SchemaVersion:
    """The schema version a store is at (0: no schema yet) and the one this release needs."""

    store: str  # "postgresql" or "sqlite"
    where: str  # the schema (PostgreSQL) or the file (SQLite)
    applied: int
    latest: int

    def to_dict(self) -> dict[str, Any]:
        return {
            "store": self.store,
            "where": self.where,
            "applied": self.applied,
            "latest": self.latest,
            "up_to_date": self.applied == self.latest,
        }

    def describe(self) -> str:
        where = f"schema {self.where!r}" if self.store == "postgresql" else self.where
        return f"{where}: {self.summary()}"

    def summary(self) -> str:
        if self.applied == self.latest:
            return f"schema version {self.applied}, up to date"
        if self.applied > self.latest:
            return (
                f"schema version {self.applied}, newer than this release's {self.latest}: "
                "upgrade turnstile"
            )
        return (
            f"schema version {self.applied} of {self.latest}: "
            "run turnstile migrate --apply (or --print-sql)"
        )


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = _support.command_parser(
        subparsers,
        "migrate",
        help="show, print or apply the store's schema migrations",
        description=(
            "Show the schema version of the store named by --url (PostgreSQL, SQLite), print\n"
            "the SQL that brings it to this release's version (--print-sql), or apply it\n"
            "(--apply). On Redis 7+: this release's function libraries (--apply loads them)\n"
            "and other releases' (--prune deletes them)."
        ),
        epilog=EPILOG,
    )
    action = parser.add_mutually_exclusive_group()
    action.add_argument(
        "--print-sql", action="store_true", help="print the SQL a DBA can review and apply"
    )
    action.add_argument(
        "--apply",
        action="store_true",
        help="apply the missing migrations (Redis: load this release's function libraries)",
    )
    parser.add_argument(
        "--prune",
        action="store_true",
        help="Redis: delete the Turnstile function libraries of other releases",
    )
    parser.add_argument(
        "--all",
        action="store_true",
        help="with --print-sql: every migration, from an empty database, without connecting",
    )
    parser.add_argument(
        "--grant",
        metavar="ROLE",
        help="PostgreSQL: also grant ROLE what the application needs (docs/postgres.md)",
    )
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    parser.set_defaults(handler=migrate_command, migrate_parser=parser)


def migrate_command(args: argparse.Namespace) -> int:
    if args.all and not args.print_sql:
        args.migrate_parser.error("--all applies only with --print-sql")
    if args.grant is not None and not (args.print_sql or args.apply):
        args.migrate_parser.error("--grant applies only with --print-sql or --apply")
    if args.json and args.print_sql:
        args.migrate_parser.error("--json does not apply with --print-sql (it prints SQL)")
    if args.grant is not None and (not args.grant or "\0" in args.grant):
        raise InvalidArgument("--grant must name a role (1 or more characters, no NUL)")
    url = _support.resolved_url(args)
    entry, parts = urls.split(url)
    if entry.module == "redis":
        for flag, given in (("--print-sql", args.print_sql), ("--grant", args.grant)):
            if given:
                args.migrate_parser.error(f"{flag} applies only to PostgreSQL and SQLite")
        return _redis(args)
    if args.prune:
        args.migrate_parser.error("--prune applies only to Redis")
    if entry.module not in ("postgres", "sqlite"):
        raise ConfigurationError(
            f"turnstile migrate works on postgresql://, sqlite:/// and redis:// stores; "
            f"{parts.scheme}:// keeps no schema to migrate"
        )
    if entry.module == "sqlite":
        if args.grant is not None:
            args.migrate_parser.error("--grant applies only to PostgreSQL")
        return _sqlite(args, url, parts.path)
    try:
        import psycopg  # noqa: F401
    except ImportError as exc:
        raise urls.missing_driver(entry, exc) from None
    return _postgres(args, url)


def _print_result(args: argparse.Namespace, version: SchemaVersion, verb: str = "") -> None:
    if args.json:
        _support.print_json(version.to_dict())
    else:
        print(f"{verb}{version.describe()}")


# -- PostgreSQL ----------------------------------------------------------------------------
def postgres_version(url: str) -> SchemaVersion:
    """Read the schema version of a ``postgresql://`` store, changing nothing."""
    import psycopg

    from ..stores.postgres import sql as pg

    config = pg.parse_url(url, urls.split(url)[1])
    try:
        with psycopg.connect(config.conninfo, autocommit=True) as conn:
            return SchemaVersion(
                "postgresql", config.schema, _read_pg(conn, config), pg.SCHEMA_VERSION
            )
    except psycopg.Error as exc:
        raise pg.translate_connect(exc, config) from exc


def _read_pg(conn: Any, config: Any) -> int:
    from ..stores.postgres import sql as pg

    table = f"{pg.quote_ident(config.schema)}.schema_version"
    exists = conn.execute(config.query("version_table_exists"), {"version_table": table})
    if not (exists.fetchone() or (False,))[0]:
        return 0
    return int((conn.execute(config.query("applied_version")).fetchone() or (0,))[0])


def _postgres(args: argparse.Namespace, url: str) -> int:
    import psycopg

    from ..stores.postgres import sql as pg

    config = pg.parse_url(url, urls.split(url)[1])
    if args.print_sql and args.all:
        print(pg.migration_script(config.schema, 0, args.grant), end="")
        return _support.EXIT_OK
    try:
        with psycopg.connect(config.conninfo, autocommit=True) as conn:
            try:
                applied = _read_pg(conn, config)
            except psycopg.errors.InsufficientPrivilege as exc:
                raise ConfigurationError(
                    f"this role may not read schema {config.schema!r} "
                    f"({pg.describe(exc, config)}); print every migration without "
                    "connecting: turnstile migrate --print-sql --all"
                ) from exc
            if applied > pg.SCHEMA_VERSION:
                raise ConfigurationError(
                    f"schema {config.schema!r} is at Turnstile schema version {applied}, "
                    f"newer than this release understands ({pg.SCHEMA_VERSION}); upgrade turnstile"
                )
            if args.print_sql:
                print(pg.migration_script(config.schema, applied, args.grant), end="")
                return _support.EXIT_OK
            if args.apply:
                if applied < pg.SCHEMA_VERSION or args.grant is not None:
                    try:
                        conn.execute(pg.migration_script(config.schema, applied, args.grant))
                    except psycopg.errors.InsufficientPrivilege as exc:
                        raise pg.cannot_migrate(exc, config) from exc
                version = SchemaVersion(
                    "postgresql", config.schema, _read_pg(conn, config), pg.SCHEMA_VERSION
                )
                verb = "applied: " if applied < pg.SCHEMA_VERSION else "nothing to apply: "
                _print_result(args, version, verb)
                return _support.EXIT_OK
            _print_result(
                args, SchemaVersion("postgresql", config.schema, applied, pg.SCHEMA_VERSION)
            )
            return _support.EXIT_OK if applied == pg.SCHEMA_VERSION else _support.EXIT_FAILURE
    except psycopg.Error as exc:
        raise pg.translate_connect(exc, config) from exc


# -- SQLite --------------------------------------------------------------------------------
def sqlite_version(url: str) -> SchemaVersion:
    """Read the schema version of a ``sqlite:///`` file, changing nothing (0: no file yet)."""
    from ..stores.sqlite import lock_store

    path = lock_store.parse_path(urls.split(url)[1].path)
    return SchemaVersion("sqlite", path, _read_sqlite(path), lock_store.SCHEMA_VERSION)


def _read_sqlite(path: str) -> int:
    import os

    if not os.path.exists(path):
        return 0
    try:
        conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        try:
            return int(conn.execute("PRAGMA user_version").fetchone()[0])
        finally:
            conn.close()
    except sqlite3.Error as exc:
        raise BackendUnavailable(f"SQLite error on {path!r}: {exc}") from exc


def _sqlite(args: argparse.Namespace, url: str, url_path: str) -> int:
    from ..stores.sqlite import lock_store

    path = lock_store.parse_path(url_path)
    latest = lock_store.SCHEMA_VERSION
    applied = 0 if args.all else _read_sqlite(path)
    if args.print_sql:
        out = [
            f"-- Turnstile SQLite schema of {path}: from version {applied} to {latest}.",
            "BEGIN IMMEDIATE;",
        ]
        for number, script in lock_store.MIGRATIONS:
            if number > applied:
                out += [script.strip(), f"PRAGMA user_version = {int(number)};"]
        out += ["COMMIT;", ""]
        print("\n".join(out), end="")
        return _support.EXIT_OK
    if args.apply:
        _support.connect(args).close()  # a client migrates the file when it opens it
        verb = "applied: " if applied < latest else "nothing to apply: "
        _print_result(args, SchemaVersion("sqlite", path, _read_sqlite(path), latest), verb)
        return _support.EXIT_OK
    _print_result(args, SchemaVersion("sqlite", path, applied, latest))
    return _support.EXIT_OK if applied == latest else _support.EXIT_FAILURE


# -- Redis ----------------------------------------------------------------------------------
# A Turnstile function library (stores/redis/scripts.py, library()): its folder and a hash of
# its text. Nothing else is ever loaded, listed as Turnstile's or deleted here.
LIBRARY_NAME = re.compile(r"turnstile_(lock|queue|rate)_[0-9a-f]{20}")


@dataclass(frozen=True)
class RedisLibraries:
    """The Turnstile function libraries of one Redis server (a Cluster master)."""

    server: str  # host:port
    version: str  # the server's redis_version
    functions: bool  # Redis 7 or later: it can run function libraries
    current: dict[str, bool] = field(default_factory=dict)  # this release's: name -> loaded
    others: tuple[str, ...] = ()  # Turnstile libraries of other releases
    loaded: tuple[str, ...] = ()  # loaded by this command (--apply)
    deleted: tuple[str, ...] = ()  # deleted by this command (--prune)

    def to_dict(self) -> dict[str, Any]:
        return {
            "server": self.server,
            "version": self.version,
            "functions": self.functions,
            "current": self.current,
            "others": list(self.others),
            "loaded": list(self.loaded),
            "deleted": list(self.deleted),
        }

    def describe(self) -> str:
        if not self.functions:
            return (
                f"Redis {self.version} at {self.server}: runs no function libraries (Redis 7 "
                "or later does); Turnstile sends its steps as scripts, nothing to load"
            )
        have = sum(self.current.values())
        lines = [
            f"Redis {self.version} at {self.server}: {have} of this release's "
            f"{len(self.current)} function libraries loaded"
            + ("" if have == len(self.current) or self.loaded else
               " (a client loads them at first use when its user may; or run --apply)")
        ]
        lines += [f"  loaded: {name}" for name in self.loaded]
        if self.deleted:
            lines += [f"  deleted (another release's): {name}" for name in self.deleted]
        if self.others:
            lines.append(
                f"  {len(self.others)} of other releases (--prune deletes them): "
                + ", ".join(self.others)
            )
        return "\n".join(lines)


def _library_rows(reply: Any) -> list[str]:
    """Library names from a FUNCTION LIST reply (RESP2 flat lists or RESP3 maps)."""
    names = []
    for entry in reply or []:
        if isinstance(entry, dict):
            fields = entry
        else:
            items = list(entry)
            fields = dict(zip(items[::2], items[1::2], strict=False))
        for key, value in fields.items():
            if (key.decode() if isinstance(key, bytes) else key) == "library_name":
                names.append(value.decode() if isinstance(value, bytes) else str(value))
    return names


def _redis(args: argparse.Namespace) -> int:
    from redis.exceptions import ConnectionError as RedisConnectionError
    from redis.exceptions import RedisError
    from redis.exceptions import TimeoutError as RedisTimeoutError

    from ..stores.redis import driver, scripts

    libraries = {lib.name: lib for lib, _ in (scripts.library(f) for f in scripts.FOLDERS)}
    found: list[RedisLibraries] = []
    with _support.connect(args) as client:
        connection: Any = client.backend.connection  # type: ignore[attr-defined]
        config = connection.config
        redis_client = connection.client
        nodes = redis_client.get_primaries() if hasattr(redis_client, "get_primaries") else [None]
        for node in nodes:
            # A Cluster: each master in turn (target_nodes); one server: the server.
            where = {} if node is None else {"target_nodes": node}
            server = config.shown if node is None else f"{node.host}:{node.port}"
            what = "read the server's version (INFO)"
            try:
                version = str(redis_client.info("server", **where).get("redis_version", "?"))
                major = version.split(".")[0]
                if major.isdigit() and int(major) < 7:
                    found.append(RedisLibraries(server, version, False))
                    continue
                what = "list the function libraries (FUNCTION LIST)"
                reply = redis_client.execute_command(
                    "FUNCTION LIST", "LIBRARYNAME", "turnstile_*", **where
                )
                present = {n for n in _library_rows(reply) if LIBRARY_NAME.fullmatch(n)}
                loaded: list[str] = []
                if args.apply:
                    what = "load this release's function libraries (FUNCTION LOAD)"
                    for name, lib in libraries.items():
                        if name not in present:
                            redis_client.execute_command(
                                "FUNCTION LOAD", "REPLACE", lib.text, **where
                            )
                            loaded.append(name)
                others = sorted(present - set(libraries))
                deleted: list[str] = []
                if args.prune:
                    what = "delete other releases' function libraries (FUNCTION DELETE)"
                    for name in others:
                        redis_client.execute_command("FUNCTION DELETE", name, **where)
                        deleted.append(name)
                    others = []
                found.append(RedisLibraries(
                    server, version, True,
                    {name: name in present or name in loaded for name in libraries},
                    tuple(others), tuple(loaded), tuple(deleted),
                ))  # fmt: skip
            except RedisError as exc:
                # Unreachable (exit 69), or refused, e.g. by an ACL (exit 78).
                unreachable = isinstance(exc, (RedisConnectionError, RedisTimeoutError))
                kind = BackendUnavailable if unreachable else ConfigurationError
                raise kind(
                    f"Redis at {server}: could not {what}: {driver.safe_message(exc, config)}"
                ) from None
    if args.json:
        _support.print_json([f.to_dict() for f in found])
    else:
        print("\n".join(f.describe() for f in found))
    return _support.EXIT_OK


def schema_version(url: str) -> SchemaVersion | None:
    """The schema version of the store at ``url``, for ``turnstile status``; None for stores
    without one (memory, Redis, the HTTP service)."""
    module = urls.split(url)[0].module
    if module == "sqlite":
        return sqlite_version(url)
    if module == "postgres":
        return postgres_version(url)
    return None
