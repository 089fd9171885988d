"""The SPEC's first problem solved by *arrival order* instead of locks: each webhook is put
into a keyed queue as it arrives (``key`` = its order), and worker processes take the next
deliverable message. A worker is only ever handed a webhook it can run at once (its order
has nothing in flight), so no worker sits idle waiting on a lock, and the order within each
order is the put order however bursty the arrivals.

Records are :class:`turnstile.demo.EventRecord` (``asked`` = when it was put, ``token`` =
``None``), so the judging functions of :mod:`turnstile.demo` apply unchanged; also recorded
is when each worker received the webhook, to measure worker time spent waiting for a turn
(always about zero here; the lock version's workers wait in line holding a webhook).
``turnstile demo --queue`` (:mod:`turnstile.cli.demo_queue`) adds the display, and the
queue benchmark reuses :func:`run_queue_scenario`.
"""

from __future__ import annotations

import multiprocessing
import os
import queue
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from . import connect
from .demo import DemoError, EventRecord, Failure, ScenarioResult, Update, Webhook, stopped_cleanly

__all__ = ["QueueScenarioResult", "run_queue_scenario", "worker_wait"]

IDLE_LIMIT = 120.0


@dataclass(frozen=True)
class QueueScenarioResult(ScenarioResult):
    received: dict[str, float]  # webhook id -> when its worker got it (since t0)


def worker_wait(result: QueueScenarioResult) -> float:
    """Seconds workers spent holding a webhook they could not start yet (summed)."""
    return sum(max(0.0, r.started - result.received[r.webhook.id]) for r in result.records)


def _worker_main(index: int, url: str, name: str, vt: float, results: Any, stop: Any) -> None:
    try:
        client = connect(url)
        q = client.queue(name, visibility_timeout=vt)
    except BaseException as exc:
        results.put(("dead", index, f"{type(exc).__name__}: {exc}"))
        return
    results.put(("ready", index, os.getpid()))
    try:
        idle_since = time.monotonic()
        while not stop.is_set() and time.monotonic() - idle_since < IDLE_LIMIT:
            m = q.get(timeout=0.5)
            if m is None:
                continue
            received = time.time()
            hook = Webhook(**m.payload)
            started = time.time()
            results.put(("started", hook.id, index, received, started))
            time.sleep(hook.work)
            ended = time.time()
            if m.ack():
                results.put(("ended", hook.id, index, f"worker{index}/{os.getpid()}", ended))
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
    times (key = order) once all are ready; collect what happened."""
    schedule = sorted(schedule, key=lambda w: w.arrival)
    by_id = {w.id: w for w in schedule}
    if run_timeout is None:
        last = schedule[-1].arrival if schedule else 0.0
        run_timeout = 30.0 + last + 2 * sum(w.work for w in schedule)
    ctx = multiprocessing.get_context("spawn")
    results = ctx.Queue()
    stop = ctx.Event()
    procs = [
        ctx.Process(
            target=_worker_main,
            args=(i + 1, url, name, visibility_timeout, results, stop),
            name=f"turnstile-queue-demo-worker-{i + 1}",
            daemon=True,
        )
        for i in range(workers)
    ]
    begun = time.monotonic()
    for proc in procs:
        proc.start()
    client = connect(url)
    q = client.queue(name, visibility_timeout=visibility_timeout)
    records: dict[str, EventRecord] = {}
    failures: dict[str, Failure] = {}
    arrived: dict[str, float] = {}
    received: dict[str, float] = {}
    started_at: dict[str, tuple[int, float]] = {}

    def notify(update: Update) -> None:
        if on_update is not None:
            on_update(update)

    try:
        ready = 0
        deadline = time.monotonic() + startup_timeout
        while ready < workers:
            try:
                message = results.get(timeout=max(0.0, min(1.0, deadline - time.monotonic())))
            except queue.Empty:
                if time.monotonic() >= deadline or not any(p.is_alive() for p in procs):
                    raise DemoError(f"only {ready} of {workers} workers started") from None
                continue
            if message[0] == "dead":
                raise DemoError(f"worker {message[1]} could not start: {message[2]}")
            ready += 1
        startup = time.monotonic() - begun
        if on_ready is not None:
            on_ready(startup)
        t0 = time.time() + 0.01
        end_by = time.monotonic() + run_timeout
        next_index = 0
        while len(records) + len(failures) < len(schedule):
            now = time.time()
            while next_index < len(schedule) and now >= t0 + schedule[next_index].arrival:
                hook = schedule[next_index]
                q.put(
                    {"id": hook.id, "order": hook.order, "seq": hook.seq,
                     "arrival": hook.arrival, "work": hook.work},
                    key=hook.order,
                )
                arrived[hook.id] = time.time() - t0
                notify(Update("arrived", hook, arrived[hook.id]))
                next_index += 1
                now = time.time()
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
                _, hook_id, worker, got, started = message
                received[hook_id] = got - t0
                started_at[hook_id] = (worker, started - t0)
                notify(Update("started", by_id[hook_id], started - t0, worker, None))
            elif kind == "ended":
                _, hook_id, worker, holder, ended = message
                hook = by_id[hook_id]
                records[hook_id] = EventRecord(
                    hook, worker, holder, None, arrived[hook_id], arrived[hook_id],
                    started_at[hook_id][1], ended - t0,
                )
                notify(Update("ended", hook, ended - t0, worker, None))
            elif kind == "failed":
                _, hook_id, worker, error = message
                failures[hook_id] = Failure(by_id[hook_id], worker, error)
                notify(Update("failed", by_id[hook_id], time.time() - t0, worker, None, error))
        for hook in schedule:
            if hook.id not in records and hook.id not in failures:
                failures[hook.id] = Failure(hook, None, f"not finished within {run_timeout:g} s")
    finally:
        stop.set()
        if not stopped_cleanly(procs):
            for proc in procs:
                if proc.is_alive():
                    proc.terminate()
            for proc in procs:
                proc.join(timeout=5.0)
        results.close()
        results.cancel_join_thread()
        client.close()
    return QueueScenarioResult(
        list(schedule),
        sorted(records.values(), key=lambda r: r.started),
        sorted(failures.values(), key=lambda f: f.webhook.arrival),
        workers,
        startup,
        received,
    )
