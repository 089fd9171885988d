"""Issue 17.2: one dropped reply never throws a grant away (Redis).

A blocked waiter is woken by its client's subscriber connection: the holder's release
PUBLISHes the grant on that client's channel. If that message is lost (the connection is
reset), the waiter must still start on that lease with (about) its whole ttl ahead, and at
once: the subscriber connection's loss wakes every waiter of the client to look again with
a step, which claims the grant already made (per holder, the same grant). A wake-up that
arrives late must not start a lease that is nearly over either.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

import turnstile

from .conftest import ProxiedStore

pytestmark = [pytest.mark.redis, pytest.mark.slow]

TTL = 9.0  # the waiter's wait_ttl is min(ttl, 5 s): it steps every 5/3 s while it waits


def _in_line(direct: turnstile.Client, through: turnstile.Client) -> bool:
    listener = through.backend.connection.listener  # type: ignore[attr-defined]
    return listener.up and [w.holder for w in direct.lock("job").status().waiters] == ["waiter"]


def test_a_dropped_wake_up_still_hands_over_at_once(redis_store: ProxiedStore) -> None:
    proxy = redis_store.proxy
    direct = turnstile.connect(redis_store.direct)
    through = turnstile.connect(redis_store.url)
    got: dict[str, Any] = {}
    try:
        holder = direct.lock("job", ttl=60).acquire(holder="holder")

        def waiter() -> None:
            try:
                with through.lock("job", ttl=TTL).acquire(timeout=30, holder="waiter") as lease:
                    got["at"] = time.monotonic()
                    got["remaining"] = lease.remaining
                    got["token"] = lease.token
                    time.sleep(TTL * 0.4)  # across a renewal (every ttl/3)
                    got["lost"] = lease.lost
            except BaseException as exc:
                got["error"] = exc

        thread = threading.Thread(target=waiter)
        thread.start()
        deadline = time.monotonic() + 20
        while not _in_line(direct, through):
            assert time.monotonic() < deadline, "the waiter never got in line"
            time.sleep(0.01)
        listener = through.backend.connection.listener  # type: ignore[attr-defined]
        connects = listener.connects
        # The wake-up the release publishes dies with the subscriber connection.
        proxy.drop_next_reply(reply_marker=listener.channel.encode())
        released = time.monotonic()
        assert holder.release()
        thread.join(30)
        assert proxy.drops == 1, "the wake-up was not dropped"
        assert "error" not in got, repr(got.get("error"))
        assert got["token"] > holder.token
        # Not left to the waiter's next heartbeat step: the lost connection woke it.
        assert got["at"] - released < 1.0, got
        # Handed over with (about) its whole ttl: at most the time since the release is gone.
        assert got["remaining"] >= TTL - (got["at"] - released) - 0.1, got
        assert not got["lost"]
        assert listener.connects == connects  # made again by the client's next wait only
        status = direct.lock("job").status()
        assert status.holders == () and status.waiters == ()
    finally:
        through.close()
        direct.close()


def test_a_wake_up_that_arrives_late_is_not_taken_as_a_fresh_lease(
    redis_store: ProxiedStore,
) -> None:
    """A wake-up carries no send time of its own: the waiter counts the handed lease from
    the step that put it in line, which may be a while before the wake-up. When the wake-up
    also arrives late, the handed lease would look nearly over; the waiter claims it with a
    step instead (per holder the same grant) and starts with the real remaining time, as
    the store's clock tells it."""
    ttl = 6.0
    proxy = redis_store.proxy
    direct = turnstile.connect(redis_store.direct)
    through = turnstile.connect(redis_store.url)
    got: dict[str, Any] = {}
    try:
        holder = direct.lock("job", ttl=60).acquire(holder="holder")

        def waiter() -> None:
            try:
                lease = through.lock("job", ttl=ttl).acquire(timeout=30, holder="waiter")
                got["at"] = time.monotonic()
                got["remaining"] = lease.remaining
                got["token"] = lease.token
                lease.release()
            except BaseException as exc:
                got["error"] = exc

        thread = threading.Thread(target=waiter)
        thread.start()
        deadline = time.monotonic() + 20
        while not _in_line(direct, through):
            assert time.monotonic() < deadline, "the waiter never got in line"
            time.sleep(0.01)
        listener = through.backend.connection.listener  # type: ignore[attr-defined]
        time.sleep(1.0)  # a second after its step, then a wake-up 2.5 s slow:
        proxy.delay_next_reply(2.5, reply_marker=listener.channel.encode())
        released = time.monotonic()
        assert holder.release()
        thread.join(30)
        assert proxy.drops == 1, "the wake-up was not delayed"
        assert "error" not in got, repr(got.get("error"))
        assert got["token"] > holder.token
        assert got["remaining"] >= ttl - (got["at"] - released) - 0.4, got
    finally:
        through.close()
        direct.close()
