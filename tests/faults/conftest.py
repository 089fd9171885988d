from __future__ import annotations

from collections.abc import Iterator

import pytest

from ._pgcluster import Cluster


@pytest.fixture(scope="session")
def pg_cluster() -> Iterator[Cluster]:
    """A PostgreSQL server of our own, which the tests may restart, crash and stop."""
    pytest.importorskip("psycopg")
    cluster = Cluster()
    try:
        yield cluster
    finally:
        cluster.close()
