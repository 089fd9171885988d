"""Fixtures of the contract suite: every test runs once per backend row (tests/backends.py),
each on data private to it."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import pytest

import turnstile
import turnstile.aio
from tests.conftest import BackendUnderTest

from .lock_harness import Spawner

CONTRACT_TEST_TIMEOUT = 120  # seconds; every wait in a test is bounded well below this


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "tests/contract/" in item.nodeid and item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(CONTRACT_TEST_TIMEOUT))


@pytest.fixture
def client(backend: BackendUnderTest) -> Iterator[turnstile.Client]:
    c = turnstile.connect(backend.url)
    try:
        yield c
    finally:
        c.close()


@pytest.fixture
async def aclient(backend: BackendUnderTest) -> AsyncIterator[turnstile.aio.AsyncClient]:
    c = await turnstile.aio.connect(backend.url)
    try:
        yield c
    finally:
        await c.close()


@pytest.fixture
def workers(backend: BackendUnderTest, client: turnstile.Client) -> Iterator[Spawner]:
    """Starts scenarios of tests/contract/lock_worker.py in their own processes (threads on the
    test's client for memory://) and makes sure they are gone after the test."""
    spawner = Spawner(backend, client)
    try:
        yield spawner
    finally:
        spawner.close()
