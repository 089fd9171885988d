"""The numbers of a run, computed from what the workers recorded: percentiles, overlaps,
streaks, FIFO violations (by call time and certain ones), handover and webhook metrics.

Pure functions of recorded times (``time.monotonic()``, one clock for every process of a
host), so tests can check them on hand-made intervals.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

DEFAULT_FIFO_TOLERANCE = 0.001


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0..100) with linear interpolation; NaN when empty."""
    if not values:
        return math.nan
    ordered = sorted(values)
    if len(ordered) == 1:
        return ordered[0]
    pos = (len(ordered) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


@dataclass(frozen=True)
class Grant:
    """One critical section: when its process called acquire, got the lock, released it, and
    (``queued``, NaN if unknown) when the lock confirmed the request was in line."""

    pid: int
    wait_start: float
    start: float
    end: float
    queued: float = math.nan


def count_overlaps(intervals: Iterable[tuple[float, float]]) -> int:
    """Intervals that begin before an earlier-starting one has ended (0 for a correct lock)."""
    overlaps = 0
    latest_end = -math.inf
    for start, end in sorted(intervals):
        if start < latest_end:
            overlaps += 1
        latest_end = max(latest_end, end)
    return overlaps


def fifo_violations(grants: Sequence[Grant], tolerance: float = DEFAULT_FIFO_TOLERANCE) -> int:
    """Grants that overtook an earlier waiter.

    A grant ``b`` is a FIFO violation when some other grant ``a`` had started waiting (called
    acquire) more than ``tolerance`` seconds before ``b`` did, yet was granted after ``b``.
    The tolerance absorbs the moment between a worker reading the clock and its request
    reaching the store; a polling lock overtakes by whole poll intervals. Grants of one
    process are sequential, so ``a`` is always another process's.
    """
    by_wait = sorted(grants, key=lambda g: g.wait_start)
    violations = 0
    latest_start_of_earlier = -math.inf  # max start among grants that waited > tolerance earlier
    j = 0
    for b in by_wait:
        while j < len(by_wait) and by_wait[j].wait_start < b.wait_start - tolerance:
            latest_start_of_earlier = max(latest_start_of_earlier, by_wait[j].start)
            j += 1
        if latest_start_of_earlier > b.start:
            violations += 1
    return violations


def certain_fifo_violations(grants: Sequence[Grant]) -> int | None:
    """Grants that overtook a request *known* to be in line before they asked.

    ``b`` is a certain violation when another grant ``a`` had been confirmed in line by the
    lock (``a.queued``) before ``b``'s process even called acquire, yet ``a`` was granted
    after ``b``. No clock tolerance is involved and descheduling cannot fake one: a process
    paused between reading the clock and sending its request only makes its own ``queued``
    later. ``None`` when the lock never confirms a place in line (nothing to check).
    """
    queued = sorted((g for g in grants if not math.isnan(g.queued)), key=lambda g: g.queued)
    if not queued:
        return None
    violations = 0
    for b in grants:
        # the latest start among grants confirmed in line before b asked
        latest = max(
            (a.start for a in queued if a.queued < b.wait_start and a is not b), default=-math.inf
        )
        if latest > b.start:
            violations += 1
    return violations


def longest_streak(pids: Sequence[int]) -> int:
    best = run = 0
    previous = None
    for pid in pids:
        run = run + 1 if pid == previous else 1
        previous = pid
        best = max(best, run)
    return best


def handover_metrics(
    grants: Sequence[Grant], tolerance: float = DEFAULT_FIFO_TOLERANCE
) -> dict[str, Any]:
    """The handover numbers of a set of grants on one name (see :class:`HandoverResult`)."""
    ordered = sorted(grants, key=lambda g: g.start)
    gaps = [b.start - a.end for a, b in itertools.pairwise(ordered) if a.pid != b.pid]
    handovers = max(len(ordered) - 1, 0)
    return {
        "grants": len(ordered),
        "handovers": handovers,
        "to_other": len(gaps),
        "to_other_share": len(gaps) / handovers if handovers else math.nan,
        "gap_p50_ms": percentile(gaps, 50) * 1000,
        "gap_p99_ms": percentile(gaps, 99) * 1000,
        "gap_max_ms": max(gaps) * 1000 if gaps else math.nan,
        "longest_streak": longest_streak([g.pid for g in ordered]),
        "fifo_violations": fifo_violations(ordered, tolerance),
        "certain_fifo_violations": certain_fifo_violations(ordered),
        "overlaps": count_overlaps((g.start, g.end) for g in ordered),
    }


@dataclass(frozen=True)
class Handled:
    """One webhook as a worker handled it. ``start``/``end`` are NaN when acquire failed."""

    index: int  # position in the feed (arrival order)
    order: str
    pid: int
    took: float
    start: float
    end: float
    error: str = ""
    queued: float = math.nan  # when the lock confirmed the request in line (LockAdapter.queued_at)


def webhook_metrics(
    handled: Sequence[Handled], tolerance: float = DEFAULT_FIFO_TOLERANCE
) -> dict[str, Any]:
    """Order violations, overlaps within an order, in-order handover gaps.

    ``order_violations`` counts webhooks that ran before an earlier-*arrived* webhook of the
    same order: what the business sees. Part of that is not the lock's doing: two workers
    that take consecutive webhooks of one order at the same instant race to the lock, and
    the later one may ask first. ``lock_fifo_violations`` counts only the lock's part: grants
    that overtook a webhook of the same order whose worker had called acquire more than
    ``tolerance`` earlier (see :func:`fifo_violations`)."""
    by_order: dict[str, list[Handled]] = {}
    for h in handled:
        if not math.isnan(h.start):
            by_order.setdefault(h.order, []).append(h)
    violations = overlaps = lock_fifo = 0
    certain: int | None = None
    gaps: list[float] = []
    for events in by_order.values():
        events.sort(key=lambda h: h.start)
        # An event ran out of order if an event of its order that arrived later ran first.
        latest_index = -1
        for h in events:
            if h.index < latest_index:
                violations += 1
            latest_index = max(latest_index, h.index)
        overlaps += count_overlaps((h.start, h.end) for h in events)
        grants = [Grant(h.pid, h.took, h.start, h.end, h.queued) for h in events]
        lock_fifo += fifo_violations(grants, tolerance)
        sure = certain_fifo_violations(grants)
        if sure is not None:
            certain = (certain or 0) + sure
        for a, b in itertools.pairwise(events):
            if b.took < a.end:  # b was waiting for the lock when a finished
                gaps.append(b.start - a.end)
    return {
        "order_violations": violations,
        "lock_fifo_violations": lock_fifo,
        "certain_lock_fifo_violations": certain,
        "overlaps": overlaps,
        "order_gap_p50_ms": percentile(gaps, 50) * 1000,
        "order_gap_p99_ms": percentile(gaps, 99) * 1000,
    }
