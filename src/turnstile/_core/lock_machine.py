"""The reference state machine of one name: holders, waiters, grants.

This is the whole algorithm of a fair leased semaphore, with no I/O. The memory and SQLite
backends run it directly inside their critical section / transaction; the Redis scripts and
PostgreSQL queries implement the same steps, and the contract suite holds all of them to it.

Invariants, after every step, at store time ``now``:

* ``len(holders) <= limit`` counting only unexpired leases (SPEC guarantee 1);
* waiters are kept in the order they first asked and granted from the front (guarantee 2);
* a free slot never coexists with a live waiter: every step first drops expired holders and
  waiters, then *promotes* waiters from the front while slots are free. A waiter promoted on
  someone else's behalf (a release, an expiry) holds an **unclaimed** grant that lasts only as
  long as its waiting entry would have (``wait_ttl``), so a waiter whose process died can
  stall the line for at most that long; its next ``acquire`` claims the grant for its full
  ``ttl``.

A name has **one limit** while it has holders or waiters: the limit of the acquire that
found it idle (an idle name keeps no state), changed only by :func:`set_limit`. An acquire
by a newcomer (neither holding nor waiting) that names another limit is refused
(:func:`limit_conflict`), so a lock and a semaphore that share a name by mistake can never
hold it together. Holders and waiters already there keep their place whatever limit they
name: the name's limit governs their grants.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

from ..errors import LimitConflict
from .records import AcquireResult, Grant, HolderInfo, Status, WaiterInfo


def limit_conflict(name: str, current: int, asked: int) -> LimitConflict:
    """The refusal of an acquire that names ``asked`` on a busy name whose limit is
    ``current`` (every store raises this very message)."""
    return LimitConflict(
        f"{name!r} has limit {current} while it has holders or waiters; this call asked for "
        f"limit {asked}. A name has one limit: ask with limit {current}, or change it with "
        f"Semaphore.set_limit({asked}) (HTTP: POST /v1/semaphores/limit; CLI: turnstile "
        f"limit NAME {asked})",
        current,
        asked,
    )


def clock_token(last: int, now: float) -> int:
    """Next fencing token: above ``last`` and at least the store clock in microseconds.

    Combining a counter with the clock means tokens never repeat even if the store forgets its
    counter (a crash before the counter reached disk, a Redis restart without persistence),
    as long as the store's clock does not step back past the forgotten tokens.
    """
    return max(last + 1, math.floor(now * 1_000_000))


@dataclass(slots=True)
class HolderRow:
    holder: str
    token: int
    acquired_at: float
    expires_at: float
    claimed: bool


@dataclass(slots=True)
class WaiterRow:
    holder: str
    ttl: float
    wait_ttl: float
    joined_at: float
    expires_at: float


@dataclass(slots=True)
class NameState:
    limit: int = 1
    holders: dict[str, HolderRow] = field(default_factory=dict)
    waiters: list[WaiterRow] = field(default_factory=list)

    @property
    def empty(self) -> bool:
        return not self.holders and not self.waiters


def purge(state: NameState, now: float) -> bool:
    """Drop expired leases and waiting entries. Returns whether anything changed."""
    changed = False
    for key in [k for k, h in state.holders.items() if h.expires_at <= now]:
        del state.holders[key]
        changed = True
    live = [w for w in state.waiters if w.expires_at > now]
    if len(live) != len(state.waiters):
        state.waiters = live
        changed = True
    return changed


def promote(
    state: NameState, now: float, next_token: Callable[[], int], claimant: str | None
) -> list[str]:
    """Grant free slots to waiters from the front. Returns the holders granted *for* someone
    else (to be woken); ``claimant`` (the caller) gets a claimed grant at once."""
    woken: list[str] = []
    while state.waiters and len(state.holders) < state.limit:
        w = state.waiters.pop(0)
        claimed = w.holder == claimant
        lease = w.ttl if claimed else min(w.ttl, w.wait_ttl)
        state.holders[w.holder] = HolderRow(w.holder, next_token(), now, now + lease, claimed)
        if not claimed:
            woken.append(w.holder)
    return woken


def retry_after(state: NameState, now: float) -> float | None:
    if not state.holders:
        return None
    return max(0.0, min(h.expires_at for h in state.holders.values()) - now)


def grant_of(name: str, row: HolderRow) -> Grant:
    return Grant(name, row.holder, row.token, row.acquired_at, row.expires_at)


def acquire(
    state: NameState,
    *,
    name: str,
    holder: str,
    limit: int,
    ttl: float,
    wait_ttl: float,
    enqueue: bool,
    now: float,
    next_token: Callable[[], int],
) -> tuple[AcquireResult, list[str]]:
    """One step of acquiring: hold, join or keep one's place in line, or (``enqueue=False``)
    take a free slot only if nobody waits. Idempotent per ``holder``.

    Raises :func:`limit_conflict` (changing nothing but the purge) when a newcomer names
    another limit than the busy name's; an idle name takes the caller's limit."""
    purge(state, now)
    if state.empty:
        state.limit = limit
    elif state.limit != limit and not (
        holder in state.holders or any(w.holder == holder for w in state.waiters)
    ):
        raise limit_conflict(name, state.limit, limit)
    # Expiries free slots for the waiters in front; the caller may be one
    # of them and then claims its grant below, so it is not among those to be woken.
    woken = [h for h in promote(state, now, next_token, None) if h != holder]
    mine = state.holders.get(holder)
    if mine is not None:
        if not mine.claimed:
            # Our own grant, handed over while we waited: claim it for the full ttl.
            mine.claimed = True
            mine.expires_at = now + ttl
        return AcquireResult(grant_of(name, mine), None, now, None), woken
    index = next((i for i, w in enumerate(state.waiters) if w.holder == holder), None)
    if index is not None:
        w = state.waiters[index]
        w.ttl, w.wait_ttl, w.expires_at = ttl, wait_ttl, now + wait_ttl
    elif enqueue or (not state.waiters and len(state.holders) < state.limit):
        state.waiters.append(WaiterRow(holder, ttl, wait_ttl, now, now + wait_ttl))
    woken += promote(state, now, next_token, holder)
    mine = state.holders.get(holder)
    if mine is not None:
        return AcquireResult(grant_of(name, mine), None, now, None), woken
    position = next((i for i, w in enumerate(state.waiters) if w.holder == holder), None)
    return AcquireResult(None, position, now, retry_after(state, now)), woken


def release(
    state: NameState, *, holder: str, token: int | None, now: float, next_token: Callable[[], int]
) -> tuple[bool, list[str]]:
    """Release ``holder``'s lease (only the one with ``token``, if given) and, without a token,
    its waiting entry. A stale or repeated release changes nothing. Returns (released, woken)."""
    purge(state, now)
    released = False
    row = state.holders.get(holder)
    if row is not None and (token is None or row.token == token):
        del state.holders[holder]
        released = True
    if token is None:
        before = len(state.waiters)
        state.waiters = [w for w in state.waiters if w.holder != holder]
        released = released or len(state.waiters) != before
    return released, promote(state, now, next_token, None)


def set_limit(
    state: NameState, *, limit: int, now: float, next_token: Callable[[], int]
) -> tuple[int | None, list[str]]:
    """Change the limit of a busy name, for the next grants: a raised limit grants waiters
    from the front at once (returned, to be woken); a lowered one never revokes a lease (no
    grant until fewer than ``limit`` hold). Returns (the limit replaced, woken); ``None`` and
    nothing changed when the name is idle (it keeps no state: the next acquire's limit
    applies)."""
    purge(state, now)
    if state.empty:
        return None, []
    previous = state.limit
    state.limit = limit
    return previous, promote(state, now, next_token, None)


def renew(
    state: NameState, *, name: str, holder: str, token: int, ttl: float, now: float
) -> Grant | None:
    """Extend the lease ``(holder, token)`` to ``now + ttl``; ``None`` if it is gone (lost)."""
    row = state.holders.get(holder)
    if row is None or row.token != token or row.expires_at <= now:
        return None
    row.expires_at = now + ttl
    row.claimed = True
    return Grant(name, row.holder, row.token, row.acquired_at, row.expires_at)


def status(state: NameState, *, name: str, now: float) -> Status:
    holders = sorted(
        (h for h in state.holders.values() if h.expires_at > now), key=lambda h: h.token
    )
    waiters = [w for w in state.waiters if w.expires_at > now]
    return Status(
        name=name,
        limit=state.limit if not state.empty else None,
        holders=tuple(HolderInfo(h.holder, h.token, h.acquired_at, h.expires_at) for h in holders),
        waiters=tuple(
            WaiterInfo(w.holder, i, w.joined_at, w.expires_at) for i, w in enumerate(waiters)
        ),
        now=now,
    )
