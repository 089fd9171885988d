"""Callback grants (issue 16 point 1-2), on every store.

A waiter may wait with a callback instead of a connection. Its grant is written with a pending
delivery in the same atomic step as any hand-over, whoever caused it (a release, an expiry, a
raised limit, its own ask); a deliverer claims deliveries with a claim lease of its own and
settles them: delivered, refused (the grant is released and the next in line served in the
same step) or retry. These tests drive the store's delivery operations directly
(``take_deliveries`` / ``settle_delivery``) and through :class:`Deliverer` to a real HTTP
receiver; stores whose far side delivers (the HTTP service) are covered end to end in
``tests/server/test_callbacks.py``.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

import turnstile
import turnstile.aio
from turnstile import InvalidArgument
from turnstile._core import callbacks
from turnstile._core.callbacks import HttpCallback, StepFunctionsCallback
from turnstile.workflows.deliverer import Deliverer, Outcome

from .lock_harness import wait_until

LONG = 60.0  # no lease or place lapses within a test unless the test says so
SECRET = b"contract-secret"


@pytest.fixture
def local(client: turnstile.Client) -> turnstile.Client:
    if not client.characteristics.local_deliveries:
        pytest.skip("this store's far side delivers callbacks (tests/server/test_callbacks.py)")
    return client


def _take(client: turnstile.Client, lease: float = LONG, max_count: int = 100) -> list[Any]:
    return client.backend.take_deliveries(lease=lease, max_count=max_count)


def _sfn(i: int | str) -> StepFunctionsCallback:
    return StepFunctionsCallback(f"task-token-{i}-" + "x" * 40)


def test_a_release_grants_the_callback_waiter_with_a_pending_delivery(
    local: turnstile.Client,
) -> None:
    sem = local.semaphore("cb:release", 1, ttl=LONG)
    first = sem.try_acquire("a")
    assert first.acquired and first.lease is not None
    ticket = sem.try_acquire("b", callback=_sfn("b"))
    assert not ticket.acquired and ticket.position == 0
    waiter = sem.status().waiters[0]
    assert (waiter.holder, waiter.callback) == ("b", "sfn")
    assert _take(local) == []  # nothing granted yet, nothing to deliver

    assert sem.release("a", first.lease.token)
    status = sem.status()
    assert [(h.holder, h.callback, h.delivery) for h in status.holders] == [("b", "sfn", "pending")]
    grant = status.holders[0]
    assert grant.token > first.lease.token
    # Claimed for the full ttl at once: nobody else will claim it.
    assert grant.expires_at - grant.acquired_at == pytest.approx(LONG, abs=0.01)
    assert local.backend.pending_deliveries() == 1

    (delivery,) = _take(local)
    assert (delivery.name, delivery.holder, delivery.token, delivery.limit) == (
        "cb:release",
        "b",
        grant.token,
        1,
    )
    assert delivery.expires_at == pytest.approx(grant.expires_at)
    assert delivery.attempts == 1
    assert callbacks.decode(delivery.callback) == _sfn("b")
    assert "task-token" not in repr(delivery)  # a task token is a credential
    assert _take(local) == []  # claimed: not taken twice while the claim lasts

    assert local.backend.settle_delivery("cb:release", grant.token, outcome="delivered", retry_in=0)
    assert [h.delivery for h in sem.status().holders] == ["delivered"]
    assert local.backend.pending_deliveries() == 0
    # Settling twice changes nothing.
    assert not local.backend.settle_delivery(
        "cb:release", grant.token, outcome="refused", retry_in=0
    )
    assert [h.holder for h in sem.status().holders] == ["b"]
    assert sem.release("b", grant.token)
    assert sem.status().holders == ()


def test_a_free_slot_grants_at_once_and_still_delivers(local: turnstile.Client) -> None:
    sem = local.semaphore("cb:free", 2, ttl=LONG)
    ticket = sem.try_acquire("a", callback=_sfn("a"))
    assert ticket.acquired and ticket.lease is not None
    (delivery,) = _take(local)
    assert (delivery.holder, delivery.token) == ("a", ticket.lease.token)


def test_asking_again_is_harmless_and_a_new_callback_gets_the_grant_too(
    local: turnstile.Client,
) -> None:
    sem = local.semaphore("cb:again", 1, ttl=LONG)
    sem.try_acquire("a", callback=_sfn("a1"))
    (d1,) = _take(local)
    assert local.backend.settle_delivery("cb:again", d1.token, outcome="delivered", retry_in=0)
    # The same ask again (a redelivered message): no second delivery of the same grant.
    again = sem.try_acquire("a", callback=_sfn("a1"))
    assert again.acquired and again.lease is not None and again.lease.token == d1.token
    assert _take(local) == []
    # A new task token for the same holder: the grant it holds is delivered there.
    sem.try_acquire("a", callback=_sfn("a2"))
    (d2,) = _take(local)
    assert (d2.token, callbacks.decode(d2.callback)) == (d1.token, _sfn("a2"))
    # A waiter asking again keeps its place, also with a new callback.
    sem.try_acquire("b", callback=_sfn("b1"))
    sem.try_acquire("c", callback=_sfn("c1"))
    sem.try_acquire("b", callback=_sfn("b2"))
    assert [w.holder for w in sem.status().waiters] == ["b", "c"]
    assert sem.release("a", d1.token)
    (d3,) = _take(local)
    assert (d3.holder, callbacks.decode(d3.callback)) == ("b", _sfn("b2"))


def test_a_refusal_releases_the_grant_and_serves_the_next_in_line(
    local: turnstile.Client,
) -> None:
    sem = local.semaphore("cb:refused", 1, ttl=LONG)
    sem.try_acquire("gone", callback=_sfn("gone"))
    sem.try_acquire("next", callback=_sfn("next"))
    (d1,) = _take(local)
    assert d1.holder == "gone"
    assert local.backend.settle_delivery("cb:refused", d1.token, outcome="refused", retry_in=0)
    status = sem.status()
    assert [(h.holder, h.delivery) for h in status.holders] == [("next", "pending")]
    assert status.holders[0].token > d1.token
    # A release scoped by the refused grant's token is stale now: it frees nothing.
    assert not sem.release("gone", d1.token)
    (d2,) = _take(local)
    assert d2.holder == "next"


def test_a_refusal_wakes_a_blocked_waiter_behind_it(local: turnstile.Client) -> None:
    sem = local.semaphore("cb:wake", 1, ttl=LONG)
    sem.try_acquire("gone", callback=_sfn("gone"))
    got: list[turnstile.Lease] = []
    blocked = threading.Thread(
        target=lambda: got.append(sem.acquire(timeout=30, holder="blocked")), daemon=True
    )
    blocked.start()
    wait_until(lambda: [w.holder for w in sem.status().waiters] == ["blocked"], 10)
    # A take skips a name whose row a step holds locked right then (PostgreSQL: SKIP LOCKED),
    # and the waiter may still be stepping (a client's first wait looks twice).
    (d1,) = wait_until(lambda: _take(local), 10, interval=0.01)
    started = time.monotonic()
    assert local.backend.settle_delivery("cb:wake", d1.token, outcome="refused", retry_in=0)
    blocked.join(10)
    assert got and got[0].holder == "blocked" and got[0].token > d1.token
    assert time.monotonic() - started < 5  # woken by the store, not by a lease running out
    got[0].release()


def test_retry_frees_the_claim_after_the_backoff(local: turnstile.Client) -> None:
    sem = local.semaphore("cb:retry", 1, ttl=LONG)
    sem.try_acquire("a", callback=_sfn("a"))
    (d1,) = _take(local)
    backoff = 0.5
    assert local.backend.settle_delivery("cb:retry", d1.token, outcome="retry", retry_in=backoff)
    assert _take(local) == []
    (d2,) = wait_until(lambda: _take(local), backoff * 20, interval=0.05)
    assert (d2.token, d2.attempts) == (d1.token, 2)


def test_a_lapsed_claim_is_taken_again(local: turnstile.Client) -> None:
    """A deliverer killed mid-delivery holds nothing: its claim lapses."""
    sem = local.semaphore("cb:claim", 1, ttl=LONG)
    sem.try_acquire("a", callback=_sfn("a"))
    claim = 0.5
    (d1,) = _take(local, lease=claim)
    assert _take(local) == []
    (d2,) = wait_until(lambda: _take(local), claim * 20, interval=0.05)
    assert (d2.token, d2.attempts) == (d1.token, 2)


def test_an_expiry_nobody_watches_grants_the_callback_waiter(local: turnstile.Client) -> None:
    """The holder died; the only waiter has no connection to notice. The deliverer's take
    acts on the expiry."""
    ttl = 1.0
    sem = local.semaphore("cb:expiry", 1, ttl=ttl)
    dead = sem.try_acquire("dead")
    assert dead.acquired and dead.lease is not None
    sem.try_acquire("b", callback=_sfn("b"))
    assert _take(local) == []
    (d1,) = wait_until(lambda: _take(local), ttl * 20, interval=0.05)
    assert d1.holder == "b" and d1.token > dead.lease.token


def test_an_undelivered_grant_expires_like_any_lease(local: turnstile.Client) -> None:
    ttl = 1.0
    sem = local.semaphore("cb:undelivered", 1, ttl=ttl)
    sem.try_acquire("a", callback=_sfn("a"))
    sem.try_acquire("b", callback=_sfn("b"))
    (d1,) = _take(local, lease=ttl * 10)  # a deliverer took it, then hung
    # Its grant expires on time; the next in line is granted by the next take.
    (d2,) = wait_until(lambda: _take(local), ttl * 20, interval=0.05)
    assert d2.holder == "b" and d2.token > d1.token
    assert not local.backend.settle_delivery(
        "cb:undelivered", d1.token, outcome="delivered", retry_in=0
    )


def test_a_raised_limit_grants_callback_waiters(local: turnstile.Client) -> None:
    sem = local.semaphore("cb:limit", 1, ttl=LONG)
    sem.try_acquire("a")
    sem.try_acquire("b", callback=_sfn("b"))
    sem.try_acquire("c", callback=_sfn("c"))
    assert sem.set_limit(3) == 1
    assert sorted(d.holder for d in _take(local)) == ["b", "c"]


def test_callback_arguments_are_checked(client: turnstile.Client) -> None:
    sem = client.semaphore("cb:args", 1, ttl=LONG)
    cases: list[tuple[Any, str]] = [
        ("token", "callback must be"),
        (StepFunctionsCallback(""), "callback.task_token"),
        (StepFunctionsCallback("x" * 1025), "at most 1024"),
        (StepFunctionsCallback("a\nb"), "control characters"),
        (HttpCallback("ftp://example.com/x"), "http:// or https://"),
        (HttpCallback("https://user:pw@example.com/x"), "credentials"),
        (HttpCallback("http://"), "callback.url"),
    ]
    for bad, words in cases:
        with pytest.raises(InvalidArgument, match=words):
            sem.try_acquire("a", callback=bad)
    with pytest.raises(InvalidArgument, match="enqueue"):
        sem.try_acquire("a", callback=_sfn(1), enqueue=False)
    assert sem.status().holders == () and sem.status().waiters == ()
    assert "task-token" not in repr(_sfn(1))
    assert "pw" not in repr(HttpCallback("https://example.com/a?pw=1"))


# -- through the deliverer, to a real HTTP receiver -----------------------------------------


class Receiver:
    """A local HTTP endpoint that records signed deliveries and answers a chosen status."""

    def __init__(self) -> None:
        self.received: list[dict[str, Any]] = []
        self.bad_signatures = 0
        self.answer: dict[str, int] = {}  # holder -> status to answer (default 200)
        # Called with each lease before it is answered (in the server's thread).
        self.before_answer: Any = None
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                if not callbacks.verify(SECRET, body, self.headers.get(callbacks.SIGNATURE_HEADER)):
                    receiver.bad_signatures += 1
                    self.send_response(401)
                    self.end_headers()
                    return
                lease = json.loads(body)
                if receiver.before_answer is not None:
                    receiver.before_answer(lease)
                status = receiver.answer.get(lease["holder"], 200)
                if status == 200:
                    receiver.received.append(lease)
                self.send_response(status)
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                return None

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/grant"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    try:
        yield r
    finally:
        r.close()


async def test_a_delivery_released_before_it_is_settled_still_counts_as_delivered(
    aclient: turnstile.aio.AsyncClient, receiver: Receiver
) -> None:
    """The target accepted it: its holder releasing the grant before the deliverer marks it
    done (a fast workflow step) is not a lost delivery."""
    if not aclient.characteristics.local_deliveries:
        pytest.skip("the HTTP service delivers its own callbacks (tests/server)")
    sem = aclient.semaphore("cb:fast", 1, ttl=LONG)
    loop = asyncio.get_running_loop()

    def release_first(lease: dict[str, Any]) -> None:
        asyncio.run_coroutine_threadsafe(
            sem.release(lease["holder"], lease["token"]), loop
        ).result(timeout=30)

    receiver.before_answer = release_first
    async with Deliverer(aclient.backend, secret=SECRET, interval=0.02) as deliverer:
        await sem.try_acquire("quick", callback=HttpCallback(receiver.url))
        await asyncio.to_thread(
            wait_until, lambda: deliverer.stats.delivered == 1, 20, 0.01, "counted"
        )
        assert deliverer.stats.lost == 0
    assert (await sem.status()).holders == ()


async def test_the_deliverer_posts_signed_leases_in_line_order(
    aclient: turnstile.aio.AsyncClient, receiver: Receiver
) -> None:
    if not aclient.characteristics.local_deliveries:
        pytest.skip("the HTTP service delivers its own callbacks (tests/server)")
    sem = aclient.semaphore("cb:http", 2, ttl=LONG)
    receiver.answer["refuses"] = 410
    async with Deliverer(aclient.backend, secret=SECRET, interval=0.02) as deliverer:
        for i in range(6):
            holder = "refuses" if i == 1 else f"h{i}"
            await sem.try_acquire(holder, callback=HttpCallback(receiver.url))
        await asyncio.to_thread(
            wait_until, lambda: len(receiver.received) == 2, 20, 0.01, "first two delivered"
        )
        # h0 holds and was delivered; "refuses" answered 410: released, h2 granted instead.
        # Deliveries are posted concurrently, so h2's post may arrive before h0's (h0's was
        # slower than the 410, the release and the next round): line order is in the grants,
        # whose fencing tokens increase in grant order.
        by_token = sorted(receiver.received, key=lambda r: r["token"])
        assert [r["holder"] for r in by_token] == ["h0", "h2"]
        for lease in list(receiver.received):
            assert set(lease) == {"name", "holder", "token", "expires_at", "limit"}
            assert lease["name"] == "cb:http" and lease["limit"] == 2
            assert await sem.release(lease["holder"], lease["token"])
        await asyncio.to_thread(
            wait_until, lambda: len(receiver.received) == 4, 20, 0.01, "next two delivered"
        )
        # Granted in line order (tokens say the order of grants; deliveries of one round
        # travel concurrently, so they may arrive in any order).
        by_token = sorted(receiver.received, key=lambda r: r["token"])
        assert [r["holder"] for r in by_token] == ["h0", "h2", "h3", "h4"]
        assert len({r["token"] for r in by_token}) == 4
        # Counted once settled, just after the receiver answered.
        await asyncio.to_thread(
            wait_until, lambda: deliverer.stats.delivered == 4, 20, 0.01, "four settled"
        )
        assert deliverer.stats.refused == 1
        assert receiver.bad_signatures == 0


async def test_a_failing_endpoint_is_retried_until_it_answers(
    aclient: turnstile.aio.AsyncClient, receiver: Receiver
) -> None:
    if not aclient.characteristics.local_deliveries:
        pytest.skip("the HTTP service delivers its own callbacks (tests/server)")
    sem = aclient.semaphore("cb:flaky", 1, ttl=LONG)
    receiver.answer["a"] = 503
    async with Deliverer(aclient.backend, secret=SECRET, interval=0.02) as deliverer:
        await sem.try_acquire("a", callback=HttpCallback(receiver.url))
        await asyncio.to_thread(
            wait_until, lambda: deliverer.stats.retried >= 2, 20, 0.01, "two retries"
        )
        assert receiver.received == []
        del receiver.answer["a"]
        await asyncio.to_thread(wait_until, lambda: receiver.received, 20, 0.01, "delivered")
    status = await sem.status()
    assert [(h.holder, h.delivery) for h in status.holders] == [("a", "delivered")]


async def test_a_deliverer_with_a_failing_sender_settles_nothing_wrongly(
    aclient: turnstile.aio.AsyncClient,
) -> None:
    """A send that raises (a bug, a dead network library) must not lose the delivery."""
    if not aclient.characteristics.local_deliveries:
        pytest.skip("the HTTP service delivers its own callbacks (tests/server)")
    sem = aclient.semaphore("cb:sender", 1, ttl=LONG)
    calls: list[str] = []

    def sender(delivery: Any, callback: Any, body: bytes) -> Outcome:
        calls.append(delivery.holder)
        return Outcome("retry", "down")

    deliverer = Deliverer(aclient.backend, sender=sender, interval=0.02)
    await sem.try_acquire("a", callback=_sfn("a"))
    assert await deliverer.round() == 1
    assert calls == ["a"]
    status = await sem.status()
    assert [(h.holder, h.delivery) for h in status.holders] == [("a", "pending")]
