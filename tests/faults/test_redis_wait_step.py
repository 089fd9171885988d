"""Issue 17.2: one dropped reply never throws a grant away (Redis).

A blocked waiter sends ``BLPOP`` on its own wake-up list; the holder's release pushes the
grant to it. If the reply to that BLPOP is lost (the connection is reset), the wake-up and
the grant in it are gone from the list: the waiter must still start on that lease with
(about) its whole ttl ahead, without sending the BLPOP again (it would block on the empty
list while the unclaimed grant runs out). Before the fix redis-py sent the blocking command
again, and the lease was handed over with less than a third of its ttl left, then declared
lost before its first renewal.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

import turnstile

from .conftest import ProxiedStore

pytestmark = [pytest.mark.redis, pytest.mark.slow]

TTL = 3.0  # the waiter's wait_ttl is min(ttl, 5 s), so each of its BLPOPs blocks ttl/3 = 1 s


def test_dropped_reply_to_the_wait_step_keeps_the_grant(
    redis_store: ProxiedStore,
) -> None:
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
                    time.sleep(TTL * 0.9)  # across two renewals (every ttl/3)
                    got["lost"] = lease.lost
            except BaseException as exc:
                got["error"] = exc

        seen = proxy.request_count(b"BLPOP")
        thread = threading.Thread(target=waiter)
        thread.start()
        # A BLPOP that has just started blocking (for 1 s): well inside it, lose the reply
        # that the release's wake-up produces (the grant BLPOP pops).
        assert proxy.wait_request(b"BLPOP", seen, 20), "the waiter never blocked"
        seen = proxy.request_count(b"BLPOP")
        assert proxy.wait_request(b"BLPOP", seen, 5), "the waiter never blocked again"
        time.sleep(0.3)
        blpops = proxy.request_count(b"BLPOP")
        proxy.drop_next_reply(request_marker=b"BLPOP")
        released = time.monotonic()
        assert holder.release()
        thread.join(30)
        assert proxy.drops == 1, "the reply to the wait step was not dropped"
        # The lost BLPOP was not sent again (it would block on the list its wake-up left).
        assert proxy.request_count(b"BLPOP") == blpops, "the blocking command was retried"
        assert "error" not in got, repr(got.get("error"))
        assert got["token"] > holder.token
        # Handed over with (about) its whole ttl: at most the time since the release is gone.
        assert got["remaining"] >= TTL - (got["at"] - released) - 0.1, got
        assert not got["lost"]
        status = direct.lock("job").status()
        assert status.holders == () and status.waiters == ()
    finally:
        through.close()
        direct.close()


def test_a_wait_step_answer_that_arrives_late_is_asked_again(redis_store: ProxiedStore) -> None:
    """A wake-up carries no send time of its own: the waiter counts the handed lease from
    the step that put it in line, which may be a while before the wake-up. When the BLPOP's
    answer also arrives late, the handed lease would look nearly over; the waiter claims it
    with a step instead (per holder the same grant) and starts with the real remaining
    time, as the store's clock tells it."""
    ttl = 6.0  # each BLPOP blocks wait_ttl/3 = 5/3 s
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

        seen = proxy.request_count(b"BLPOP")
        thread = threading.Thread(target=waiter)
        thread.start()
        assert proxy.wait_request(b"BLPOP", seen, 20), "the waiter never blocked"
        seen = proxy.request_count(b"BLPOP")
        assert proxy.wait_request(b"BLPOP", seen, 5), "the waiter never blocked again"
        time.sleep(1.0)  # a second into its BLPOP, then an answer 2.5 s slow:
        proxy.delay_next_reply(2.5, request_marker=b"BLPOP")  # it would look 2.5 s from over
        released = time.monotonic()
        assert holder.release()
        thread.join(30)
        assert proxy.drops == 1, "the reply to the wait step was not delayed"
        assert "error" not in got, repr(got.get("error"))
        assert got["token"] > holder.token
        assert got["remaining"] >= ttl - (got["at"] - released) - 0.4, got
    finally:
        through.close()
        direct.close()
