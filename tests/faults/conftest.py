"""Stores behind a :class:`~tests.faults.proxy.FaultProxy`: the development servers
(``TURNSTILE_TEST_REDIS_URL``, ``TURNSTILE_TEST_POSTGRES_URL``), each test with data of its
own (a key prefix, a schema) deleted afterwards."""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import pytest

from tests.backends import BACKENDS, BackendRow

from .proxy import FaultProxy


@dataclass(frozen=True)
class ProxiedStore:
    """``url`` reaches the store through ``proxy``; ``direct`` reaches the same data
    without it (for the holder whose operations are not under test, and for checks)."""

    name: str
    url: str
    direct: str
    proxy: FaultProxy


def _through(url: str, port: int) -> str:
    parts = urlsplit(url)
    userinfo, _, _ = parts.netloc.rpartition("@")
    netloc = f"{userinfo}@127.0.0.1:{port}" if userinfo else f"127.0.0.1:{port}"
    return urlunsplit(parts._replace(netloc=netloc))


def _store(row: BackendRow, tmp_path: Path) -> Iterator[ProxiedStore]:
    server = row.server_url()
    if server is None:
        message = f"{row.env} is not set (scripts/dev.py test starts a server and sets it)"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    port = urlsplit(server).port or (6379 if row.name == "redis" else 5432)
    uid = secrets.token_hex(5)
    direct = row.make_url(server, uid, tmp_path)
    proxy = FaultProxy(port)
    try:
        yield ProxiedStore(row.name, _through(direct, proxy.port), direct, proxy)
    finally:
        proxy.close()
        row.cleanup(server, uid)


@pytest.fixture
def redis_store(tmp_path: Path) -> Iterator[ProxiedStore]:
    pytest.importorskip("redis")
    yield from _store(next(r for r in BACKENDS if r.name == "redis"), tmp_path)


@pytest.fixture
def pg_store(tmp_path: Path) -> Iterator[ProxiedStore]:
    pytest.importorskip("psycopg")
    yield from _store(next(r for r in BACKENDS if r.name == "postgres"), tmp_path)


@pytest.fixture(
    params=[
        pytest.param("redis", marks=pytest.mark.redis),
        pytest.param("postgres", marks=pytest.mark.postgres),
    ]
)
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[ProxiedStore]:
    """Each store with a server, in turn (the dropped-reply tests run on both)."""
    pytest.importorskip("redis" if request.param == "redis" else "psycopg")
    yield from _store(next(r for r in BACKENDS if r.name == request.param), tmp_path)
