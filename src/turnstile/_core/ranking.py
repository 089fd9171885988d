"""Where a waiter stands in a line: priorities with optional ageing (docs/admission.md).

Every line (a lock's, a semaphore's, a rate limit's) is kept in order of **rank**, smallest
first, and within one rank in arrival order. A waiter's rank is fixed when it joins::

    rank = stamp - priority * level

* ``stamp`` is its arrival time on the store's clock in integer microseconds, made
  strictly increasing per line (``max(now, newest stamp in line + 1)``), so two waiters of
  one priority are always served in arrival order, even if the clock steps back;
* ``level`` is what one priority level is worth in waiting time: with ageing, the caller's
  ``ageing`` seconds (a waiter that has waited that long ranks with waiters one level above
  that arrive now); without ageing, :data:`STRICT_LEVEL_US` (2**42 µs, about 51 days: more
  than any acquire may wait, so in practice a lower level never passes a higher one).

A larger priority is therefore served first, FIFO within a level, and ageing never lifts a
waiter a whole level in less than ``ageing`` seconds. The rank is an integer below 2**53 in
magnitude (|priority| <= 1000, ``level`` <= 2**42, stamps near 2**51), so a Redis sorted
set's score (a double) holds it exactly and PostgreSQL keeps it in a bigint.

Callers of one name should agree on ``ageing``: the rank of each waiter is computed with
its own caller's value.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Protocol, TypeVar

STRICT_LEVEL_US = 1 << 42


def lead(priority: int, ageing: float | None) -> int:
    """How far ahead of its arrival a waiter stands, in microseconds."""
    level = STRICT_LEVEL_US if ageing is None else round(ageing * 1_000_000)
    return priority * level


def stamp(now: float, newest: int | None) -> int:
    """A joining waiter's arrival stamp: the clock in µs, above the newest in line."""
    at = math.floor(now * 1_000_000)
    return at if newest is None else max(at, newest + 1)


def stamp_of(joined_at: float) -> int:
    """The stamp a waiter's ``joined_at`` (``stamp / 1e6``) was made from."""
    return round(joined_at * 1_000_000)


class Ranked(Protocol):
    """A waiting entry of any line: its arrival (``stamp / 1e6``) and its rank."""

    joined_at: float
    rank: int


R = TypeVar("R", bound=Ranked)


class Waiting(Protocol):
    """A waiting entry, known by its holder."""

    @property
    def holder(self) -> str: ...


W = TypeVar("W", bound=Waiting)


def place(row: Ranked, now: float, newest: int | None, lead: int) -> None:
    """Set a joining entry's ``joined_at`` (its stamp) and ``rank``, ``newest`` being the
    newest stamp in its line (None: an empty line)."""
    at = stamp(now, newest)
    row.joined_at, row.rank = at / 1_000_000, at - lead


def join(line: list[R], row: R, now: float, lead: int) -> int:
    """Put a new waiting entry in ``line`` by rank: behind every waiter of its rank or
    better, ahead of the rest. Sets its ``joined_at`` (its stamp) and ``rank``; returns its
    position."""
    place(row, now, max((stamp_of(w.joined_at) for w in line), default=None), lead)
    index = len(line)
    while index > 0 and line[index - 1].rank > row.rank:
        index -= 1
    line.insert(index, row)
    return index


def position(line: Sequence[Waiting], holder: str) -> int | None:
    """How many entries stand before ``holder``'s in ``line`` (None: it has none)."""
    return next((i for i, w in enumerate(line) if w.holder == holder), None)


def drop(line: list[W], holder: str) -> bool:
    """Take ``holder``'s entry out of ``line``; whether it had one."""
    index = position(line, holder)
    if index is None:
        return False
    del line[index]
    return True
