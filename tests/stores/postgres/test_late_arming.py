"""A lock waiter arms after its first step (``keeps_early_wakeups``): an uncontended acquire
arms nothing and opens no LISTEN connection; a wake-up that reaches the LISTEN connection
before its waiter registers is kept and delivered on registration; and a waiter whose step
the LISTEN connection may not have heard (not up yet, reconnected since, an early wake-up
evicted) re-checks at once."""

from __future__ import annotations

from typing import Any

import pytest

import turnstile
from turnstile._sync.backends import postgres_listen
from turnstile._sync.backends.postgres_listen import ARMED_FIRST, PostgresWaiter
from turnstile.stores.postgres import sql as pg

from ._util import wait_for

pytestmark = pytest.mark.postgres


def _listening(client: turnstile.Client) -> Any:
    listener = client.backend.listener  # type: ignore[attr-defined]
    listener.connect(10.0)
    wait_for(lambda: listener.up, "the LISTEN connection never came up")
    return listener


def test_an_uncontended_acquire_opens_no_listen_connection(pg_url: str) -> None:
    client = turnstile.connect(pg_url)
    try:
        backend: Any = client.backend
        lock = client.lock("quiet", ttl=30)
        before = backend.statements
        with lock.acquire(timeout=5):
            pass
        assert backend.statements - before == 2  # one acquire, one release
        assert not backend.listener.started
        assert len(backend._marks) == 0
    finally:
        client.close()


def test_a_wakeup_before_the_waiter_registers_is_kept(pg_url: str) -> None:
    client = turnstile.connect(pg_url)
    try:
        listener = _listening(client)
        mark = listener.mark()
        assert mark is not None
        key = pg.wake_key("early", "w1")
        listener._dispatch(f"{key} 7 123 1000.5 1005.5")  # the hand-over came first
        waiter = PostgresWaiter(listener, key, "early", "w1", mark)
        try:
            assert waiter.wait(0.0)  # woken on arming, and no re-check was needed
            grant = waiter.handed(7)
            assert grant is not None and (grant.holder, grant.token) == ("w1", 123)
            assert listener._early == {}
        finally:
            waiter.close()
        # Armed at the same epoch with nothing kept: it waits.
        other = PostgresWaiter(listener, pg.wake_key("early", "w2"), "early", "w2", mark)
        try:
            assert not other.wait(0.05)
        finally:
            other.close()
    finally:
        client.close()


class _Quiet:
    def deliver(self, grant: str) -> None:
        pass


def test_a_waiter_re_checks_when_a_wakeup_may_be_missing(pg_url: str) -> None:
    client = turnstile.connect(pg_url)
    try:
        listener = _listening(client)
        key = pg.wake_key("missing", "w")
        assert not listener.register(key, _Quiet(), ARMED_FIRST)
        mark = listener.mark()
        assert not listener.register(key, _Quiet(), mark)
        assert listener.register(key, _Quiet(), None)
        # An early wake-up evicted unclaimed moves the epoch on: who stepped before re-checks.
        for i in range(postgres_listen.EARLY_MAX + 1):
            listener._dispatch(f"{pg.wake_key('evicted', str(i))} ")
        assert len(listener._early) == postgres_listen.EARLY_MAX
        assert listener.register(key, _Quiet(), mark)
    finally:
        client.close()


def test_the_first_wait_of_a_client_re_checks_once(pg_url: str) -> None:
    """The step that put a fresh client in line named no channel (it was not listening):
    its waiter looks again at once, with the channel, and is then woken by the hand-over."""
    holder = turnstile.connect(pg_url)
    waiter = turnstile.connect(pg_url)
    try:
        backend: Any = waiter.backend
        first = holder.lock("first-wait", ttl=30).acquire()
        joined = backend.acquire("first-wait", "w", limit=1, ttl=30.0, wait_ttl=5.0, enqueue=True)
        assert joined.grant is None and joined.wait_id is not None
        assert not backend.listener.started
        w = backend.open_waiter("first-wait", "w")
        try:
            assert backend.listener.up
            assert w.wait(5.0)  # at once: the step named no channel
            again = backend.acquire(
                "first-wait", "w", limit=1, ttl=30.0, wait_ttl=5.0, enqueue=True
            )
            assert again.grant is None
            assert first.release()
            assert w.wait(5.0)
            assert w.handed(again.wait_id) is not None  # the NOTIFY carried the grant
        finally:
            w.close()
            backend.release("first-wait", "w", None)
    finally:
        holder.close()
        waiter.close()


def test_a_reconnect_between_step_and_arming_makes_the_waiter_re_check(pg_url: str) -> None:
    holder = turnstile.connect(pg_url)
    waiter = turnstile.connect(pg_url)
    try:
        backend: Any = waiter.backend
        listener = _listening(waiter)
        first = holder.lock("reconnect", ttl=30).acquire()
        joined = backend.acquire("reconnect", "w", limit=1, ttl=30.0, wait_ttl=5.0, enqueue=True)
        assert joined.grant is None
        with listener._lock:
            listener._epoch += 1  # as a drop and a reconnect would
        w = backend.open_waiter("reconnect", "w")
        try:
            assert w.wait(0.0)
        finally:
            w.close()
            backend.release("reconnect", "w", None)
            first.release()
        # Armed first (no note of a step, as Lock.wait does): nothing to re-check.
        w = backend.open_waiter("reconnect", "w2")
        try:
            assert not w.wait(0.05)
        finally:
            w.close()
    finally:
        holder.close()
        waiter.close()
