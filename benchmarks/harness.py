"""A small harness for comparing lock implementations side by side, on real processes.

A benchmark script lists *contenders* — a label plus a factory that builds a
:class:`LockAdapter` inside each worker process — and runs the scenarios below on all of them
in one run (the machine drifts, so numbers from different runs do not compare):

* :func:`run_uncontended` — one process, acquire + release of a free lock, ops/s;
* :func:`run_handover` — P processes contending for one name with short critical sections:
  every grant's ``[wait start, start, end, pid]`` is recorded and turned into the gap to
  another process (p50/p99), the share of handovers that go to another process, the longest
  streak of one process, FIFO violations and overlaps;
* :func:`run_webhooks` — the SPEC's problem: K orders x E webhooks arrive in a seeded random
  order; W worker processes take the next webhook from a shared feed and handle it under its
  order's lock. Makespan, efficiency = ideal / makespan, order violations, and the same
  efficiency for a zero-overhead strictly-FIFO lock on the same arrivals (:func:`fifo_bound`).

Workers are started with the ``spawn`` method, so a factory must be picklable: a module-level
class (or a :func:`functools.partial` of one) whose constructor connects. Adding a library::

    class RedisPyLock(LockAdapter):
        def __init__(self, url: str) -> None:
            self.redis = redis.Redis.from_url(url)
        def acquire(self, name: str) -> None:
            self.lock = self.redis.lock(name, timeout=30)
            self.lock.acquire()
        def release(self) -> None:
            self.lock.release()

    Contender("redis-py Lock", functools.partial(RedisPyLock, url))

Times are ``time.monotonic()`` (``CLOCK_MONOTONIC``, one clock for every process on a host).
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import heapq
import itertools
import json
import math
import multiprocessing
import os
import platform
import queue
import random
import secrets
import statistics
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

SPAWN = multiprocessing.get_context("spawn")
STARTUP_TIMEOUT = 180.0  # spawning 32 interpreters on 2 busy cores takes a while
DEFAULT_FIFO_TOLERANCE = 0.001


class BenchmarkError(RuntimeError):
    """A worker failed or a scenario did not finish in time."""


# --------------------------------------------------------------------------------------------
# adapters and contenders
# --------------------------------------------------------------------------------------------
class LockAdapter:
    """One worker process's handle on one lock implementation.

    Built once per worker process (by the contender's factory), then used sequentially: each
    :meth:`acquire` (block until ``name`` is held) is followed by one :meth:`release`. A worker
    holds at most one lock at a time, so an adapter may keep the held lock in an attribute.

    ``queued_at``: after an :meth:`acquire` that had to wait, the monotonic time at which the
    lock *confirmed* that the request was in line (NaN if it was granted at once, or if the
    lock never says so, like a blocking ``pg_advisory_lock`` or ``redis.lock.Lock``). It makes
    the certain FIFO check possible (:func:`certain_fifo_violations`).
    """

    queued_at: float = math.nan

    def acquire(self, name: str) -> None:
        raise NotImplementedError

    def release(self) -> None:
        raise NotImplementedError

    def close(self) -> None:
        """Called once when the worker is done (close connections)."""


Probe = Callable[[], Mapping[str, float]]


@dataclass(frozen=True)
class Contender:
    """A lock implementation under test.

    ``factory`` runs in every worker process and must be picklable. ``probe`` (optional) runs
    in the parent and returns counters of the store (e.g. Redis commands processed,
    PostgreSQL transactions committed); it is read right before the workers start and right
    after they finish, and the differences are reported per grant.
    """

    label: str
    factory: Callable[[], LockAdapter]
    note: str = ""
    probe: Probe | None = None


class TurnstileLock(LockAdapter):
    """Turnstile's lock on any URL, used the way the SPEC shows it: ``with lock.acquire():``
    (the lease auto-renews in the background while held). ``renew=False`` uses a bare
    ``acquire()`` / ``release()`` without the renewing context manager."""

    def __init__(self, url: str, ttl: float = 30.0, renew: bool = True) -> None:
        import logging

        import turnstile

        self._client = turnstile.connect(url)
        self._ttl = ttl
        self._renew = renew
        self._lease: Any = None
        # Turnstile logs (at DEBUG, with the position as an extra field) the moment the store
        # answered that a blocking acquire is in line: that is our queued_at.
        adapter = self

        class Queued(logging.Handler):
            def emit(self, record: logging.LogRecord) -> None:
                if getattr(record, "turnstile_position", None) is not None:
                    adapter.queued_at = time.monotonic()

        log = logging.getLogger("turnstile.lock.acquire")
        log.addHandler(Queued(logging.DEBUG))
        log.setLevel(logging.DEBUG)
        log.propagate = False

    def acquire(self, name: str) -> None:
        self.queued_at = math.nan
        lease = self._client.lock(name, ttl=self._ttl).acquire()
        if self._renew:
            lease.__enter__()
        self._lease = lease

    def release(self) -> None:
        lease, self._lease = self._lease, None
        if self._renew:
            lease.__exit__(None, None, None)
        else:
            lease.release()

    def close(self) -> None:
        self._client.close()


# --------------------------------------------------------------------------------------------
# statistics
# --------------------------------------------------------------------------------------------
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


# --------------------------------------------------------------------------------------------
# running workers
# --------------------------------------------------------------------------------------------
Job = Callable[[LockAdapter, Any, float], Any]


def _worker_entry(
    job: Job,
    factory: Callable[[], LockAdapter],
    args: Any,
    warm_name: str,
    barrier: Any,
    done: Any,
    out: Any,
) -> None:
    try:
        adapter = factory()
        # Warm up on a private name: connections opened, scripts loaded, files created.
        adapter.acquire(warm_name)
        adapter.release()
        barrier.wait()
        go = time.monotonic()
        result = job(adapter, args, go)
        out.put(("ok", os.getpid(), (go, result)))
        done.wait(60)
        adapter.close()
    except BaseException:
        with contextlib.suppress(Exception):
            barrier.abort()
        out.put(("error", os.getpid(), traceback.format_exc()))


@dataclass
class WorkerRun:
    """What :func:`run_workers` returns: each worker's result and start time, store counters."""

    results: list[Any]
    go_times: list[float]
    counters: dict[str, float]


def run_workers(
    contender: Contender,
    job: Job,
    jobs: Sequence[Any],
    *,
    timeout: float,
) -> WorkerRun:
    """Start one spawned process per entry of ``jobs``; each builds the contender's adapter,
    warms it up, waits until all are ready, then runs ``job(adapter, args, go_time)``.

    Raises :class:`BenchmarkError` if a worker fails or the run exceeds ``timeout`` seconds
    after the start signal. The contender's probe is read while all workers wait at the start
    line and again once they have all reported, so connection setup is not counted.
    """
    run_id = secrets.token_hex(4)
    barrier = SPAWN.Barrier(len(jobs) + 1, timeout=STARTUP_TIMEOUT)
    done = SPAWN.Event()
    out = SPAWN.Queue()
    procs = [
        SPAWN.Process(
            target=_worker_entry,
            args=(job, contender.factory, args, f"bench-warmup-{run_id}-{i}", barrier, done, out),
            daemon=True,
        )
        for i, args in enumerate(jobs)
    ]
    for proc in procs:
        proc.start()
    errors: list[str] = []
    results: list[Any] = []
    go_times: list[float] = []
    counters: dict[str, float] = {}
    try:
        # The parent is one party of the start line, so it can read the probe meanwhile.
        started = _wait_start(barrier, out, errors, procs)
        before = dict(contender.probe()) if contender.probe is not None and started else {}
        if started:
            try:
                barrier.wait()
            except threading.BrokenBarrierError:
                started = False
                with contextlib.suppress(queue.Empty):
                    kind, _pid, payload = out.get(timeout=2.0)
                    if kind == "error":
                        errors.append(payload)
                if not errors:
                    errors.append("the start line broke (a worker failed getting ready)")
        deadline = time.monotonic() + timeout
        while started and len(results) + len(errors) < len(jobs):
            try:
                kind, _pid, payload = out.get(timeout=0.5)
            except queue.Empty:
                if time.monotonic() > deadline:
                    errors.append(f"timed out after {timeout:.0f} s")
                    break
                if any(p.exitcode not in (None, 0) for p in procs):
                    time.sleep(0.5)  # let its error message arrive
                    with contextlib.suppress(queue.Empty):
                        kind, _pid, payload = out.get_nowait()
                        if kind == "error":
                            errors.append(payload)
                    if not errors:
                        errors.append("a worker process died without reporting")
                    break
                continue
            if kind == "error":
                errors.append(payload)
                break
            go, result = payload
            go_times.append(go)
            results.append(result)
        if not errors and contender.probe is not None:
            after = contender.probe()
            counters = {k: after[k] - before.get(k, 0.0) for k in after}
    finally:
        done.set()
        with contextlib.suppress(Exception):
            barrier.abort()
        for proc in procs:
            proc.join(timeout=10)
            if proc.is_alive():
                proc.terminate()
                proc.join(timeout=5)
        out.close()
    if errors:
        raise BenchmarkError(f"{contender.label}: {errors[0]}")
    return WorkerRun(results, go_times, counters)


def _wait_start(barrier: Any, out: Any, errors: list[str], procs: Sequence[Any]) -> bool:
    """Wait until every worker stands at the start line (or one failed getting there)."""
    deadline = time.monotonic() + STARTUP_TIMEOUT
    while barrier.n_waiting < barrier.parties - 1:
        with contextlib.suppress(queue.Empty):
            kind, _pid, payload = out.get(timeout=0.05)
            if kind == "error":
                errors.append(payload)
                return False
        if any(p.exitcode is not None for p in procs):
            time.sleep(0.5)  # let its error message arrive
            with contextlib.suppress(queue.Empty):
                kind, _pid, payload = out.get_nowait()
                if kind == "error":
                    errors.append(payload)
                    return False
            errors.append("a worker process exited before the start")
            return False
        if time.monotonic() > deadline:
            errors.append(f"workers not ready after {STARTUP_TIMEOUT:.0f} s")
            return False
    return True


def _progress(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


# --------------------------------------------------------------------------------------------
# scenario 1: uncontended acquire + release
# --------------------------------------------------------------------------------------------
@dataclass
class UncontendedResult:
    label: str
    iterations: int
    seconds: float
    ops_per_s: float
    p50_ms: float
    p99_ms: float
    trials: list[float] = field(default_factory=list)  # ops/s of each trial


def _uncontended_job(adapter: LockAdapter, args: tuple[str, int, float], go: float) -> Any:
    name, iterations, max_seconds = args
    latencies: list[float] = []
    clock = time.monotonic
    stop = go + max_seconds
    for _ in range(iterations):
        t0 = clock()
        adapter.acquire(name)
        adapter.release()
        t1 = clock()
        latencies.append(t1 - t0)
        if t1 > stop:
            break
    return latencies


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
    for trial in range(trials):
        for c in contenders:
            _progress(f"  uncontended  {c.label}  trial {trial + 1}/{trials}")
            name = f"bench-{secrets.token_hex(4)}:uncontended"
            run = run_workers(
                c, _uncontended_job, [(name, iterations, max_seconds)], timeout=max_seconds + 120
            )
            samples[c.label].append(run.results[0])
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
            )
        )
    return results


# --------------------------------------------------------------------------------------------
# scenario 2: handover between contending processes
# --------------------------------------------------------------------------------------------
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


def run_handover(
    contenders: Sequence[Contender],
    *,
    processes: int = 4,
    rounds: int = 20,
    hold: float = 0.002,
    max_seconds: float = 20.0,
    fifo_tolerance: float = DEFAULT_FIFO_TOLERANCE,
) -> list[HandoverResult]:
    """``processes`` processes each acquire one name ``rounds`` times (none starts a new
    round after ``max_seconds``, which bounds slow polling locks), holding it ``hold`` s."""
    results = []
    for c in contenders:
        _progress(f"  handover     {c.label}  {processes} processes")
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
        results.append(
            HandoverResult(
                label=c.label,
                processes=processes,
                hold_ms=hold * 1000,
                fifo_tolerance_ms=fifo_tolerance * 1000,
                seconds=seconds,
                counters=run.counters,
                per_grant={k: v / len(grants) for k, v in run.counters.items()} if grants else {},
                **metrics,
            )
        )
    return results


# --------------------------------------------------------------------------------------------
# scenario 3: webhooks per order
# --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Arrival:
    """A webhook: its order, and when it arrives (seconds after the start; 0 = already queued).
    The feed is in arrival order."""

    order: str
    at: float = 0.0


@dataclass(frozen=True)
class WebhookScenario:
    name: str
    arrivals: tuple[Arrival, ...]

    @classmethod
    def random(
        cls, orders: int, per_order: int, seed: int = 1, spacing: float = 0.0
    ) -> WebhookScenario:
        """``orders`` x ``per_order`` webhooks in a seeded random order, ``spacing`` s apart
        (0: all already waiting in the feed when the workers start)."""
        width = len(str(orders))
        feed = [f"{i:0{width}d}" for i in range(orders) for _ in range(per_order)]
        random.Random(seed).shuffle(feed)
        return cls(
            f"{orders} orders x {per_order} webhooks, random order (seed {seed})",
            tuple(Arrival(o, i * spacing) for i, o in enumerate(feed)),
        )

    @classmethod
    def parse(cls, text: str, spacing: float = 0.0) -> WebhookScenario:
        """The demo's notation: ``"RA1,RA2,RB1,RB2,RB3"`` — order = the letters after the
        leading ``R``, the number is its sequence within the order (informative only)."""
        orders = []
        for item in text.split(","):
            item = item.strip()
            body = item[1:] if item[:1] in "Rr" and len(item) > 1 else item
            order = body.rstrip("0123456789") or body
            orders.append(order)
        return cls(text, tuple(Arrival(o, i * spacing) for i, o in enumerate(orders)))

    def longest_order(self) -> int:
        counts: dict[str, int] = {}
        for a in self.arrivals:
            counts[a.order] = counts.get(a.order, 0) + 1
        return max(counts.values(), default=0)


def ideal_makespan(scenario: WebhookScenario, workers: int, work: float) -> float:
    """No lock can beat this: total work spread over all workers, and never less than the
    longest order's events back to back (nor the last arrival plus its work)."""
    n = len(scenario.arrivals)
    last = max((a.at for a in scenario.arrivals), default=0.0)
    return max(n * work / workers, scenario.longest_order() * work, last + work)


def fifo_bound(scenario: WebhookScenario, workers: int, work: float) -> float:
    """Makespan with a perfect lock: zero overhead, strictly FIFO per order.

    Each webhook goes to the worker that is free first (at its arrival time at the earliest);
    that worker waits for the order's lock behind the order's earlier webhooks, runs the
    webhook for ``work`` seconds, then takes the next. Workers that wait behind a busy order
    sit idle, which is why even a perfect lock stays below an efficiency of 1.
    """
    free = [0.0] * workers
    order_free: dict[str, float] = {}
    end = 0.0
    for a in scenario.arrivals:
        took = max(heapq.heappop(free), a.at)
        start = max(took, order_free.get(a.order, 0.0))
        finish = start + work
        order_free[a.order] = finish
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
    queued: float = math.nan  # when the lock confirmed the request in line (see LockAdapter)


def _webhook_job(adapter: LockAdapter, args: tuple[Any, ...], go: float) -> list[Handled]:
    prefix, arrivals, work, counter = args
    pid = os.getpid()
    clock = time.monotonic
    handled: list[Handled] = []
    while True:
        with counter.get_lock():
            index = counter.value
            counter.value += 1
        if index >= len(arrivals):
            return handled
        order, at = arrivals[index]
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


def run_webhooks(
    contenders: Sequence[Contender],
    scenario: WebhookScenario,
    *,
    workers: int = 8,
    work: float = 0.02,
    trials: int = 1,
    timeout: float = 600.0,
    fifo_tolerance: float = DEFAULT_FIFO_TOLERANCE,
) -> list[WebhookResult]:
    """``workers`` processes take webhooks from the shared feed (a shared counter into the
    arrival list) and handle each under its order's lock for ``work`` seconds.

    With ``trials`` > 1 the scenario runs that many times, interleaved over the contenders;
    each contender's trial of median efficiency is reported (``trials`` lists them all)."""
    ideal = ideal_makespan(scenario, workers, work)
    bound_eff = ideal / fifo_bound(scenario, workers, work)
    arrivals = [(a.order, a.at) for a in scenario.arrivals]
    runs: dict[str, list[WebhookResult]] = {c.label: [] for c in contenders}
    for trial in range(trials):
        for c in contenders:
            _progress(
                f"  webhooks     {c.label}  {scenario.name} on {workers} workers"
                + (f"  trial {trial + 1}/{trials}" if trials > 1 else "")
            )
            prefix = f"bench-{secrets.token_hex(4)}:order:"
            counter = SPAWN.Value("q", 0)
            run = run_workers(
                c, _webhook_job, [(prefix, arrivals, work, counter)] * workers, timeout=timeout
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
                    work_ms=work * 1000,
                    events=len(arrivals),
                    makespan_s=makespan,
                    ideal_s=ideal,
                    efficiency=efficiency,
                    bound_efficiency=bound_eff,
                    vs_bound=efficiency / bound_eff,
                    failed=len(failed),
                    counters=run.counters,
                    per_grant={k: v / len(done) for k, v in run.counters.items()} if done else {},
                    errors=sorted({h.error for h in failed}),
                    **webhook_metrics(handled, fifo_tolerance),
                )
            )
    results = []
    for c in contenders:
        # NaN (failed webhooks) sorts as the worst efficiency.
        ranked = sorted(
            runs[c.label], key=lambda r: -1.0 if math.isnan(r.efficiency) else r.efficiency
        )
        chosen = ranked[(len(ranked) - 1) // 2]
        chosen.trials = [r.efficiency for r in runs[c.label]]
        results.append(chosen)
    return results


# --------------------------------------------------------------------------------------------
# reporting
# --------------------------------------------------------------------------------------------
def fmt(value: Any, digits: int = 2) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        if math.isnan(value):
            return "-"
        if abs(value) >= 1000:
            return f"{value:,.0f}"
        return f"{value:.{digits}f}"
    return str(value)


def markdown_table(headers: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    lines = [
        "| " + " | ".join(headers) + " |",
        "|" + "|".join("---" if i == 0 else "---:" for i in range(len(headers))) + "|",
    ]
    for row in rows:
        lines.append("| " + " | ".join(fmt(v) for v in row) + " |")
    return "\n".join(lines)


def ratio(value: float, base: float) -> float:
    if base == 0 or math.isnan(base) or math.isnan(value):
        return math.nan
    return value / base


def _baseline(results: Sequence[Any], baseline: str | None) -> Any:
    return next((r for r in results if r.label == baseline), None)


def uncontended_table(results: Sequence[UncontendedResult], baseline: str | None = None) -> str:
    base = _baseline(results, baseline)
    headers = ["lock", "acquire+release /s", "p50 ms", "p99 ms", "trials (ops/s)"]
    if base is not None:
        headers.insert(2, f"vs {baseline}")
    rows = []
    for r in results:
        row: list[Any] = [
            r.label,
            r.ops_per_s,
            r.p50_ms,
            r.p99_ms,
            " / ".join(f"{t:,.0f}" for t in r.trials),
        ]
        if base is not None:
            row.insert(2, ratio(r.ops_per_s, base.ops_per_s))
        rows.append(row)
    return markdown_table(headers, rows)


def handover_table(
    results: Sequence[HandoverResult], baseline: str | None = None, counters: bool = False
) -> str:
    base = _baseline(results, baseline)
    headers = [
        "lock",
        "procs",
        "gap to other p50 ms",
        "p99 ms",
        "max ms",
        "to another process",
        "longest streak",
        "FIFO violations (call time ±1 ms)",
        "certain FIFO violations",
        "overlaps",
    ]
    if base is not None:
        headers.insert(3, f"p50 vs {baseline}")
    keys = sorted({k for r in results for k in r.per_grant}) if counters else []
    headers += [f"{k} / grant" for k in keys]
    rows = []
    for r in results:
        row: list[Any] = [
            r.label,
            r.processes,
            r.gap_p50_ms,
            r.gap_p99_ms,
            r.gap_max_ms,
            f"{r.to_other} of {r.handovers}",
            r.longest_streak,
            f"{r.fifo_violations} of {r.grants}",
            _certain(r.certain_fifo_violations, r.grants),
            r.overlaps,
        ]
        if base is not None:
            row.insert(3, ratio(r.gap_p50_ms, base.gap_p50_ms))
        row += [r.per_grant.get(k, math.nan) for k in keys]
        rows.append(row)
    return markdown_table(headers, rows)


def _certain(count: int | None, of: int | None) -> str:
    """A certain FIFO count; "-" for a lock that never confirms a place in line."""
    if count is None:
        return "-"
    return f"{count} of {of}" if of is not None else str(count)


def webhook_table(
    results: Sequence[WebhookResult], baseline: str | None = None, counters: bool = False
) -> str:
    base = _baseline(results, baseline)
    headers = [
        "lock",
        "makespan s",
        "efficiency",
        "perfect FIFO lock",
        "vs perfect",
        "out of order",
        "lock FIFO violations (call time ±1 ms)",
        "certain lock FIFO violations",
        "overlaps",
        "in-order handover p50 ms",
        "p99 ms",
        "failed",
        "efficiency per trial",
    ]
    if base is not None:
        headers.insert(3, f"vs {baseline}")
    keys = sorted({k for r in results for k in r.per_grant}) if counters else []
    headers += [f"{k} / grant" for k in keys]
    rows = []
    for r in results:
        row: list[Any] = [
            r.label,
            r.makespan_s,
            r.efficiency,
            r.bound_efficiency,
            r.vs_bound,
            f"{r.order_violations} of {r.events}",
            r.lock_fifo_violations,
            _certain(r.certain_lock_fifo_violations, None),
            r.overlaps,
            r.order_gap_p50_ms,
            r.order_gap_p99_ms,
            r.failed,
            " / ".join(fmt(t) for t in r.trials),
        ]
        if base is not None:
            row.insert(3, ratio(r.efficiency, base.efficiency))
        row += [r.per_grant.get(k, math.nan) for k in keys]
        rows.append(row)
    return markdown_table(headers, rows)


def machine_info(packages: Sequence[str] = ()) -> dict[str, Any]:
    """Where and when: for the header of a results file."""
    from importlib import metadata

    versions = {}
    for package in packages:
        try:
            versions[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            versions[package] = "not installed"
    return {
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "nproc": os.cpu_count(),
        "loadavg": [round(x, 2) for x in os.getloadavg()],
        "python": platform.python_version(),
        "platform": platform.platform(),
        "versions": versions,
    }


def machine_lines(info: Mapping[str, Any], command: str) -> list[str]:
    versions = ", ".join(f"{k} {v}" for k, v in info["versions"].items())
    return [
        f"- command: `{command}`",
        f"- date: {info['date']}",
        f"- machine: {info['nproc']} CPUs (nproc), load average at start "
        f"{' / '.join(str(x) for x in info['loadavg'])}, {info['platform']}",
        f"- python {info['python']}" + (f"; {versions}" if versions else ""),
    ]


def to_json(obj: Any) -> str:
    """Results (dataclasses, lists, dicts) as JSON; NaN becomes null."""

    def clean(value: Any) -> Any:
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            return clean(dataclasses.asdict(value))
        if isinstance(value, Mapping):
            return {str(k): clean(v) for k, v in value.items()}
        if isinstance(value, list | tuple):
            return [clean(v) for v in value]
        if isinstance(value, float) and (math.isnan(value) or math.isinf(value)):
            return None
        return value

    return json.dumps(clean(obj), indent=2)


__all__ = [
    "Arrival",
    "BenchmarkError",
    "Contender",
    "Grant",
    "Handled",
    "HandoverResult",
    "LockAdapter",
    "TurnstileLock",
    "UncontendedResult",
    "WebhookResult",
    "WebhookScenario",
    "count_overlaps",
    "fifo_bound",
    "fifo_violations",
    "fmt",
    "handover_metrics",
    "handover_table",
    "ideal_makespan",
    "longest_streak",
    "machine_info",
    "machine_lines",
    "markdown_table",
    "percentile",
    "ratio",
    "run_handover",
    "run_uncontended",
    "run_webhooks",
    "run_workers",
    "to_json",
    "uncontended_table",
    "webhook_metrics",
    "webhook_table",
]
