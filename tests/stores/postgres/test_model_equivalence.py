"""The SQL functions against the reference state machine (turnstile/_core/lock_machine.py), step for
step, on a virtual clock: random operations on a few names, the same answers (grants, tokens,
times, positions, retry_after, status, names, callback deliveries taken and settled) and the
same NOTIFY wake-ups, in order, each carrying exactly the grant the model made, for the
waiting entry the waiter was told of (callback waiters are never woken). Acquires carry
random priorities, some with ageing (_core/ranking.py), so lines are reordered: the same
order, positions and arrival stamps on both. Two names are semaphore groups (random keys from
a small set, per_key 1-2, total 2-3), so promotions skip waiters of full keys (no
head-of-line blocking) and callers of another shape are refused: the same grants, skips,
keys and refusals on both."""

from __future__ import annotations

import copy
import random
import secrets
import time
from typing import Any

import psycopg
import pytest

import turnstile
from turnstile._core import callbacks, lock_machine
from turnstile.stores.postgres import sql as pg

pytestmark = pytest.mark.postgres

T0 = 1_700_000_000.0
GRID = 1 / 64  # exact both as a float and in microseconds, so expiry boundaries agree
PLAIN = ["a", "b:{x}", "c ☃"]
GROUPS = ["g", "g:{y} ☃"]  # semaphore groups (per_key), unless a caller's other shape wins
NAMES = PLAIN + GROUPS
KEYS = ["k1", "k2", "k3"]
HOLDERS = ["h1", "h2", "h3", "h4", "h5"]
GROUP_HOLDERS = [*HOLDERS, "h6", "h7"]  # enough for a group's line to form behind its total
TTLS = [0.25, 0.5, 1.0, 2.0, 3.0]
# A group's leases and places last longer, so that lines form behind full keys and the total
# (a group needs more holders than a lock before anyone waits).
GROUP_TTLS = [8.0, 16.0, 32.0]
OUTCOMES = ["delivered", "delivered", "refused", "retry"]
PRIORITIES = [-2, -1, 0, 0, 0, 1, 2]
# Mostly strict; with ageing, levels of a few steps of the virtual clock (GRID multiples),
# so that waiting entries of different levels overtake each other, and rank ties happen.
AGEINGS = [None, None, None, 0.25, 1.0, 4 * GRID]


def _ranking(rng: random.Random) -> dict[str, Any]:
    return {"priority": rng.choice(PRIORITIES), "ageing": rng.choice(AGEINGS)}


def _shape(
    rng: random.Random, name: str, home: dict[str, tuple[int, int | None]], ref: Reference
) -> dict[str, Any]:
    """An acquire's limit, key and per_key: mostly the name's shape (its own while busy, its
    usual one while idle: a line forms, hand-overs happen), sometimes another (refused while
    the name is busy, taken while it is idle): a plain name asked as a group, a group asked
    as a plain semaphore or with another total or per_key."""
    state = ref.states.get(name)
    limit, per_key = home[name] if state is None else (state.limit, state.per_key)
    if rng.random() < 0.1:
        limit = rng.choice([1, 2, 3])
        per_key = rng.choice([None, None, 1, 2] if name in GROUPS else [None] * 5 + [1])
    key = rng.choice(KEYS) if per_key is not None or rng.random() < 0.1 else None
    return {"limit": limit, "key": key, "per_key": per_key}


def _line(ref: Reference, now: float) -> dict[str, list[str]]:
    """The live lines of the groups in the model."""
    return {
        n: [w.holder for w in s.waiters if w.expires_at > now]
        for n, s in ref.states.items()
        if s.per_key is not None
    }


def _skipped(ref: Reference, before: dict[str, list[str]]) -> bool:
    """Whether a step granted a group's waiter while one ahead of it stayed in line."""
    for name, line in before.items():
        state = ref.states.get(name)
        if state is None:
            continue
        granted = [i for i, h in enumerate(line) if h in state.holders]
        waiting = {w.holder for w in state.waiters}
        staying = [i for i, h in enumerate(line) if h in waiting]
        if granted and staying and max(granted) > min(staying):
            return True
    return False


def _callback(holder: str, n: int) -> str:
    return callbacks.encode(callbacks.StepFunctionsCallback(f"task-{holder}-{n}"))


class Reference:
    """lock_machine.py with one token counter per name, as the PostgreSQL schema keeps it."""

    def __init__(self) -> None:
        self.states: dict[str, lock_machine.NameState] = {}
        self.last: dict[str, int] = {}
        # One wake-up per hand-over, with the grant it carries: (key, holder, token, acquired
        # at, expires at), the model's grant at the moment it was made.
        self.woken: list[tuple[str, str, int, float, float]] = []

    def _tokens(self, name: str, now: float) -> Any:
        def next_token() -> int:
            self.last[name] = lock_machine.clock_token(self.last.get(name, 0), now)
            return self.last[name]

        return next_token

    def _settle(self, name: str, woken: list[str]) -> None:
        rows = self.states[name].holders
        self.woken += [
            (pg.wake_key(name, h), h, rows[h].token, rows[h].acquired_at, rows[h].expires_at)
            for h in woken
        ]
        if self.states[name].empty:
            del self.states[name]

    def acquire(self, now: float, name: str, holder: str, **kw: Any) -> Any:
        state = self.states.setdefault(name, lock_machine.NameState(limit=kw["limit"]))
        before = copy.deepcopy(state)
        try:
            result, woken = lock_machine.acquire(
                state, name=name, holder=holder, now=now, next_token=self._tokens(name, now), **kw
            )
        except turnstile.InvalidArgument:
            # A refused acquire's transaction is rolled back: not even its purge stays (the
            # model's purge without the promotion after it would leave a free slot before a
            # live waiter, which a deliverer's take then acts on in SQL but not in the model).
            self.states[name] = before
            raise
        self._settle(name, woken)
        return result

    def set_limit(self, now: float, name: str, limit: int) -> int | None:
        if name not in self.states:
            return None
        previous, woken = lock_machine.set_limit(
            self.states[name], limit=limit, now=now, next_token=self._tokens(name, now)
        )
        self._settle(name, woken)
        return previous

    def release(self, now: float, name: str, holder: str, token: int | None) -> bool:
        if name not in self.states:
            return False
        released, woken = lock_machine.release(
            self.states[name],
            holder=holder,
            token=token,
            now=now,
            next_token=self._tokens(name, now),
        )
        self._settle(name, woken)
        return released

    def renew(self, now: float, name: str, holder: str, token: int, ttl: float) -> Any:
        if name not in self.states:
            return None
        return lock_machine.renew(
            self.states[name], name=name, holder=holder, token=token, ttl=ttl, now=now
        )

    def take_deliveries(self, now: float, lease: float, max_count: int) -> list[Any]:
        taken: list[Any] = []
        for name in list(self.states):
            state = self.states[name]
            if not state.has_callbacks or not lock_machine.due(state, now):
                continue
            got, woken = lock_machine.take_deliveries(
                state,
                name=name,
                now=now,
                lease=lease,
                max_count=max_count - len(taken),
                next_token=self._tokens(name, now),
            )
            taken += got
            self._settle(name, woken)
        return taken

    def settle_delivery(
        self, now: float, name: str, token: int, outcome: str, retry_in: float
    ) -> bool:
        if name not in self.states:
            return False
        settled, woken = lock_machine.settle_delivery(
            self.states[name],
            token=token,
            outcome=outcome,
            retry_in=retry_in,
            now=now,
            next_token=self._tokens(name, now),
        )
        self._settle(name, woken)
        return settled

    def status(self, now: float, name: str) -> Any:
        return lock_machine.status(
            self.states.get(name) or lock_machine.NameState(), name=name, now=now
        )

    def names(self, now: float, prefix: str, max_count: int) -> list[str]:
        live = [
            n
            for n, s in self.states.items()
            if n.startswith(prefix)
            and (
                any(h.expires_at > now for h in s.holders.values())
                or any(w.expires_at > now for w in s.waiters)
            )
        ]
        return sorted(live)[:max_count]


class _Forgetful(dict):  # type: ignore[type-arg]
    """A backend's ``_known`` that never knows a name: every acquire sends acquire_fresh."""

    def __contains__(self, key: object) -> bool:
        return False

    def __setitem__(self, key: object, value: object) -> None:
        pass


class _AlwaysIdle(dict):  # type: ignore[type-arg]
    """A backend's ``_known`` that takes every name for idle: every acquire sends
    acquire_idle first, and the function when that finds the name busy."""

    def get(self, key: object, default: object = None) -> int:
        return 1 << 20  # any streak long enough

    def __setitem__(self, key: object, value: object) -> None:
        pass


@pytest.mark.parametrize("prepare", ["off", "on", "fresh", "idle"])
@pytest.mark.parametrize("seed", [*range(6), 12, 47])
def test_sql_functions_follow_the_model(pg_url: str, seed: int, prepare: str) -> None:
    """prepare=on: acquire and release as the plain statements of queries.sql (their fast
    paths inline, the functions called when those do not apply): acquire_fresh for a name's
    first acquire by the client, then acquire_idle or acquire_fast by whether the last ones
    were fast grants. "fresh": acquire_fresh every time (as a client that has not seen the
    name sends it, whatever state the name is in). "idle": acquire_idle every time, then the
    function when it grants nothing (as a client whose hint is wrong sends them)."""
    rng = random.Random(seed)
    on = "on" if prepare in ("fresh", "idle") else prepare
    client = turnstile.connect(f"{pg_url}{'&' if '?' in pg_url else '?'}prepare={on}")
    backend: Any = client.backend
    if prepare == "fresh":
        backend._known = _Forgetful()
    elif prepare == "idle":
        backend._known = _AlwaysIdle()
    clock = [T0]
    backend.clock_override = lambda: clock[0]
    listen = psycopg.connect(backend.config.conninfo, autocommit=True)
    heard: list[str] = []  # read at the end: they wait in the socket meanwhile
    # Waiting entries name this channel, as they name a client's LISTEN channel.
    channel = pg.client_channel(secrets.token_hex(16))
    backend._wake_channel = lambda: channel
    listen.execute(f"LISTEN {pg.quote_ident(channel)}")
    ref = Reference()
    issued: dict[tuple[str, str], int] = {}  # last token seen per (name, holder)
    wait_ids: dict[str, int] = {}  # holder -> its waiting entry, as its last step told it
    expected: list[tuple[str, int, int, float, float]] = []  # what each wake-up must say
    seen: set[str] = set()  # the sequence must include refusals and changes of limit
    # Each name's usual shape (limit, per_key): groups have per_key 1-2 below a total of 2-3.
    home: dict[str, tuple[int, int | None]] = dict.fromkeys(PLAIN, (1, None))
    for group in GROUPS:
        home[group] = rng.choice([(2, 1), (3, 1), (3, 2)])
    taken: list[tuple[str, int]] = []  # deliveries taken: (name, token)
    unordered: list[tuple[int, int]] = []  # ranges of expected wake-ups of one take
    try:
        for step in range(500):
            clock[0] += GRID * rng.choice([0, 0, 1, 4, 16, 32, 64, 128])
            now = clock[0]
            name = rng.choices(NAMES, [1] * len(PLAIN) + [3] * len(GROUPS))[0]
            holder = rng.choice(GROUP_HOLDERS if name in GROUPS else HOLDERS)
            ttls = GROUP_TTLS if name in GROUPS else TTLS
            op = rng.choices(
                ["acquire", "set_limit", "release", "renew", "status", "names", "callback",
                 "take", "settle"],
                [12 if name in GROUPS else 6, 1, 3, 2, 1, 1, 2, 2, 1],
            )[0]
            where = f"seed {seed} step {step}: {op} {name!r} {holder!r} at +{now - T0}"
            lines = _line(ref, now)
            if op == "acquire":
                kw = {
                    **_shape(rng, name, home, ref),
                    "ttl": rng.choice(ttls),
                    "wait_ttl": rng.choice(ttls),
                    "enqueue": rng.random() < 0.8,
                    **_ranking(rng),
                }
                before = len(ref.woken)
                want = _outcome(ref.acquire, now, name, holder, **kw)
                got = _outcome(backend.acquire, name, holder, **kw)
                assert got == want, where
                if isinstance(got, str):  # a refused limit or shape: nothing changed
                    seen.add("refused group" if "semaphore group" in got else "refused")
                    continue
                if got.grant is not None:
                    issued[(name, holder)] = got.grant.token
                    assert got.wait_id is None, where
                else:
                    # a waiting entry is named; acquire_nowait on a busy name has none
                    assert (got.wait_id is not None) == (got.position is not None), where
                    if got.wait_id is not None:
                        wait_ids[f"{name}\0{holder}"] = got.wait_id
                _expect(ref, before, name, wait_ids, expected)
            elif op == "callback":
                kw = {
                    **_shape(rng, name, home, ref),
                    "ttl": rng.choice(ttls),
                    "wait_ttl": rng.choice(ttls),
                    "callback": _callback(holder, rng.randrange(2)),
                    **_ranking(rng),
                }
                before = len(ref.woken)
                want = _outcome(ref.acquire, now, name, holder, enqueue=True, **kw)
                got = _outcome(backend.acquire_callback, name, holder, **kw)
                assert got == want, where
                if isinstance(got, str):
                    continue
                if got.grant is not None:
                    issued[(name, holder)] = got.grant.token
                _expect(ref, before, name, wait_ids, expected)
            elif op == "take":
                lease = rng.choice(TTLS)
                before = len(ref.woken)
                want = sorted(ref.take_deliveries(now, lease, 100), key=_by_grant)
                got = sorted(backend.take_deliveries(lease=lease, max_count=100), key=_by_grant)
                assert got == want, where
                taken += [(d.name, d.token) for d in got]
                start = len(expected)
                _expect_any(ref, before, wait_ids, expected)
                # One transaction: its wake-ups arrive together, names in any order.
                unordered.append((start, len(expected)))
            elif op == "settle":
                if taken and rng.random() < 0.8:
                    name, token = rng.choice(taken)
                else:
                    token = issued.get((name, holder)) or rng.randrange(1, 10**16)
                outcome, retry_in = rng.choice(OUTCOMES), rng.choice(TTLS)
                before = len(ref.woken)
                assert backend.settle_delivery(
                    name, token, outcome=outcome, retry_in=retry_in
                ) == ref.settle_delivery(now, name, token, outcome, retry_in), where
                _expect(ref, before, name, wait_ids, expected)
            elif op == "set_limit":
                limit = rng.choice([2, 3] if name in GROUPS else [1, 2, 3])
                before = len(ref.woken)
                previous = ref.set_limit(now, name, limit)
                home[name] = (limit, home[name][1])
                assert backend.set_limit(name, limit) == previous, where
                seen.add("changed" if previous not in (None, limit) else "unchanged")
                _expect(ref, before, name, wait_ids, expected)
            elif op == "release":
                state = ref.states.get(name)
                if name in GROUPS and state is not None and state.holders and rng.random() < 0.7:
                    # mostly a holder of the group: keys free up while others wait
                    holder = rng.choice(sorted(state.holders))
                    where = f"seed {seed} step {step}: {op} {name!r} {holder!r} at +{now - T0}"
                token = rng.choice([None, issued.get((name, holder)), rng.randrange(1, 10**16)])
                before = len(ref.woken)
                assert backend.release(name, holder, token) == ref.release(
                    now, name, holder, token
                ), where
                _expect(ref, before, name, wait_ids, expected)
            elif op == "renew":
                token = issued.get((name, holder)) or rng.randrange(1, 10**16)
                ttl = rng.choice(TTLS)
                assert backend.renew(name, holder, token, ttl) == ref.renew(
                    now, name, holder, token, ttl
                ), where
            elif op == "status":
                assert backend.status(name) == ref.status(now, name), where
            else:
                prefix = rng.choice(["", "a", "b:", "z"])
                assert backend.names(prefix, 2) == ref.names(now, prefix, 2), where
            for state in ref.states.values():  # has a priority reordered a line?
                joined = [w.joined_at for w in state.waiters]
                if joined != sorted(joined):
                    seen.add("reordered")
            if _skipped(ref, lines):
                seen.add("skipped")
        # A scripted tail, so that every seed has hand-overs of both kinds, by a release and
        # by a raised limit (everything above has lapsed by then).
        clock[0] += 10.0
        now = clock[0]
        name = PLAIN[seed % len(PLAIN)]
        for holder in ("h1", "h2", "h3"):
            kw = {"limit": 1, "ttl": 3.0, "wait_ttl": 3.0, "enqueue": True}
            want = ref.acquire(now, name, holder, **kw)
            got = backend.acquire(name, holder, **kw)
            assert got == want, f"seed {seed} tail: acquire {holder}"
            if got.wait_id is not None:
                wait_ids[f"{name}\0{holder}"] = got.wait_id
        before = len(ref.woken)
        assert backend.release(name, "h1", None) == ref.release(now, name, "h1", None) is True
        assert backend.set_limit(name, 2) == ref.set_limit(now, name, 2) == 1
        assert [w[1] for w in ref.woken[before:]] == ["h2", "h3"]
        _expect(ref, before, name, wait_ids, expected)
        kw = {"limit": 3, "ttl": 3.0, "wait_ttl": 3.0, "enqueue": True}
        refused = _outcome(backend.acquire, name, "h4", **kw)
        assert refused == _outcome(ref.acquire, now, name, "h4", **kw)
        assert isinstance(refused, str) and "has limit 2" in refused
        seen.add("refused")
        # And a line a priority reorders: h5 (priority 1) joins ahead of h4, and is the one
        # a release hands over to.
        for holder, priority in (("h4", 0), ("h5", 1)):
            kw = {"limit": 2, "ttl": 3.0, "wait_ttl": 3.0, "enqueue": True}
            want = ref.acquire(now, name, holder, priority=priority, **kw)
            got = backend.acquire(name, holder, priority=priority, **kw)
            assert got == want, f"seed {seed} tail: acquire {holder}"
            wait_ids[f"{name}\0{holder}"] = got.wait_id
        assert backend.status(name) == ref.status(now, name)
        assert [w.holder for w in backend.status(name).waiters] == ["h5", "h4"]
        seen.add("reordered")
        before = len(ref.woken)
        assert backend.release(name, "h2", None) == ref.release(now, name, "h2", None) is True
        assert [w[1] for w in ref.woken[before:]] == ["h5"]
        _expect(ref, before, name, wait_ids, expected)
        # And a group whose releases skip a waiter of a full key (per_key 1, total 3): h3
        # waits for k1, h7 for the total; k1's holder stays, k2's leaves: h7 goes first.
        # (Everything of the groups above has lapsed by then.)
        clock[0] += max(GROUP_TTLS) + 1
        now = clock[0]
        name = GROUPS[seed % len(GROUPS)]
        group = {"limit": 3, "per_key": 1, "ttl": 30.0, "wait_ttl": 30.0, "enqueue": True}
        for holder, key in (("h1", "k1"), ("h2", "k2"), ("h3", "k1"), ("h4", "k3"), ("h7", "k2")):
            want = ref.acquire(now, name, holder, key=key, **group)
            got = backend.acquire(name, holder, key=key, **group)
            assert got == want, f"seed {seed} group tail: acquire {holder}"
            if got.wait_id is not None:
                wait_ids[f"{name}\0{holder}"] = got.wait_id
        assert [w.holder for w in backend.status(name).waiters] == ["h3", "h7"]
        refused = _outcome(backend.acquire, name, "h5", key="k3", **{**group, "per_key": 2})
        other = {**group, "per_key": 2}
        assert refused == _outcome(ref.acquire, now, name, "h5", key="k3", **other)
        assert isinstance(refused, str) and "per_key=1 total=3" in refused
        before = len(ref.woken)
        lines = _line(ref, now)
        assert backend.release(name, "h2", None) == ref.release(now, name, "h2", None) is True
        assert [w[1] for w in ref.woken[before:]] == ["h7"]
        assert _skipped(ref, lines)
        seen.add("skipped")  # whether or not the random steps above skipped one
        _expect(ref, before, name, wait_ids, expected)
        assert backend.status(name) == ref.status(now, name)
        assert [w.holder for w in backend.status(name).waiters] == ["h3"]
        # Every hand-over woke exactly its waiter, once, in commit order, with its grant.
        deadline = time.monotonic() + 10
        while len(heard) < len(expected) and time.monotonic() < deadline:
            for notify in listen.notifies(timeout=0.2):
                heard.append(notify.payload)
        for notify in listen.notifies(timeout=0.3):  # an extra one: a spurious wake-up
            heard.append(notify.payload)
        got_wakeups = [_parse(p) for p in heard]
        want_wakeups = list(expected)
        for a, b in unordered:
            got_wakeups[a:b] = sorted(got_wakeups[a:b])
            want_wakeups[a:b] = sorted(want_wakeups[a:b])
        assert got_wakeups == want_wakeups
        assert expected, "the sequence should include hand-overs"
        assert seen == {
            "refused", "changed", "unchanged", "reordered", "skipped", "refused group"
        }, seen
        assert taken, "the sequence should include callback deliveries"
    finally:
        listen.close()
        client.close()


def _outcome(fn: Any, *args: Any, **kwargs: Any) -> Any:
    """The answer, or the message of an InvalidArgument (a refused limit)."""
    try:
        return fn(*args, **kwargs)
    except turnstile.InvalidArgument as exc:
        return str(exc)


def _expect(
    ref: Reference,
    before: int,
    name: str,
    wait_ids: dict[str, int],
    expected: list[tuple[str, int, int, float, float]],
) -> None:
    for key, holder, token, acquired_at, expires_at in ref.woken[before:]:
        seq = wait_ids[f"{name}\0{holder}"]
        expected.append((key, seq, token, acquired_at, expires_at))


def _by_grant(delivery: Any) -> tuple[str, int]:
    return delivery.name, delivery.token


def _expect_any(
    ref: Reference,
    before: int,
    wait_ids: dict[str, int],
    expected: list[tuple[str, int, int, float, float]],
) -> None:
    """Like _expect, for a step over every name (the wake key names the name)."""
    keys = {pg.wake_key(n, h): n for n in NAMES for h in GROUP_HOLDERS}
    for key, holder, token, acquired_at, expires_at in ref.woken[before:]:
        seq = wait_ids[f"{keys[key]}\0{holder}"]
        expected.append((key, seq, token, acquired_at, expires_at))


def _parse(payload: str) -> tuple[str, int, int, float, float]:
    key, seq, token, acquired_at, expires_at = payload.split(" ")
    return key, int(seq), int(token), float(acquired_at), float(expires_at)
