"""Running scenarios (``lock_worker.py``) in separate OS processes, or in threads for a backend
that lives in one process, behind one interface; and the checks applied to what they record.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Any

import pytest

from . import lock_worker as _worker

ROOT = Path(__file__).resolve().parents[2]
START_TIMEOUT = 60.0  # a fresh interpreter on a loaded 2-core machine can be slow to start
# A ttl (or wait_ttl) for leases and places in line that must last while the test starts
# worker processes or simply runs on, unrenewed: far longer than any of that may take.
LONG_TTL = 4 * START_TIMEOUT


class WorkerFailed(AssertionError):
    pass


class Worker:
    """One running scenario. Events arrive as dicts with at least ``event`` and ``t``."""

    label: str
    pid: int | None = None

    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []
        self._cond = threading.Condition()

    def _add(self, event: dict[str, Any]) -> None:
        with self._cond:
            self.events.append(event)
            self._cond.notify_all()

    def _finished(self) -> bool:
        raise NotImplementedError

    def _diagnostics(self) -> str:
        return ""

    def wait_for(self, kind: str, timeout: float = START_TIMEOUT) -> dict[str, Any]:
        """The first event ``kind``; fails if the worker ends or errs first, or on timeout."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                for event in self.events:
                    if event["event"] == kind:
                        return event
                    if event["event"] == "error":
                        raise WorkerFailed(f"{self.label} failed: {event['traceback']}")
                if self._finished():
                    raise WorkerFailed(
                        f"{self.label} ended without {kind!r}; events {self.events}"
                        f"{self._diagnostics()}"
                    )
                left = deadline - time.monotonic()
                if left <= 0:
                    raise WorkerFailed(
                        f"{self.label}: no {kind!r} within {timeout} s; events {self.events}"
                    )
                self._cond.wait(min(left, 0.2))

    def all(self, kind: str) -> list[dict[str, Any]]:
        with self._cond:
            return [e for e in self.events if e["event"] == kind]

    def send(self, command: str) -> None:
        raise NotImplementedError

    def join(self, timeout: float = START_TIMEOUT) -> None:
        """Wait for the scenario to end; fail if it raised."""
        self.wait_for("exited", timeout)

    def signal(self, sig: int) -> None:
        raise NotImplementedError

    def stop(self) -> None:
        """Make sure it is gone (teardown)."""


class ProcessWorker(Worker):
    def __init__(self, url: str, scenario: str, params: dict[str, Any], label: str) -> None:
        super().__init__()
        self.label = label
        spec = json.dumps({"url": url, "scenario": scenario, "params": params})
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.contract.lock_worker", spec],
            cwd=ROOT,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            bufsize=1,
        )
        self.pid = self.proc.pid
        self._stderr: list[str] = []
        self._out_done = False
        threading.Thread(target=self._read_stdout, daemon=True).start()
        threading.Thread(target=self._read_stderr, daemon=True).start()

    def _read_stdout(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            try:
                event = json.loads(line)
            except ValueError:
                self._stderr.append(f"[stdout] {line}")
                continue
            self._add(event)
        with self._cond:
            self._out_done = True
            self._cond.notify_all()

    def _read_stderr(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self._stderr.append(line)

    def _finished(self) -> bool:
        return self._out_done

    def _diagnostics(self) -> str:
        return f"; exit code {self.proc.poll()}; stderr:\n{''.join(self._stderr)[-4000:]}"

    def send(self, command: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()

    def signal(self, sig: int) -> None:
        os.kill(self.proc.pid, sig)

    def wait_exit(self, timeout: float = START_TIMEOUT) -> int:
        return self.proc.wait(timeout)

    def stop(self) -> None:
        if self.proc.poll() is None:
            try:
                os.kill(self.proc.pid, signal.SIGCONT)
                self.proc.terminate()
                self.proc.wait(5)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait(5)
        for stream in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            if stream is not None:
                with contextlib.suppress(OSError):
                    stream.close()


class ThreadWorker(Worker):
    """The same scenario in a thread of this process, on the test's own client."""

    def __init__(self, client: Any, scenario: str, params: dict[str, Any], label: str) -> None:
        super().__init__()
        self.label = label
        self._commands: queue.Queue[str] = queue.Queue()
        self._done = False
        fn = _worker.SCENARIOS[scenario]
        if _worker.is_async(scenario):
            raise TypeError(f"{scenario} needs its own process (an async client)")

        def command(timeout: float) -> str:
            try:
                return self._commands.get(timeout=timeout)
            except queue.Empty:
                return ""

        def run() -> None:
            ctx = _worker.Context(client, self._add, command, time.thread_time)
            try:
                fn(ctx, **params)
            except BaseException as exc:
                self._add(
                    {
                        "event": "error",
                        "t": time.monotonic(),
                        "error": repr(exc),
                        "traceback": traceback.format_exc(),
                    }
                )
            else:
                self._add({"event": "exited", "t": time.monotonic()})
            finally:
                with self._cond:
                    self._done = True
                    self._cond.notify_all()

        self._thread = threading.Thread(target=run, name=label, daemon=True)
        self._thread.start()

    def _finished(self) -> bool:
        return self._done

    def send(self, command: str) -> None:
        self._commands.put(command)

    def signal(self, sig: int) -> None:
        raise NotImplementedError("a thread cannot be signalled")

    def stop(self) -> None:
        # Unblock a scenario waiting for a command; every wait in a scenario is bounded.
        for _ in range(4):
            self._commands.put("stop")
        self._thread.join(10)


class Spawner:
    """Starts scenarios for one backend: OS processes when the backend is shared between
    processes, threads on the test's client otherwise (``memory://``)."""

    def __init__(self, backend: Any, client: Any) -> None:
        self.backend = backend
        self.client = client
        self.workers: list[Worker] = []

    @property
    def processes(self) -> bool:
        return bool(self.backend.cross_process)

    def spawn(self, scenario: str, label: str | None = None, **params: Any) -> Worker:
        label = label or f"{scenario}#{len(self.workers)}"
        worker: Worker
        if self.processes:
            worker = ProcessWorker(self.backend.url, scenario, params, label)
        else:
            worker = ThreadWorker(self.client, scenario, params, label)
        self.workers.append(worker)
        return worker

    def close(self) -> None:
        for worker in self.workers:
            worker.stop()


def require_processes(backend: Any, why: str) -> None:
    if not backend.cross_process:
        pytest.skip(f"{backend.name}:// lives in one process, so {why} cannot be done to it")


def wait_until(predicate: Any, timeout: float, interval: float = 0.01, what: str = "") -> Any:
    """Poll ``predicate`` (bounded) until it returns something truthy; return that."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout} s: {what or predicate}")
        time.sleep(interval)


# -- checks on recorded data ------------------------------------------------------------


def max_concurrency(intervals: list[dict[str, Any]]) -> int:
    """The largest number of intervals ``[start, end]`` open at one instant. An interval that
    ends exactly where another starts does not overlap it."""
    points = []
    for iv in intervals:
        points.append((iv["start"], 1))
        points.append((iv["end"], -1))
    points.sort(key=lambda p: (p[0], p[1]))  # ends before starts at the same instant
    current = best = 0
    for _, delta in points:
        current += delta
        best = max(best, current)
    return best


def check_exclusive(intervals: list[dict[str, Any]]) -> None:
    """Critical sections of a lock: no two overlap, and in time order their tokens strictly
    increase (each grant's token is above every earlier one)."""
    ordered = sorted(intervals, key=lambda iv: iv["start"])
    for a, b in itertools.pairwise(ordered):
        assert a["end"] <= b["start"], f"critical sections overlap: {a} and {b}"
        assert a["token"] < b["token"], f"token did not increase: {a} then {b}"


def check_bounded(intervals: list[dict[str, Any]], limit: int) -> int:
    """Holders of a semaphore: never more than ``limit`` at once; tokens unique, and a grant
    asked for after another grant began carries a larger token. Returns the peak."""
    peak = max_concurrency(intervals)
    assert peak <= limit, f"{peak} holders at once, limit {limit}"
    tokens = [iv["token"] for iv in intervals]
    assert len(set(tokens)) == len(tokens), f"a token was issued twice: {sorted(tokens)}"
    for a in intervals:
        for b in intervals:
            if b["asked"] > a["start"]:
                assert b["token"] > a["token"], f"{b} was asked for after {a} began"
    return peak
