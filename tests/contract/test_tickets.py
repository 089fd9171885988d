"""``try_acquire`` tickets (SPEC problem 2b): never blocks, joins the line once, idempotent per
holder, keeps the place while the holder keeps asking, lapses when it stops, released from
any process, and release also leaves the line."""

from __future__ import annotations

import time

import turnstile

from .lock_harness import LONG_TTL, Spawner


def test_positions_and_idempotence(client: turnstile.Client, workers: Spawner) -> None:
    name = "tix:basic"
    sem = client.semaphore(name, 1, ttl=LONG_TTL)
    boss = sem.acquire(timeout=5, holder="boss")
    assert [sem.try_acquire(h).position for h in ("a", "b", "c")] == [0, 1, 2]
    for _ in range(3):  # asking again keeps the place and adds nobody
        assert [sem.try_acquire(h).position for h in ("c", "a", "b")] == [2, 0, 1]
    t = sem.try_acquire("a")
    assert (t.acquired, t.lease) == (False, None)
    assert [w.holder for w in sem.status().waiters] == ["a", "b", "c"]

    # release(holder) from another process also leaves the line
    w = workers.spawn("release", name=name, limit=1, ttl=LONG_TTL, holder="b")
    assert w.wait_for("released")["result"] is True
    w.join()
    assert [w.holder for w in sem.status().waiters] == ["a", "c"]
    assert sem.try_acquire("c").position == 1

    boss.release()
    first = sem.try_acquire("a")
    assert first.acquired and first.lease is not None and first.position is None
    again = sem.try_acquire("a")  # idempotent once granted: the same lease
    assert again.acquired and again.lease is not None
    assert again.lease.token == first.lease.token
    assert sem.try_acquire("c").position == 0

    # another process asks for a ticket on the same line and sees the same state
    w = workers.spawn("ticket", name=name, limit=1, ttl=LONG_TTL, holder="c")
    seen = w.wait_for("ticket")
    assert (seen["acquired"], seen["position"], seen["token"]) == (False, 0, None)
    w.join()

    # the holder finishes in another process: release by holder name
    w = workers.spawn("release", name=name, limit=1, ttl=LONG_TTL, holder="a")
    assert w.wait_for("released")["result"] is True
    w.join()
    third = sem.try_acquire("c")
    assert third.acquired and third.lease is not None
    assert third.lease.token > first.lease.token
    # a stale token from the released holder releases nothing
    assert sem.release("a", first.lease.token) is False
    assert third.lease.release()
    st = sem.status()
    assert st.holders == () and st.waiters == ()


def test_ticket_lease_keeps_renewing_in_with(client: turnstile.Client) -> None:
    ttl = 3.0  # renewed every second: a renewal may be two seconds late before it is lost
    sem = client.semaphore("tix:with", 2, ttl=ttl)
    t = sem.try_acquire("exec")
    assert t.acquired and t.lease is not None
    with t.lease as lease:
        first_expiry = lease.expires_at
        deadline = time.monotonic() + 60
        while lease.expires_at < first_expiry + ttl and time.monotonic() < deadline:
            time.sleep(0.05)  # until renewed (at least) past a whole ttl beyond the first
        assert lease.expires_at >= first_expiry + ttl, "not renewed"
        assert not lease.lost
    assert sem.status().holders == ()


def test_place_kept_while_asking_and_lapses_when_not(client: turnstile.Client) -> None:
    name = "tix:lapse"
    wait_ttl = 2.5  # a and c ask every 0.1 s: one of them would have to stall for 2.4 s
    sem = client.semaphore(name, 1, ttl=120.0)
    boss = sem.acquire(timeout=5, holder="boss")
    for h in ("a", "b", "c"):
        sem.try_acquire(h, wait_ttl=wait_ttl)
    started = time.monotonic()
    deadline = started + 60
    while time.monotonic() < deadline:  # a and c keep asking, b does not
        assert sem.try_acquire("a", wait_ttl=wait_ttl).position == 0
        sem.try_acquire("c", wait_ttl=wait_ttl)
        # ... for longer than wait_ttl, and until b's place has lapsed
        if time.monotonic() - started > 1.5 * wait_ttl and len(sem.status().waiters) == 2:
            break
        time.sleep(0.1)
    assert [w.holder for w in sem.status().waiters] == ["a", "c"]
    assert sem.try_acquire("c", wait_ttl=wait_ttl).position == 1
    # b asks again: it lost its place and joins at the back
    assert sem.try_acquire("b", wait_ttl=wait_ttl).position == 2
    # ... and stays there: it does not get its old place back
    assert [w.holder for w in sem.status().waiters] == ["a", "c", "b"]
    assert [sem.try_acquire(h, wait_ttl=wait_ttl).position for h in "abc"] == [0, 2, 1]
    for h in ("a", "b", "c"):
        assert sem.release(h)
    boss.release()
    assert sem.status().waiters == ()


def test_unclaimed_grant_lapses_and_line_moves_on(client: turnstile.Client) -> None:
    """A waiter granted on a release but never asking again (it died) holds the grant only for
    its wait_ttl; then the next in line gets it."""
    name = "tix:unclaimed"
    wait_ttl = 0.5
    ttl = 30.0  # what the dead waiter's grant would last if it did not lapse after wait_ttl
    sem = client.semaphore(name, 1, ttl=ttl)
    boss = sem.acquire(timeout=5, holder="boss")
    assert sem.try_acquire("dead", wait_ttl=wait_ttl).position == 0
    assert sem.try_acquire("next", wait_ttl=ttl).position == 1
    released = time.monotonic()
    boss.release()
    st = sem.status()
    assert [h.holder for h in st.holders] == ["dead"]
    assert st.holders[0].expires_at - st.now <= wait_ttl + 0.01
    granted_at = None
    deadline = released + ttl / 2
    while time.monotonic() < deadline:
        t = sem.try_acquire("next", wait_ttl=ttl)
        if t.acquired:
            granted_at = time.monotonic()
            assert t.lease is not None
            t.lease.release()
            break
        time.sleep(0.02)
    assert granted_at is not None, "the line did not move past the dead waiter"
    assert wait_ttl - 0.05 <= granted_at - released < ttl / 2


def test_release_also_leaves_the_line(client: turnstile.Client) -> None:
    sem = client.semaphore("tix:leave", 1, ttl=60.0)
    with sem.acquire(timeout=5, holder="boss"):
        sem.try_acquire("a")
        sem.try_acquire("b")
        assert sem.release("a") is True
        assert sem.release("a") is False
        assert [(w.holder, w.position) for w in sem.status().waiters] == [("b", 0)]
    t = sem.try_acquire("b")
    assert t.acquired and t.lease is not None
    t.lease.release()


def test_try_acquire_on_a_free_name_acquires(client: turnstile.Client) -> None:
    sem = client.semaphore("tix:free", 3, ttl=60.0)
    tickets = [sem.try_acquire(f"e{i}") for i in range(4)]
    assert [t.acquired for t in tickets] == [True, True, True, False]
    assert tickets[3].position == 0
    tokens = [t.lease.token for t in tickets[:3] if t.lease is not None]
    assert tokens == sorted(tokens) and len(set(tokens)) == 3
    assert sem.release("e0")
    t = sem.try_acquire("e3")
    assert t.acquired
    for h in ("e1", "e2", "e3"):
        assert sem.release(h)


def test_lapsed_waiter_rejoins_at_the_back(client: turnstile.Client) -> None:
    """A waiter whose entry lapsed and who asks again — before anybody else touched the
    line — joins at the back, behind everyone who kept their place."""
    sem = client.semaphore("tix:rejoin", 1, ttl=60.0)
    with sem.acquire(timeout=5, holder="boss"):
        assert sem.try_acquire("a", wait_ttl=60.0).position == 0
        assert sem.try_acquire("b", wait_ttl=0.3).position == 1
        assert sem.try_acquire("c", wait_ttl=60.0).position == 2
        time.sleep(0.5)  # b's entry lapses; nobody asks meanwhile
        assert sem.try_acquire("b", wait_ttl=60.0).position == 2
        st = sem.status()
        assert [(w.holder, w.position) for w in st.waiters] == [("a", 0), ("c", 1), ("b", 2)]
        assert st.waiters[2].joined_at > st.waiters[1].joined_at
        for h in "abc":
            assert sem.release(h)
