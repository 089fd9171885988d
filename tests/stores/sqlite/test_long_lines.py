"""The SQLite store keeps a name's line in its table and reaches it through indexes
(``StoredName``), where it used to read the whole line into the reference's list at every
step (59 ms per hand-over with 10,000 waiters, benchmarks/results/scale.md). Shown here:

* it still answers as the reference list, step for step, on everything a line has: long
  lines read in pages, priorities and ageing, semaphore groups whose full keys are skipped,
  callback waiters and their deliveries, expiries, limits changed, refusals, and the
  wake-ups each step sends;
* the work of a hand-over does not grow with the line: SQLite's own count of virtual
  machine steps (``set_progress_handler``) for a release and the claim of the head is the
  same with 2 and with 3,000 waiters behind.

A rate limit's line and recent admissions (``StoredRate``) are held to the same two
promises.
"""

from __future__ import annotations

import random
import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any

from turnstile._core import lock_machine
from turnstile.errors import InvalidArgument
from turnstile.stores.sqlite.lock_store import SQLiteStore

Step = Callable[[lock_machine.NameState, float, Callable[[], int]], tuple[Any, list[str]]]


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


class Pair:
    """The store and the reference (plain NameState lists, one token counter), fed the same
    steps; every answer and every wake-up is compared."""

    def __init__(self, path: str, clock: Clock) -> None:
        self.clock = clock
        self.store = SQLiteStore(path, clock=clock)
        self.signals: list[tuple[str, str]] = []
        self.store.wake.signal = lambda name, holder: self.signals.append((name, holder))
        self.states: dict[str, lock_machine.NameState] = {}
        self.last = 0

    def _tokens(self) -> Callable[[], int]:
        now = self.clock()

        def next_token() -> int:
            self.last = lock_machine.clock_token(self.last, now)
            return self.last

        return next_token

    def step(self, name: str, fn: Step) -> Any:
        state = self.states.setdefault(name, lock_machine.NameState())
        try:
            want, woken = fn(state, self.clock(), self._tokens())
        except InvalidArgument as exc:
            want, woken = ("refused", str(exc)), []
        self.signals.clear()
        try:
            got = self.store._mutate(name, fn)
        except InvalidArgument as exc:
            got = ("refused", str(exc))
        assert got == want
        assert self.signals == [(name, h) for h in woken]
        return want

    def check_status(self, names: list[str]) -> None:
        now = self.clock()
        for name in names:
            state = self.states.setdefault(name, lock_machine.NameState())
            assert self.store.status(name) == lock_machine.status(state, name=name, now=now)


def test_the_stored_line_answers_as_the_reference_list(tmp_path: Path) -> None:
    rng = random.Random(7)
    clock = Clock(1_800_000_000.0)
    pair = Pair(str(tmp_path / "lines.db"), clock)
    names = ["lock", "sem", "group"]
    holders = [f"h{i}" for i in range(150)]  # lines longer than the store's first pages
    keys = ["k0", "k1", "k2", "k3"]
    seen: set[str] = set()
    deepest = 0
    try:
        for n in range(2500):
            clock.now += rng.choice([0.0, 0.0, 0.001, 0.01, 0.1, 0.3])
            if rng.random() < 0.02:
                clock.now -= 0.05  # the host clock steps back: stamps stay in arrival order
            name, holder = rng.choice([*names, "group"]), rng.choice(holders)
            op = rng.random()
            if op < 0.55:
                group = name == "group"
                limit = {"lock": 1, "sem": rng.choice([2, 3, 3]), "group": 4}[name]
                if rng.random() < 0.03:
                    limit += 1  # a newcomer naming another limit is refused
                callback = f"cb-{holder}-{n}" if rng.random() < 0.15 else None
                kwargs: dict[str, Any] = dict(
                    name=name,
                    holder=holder,
                    limit=limit,
                    ttl=rng.choice([1.0, 8.0]),
                    wait_ttl=rng.choice([0.5, 60.0, 60.0]),
                    enqueue=callback is not None or rng.random() < 0.9,
                    callback=callback,
                    priority=rng.choice([0, 0, 0, 1, -1, 2]),
                    ageing=rng.choice([None, None, 0.5]),
                    key=rng.choice(keys) if group else None,
                    per_key=rng.choice([1, 1, 2]) if group else None,
                )
                answer = pair.step(
                    name, lambda s, now, t, kw=kwargs: lock_machine.acquire(
                        s, now=now, next_token=t, **kw
                    )
                )
                if isinstance(answer, tuple):
                    seen.add("refused")
                elif answer.grant is not None:
                    seen.add("granted")
                if not isinstance(answer, tuple) and answer.position is not None:
                    deepest = max(deepest, answer.position)
                    if answer.position >= 40:  # past the store's first two pages
                        seen.add("deep in line")
            elif op < 0.75:
                state = pair.states.get(name)
                held = state.holders.get(holder) if state else None
                token = held.token if held is not None and rng.random() < 0.7 else None
                pair.step(
                    name, lambda s, now, t, h=holder, tok=token: lock_machine.release(
                        s, holder=h, token=tok, now=now, next_token=t
                    )
                )
            elif op < 0.83:
                state = pair.states.get(name)
                held = state.holders.get(holder) if state else None
                token = held.token if held is not None else 1

                def renew(
                    s: lock_machine.NameState, now: float, t: Callable[[], int],
                    h: str = holder, tok: int = token, nm: str = name,
                ) -> tuple[Any, list[str]]:
                    return lock_machine.renew(s, name=nm, holder=h, token=tok, ttl=8.0, now=now), []

                pair.step(name, renew)
            elif op < 0.88:
                limit = {"lock": 1, "sem": rng.choice([1, 2, 3, 5]), "group": rng.choice([2, 4, 6])}
                pair.step(
                    name, lambda s, now, t, lim=limit[name]: lock_machine.set_limit(
                        s, limit=lim, now=now, next_token=t
                    )
                )
            elif op < 0.95:
                most = rng.choice([1, 3])
                taken = pair.step(
                    name, lambda s, now, t, nm=name, m=most: (
                        lock_machine.take_deliveries(
                            s, name=nm, now=now, lease=0.5, max_count=m, next_token=t
                        )
                    )
                )
                if taken:
                    seen.add("delivery taken")
            else:
                state = pair.states.get(name)
                pending = [h.token for h in state.holders.values() if h.pending] if state else []
                token = rng.choice(pending) if pending else 1
                outcome = rng.choice(lock_machine.OUTCOMES)
                pair.step(
                    name, lambda s, now, t, tok=token, o=outcome: lock_machine.settle_delivery(
                        s, token=tok, outcome=o, retry_in=0.2, now=now, next_token=t
                    )
                )
            pair.check_status(names)
        assert {"refused", "granted", "deep in line", "delivery taken"} <= seen, (seen, deepest)
        with sqlite3.connect(pair.store.path) as conn:  # the names row invariant holds
            named = {r[0] for r in conn.execute("SELECT name FROM turnstile_names")}
            used = {
                r[0]
                for r in conn.execute(
                    "SELECT name FROM turnstile_holders UNION SELECT name FROM turnstile_waiters"
                )
            }
        assert named == used
    finally:
        pair.store.close()


def _vm_steps(store: SQLiteStore, call: Callable[[], object]) -> int:
    """SQLite virtual machine instructions run by ``call`` (in tens)."""
    count = [0]

    def tick() -> int:
        count[0] += 1
        return 0

    conn = store._conn()
    conn.set_progress_handler(tick, 10)
    try:
        call()
    finally:
        conn.set_progress_handler(None, 10)
    return count[0]


def _hand_over_work(tmp_path: Path, waiters: int) -> list[int]:
    store = SQLiteStore(str(tmp_path / f"line-{waiters}.db"))
    try:
        first = store.acquire("n", "holder", 1, 600.0, 600.0, True).grant
        assert first is not None
        for i in range(waiters):
            store.acquire("n", f"w{i}", 1, 600.0, 600.0, True)
        holder, token = "holder", first.token
        work = []
        for i in range(5):
            head = f"w{i}"
            granted: list[lock_machine.Grant] = []

            def hand_over(
                h: str = holder,
                t: int = token,
                nxt: str = head,
                granted: list[lock_machine.Grant] = granted,
            ) -> None:
                assert store.release("n", h, t)
                result = store.acquire("n", nxt, 1, 600.0, 600.0, True)
                assert result.grant is not None
                granted.append(result.grant)

            work.append(_vm_steps(store, hand_over))
            holder, token = head, granted[0].token
            store.acquire("n", f"w{waiters + i}", 1, 600.0, 600.0, True)  # the line stays long
        return work
    finally:
        store.close()


def test_a_hand_over_does_the_same_work_whatever_the_line(tmp_path: Path) -> None:
    short = max(_hand_over_work(tmp_path, 2))
    long = max(_hand_over_work(tmp_path, 3000))
    # Reading the whole line made this about 240 times the short line's work.
    assert long <= short * 1.5 + 5, (short, long)


def test_a_rate_limits_stored_line_answers_as_the_reference_list(tmp_path: Path) -> None:
    """The same for a rate limit's line and its recent admissions (``StoredRate``): slots
    by position, priorities, entries lapsing past their grace, callers leaving, a newcomer
    naming another rate refused, the name forgotten when idle."""
    from turnstile._core import rate_machine
    from turnstile.stores.sqlite.rate_store import SQLiteRates

    rng = random.Random(11)
    clock = Clock(1_800_000_000.0)
    store = SQLiteStore(str(tmp_path / "rates.db"), clock=clock)
    rates = SQLiteRates(store)
    states: dict[str, rate_machine.RateState] = {}
    holders = [f"h{i}" for i in range(300)]
    seen: set[str] = set()
    try:
        for _ in range(3000):
            clock.now += rng.choice([0.0, 0.001, 0.01, 0.05, 0.05, 0.2]) + (
                40.0 if rng.random() < 0.002 else 0.0  # everybody's entry lapses
            )
            name = rng.choice(["slow", "fast"])
            holder = rng.choice(holders)
            state = states.setdefault(name, rate_machine.RateState())
            now = clock()
            if rng.random() < 0.8:
                spec = {"slow": (2, 1.0, 1), "fast": (50, 1.0, 5)}[name]
                if rng.random() < 0.03:
                    spec = (spec[0] + 1, spec[1], spec[2])
                kwargs: dict[str, Any] = dict(
                    rate=spec[0],
                    per=spec[1],
                    burst=spec[2],
                    enqueue=rng.random() < 0.9,
                    grace=rng.choice([0.5, 30.0]),
                    priority=rng.choice([0, 0, 0, 1, -1]),
                    ageing=rng.choice([None, None, 0.5]),
                )
                try:
                    want: Any = rate_machine.acquire(
                        state, name=name, holder=holder, now=now, **kwargs
                    )
                except InvalidArgument as exc:
                    want = ("refused", str(exc))
                try:
                    got: Any = rates.acquire(name, holder, **kwargs)
                except InvalidArgument as exc:
                    got = ("refused", str(exc))
                if isinstance(want, tuple):
                    seen.add("refused")
                elif want.admitted:
                    seen.add("admitted")
                elif want.position is not None and want.position >= 40:
                    seen.add("deep in line")
            else:
                want = rate_machine.leave(state, holder=holder, now=now)
                got = rates.leave(name, holder)
            assert got == want
            for n, s in states.items():
                assert rates.status(n) == rate_machine.status(s, name=n, now=now)
        assert {"refused", "admitted", "deep in line"} <= seen, seen
    finally:
        store.close()


def _admission_work(tmp_path: Path, waiters: int) -> list[int]:
    from turnstile.stores.sqlite.rate_store import SQLiteRates

    clock = Clock(1_800_000_000.0)
    store = SQLiteStore(str(tmp_path / f"rate-{waiters}.db"), clock=clock)
    rates = SQLiteRates(store)
    try:
        assert rates.acquire("r", "first", 1, 1.0, 1, True, 1e5).admitted
        for i in range(waiters):
            assert not rates.acquire("r", f"w{i}", 1, 1.0, 1, True, 1e5).admitted
        work = []
        for i in range(5):
            clock.now += 1.0  # the head's slot has come
            admitted: list[bool] = []

            def admit(head: str = f"w{i}", admitted: list[bool] = admitted) -> None:
                admitted.append(rates.acquire("r", head, 1, 1.0, 1, True, 1e5).admitted)

            work.append(_vm_steps(store, admit))
            assert admitted == [True]
            rates.acquire("r", f"w{waiters + i}", 1, 1.0, 1, True, 1e5)  # the line stays long
        return work
    finally:
        store.close()


def test_an_admission_does_the_same_work_whatever_the_rate_limits_line(tmp_path: Path) -> None:
    short = max(_admission_work(tmp_path, 2))
    long = max(_admission_work(tmp_path, 3000))
    assert long <= short * 1.5 + 5, (short, long)


def test_every_method_that_reads_the_reference_lists_is_answered_by_the_stored_state() -> None:
    """The stored states leave the reference's lists empty: a method of the reference that
    reads them and is not overridden would answer from an empty line, silently. So every
    such method must have the stored state's own."""
    import inspect

    from turnstile._core import rate_machine
    from turnstile.stores.sqlite.lock_store import StoredName
    from turnstile.stores.sqlite.rate_store import StoredRate

    pairs = [
        (lock_machine.NameState, StoredName, ("self.waiters",)),
        (rate_machine.RateState, StoredRate, ("self.waiters", "self.admitted")),
    ]
    for reference, stored, lists in pairs:
        reading = {
            name
            for name, member in vars(reference).items()
            if inspect.isfunction(member)
            and not name.startswith("__")  # the dataclass's own, made without source
            and any(attr in inspect.getsource(member) for attr in lists)
        }
        assert reading, reference
        assert reading <= set(vars(stored)), (stored, sorted(reading - set(vars(stored))))
