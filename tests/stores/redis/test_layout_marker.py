"""A name a later release keeps in another key layout (``=layout`` in the name's hash, other
than this release's "2") is refused by every lock step of this release, before it writes
anything: such a client would find no holder where it looks and grant the name a second
time. The refusal is a ``ConfigurationError`` that says to upgrade; nothing of the name
changes, and other names are untouched. (The marker is written here by hand, as the later
release would write it.) A name written by a build before layout 2 (its record without the
marker) is refused alike, with a message that says so."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import turnstile
import turnstile.aio
from turnstile.stores.redis import keys as redis_keys

from ._tools import RedisProcess, redis_process

pytestmark = pytest.mark.redis


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisProcess]:
    folder: Path = tmp_path_factory.mktemp("redis-layout")
    with redis_process(folder / "redis", "--appendonly", "no") as srv:
        yield srv


@pytest.fixture(params=["functions", "scripts"])
def client(server: RedisProcess, request: pytest.FixtureRequest) -> Iterator[turnstile.Client]:
    options = "&functions=off" if request.param == "scripts" else ""
    client = turnstile.connect(f"{server.url}?prefix=tt-layout-{request.param}:{options}")
    try:
        yield client
    finally:
        client.close()


def _record(client: turnstile.Client, name: str) -> str:
    base = client.backend._keys.get(name)[0]  # type: ignore[attr-defined]
    return redis_keys.name_keys(base)[0]


def _snapshot(server: RedisProcess, prefix: str) -> dict[bytes, Any]:
    """Every key under ``prefix``: its type and contents (what a refused step must not change)."""
    out: dict[bytes, Any] = {}
    with server.admin() as admin:
        for key in admin.scan_iter(match=prefix + "*"):
            kind = admin.type(key)
            if kind == b"hash":
                out[key] = dict(admin.hgetall(key))
            elif kind == b"zset":
                out[key] = admin.zrange(key, 0, -1, withscores=True)
            elif kind == b"list":
                out[key] = admin.lrange(key, 0, -1)
            else:
                out[key] = kind
    return out


def _mark(server: RedisProcess, client: turnstile.Client, name: str) -> None:
    with server.admin() as admin:
        admin.hset(_record(client, name), "=layout", "3")


def _prefix(client: turnstile.Client) -> str:
    return str(client.backend.config.prefix)  # type: ignore[attr-defined]


def _refused(action: Callable[[], object]) -> str:
    with pytest.raises(turnstile.ConfigurationError) as caught:
        action()
    message = str(caught.value)
    assert "newer key layout ('3')" in message and "upgrade this client" in message
    assert "Traceback" not in message
    return message


def test_every_step_on_a_marked_name_is_refused_and_changes_nothing(
    server: RedisProcess, client: turnstile.Client
) -> None:
    # A name in use (a holder, a waiter), then marked as moved.
    lock = client.lock("moved", ttl=30)
    lease = lock.acquire(timeout=1)
    waiting = lock.try_acquire(holder="waiter")
    assert not waiting.acquired and waiting.position == 0
    _mark(server, client, "moved")
    before = _snapshot(server, _prefix(client))

    _refused(lambda: lock.acquire(timeout=0.2))
    _refused(lambda: lock.try_acquire(holder="newcomer"))
    _refused(lambda: lock.try_acquire(holder="waiter"))  # the waiter asking again
    _refused(lease.renew)
    _refused(lease.release)
    _refused(lambda: lock.release(holder="waiter"))
    _refused(lock.status)
    _refused(lambda: client.semaphore("moved", limit=2).set_limit(3))
    assert _snapshot(server, _prefix(client)) == before
    # Not this release's to list; another name is untouched and works.
    other = client.lock("other", ttl=30).acquire(timeout=1)
    assert "moved" not in client.names() and "other" in client.names()
    assert other.release() is True


def test_an_idle_name_and_its_only_holder_are_refused_too(
    server: RedisProcess, client: turnstile.Client
) -> None:
    lock = client.lock("idle-moved", ttl=30)
    for _ in range(2):
        assert lock.acquire(timeout=1).release() is True
    lease = lock.acquire(timeout=1)
    assert lease.release() is True
    _mark(server, client, "idle-moved")
    before = _snapshot(server, _prefix(client))
    _refused(lambda: lock.acquire(timeout=1))
    assert _snapshot(server, _prefix(client)) == before

    held = client.lock("held-moved", ttl=30)
    for _ in range(2):
        assert held.acquire(timeout=1).release() is True
    lease = held.acquire(timeout=1)
    _mark(server, client, "held-moved")
    before = _snapshot(server, _prefix(client))
    _refused(lease.release)
    assert _snapshot(server, _prefix(client)) == before


def test_a_new_name_that_is_marked_is_refused(
    server: RedisProcess, client: turnstile.Client
) -> None:
    """A name whose only record is the marker (the later release moved everything else)."""
    _mark(server, client, "brand-new")
    _refused(lambda: client.lock("brand-new", ttl=30).acquire(timeout=1))
    with server.admin() as admin:
        assert admin.hgetall(_record(client, "brand-new")) == {b"=layout": b"3"}


def test_a_name_written_in_the_earlier_layout_is_refused(
    server: RedisProcess, client: turnstile.Client
) -> None:
    """Layout 1 kept holders in an index of their own; its record has "=exp" and no marker."""
    with server.admin() as admin:
        admin.hset(_record(client, "old"), mapping={"=name": "old", "=exp": "1", "h:x": "1 1 9 1"})
    before = _snapshot(server, _prefix(client))
    with pytest.raises(turnstile.ConfigurationError) as caught:
        client.lock("old", ttl=30).acquire(timeout=1)
    message = str(caught.value)
    assert "earlier key layout ('1')" in message and "expire by themselves" in message
    assert _snapshot(server, _prefix(client)) == before
    assert "old" not in client.names()


async def test_the_async_flavour_refuses_alike(server: RedisProcess) -> None:
    client = await turnstile.aio.connect(f"{server.url}?prefix=tt-layout-aio:")
    try:
        lock = client.lock("moved", ttl=30)
        await (await lock.acquire(timeout=1)).release()
        base = client.backend._keys.get("moved")[0]  # type: ignore[attr-defined]
        with server.admin() as admin:
            admin.hset(redis_keys.name_keys(base)[0], "=layout", "3")
        with pytest.raises(turnstile.ConfigurationError, match="upgrade this client"):
            await lock.acquire(timeout=1)
    finally:
        await client.close()
