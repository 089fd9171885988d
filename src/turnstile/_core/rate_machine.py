"""The reference state machine of one rate limit: admissions that wait in line, with no I/O.

A rate limit admits at most ``burst`` at once from idle and at most ``rate + burst`` in any
window of ``per`` seconds, by the store's clock. It is GCRA (the generic cell rate
algorithm, "virtual scheduling"): the emission interval is ``T = per / rate`` and the
tolerance ``tau = (burst - 1) * T``; the name keeps ``tat``, the theoretical arrival time of
the next admission. An admission at ``now`` conforms when ``now >= tat - tau``, and moves
``tat`` to ``max(tat, now) + T``. (In any window of length ``L`` GCRA admits at most
``floor((L + tau) / T) + 1`` = ``L / per * rate + burst``: ``rate + burst`` per ``per``.)

Unlike a limiter that only says yes or no, callers **wait in line**, in arrival order:

* a caller that conforms while nobody waits is admitted at once;
* otherwise it joins the back of the line (or keeps its place), and learns its **slot**:
  the ``k``-th in line (0 = next) is due at ``tat - tau + k * T``. It sleeps until then (no
  polling: one step per admission) and asks again; the head of the line is admitted as soon
  as its slot has come. A caller behind a head that has not come back waits for it: the
  order is kept;
* a waiting entry lasts until ``grace`` after its slot: a waiter that died (stopped asking)
  is dropped then, and the line moves on.

The state is tiny and lives only while it matters: an idle name (nobody in line, ``tat`` in
the past) keeps nothing but what ``status`` shows of recent admissions, which expires after
``per`` seconds.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from ..errors import LimitConflict
from . import ranking
from .records import RateResult, RateStatus, RateWaiterInfo

# How long a waiting entry lasts past its slot without its holder asking: covers a waiter
# woken a little late (a busy machine) and the round trip of its step.
DEFAULT_GRACE = 2.0
# Recent admission times kept for status (and for checking the window bound): at most this
# many, and none older than ``per``.
MAX_RECENT = 10_000


@dataclass(slots=True)
class RateWaiter:
    holder: str
    joined_at: float
    expires_at: float
    rank: int = 0  # the line's order (_core/ranking.py): smallest first


@dataclass(slots=True)
class RateState:
    rate: int = 1
    per: float = 1.0
    burst: int = 1
    tat: float = 0.0
    waiters: list[RateWaiter] = field(default_factory=list)
    admitted: list[float] = field(default_factory=list)  # recent admission times, in order

    @property
    def interval(self) -> float:
        return self.per / self.rate

    @property
    def tolerance(self) -> float:
        return (self.burst - 1) * self.interval

    def idle(self, now: float) -> bool:
        return not self.has_waiters() and self.tat <= now and not self.has_admissions()

    # -- the line and the recent admissions: every step reaches them only through these
    # methods, so a store may keep them elsewhere (the SQLite store reads and writes its
    # rows as the step goes: stores/sqlite/rate_store.py). The lists here are the reference.
    def has_waiters(self) -> bool:
        return bool(self.waiters)

    def line_length(self) -> int:
        return len(self.waiters)

    def position(self, holder: str) -> int | None:
        """How many entries stand before ``holder``'s (None: it has none)."""
        return ranking.position(self.waiters, holder)

    def purge_waiters(self, now: float) -> None:
        self.waiters = [w for w in self.waiters if w.expires_at > now]

    def drop_waiter(self, holder: str) -> bool:
        """Take ``holder``'s entry out of the line; whether it had one."""
        return ranking.drop(self.waiters, holder)

    def join_line(self, row: RateWaiter, now: float, lead: int) -> int:
        """Put a new entry in line by rank (``ranking.join``); its position."""
        return ranking.join(self.waiters, row, now, lead)

    def set_expiry(self, holder: str, expires_at: float) -> None:
        """Set the expiry of ``holder``'s entry (it has one)."""
        for w in self.waiters:
            if w.holder == holder:
                w.expires_at = expires_at
                return

    def line(self) -> list[RateWaiter]:
        """Every entry, front to back."""
        return list(self.waiters)

    def has_admissions(self) -> bool:
        return bool(self.admitted)

    def trim_admissions(self, cutoff: float) -> None:
        """Forget the admissions at or before ``cutoff``."""
        if self.admitted and self.admitted[0] <= cutoff:
            self.admitted = [t for t in self.admitted if t > cutoff]

    def record_admission(self, at: float) -> None:
        self.admitted.append(at)
        if len(self.admitted) > MAX_RECENT:
            del self.admitted[: len(self.admitted) - MAX_RECENT]

    def admissions(self) -> list[float]:
        """The recent admissions kept (at most MAX_RECENT, the newest), oldest first."""
        return list(self.admitted)


def rate_conflict(
    name: str, current: tuple[int, float, int], asked: tuple[int, float, int]
) -> LimitConflict:
    return LimitConflict(
        f"{name!r} is a rate limit of {_shown(current)} while it is in use; this call asked "
        f"for {_shown(asked)}. A name has one rate: ask with {_shown(current)}, or wait "
        "until it is idle",
    )


def _shown(spec: tuple[int, float, int]) -> str:
    rate, per, burst = spec
    return f"rate={rate} per={per:g} burst={burst}"


def purge(state: RateState, now: float) -> None:
    state.purge_waiters(now)
    state.trim_admissions(now - state.per)


def slot(state: RateState, position: int, now: float) -> float:
    """When the ``position``-th waiter (0 = next) is due, on the store's clock."""
    return max(now, state.tat - state.tolerance) + position * state.interval


def _admit(state: RateState, now: float) -> None:
    state.tat = max(state.tat, now) + state.interval
    state.record_admission(now)


def acquire(
    state: RateState,
    *,
    name: str,
    holder: str,
    rate: int,
    per: float,
    burst: int,
    enqueue: bool,
    grace: float,
    now: float,
    priority: int = 0,
    ageing: float | None = None,
) -> RateResult:
    """One step: admit, or join / keep a place in line and answer the slot. Idempotent per
    ``holder`` while it waits. Raises :func:`rate_conflict` when the busy name has another
    rate (an idle name takes the caller's).

    A new waiting entry takes its place by ``priority`` (larger first, FIFO within a
    level, ``ageing`` seconds per level: _core/ranking.py); those it passes get later
    slots (they learn them when they come back at their old one)."""
    purge(state, now)
    spec = (rate, per, burst)
    current = (state.rate, state.per, state.burst)
    waiting = state.has_waiters()
    if not waiting and state.tat <= now:  # idle, or only recent admissions: the caller's rate
        state.rate, state.per, state.burst = spec
    elif current != spec:
        raise rate_conflict(name, current, spec)
    index = state.position(holder) if waiting else None
    conforms = now >= state.tat - state.tolerance
    if index == 0 and conforms:
        state.drop_waiter(holder)
        _admit(state, now)
        return RateResult(True, None, now, 0.0, state.tat)
    if index is None and not waiting and conforms:
        _admit(state, now)
        return RateResult(True, None, now, 0.0, state.tat)
    if index is None:
        if not enqueue:
            return RateResult(
                False, None, now, slot(state, state.line_length(), now) - now, state.tat
            )
        index = state.join_line(
            RateWaiter(holder, now, 0.0), now, ranking.lead(priority, ageing)
        )
        if index == 0 and conforms:  # it ranks ahead of everyone and its slot has come
            state.drop_waiter(holder)
            _admit(state, now)
            return RateResult(True, None, now, 0.0, state.tat)
    due = slot(state, index, now)
    state.set_expiry(holder, due + grace)
    return RateResult(False, index, now, max(0.0, due - now), state.tat)


def leave(state: RateState, *, holder: str, now: float) -> bool:
    """Give up a place in line (a caller that timed out). False if it had none."""
    purge(state, now)
    return state.drop_waiter(holder)


def status(state: RateState, *, name: str, now: float) -> RateStatus:
    purge(state, now)
    waiters = tuple(
        RateWaiterInfo(w.holder, i, w.joined_at, slot(state, i, now))
        for i, w in enumerate(state.line())
    )
    in_use = not state.idle(now)
    return RateStatus(
        name=name,
        rate=state.rate if in_use else None,
        per=state.per if in_use else None,
        burst=state.burst if in_use else None,
        waiters=waiters,
        admitted=tuple(state.admissions()),
        next_slot=slot(state, 0, now) if in_use else now,
        now=now,
    )


def max_in_window(times: list[float], window: float) -> int:
    """The most admissions in any closed window ``[t - window, t]``: what the guarantee
    bounds by ``rate + burst`` for ``window = per`` (and by ``burst`` at one instant)."""
    best = 0
    start = 0
    ordered = sorted(times)
    for end, t in enumerate(ordered):
        while ordered[start] < t - window:
            start += 1
        best = max(best, end - start + 1)
    return best


def check_spec(rate: int, per: float, burst: int) -> None:
    if not math.isfinite(per / rate):
        raise ValueError("rate and per must give a finite interval")
