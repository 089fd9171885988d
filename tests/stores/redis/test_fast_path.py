"""The fast paths of the lock scripts (``lua/lock/_fast_acquire.lua``, ``_fast_release.lua``):
an acquire on an idle name and the release of a name's only holder with nobody in line are
answered before the library is built, in a handful of commands, and only while the name's
``=fast`` record, stamped with its token counter and arrival stamp, proves the case — also
against holders and waiters written by a client that knows nothing of it (an earlier
release of Turnstile, emulated here by writing its records directly)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

import turnstile
from turnstile.stores.redis import keys as redis_keys

from ._tools import RedisProcess, redis_process, wait_until

pytestmark = pytest.mark.redis


@pytest.fixture
def server(tmp_path: Path) -> Iterator[RedisProcess]:
    with redis_process(tmp_path / "redis", "--appendonly", "no") as srv:
        yield srv


@pytest.fixture
def client(server: RedisProcess) -> Iterator[turnstile.Client]:
    client = turnstile.connect(server.url + "?prefix=tt-fast:")
    try:
        yield client
    finally:
        client.close()


def _keys(client: turnstile.Client, name: str) -> list[str]:
    base = client.backend._keys.get(name)[0]  # type: ignore[attr-defined]
    return redis_keys.name_keys(base)


def _server_us(server: RedisProcess) -> int:
    with server.admin() as admin:
        seconds, micros = admin.time()
    return int(seconds) * 1_000_000 + int(micros)


def _calls(server: RedisProcess) -> dict[str, int]:
    stats = server.commandstats()
    return {k: n for k, n in stats.items() if k not in ("info", "hello", "time")}


def _spent(server: RedisProcess, action: Callable[[], object]) -> dict[str, int]:
    """The commands the server ran during ``action`` (those inside scripts included)."""
    before = _calls(server)
    action()
    after = _calls(server)
    spent = {k: after.get(k, 0) - before.get(k, 0) for k in after}
    return {k: n for k, n in spent.items() if n}


def test_an_idle_name_costs_two_short_scripts_per_acquire_and_release(
    client: turnstile.Client, server: RedisProcess
) -> None:
    lock = client.lock("idle", ttl=30)
    for _ in range(2):  # the first release learns the name idle; scripts get loaded
        lock.acquire(timeout=1).release()
    leases: list[turnstile.Lease] = []

    def cycles() -> None:
        for _ in range(10):
            leases.append(lock.acquire(timeout=1))
            assert leases[-1].release() is True

    spent = _spent(server, cycles)
    # Per cycle: acquire = HMGET, TIME, HSET, ZADD, PEXPIREAT (the holder index was empty,
    # so it is made again); release = HMGET, TIME, HDEL, ZREM, HSET.
    assert spent == {
        "evalsha": 20,
        "hmget": 20,
        "hset": 20,
        "zadd": 10,
        "pexpireat": 10,
        "hdel": 10,
        "zrem": 10,
    }, spent
    # Tokens still grow, and the name is left with nothing but its counter.
    assert lock.acquire(timeout=1).token > leases[-1].token


def test_a_holder_written_by_a_client_without_fast_paths_is_seen(
    client: turnstile.Client, server: RedisProcess
) -> None:
    lock = client.lock("mixed", ttl=30)
    lock.acquire(timeout=1, holder="a").release()  # "=fast" now says: idle
    d, hx = _keys(client, "mixed")[:2]
    now = _server_us(server)
    with server.admin() as admin:
        last = int(admin.hget(d, "=last"))
        token = max(last + 1, now)
        # What an acquire of an earlier release writes: the record, the token counter and
        # the holder index; "=fast" is left as it was.
        admin.hset(d, mapping={"h:old": f"{token} {now} {now + 30_000_000} 1", "=last": token})
        admin.zadd(hx, {"old": now + 30_000_000})
    got = lock.try_acquire(holder="b")
    assert not got.acquired
    assert [h.holder for h in lock.status().holders] == ["old"]


def test_a_waiter_written_by_a_client_without_fast_paths_is_handed_the_lock(
    client: turnstile.Client, server: RedisProcess
) -> None:
    lock = client.lock("mixed", ttl=30)
    lock.acquire(timeout=1, holder="a").release()
    lease = lock.acquire(timeout=1, holder="a")  # "=fast" now says: one holder, no line
    d, _hx, wx, wq = _keys(client, "mixed")[:4]
    now = _server_us(server)
    with server.admin() as admin:
        seq = int(admin.hget(d, "=seq") or 0)
        stamp = max(seq + 1, now)
        expires = now + 30_000_000
        # What a join of an earlier release writes: the record, the arrival stamp, the line
        # and the waiters' expiry index.
        admin.hset(d, mapping={"w:old": f"30000000 30000000 {stamp} {expires}", "=seq": stamp})
        admin.zadd(wq, {"old": stamp})
        admin.zadd(wx, {"old": expires})
    assert lease.release() is True
    status = lock.status()
    assert [h.holder for h in status.holders] == ["old"] and status.waiters == ()


def test_a_stale_or_lapsed_release_still_reports_it(
    client: turnstile.Client, server: RedisProcess
) -> None:
    lock = client.lock("stale", ttl=30)
    lock.acquire(timeout=1, holder="a").release()
    lease = lock.acquire(timeout=1, holder="a")
    assert lock.release("a", lease.token + 1) is False  # not this lease's token
    assert lease.release() is True
    short = client.lock("stale", ttl=0.3).acquire(timeout=1, holder="a")
    time.sleep(0.5)  # its lease has run out on the server
    assert short.release() is False
    assert lock.status().holders == ()
    again = lock.acquire(timeout=1, holder="b")
    assert again.token > short.token


def test_a_new_limit_on_an_idle_name_is_taken(client: turnstile.Client) -> None:
    client.lock("shape", ttl=30).acquire(timeout=1).release()
    sem = client.semaphore("shape", 3, ttl=30)
    leases = [sem.acquire(timeout=1) for _ in range(3)]
    assert sem.status().limit == 3
    assert not sem.try_acquire("one-more").acquired
    for lease in leases:
        lease.release()


def _waiter(
    client: turnstile.Client, name: str, handed: list[turnstile.Lease], waiters: int
) -> threading.Thread:
    """A thread that asks for ``name`` (its lease appended to ``handed``), started once the
    name has ``waiters - 1`` waiters, and returned once it is in line too."""
    lock = client.lock(name, ttl=30)
    thread = threading.Thread(target=lambda: handed.append(lock.acquire(timeout=10)))
    thread.start()
    assert wait_until(lambda: len(lock.status().waiters) == waiters, 10)
    return thread


def test_a_hand_over_to_the_last_waiter_leaves_the_name_on_the_fast_path(
    client: turnstile.Client, server: RedisProcess
) -> None:
    """The release that hands over reads one waiter more than it grants, so it knows when
    it leaves the line empty: the new holder, alone then, releases on the fast path. With
    another waiter still in line, the new holder's release hands over in turn."""
    first = client.lock("last", ttl=30).acquire(timeout=1)
    handed: list[turnstile.Lease] = []
    threads = [_waiter(client, "last", handed, 1), _waiter(client, "last", handed, 2)]
    assert first.release() is True
    threads[0].join(10)
    # Someone still waits: a full release step, which hands over (and pushes the wake-up).
    spent = _spent(server, handed[0].release)
    assert spent["evalsha"] == 1 and spent["rpush"] == 1, spent
    threads[1].join(10)
    # The line is empty now: the fast release (HMGET, TIME, HDEL, ZREM, HSET).
    spent = _spent(server, handed[1].release)
    assert spent == {"evalsha": 1, "hmget": 1, "hdel": 1, "zrem": 1, "hset": 1}, spent
    # The name is idle again: the fast acquire, and tokens still grow.
    lock = client.lock("last", ttl=30)
    spent = _spent(server, lambda: handed.append(lock.acquire(timeout=1)))
    assert spent["evalsha"] == 1 and "zrange" not in spent, spent
    assert handed[2].token > handed[1].token > handed[0].token
    handed[2].release()
