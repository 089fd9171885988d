"""The Lua scripts follow the reference state machine (turnstile/_core/lock_machine.py) step for
step: the same random sequence of operations, run on the memory backend (the model itself)
and on a real Redis, gives the same answers (refusals of another limit included) and the
same holders and line after each step.

Leases and waiting entries here are long, so no expiry falls inside a sequence (expiry is
judged by each store's own clock; the contract suite covers it).

Acquires carry random priorities, strict or with an ageing so long (an hour a level) or so
short (a microsecond) that no comparison of ranks depends on the two stores' clocks: waits
within a sequence (milliseconds to seconds) are far from either (test_priorities.py covers
an ageing that matters).

Semaphore groups get a sequence of their own: random keys from a small set (one with a
space, one that looks like a record's length prefix), per_key 1 to 2 and a total of 2 to 3,
so that promote's skips of full keys are compared step for step, with plain acquires and
other shapes on the same names (refused alike), releases, renewals and changes of total.
"""

from __future__ import annotations

import os
import random
import secrets
from typing import Any

import pytest

import turnstile
from turnstile._sync.backends.protocol import Backend

pytestmark = pytest.mark.redis

LONG = 600.0
# Seconds per priority level: strict, an hour (never reached here), a microsecond (every
# step is far longer, so the line is in arrival order between these).
AGEINGS = [None, None, 3600.0, 1e-6]


def _server() -> str:
    url = os.environ.get("TURNSTILE_TEST_REDIS_URL")
    if not url:
        if os.environ.get("CI"):
            pytest.fail("TURNSTILE_TEST_REDIS_URL is not set under CI")
        pytest.skip("TURNSTILE_TEST_REDIS_URL is not set (scripts/dev.py test sets it)")
    return url


def _outcome(fn: Any, *args: Any, **kwargs: Any) -> Any:
    """The answer, or the message of an InvalidArgument (a refused limit)."""
    try:
        return fn(*args, **kwargs)
    except turnstile.InvalidArgument as exc:
        return str(exc)


def _view(backend: Backend, name: str) -> tuple[object, ...]:
    """Limit (and a group's per_key), holders with their key and the time left on their
    lease (to 10 s: the two stores' clocks and the steps' timing differ a little), and the
    line."""
    s = backend.status(name)
    tokens = [h.token for h in s.holders]
    assert tokens == sorted(tokens)
    return (
        s.limit,
        s.per_key,
        [(h.holder, h.key, round((h.expires_at - s.now) / 10)) for h in s.holders],
        [(w.holder, w.key, w.position, round((w.expires_at - s.now) / 10)) for w in s.waiters],
    )


@pytest.mark.parametrize("seed", range(12))
def test_random_operations_match_the_model(seed: int) -> None:
    rng = random.Random(seed)
    prefix = f"tt-model-{secrets.token_hex(4)}:"
    model = turnstile.connect("memory://")
    real = turnstile.connect(f"{_server()}?prefix={prefix}")
    names = ["a", "{b}", "c c"]
    holders = [f"h{i}" for i in range(7)]
    tokens: dict[tuple[str, str], tuple[int, int]] = {}  # (name, holder) -> (model, redis)
    seen: set[str] = set()  # refusals, changes of limit and newcomers passing others
    try:
        for step in range(400):
            name, holder = rng.choice(names), rng.choice(holders)
            op = rng.choices(
                ["acquire", "set_limit", "release", "release_token", "renew"], [6, 1, 2, 2, 1]
            )[0]
            where = f"seed {seed} step {step}: {op} {name!r} {holder!r}"
            if op == "acquire":
                limit = rng.choice([1, 1, 2, 3])
                enqueue = rng.random() < 0.8
                # Unclaimed grants last min(ttl, wait_ttl), claimed ones ttl: vary both.
                ttl, wait_ttl = rng.choice([LONG, LONG / 2]), rng.choice([LONG, LONG / 4])
                args = {
                    "limit": limit,
                    "ttl": ttl,
                    "wait_ttl": wait_ttl,
                    "enqueue": enqueue,
                    "priority": rng.randint(-2, 2),
                    "ageing": rng.choice(AGEINGS),
                }
                before = model.backend.status(name)
                a = _outcome(model.backend.acquire, name, holder, **args)
                b = _outcome(real.backend.acquire, name, holder, **args)
                if isinstance(a, str) or isinstance(b, str):  # a refused limit, on both
                    assert a == b, where
                    seen.add("refused")
                    continue
                assert (a.grant is None) == (b.grant is None), where
                assert a.position == b.position, where
                if a.position is not None and a.position < len(before.waiters) and not any(
                    w.holder == holder for w in before.waiters
                ):
                    seen.add("passed")
                if a.grant is not None and b.grant is not None:
                    tokens[(name, holder)] = (a.grant.token, b.grant.token)
            elif op == "set_limit":
                limit = rng.choice([1, 2, 3])
                previous = model.backend.set_limit(name, limit)
                assert real.backend.set_limit(name, limit) == previous, where
                seen.add("changed" if previous not in (None, limit) else "unchanged")
            elif op == "release":
                assert model.backend.release(name, holder, None) == real.backend.release(
                    name, holder, None
                ), where
            else:
                known = tokens.get((name, holder))
                if known is None:
                    continue
                if op == "release_token":
                    ra = model.backend.release(name, holder, known[0])
                    rb = real.backend.release(name, holder, known[1])
                    assert ra == rb, where
                else:
                    ga = model.backend.renew(name, holder, known[0], LONG)
                    gb = real.backend.renew(name, holder, known[1], LONG)
                    assert (ga is None) == (gb is None), where
            for n in names:
                assert _view(model.backend, n) == _view(real.backend, n), f"{where}; {n!r}"
        assert seen == {"refused", "changed", "unchanged", "passed"}, seen
        # Tokens are ordered the same way on both stores.
        pairs = sorted(tokens.values())
        assert [b for _, b in pairs] == sorted(b for _, b in pairs)
    finally:
        model.close()
        real.close()
        _clean(prefix)


def _clean(prefix: str) -> None:
    import redis

    admin = redis.Redis.from_url(_server())
    for key in list(admin.scan_iter(match=f"{prefix}*", count=1000)):
        admin.delete(key)
    admin.close()


GROUP_KEYS = ["a", "b", "c", "k 1", "k1 x"]


@pytest.mark.parametrize("seed", range(12))
def test_random_group_operations_match_the_model(seed: int) -> None:
    rng = random.Random(seed)
    prefix = f"tt-model-g-{secrets.token_hex(4)}:"
    model = turnstile.connect("memory://")
    real = turnstile.connect(f"{_server()}?prefix={prefix}")
    names = ["g", "g {2}"]
    holders = [f"h{i}" for i in range(9)]
    tokens: dict[tuple[str, str], tuple[int, int]] = {}  # (name, holder) -> (model, redis)
    seen: set[str] = set()
    try:
        for step in range(500):
            name, holder = rng.choice(names), rng.choice(holders)
            op = rng.choices(
                ["acquire", "set_limit", "release", "release_token", "renew", "clear"],
                [10, 1, 3, 2, 1, 1],
            )[0]
            where = f"seed {seed} step {step}: {op} {name!r} {holder!r}"
            if op == "acquire":
                # Another shape is mostly tried on a busy name (refused); on an idle one it
                # makes a plain semaphore or another group of the name until the next clear.
                busy = model.backend.status(name).limit is not None
                weights = [12, 1, 1] if busy else [30, 1, 1]
                shape = rng.choices(["group", "other", "plain"], weights)[0]
                if shape == "group":  # the name's usual shape: per_key 1 or 2, total 2 or 3
                    per_key, limit = (1, 2) if name == "g" else (2, 3)
                elif shape == "other":
                    per_key, limit = rng.choice([(1, 3), (2, 2), (1, 1)])
                else:
                    per_key, limit = None, rng.choice([2, 3])
                key = rng.choice(GROUP_KEYS) if per_key is not None else None
                args = {
                    "limit": limit,
                    "ttl": rng.choice([LONG, LONG / 2]),
                    "wait_ttl": rng.choice([LONG, LONG / 4]),
                    "enqueue": rng.random() < 0.8,
                    "priority": rng.choice([0, 0, 0, 1, -1]),
                    "ageing": rng.choice(AGEINGS),
                    "key": key,
                    "per_key": per_key,
                }
                before = model.backend.status(name)
                a = _outcome(model.backend.acquire, name, holder, **args)
                b = _outcome(real.backend.acquire, name, holder, **args)
                if isinstance(a, str) or isinstance(b, str):  # a refused shape, on both
                    assert a == b, where
                    seen.add("group refused" if "semaphore group" in a else "refused")
                    continue
                assert (a.grant is None) == (b.grant is None), where
                assert a.position == b.position, where
                if a.grant is not None and b.grant is not None:
                    tokens[(name, holder)] = (a.grant.token, b.grant.token)
                    if before.per_key is not None and not any(
                        h.holder == holder for h in before.holders
                    ) and any(w.key != key for w in before.waiters):
                        seen.add("granted past a full key")
            elif op == "set_limit":
                limit = rng.choice([2, 3])
                previous = model.backend.set_limit(name, limit)
                assert real.backend.set_limit(name, limit) == previous, where
            elif op == "release":
                assert model.backend.release(name, holder, None) == real.backend.release(
                    name, holder, None
                ), where
            elif op == "clear":  # everyone leaves: the name is idle, free to take a shape
                for h in holders:
                    assert model.backend.release(name, h, None) == real.backend.release(
                        name, h, None
                    ), where
                seen.add("cleared")
            else:
                known = tokens.get((name, holder))
                if known is None:
                    continue
                if op == "release_token":
                    ra = model.backend.release(name, holder, known[0])
                    rb = real.backend.release(name, holder, known[1])
                    assert ra == rb, where
                else:
                    ga = model.backend.renew(name, holder, known[0], LONG)
                    gb = real.backend.renew(name, holder, known[1], LONG)
                    assert (ga is None) == (gb is None), where
            for n in names:
                view = _view(model.backend, n)
                assert view == _view(real.backend, n), f"{where}; {n!r}"
                if view[1] is not None and len(view[3]) > 0 and len(view[2]) < view[0]:
                    seen.add("skipped")  # a free slot and a line: every key in it is full
        # A scripted tail, so that every seed grants past a full key and leaves a free slot
        # before a line of full keys: on a cleared name (per_key 1, total 3), h1 holds key a,
        # h2 waits for a (full), h3 asks for b and is granted at once; one slot stays free.
        for h in holders:
            assert model.backend.release("g", h, None) == real.backend.release("g", h, None)
        group = {"limit": 3, "ttl": LONG, "wait_ttl": LONG, "enqueue": True, "per_key": 1}
        for holder, key, granted in (("h1", "a", True), ("h2", "a", False), ("h3", "b", True)):
            a = model.backend.acquire("g", holder, key=key, **group)
            b = real.backend.acquire("g", holder, key=key, **group)
            assert (a.grant is not None) == (b.grant is not None) == granted, holder
            assert a.position == b.position, holder
        view = _view(model.backend, "g")
        assert view == _view(real.backend, "g")
        assert view[0] == 3 and len(view[2]) == 2 and len(view[3]) == 1, view
        seen |= {"granted past a full key", "skipped"}
        expected = {"refused", "group refused", "skipped", "granted past a full key", "cleared"}
        assert expected <= seen, seen
    finally:
        model.close()
        real.close()
        _clean(prefix)
