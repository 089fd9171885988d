"""The SPEC's first problem, live: webhooks for several orders arrive in quick succession and
land on different worker processes; work for one order must run one at a time, in arrival
order, while different orders run in parallel.

This module is the scenario, reusable by benchmarks: the arrival schedule
(:func:`arrival_schedule`), running real worker processes against a store
(:func:`run_scenario`), and judging the outcome (:func:`order_violations`,
:func:`makespan`, :func:`ideal_makespan`, :func:`handover_latencies`,
:func:`parallelism`, :func:`summarize`, :func:`render_timeline`). ``turnstile demo``
(:mod:`turnstile.cli.demo`) adds the display.

How a worker handles a webhook: webhooks are delivered one at a time in arrival order to
whichever worker is free; on delivery the worker *joins the line* of the webhook's order
(``client.lock(f"order:{order}").try_acquire(holder)``), then waits for its turn
(``acquire``, woken by the store), does the work with the lease held (and renewed), and
releases it, which hands the lock to the next webhook of that order. Joining the line on
delivery makes "arrival order" well defined: it is the order in which the lock was asked
for, which the lock's FIFO guarantee preserves. Which lock is used is pluggable (an
``OrderLock``, named by import path so that spawned workers can load it), so a benchmark can
run the same scenario over other locks.
"""

from __future__ import annotations

import contextlib
import importlib
import itertools
import multiprocessing
import os
import queue
import random
import signal
import statistics
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any, Protocol

from . import connect
from ._sync.client import Client
from ._sync.semaphore import Lease, Lock

__all__ = [
    "ARRIVALS",
    "DEFAULT_EVENTS",
    "DEFAULT_GAP",
    "DEFAULT_STRATEGY",
    "DEFAULT_WORK",
    "DemoError",
    "EventRecord",
    "Failure",
    "Ideal",
    "OrderLock",
    "ScenarioResult",
    "Summary",
    "TurnstileOrderLock",
    "Update",
    "Violation",
    "Webhook",
    "arrival_schedule",
    "handover_latencies",
    "ideal_makespan",
    "makespan",
    "order_labels",
    "order_violations",
    "parallelism",
    "render_timeline",
    "run_scenario",
    "summarize",
]

DEFAULT_EVENTS = (2, 3)  # order A: RA1, RA2; order B: RB1, RB2, RB3
DEFAULT_GAP = 0.04  # seconds between arrivals
DEFAULT_WORK = 0.3  # seconds of work per webhook
ARRIVALS = ("grouped", "interleaved", "shuffled")
DEFAULT_STRATEGY = "turnstile.demo:TurnstileOrderLock"
IDLE_LIMIT = 120.0  # a worker that gets nothing for this long exits (bounds every wait)


class DemoError(Exception):
    """The scenario could not run (workers failed to start, …)."""


# -- the schedule -------------------------------------------------------------------------


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


# -- taking turns -------------------------------------------------------------------------


class OrderLock(Protocol):
    """How a worker takes its turn on an order. Constructed in each worker process as
    ``factory(url, **options)``; ``join`` is called while the webhook is being delivered
    (deliveries are serialized, so joins happen in arrival order) and returns a context
    manager that waits for the turn, yields a fencing token (or ``None`` if the lock has
    none), and gives the turn back on exit."""

    def join(self, order: str, holder: str) -> AbstractContextManager[int | None]: ...

    def close(self) -> None: ...


class TurnstileOrderLock:
    """The per-order Turnstile lock ``client.lock(f"order:{order}")``."""

    def __init__(
        self, url: str, *, ttl: float = 10.0, timeout: float | None = 60.0, prefix: str = ""
    ) -> None:
        self.client: Client = connect(url)
        self.client.ping()
        self.ttl = ttl
        self.timeout = timeout
        self.prefix = prefix

    def join(self, order: str, holder: str) -> AbstractContextManager[int | None]:
        lock = self.client.lock(f"{self.prefix}order:{order}", ttl=self.ttl)
        ticket = lock.try_acquire(holder)  # in line now (or holding it already)
        return self._turn(lock, holder, ticket.lease)

    @contextlib.contextmanager
    def _turn(self, lock: Lock, holder: str, lease: Lease | None) -> Iterator[int | None]:
        if lease is None:
            # Same holder: keeps the place taken by try_acquire; woken when it is our turn.
            lease = lock.acquire(timeout=self.timeout, holder=holder)
        with lease:  # renewed while the work runs; released (handed over) at the end
            yield lease.token

    def close(self) -> None:
        self.client.close()


def load_strategy(path: str) -> Callable[..., OrderLock]:
    """``"package.module:Factory"`` → the factory."""
    module_name, _, attr = path.partition(":")
    if not module_name or not attr:
        raise ValueError(f"strategy must look like 'package.module:Factory', got {path!r}")
    factory: Callable[..., OrderLock] = getattr(importlib.import_module(module_name), attr)
    return factory


# -- running it ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class EventRecord:
    """What happened to one webhook; times in seconds since the first arrival was due."""

    webhook: Webhook
    worker: int
    holder: str
    token: int | None
    arrived: float  # delivered to the workers
    asked: float  # its worker joined the order's line
    started: float  # its worker held the lock and began the work
    ended: float  # the work was done (the lock was released right after)

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
    worker: int | None
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


def _worker_main(
    index: int,
    url: str,
    strategy: str,
    options: dict[str, Any],
    tasks: Any,
    results: Any,
    intake: Any,
) -> None:
    """One worker process: take the next webhook as it arrives, take its order's turn,
    work, hand over."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    try:
        order_lock = load_strategy(strategy)(url, **options)
    except BaseException as exc:
        results.put(("dead", index, f"{type(exc).__name__}: {exc}"))
        return
    results.put(("ready", index, os.getpid()))
    try:
        while True:
            with intake:  # deliveries one at a time, in arrival order
                try:
                    item: Webhook | None = tasks.get(timeout=IDLE_LIMIT)
                except queue.Empty:
                    return
                if item is None:
                    return
                holder = f"{item.id}@worker{index}/{os.getpid()}"
                asked = time.time()
                try:
                    turn = order_lock.join(item.order, holder)
                except Exception as exc:
                    results.put(("failed", item.id, index, f"{type(exc).__name__}: {exc}"))
                    continue
            started = ended = None
            token = None
            try:
                with turn as token:
                    started = time.time()
                    results.put(("started", item.id, index, token, started))
                    time.sleep(item.work)
                    ended = time.time()
            except Exception as exc:  # a timeout or a lost lease: reported, never hidden
                error = f"{type(exc).__name__}: {exc}"
                if started is not None and ended is not None:
                    results.put(("ended", item.id, index, holder, token, asked, started, ended))
                results.put(("failed", item.id, index, error))
                continue
            results.put(("ended", item.id, index, holder, token, asked, started, ended))
    finally:
        order_lock.close()


def run_scenario(
    url: str,
    schedule: Sequence[Webhook],
    *,
    workers: int,
    strategy: str = DEFAULT_STRATEGY,
    options: Mapping[str, Any] | None = None,
    on_update: Callable[[Update], None] | None = None,
    on_ready: Callable[[float], None] | None = None,
    startup_timeout: float = 60.0,
    run_timeout: float | None = None,
) -> ScenarioResult:
    """Start ``workers`` processes (spawned, each with its own connection to ``url``),
    deliver ``schedule`` at its arrival times once all are ready, and collect what happened.

    ``options`` are passed to the strategy's factory (for Turnstile: ``ttl``, ``timeout``,
    ``prefix``). ``on_update`` sees progress as it happens, in this process. Webhooks not
    finished within ``run_timeout`` (default: generous, from the schedule) are failures.
    """
    schedule = sorted(schedule, key=lambda w: w.arrival)
    by_id = {w.id: w for w in schedule}
    if len(by_id) != len(schedule):
        raise ValueError("webhook ids must be unique")
    if workers < 1:
        raise ValueError("workers must be at least 1")
    if run_timeout is None:
        last = schedule[-1].arrival if schedule else 0.0
        run_timeout = 30.0 + last + 2 * sum(w.work for w in schedule)
    ctx = multiprocessing.get_context("spawn")  # no fork: a forked sqlite/redis handle is unsafe
    tasks = ctx.Queue()
    results = ctx.Queue()
    intake = ctx.Lock()
    procs = [
        ctx.Process(
            target=_worker_main,
            args=(i + 1, url, strategy, dict(options or {}), tasks, results, intake),
            name=f"turnstile-demo-worker-{i + 1}",
            daemon=True,
        )
        for i in range(workers)
    ]
    begun = time.monotonic()
    for proc in procs:
        proc.start()
    records: dict[str, EventRecord] = {}
    failures: dict[str, Failure] = {}
    arrived: dict[str, float] = {}
    stopped = False
    try:
        ready = 0
        deadline = time.monotonic() + startup_timeout
        while ready < workers:
            try:
                message = results.get(timeout=max(0.0, min(1.0, deadline - time.monotonic())))
            except queue.Empty:
                if time.monotonic() >= deadline:
                    raise DemoError(
                        f"only {ready} of {workers} workers started within {startup_timeout:g} s"
                    ) from None
                if not any(p.is_alive() for p in procs):
                    raise DemoError("the worker processes exited before they were ready") from None
                continue
            if message[0] == "dead":
                raise DemoError(f"worker {message[1]} could not start: {message[2]}")
            ready += 1
        startup = time.monotonic() - begun
        if on_ready is not None:
            on_ready(startup)

        def notify(update: Update) -> None:
            if on_update is not None:
                on_update(update)

        t0 = time.time() + 0.01
        end_by = time.monotonic() + run_timeout
        next_index = 0
        while len(records) + len(failures) < len(schedule):
            now = time.time()
            while next_index < len(schedule) and now >= t0 + schedule[next_index].arrival:
                hook = schedule[next_index]
                tasks.put(hook)
                arrived[hook.id] = time.time() - t0
                notify(Update("arrived", hook, arrived[hook.id]))
                next_index += 1
                now = time.time()
            if next_index == len(schedule) and not stopped:
                for _ in procs:
                    tasks.put(None)  # each worker exits after its last webhook
                stopped = True
            wait = 0.25
            if next_index < len(schedule):
                wait = min(wait, max(0.0, t0 + schedule[next_index].arrival - now))
            try:
                message = results.get(timeout=wait)
            except queue.Empty:
                if time.monotonic() > end_by or not any(p.is_alive() for p in procs):
                    break
                continue
            kind = message[0]
            if kind == "started":
                _, hook_id, worker, token, started = message
                notify(Update("started", by_id[hook_id], started - t0, worker, token))
            elif kind == "ended":
                _, hook_id, worker, holder, token, asked, started, ended = message
                hook = by_id[hook_id]
                records[hook_id] = EventRecord(
                    hook,
                    worker,
                    holder,
                    token,
                    arrived[hook_id],
                    asked - t0,
                    started - t0,
                    ended - t0,
                )
                notify(Update("ended", hook, ended - t0, worker, token))
            elif kind == "failed":
                _, hook_id, worker, error = message
                records.pop(hook_id, None)  # a lease lost during the work does not count
                failures[hook_id] = Failure(by_id[hook_id], worker, error)
                notify(Update("failed", by_id[hook_id], time.time() - t0, worker, None, error))
        for hook in schedule:
            if hook.id not in records and hook.id not in failures:
                failures[hook.id] = Failure(hook, None, f"not finished within {run_timeout:g} s")
    except BaseException:
        for proc in procs:  # interrupted or failed: no point in finishing the work
            proc.terminate()
        raise
    finally:
        if not stopped:
            for _ in procs:
                tasks.put(None)
        if not stopped_cleanly(procs):
            for proc in procs:
                if proc.is_alive():
                    proc.terminate()
            for proc in procs:
                proc.join(timeout=5.0)
        tasks.close()
        results.close()
        tasks.cancel_join_thread()
        results.cancel_join_thread()
    ordered = sorted(records.values(), key=lambda r: r.started)
    return ScenarioResult(
        list(schedule),
        ordered,
        sorted(failures.values(), key=lambda f: f.webhook.arrival),
        workers,
        startup,
    )


def stopped_cleanly(procs: Sequence[Any], timeout: float = 5.0) -> bool:
    """Join the workers (they exit after the stop sentinels); False if any still runs."""
    deadline = time.monotonic() + timeout
    for proc in procs:
        proc.join(timeout=max(0.0, deadline - time.monotonic()))
    return not any(proc.is_alive() for proc in procs)


# -- judging it ---------------------------------------------------------------------------


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


# -- showing it ---------------------------------------------------------------------------


def render_timeline(
    records: Sequence[EventRecord], schedule: Sequence[Webhook], *, width: int = 60
) -> list[str]:
    """One row per order: ``RA1=====`` while an event runs, ``.`` while an event of the
    order waits for its turn and none runs, blank while the order has nothing to do.

    Each column shows what filled most of its time slice, so a handover far shorter than a
    column does not show as a gap."""
    width = max(10, width)
    span = max([r.ended for r in records] + [w.arrival for w in schedule] + [1e-3])
    step = span / width
    samples = 8  # per column

    labels = sorted({w.order for w in schedule}, key=lambda o: (len(o), o))
    label_width = max(len(f"order {o}") for o in labels) + 2 if labels else 8
    lines = []
    ticks = 4 if width >= 40 else 2
    ruler = [" "] * (width + 12)
    marks = ["-"] * width
    for i in range(ticks + 1):
        position = min(width - 1, round(i * width / ticks))
        marks[position] = "|"
        text = f"{position * step:.2f}s" if i < ticks else f"{span:.2f}s"
        start = min(max(0, position - len(text) // 2), len(ruler) - len(text))
        if i == 0:
            start = 0
        ruler[start : start + len(text)] = text
    lines.append(" " * label_width + "".join(ruler).rstrip())
    lines.append(" " * label_width + "".join(marks))
    by_order: dict[str, list[EventRecord]] = {}
    for r in records:
        by_order.setdefault(r.webhook.order, []).append(r)
    for order in labels:
        events = sorted(by_order.get(order, []), key=lambda r: r.started)
        owner: list[EventRecord | str | None] = []  # per column: an event, "." or None
        for c in range(width):
            votes: dict[int, int] = {}
            waiting = 0
            for k in range(samples):
                t = (c + (k + 0.5) / samples) * step
                running = next((i for i, r in enumerate(events) if r.started <= t < r.ended), None)
                if running is not None:
                    votes[running] = votes.get(running, 0) + 1
                elif any(r.arrived <= t < r.started for r in events):
                    waiting += 1
            best = max(votes, key=lambda i: votes[i], default=None)
            running_total = sum(votes.values())
            if best is not None and running_total >= max(
                waiting, samples - running_total - waiting
            ):
                owner.append(events[best])
            elif waiting * 2 >= samples:
                owner.append(".")
            else:
                owner.append(None)
        for r in events:  # an event shorter than half a column still gets one
            if r not in owner:
                c = min(width - 1, int((r.started + r.ended) / 2 / step))
                if not isinstance(owner[c], EventRecord):
                    owner[c] = r
        row = []
        for c, who in enumerate(owner):
            if isinstance(who, EventRecord):
                offset = 0
                while c - offset - 1 >= 0 and owner[c - offset - 1] is who:
                    offset += 1
                label = who.webhook.id
                row.append(label[offset] if offset < len(label) else "=")
            else:
                row.append(" " if who is None else who)
        lines.append(f"order {order}".ljust(label_width) + "".join(row).rstrip())
    return lines
