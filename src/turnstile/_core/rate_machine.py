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
        return not self.waiters and self.tat <= now and not self.admitted


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
    state.waiters = [w for w in state.waiters if w.expires_at > now]
    cutoff = now - state.per
    if state.admitted and state.admitted[0] <= cutoff:
        state.admitted = [t for t in state.admitted if t > cutoff]


def slot(state: RateState, position: int, now: float) -> float:
    """When the ``position``-th waiter (0 = next) is due, on the store's clock."""
    return max(now, state.tat - state.tolerance) + position * state.interval


def _admit(state: RateState, now: float) -> None:
    state.tat = max(state.tat, now) + state.interval
    state.admitted.append(now)
    if len(state.admitted) > MAX_RECENT:
        del state.admitted[: len(state.admitted) - MAX_RECENT]


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
    if state.idle(now) or (not state.waiters and state.tat <= now):
        state.rate, state.per, state.burst = spec
    elif current != spec:
        raise rate_conflict(name, current, spec)
    index = next((i for i, w in enumerate(state.waiters) if w.holder == holder), None)
    conforms = now >= state.tat - state.tolerance
    if index == 0 and conforms:
        del state.waiters[0]
        _admit(state, now)
        return RateResult(True, None, now, 0.0, state.tat)
    if index is None and not state.waiters and conforms:
        _admit(state, now)
        return RateResult(True, None, now, 0.0, state.tat)
    if index is None:
        if not enqueue:
            return RateResult(
                False, None, now, slot(state, len(state.waiters), now) - now, state.tat
            )
        index = ranking.join(
            state.waiters, RateWaiter(holder, now, 0.0), now, ranking.lead(priority, ageing)
        )
        if index == 0 and conforms:  # it ranks ahead of everyone and its slot has come
            del state.waiters[0]
            _admit(state, now)
            return RateResult(True, None, now, 0.0, state.tat)
    due = slot(state, index, now)
    state.waiters[index].expires_at = due + grace
    return RateResult(False, index, now, max(0.0, due - now), state.tat)


def leave(state: RateState, *, holder: str, now: float) -> bool:
    """Give up a place in line (a caller that timed out). False if it had none."""
    purge(state, now)
    before = len(state.waiters)
    state.waiters = [w for w in state.waiters if w.holder != holder]
    return len(state.waiters) != before


def status(state: RateState, *, name: str, now: float) -> RateStatus:
    purge(state, now)
    waiters = tuple(
        RateWaiterInfo(w.holder, i, w.joined_at, slot(state, i, now))
        for i, w in enumerate(state.waiters)
    )
    in_use = not state.idle(now)
    return RateStatus(
        name=name,
        rate=state.rate if in_use else None,
        per=state.per if in_use else None,
        burst=state.burst if in_use else None,
        waiters=waiters,
        admitted=tuple(state.admitted),
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
