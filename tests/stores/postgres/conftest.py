"""PostgreSQL-only tests: on the development/CI server (``TURNSTILE_TEST_POSTGRES_URL``), each
in a schema of its own that is dropped afterwards (the ``postgres`` row of tests/backends.py),
or on a server of their own that they may restart, crash and stop (``pg_cluster``)."""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.backends import BACKENDS

from ._cluster import Cluster

ROW = next(row for row in BACKENDS if row.name == "postgres")


@pytest.fixture
def pg_server() -> str:
    pytest.importorskip("psycopg")
    server = ROW.server_url()
    if server is None:
        message = f"{ROW.env} is not set (scripts/dev.py test starts a server and sets it)"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    return server


@pytest.fixture
def pg_url(pg_server: str, tmp_path: Path) -> Iterator[str]:
    """A URL whose schema belongs to this test alone."""
    uid = secrets.token_hex(5)
    try:
        yield ROW.make_url(pg_server, uid, tmp_path)
    finally:
        ROW.cleanup(pg_server, uid)


@pytest.fixture(scope="session")
def pg_cluster() -> Iterator[Cluster]:
    """A PostgreSQL server of our own, which the tests may restart, crash and stop."""
    pytest.importorskip("psycopg")
    cluster = Cluster()
    try:
        yield cluster
    finally:
        cluster.close()
