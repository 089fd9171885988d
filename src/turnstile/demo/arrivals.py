"""The scenario: which webhooks arrive, when, and what is recorded about each.

Pure data, no I/O: :func:`arrival_schedule` builds the arrivals, the records below are what
running them (:mod:`turnstile.demo.workers`) produces and what judging them
(:mod:`turnstile.demo.judge`) reads. Times are seconds since the first arrival was due.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

DEFAULT_EVENTS = (2, 3)  # order A: RA1, RA2; order B: RB1, RB2, RB3
DEFAULT_GAP = 0.04  # seconds between arrivals
DEFAULT_WORK = 0.3  # seconds of work per webhook
ARRIVALS = ("grouped", "interleaved", "shuffled")


class DemoError(Exception):
    """The scenario could not run (workers failed to start, …)."""


@dataclass(frozen=True, slots=True)
class Webhook:
    """One webhook: event ``seq`` (1-based, in arrival order) of ``order``."""

    id: str  # "RA1": R(equest) + order + seq
    order: str  # "A"
    seq: int
    arrival: float  # seconds after the first arrival
    work: float  # seconds of work to handle it


def order_labels(count: int) -> list[str]:
    """``A``, ``B``, …, ``Z``, ``AA``, ``AB``, … (like spreadsheet columns)."""
    labels = []
    for n in range(1, count + 1):
        label = ""
        while n:
            n, rest = divmod(n - 1, 26)
            label = chr(ord("A") + rest) + label
        labels.append(label)
    return labels


def arrival_schedule(
    events_per_order: Sequence[int] = DEFAULT_EVENTS,
    *,
    gap: float = DEFAULT_GAP,
    work: float = DEFAULT_WORK,
    arrival: str = "grouped",
    seed: int | None = None,
) -> list[Webhook]:
    """Webhooks in arrival order, one every ``gap`` seconds.

    ``grouped``: all of order A's events, then B's, … (the default RA1, RA2, RB1, RB2, RB3);
    ``interleaved``: round robin over the orders (RA1, RB1, RA2, RB2, RB3);
    ``shuffled``: a random merge (``seed``) that keeps each order's own events in sequence.
    """
    if arrival not in ARRIVALS:
        raise ValueError(f"arrival must be one of {', '.join(ARRIVALS)}, got {arrival!r}")
    if not events_per_order or any(k < 1 for k in events_per_order):
        raise ValueError("every order needs at least one event")
    counts = list(zip(order_labels(len(events_per_order)), events_per_order, strict=True))
    if arrival == "interleaved":
        sequence = []
        for round_ in range(max(events_per_order)):
            sequence += [label for label, k in counts if round_ < k]
    else:
        sequence = [label for label, k in counts for _ in range(k)]
        if arrival == "shuffled":
            # Shuffles which slots each order's events take; their seq stays in order below.
            random.Random(seed).shuffle(sequence)
    seen: dict[str, int] = {}
    schedule = []
    for index, label in enumerate(sequence):
        seen[label] = seen.get(label, 0) + 1
        schedule.append(Webhook(f"R{label}{seen[label]}", label, seen[label], index * gap, work))
    return schedule


def orders_of(schedule: Sequence[Webhook]) -> list[str]:
    """The schedule's order labels, A before B before AA."""
    return sorted({w.order for w in schedule}, key=lambda o: (len(o), o))


@dataclass(frozen=True, slots=True)
class EventRecord:
    """What happened to one webhook; times in seconds since the first arrival was due."""

    webhook: Webhook
    worker: int
    holder: str
    token: int | None
    arrived: float  # delivered to the workers
    asked: float  # its worker joined the order's line (queue variant: it was put)
    started: float  # its worker held its turn and began the work
    ended: float  # the work was done (the turn was given back right after)

    def to_dict(self) -> dict[str, object]:
        return {
            "id": self.webhook.id,
            "order": self.webhook.order,
            "seq": self.webhook.seq,
            "work": self.webhook.work,
            "worker": self.worker,
            "holder": self.holder,
            "token": self.token,
            "arrived": round(self.arrived, 6),
            "asked": round(self.asked, 6),
            "started": round(self.started, 6),
            "ended": round(self.ended, 6),
        }


@dataclass(frozen=True, slots=True)
class Failure:
    webhook: Webhook
    worker: int | None  # None: no worker reported back before the run's deadline
    message: str


@dataclass(frozen=True, slots=True)
class Update:
    """Progress, as it happens: ``arrived``, ``started``, ``ended`` or ``failed``."""

    kind: str
    webhook: Webhook
    at: float  # seconds since the first arrival was due
    worker: int | None = None
    token: int | None = None
    message: str = ""


@dataclass(frozen=True)
class ScenarioResult:
    schedule: list[Webhook]
    records: list[EventRecord]
    failures: list[Failure]
    workers: int
    startup: float  # seconds until every worker was connected and ready
