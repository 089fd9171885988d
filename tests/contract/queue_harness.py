"""Shared by the queue contract tests: open a client whose backend has queues, or skip
(naming why) only when the backend raises NotSupported for them."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import pytest

import turnstile
import turnstile.aio
from tests.conftest import BackendUnderTest


def _skip_unsupported(backend: BackendUnderTest, exc: turnstile.NotSupported) -> None:
    pytest.skip(f"{backend.name} backend has no queue support yet (NotSupported: {exc})")


@pytest.fixture
def qclient(backend: BackendUnderTest) -> Iterator[turnstile.Client]:
    client = turnstile.connect(backend.url)
    try:
        try:
            client.queue("probe")
        except turnstile.NotSupported as exc:
            _skip_unsupported(backend, exc)
        yield client
    finally:
        client.close()


@pytest.fixture
async def aqclient(backend: BackendUnderTest) -> AsyncIterator[turnstile.aio.Client]:
    client = await turnstile.aio.connect(backend.url)
    try:
        try:
            client.queue("probe")
        except turnstile.NotSupported as exc:
            _skip_unsupported(backend, exc)
        yield client
    finally:
        await client.close()
