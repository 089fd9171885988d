"""A name has one limit (issue 17 point 3), on every store.

While a name has holders or waiters its limit is part of its state: an acquire, a
try_acquire or a blocking acquire by a newcomer naming another limit is refused with
``InvalidArgument`` (naming the name, its limit and the ways to change it), and only
``set_limit`` changes it: a raised limit grants waiters at once in line order, a lowered one
revokes nothing. An idle name keeps no state, so the next caller's limit becomes its limit.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

import turnstile
import turnstile.aio
from turnstile import InvalidArgument
from turnstile._core.validate import MAX_LIMIT

from .lock_harness import check_exclusive, max_concurrency, wait_until

LONG = 30.0  # no lease or place in line lapses within a test


def _holders(sem: turnstile.Semaphore) -> list[str]:
    return [h.holder for h in sem.status().holders]


def _waiters(sem: turnstile.Semaphore) -> list[str]:
    return [w.holder for w in sem.status().waiters]


def _assert_refusal(exc: pytest.ExceptionInfo[InvalidArgument], name: str, current: int) -> None:
    assert isinstance(exc.value, turnstile.LimitConflict)  # an InvalidArgument, by state
    message = str(exc.value)
    assert repr(name) in message
    assert f"has limit {current}" in message
    assert exc.value.current == current  # what the caller needs to decide, as data too
    assert exc.value.asked is not None and exc.value.asked != current
    # the three ways to change it
    for way in ("set_limit(", "POST /v1/semaphores/limit", "turnstile limit NAME"):
        assert way in message, message


def test_a_newcomer_naming_another_limit_is_refused(client: turnstile.Client) -> None:
    name = "limit:conflict"
    lock = client.lock(name, ttl=LONG)
    held = lock.acquire(timeout=5, holder="owner")
    wide = client.semaphore(name, 3, ttl=LONG)
    with pytest.raises(InvalidArgument) as refused:
        wide.acquire_nowait(holder="intruder")
    _assert_refusal(refused, name, 1)
    with pytest.raises(InvalidArgument) as refused:
        wide.try_acquire("intruder")
    _assert_refusal(refused, name, 1)
    with pytest.raises(InvalidArgument) as refused:
        wide.acquire(timeout=2, holder="intruder")
    _assert_refusal(refused, name, 1)
    # nothing was granted or queued for the refused caller
    assert _holders(wide) == ["owner"] and _waiters(wide) == []
    assert wide.status().limit == 1

    # still refused while the name only has waiters (a ticket keeps the line busy)
    narrow = client.semaphore(name, 1, ttl=LONG)
    assert narrow.try_acquire("queued", LONG).position == 0
    assert held.release()
    assert narrow.try_acquire("queued", LONG).acquired
    assert narrow.try_acquire("second", LONG).position == 0
    with pytest.raises(InvalidArgument):
        wide.try_acquire("intruder")
    assert _holders(narrow) == ["queued"] and _waiters(narrow) == ["second"]
    narrow.release("queued")
    narrow.release("second")
    assert narrow.status().holders == () and narrow.status().waiters == ()


def test_an_idle_name_takes_the_new_callers_limit(client: turnstile.Client) -> None:
    name = "limit:idle"
    one = client.semaphore(name, 1, ttl=LONG)
    first = one.acquire(timeout=5)
    assert first.release()
    three = client.semaphore(name, 3, ttl=LONG)
    leases = [three.acquire(timeout=5, holder=f"h{i}") for i in range(3)]
    st = three.status()
    assert st.limit == 3 and len(st.holders) == 3
    # now the name is busy under 3: a limit-1 caller is the newcomer refused
    with pytest.raises(InvalidArgument):
        one.acquire_nowait(holder="late")
    for lease in leases:
        assert lease.release()
    # idle again: the limit-1 caller's limit applies
    again = one.acquire_nowait(holder="late")
    assert one.status().limit == 1
    assert again.release()


def test_raising_the_limit_grants_waiters_at_once_in_line_order(
    client: turnstile.Client,
) -> None:
    name = "limit:raise"
    sem = client.semaphore(name, 1, ttl=LONG)
    boss = sem.acquire(timeout=5, holder="boss")
    assert [sem.try_acquire(h, LONG).position for h in ("a", "b", "c", "d")] == [0, 1, 2, 3]
    admin = client.semaphore(name, 3, ttl=LONG)
    assert admin.set_limit(3) == 1
    assert admin.limit == 3
    st = sem.status()
    assert st.limit == 3
    # the two freed slots went to the front of the line, in order (tokens increase)
    assert [h.holder for h in st.holders] == ["boss", "a", "b"]
    assert [w.holder for w in st.waiters] == ["c", "d"]
    # the granted waiters claim their grants; the others keep their places
    assert sem.try_acquire("a", LONG).acquired and sem.try_acquire("b", LONG).acquired
    assert [sem.try_acquire(h, LONG).position for h in ("c", "d")] == [0, 1]
    # an asker with the name's new limit is a newcomer like any other: it joins the line
    assert admin.try_acquire("e", LONG).position == 2
    for h in ("boss", "a", "b", "c", "d", "e"):
        sem.release(h)
    assert boss.release() is False  # released by holder above


def test_raising_the_limit_grants_a_blocked_waiter(client: turnstile.Client) -> None:
    name = "limit:wake"
    sem = client.semaphore(name, 1, ttl=LONG)
    boss = sem.acquire(timeout=5, holder="boss")
    got: list[Any] = []

    def wait_in_line() -> None:
        try:
            got.append(sem.acquire(timeout=20, holder="blocked"))
        except Exception as exc:  # reported below
            got.append(exc)

    thread = threading.Thread(target=wait_in_line)
    thread.start()
    try:
        wait_until(lambda: _waiters(sem) == ["blocked"], 10, what="the waiter in line")
        assert sem.set_limit(2) == 1
        thread.join(20)
        assert not thread.is_alive()
        assert len(got) == 1 and isinstance(got[0], turnstile.Lease), got
        assert _holders(sem) == ["boss", "blocked"]
        assert got[0].release()
    finally:
        thread.join(25)
        boss.release()


def test_lowering_the_limit_never_revokes_a_lease(client: turnstile.Client) -> None:
    name = "limit:lower"
    sem = client.semaphore(name, 3, ttl=LONG)
    leases = [sem.acquire(timeout=5, holder=f"h{i}") for i in range(3)]
    waiting = client.semaphore(name, 3, ttl=LONG)
    assert waiting.try_acquire("w", LONG).position == 0
    admin = client.semaphore(name, 1, ttl=LONG)
    assert admin.set_limit(1) == 3
    st = sem.status()
    assert st.limit == 1 and len(st.holders) == 3 and [w.holder for w in st.waiters] == ["w"]
    for lease in leases:
        lease.renew()  # every lease still held (LeaseLost otherwise)
    # the waiter, asking with its old limit, keeps its place: it is not a newcomer
    assert waiting.try_acquire("w", LONG).position == 0
    # nobody is granted until fewer than the new limit (1) hold
    assert leases[0].release()
    assert waiting.try_acquire("w", LONG).position == 0
    assert leases[1].release()
    assert waiting.try_acquire("w", LONG).position == 0
    assert leases[2].release()
    ticket = waiting.try_acquire("w", LONG)
    assert ticket.acquired and ticket.lease is not None
    assert sem.status().limit == 1
    assert ticket.lease.release()


def test_set_limit_on_an_idle_name_changes_nothing_but_the_object(
    client: turnstile.Client,
) -> None:
    sem = client.semaphore("limit:idle-set", 2, ttl=LONG)
    assert sem.set_limit(5) is None
    assert sem.limit == 5
    assert sem.status().limit == 5  # an idle name shows the asking object's limit
    leases = [sem.acquire_nowait(holder=f"h{i}") for i in range(5)]
    assert sem.status().limit == 5
    for lease in leases:
        assert lease.release()


def test_set_limit_validates_its_argument(client: turnstile.Client) -> None:
    sem = client.semaphore("limit:validate", 2, ttl=LONG)
    for bad in (0, -1, MAX_LIMIT + 1):
        with pytest.raises(InvalidArgument, match=rf"limit must be between 1 and {MAX_LIMIT}"):
            sem.set_limit(bad)
    for wrong in (True, 1.5, "2", None):
        with pytest.raises(InvalidArgument, match="limit must be an integer"):
            sem.set_limit(wrong)  # type: ignore[arg-type]
    assert sem.limit == 2
    lock = client.lock("limit:validate", ttl=LONG)
    with pytest.raises(InvalidArgument, match="a Lock always has limit 1"):
        lock.set_limit(2)


def test_a_lock_and_a_semaphore_sharing_a_name_never_overlap(client: turnstile.Client) -> None:
    """Threads of a lock and of a limit-3 semaphore on one name by mistake: whichever kind
    holds the name refuses the other kind, so a lock holder is always alone."""
    name = "limit:shared"
    intervals: list[dict[str, Any]] = []
    refused = {"lock": 0, "semaphore": 0}
    errors: list[BaseException] = []
    guard = threading.Lock()
    deadline = time.monotonic() + 60

    def worker(kind: str, index: int) -> None:
        if kind == "lock":
            prim: turnstile.Semaphore = client.lock(name, ttl=LONG)
        else:
            prim = client.semaphore(name, 3, ttl=LONG)
        done = 0
        try:
            while done < 4 and time.monotonic() < deadline:
                try:
                    lease = prim.acquire(timeout=20, holder=f"{kind}-{index}-{done}")
                except InvalidArgument:
                    with guard:
                        refused[kind] += 1
                    time.sleep(0.002)
                    continue
                start = time.monotonic()
                time.sleep(0.003)
                end = time.monotonic()
                assert lease.release()
                with guard:
                    intervals.append(
                        {"kind": kind, "start": start, "end": end, "token": lease.token}
                    )
                done += 1
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(k, i)) for k in ("lock", "semaphore")
               for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(90)
    assert not errors, errors
    locks = [iv for iv in intervals if iv["kind"] == "lock"]
    sems = [iv for iv in intervals if iv["kind"] == "semaphore"]
    assert locks and sems
    check_exclusive(locks)
    assert max_concurrency(sems) <= 3
    for held in locks:
        for other in sems:
            assert held["end"] <= other["start"] or other["end"] <= held["start"], (held, other)


async def test_async_set_limit(aclient: turnstile.aio.AsyncClient) -> None:
    sem = aclient.semaphore("limit:aio", 1, ttl=LONG)
    boss = await sem.acquire(timeout=5, holder="boss")
    assert (await sem.try_acquire("next", LONG)).position == 0
    with pytest.raises(turnstile.aio.InvalidArgument):
        await aclient.semaphore("limit:aio", 2, ttl=LONG).try_acquire("other")
    assert await sem.set_limit(2) == 1
    assert (await sem.try_acquire("next", LONG)).acquired
    assert (await sem.status()).limit == 2
    with pytest.raises(turnstile.aio.InvalidArgument, match="a Lock always has limit 1"):
        await aclient.lock("limit:aio").set_limit(2)
    await sem.release("next")
    await boss.release()
