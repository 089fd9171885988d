"""The scenarios, each run on every contender in one run, on real processes:

* :func:`run_uncontended` — one process, acquire + release of a free lock, ops/s;
* :func:`run_handover` — P processes contending for one name with short critical sections;
* :func:`run_webhooks` — the SPEC's problem on the demo's schedule (:class:`WebhookScenario`
  holds :class:`turnstile.demo.Webhook` objects; the ideal makespan is the demo's): W workers take
  the next webhook from a shared feed and handle it under its order's lock;
* :func:`run_webhook_pair` and :func:`run_throughput` — the webhooks by lock and by keyed queue,
  and a queue's drain rate and put -> start latency.
"""

from __future__ import annotations

import dataclasses
import functools
import heapq
import math
import os
import secrets
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from turnstile.demo import DEFAULT_EVENTS as DEMO_EVENTS
from turnstile.demo import Webhook, arrival_schedule
from turnstile.demo import ideal_makespan as demo_ideal_makespan

from .adapters import (
    SERVER_CPU,
    Contender,
    LockAdapter,
    QueueAdapter,
    TurnstileLock,
    TurnstileQueue,
    WorkerLoopQueue,
)
from .metrics import (
    DEFAULT_FIFO_TOLERANCE,
    Grant,
    Handled,
    handover_metrics,
    percentile,
    webhook_metrics,
)
from .workers import SPAWN, progress, run_workers

DEFAULT_WORK = 0.02  # seconds per webhook: the benchmarks' default (the demo shows 0.3 s)


# -- uncontended -------------------------------------------------------------------------------
@dataclass
class UncontendedResult:
    label: str
    iterations: int
    seconds: float
    ops_per_s: float
    p50_ms: float
    p99_ms: float
    trials: list[float] = field(default_factory=list)  # ops/s of each trial
    # CPU time of the worker process (all its threads: a renewer, a pool's) per acquire +
    # release, in microseconds, median over the trials: what the client itself spends. The
    # rest of a cycle (1 / ops_per_s minus this) is spent waiting: the network, the server,
    # the disk, and the scheduler.
    cpu_us: float = math.nan
    # The store's CPU time per acquire + release (its processes, where the contender's probe
    # reads it: adapters.SERVER_CPU), median over the trials; part of the waiting.
    server_us: float = math.nan

    @property
    def wait_us(self) -> float:
        """Microseconds of each cycle not spent on the client's CPU (NaN without a rate)."""
        if not self.ops_per_s > 0:
            return math.nan
        return max(0.0, 1e6 / self.ops_per_s - self.cpu_us)


def _per(counters: dict[str, float], grants: int) -> dict[str, float]:
    """The store's counters per grant, for the hand-over and webhook tables (the server's
    CPU time is reported by the uncontended table only)."""
    return {k: v / grants for k, v in counters.items() if k != SERVER_CPU}


def _uncontended_job(adapter: LockAdapter, args: tuple[str, int, float], go: float) -> Any:
    name, iterations, max_seconds = args
    latencies: list[float] = []
    clock = time.monotonic
    stop = go + max_seconds
    cpu = time.process_time()
    for _ in range(iterations):
        t0 = clock()
        adapter.acquire(name)
        adapter.release()
        t1 = clock()
        latencies.append(t1 - t0)
        if t1 > stop:
            break
    return latencies, time.process_time() - cpu


def run_uncontended(
    contenders: Sequence[Contender],
    *,
    iterations: int = 2000,
    max_seconds: float = 5.0,
    trials: int = 3,
) -> list[UncontendedResult]:
    """Acquire + release a free lock in one process, ``iterations`` times (or for at most
    ``max_seconds``); ``trials`` rounds interleaved over the contenders, median reported."""
    samples: dict[str, list[list[float]]] = {c.label: [] for c in contenders}
    cpu: dict[str, list[float]] = {c.label: [] for c in contenders}  # µs per op, by trial
    server: dict[str, list[float]] = {c.label: [] for c in contenders}  # the same, the store's
    for trial in range(trials):
        for c in contenders:
            progress(f"  uncontended  {c.label}  trial {trial + 1}/{trials}")
            name = f"bench-{secrets.token_hex(4)}:uncontended"
            run = run_workers(
                c, _uncontended_job, [(name, iterations, max_seconds)], timeout=max_seconds + 120
            )
            latencies, spent = run.results[0]
            samples[c.label].append(latencies)
            cpu[c.label].append(spent / len(latencies) * 1e6)
            if SERVER_CPU in run.counters:
                server[c.label].append(run.counters[SERVER_CPU] / len(latencies) * 1e6)
    results = []
    for c in contenders:
        rates = [len(lat) / sum(lat) for lat in samples[c.label]]
        median_trial = sorted(samples[c.label], key=lambda lat: len(lat) / sum(lat))[
            len(rates) // 2
        ]
        results.append(
            UncontendedResult(
                label=c.label,
                iterations=len(median_trial),
                seconds=sum(median_trial),
                ops_per_s=statistics.median(rates),
                p50_ms=percentile(median_trial, 50) * 1000,
                p99_ms=percentile(median_trial, 99) * 1000,
                trials=rates,
                cpu_us=statistics.median(cpu[c.label]),
                server_us=statistics.median(server[c.label]) if server[c.label] else math.nan,
            )
        )
    return results


# -- handover ----------------------------------------------------------------------------------
@dataclass
class HandoverResult:
    label: str
    processes: int
    hold_ms: float
    grants: int
    handovers: int  # consecutive grant pairs
    to_other: int  # ... of which went to another process
    to_other_share: float
    gap_p50_ms: float  # end of one grant -> start of the next, when it went to another process
    gap_p99_ms: float
    gap_max_ms: float
    longest_streak: int
    fifo_violations: int
    fifo_tolerance_ms: float
    overlaps: int
    seconds: float
    counters: dict[str, float] = field(default_factory=dict)
    per_grant: dict[str, float] = field(default_factory=dict)
    certain_fifo_violations: int | None = None  # None: the lock never confirms a place in line
    trials: list[float] = field(default_factory=list)  # p50 gap (ms) of every trial


def _handover_job(
    adapter: LockAdapter, args: tuple[str, int, float, float], go: float
) -> list[tuple[int, float, float, float, float]]:
    name, rounds, hold, max_seconds = args
    pid = os.getpid()
    clock = time.monotonic
    grants = []
    stop = go + max_seconds
    for _ in range(rounds):
        wait_start = clock()
        if wait_start > stop:
            break
        adapter.acquire(name)
        start = clock()
        time.sleep(hold)
        end = clock()
        adapter.release()
        grants.append((pid, wait_start, start, end, adapter.queued_at))
    return grants


R = TypeVar("R", "HandoverResult", "WebhookResult")


def _median_trial(trials: list[R], value: Callable[[R], float], nan_as: float) -> R:
    """The trial of median ``value`` (the lower one of an even count; NaN counts as
    ``nan_as``), with every trial's value in its ``trials``."""
    ranked = sorted(trials, key=lambda r: nan_as if math.isnan(value(r)) else value(r))
    chosen = ranked[(len(ranked) - 1) // 2]
    chosen.trials = [value(r) for r in trials]
    return chosen


# run_handover: a lock slower than this (p50 gap, ms) in its first trial runs no more trials.
REPEAT_BELOW_MS = 10.0


def run_handover(
    contenders: Sequence[Contender],
    *,
    processes: int = 4,
    rounds: int = 20,
    hold: float = 0.002,
    max_seconds: float = 20.0,
    fifo_tolerance: float = DEFAULT_FIFO_TOLERANCE,
    trials: int = 1,
) -> list[HandoverResult]:
    """``processes`` processes each acquire one name ``rounds`` times (none starts a new
    round after ``max_seconds``, which bounds slow polling locks), holding it ``hold`` s.

    With ``trials`` > 1 the run is made that many times, interleaved over the contenders (a
    trial runs every contender in turn, so a machine whose speed drifts affects them alike);
    each contender's trial of median p50 gap is reported (``trials`` lists every trial's). A
    lock whose first trial handed over slower than ``REPEAT_BELOW_MS`` p50 (a polling lock,
    many times off the others) runs that trial only: the trials are there to tell apart the
    locks whose figures lie within the machine's drift of each other."""
    runs: dict[str, list[HandoverResult]] = {c.label: [] for c in contenders}
    for trial in range(trials):
        for c in contenders:
            if trial > 0 and not runs[c.label][0].gap_p50_ms < REPEAT_BELOW_MS:
                continue
            progress(
                f"  handover     {c.label}  {processes} processes"
                + (f"  trial {trial + 1}/{trials}" if trials > 1 else "")
            )
            name = f"bench-{secrets.token_hex(4)}:handover"
            run = run_workers(
                c,
                _handover_job,
                [(name, rounds, hold, max_seconds)] * processes,
                timeout=max_seconds + 120,
            )
            grants = [Grant(*g) for worker in run.results for g in worker]
            metrics = handover_metrics(grants, fifo_tolerance)
            seconds = max((g.end for g in grants), default=0.0) - min(run.go_times)
            runs[c.label].append(
                HandoverResult(
                    label=c.label,
                    processes=processes,
                    hold_ms=hold * 1000,
                    fifo_tolerance_ms=fifo_tolerance * 1000,
                    seconds=seconds,
                    counters=run.counters,
                    per_grant=(
                        _per(run.counters, len(grants)) if grants else {}
                    ),
                    **metrics,
                )
            )
    # NaN (no hand-over to another process) sorts as the slowest.
    return [_median_trial(runs[c.label], lambda r: r.gap_p50_ms, math.inf) for c in contenders]


# -- webhooks by lock --------------------------------------------------------------------------
@dataclass(frozen=True)
class WebhookScenario:
    """A feed of webhooks in arrival order: the demo's :class:`~turnstile.demo.Webhook` objects
    (``arrival`` in seconds after the start line; 0 = already waiting in the feed), so the
    benchmark and ``turnstile demo`` judge the same schedule with the same ideal makespan."""

    name: str
    arrivals: tuple[Webhook, ...]

    @classmethod
    def random(
        cls,
        orders: int,
        per_order: int,
        seed: int = 1,
        spacing: float = 0.0,
        work: float = DEFAULT_WORK,
    ) -> WebhookScenario:
        """``orders`` x ``per_order`` webhooks in a seeded random order, ``spacing`` s apart
        (0: all already waiting in the feed when the workers start), ``work`` s each: the
        demo's ``shuffled`` arrival schedule."""
        schedule = arrival_schedule(
            [per_order] * orders, gap=spacing, work=work, arrival="shuffled", seed=seed
        )
        return cls(
            f"{orders} orders x {per_order} webhooks, random order (seed {seed})", tuple(schedule)
        )

    @classmethod
    def parse(cls, text: str, spacing: float = 0.0, work: float = DEFAULT_WORK) -> WebhookScenario:
        """The demo's notation: ``"RA1,RA2,RB1,RB2,RB3"`` — order = the letters after the
        leading ``R``; the number is informative only (``seq`` counts arrivals per order)."""
        seen: dict[str, int] = {}
        hooks = []
        for index, item in enumerate(text.split(",")):
            item = item.strip()
            body = item[1:] if item[:1] in "Rr" and len(item) > 1 else item
            order = body.rstrip("0123456789") or body
            seen[order] = seen.get(order, 0) + 1
            hooks.append(Webhook(item, order, seen[order], index * spacing, work))
        return cls(text, tuple(hooks))

    @property
    def work(self) -> float:
        """Seconds of work per webhook (the longest, if they differ)."""
        return max((w.work for w in self.arrivals), default=0.0)

    def with_work(self, work: float | None) -> WebhookScenario:
        """The same arrivals with ``work`` seconds each (``None``: unchanged)."""
        if work is None:
            return self
        return dataclasses.replace(
            self, arrivals=tuple(dataclasses.replace(w, work=work) for w in self.arrivals)
        )


def demo_notation() -> str:
    """The demo's default webhooks in the notation of :meth:`WebhookScenario.parse`."""
    return ",".join(w.id for w in arrival_schedule(DEMO_EVENTS))


def ideal_makespan(scenario: WebhookScenario, workers: int, work: float | None = None) -> float:
    """No lock can beat this (the demo's :func:`turnstile.demo.ideal_makespan`): total work
    spread over all workers, and never less than the longest order's chain (its events back to
    back, none before it arrived). ``work`` overrides the webhooks' own."""
    return demo_ideal_makespan(scenario.with_work(work).arrivals, workers).seconds


def fifo_bound(scenario: WebhookScenario, workers: int, work: float | None = None) -> float:
    """Makespan with a perfect lock: zero overhead, strictly FIFO per order.

    Each webhook goes to the worker that is free first (at its arrival time at the earliest);
    that worker waits for the order's lock behind the order's earlier webhooks, runs the
    webhook for its work, then takes the next. Workers that wait behind a busy order sit idle,
    which is why even a perfect lock stays below an efficiency of 1. The demo has no such
    bound; this one is computed from the same schedule as :func:`ideal_makespan`.
    """
    free = [0.0] * workers
    order_free: dict[str, float] = {}
    end = 0.0
    for w in scenario.with_work(work).arrivals:
        took = max(heapq.heappop(free), w.arrival)
        start = max(took, order_free.get(w.order, 0.0))
        finish = start + w.work
        order_free[w.order] = finish
        heapq.heappush(free, finish)
        end = max(end, finish)
    return end


@dataclass
class WebhookResult:
    label: str
    scenario: str
    workers: int
    work_ms: float
    events: int
    makespan_s: float
    ideal_s: float
    efficiency: float
    bound_efficiency: float  # the zero-overhead strictly-FIFO lock on the same arrivals
    vs_bound: float  # efficiency / bound_efficiency
    order_violations: int  # ran before an earlier-arrived webhook of the same order
    lock_fifo_violations: int  # ... of the same order that had been waiting for the lock longer
    overlaps: int
    failed: int
    order_gap_p50_ms: float  # release -> next start within an order, when the next was waiting
    order_gap_p99_ms: float
    counters: dict[str, float] = field(default_factory=dict)
    per_grant: dict[str, float] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    trials: list[float] = field(default_factory=list)  # efficiency of every trial
    certain_lock_fifo_violations: int | None = None  # see certain_fifo_violations


def _webhook_job(adapter: LockAdapter, args: tuple[Any, ...], go: float) -> list[Handled]:
    prefix, arrivals, counter = args
    pid = os.getpid()
    clock = time.monotonic
    handled: list[Handled] = []
    while True:
        with counter.get_lock():
            index = counter.value
            counter.value += 1
        if index >= len(arrivals):
            return handled
        order, at, work = arrivals[index]
        delay = go + at - clock()
        if delay > 0:
            time.sleep(delay)
        took = clock()
        try:
            adapter.acquire(prefix + order)
        except Exception as exc:
            handled.append(Handled(index, order, pid, took, math.nan, math.nan, repr(exc)))
            continue
        start = clock()
        time.sleep(work)
        end = clock()
        adapter.release()
        handled.append(Handled(index, order, pid, took, start, end, queued=adapter.queued_at))


def run_webhooks(
    contenders: Sequence[Contender],
    scenario: WebhookScenario,
    *,
    workers: int = 8,
    trials: int = 1,
    timeout: float = 600.0,
    fifo_tolerance: float = DEFAULT_FIFO_TOLERANCE,
) -> list[WebhookResult]:
    """``workers`` processes take webhooks from the shared feed (a shared counter into the
    arrival list) and handle each under its order's lock for the webhook's work (a sleep).

    With ``trials`` > 1 the scenario runs that many times, interleaved over the contenders;
    each contender's trial of median efficiency is reported (``trials`` lists them all)."""
    ideal = ideal_makespan(scenario, workers)
    bound_eff = ideal / fifo_bound(scenario, workers)
    arrivals = [(w.order, w.arrival, w.work) for w in scenario.arrivals]
    runs: dict[str, list[WebhookResult]] = {c.label: [] for c in contenders}
    for trial in range(trials):
        for c in contenders:
            progress(
                f"  webhooks     {c.label}  {scenario.name} on {workers} workers"
                + (f"  trial {trial + 1}/{trials}" if trials > 1 else "")
            )
            prefix = f"bench-{secrets.token_hex(4)}:order:"
            counter = SPAWN.Value("q", 0)
            run = run_workers(
                c, _webhook_job, [(prefix, arrivals, counter)] * workers, timeout=timeout
            )
            handled = [h for worker in run.results for h in worker]
            done = [h for h in handled if not math.isnan(h.end)]
            failed = [h for h in handled if math.isnan(h.end)]
            makespan = max((h.end for h in done), default=math.nan) - min(run.go_times)
            efficiency = ideal / makespan if done and not failed else math.nan
            runs[c.label].append(
                WebhookResult(
                    label=c.label,
                    scenario=scenario.name,
                    workers=workers,
                    work_ms=scenario.work * 1000,
                    events=len(arrivals),
                    makespan_s=makespan,
                    ideal_s=ideal,
                    efficiency=efficiency,
                    bound_efficiency=bound_eff,
                    vs_bound=efficiency / bound_eff,
                    failed=len(failed),
                    counters=run.counters,
                    per_grant=_per(run.counters, len(done)) if done else {},
                    errors=sorted({h.error for h in failed}),
                    **webhook_metrics(handled, fifo_tolerance),
                )
            )
    # NaN (failed webhooks) sorts as the worst efficiency.
    return [_median_trial(runs[c.label], lambda r: r.efficiency, -1.0) for c in contenders]


# -- webhooks by queue, queue throughput -------------------------------------------------------
def _queue_webhook_job(adapter: Any, args: tuple[Any, ...], go: float) -> list[Handled]:
    """Role "put": the receiver, putting each webhook as it arrives, then a stop message per
    consumer once all are handled. Role "get": a worker."""
    role, arrivals, counter, consumers = args
    pid = os.getpid()
    clock = time.monotonic
    if role == "put":
        for index, (order, at, _work) in enumerate(arrivals):
            delay = go + at - clock()
            if delay > 0:
                time.sleep(delay)
            adapter.put({"i": index, "o": order}, key=order)
        while counter.value < len(arrivals):
            time.sleep(0.005)
        for _ in range(consumers):
            adapter.put({"stop": True})
        return []
    handled: list[Handled] = []
    while True:
        got = adapter.take(timeout=30)
        if got is None:
            raise RuntimeError("no message for 30 s")
        payload, handle = got
        if "stop" in payload:
            adapter.done(handle)
            return handled
        took = start = clock()
        time.sleep(arrivals[payload["i"]][2])
        end = clock()
        adapter.done(handle)
        with counter.get_lock():
            counter.value += 1
        handled.append(Handled(payload["i"], payload["o"], pid, took, start, end))


def _throughput_job(adapter: Any, args: tuple[Any, ...], go: float) -> Any:
    """Role "put": put ``count`` messages at ``rate`` per second (0: pre-filled, nothing to
    do), keyed ``k<i % keys>`` when ``keys``. Role "get": take and settle until a stop
    message (a worker loop's adapter: be the loop's handler until then); record (sent,
    start, settled)."""
    role, count, rate, consumers, keys = args
    clock = time.monotonic
    if role == "put":
        for i in range(count):
            if rate:
                delay = go + i / rate - clock()
                if delay > 0:
                    time.sleep(delay)
            adapter.put({"i": i, "t": clock()}, key=f"k{i % keys}" if keys else None)
        for _ in range(consumers):
            adapter.put({"stop": True, "t": clock()})
        return []
    seen: list[tuple[float, float, float]] = []
    if isinstance(adapter, WorkerLoopQueue):
        # The consumer is the loop's handler. A loop settles a message before it delivers
        # the next, so a message counts as settled when the handler is called again (for
        # the last one, when the loop returns: a loop that prefetches acks a batch only with
        # its next claim, or at its end).
        in_hand: tuple[float, float] | None = None  # (sent, start) of the message in hand

        def handler(payload: Any) -> bool:
            nonlocal in_hand
            now = clock()
            if in_hand is not None:
                seen.append((*in_hand, now))
            if "stop" in payload:
                return True
            in_hand = (payload["t"], now)
            return False

        adapter.serve(handler)
        if seen:
            sent, start, _ = seen[-1]
            seen[-1] = (sent, start, clock())
        return seen
    while True:
        got = adapter.take(timeout=30)
        if got is None:
            raise RuntimeError("no message for 30 s")
        payload, handle = got
        start = clock()
        adapter.done(handle)
        if "stop" in payload:
            return seen
        seen.append((payload["t"], start, clock()))


@dataclass
class WebhookRow:
    store: str
    how: str
    makespan_s: float
    ideal_s: float
    efficiency: float
    order_violations: int
    overlaps: int
    worker_wait_s: float  # summed: holding a webhook it could not start yet
    start_p50_ms: float  # arrival -> start
    start_p99_ms: float


def _webhook_row(
    store: str,
    how: str,
    handled: list[Handled],
    go: float,
    scenario: WebhookScenario,
    workers: int,
) -> WebhookRow:
    arrivals = scenario.arrivals
    done = [h for h in handled if not math.isnan(h.end)]
    metrics = webhook_metrics(done)
    ideal = ideal_makespan(scenario, workers)
    makespan = max(h.end for h in done) - go
    lat = [h.start - (go + arrivals[h.index].arrival) for h in done]
    return WebhookRow(
        store,
        how,
        makespan,
        ideal,
        ideal / makespan,
        metrics["order_violations"],
        metrics["overlaps"],
        sum(h.start - h.took for h in done),
        percentile(lat, 50) * 1000,
        percentile(lat, 99) * 1000,
    )


def run_webhook_pair(
    store: str, url: str, scenario: WebhookScenario, workers: int
) -> list[WebhookRow]:
    """The webhooks on one store by Turnstile lock (the feed of :func:`run_webhooks`) and by
    Turnstile queue (a receiver puts each webhook as it arrives, keyed by its order; W workers
    ``get`` the next deliverable one)."""
    rows = []
    arrivals = [(w.order, w.arrival, w.work) for w in scenario.arrivals]
    progress(f"  webhooks by lock   on {store}")
    lock = Contender("lock", functools.partial(TurnstileLock, url))
    counter = SPAWN.Value("q", 0)
    prefix = f"bench-{secrets.token_hex(4)}:order:"
    run = run_workers(lock, _webhook_job, [(prefix, arrivals, counter)] * workers, timeout=600)
    handled = [h for r in run.results for h in r]
    rows.append(_webhook_row(store, "by lock", handled, min(run.go_times), scenario, workers))
    progress(f"  webhooks by queue  on {store}")
    name = f"bench-{secrets.token_hex(4)}:webhooks"
    queue = Contender("queue", functools.partial(TurnstileQueue, url, name))
    counter = SPAWN.Value("q", 0)
    jobs = [("put", arrivals, counter, workers)] + [("get", arrivals, counter, workers)] * workers
    run = run_workers(queue, _queue_webhook_job, jobs, timeout=600)
    handled = [h for r in run.results for h in r]
    rows.append(_webhook_row(store, "by queue", handled, min(run.go_times), scenario, workers))
    return rows


@dataclass
class ThroughputRow:
    store: str
    queue: str
    messages: int
    consumers: int
    per_second: float
    paced_rate: float
    latency_p50_ms: float
    latency_p99_ms: float
    notes: str = ""
    extra: dict[str, Any] = field(default_factory=dict)
    keys: int = 0  # messages spread over this many keys (0: no key)


def run_throughput(
    store: str,
    label: str,
    factory: Callable[[], QueueAdapter],
    count: int,
    paced: int,
    rate: float,
    consumers: int,
    note: str = "",
    keys: int = 0,
) -> ThroughputRow:
    """Drain: ``count`` messages put before the start line, ``consumers`` take + settle them
    as fast as they can (messages/s, from the first message started to the last settled, so
    a consumer that starts its worker machinery on first use, like procrastinate's, is not
    charged for it). Latency: one producer puts ``paced`` messages at ``rate`` per second
    while the consumers wait (put -> start p50/p99). ``keys`` > 0: message ``i`` has the key
    ``k<i % keys>`` (per-key FIFO, one in flight per key), else no key."""
    progress(f"  throughput {label} on {store}" + (f", {keys} keys" if keys else ""))
    contender = Contender(label, factory)
    filler = factory()  # the parent fills the queue through one adapter
    for i in range(count):
        filler.put({"i": i, "t": 0.0}, key=f"k{i % keys}" if keys else None)
    for _ in range(consumers):
        filler.put({"stop": True, "t": 0.0})
    filler.close()
    run = run_workers(
        contender,
        _throughput_job,
        [("get", 0, 0, consumers, keys)] * consumers,
        timeout=900,
    )
    seen = [s for r in run.results for s in r]
    elapsed = max(e for _, _, e in seen) - min(s for _, s, _ in seen)
    per_second = len(seen) / elapsed
    jobs = [("put", paced, rate, consumers, keys)] + [("get", 0, 0, consumers, keys)] * consumers
    run = run_workers(contender, _throughput_job, jobs, timeout=900)
    lat = [start - sent for r in run.results for sent, start, _ in r]
    return ThroughputRow(
        store,
        label,
        count,
        consumers,
        per_second,
        rate,
        percentile(lat, 50) * 1000,
        percentile(lat, 99) * 1000,
        note,
        keys=keys,
    )
