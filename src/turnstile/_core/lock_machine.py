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

**Callback waiters** (:func:`acquire` with ``callback``) wait with no connection: a Step
Functions task token or an HTTP URL stands in for the process. Their grant is made in the
same step as any other (a release, an expiry, a raised limit, their own ask), but it is
*claimed* at once for the full ``ttl`` and carries a **pending delivery**: the callback text
on the holder row, which a deliverer takes (:func:`take_deliveries`, with a claim lease of its
own so a deliverer that dies mid-delivery lets another take it) and settles
(:func:`settle_delivery`: delivered, refused, which releases the grant and grants the next in
line, or retry later). A pending delivery lives exactly as long as its grant: an undelivered
grant expires like any other lease. Nobody polls for a callback waiter, so expiries on a name
with callback waiters are acted on by the deliverer's :func:`take_deliveries` sweep
(:func:`due`).

A **semaphore group** is a name with ``per_key``: every holder and waiter names a *key*
(a tenant, an account), and the name's ``limit`` is the *total*: at most ``per_key``
holders per key and at most ``limit`` in all. :func:`promote` then grants, in line order,
every waiter whose key has room while the total has room, **skipping** waiters whose key is
full: a busy key never blocks the keys behind it (no head-of-line blocking), and the
invariant becomes "no waiter that could be granted is left waiting".

A name has **one limit** while it has holders or waiters: the limit of the acquire that
found it idle (an idle name keeps no state), changed only by :func:`set_limit`. An acquire
by a newcomer (neither holding nor waiting) that names another limit is refused
(:func:`limit_conflict`), so a lock and a semaphore that share a name by mistake can never
hold it together. Holders and waiters already there keep their place whatever limit they
name: the name's limit governs their grants.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from ..errors import LimitConflict
from . import ranking
from .callbacks import callback_kind, delivery_state
from .records import AcquireResult, CallbackDelivery, Grant, HolderInfo, Status, WaiterInfo

# How a deliverer settles a delivery (settle_delivery).
DELIVERED = "delivered"
REFUSED = "refused"
RETRY = "retry"
OUTCOMES = (DELIVERED, REFUSED, RETRY)


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


def group_conflict(
    name: str, current: tuple[int, int | None], asked: tuple[int, int | None]
) -> LimitConflict:
    """The refusal of an acquire that names another ``per_key`` (or is a group where the name
    is a plain semaphore, or the other way round) on a busy name."""

    def shown(shape: tuple[int, int | None]) -> str:
        limit, per_key = shape
        if per_key is None:
            return f"a semaphore of limit {limit}"
        return f"a semaphore group of per_key={per_key} total={limit}"

    return LimitConflict(
        f"{name!r} is {shown(current)} while it has holders or waiters; this call asked for "
        f"{shown(asked)}. Ask with the same shape, or wait until the name is idle",
        current[0],
        asked[0],
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
    # A callback grant: the callback it is (or was) delivered to; ``pending`` until a
    # deliverer settles it; ``claimed_until`` is the deliverer's own claim on the delivery
    # (0: nobody's); ``attempts`` counts the deliverers' takes.
    callback: str | None = field(default=None, repr=False)  # holds a task token
    pending: bool = False
    claimed_until: float = 0.0
    attempts: int = 0
    key: str | None = None  # a semaphore group's key


@dataclass(slots=True)
class WaiterRow:
    holder: str
    ttl: float
    wait_ttl: float
    joined_at: float
    expires_at: float
    callback: str | None = field(default=None, repr=False)  # holds a task token
    rank: int = 0  # the line's order (_core/ranking.py): smallest first
    key: str | None = None  # a semaphore group's key


@dataclass(slots=True)
class NameState:
    """One name's limit, holders and line, in memory.

    Every step reaches the line (``waiters``, in line order) only through the methods
    below, so a store may keep it elsewhere: the SQLite store reads and writes its rows as
    the step goes (``stores/sqlite/lock_store.py``), which keeps a step on a line of any
    length to a few index lookups. The list here is the reference."""

    limit: int = 1
    holders: dict[str, HolderRow] = field(default_factory=dict)
    waiters: list[WaiterRow] = field(default_factory=list)
    per_key: int | None = None  # a semaphore group: at most this many holders per key

    # -- the line ---------------------------------------------------------------------------
    def waiter(self, holder: str) -> WaiterRow | None:
        """``holder``'s waiting entry, if it has one."""
        return next((w for w in self.waiters if w.holder == holder), None)

    def has_waiters(self) -> bool:
        return bool(self.waiters)

    def has_callback_waiter(self) -> bool:
        return any(w.callback is not None for w in self.waiters)

    def waiter_expired(self, now: float) -> bool:
        """Whether a waiting entry has expired by ``now`` (not yet purged)."""
        return any(w.expires_at <= now for w in self.waiters)

    def purge_waiters(self, now: float) -> bool:
        """Drop the waiting entries expired by ``now``; whether there were any."""
        live = [w for w in self.waiters if w.expires_at > now]
        if len(live) == len(self.waiters):
            return False
        self.waiters = live
        return True

    def line(self) -> Iterator[WaiterRow]:
        """The waiting entries front to back. The caller may drop (only) the entry just
        given before asking for the next."""
        index = 0
        while index < len(self.waiters):
            w = self.waiters[index]
            yield w
            if index < len(self.waiters) and self.waiters[index] is w:
                index += 1

    def drop_waiter(self, holder: str) -> bool:
        """Take ``holder``'s entry out of the line; whether it had one."""
        return ranking.drop(self.waiters, holder)

    def join_line(self, row: WaiterRow, now: float, lead: int) -> None:
        """Put a new entry in line by rank (``ranking.join``: sets its stamp and rank)."""
        ranking.join(self.waiters, row, now, lead)

    def waiter_changed(self, row: WaiterRow) -> None:
        """``row`` (an entry of this line) had its ttls, expiry or callback changed."""

    def position(self, holder: str) -> int | None:
        """How many entries stand before ``holder``'s (None: it has none)."""
        return ranking.position(self.waiters, holder)

    def live_waiters(self, now: float) -> list[WaiterRow]:
        """Every entry not expired by ``now``, front to back."""
        return [w for w in self.waiters if w.expires_at > now]

    # -- holders and room -------------------------------------------------------------------
    def key_counts(self) -> dict[str | None, int]:
        counts: dict[str | None, int] = {}
        for h in self.holders.values():
            counts[h.key] = counts.get(h.key, 0) + 1
        return counts

    def has_room(self, key: str | None, counts: dict[str | None, int] | None = None) -> bool:
        """Whether a grant to ``key`` would keep the limit (and the per-key limit)."""
        if len(self.holders) >= self.limit:
            return False
        if self.per_key is None:
            return True
        return (self.key_counts() if counts is None else counts).get(key, 0) < self.per_key

    def grantable_waiter(self) -> bool:
        """Whether a live waiter could be granted now (promote leaves none)."""
        if len(self.holders) >= self.limit:
            return False
        if self.per_key is None:
            return self.has_waiters()
        counts = self.key_counts()
        return any(self.has_room(w.key, counts) for w in self.line())

    @property
    def empty(self) -> bool:
        return not self.holders and not self.has_waiters()

    @property
    def has_callbacks(self) -> bool:
        """Whether a deliverer has anything to do here now or later: a callback waiter (its
        grant may come from an expiry nobody else acts on) or a pending delivery."""
        return any(h.pending for h in self.holders.values()) or self.has_callback_waiter()


def purge(state: NameState, now: float) -> bool:
    """Drop expired leases and waiting entries. Returns whether anything changed."""
    changed = False
    for key in [k for k, h in state.holders.items() if h.expires_at <= now]:
        del state.holders[key]
        changed = True
    return state.purge_waiters(now) or changed


def promote(
    state: NameState, now: float, next_token: Callable[[], int], claimant: str | None
) -> list[str]:
    """Grant free slots to waiters from the front (in a semaphore group: to every waiter in
    line order whose key has room, skipping those whose key is full). Returns the holders
    granted *for* someone else (to be woken); ``claimant`` (the caller) gets a claimed grant
    at once."""
    woken: list[str] = []
    if len(state.holders) >= state.limit:
        return woken
    counts = state.key_counts() if state.per_key is not None else None
    for w in state.line():
        if len(state.holders) >= state.limit:
            break
        if counts is not None:
            if not state.has_room(w.key, counts):
                continue  # its key is full: the waiters behind it go on
            counts[w.key] = counts.get(w.key, 0) + 1
        state.drop_waiter(w.holder)
        if w.callback is not None:
            # Nobody to wake and nobody to claim it: the grant is claimed for its full ttl
            # and its delivery is pending, written in this very step.
            state.holders[w.holder] = HolderRow(
                w.holder, next_token(), now, now + w.ttl, True, w.callback, True, key=w.key
            )
            continue
        claimed = w.holder == claimant
        lease = w.ttl if claimed else min(w.ttl, w.wait_ttl)
        state.holders[w.holder] = HolderRow(
            w.holder, next_token(), now, now + lease, claimed, key=w.key
        )
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
    callback: str | None = None,
    priority: int = 0,
    ageing: float | None = None,
    key: str | None = None,
    per_key: int | None = None,
) -> tuple[AcquireResult, list[str]]:
    """One step of acquiring: hold, join or keep one's place in line, or (``enqueue=False``)
    take a free slot only if nobody waits. Idempotent per ``holder``.

    A new waiting entry takes its place by ``priority`` (larger first, FIFO within a
    level; ``ageing`` seconds per level, see _core/ranking.py); asking again keeps the
    place whatever priority it names.

    With ``callback`` (always with ``enqueue``) the caller waits as a callback waiter: its
    grant, now or later, carries a pending delivery to ``callback``. Asking again with the
    same callback changes nothing but the waiting entry's expiry (a redelivered ask is
    harmless); a holder asking with another callback (a new task token) gets its current
    grant delivered there.

    With ``per_key`` the name is a semaphore group (``limit`` is its total) and the caller
    asks for ``key``; a holder id stands for one lease in a group, whatever key it names
    later.

    Raises :func:`limit_conflict` (changing nothing but the purge) when a newcomer names
    another limit than the busy name's (or another ``per_key``: :func:`group_conflict`); an
    idle name takes the caller's."""
    purge(state, now)
    if state.empty:
        state.limit, state.per_key = limit, per_key
    elif (state.limit != limit or state.per_key != per_key) and not (
        holder in state.holders or state.waiter(holder) is not None
    ):
        if state.per_key != per_key:
            raise group_conflict(name, (state.limit, state.per_key), (limit, per_key))
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
        if callback is not None and callback != mine.callback:
            mine.callback, mine.pending, mine.claimed_until, mine.attempts = (
                callback, True, 0.0, 0
            )
        return AcquireResult(grant_of(name, mine), None, now, None), woken
    w = state.waiter(holder)
    if w is not None:
        # Keeping one's place: promote above granted every waiter that could be granted,
        # so this one waits on.
        w.ttl, w.wait_ttl, w.expires_at = ttl, wait_ttl, now + wait_ttl
        if callback is not None:
            w.callback = callback
        state.waiter_changed(w)
    elif state.has_room(key):
        # A newcomer and a free slot for its key: promote above left none that a waiter
        # could take, so nobody in line can use it. Granted at once (joining and then
        # promoting would grant it the same, wherever it joined): claimed for the full ttl,
        # and for a callback waiter with its delivery pending.
        mine = HolderRow(
            holder, next_token(), now, now + ttl, True, callback, callback is not None, key=key
        )
        state.holders[holder] = mine
        return AcquireResult(grant_of(name, mine), None, now, None), woken
    elif enqueue:
        state.join_line(
            WaiterRow(holder, ttl, wait_ttl, now, now + wait_ttl, callback, key=key),
            now,
            ranking.lead(priority, ageing),
        )
    return AcquireResult(None, state.position(holder), now, retry_after(state, now)), woken


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
        released = state.drop_waiter(holder) or released
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


def due(state: NameState, now: float) -> bool:
    """Whether a step is owed to a name with callbacks: a lease or waiting entry has expired
    (which may grant a callback waiter), or a delivery is pending and nobody has claimed it
    (or a claim lapsed)."""
    if any(h.expires_at <= now for h in state.holders.values()):
        return True
    if state.waiter_expired(now):
        return True
    if state.grantable_waiter():
        # A free slot before a live waiter: left by a step that purged and then refused
        # (a limit conflict raises before promoting); the deliverer's step grants it.
        return True
    return any(h.pending and h.claimed_until <= now for h in state.holders.values())


def take_deliveries(
    state: NameState,
    *,
    name: str,
    now: float,
    lease: float,
    max_count: int,
    next_token: Callable[[], int],
) -> tuple[list[CallbackDelivery], list[str]]:
    """A deliverer's step on one name: drop what expired (an undelivered grant with it),
    grant what that freed, and claim up to ``max_count`` pending deliveries nobody holds a
    claim on, for ``lease`` seconds, oldest grant first. Returns (claimed, woken)."""
    purge(state, now)
    woken = promote(state, now, next_token, None)
    taken: list[CallbackDelivery] = []
    rows = sorted(
        (h for h in state.holders.values() if h.pending and h.claimed_until <= now),
        key=lambda h: h.token,
    )
    for row in rows[:max_count]:
        row.claimed_until = now + lease
        row.attempts += 1
        taken.append(
            CallbackDelivery(
                name,
                row.holder,
                row.token,
                row.acquired_at,
                row.expires_at,
                state.limit,
                row.callback or "",
                row.attempts,
            )
        )
    return taken, woken


def settle_delivery(
    state: NameState,
    *,
    token: int,
    outcome: str,
    retry_in: float,
    now: float,
    next_token: Callable[[], int],
) -> tuple[bool, list[str]]:
    """Settle the pending delivery of grant ``token``: ``delivered`` (done), ``refused`` (the
    callback can never be delivered: release the grant, grant the next in line) or ``retry``
    (free the claim in ``retry_in`` seconds, for another try). False, changing nothing, when
    the grant is gone or its delivery was already settled."""
    purge(state, now)
    row = next((h for h in state.holders.values() if h.token == token), None)
    if row is None or not row.pending:
        return False, promote(state, now, next_token, None)
    if outcome == DELIVERED:
        row.pending, row.claimed_until = False, 0.0
    elif outcome == REFUSED:
        del state.holders[row.holder]
    elif outcome == RETRY:
        row.claimed_until = now + retry_in
    else:
        raise ValueError(f"unknown delivery outcome {outcome!r}")
    return True, promote(state, now, next_token, None)


def status(state: NameState, *, name: str, now: float) -> Status:
    holders = sorted(
        (h for h in state.holders.values() if h.expires_at > now), key=lambda h: h.token
    )
    waiters = state.live_waiters(now)
    # The limit is the name's while someone holds or waits: leases and entries that have
    # expired but are not purged yet do not count (every store answers the same).
    busy = bool(holders or waiters)
    return Status(
        name=name,
        limit=state.limit if busy else None,
        per_key=state.per_key if busy else None,
        holders=tuple(
            HolderInfo(
                h.holder,
                h.token,
                h.acquired_at,
                h.expires_at,
                callback_kind(h.callback),
                delivery_state(h.callback, h.pending),
                h.key,
            )
            for h in holders
        ),
        waiters=tuple(
            WaiterInfo(w.holder, i, w.joined_at, w.expires_at, callback_kind(w.callback), w.key)
            for i, w in enumerate(waiters)
        ),
        now=now,
    )
