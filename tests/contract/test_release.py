"""SPEC guarantee 5 (scoped, idempotent release and renew): release and renew name holder and
token; a stale holder never releases or renews a newer grant; releasing twice is harmless."""

from __future__ import annotations

import time

import pytest

import turnstile

from .lock_harness import LONG_TTL, Spawner


def test_double_release_is_harmless(client: turnstile.Client) -> None:
    lock = client.lock("rel:double", ttl=LONG_TTL)
    lease = lock.acquire(timeout=5, holder="h")
    assert lease.release() is True
    assert lease.release() is False
    with lock.acquire(timeout=5, holder="other") as other:
        assert lease.release() is False
        assert lock.release("h") is False
        assert lock.release("h", lease.token) is False
        assert [(h.holder, h.token) for h in lock.status().holders] == [("other", other.token)]


def test_stale_token_never_releases_a_newer_grant(
    client: turnstile.Client, workers: Spawner
) -> None:
    """The same holder id, granted again: its old token releases nothing — in this process
    or from another one."""
    name = "rel:stale"
    lock = client.lock(name, ttl=LONG_TTL)
    old = lock.acquire(timeout=5, holder="h")
    assert old.release()
    new = lock.acquire(timeout=5, holder="h")
    assert new.token > old.token
    assert lock.release("h", old.token) is False
    assert old.release() is False
    w = workers.spawn("release", name=name, limit=1, ttl=LONG_TTL, holder="h", token=old.token)
    assert w.wait_for("released")["result"] is False
    w.join()
    assert [(h.holder, h.token) for h in lock.status().holders] == [("h", new.token)]
    with pytest.raises(turnstile.LeaseLost):
        old.renew()
    new.renew()  # the current lease is untouched and still renewable
    assert lock.release("h", new.token) is True
    assert lock.status().holders == ()


def test_expired_lease_releases_nothing(client: turnstile.Client) -> None:
    lock = client.lock("rel:expired", ttl=0.2)
    stale = lock.acquire(timeout=5, holder="a")
    time.sleep(0.3)
    newer = client.lock("rel:expired", ttl=LONG_TTL).acquire(timeout=5, holder="b")
    assert stale.release() is False
    assert lock.release("a", stale.token) is False
    assert [(h.holder, h.token) for h in lock.status().holders] == [("b", newer.token)]
    assert newer.release()


def test_release_of_unknown_holder_is_harmless(client: turnstile.Client) -> None:
    sem = client.semaphore("rel:unknown", 2, ttl=LONG_TTL)
    assert sem.release("nobody") is False
    assert sem.release("nobody", 12345) is False
    with sem.acquire(timeout=5, holder="a") as a:
        assert sem.release("nobody") is False
        assert sem.release("a", a.token + 1) is False
        assert [h.holder for h in sem.status().holders] == ["a"]


def test_renew_of_released_or_lost_lease_raises(client: turnstile.Client) -> None:
    lock = client.lock("rel:renew", ttl=0.2)
    lease = lock.acquire(timeout=5)
    lease.release()
    with pytest.raises(turnstile.LeaseLost):
        lease.renew()
    lost = lock.acquire(timeout=5)
    time.sleep(0.3)
    with pytest.raises(turnstile.LeaseLost):
        lost.renew()
    assert lost.lost


def test_release_by_holder_from_another_process(client: turnstile.Client, workers: Spawner) -> None:
    name = "rel:remote"
    lock = client.lock(name, ttl=LONG_TTL)
    lease = lock.acquire(timeout=5, holder="exec-1")
    w = workers.spawn("release", name=name, limit=1, ttl=LONG_TTL, holder="exec-1")
    assert w.wait_for("released")["result"] is True
    w.join()
    assert lock.status().holders == ()
    assert lease.release() is False  # already released by the other process
    with pytest.raises(turnstile.LeaseLost):
        lease.renew()
