"""Running the scenario: real worker processes (spawned, each with its own connection to the
store) handle the webhooks as they arrive, in one of two ways to give each order one turn at
a time. Both go through the public client API only.

**Per-order locks** (:func:`run_scenario`, ``turnstile demo``). Webhooks are delivered one
at a time in arrival order to whichever worker is free; on delivery the worker *joins the
line* of the webhook's order (``client.lock(f"order:{order}").try_acquire(holder)``), then
waits for its turn (``acquire``, woken by the store), does the work with the lease held (and
renewed), and releases it, which hands the lock to the next webhook of that order. Joining
the line on delivery makes "arrival order" well defined: it is the order in which the lock
was asked for, which the lock's FIFO guarantee preserves. Which lock is used is pluggable
(an :class:`OrderLock`, named by import path so that spawned workers can load it), so the
same scenario runs over other locks.

**A keyed queue** (:func:`run_queue_scenario`, ``turnstile demo --queue``). Each webhook is
put into a queue keyed by its order as it arrives, and workers take the next deliverable
message. A worker is only ever handed a webhook it can run at once (its order has nothing
in flight), so no worker sits idle waiting on a lock, and the order within each order is
the put order however bursty the arrivals. Its records have ``asked`` = when it was put and
no token; :func:`worker_wait` measures the time workers held a webhook they could not start
(about zero here; the lock variant's workers wait in line holding one).
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import multiprocessing
import os
import queue
import signal
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from multiprocessing.process import BaseProcess
from typing import Any, Protocol

from .. import Client, Lease, Lock, connect
from .arrivals import DemoError, EventRecord, Failure, ScenarioResult, Update, Webhook

DEFAULT_STRATEGY = "turnstile.demo:TurnstileOrderLock"
IDLE_LIMIT = 120.0  # a worker that gets nothing for this long exits (bounds every wait)

# What a worker tells the parent, on the ``results`` queue (times are time.time()):
#   ("ready", worker, pid)                 connected; ("dead", worker, error) could not
#   ("started", id, worker, token, received, started)
#   ("ended", id, worker, holder, token, asked | None, started, ended)
#       asked None: the parent knows it (the queue variant asks when it puts)
#   ("failed", id, worker, error)          after "ended" too, if the turn was lost meanwhile


# -- taking turns with a lock -------------------------------------------------------------


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


def _lock_worker(
    index: int,
    url: str,
    strategy: str,
    options: dict[str, Any],
    tasks: Any,
    results: Any,
    intake: Any,
) -> None:
    """Take the next webhook as it arrives, take its order's turn, work, hand over."""
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
                    results.put(("started", item.id, index, token, asked, started))
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
    schedule = _arrival_order(schedule, workers)
    ctx = multiprocessing.get_context("spawn")  # no fork: a forked sqlite/redis handle is unsafe
    tasks = ctx.Queue()
    results = ctx.Queue()
    intake = ctx.Lock()
    procs = [
        ctx.Process(
            target=_lock_worker,
            args=(i + 1, url, strategy, dict(options or {}), tasks, results, intake),
            name=f"turnstile-demo-worker-{i + 1}",
            daemon=True,
        )
        for i in range(workers)
    ]
    run = _Run(procs, results, schedule, on_update, _start(procs))
    stopped = False

    def stop() -> None:
        nonlocal stopped
        if not stopped:
            for _ in procs:
                tasks.put(None)  # each worker exits after its last webhook
            stopped = True

    try:
        run.drive(tasks.put, stop, on_ready, startup_timeout, run_timeout)
    except BaseException:
        for proc in procs:  # interrupted or failed: no point in finishing the work
            proc.terminate()
        raise
    finally:
        stop()
        _join(procs)
        for channel in (tasks, results):
            channel.close()
            channel.cancel_join_thread()
    return run.result()


# -- taking turns through a keyed queue ---------------------------------------------------


@dataclass(frozen=True)
class QueueScenarioResult(ScenarioResult):
    received: dict[str, float]  # webhook id -> when its worker got it (since t0)


def worker_wait(result: QueueScenarioResult) -> float:
    """Seconds workers spent holding a webhook they could not start yet (summed)."""
    return sum(max(0.0, r.started - result.received[r.webhook.id]) for r in result.records)


def _queue_worker(index: int, url: str, name: str, vt: float, results: Any, stop: Any) -> None:
    """Take the next deliverable webhook, work, acknowledge."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    try:
        client = connect(url)
        webhooks = client.queue(name, visibility_timeout=vt)
    except BaseException as exc:
        results.put(("dead", index, f"{type(exc).__name__}: {exc}"))
        return
    results.put(("ready", index, os.getpid()))
    try:
        idle_since = time.monotonic()
        while not stop.is_set() and time.monotonic() - idle_since < IDLE_LIMIT:
            message = webhooks.get(timeout=0.5)
            if message is None:
                continue
            received = time.time()
            hook = Webhook(**message.payload)
            started = time.time()
            results.put(("started", hook.id, index, None, received, started))
            time.sleep(hook.work)
            ended = time.time()
            if message.ack():
                holder = f"worker{index}/{os.getpid()}"
                results.put(("ended", hook.id, index, holder, None, None, started, ended))
            else:
                results.put(("failed", hook.id, index, "ack refused (visibility timeout passed)"))
            idle_since = time.monotonic()
    finally:
        client.close()


def run_queue_scenario(
    url: str,
    schedule: Sequence[Webhook],
    *,
    workers: int,
    name: str = "webhooks",
    visibility_timeout: float = 30.0,
    on_update: Callable[[Update], None] | None = None,
    on_ready: Callable[[float], None] | None = None,
    startup_timeout: float = 60.0,
    run_timeout: float | None = None,
) -> QueueScenarioResult:
    """Start ``workers`` processes consuming queue ``name``; put ``schedule`` at its arrival
    times (key = order) once all are ready; collect what happened, as :func:`run_scenario`
    does."""
    schedule = _arrival_order(schedule, workers)
    ctx = multiprocessing.get_context("spawn")
    results = ctx.Queue()
    stop = ctx.Event()
    procs = [
        ctx.Process(
            target=_queue_worker,
            args=(i + 1, url, name, visibility_timeout, results, stop),
            name=f"turnstile-queue-demo-worker-{i + 1}",
            daemon=True,
        )
        for i in range(workers)
    ]
    run = _Run(procs, results, schedule, on_update, _start(procs))
    try:
        with connect(url) as client:
            webhooks = client.queue(name, visibility_timeout=visibility_timeout)

            def put(hook: Webhook) -> None:
                webhooks.put(dataclasses.asdict(hook), key=hook.order)

            run.drive(put, lambda: None, on_ready, startup_timeout, run_timeout)
    except BaseException:
        for proc in procs:  # interrupted or failed: no point in finishing the work
            proc.terminate()
        raise
    finally:
        stop.set()
        _join(procs)
        results.close()
        results.cancel_join_thread()
    done = run.result()
    return QueueScenarioResult(
        done.schedule, done.records, done.failures, done.workers, done.startup, run.received
    )


# -- the parent's side, shared by both ----------------------------------------------------


def _arrival_order(schedule: Sequence[Webhook], workers: int) -> list[Webhook]:
    ordered = sorted(schedule, key=lambda w: w.arrival)
    if len({w.id for w in ordered}) != len(ordered):
        raise ValueError("webhook ids must be unique")
    if workers < 1:
        raise ValueError("workers must be at least 1")
    return ordered


def _start(procs: Sequence[BaseProcess]) -> float:
    begun = time.monotonic()
    for proc in procs:
        proc.start()
    return begun


def _join(procs: Sequence[BaseProcess], timeout: float = 5.0) -> None:
    """Join the workers (they exit once told to stop); terminate any that still run."""
    deadline = time.monotonic() + timeout
    for proc in procs:
        proc.join(timeout=max(0.0, deadline - time.monotonic()))
    if any(proc.is_alive() for proc in procs):
        for proc in procs:
            if proc.is_alive():
                proc.terminate()
        for proc in procs:
            proc.join(timeout=5.0)


class _Run:
    """Waits for the workers, delivers the schedule at its arrival times, and turns the
    workers' messages into records, failures and progress updates."""

    def __init__(
        self,
        procs: Sequence[BaseProcess],
        results: Any,
        schedule: list[Webhook],
        on_update: Callable[[Update], None] | None,
        begun: float,
    ) -> None:
        self.procs = procs
        self.results = results
        self.schedule = schedule
        self.by_id = {w.id: w for w in schedule}
        self.on_update = on_update
        self.begun = begun
        self.startup = 0.0
        self.t0 = 0.0
        self.records: dict[str, EventRecord] = {}
        self.failures: dict[str, Failure] = {}
        self.arrived: dict[str, float] = {}
        self.received: dict[str, float] = {}

    def drive(
        self,
        deliver: Callable[[Webhook], None],
        delivered_all: Callable[[], None],
        on_ready: Callable[[float], None] | None,
        startup_timeout: float,
        run_timeout: float | None,
    ) -> None:
        self._wait_ready(startup_timeout)
        if on_ready is not None:
            on_ready(self.startup)
        if run_timeout is None:
            last = self.schedule[-1].arrival if self.schedule else 0.0
            run_timeout = 30.0 + last + 2 * sum(w.work for w in self.schedule)
        schedule = self.schedule
        self.t0 = time.time() + 0.01
        end_by = time.monotonic() + run_timeout
        next_index = 0
        while len(self.records) + len(self.failures) < len(schedule):
            now = time.time()
            while next_index < len(schedule) and now >= self.t0 + schedule[next_index].arrival:
                hook = schedule[next_index]
                deliver(hook)
                self.arrived[hook.id] = time.time() - self.t0
                self._notify(Update("arrived", hook, self.arrived[hook.id]))
                next_index += 1
                if next_index == len(schedule):
                    delivered_all()
                now = time.time()
            wait = 0.25
            if next_index < len(schedule):
                wait = min(wait, max(0.0, self.t0 + schedule[next_index].arrival - now))
            try:
                message = self.results.get(timeout=wait)
            except queue.Empty:
                if time.monotonic() > end_by or not any(p.is_alive() for p in self.procs):
                    break
                continue
            self._handle(message)
        for hook in schedule:
            if hook.id not in self.records and hook.id not in self.failures:
                self.failures[hook.id] = Failure(
                    hook, None, f"not finished within {run_timeout:g} s"
                )

    def _wait_ready(self, startup_timeout: float) -> None:
        workers = len(self.procs)
        ready = 0
        deadline = time.monotonic() + startup_timeout
        while ready < workers:
            try:
                message = self.results.get(timeout=max(0.0, min(1.0, deadline - time.monotonic())))
            except queue.Empty:
                if time.monotonic() >= deadline:
                    raise DemoError(
                        f"only {ready} of {workers} workers started within {startup_timeout:g} s"
                    ) from None
                if not any(p.is_alive() for p in self.procs):
                    raise DemoError("the worker processes exited before they were ready") from None
                continue
            if message[0] == "dead":
                raise DemoError(f"worker {message[1]} could not start: {message[2]}")
            ready += 1
        self.startup = time.monotonic() - self.begun

    def _handle(self, message: tuple[Any, ...]) -> None:
        kind, hook_id = message[0], message[1]
        hook = self.by_id[hook_id]
        if kind == "started":
            _, _, worker, token, received, started = message
            self.received[hook_id] = received - self.t0
            self._notify(Update("started", hook, started - self.t0, worker, token))
        elif kind == "ended":
            _, _, worker, holder, token, asked, started, ended = message
            self.records[hook_id] = EventRecord(
                hook,
                worker,
                holder,
                token,
                self.arrived[hook_id],
                self.arrived[hook_id] if asked is None else asked - self.t0,
                started - self.t0,
                ended - self.t0,
            )
            self._notify(Update("ended", hook, ended - self.t0, worker, token))
        elif kind == "failed":
            _, _, worker, error = message
            self.records.pop(hook_id, None)  # a turn lost during the work does not count
            self.failures[hook_id] = Failure(hook, worker, error)
            self._notify(Update("failed", hook, time.time() - self.t0, worker, None, error))

    def _notify(self, update: Update) -> None:
        if self.on_update is not None:
            self.on_update(update)

    def result(self) -> ScenarioResult:
        return ScenarioResult(
            list(self.schedule),
            sorted(self.records.values(), key=lambda r: r.started),
            sorted(self.failures.values(), key=lambda f: f.webhook.arrival),
            len(self.procs),
            self.startup,
        )
