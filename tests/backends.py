"""The table of backends under test. A backend joins every contract test by adding one row.

Each row turns a per-test unique id into a URL whose data is private to that test (its own
SQLite file, Redis key prefix or PostgreSQL schema) and knows how to delete exactly that data
afterwards. Servers are named by environment variables, which ``scripts/dev.py test`` sets
(starting throwaway servers when none are given):

    TURNSTILE_TEST_REDIS_URL          redis://127.0.0.1:6379/0
    TURNSTILE_TEST_REDIS_CLUSTER_URL  redis+cluster://127.0.0.1:7000
    TURNSTILE_TEST_POSTGRES_URL       postgresql://postgres@127.0.0.1:5432/postgres

Without them those rows are skipped, except under ``CI=true`` where a missing server fails.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlencode, urlsplit, urlunsplit


def with_query(url: str, **params: str) -> str:
    parts = urlsplit(url)
    query = "&".join(q for q in (parts.query, urlencode(params)) if q)
    return urlunsplit(parts._replace(query=query))


@dataclass(frozen=True)
class BackendRow:
    name: str
    env: str | None  # environment variable naming the server, None for embedded backends
    make_url: Callable[[str, str, Path], str]  # (server url, unique id, tmp dir) -> url
    cleanup: Callable[[str, str], None]  # (server url, unique id) -> delete the test's data
    cross_process: bool = True

    def server_url(self) -> str | None:
        if self.env is None:
            return ""
        return os.environ.get(self.env) or None


def _nothing(server: str, uid: str) -> None:
    return None


def _redis_admin(server: str) -> Any:
    """An admin client of a given Redis server or Cluster."""
    import redis
    from redis.cluster import RedisCluster

    if server.startswith("redis+cluster://"):
        return RedisCluster.from_url(server.replace("redis+cluster://", "redis://", 1))
    return redis.Redis.from_url(server)


def _redis_cleanup(server: str, uid: str) -> None:
    """Delete only the keys under this test's prefix."""
    from redis.cluster import RedisCluster

    prefix = f"tt-{uid}:"
    client = _redis_admin(server)
    if isinstance(client, RedisCluster):
        keys = list(
            client.scan_iter(match=f"{prefix}*", count=1000, target_nodes=RedisCluster.PRIMARIES)
        )
    else:
        keys = list(client.scan_iter(match=f"{prefix}*", count=1000))
    for key in keys:
        client.delete(key)
    client.close()


def _library_names() -> list[str]:
    from turnstile.stores.redis import scripts

    return [scripts.library(folder)[0].name for folder in scripts.FOLDERS]


def redis_library_servers() -> list[tuple[str, str]]:
    """The given Redis servers, and the Turnstile function libraries of this release that
    each had not when this session began: the tests' clients load them there (FUNCTION LOAD),
    so the session deletes them at its end (:func:`delete_redis_library`). A library a
    server already had stays."""
    found = []
    for env in ("TURNSTILE_TEST_REDIS_URL", "TURNSTILE_TEST_REDIS_CLUSTER_URL"):
        server = os.environ.get(env)
        if not server:
            continue
        try:
            client = _redis_admin(server)
            for name in _library_names():
                if not client.function_list(library=name):
                    found.append((server, name))
            client.close()
        except Exception:  # no server, or no functions: nothing to delete later
            continue
    return found


def delete_redis_library(loaded: list[tuple[str, str]]) -> None:
    from redis.cluster import RedisCluster

    for server, name in loaded:
        try:
            client = _redis_admin(server)
            if isinstance(client, RedisCluster):
                client.function_delete(name, target_nodes=RedisCluster.PRIMARIES)
            else:
                client.function_delete(name)
            client.close()
        except Exception:  # not loaded after all, or the server is gone
            continue


def _postgres_cleanup(server: str, uid: str) -> None:
    """Drop only this test's schema."""
    import psycopg

    with psycopg.connect(server, autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "tt_{uid}" CASCADE')


_HTTP_SERVERS: dict[str, object] = {}


def _http_url(server: str, uid: str, tmp: Path) -> str:
    """Start a real `turnstile serve` (uvicorn, free port, one admin token) over a private
    SQLite file; the URL carries the token as its password."""
    import importlib.util

    missing = [m for m in ("httpx", "starlette", "uvicorn") if importlib.util.find_spec(m) is None]
    if missing:
        import pytest

        message = f"the http row needs {', '.join(missing)}: pip install -e '.[server,http]'"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    from tests.http_server import start_server

    process = start_server(
        f"sqlite:///{tmp}/turnstile-http-{uid}.db",
        tmp,
        tokens=[{"name": "contract", "admin": True}],
    )
    _HTTP_SERVERS[uid] = process
    return process.url("contract")


def _http_cleanup(server: str, uid: str) -> None:
    process = _HTTP_SERVERS.pop(uid, None)
    if process is not None:
        process.stop()  # type: ignore[attr-defined]


BACKENDS: list[BackendRow] = [
    BackendRow("memory", None, lambda s, uid, tmp: "memory://", _nothing, cross_process=False),
    BackendRow("sqlite", None, lambda s, uid, tmp: f"sqlite:///{tmp}/turnstile-{uid}.db", _nothing),
    BackendRow(
        "redis",
        "TURNSTILE_TEST_REDIS_URL",
        lambda s, uid, tmp: with_query(s, prefix=f"tt-{uid}:"),
        _redis_cleanup,
    ),
    BackendRow(
        "redis_cluster",
        "TURNSTILE_TEST_REDIS_CLUSTER_URL",
        lambda s, uid, tmp: with_query(s, prefix=f"tt-{uid}:"),
        _redis_cleanup,
    ),
    BackendRow(
        "postgres",
        "TURNSTILE_TEST_POSTGRES_URL",
        lambda s, uid, tmp: with_query(s, schema=f"tt_{uid}"),
        _postgres_cleanup,
    ),
    BackendRow("http", None, _http_url, _http_cleanup),
]
