"""Rate limits on Redis (lua/rate/*.lua): the scripts follow the reference machine
(turnstile/_core/rate_machine.py) step for step, keep every key under the prefix, in one slot
per name and with an expiry that ends with the rate limit's use, and cost a fixed number of
commands per admission whatever the length of the line.

The model comparison uses rates slow enough (one admission per 10 minutes) that no slot,
lapse or change of conformance falls inside a sequence: the two stores' clocks and the
steps' timing differ by milliseconds only, so the answers must agree exactly (slots to
10 s). Acquires carry random priorities, strict or with an ageing (an hour or a microsecond
a level) that no comparison of ranks within a sequence comes near (see test_model.py).
"""

from __future__ import annotations

import os
import random
import secrets
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from redis.crc import key_slot

import turnstile
from turnstile._sync.backends.protocol import Backend
from turnstile.stores.redis import keys as redis_keys

from ._tools import RedisProcess, redis_process
from .test_specific import ODD_NAMES

pytestmark = pytest.mark.redis

SLOW = [(1, 600.0, 1), (2, 1200.0, 3), (1, 600.0, 2)]  # (rate, per, burst): T = 600 s
AGEINGS = [None, None, 3600.0, 1e-6]  # seconds per priority level (see test_model.py)


def _server() -> str:
    url = os.environ.get("TURNSTILE_TEST_REDIS_URL")
    if not url:
        if os.environ.get("CI"):
            pytest.fail("TURNSTILE_TEST_REDIS_URL is not set under CI")
        pytest.skip("TURNSTILE_TEST_REDIS_URL is not set (scripts/dev.py test sets it)")
    return url


@pytest.fixture
def server(tmp_path: Path) -> Iterator[RedisProcess]:
    with redis_process(tmp_path / "redis", "--appendonly", "no") as srv:
        yield srv


def _outcome(fn: Any, *args: Any, **kwargs: Any) -> Any:
    """The answer (slots to 10 s), or the message of a refused rate."""
    try:
        r = fn(*args, **kwargs)
    except turnstile.LimitConflict as exc:
        return str(exc)
    return (r.admitted, r.position, round(r.retry_after / 10))


def _view(backend: Backend, name: str) -> tuple[object, ...]:
    s = backend.rate_status(name)
    assert list(s.admitted) == sorted(s.admitted)
    assert all(s.now - 600 < a <= s.now for a in s.admitted)
    joined = [w.joined_at for w in s.waiters]  # distinct stamps, none in the future
    assert len(set(joined)) == len(joined) and all(j <= s.now for j in joined)
    return (
        s.rate,
        s.per,
        s.burst,
        round((s.next_slot - s.now) / 10),
        [(w.holder, w.position, round((w.slot - s.now) / 10)) for w in s.waiters],
        len(s.admitted),
    )


def _cleanup(url: str, prefix: str) -> None:
    admin = redis.Redis.from_url(url)
    for key in list(admin.scan_iter(match=f"{prefix}*", count=1000)):
        admin.delete(key)
    admin.close()


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_random_operations_match_the_model(seed: int) -> None:
    rng = random.Random(seed)
    prefix = f"tt-rmodel-{secrets.token_hex(4)}:"
    model = turnstile.connect("memory://")
    real = turnstile.connect(f"{_server()}?prefix={prefix}")
    names = ["a", "{b}", "c c", "d"]
    holders = [f"h{i}" for i in range(6)]
    seen: set[str] = set()
    try:
        for step in range(300):
            name, holder = rng.choice(names), rng.choice(holders)
            op = rng.choices(["acquire", "leave", "status"], [6, 2, 1])[0]
            where = f"seed {seed} step {step}: {op} {name!r} {holder!r}"
            if op == "acquire":
                rate, per, burst = rng.choice(SLOW) if rng.random() < 0.2 else SLOW[0]
                args = {
                    "rate": rate,
                    "per": per,
                    "burst": burst,
                    "enqueue": rng.random() < 0.8,
                    "grace": 600.0,
                    "priority": rng.randint(-2, 2),
                    "ageing": rng.choice(AGEINGS),
                }
                before = model.backend.rate_status(name)
                a = _outcome(model.backend.rate_acquire, name, holder, **args)
                b = _outcome(real.backend.rate_acquire, name, holder, **args)
                assert a == b, where
                seen.add("refused" if isinstance(a, str) else "admitted" if a[0] else "waits")
                if (
                    not isinstance(a, str)
                    and a[1] is not None
                    and a[1] < len(before.waiters)
                    and not any(w.holder == holder for w in before.waiters)
                ):
                    seen.add("passed")
            elif op == "leave":
                left = model.backend.rate_leave(name, holder)
                assert real.backend.rate_leave(name, holder) == left, where
                seen.add(f"left {left}")
            for n in names:
                assert _view(model.backend, n) == _view(real.backend, n), f"{where}; {n!r}"
        assert seen >= {"refused", "admitted", "waits", "left True", "left False", "passed"}, seen
    finally:
        model.close()
        real.close()
        _cleanup(_server(), prefix)


def test_a_deterministic_sequence_matches_the_model() -> None:
    prefix = f"tt-rseq-{secrets.token_hex(4)}:"
    model = turnstile.connect("memory://")
    real = turnstile.connect(f"{_server()}?prefix={prefix}")
    steps: list[tuple[str, str, dict[str, Any]]] = [
        ("acquire", "a", {"enqueue": True}),  # admitted (burst 2 from idle)
        ("acquire", "b", {"enqueue": True}),  # admitted
        ("acquire", "c", {"enqueue": False}),  # refused, not in line
        ("acquire", "c", {"enqueue": True}),  # position 0
        ("acquire", "d", {"enqueue": True}),  # position 1
        ("acquire", "c", {"enqueue": True}),  # keeps position 0
        ("acquire", "e", {"enqueue": True, "burst": 5}),  # another rate: refused
        ("leave", "c", {}),  # d moves up
        ("leave", "c", {}),  # had no place
        ("acquire", "e", {"enqueue": True}),  # position 1
        ("status", "", {}),
    ]
    try:
        for op, holder, extra in steps:
            if op == "acquire":
                args = {"rate": 1, "per": 600.0, "burst": 2, "grace": 600.0, **extra}
                a = _outcome(model.backend.rate_acquire, "n", holder, **args)
                b = _outcome(real.backend.rate_acquire, "n", holder, **args)
            elif op == "leave":
                a = model.backend.rate_leave("n", holder)
                b = real.backend.rate_leave("n", holder)
            else:
                a, b = _view(model.backend, "n"), _view(real.backend, "n")
            assert a == b, (op, holder, extra)
        assert [w.holder for w in real.backend.rate_status("n").waiters] == ["d", "e"]
    finally:
        model.close()
        real.close()
        _cleanup(_server(), prefix)


def test_keys_live_under_the_prefix_in_one_slot_and_expire_with_use(
    server: RedisProcess,
) -> None:
    prefix = "tt-rkeys:"
    client = turnstile.connect(server.url + f"?prefix={prefix}")
    try:
        for name in ODD_NAMES:
            limiter = client.rate_limit(name, rate=1, per=30.0)
            assert limiter.try_acquire("first").acquired
            assert limiter.try_acquire("second", wait_ttl=5).position == 0
        assert client.names() == []  # rate limits are not locks
        with server.admin() as admin:
            keys = [k.decode() for k in admin.scan_iter(count=1000)]
            for name in ODD_NAMES:
                base = redis_keys.key_base(prefix, name)
                mine = sorted(k for k in keys if k.startswith(base))
                assert mine == sorted(redis_keys.rate_keys(base))
                assert len({key_slot(k.encode()) for k in mine}) == 1
                assert admin.hget(base + "r:m", "=name") == name.encode()  # the name is data
                for key in mine:
                    # until tat (one slot, 30 s) + the waiter's place (5 s past its slot)
                    assert 29_000 < admin.pttl(key) <= 35_002, key
            assert len(keys) == 4 * len(ODD_NAMES)

        # A fast rate limit is gone as soon as it is idle: nothing left behind.
        fast = client.rate_limit("fast", rate=10, per=0.2, burst=2)
        assert fast.try_acquire("x").acquired
        assert fast.try_acquire("y").acquired
        base = redis_keys.key_base(prefix, "fast")
        with server.admin() as admin:
            assert admin.exists(*redis_keys.rate_keys(base)) == 2  # r:m, r:a: nobody waits
            deadline = time.monotonic() + 5
            while admin.exists(*redis_keys.rate_keys(base)) and time.monotonic() < deadline:
                time.sleep(0.02)
            assert admin.exists(*redis_keys.rate_keys(base)) == 0
        assert fast.status().rate is None
        # Leaving the line of a name that is otherwise idle deletes it at once.
        slow = client.rate_limit("slow", rate=1, per=0.5)
        assert slow.try_acquire("x").acquired
        assert slow.try_acquire("y").position == 0
        time.sleep(0.6)  # tat and the admission are past; y is still in line
        assert slow.leave("y")
        with server.admin() as admin:
            assert admin.exists(*redis_keys.rate_keys(redis_keys.key_base(prefix, "slow"))) == 0
    finally:
        client.close()


def _commands(server: RedisProcess) -> int:
    """Commands the server ran so far, counting the INFO of an earlier call to this."""
    return sum(server.commandstats().values())


def test_an_admission_costs_the_same_with_2_and_32_waiters(server: RedisProcess) -> None:
    client = turnstile.connect(server.url + "?prefix=tt-rcost:")
    try:
        costs = {}
        for waiters in (2, 32):
            for attempt in range(5):
                limiter = client.rate_limit(f"line-{waiters}-{attempt}", rate=5, per=1.0)
                assert limiter.try_acquire("first").acquired
                for i in range(waiters):
                    assert limiter.try_acquire(f"w{i}").position == i
                ticket = limiter.try_acquire("w0")
                if ticket.acquired:
                    # The head's slot (0.2 s after the first admission) came while the line
                    # formed (a slow machine): that step admitted it, and is not the one to
                    # count. Again, under a fresh name.
                    continue
                time.sleep(ticket.retry_after + 0.01)
                before = _commands(server)
                assert limiter.try_acquire("w0").acquired  # the head, at its slot
                costs[waiters] = _commands(server) - before - 1  # less the INFO of `before`
                break
            else:
                pytest.fail("the line never formed before its head's slot, in 5 tries")
        assert costs[2] == costs[32], costs

        # The head at its slot: one EVALSHA running 14 commands (the purge of lapsed places
        # reads the line's length; the head leaves both zsets and its joined field).
        assert costs[2] == 15, costs
        # An admission with nobody in line: one EVALSHA running TIME, HMGET,
        # ZREMRANGEBYSCORE, ZADD, HSET and PEXPIREAT of the two keys.
        limiter = client.rate_limit("alone", rate=1000, per=1.0, burst=1000)
        assert limiter.try_acquire("a").acquired
        before = _commands(server)
        assert limiter.try_acquire("b").acquired
        assert _commands(server) - before - 1 == 9
    finally:
        client.close()
