"""Issue 17.10: a dropped single reply to each lock operation, on Redis and PostgreSQL.

A :class:`~tests.faults.proxy.FaultProxy` sits between the client under test and the store;
for each operation it lets the store run the request and then throws its reply away and
resets the connection, once. Every operation is idempotent per holder (acquire) or per token
(release, renew), so the client's retry must land on the very outcome the lost reply carried:

* acquire: the caller gets the lease the store granted (one holder, one token), never a
  second grant and never a grant nobody knows about;
* the wait step (Redis: the ``BLPOP`` that pops the wake-up carrying the grant;
  PostgreSQL: the ``NOTIFY`` that hands the grant over, on the LISTEN connection): the
  waiter still gets the lease, promptly and with (about) its whole ttl ahead;
* release: no error for a release the store committed, the next waiter is granted exactly
  once, and releasing again is harmless (``False``, the newer holder untouched);
* renew: the lease stays held and is extended, never reported lost.

Every grant is also checked against a fenced resource (:class:`Fence`): tokens strictly
increase from one holder to the next, no two recorded holds overlap, and a stale token is
refused. SQLite has no connection to lose (and the HTTP service's faults are tested with the
service); the memory store has no I/O at all.
"""

from __future__ import annotations

import itertools
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import pytest

import turnstile

from .conftest import ProxiedStore

pytestmark = pytest.mark.slow

TTL = 30.0


@dataclass
class Fence:
    """A resource that accepts writes only under a token at least as large as any it has
    seen, and records each holder's hold from its first write to its last."""

    highest: int = 0
    holds: list[tuple[int, float, float]] = field(default_factory=list)
    _open: dict[int, float] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def write(self, token: int) -> None:
        with self._lock:
            if token < self.highest:
                raise AssertionError(f"stale token {token} accepted after {self.highest}")
            self.highest = token
            self._open.setdefault(token, time.monotonic())

    def done(self, token: int) -> None:
        with self._lock:
            self.holds.append((token, self._open.pop(token), time.monotonic()))

    def check(self) -> None:
        """Tokens strictly increase in the order of the holds, which never overlap."""
        assert not self._open, f"holds never ended: {self._open}"
        holds = sorted(self.holds, key=lambda h: h[1])
        for (t1, _s1, e1), (t2, s2, _e2) in itertools.pairwise(holds):
            assert t1 < t2, f"tokens not increasing: {t1} then {t2}"
            assert e1 <= s2, f"holds of tokens {t1} and {t2} overlap"


def _hold(fence: Fence, lease: Any) -> None:
    fence.write(lease.token)
    fence.write(lease.token)
    fence.done(lease.token)


def _markers(store: ProxiedStore) -> dict[str, bytes]:
    """What identifies each operation's request on the wire."""
    if store.name == "redis":
        from turnstile.stores.redis import scripts

        # The steps run as functions (FCALL <name>) on a server that has them, as here.
        lock_scripts = scripts.load("lock")
        return {op: lock_scripts[op].function.encode() for op in ("acquire", "release", "renew")}
    return {op: f"{op}(".encode() for op in ("acquire", "release", "renew")}


@pytest.fixture
def clients(store: ProxiedStore) -> Any:
    """(the client under test, through the proxy; a client straight to the store)."""
    through = turnstile.connect(store.url)
    direct = turnstile.connect(store.direct)
    try:
        yield through, direct
    finally:
        through.close()
        direct.close()


def test_dropped_acquire_reply(store: ProxiedStore, clients: Any) -> None:
    through, direct = clients
    fence = Fence()
    store.proxy.drop_next_reply(request_marker=_markers(store)["acquire"])
    lease = through.lock("job", ttl=TTL).acquire(timeout=10, holder="a")
    assert store.proxy.drops == 1, "the acquire reply was not dropped"
    status = direct.lock("job").status()
    assert [(h.holder, h.token) for h in status.holders] == [("a", lease.token)]
    assert status.waiters == ()
    assert lease.remaining > TTL - 5
    _hold(fence, lease)
    assert lease.release()
    after = direct.lock("job", ttl=TTL).acquire(timeout=10, holder="b")
    _hold(fence, after)
    assert after.release()
    fence.check()


def test_dropped_wait_step_reply(store: ProxiedStore, clients: Any) -> None:
    """The wake-up that carries the grant to the waiter's client (Redis: a PUBLISH on its
    subscriber connection; PostgreSQL: a NOTIFY on its LISTEN connection) is lost with that
    connection, reset as it arrives."""
    through, direct = clients
    fence = Fence()
    deadline = time.monotonic() + 20
    # A client's listening connection starts with its first wait, and a join made before it
    # is up is re-checked with a step once it is: the drop below would wait for a wake-up
    # that never comes. Up first, so the grant's wake-up is the reply dropped.
    listener = through.backend.connection.listening()
    assert listener is not None
    while not listener.up:
        assert time.monotonic() < deadline, "the listening connection never came up"
        time.sleep(0.01)
        listener = through.backend.connection.listening()
    holder = direct.lock("job", ttl=TTL).acquire(timeout=10, holder="holder")
    fence.write(holder.token)
    got: dict[str, Any] = {}

    def waiter() -> None:
        try:
            with through.lock("job", ttl=TTL).acquire(timeout=30, holder="waiter") as lease:
                got["at"] = time.monotonic()
                got["remaining"] = lease.remaining
                _hold(fence, lease)
        except BaseException as exc:
            got["error"] = exc

    thread = threading.Thread(target=waiter)
    thread.start()
    while not direct.lock("job").status().waiters:
        assert time.monotonic() < deadline, "the waiter never joined the line"
        time.sleep(0.01)
    store.proxy.drop_next_reply(reply_marker=listener.channel.encode())
    fence.done(holder.token)
    released = time.monotonic()
    assert holder.release()
    thread.join(30)
    assert store.proxy.drops == 1, "the wait step's reply was not dropped"
    assert "error" not in got, repr(got.get("error"))
    # Promptly (no ttl-long stall), and with (about) its whole ttl ahead.
    assert got["at"] - released < 2.0, got["at"] - released
    assert got["remaining"] >= TTL - (got["at"] - released) - 0.5, got
    fence.check()
    status = direct.lock("job").status()
    assert status.holders == () and status.waiters == ()


def test_dropped_release_reply(store: ProxiedStore, clients: Any) -> None:
    through, direct = clients
    fence = Fence()
    other = direct.lock("job", ttl=TTL)
    with through.lock("job", ttl=TTL).acquire(timeout=10, holder="a") as lease:
        _hold(fence, lease)
        assert other.try_acquire(holder="next").position == 0
        assert other.try_acquire(holder="after").position == 1
        store.proxy.drop_next_reply(request_marker=_markers(store)["release"])
    # Leaving the block released (the store committed it, the reply was lost): no error.
    assert store.proxy.drops == 1, "the release reply was not dropped"
    status = other.status()
    assert [h.holder for h in status.holders] == ["next"]  # handed over exactly once
    assert [w.holder for w in status.waiters] == ["after"]
    newer = status.holders[0].token
    assert newer > lease.token
    # Releasing again (a caller retrying) is harmless and spares the newer holder.
    assert through.lock("job").release("a", lease.token) is False
    assert [(h.holder, h.token) for h in other.status().holders] == [("next", newer)]
    claimed = other.try_acquire(holder="next")
    assert claimed.lease is not None and claimed.lease.token == newer
    _hold(fence, claimed.lease)
    assert claimed.lease.release()
    fence.check()


def test_dropped_renew_reply(store: ProxiedStore, clients: Any) -> None:
    through, direct = clients
    fence = Fence()
    lease = through.lock("job", ttl=TTL).acquire(timeout=10, holder="a")
    fence.write(lease.token)
    before = direct.lock("job").status().holders[0].expires_at
    time.sleep(0.05)
    store.proxy.drop_next_reply(request_marker=_markers(store)["renew"])
    lease.renew()
    assert store.proxy.drops == 1, "the renew reply was not dropped"
    assert not lease.lost
    assert lease.remaining > TTL - 5
    after = direct.lock("job").status().holders
    assert [(h.holder, h.token) for h in after] == [("a", lease.token)]
    assert after[0].expires_at > before  # extended by the renewal the store ran
    fence.write(lease.token)
    fence.done(lease.token)
    assert lease.release()
    nxt = direct.lock("job", ttl=TTL).acquire(timeout=10, holder="b")
    _hold(fence, nxt)
    assert nxt.release()
    fence.check()
