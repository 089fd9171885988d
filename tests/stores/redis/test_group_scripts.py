"""Semaphore groups on Redis (lua/lock/_lib.lua promote_group, acquire.lua ARGV 10-11): the
paths the random model comparison (test_model.py) does not reach: expiries that free a key,
callback waiters in a group (granted past a full key, a refused delivery freeing its key),
the records' key encoding, and what a hand-over costs. Each scenario runs on the memory
backend (the model) too."""

from __future__ import annotations

import os
import secrets
import time
from collections.abc import Iterator

import pytest
import redis

import turnstile
from turnstile._core.callbacks import StepFunctionsCallback
from turnstile.stores.redis import keys as redis_keys

from ._tools import RedisProcess, redis_process

pytestmark = pytest.mark.redis

LONG = 120.0
TOKEN = "secret-task-token-" + "x" * 40


def _server() -> str:
    url = os.environ.get("TURNSTILE_TEST_REDIS_URL")
    if not url:
        if os.environ.get("CI"):
            pytest.fail("TURNSTILE_TEST_REDIS_URL is not set under CI")
        pytest.skip("TURNSTILE_TEST_REDIS_URL is not set (scripts/dev.py test sets it)")
    return url


def _cleanup(url: str, prefix: str) -> None:
    admin = redis.Redis.from_url(url)
    for key in list(admin.scan_iter(match=f"{prefix}*", count=1000)):
        admin.delete(key)
    admin.close()


@pytest.fixture(params=["memory", "redis"])
def client(request: pytest.FixtureRequest) -> Iterator[turnstile.Client]:
    if request.param == "memory":
        c = turnstile.connect("memory://")
        yield c
        c.close()
        return
    prefix = f"tt-group-{secrets.token_hex(4)}:"
    c = turnstile.connect(f"{_server()}?prefix={prefix}")
    try:
        yield c
    finally:
        c.close()
        _cleanup(_server(), prefix)


def _view(group: turnstile.SemaphoreGroup) -> tuple[list[tuple[str, str | None]], list[str]]:
    status = group.status()
    return sorted((h.holder, h.key) for h in status.holders), [w.holder for w in status.waiters]


def test_an_expired_holder_frees_its_key_for_the_next_of_that_key(
    client: turnstile.Client,
) -> None:
    short = client.semaphore_group("exp", per_key=1, total=2, ttl=0.3)
    group = client.semaphore_group("exp", per_key=1, total=2, ttl=LONG)
    assert short.try_acquire("a", "a1").acquired
    assert group.try_acquire("b", "b1").acquired
    group.release("b1")
    assert not group.try_acquire("a", "a2", wait_ttl=LONG).acquired  # a is full
    assert group.try_acquire("c", "c1", wait_ttl=LONG).acquired  # past a2
    assert not group.try_acquire("d", "d1", wait_ttl=LONG).acquired  # the total
    time.sleep(0.5)
    # a1's lease ran out: the next step drops it and grants a2 (first in line, its key
    # free again), not d1.
    assert not group.try_acquire("c", "c2", wait_ttl=LONG).acquired
    assert _view(group) == ([("a2", "a"), ("c1", "c")], ["d1", "c2"])
    assert group.try_acquire("a", "a2").acquired  # claims its grant


def test_callback_waiters_in_a_group(client: turnstile.Client) -> None:
    backend = client.backend
    group = client.semaphore_group("cbg", per_key=1, total=2, ttl=LONG)
    assert group.try_acquire("a", "a1").acquired
    cb = StepFunctionsCallback(TOKEN)
    assert not group.try_acquire("a", "cb-a", wait_ttl=LONG, callback=cb).acquired
    # Past the full key a, a callback waiter of key b is granted at once, its delivery
    # pending.
    assert group.try_acquire("b", "cb-b", wait_ttl=LONG, callback=cb).acquired
    assert not group.try_acquire("b", "b2", wait_ttl=LONG).acquired
    status = group.status()
    assert [(h.holder, h.key, h.delivery) for h in status.holders] == [
        ("a1", "a", None),
        ("cb-b", "b", "pending"),
    ]
    assert [(w.holder, w.key, w.callback) for w in status.waiters] == [
        ("cb-a", "a", "sfn"),
        ("b2", "b", None),
    ]
    taken = backend.take_deliveries(lease=LONG, max_count=10)
    assert [(d.holder, d.limit) for d in taken] == [("cb-b", 2)]
    # Refused: cb-b's grant goes, and its key's slot with it, to b2 (cb-a's key is full).
    assert backend.settle_delivery("cbg", taken[0].token, outcome="refused", retry_in=0)
    assert _view(group) == ([("a1", "a"), ("b2", "b")], ["cb-a"])
    # a1 leaves: cb-a is granted in the same step, its delivery pending.
    assert group.release("a1")
    status = group.status()
    assert [(h.holder, h.key, h.delivery) for h in status.holders] == [
        ("b2", "b", None),
        ("cb-a", "a", "pending"),
    ]
    assert [d.holder for d in backend.take_deliveries(lease=LONG, max_count=10)] == ["cb-a"]


def test_a_raised_total_grants_past_full_keys(client: turnstile.Client) -> None:
    group = client.semaphore_group("raise", per_key=2, total=2, ttl=LONG)
    for holder, key in [("a1", "a"), ("a2", "a"), ("a3", "a"), ("b1", "b"), ("a4", "a")]:
        group.try_acquire(key, holder, wait_ttl=LONG)
    assert _view(group) == ([("a1", "a"), ("a2", "a")], ["a3", "b1", "a4"])
    assert client.semaphore("raise", 2).set_limit(5) == 2
    assert _view(group) == ([("a1", "a"), ("a2", "a"), ("b1", "b")], ["a3", "a4"])
    assert group.status().free == 2  # free slots, and a line of a full key


def _redis_client(prefix: str) -> turnstile.Client:
    return turnstile.connect(f"{_server()}?prefix={prefix}")


def test_records_carry_the_key_length_first() -> None:
    prefix = f"tt-group-{secrets.token_hex(4)}:"
    client = _redis_client(prefix)
    try:
        group = client.semaphore_group("rec", per_key=1, total=1, ttl=LONG)
        odd = "k3 x y 1 2 3 4"  # spaces, and text like a record and its length prefix
        assert group.try_acquire(odd, "h").acquired
        assert not group.try_acquire("é", "w", wait_ttl=LONG).acquired
        plain = client.semaphore("plain", 1, ttl=LONG)
        plain.try_acquire("p")
        plain.try_acquire("q")
        admin = redis.Redis.from_url(_server())
        try:
            d = admin.hgetall(redis_keys.key_base(prefix, "rec") + "d")
            assert d[b"=pk"] == b"1"
            # "=hn": "<bytes>:<holder>" each, "=hr": "<bytes>:<record>" each, in the same
            # order; a record starts with its key; a waiting entry (a member of the line)
            # too, after "[i]<bytes>:<holder>".
            assert d[b"=hn"] == b"1:h"
            assert d[b"=hr"].split(b":", 1)[1].startswith(f"k{len(odd)} {odd} ".encode())
            line = admin.zrange(redis_keys.key_base(prefix, "rec") + "l", 0, -1)
            assert line[0].startswith("i1:wk2 é ".encode())  # bytes, not characters
            assert admin.zscore(redis_keys.key_base(prefix, "rec") + "l", line[0]) == float(
                d[b"w:w"]
            )  # the index field holds the entry's score
            p = admin.hgetall(redis_keys.key_base(prefix, "plain") + "d")
            assert b"=pk" not in p  # a plain name's records carry no key
            assert p[b"=hn"] == b"1:p" and p[b"=hr"].split(b":", 1)[1][:1].isdigit()
            plain_line = admin.zrange(redis_keys.key_base(prefix, "plain") + "l", 0, -1)
            assert plain_line[0].startswith(b"i1:q") and plain_line[0][4:5].isdigit()
        finally:
            admin.close()
        status = group.status()
        assert (status.per_key, status.holders[0].key, status.waiters[0].key) == (1, odd, "é")
        assert client.semaphore("plain", 1).status().per_key is None
    finally:
        client.close()
        _cleanup(_server(), prefix)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisProcess]:
    with redis_process(tmp_path_factory.mktemp("redis-groups")) as server:
        yield server


def test_a_group_hand_over_does_not_read_the_whole_line(server: RedisProcess) -> None:
    """When the front of the line can be granted, a hand-over reads a slice of the line,
    not all of it: the same commands with 2 and 32 waiters."""
    client = turnstile.connect(server.url + "?prefix=tt-gcost:")
    try:
        costs = {}
        for waiters in (2, 32):
            group = client.semaphore_group(f"line-{waiters}", per_key=1, total=1, ttl=30)
            holder = group.try_acquire("k0", "h")
            assert holder.lease is not None
            for i in range(waiters):
                group.try_acquire(f"k{i}", f"w{i}", wait_ttl=30)
            group.status()  # loads every script used below before counting
            group.release("nobody", 1)
            before = sum(server.commandstats().values())
            holder.lease.release()  # one hand-over to w0 ...
            claimed = group.try_acquire("k0", "w0")  # ... and w0 claiming it
            after = sum(server.commandstats().values())
            assert claimed.acquired
            costs[waiters] = after - before - 1  # less the INFO that reads the stats
        assert costs[2] == costs[32], costs
    finally:
        client.close()
