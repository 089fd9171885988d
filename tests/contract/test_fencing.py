"""SPEC guarantee 4 (fencing): every grant's token is strictly greater than every earlier
token for that name, across processes and clients, and after the store is reopened."""

from __future__ import annotations

import itertools

import turnstile
from tests.conftest import BackendUnderTest

from .lock_harness import Spawner


def test_tokens_increase_with_every_grant(client: turnstile.Client) -> None:
    lock = client.lock("fence:seq", ttl=2.0)
    other = client.lock("fence:other", ttl=2.0)
    seen = []
    for i in range(20):
        with lock.acquire(timeout=5) as lease:
            seen.append(lease.token)
        if i % 3 == 0:  # grants on another name in between do not disturb the order
            with other.acquire(timeout=5):
                pass
    assert all(isinstance(t, int) and t > 0 for t in seen)
    assert all(a < b for a, b in itertools.pairwise(seen)), seen


def test_tokens_increase_across_processes(client: turnstile.Client, workers: Spawner) -> None:
    lock = client.lock("fence:procs", ttl=2.0)
    with lock.acquire(timeout=5) as first:
        pass
    w = workers.spawn("tokens", name="fence:procs", ttl=2.0, count=5)
    theirs = w.wait_for("tokens")["tokens"]
    w.join()
    with lock.acquire(timeout=5) as last:
        pass
    sequence = [first.token, *theirs, last.token]
    assert all(a < b for a, b in itertools.pairwise(sequence)), sequence


def test_tokens_increase_after_reopening(
    backend: BackendUnderTest, client: turnstile.Client, workers: Spawner
) -> None:
    """Close every client, open a new one: no token is ever repeated or lower. For the
    SQLite file this is a restart of the store itself."""
    if not backend.cross_process:
        import pytest

        pytest.skip(f"{backend.name}:// keeps nothing after its client closes: nothing to reopen")
    name = "fence:reopen"
    with client.lock(name, ttl=2.0).acquire(timeout=5) as lease:
        before = lease.token
    # another process, which exits (closing its client) after its grants
    w = workers.spawn("tokens", name=name, ttl=2.0, count=3)
    theirs = w.wait_for("tokens")["tokens"]
    w.join()
    client.close()
    assert theirs[0] > before
    for _ in range(2):
        with (
            turnstile.connect(backend.url) as reopened,
            reopened.lock(name, ttl=2.0).acquire(timeout=5) as lease,
        ):
            assert lease.token > theirs[-1]
            theirs.append(lease.token)
    assert all(a < b for a, b in itertools.pairwise(theirs)), theirs
