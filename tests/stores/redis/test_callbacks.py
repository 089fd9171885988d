"""Callback grants on Redis: what the contract suite cannot see (tests/contract/test_callbacks.py
holds the behaviour). The plain paths send exactly the commands they sent before callbacks;
the callback index finds a grant whose notification was lost; status never carries the
stored callback; an index entry goes once its name has no callbacks left."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from redis.crc import key_slot

import turnstile
from turnstile._core.callbacks import StepFunctionsCallback
from turnstile._sync.backends import redis as redis_backend
from turnstile.stores.redis import keys as redis_keys

from ._tools import RedisProcess, redis_process

LONG = 60.0
SECRET_TOKEN = "secret-task-token-" + "x" * 40


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisProcess]:
    folder: Path = tmp_path_factory.mktemp("redis-callbacks")
    with redis_process(folder) as server:
        yield server


@pytest.fixture
def client(server: RedisProcess, request: pytest.FixtureRequest) -> Iterator[turnstile.Client]:
    prefix = f"tt-cb-{request.node.name[:20]}:"
    client = turnstile.connect(server.url + f"?prefix={prefix}")
    try:
        yield client
    finally:
        client.close()
        with server.admin() as admin:
            for key in admin.scan_iter(match=f"{prefix}*", count=1000):
                admin.delete(key)


def _calls(server: RedisProcess) -> int:
    """Commands so far, less those of the admin connections that read them."""
    stats = server.commandstats()
    return sum(n for k, n in stats.items() if k not in ("info", "hello"))


def test_a_plain_lock_leaves_no_callback_keys_and_a_hand_over_costs_what_it_did(
    client: turnstile.Client, server: RedisProcess
) -> None:
    lock = client.lock("plain", ttl=LONG)
    first = lock.try_acquire(holder="a")
    assert first.lease is not None
    lock.try_acquire(holder="b")
    lock.status()
    lock.release("nobody", 1)  # every script used below is loaded
    before = _calls(server)
    first.lease.release()
    released = _calls(server)
    claimed = lock.try_acquire(holder="b")
    after = _calls(server)
    assert claimed.acquired
    # The release script (EVALSHA and the commands inside: HMGET, TIME, ZPOPMIN of the front
    # of the line, the PUBLISH of the wake-up, HDEL of the waiter's index field (a holder
    # named by the caller is indexed), HSET) and a claiming acquire (HMGET, TIME, HSET): none
    # of them a callback's (CW, PD untouched). The release also sends a PING ahead of its
    # script (RedisConnection._call: a woken waiter is written first).
    assert released - before == 1 + 1 + 6
    assert after - released == 1 + 3
    prefix = client.backend.config.prefix
    with server.admin() as admin:
        found = sorted(k.decode() for k in admin.scan_iter(match=f"{prefix}*"))
    assert not any(k.endswith((":cw", ":pd")) or "{callbacks}" in k for k in found), found


def test_nothing_due_costs_one_round_trip(client: turnstile.Client, server: RedisProcess) -> None:
    sem = client.semaphore("idle", 1, ttl=LONG)
    sem.try_acquire("a")
    sem.try_acquire("b", callback=StepFunctionsCallback(SECRET_TOKEN))
    client.backend.take_deliveries(lease=LONG, max_count=10)  # reschedules "idle"
    before = server.commandstats()
    assert client.backend.take_deliveries(lease=LONG, max_count=10) == []
    after = server.commandstats()
    assert after["script"] - before["script"] == 1


def test_a_grant_whose_notification_was_lost_is_still_taken_within_the_recheck(
    client: turnstile.Client,
) -> None:
    """The client that released died between its script and its index update."""
    backend = client.backend
    sem = client.semaphore("lost", 1, ttl=LONG)
    first = sem.try_acquire("a")
    assert first.lease is not None
    sem.try_acquire("b", callback=StepFunctionsCallback(SECRET_TOKEN))
    assert backend.take_deliveries(lease=LONG, max_count=10) == []  # scheduled ahead
    # The release script alone, as a client that dies before its index update.
    reply = backend._run("release", "lost", ["a", str(first.lease.token)])
    assert isinstance(reply, list) and int(reply[0]) == 1  # it asked for a notification
    assert [(h.holder, h.delivery) for h in sem.status().holders] == [("b", "pending")]
    started = time.monotonic()
    found: list[object] = []
    while not found and time.monotonic() - started < 10:
        found = backend.take_deliveries(lease=LONG, max_count=10)
        time.sleep(0.05)
    waited = time.monotonic() - started
    assert [d.holder for d in found] == ["b"]  # type: ignore[attr-defined]
    assert waited < redis_backend.RECHECK_US / 1e6 + 1.0


def test_status_and_status_replies_never_carry_the_callback(client: turnstile.Client) -> None:
    sem = client.semaphore("secret", 1, ttl=LONG)
    sem.try_acquire("a", callback=StepFunctionsCallback(SECRET_TOKEN))
    sem.try_acquire("b", callback=StepFunctionsCallback(SECRET_TOKEN + "-b"))
    raw = client.backend._run("status", "secret", [])
    assert SECRET_TOKEN not in repr(raw)
    status = sem.status()
    assert SECRET_TOKEN not in repr(status) and SECRET_TOKEN not in repr(status.to_dict())
    assert [(h.callback, h.delivery) for h in status.holders] == [("sfn", "pending")]
    assert [w.callback for w in status.waiters] == ["sfn"]


def test_keys_share_the_name_slot_and_the_index_goes_when_callbacks_are_gone(
    client: turnstile.Client, server: RedisProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(redis_backend, "LINGER_US", 100_000)
    backend = client.backend
    prefix = backend.config.prefix
    sem = client.semaphore("{odd} name", 1, ttl=LONG)
    sem.try_acquire("a", callback=StepFunctionsCallback(SECRET_TOKEN))
    sem.try_acquire("b", callback=StepFunctionsCallback(SECRET_TOKEN))
    base = redis_keys.key_base(prefix, "{odd} name")
    due_key, idle_key = redis_keys.callback_index_keys(prefix)
    with server.admin() as admin:
        mine = [k.decode() for k in admin.scan_iter(match=f"{prefix}*")]
        name_keys = [k for k in mine if k.startswith(base)]
        assert {k[len(base) :] for k in name_keys} == {"d", "l", "cw", "pd"}
        assert len({key_slot(k.encode()) for k in name_keys}) == 1
        assert all(admin.pttl(k) > 0 for k in mine), mine
        assert admin.zscore(due_key, redis_keys.name_tag("{odd} name")) is not None
    (d1,) = backend.take_deliveries(lease=LONG, max_count=10)
    assert backend.pending_deliveries() == 1
    assert backend.settle_delivery("{odd} name", d1.token, outcome="refused", retry_in=0)
    (d2,) = backend.take_deliveries(lease=LONG, max_count=10)
    assert d2.holder == "b"
    assert backend.settle_delivery("{odd} name", d2.token, outcome="delivered", retry_in=0)
    assert backend.pending_deliveries() == 0
    assert sem.release("b", d2.token)
    deadline = time.monotonic() + 10
    with server.admin() as admin:
        while admin.exists(due_key) and time.monotonic() < deadline:
            backend.take_deliveries(lease=LONG, max_count=10)
            time.sleep(0.05)
        assert not admin.exists(due_key) and not admin.exists(idle_key)
        assert not admin.hexists(base + "d", "=cb")
