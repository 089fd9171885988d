"""Rate limits that wait in line (issue 15 point 1), on every store.

The guarantee checked from the store's own admission times (``status().admitted``): at most
``burst`` at once from idle and at most ``rate + burst`` in any window of ``per`` seconds.
Callers are admitted in arrival order, each at its slot; a waiter that stops asking loses its
place ``grace`` after its slot. Safety assertions never depend on scheduling; timing only
enters through slots the store computed.
"""

from __future__ import annotations

import threading
import time

import pytest

import turnstile
from turnstile import AcquireTimeout, InvalidArgument, LimitConflict
from turnstile._core.rate_machine import max_in_window

from .lock_harness import wait_until


def test_a_burst_at_once_from_idle_then_one_slot_per_interval(client: turnstile.Client) -> None:
    limiter = client.rate_limit("rate:burst", rate=10, per=1.0, burst=3)
    tickets = [limiter.try_acquire(f"h{i}") for i in range(6)]
    assert [t.acquired for t in tickets] == [True, True, True, False, False, False]
    assert [t.position for t in tickets[3:]] == [0, 1, 2]
    # Slots (on the store's clock: the answer's `now` + `retry_after`) one emission
    # interval (per / rate = 0.1 s) apart, in line order, however slow the calls were.
    slots = [t.now + t.retry_after for t in tickets[3:]]
    assert slots[1] - slots[0] == pytest.approx(0.1, abs=1e-4)
    assert slots[2] - slots[1] == pytest.approx(0.1, abs=1e-4)
    status = limiter.status()
    assert (status.rate, status.per, status.burst) == (10, 1.0, 3)
    assert [w.holder for w in status.waiters] == ["h3", "h4", "h5"]
    assert len(status.admitted) == 3


def test_asking_again_keeps_the_place_and_the_head_is_admitted_at_its_slot(
    client: turnstile.Client,
) -> None:
    limiter = client.rate_limit("rate:again", rate=5, per=1.0, burst=1)
    assert limiter.try_acquire("first").acquired
    second = limiter.try_acquire("second")
    third = limiter.try_acquire("third")
    assert (second.position, third.position) == (0, 1)
    assert limiter.try_acquire("second").position == 0  # idempotent
    # The third asks at its own slot while the head has not come back: it keeps waiting
    # (the order is kept), and the head is admitted when it asks.
    time.sleep(third.retry_after + 0.05)
    early = limiter.try_acquire("third")
    assert not early.acquired and early.position == 1
    assert limiter.try_acquire("second").acquired
    then = limiter.try_acquire("third")
    if not then.acquired:
        time.sleep(then.retry_after + 0.05)
        assert limiter.try_acquire("third").acquired


def test_a_waiter_that_stops_asking_loses_its_place(client: turnstile.Client) -> None:
    limiter = client.rate_limit("rate:dead", rate=10, per=1.0, burst=1)
    assert limiter.try_acquire("a").acquired
    dead = limiter.try_acquire("dead", wait_ttl=0.3)  # its place lasts 0.3 s past its slot
    alive = limiter.try_acquire("alive", wait_ttl=30)
    assert (dead.position, alive.position) == (0, 1)
    wait_until(
        lambda: [w.holder for w in limiter.status().waiters] == ["alive"],
        10,
        what="the dead waiter's place lapses",
    )
    ticket = limiter.try_acquire("alive")
    if not ticket.acquired:
        time.sleep(ticket.retry_after + 0.05)
        assert limiter.try_acquire("alive").acquired


def test_blocking_callers_never_exceed_the_rate_and_go_in_arrival_order(
    client: turnstile.Client,
) -> None:
    rate, per, burst = 20, 1.0, 4
    limiter = client.rate_limit("rate:blocking", rate=rate, per=per, burst=burst)
    admitted: dict[int, float] = {}
    threads = []
    for i in range(24):
        t = threading.Thread(
            target=lambda i=i: admitted.__setitem__(
                i, limiter.acquire(timeout=30, holder=f"w{i:02d}")
            )
        )
        t.start()
        threads.append(t)
        # The next one arrives only once this one is admitted or in line: order is known.
        wait_until(
            lambda i=i: (
                i in admitted or f"w{i:02d}" in [w.holder for w in limiter.status().waiters]
            ),
            10,
            0.002,
        )
    for t in threads:
        t.join(30)
    assert len(admitted) == 24
    times = [admitted[i] for i in range(24)]
    assert times == sorted(times), "admitted out of arrival order"
    # The store's own record of admissions: the guarantee, whatever the scheduling.
    recent = list(limiter.status().admitted)
    assert len(recent) >= 24 - rate  # the last `per` seconds' worth at least
    assert max_in_window(times, per) <= rate + burst
    assert max_in_window(times, 1e-9) <= burst


def test_a_timeout_shorter_than_the_slot_fails_at_once_and_leaves_the_line(
    client: turnstile.Client,
) -> None:
    limiter = client.rate_limit("rate:timeout", rate=1, per=60.0, burst=1)
    assert limiter.try_acquire("first").acquired
    started = time.monotonic()
    with pytest.raises(AcquireTimeout, match="past the timeout"):
        limiter.acquire(timeout=1.0, holder="impatient")
    assert time.monotonic() - started < 5  # did not sleep out the minute
    assert limiter.status().waiters == ()


class _InterruptedAfterTheStore:
    """The store placed the caller in line, then a signal (here KeyboardInterrupt) landed
    before the answer reached the caller."""

    def __init__(self, backend: object) -> None:
        self._backend = backend

    def rate_acquire(self, *args: object, **kwargs: object) -> object:
        self._backend.rate_acquire(*args, **kwargs)  # type: ignore[attr-defined]
        raise KeyboardInterrupt

    def __getattr__(self, name: str) -> object:
        return getattr(self._backend, name)


def test_an_interrupt_after_the_store_placed_the_caller_leaves_the_line(
    client: turnstile.Client,
) -> None:
    limiter = client.rate_limit("rate:interrupted", rate=1, per=60.0, burst=1)
    assert limiter.try_acquire("first").acquired
    limiter._backend = _InterruptedAfterTheStore(limiter._backend)  # type: ignore[assignment]
    with pytest.raises(KeyboardInterrupt):
        limiter.acquire(timeout=120, holder="interrupted")
    assert limiter.status().waiters == ()


def test_a_busy_name_has_one_rate(client: turnstile.Client) -> None:
    client.rate_limit("rate:one", rate=5, per=1.0).try_acquire("a")
    client.rate_limit("rate:one", rate=5, per=1.0).try_acquire("b")  # now someone waits
    with pytest.raises(LimitConflict, match="rate=5 per=1 burst=1"):
        client.rate_limit("rate:one", rate=50, per=1.0).try_acquire("c")


@pytest.mark.parametrize(
    ("kwargs", "words"),
    [
        ({"rate": 0}, "rate must be between 1"),
        ({"rate": 10**9}, "rate must be between 1"),
        ({"rate": 1.5}, "rate must be an integer"),
        ({"rate": 1, "per": 0}, "per must be"),
        ({"rate": 1, "per": float("nan")}, "per must be"),
        ({"rate": 1, "burst": 0}, "burst must be between 1"),
        ({"rate": True}, "rate must be an integer"),
    ],
)
def test_bad_arguments_are_named(
    client: turnstile.Client, kwargs: dict[str, object], words: str
) -> None:
    with pytest.raises(InvalidArgument, match=words):
        client.rate_limit("rate:bad", **kwargs)  # type: ignore[arg-type]
