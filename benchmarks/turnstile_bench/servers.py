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
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


class Unavailable(RuntimeError):
    """The server a script needs cannot be had here (the script exits with status 77)."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# -- throwaway servers -------------------------------------------------------------------------
@contextlib.contextmanager
def own_redis(folder: Path) -> Iterator[str]:
    """A ``redis-server`` (from PATH) of the benchmark's own on a free port, files in
    ``folder``, no persistence; stopped afterwards. Yields its URL."""
    binary = shutil.which("redis-server")
    if binary is None:
        raise Unavailable("redis-server is not on PATH (or pass --redis-url)")
    import redis

    port = free_port()
    proc = subprocess.Popen(
        [
            binary,
            "--port",
            str(port),
            "--bind",
            "127.0.0.1",
            "--dir",
            str(folder),
            "--save",
            "",
            "--appendonly",
            "no",
            "--logfile",
            str(folder / "redis.log"),
        ],
        stdout=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                with contextlib.closing(redis.Redis(port=port, socket_timeout=1)) as r:
                    r.ping()
                    break
            except redis.exceptions.ConnectionError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("redis-server did not start") from None
                time.sleep(0.02)
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()


@contextlib.contextmanager
def throwaway_postgres() -> Iterator[str]:
    """A PostgreSQL cluster of the benchmark's own (initdb in a temporary directory, a free
    port; the fault tests' helper), removed afterwards. Yields its URL."""
    if str(REPO) not in sys.path:
        sys.path.insert(1, str(REPO))
    from tests.stores.postgres._cluster import Cluster
    from tests.stores.postgres._cluster import Unavailable as NoCluster

    try:
        cluster = Cluster()
    except NoCluster as exc:
        raise Unavailable(f"no --url and cannot start PostgreSQL: {exc}") from exc
    try:
        yield cluster.url
    finally:
        cluster.close()


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
