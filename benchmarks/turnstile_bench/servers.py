"""Where the benchmarks get their servers and keep their data apart.

Starting a throwaway server is one function per store (:func:`own_redis`,
:func:`throwaway_postgres`), so each is a one-place swap for the project's shared starter.
The rest gives a run a namespace of its own on a given server (a SQLite folder, a Redis key
prefix, a PostgreSQL schema) and deletes only what the run created.
"""

from __future__ import annotations

import contextlib
import secrets
import shutil
import signal
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]


class Unavailable(RuntimeError):
    """The server a script needs cannot be had here (the script exits with status 77)."""


def exit_on_signals() -> None:
    """Make SIGTERM and SIGHUP end the run as Ctrl-C does, by an exception in the main
    thread: every ``with`` of the run then unwinds, so its throwaway servers are stopped,
    its scratch folders removed, its worker processes ended and its schema or key prefix
    deleted (by default these signals end the process at once, leaving all of that)."""

    def stop(signum: int, frame: Any) -> None:
        raise SystemExit(128 + signum)

    for signum in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, stop)


# -- throwaway servers -------------------------------------------------------------------------
# Both come from the project's one stdlib-only starter (scripts/servers.py), which scripts/dev.py
# and the test suite use too.
def _starter() -> Any:
    if str(REPO) not in sys.path:
        sys.path.insert(1, str(REPO))
    from scripts import servers

    return servers


@contextlib.contextmanager
def own_redis(folder: Path) -> Iterator[str]:
    """A ``redis-server`` of the benchmark's own on a free port, files in ``folder``, no
    persistence; stopped afterwards. Yields its URL."""
    starter = _starter()
    try:
        binary = starter.redis_binary()
    except starter.Unavailable as exc:
        raise Unavailable(f"{exc} (or pass --redis-url)") from exc
    with starter.redis_server(
        "--save", "", "--appendonly", "no", folder=folder, binary=binary
    ) as server:
        yield str(server.url)


@contextlib.contextmanager
def throwaway_postgres() -> Iterator[str]:
    """A PostgreSQL cluster of the benchmark's own (initdb in a temporary directory, a free
    port, durable commits as a production server has them), removed afterwards. Yields its
    URL."""
    starter = _starter()
    try:
        server = starter.PostgresServer(
            {
                "max_connections": 200,
                "shared_buffers": "32MB",
                "fsync": "on",
                "synchronous_commit": "on",
            }
        )
    except starter.Unavailable as exc:
        raise Unavailable(f"no --url and cannot start PostgreSQL: {exc}") from exc
    try:
        server.start()
        yield str(server.url)
    finally:
        server.close()


# -- a namespace of the run's own --------------------------------------------------------------
@contextlib.contextmanager
def scratch_folder(
    tmpdir: str | Path | None = None, prefix: str = "turnstile-bench-"
) -> Iterator[Path]:
    """A fresh folder (under ``tmpdir``) for database, lock and server files, removed
    afterwards."""
    folder = Path(tempfile.mkdtemp(prefix=prefix, dir=tmpdir))
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def delete_redis_keys(url: str, *patterns: str) -> None:
    import redis

    with contextlib.closing(redis.Redis.from_url(url)) as r:
        for pattern in patterns:
            for key in list(r.scan_iter(match=pattern, count=1000)):
                r.delete(key)


@contextlib.contextmanager
def redis_prefix(server: str) -> Iterator[str]:
    """A Turnstile URL on ``server`` under a fresh key prefix; its keys deleted afterwards."""
    prefix = f"bench-q-{secrets.token_hex(4)}:"
    sep = "&" if "?" in server else "?"
    try:
        yield f"{server}{sep}prefix={prefix}"
    finally:
        delete_redis_keys(server, f"{prefix}*")


@contextlib.contextmanager
def postgres_schema(server: str) -> Iterator[tuple[str, str]]:
    """A fresh schema on ``server`` with the ``jobs`` table of
    :class:`adapters.SkipLockedQueue`; yields (Turnstile URL on it, schema); dropped
    afterwards."""
    import psycopg

    schema = f"bench_q_{secrets.token_hex(4)}"
    sep = "&" if "?" in server else "?"
    with psycopg.connect(server, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
        conn.execute(
            f"CREATE TABLE {schema}.jobs (id bigint GENERATED ALWAYS AS IDENTITY"
            " PRIMARY KEY, payload jsonb NOT NULL)"
        )
    try:
        yield f"{server}{sep}schema={schema}", schema
    finally:
        with psycopg.connect(server, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")


@contextlib.contextmanager
def procrastinate_database(server: str) -> Iterator[str]:
    """A database of the run's own on ``server`` with procrastinate's schema applied (its
    tables, functions and types live in ``public`` and cannot be put elsewhere); yields its
    connection string; dropped afterwards (``WITH (FORCE)``: a worker that did not close is
    cut off)."""
    import procrastinate
    import psycopg
    from psycopg.conninfo import make_conninfo

    name = f"bench_proc_{secrets.token_hex(4)}"
    with psycopg.connect(server, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")
    try:
        url = make_conninfo(server, dbname=name)
        app = procrastinate.App(connector=procrastinate.SyncPsycopgConnector(conninfo=url))
        with app.open():
            app.schema_manager.apply_schema()
        yield url
    finally:
        with psycopg.connect(server, autocommit=True) as conn:
            conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


@contextlib.contextmanager
def dbos_database(server: str) -> Iterator[str]:
    """A database of the run's own on ``server`` (``tt_bench_dbos_<random>``) with DBOS's
    system tables (created once, by a DBOS launched in a subprocess); yields its URL; dropped
    afterwards (``WITH (FORCE)``: a worker that did not close is cut off). Raises
    :class:`Unavailable` with the reason if DBOS cannot set it up."""
    import subprocess
    from urllib.parse import urlsplit

    import psycopg

    parts = urlsplit(server)
    if not parts.scheme.startswith("postgres"):
        raise Unavailable(f"DBOS needs a postgresql:// URL, not {server!r}")
    name = f"tt_bench_dbos_{secrets.token_hex(4)}"
    url = parts._replace(path=f"/{name}").geturl()
    with psycopg.connect(server, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")
    try:
        code = ("import sys; sys.path.insert(0, sys.argv[1]); "
                "from turnstile_bench import dbos_jobs; dbos_jobs.migrate(sys.argv[2])")
        proc = subprocess.run(
            [sys.executable, "-c", code, str(Path(__file__).resolve().parents[1]), url],
            capture_output=True, text=True, timeout=180,
        )
        if proc.returncode:
            last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
            raise Unavailable(f"DBOS could not set up its database: {last}")
        yield url
    finally:
        with psycopg.connect(server, autocommit=True) as conn:
            conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
