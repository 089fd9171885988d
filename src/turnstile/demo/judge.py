"""The judge: was order kept within each order, did orders run in parallel, how close the
makespan came to the ideal, how long handovers took. Reads only records, so it judges any
run: the lock and queue variants here, and the benchmarks, which take their webhook
scenario (:func:`turnstile.demo.arrival_schedule`) and ideal makespan
(:func:`ideal_makespan`) from this package.
"""

from __future__ import annotations

import itertools
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field

from .arrivals import EventRecord, Failure, ScenarioResult, Webhook


@dataclass(frozen=True, slots=True)
class Violation:
    """Two events of one order, ``first`` started before ``second``, that break a rule:
    ``order`` (``first`` arrived later), ``overlap`` (``second`` started before ``first``
    ended) or ``token`` (``second``'s fencing token is not larger)."""

    order: str
    kind: str
    first: str
    second: str

    def __str__(self) -> str:
        if self.kind == "order":
            return f"{self.first} ran before {self.second}, which arrived earlier"
        if self.kind == "overlap":
            return f"{self.second} started before {self.first} ended"
        return f"{self.second}'s fencing token is not larger than {self.first}'s"


def _by_order(records: Sequence[EventRecord]) -> dict[str, list[EventRecord]]:
    orders: dict[str, list[EventRecord]] = {}
    for record in sorted(records, key=lambda r: (r.started, r.webhook.seq)):
        orders.setdefault(record.webhook.order, []).append(record)
    return orders


def order_violations(records: Sequence[EventRecord]) -> list[Violation]:
    """Within each order, consecutive events in start order must have arrived in that order,
    must not overlap, and must carry increasing fencing tokens (when the lock has them)."""
    found = []
    for order, events in _by_order(records).items():
        for a, b in itertools.pairwise(events):
            if a.webhook.seq > b.webhook.seq:
                found.append(Violation(order, "order", a.webhook.id, b.webhook.id))
            if b.started < a.ended:
                found.append(Violation(order, "overlap", a.webhook.id, b.webhook.id))
            if a.token is not None and b.token is not None and b.token <= a.token:
                found.append(Violation(order, "token", a.webhook.id, b.webhook.id))
    return found


def makespan(records: Sequence[EventRecord], schedule: Sequence[Webhook]) -> float:
    """From the first arrival to the end of the last work."""
    if not records:
        return 0.0
    first = min(w.arrival for w in schedule) if schedule else 0.0
    return max(r.ended for r in records) - first


@dataclass(frozen=True, slots=True)
class Ideal:
    seconds: float
    reason: str


def ideal_makespan(schedule: Sequence[Webhook], workers: int) -> Ideal:
    """A lower bound no schedule can beat: the larger of

    * the longest order *chain*: each order's events back to back, none before it arrived
      (orders fully in parallel, zero handover time); and
    * the total work divided by the number of workers.
    """
    if not schedule:
        return Ideal(0.0, "nothing to do")
    first = min(w.arrival for w in schedule)
    chain, chain_order = 0.0, ""
    orders: dict[str, list[Webhook]] = {}
    for hook in schedule:
        orders.setdefault(hook.order, []).append(hook)
    for order, hooks in orders.items():
        t = first
        for hook in sorted(hooks, key=lambda w: w.seq):
            t = max(t, hook.arrival) + hook.work
        if t - first > chain:
            chain, chain_order = t - first, order
    capacity = sum(w.work for w in schedule) / workers
    if capacity > chain:
        return Ideal(capacity, f"total work / {workers} workers")
    return Ideal(
        chain, f"order {chain_order}'s events back to back from their arrivals, orders in parallel"
    )


def handover_latencies(records: Sequence[EventRecord]) -> list[float]:
    """Seconds from one event of an order ending to the next starting, counted only when
    the next one was already waiting (it asked before the previous one ended)."""
    gaps = []
    for events in _by_order(records).values():
        for a, b in itertools.pairwise(events):
            if b.asked <= a.ended:
                gaps.append(b.started - a.ended)
    return gaps


def parallelism(records: Sequence[EventRecord]) -> tuple[int, float]:
    """(most orders running at one instant, seconds during which two or more ran)."""
    points = []
    for r in records:
        points.append((r.started, 1, r.webhook.order))
        points.append((r.ended, -1, r.webhook.order))
    points.sort(key=lambda p: (p[0], p[1]))  # an end before a start at the same instant
    running: dict[str, int] = {}
    most, together, last = 0, 0.0, 0.0
    for t, delta, order in points:
        if sum(1 for n in running.values() if n > 0) >= 2:
            together += t - last
        running[order] = running.get(order, 0) + delta
        most = max(most, sum(1 for n in running.values() if n > 0))
        last = t
    return most, together


@dataclass(frozen=True)
class Summary:
    events: int
    orders: int
    workers: int
    completed: int
    failures: tuple[Failure, ...]
    violations: tuple[Violation, ...]
    max_parallel_orders: int
    parallel_seconds: float
    makespan: float
    ideal: Ideal
    handovers: tuple[float, ...] = field(default_factory=tuple)

    @property
    def ok(self) -> bool:
        return not self.violations and not self.failures

    @property
    def efficiency(self) -> float:
        return self.ideal.seconds / self.makespan if self.makespan > 0 else 0.0

    @property
    def handover_p50(self) -> float | None:
        return statistics.median(self.handovers) if self.handovers else None

    @property
    def handover_max(self) -> float | None:
        return max(self.handovers) if self.handovers else None

    def to_dict(self) -> dict[str, object]:
        def ms(value: float | None) -> float | None:
            return None if value is None else round(value * 1000, 3)

        return {
            "ok": self.ok,
            "events": self.events,
            "orders": self.orders,
            "workers": self.workers,
            "completed": self.completed,
            "failed": len(self.failures),
            "failures": [
                {"id": f.webhook.id, "worker": f.worker, "message": f.message}
                for f in self.failures
            ],
            "order_violations": len(self.violations),
            "violations": [
                {
                    "order": v.order,
                    "kind": v.kind,
                    "first": v.first,
                    "second": v.second,
                    "message": str(v),
                }
                for v in self.violations
            ],
            "orders_in_parallel": self.max_parallel_orders >= 2,
            "max_parallel_orders": self.max_parallel_orders,
            "parallel_seconds": round(self.parallel_seconds, 6),
            "makespan": round(self.makespan, 6),
            "ideal": round(self.ideal.seconds, 6),
            "ideal_bound": self.ideal.reason,
            "efficiency": round(self.efficiency, 4),
            "handovers": len(self.handovers),
            "handover_p50_ms": ms(self.handover_p50),
            "handover_max_ms": ms(self.handover_max),
        }


def summarize(result: ScenarioResult) -> Summary:
    most, together = parallelism(result.records)
    return Summary(
        events=len(result.schedule),
        orders=len({w.order for w in result.schedule}),
        workers=result.workers,
        completed=len(result.records),
        failures=tuple(result.failures),
        violations=tuple(order_violations(result.records)),
        max_parallel_orders=most,
        parallel_seconds=together,
        makespan=makespan(result.records, result.schedule),
        ideal=ideal_makespan(result.schedule, result.workers),
        handovers=tuple(handover_latencies(result.records)),
    )
