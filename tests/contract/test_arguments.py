"""Bad input (SPEC "Bad input"): every public entry point refuses a bad argument with an
InvalidArgument naming it; odd but valid names work and stay separate from each other."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import pytest

import turnstile
from turnstile import MAX_NAME_BYTES

from .lock_harness import LONG_TTL, Spawner

BAD_NAMES: list[Any] = [
    "",
    "x" * (MAX_NAME_BYTES + 1),
    "é" * (MAX_NAME_BYTES // 2 + 1),  # 2 bytes each in UTF-8: over the limit in bytes
    "😀" * (MAX_NAME_BYTES // 4) + "x",  # 4097 bytes
    "a\x00b",
    "\x00",
    "\ud800",  # a lone surrogate is not UTF-8
    None,
    42,
    b"bytes",
    ["list"],
]
BAD_TTLS: list[Any] = [
    0,
    -1,
    -0.5,
    0.0,
    math.nan,
    math.inf,
    -math.inf,
    1e12,
    10**20,
    True,
    False,
    "5",
    None,
]
BAD_TIMEOUTS: list[Any] = [-1, -0.001, math.inf, -math.inf, math.nan, 1e12, True, "1", [1]]
BAD_LIMITS: list[Any] = [0, -1, True, False, 1.5, 2.0, 10**12, "2", None]
BAD_HOLDERS: list[Any] = ["", "a\x00", "x" * 1025, 5, None, b"h"]
BAD_TOKENS: list[Any] = [0, -1, True, 1.5, "1", 2**63, [1]]

ODD_NAMES = [
    "{}",
    "{a}",
    "a",
    "{a}:",
    "{a}:b",
    "a b",
    " ",
    "  leading and trailing  ",
    "'",
    '"',
    'it\'s "quoted"',
    "'; DROP TABLE x; --",
    "'); DELETE FROM turnstile_holders; --",
    "Robert'); DROP TABLE turnstile_meta;--",
    "😀",
    "名前:ロック",
    "*",
    "?",
    "[a-z]",
    "%",
    "_",
    "a*",
    "\\",
    "line\nbreak",
    "tab\there",
    "redis.call('FLUSHALL')",
    "$1",
    "x" * MAX_NAME_BYTES,
    "😀" * (MAX_NAME_BYTES // 4),
    "x" * (MAX_NAME_BYTES - 1) + "y",
]


class Refusals:
    """Runs every check and reports all that failed at once (one client per backend row, not
    one per bad value: setting up a private store costs time on server backends)."""

    def __init__(self) -> None:
        self.failures: list[str] = []

    def check(self, call: Callable[[], object], argument: str, bad: Any) -> None:
        try:
            call()
        except turnstile.InvalidArgument as exc:
            if not isinstance(exc, ValueError) or argument not in str(exc):
                self.failures.append(f"{argument}={bad!r}: message does not name it: {exc}")
        except Exception as exc:
            self.failures.append(f"{argument}={bad!r}: {type(exc).__name__}: {exc}")
        else:
            self.failures.append(f"{argument}={bad!r}: accepted")

    def __enter__(self) -> Refusals:
        return self

    def __exit__(self, *exc: object) -> None:
        assert not self.failures, "\n".join(self.failures)


def test_bad_names(client: turnstile.Client) -> None:
    with Refusals() as r:
        for bad in BAD_NAMES:
            r.check(lambda bad=bad: client.lock(bad), "name", bad)
            r.check(lambda bad=bad: client.semaphore(bad, 2), "name", bad)
            r.check(lambda bad=bad: client.status(bad), "name", bad)
            r.check(lambda bad=bad: client.limited(bad, 2), "name", bad)


def test_bad_ttls(client: turnstile.Client) -> None:
    sem = client.semaphore("args", 2, ttl=LONG_TTL)
    with Refusals() as r, sem.acquire(timeout=5) as lease:
        for bad in BAD_TTLS:
            r.check(lambda bad=bad: client.lock("args", ttl=bad), "ttl", bad)
            r.check(lambda bad=bad: client.semaphore("args", 2, ttl=bad), "ttl", bad)
            r.check(lambda bad=bad: client.sequential(key="k", ttl=bad), "ttl", bad)
            r.check(lambda bad=bad: client.limited("args", 2, ttl=bad), "ttl", bad)
            if bad is not None:  # None means: the default
                r.check(lambda bad=bad: sem.try_acquire("h", wait_ttl=bad), "wait_ttl", bad)
                r.check(lambda bad=bad: lease.renew(ttl=bad), "ttl", bad)
        assert not lease.lost
    st = sem.status()
    assert st.holders == () and st.waiters == ()  # refused calls left nothing behind


def test_bad_timeouts(client: turnstile.Client) -> None:
    lock = client.lock("args", ttl=LONG_TTL)
    with Refusals() as r:
        for bad in BAD_TIMEOUTS:
            r.check(lambda bad=bad: lock.acquire(timeout=bad), "timeout", bad)
            r.check(lambda bad=bad: client.sequential(key="k", timeout=bad), "timeout", bad)
            r.check(lambda bad=bad: client.limited("args", 2, timeout=bad), "timeout", bad)
    st = lock.status()
    assert st.holders == () and st.waiters == ()


def test_bad_limits(client: turnstile.Client) -> None:
    with Refusals() as r:
        for bad in BAD_LIMITS:
            r.check(lambda bad=bad: client.semaphore("args", bad), "limit", bad)
            r.check(lambda bad=bad: client.limited("args", bad), "limit", bad)


def test_bad_holders(client: turnstile.Client) -> None:
    sem = client.semaphore("args", 2, ttl=LONG_TTL)
    with Refusals() as r:
        for bad in BAD_HOLDERS:
            if bad is not None:  # None means: a fresh holder id
                r.check(lambda bad=bad: sem.acquire(timeout=1, holder=bad), "holder", bad)
                r.check(lambda bad=bad: sem.acquire_nowait(holder=bad), "holder", bad)
            r.check(lambda bad=bad: sem.try_acquire(bad), "holder", bad)
            r.check(lambda bad=bad: sem.release(bad), "holder", bad)
    st = sem.status()
    assert st.holders == () and st.waiters == ()


def test_bad_tokens(client: turnstile.Client) -> None:
    sem = client.semaphore("args", 2, ttl=LONG_TTL)
    with Refusals() as r, sem.acquire(timeout=5, holder="h"):
        for bad in BAD_TOKENS:
            r.check(lambda bad=bad: sem.release("h", bad), "token", bad)
        assert [h.holder for h in sem.status().holders] == ["h"]


def test_names_arguments(client: turnstile.Client) -> None:
    with Refusals() as r:
        r.check(lambda: client.names(3), "prefix", 3)  # type: ignore[arg-type]
        r.check(lambda: client.names("", 0), "max_count", 0)
        r.check(lambda: client.names("", True), "max_count", True)
        r.check(lambda: client.names("\ud800"), "prefix", "\ud800")
    # No name can start with these: an empty answer, without asking the store.
    assert client.names("n\x00") == client.names("n" * 4097) == []


def test_limits_of_the_accepted_range_work(client: turnstile.Client) -> None:
    # The shortest ttl is granted as asked. It may well have expired again before the next
    # line runs on a busy machine, so nothing here depends on still holding it.
    sem = client.semaphore("args:edge", 1_000_000, ttl=0.05)
    lease = sem.acquire(timeout=0)
    assert lease.ttl == 0.05
    assert lease.expires_at - lease.acquired_at == pytest.approx(0.05, abs=1e-3)
    lease.release()  # True, or False if it already expired: either is right
    lock = client.lock("args:edge2", ttl=30 * 24 * 3600)
    with lock.acquire(timeout=30 * 24 * 3600) as lease:
        assert lease.expires_at - lease.acquired_at == pytest.approx(30 * 24 * 3600)


def test_odd_names_work_and_stay_separate(client: turnstile.Client, workers: Spawner) -> None:
    assert len(set(ODD_NAMES)) == len(ODD_NAMES)
    leases = {}
    for name in ODD_NAMES:
        lock = client.lock(name, ttl=LONG_TTL)
        leases[name] = lock.acquire_nowait(holder=f"holder of {name[:30]}")
        assert lock.status().name == name
    for name in ODD_NAMES:  # each name is held by exactly its own holder
        st = client.status(name)
        assert [(h.holder, h.token) for h in st.holders] == [
            (f"holder of {name[:30]}", leases[name].token)
        ]
        with pytest.raises(turnstile.AcquireTimeout):
            client.lock(name, ttl=LONG_TTL).acquire_nowait()
    assert set(ODD_NAMES) <= set(client.names("", 1000))
    # another process (or thread) sees the very same names, held
    w = workers.spawn("probe_names", names=ODD_NAMES, ttl=LONG_TTL)
    report = w.wait_for("probe")["report"]
    w.join()
    assert [r["name"] for r in report] == ODD_NAMES
    assert [r["free"] for r in report] == [False] * len(ODD_NAMES)
    assert [r["holders"] for r in report] == [[f"holder of {n[:30]}"] for n in ODD_NAMES]
    # releasing some leaves the others alone
    released = ODD_NAMES[::2]
    for name in released:
        assert leases[name].release()
    for name in ODD_NAMES:
        holders = [h.holder for h in client.status(name).holders]
        assert holders == ([] if name in released else [f"holder of {name[:30]}"])
    for name in ODD_NAMES[1::2]:
        assert leases[name].release()
    for name in ODD_NAMES:
        assert client.status(name).holders == ()


def test_odd_names_as_prefix_of_names(client: turnstile.Client) -> None:
    """names(prefix) takes the prefix literally (no pattern matching)."""
    for name in ("*", "a*", "ab", "[a]b", "%x", "_y"):
        client.lock(name, ttl=LONG_TTL).acquire_nowait(holder="h")
    assert client.names("*") == ["*"]
    assert client.names("a") == ["a*", "ab"]
    assert client.names("a*") == ["a*"]
    assert client.names("[a]") == ["[a]b"]
    assert client.names("%") == ["%x"]
    assert client.names("_") == ["_y"]
    assert client.names("", 2) == sorted(client.names(""))[:2]
    for name in ("*", "a*", "ab", "[a]b", "%x", "_y"):
        assert client.lock(name).release("h")


def test_odd_holders_work(client: turnstile.Client) -> None:
    sem = client.semaphore("args:holders", 10, ttl=LONG_TTL)
    holders = ["'; DROP TABLE x; --", "{h}", "😀", "a b", "*", "\n", "x" * 1024]
    for h in holders:
        assert sem.try_acquire(h).acquired
    assert sorted(x.holder for x in sem.status().holders) == sorted(holders)
    for h in holders:
        assert sem.release(h)
    assert sem.status().holders == ()
