"""Running a job on real processes: one spawned process per job, each builds the contender's
adapter, warms it up on a private name, waits at a start line, then runs.

Workers are started with the ``spawn`` method, so a contender's factory must be picklable (a
module-level class, or a :func:`functools.partial` of one).
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import queue
import secrets
import sys
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from .adapters import Contender, LockAdapter

SPAWN = multiprocessing.get_context("spawn")
STARTUP_TIMEOUT = 180.0  # spawning 32 interpreters on 2 busy cores takes a while


class BenchmarkError(RuntimeError):
    """A worker failed or a scenario did not finish in time."""


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
        adapter.warm_up(warm_name)
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


def progress(message: str) -> None:
    print(message, file=sys.stderr, flush=True)
