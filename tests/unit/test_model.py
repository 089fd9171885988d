"""The reference state machine (turnstile._core.lock_machine), driven with explicit store times."""

from __future__ import annotations

import itertools
import random
from collections.abc import Callable

import pytest

from turnstile._core import lock_machine
from turnstile._core.records import AcquireResult
from turnstile.errors import InvalidArgument


class Store:
    """One name's state plus a token counter, stepping the model at chosen instants."""

    def __init__(self, limit: int = 1) -> None:
        self.state = lock_machine.NameState(limit=limit)
        self.last = 0
        self.limit = limit

    def tokens(self, now: float) -> Callable[[], int]:
        def next_token() -> int:
            self.last = lock_machine.clock_token(self.last, now)
            return self.last

        return next_token

    def acquire(
        self,
        holder: str,
        now: float,
        *,
        ttl: float = 10.0,
        wait_ttl: float = 2.0,
        enqueue: bool = True,
        limit: int | None = None,
    ) -> tuple[AcquireResult, list[str]]:
        return lock_machine.acquire(
            self.state,
            name="n",
            holder=holder,
            limit=self.limit if limit is None else limit,
            ttl=ttl,
            wait_ttl=wait_ttl,
            enqueue=enqueue,
            now=now,
            next_token=self.tokens(now),
        )

    def release(self, holder: str, now: float, token: int | None = None) -> tuple[bool, list[str]]:
        return lock_machine.release(
            self.state, holder=holder, token=token, now=now, next_token=self.tokens(now)
        )

    def holders(self, now: float) -> list[str]:
        return [h.holder for h in lock_machine.status(self.state, name="n", now=now).holders]

    def waiters(self, now: float) -> list[str]:
        return [w.holder for w in lock_machine.status(self.state, name="n", now=now).waiters]


def test_clock_token_is_above_last_and_the_clock() -> None:
    assert lock_machine.clock_token(0, 1.5) == 1_500_000
    assert lock_machine.clock_token(2_000_000, 1.5) == 2_000_001  # a clock that stepped back
    assert lock_machine.clock_token(0, 0.0) == 1
    tokens = [0]
    for now in (5.0, 5.0, 5.0, 4.0, 6.0):
        tokens.append(lock_machine.clock_token(tokens[-1], now))
    assert all(a < b for a, b in itertools.pairwise(tokens))


def test_grant_and_hold() -> None:
    s = Store()
    r, woken = s.acquire("a", 100.0, ttl=10.0)
    assert r.grant is not None and woken == []
    assert (r.grant.holder, r.grant.acquired_at, r.grant.expires_at) == ("a", 100.0, 110.0)
    assert r.position is None and r.now == 100.0
    again, _ = s.acquire("a", 101.0)  # idempotent: the same grant
    assert again.grant is not None and again.grant.token == r.grant.token
    b, _ = s.acquire("b", 101.0)
    assert b.grant is None and b.position == 0
    assert b.retry_after == pytest.approx(9.0)


def test_fifo_and_handover_to_the_first_waiter() -> None:
    s = Store()
    a, _ = s.acquire("a", 0.0)
    for i, h in enumerate("bcd"):
        r, _ = s.acquire(h, 0.1)
        assert r.position == i
    assert a.grant is not None
    released, woken = s.release("a", 0.5, a.grant.token)
    assert released and woken == ["b"]  # the release grants b and wakes b only
    assert s.holders(0.5) == ["b"] and s.waiters(0.5) == ["c", "d"]


def test_unclaimed_grant_lasts_wait_ttl_then_claimed_for_ttl() -> None:
    s = Store()
    s.acquire("a", 0.0, ttl=10.0)
    s.acquire("b", 0.0, ttl=10.0, wait_ttl=2.0)
    s.release("a", 1.0)
    row = s.state.holders["b"]
    assert not row.claimed and row.expires_at == 3.0  # min(ttl, wait_ttl) after the grant
    r, _ = s.acquire("b", 2.0, ttl=10.0, wait_ttl=2.0)
    assert r.grant is not None and r.grant.expires_at == 12.0
    assert s.state.holders["b"].claimed


def test_dead_waiter_is_skipped() -> None:
    """b is granted on a's release but never comes back: after wait_ttl c gets the grant."""
    s = Store()
    s.acquire("a", 0.0)
    s.acquire("b", 0.0, wait_ttl=2.0)
    s.acquire("c", 0.0, wait_ttl=2.0)
    s.acquire("c", 1.5, wait_ttl=2.0)  # c keeps asking, b does not
    _, woken = s.release("a", 1.9)
    assert woken == ["b"]
    c, _ = s.acquire("c", 3.0, wait_ttl=2.0)
    assert c.grant is None and c.position == 0 and c.retry_after == pytest.approx(0.9)
    c, _ = s.acquire("c", 3.95, wait_ttl=2.0)  # b's unclaimed grant lapsed at 3.9
    assert c.grant is not None
    assert s.holders(3.95) == ["c"]


def test_waiter_that_stops_asking_loses_its_place() -> None:
    s = Store()
    s.acquire("a", 0.0, ttl=100.0)
    s.acquire("b", 0.0, wait_ttl=1.0)
    s.acquire("c", 0.0, wait_ttl=1.0)
    s.acquire("c", 0.9, wait_ttl=1.0)
    assert s.waiters(0.95) == ["b", "c"]
    assert s.waiters(1.0) == ["c"]  # b's entry expired at 1.0 (store time decides)
    r, _ = s.acquire("b", 1.2, wait_ttl=1.0)
    assert r.position == 1  # back of the line


def test_expired_holder_is_replaced_on_next_step() -> None:
    s = Store()
    a, _ = s.acquire("a", 0.0, ttl=1.0)
    s.acquire("b", 0.5, ttl=1.0, wait_ttl=1.0)
    r, woken = s.acquire("b", 1.0, ttl=1.0, wait_ttl=1.0)  # a expires exactly at 1.0
    assert r.grant is not None and a.grant is not None and r.grant.token > a.grant.token
    assert woken == []  # b was the caller: claimed at once, nobody to wake


def test_expiry_promotes_others_and_reports_them_woken() -> None:
    s = Store(limit=1)
    s.acquire("a", 0.0, ttl=1.0)
    s.acquire("b", 0.0, wait_ttl=5.0)
    s.acquire("c", 0.0, wait_ttl=5.0)
    r, woken = s.acquire("c", 1.5, wait_ttl=5.0)
    assert r.grant is None and r.position == 0
    assert woken == ["b"]


def test_enqueue_false_never_joins_or_jumps_the_line() -> None:
    s = Store(limit=1)
    r, _ = s.acquire("a", 0.0, enqueue=False)
    assert r.grant is not None
    r, _ = s.acquire("x", 0.1, enqueue=False)
    assert r.grant is None and r.position is None
    assert s.waiters(0.1) == []
    s.acquire("b", 0.2)  # b waits
    s.release("a", 0.3)  # b gets the unclaimed grant
    r, _ = s.acquire("x", 0.4, enqueue=False)
    assert r.grant is None and r.position is None


def test_enqueue_false_keeps_place_of_an_existing_waiter() -> None:
    s = Store(limit=1)
    s.acquire("a", 0.0)
    s.acquire("b", 0.0, wait_ttl=1.0)
    r, _ = s.acquire("b", 0.8, wait_ttl=1.0, enqueue=False)
    assert r.position == 0
    assert s.waiters(1.5) == ["b"]  # its entry was refreshed


def test_release_is_scoped_and_idempotent() -> None:
    s = Store(limit=1)
    a, _ = s.acquire("a", 0.0)
    assert a.grant is not None
    assert s.release("a", 0.1, a.grant.token + 1) == (False, [])
    assert s.release("a", 0.1, a.grant.token)[0] is True
    assert s.release("a", 0.2, a.grant.token)[0] is False
    assert s.release("a", 0.2)[0] is False
    a2, _ = s.acquire("a", 0.3)
    assert a2.grant is not None and a2.grant.token > a.grant.token
    assert s.release("a", 0.4, a.grant.token)[0] is False  # stale token
    assert s.holders(0.4) == ["a"]


def test_release_without_token_leaves_the_line() -> None:
    s = Store(limit=1)
    s.acquire("a", 0.0)
    s.acquire("b", 0.0)
    s.acquire("c", 0.0)
    released, woken = s.release("b", 0.1)
    assert released and woken == []
    assert s.waiters(0.1) == ["c"]
    released, woken = s.release("b", 0.1, 5)  # with a token: only a lease, not the line
    assert not released


def test_renew() -> None:
    s = Store(limit=1)
    a, _ = s.acquire("a", 0.0, ttl=1.0)
    assert a.grant is not None
    g = lock_machine.renew(s.state, name="n", holder="a", token=a.grant.token, ttl=5.0, now=0.5)
    assert g is not None and g.expires_at == 5.5 and g.acquired_at == 0.0
    assert (
        lock_machine.renew(s.state, name="n", holder="a", token=a.grant.token + 1, ttl=5.0, now=0.6)
        is None
    )
    assert (
        lock_machine.renew(s.state, name="n", holder="a", token=a.grant.token, ttl=5.0, now=5.5)
        is None
    )  # expired exactly now
    assert lock_machine.renew(s.state, name="n", holder="zz", token=1, ttl=5.0, now=0.1) is None


def test_renew_claims_an_unclaimed_grant() -> None:
    s = Store(limit=1)
    s.acquire("a", 0.0)
    s.acquire("b", 0.0, ttl=10.0, wait_ttl=1.0)
    s.release("a", 0.1)
    token = s.state.holders["b"].token
    g = lock_machine.renew(s.state, name="n", holder="b", token=token, ttl=10.0, now=0.5)
    assert g is not None and s.state.holders["b"].claimed and g.expires_at == 10.5


def test_a_busy_name_keeps_its_limit_and_set_limit_changes_it() -> None:
    s = Store(limit=2)
    assert s.acquire("a", 0.0)[0].grant is not None
    assert s.acquire("b", 0.0)[0].grant is not None
    assert s.acquire("c", 0.0)[0].position == 0
    # a newcomer asking with another limit is refused, and nothing changes
    with pytest.raises(InvalidArgument, match=r"'n' has limit 2 .* asked for limit 3"):
        s.acquire("d", 0.1, limit=3)
    assert s.holders(0.1) == ["a", "b"] and s.waiters(0.1) == ["c"]
    # one already in line keeps its place whatever limit it names: the name's governs
    r, woken = s.acquire("c", 0.1, limit=3)
    assert r.position == 0 and woken == [] and s.state.limit == 2
    # raised: the waiters in front are granted (and to be woken), in order
    assert s.acquire("d", 0.1)[0].position == 1
    previous, woken = lock_machine.set_limit(
        s.state, limit=3, now=0.2, next_token=s.tokens(0.2)
    )
    assert previous == 2 and woken == ["c"] and s.holders(0.2) == ["a", "b", "c"]
    assert s.waiters(0.2) == ["d"]
    # lowered: nobody is evicted, nobody promoted until fewer than 1 hold
    previous, woken = lock_machine.set_limit(
        s.state, limit=1, now=0.3, next_token=s.tokens(0.3)
    )
    assert previous == 3 and woken == [] and s.holders(0.3) == ["a", "b", "c"]
    for who in ("a", "b"):
        assert s.release(who, 0.4) == (True, [])
    assert s.release("c", 0.5) == (True, ["d"])


def test_an_idle_name_takes_the_callers_limit_and_ignores_set_limit() -> None:
    s = Store(limit=1)
    previous, woken = lock_machine.set_limit(s.state, limit=4, now=0.0, next_token=s.tokens(0.0))
    assert (previous, woken, s.state.limit) == (None, [], 1)
    assert s.acquire("a", 0.0, limit=1)[0].grant is not None
    assert s.release("a", 0.1)[0]
    # idle again (nothing held, nobody waiting): the next caller's limit becomes the name's
    for who in ("x", "y", "z"):
        assert s.acquire(who, 0.2, limit=3)[0].grant is not None
    assert s.state.limit == 3
    # expired leases do not make a name busy
    t = Store(limit=1)
    t.acquire("old", 0.0, ttl=1.0)
    assert t.acquire("new", 2.0, limit=2)[0].grant is not None and t.state.limit == 2


def test_status_filters_expired_and_orders() -> None:
    s = Store(limit=2)
    s.acquire("a", 0.0, ttl=1.0)
    s.acquire("b", 0.5, ttl=5.0)
    s.acquire("c", 0.6, wait_ttl=0.5)
    s.acquire("d", 0.7, wait_ttl=5.0)
    st = lock_machine.status(s.state, name="n", now=1.15)
    assert [h.holder for h in st.holders] == ["b"]  # a expired
    assert [(w.holder, w.position) for w in st.waiters] == [("d", 0)]  # c expired
    assert st.limit == 2 and st.now == 1.15
    empty = lock_machine.status(lock_machine.NameState(), name="n", now=0.0)
    assert empty.limit is None and empty.holders == () and empty.waiters == ()


def test_retry_after() -> None:
    s = Store(limit=2)
    assert lock_machine.retry_after(s.state, 0.0) is None
    s.acquire("a", 0.0, ttl=3.0)
    s.acquire("b", 0.0, ttl=2.0)
    assert lock_machine.retry_after(s.state, 0.5) == pytest.approx(1.5)
    assert lock_machine.retry_after(s.state, 2.5) == 0.0


def test_invariants_under_random_operations() -> None:
    """Random holders acquire, renew, release, stop asking; the clock moves on. After every
    step: never more than limit unexpired holders, no free slot beside a live waiter, tokens
    strictly increase, and the line keeps its order."""
    rng = random.Random(1234)
    for limit in (1, 2, 3):
        s = Store(limit=limit)
        now = 0.0
        issued: list[int] = []  # every token ever granted, in grant order
        holders = [f"h{i}" for i in range(8)]
        for _ in range(3000):
            now += rng.choice([0.0, 0.01, 0.1, 0.5, 1.0])
            h = rng.choice(holders)
            op = rng.random()
            before = [w.holder for w in s.state.waiters if w.expires_at > now]
            if op < 0.5:
                s.acquire(
                    h,
                    now,
                    ttl=rng.choice([0.5, 1.0, 3.0]),
                    wait_ttl=rng.choice([0.3, 1.0]),
                    enqueue=rng.random() < 0.9,
                )
            elif op < 0.8:
                row = s.state.holders.get(h)
                token = row.token if row is not None and rng.random() < 0.8 else None
                s.release(h, now, token)
            else:
                row = s.state.holders.get(h)
                if row is not None:
                    lock_machine.renew(
                        s.state, name="n", holder=h, token=row.token, ttl=1.0, now=now
                    )
            live_holders = [x for x in s.state.holders.values() if x.expires_at > now]
            live_waiters = [w.holder for w in s.state.waiters if w.expires_at > now]
            assert len(live_holders) <= limit
            if live_waiters and op < 0.8:  # renew is not a step that promotes
                assert len(live_holders) == limit, "a free slot next to a live waiter"
            assert not set(live_waiters) & {x.holder for x in live_holders}
            # survivors of the line keep their relative order
            survivors = [x for x in before if x in live_waiters]
            assert survivors == [x for x in live_waiters if x in survivors]
            new = sorted(x.token for x in s.state.holders.values() if x.token not in issued)
            assert not issued or not new or new[0] > issued[-1], "a token was not above the last"
            issued += new
