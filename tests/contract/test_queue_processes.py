"""The queue under many consumer processes with ``kill -9`` mid-message (issue 5 point 4).

Each consumer logs when it starts a message's work, when that work ends and the ack's
answer. A logged interval lies inside the store's in-flight interval of that delivery (the
claim came before the start, the ack after the end; a killed consumer's delivery stays in
flight until its visibility timeout), so checks on logged intervals are sound:

* nothing lost: every message put is acked successfully exactly once, or is a dead letter;
* per-key order: a key's message n+1 first starts after message n's successful work ended,
  and no two intervals of one key overlap;
* the global cap: never more than ``concurrency`` intervals overlap (and the cap is used);
* redelivery: a killed consumer's message is delivered again, with a higher attempt, no
  sooner than about its visibility timeout later.

On ``memory://`` (one process) consumers are threads and "kill" abandons a message unacked.
"""

from __future__ import annotations

import itertools
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

import turnstile
from tests.conftest import BackendUnderTest
from tests.contract import queue_harness
from tests.contract.queue_worker import run as run_worker

qclient = queue_harness.qclient  # the fixture, for this module

ROOT = Path(__file__).resolve().parents[2]
# A consumer stalled (descheduled) for longer than this between its get and its ack would see
# its message delivered again while still working on it: much longer than any stall.
VT = 4.0
KEYS = [f"order-{i}" for i in range(8)]


class Consumer:
    """A worker process (or, on memory://, a thread) with its own log file."""

    def __init__(self, opts: dict[str, Any], client: turnstile.Client | None) -> None:
        self.log = opts["log"]
        self.proc: subprocess.Popen[bytes] | None = None
        self.thread: threading.Thread | None = None
        self.abandon = threading.Event()
        if client is None:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "tests.contract.queue_worker", json.dumps(opts)], cwd=ROOT
            )
        else:
            self.thread = threading.Thread(
                target=run_worker, args=(opts, client, self.abandon), daemon=True
            )
            self.thread.start()

    def alive(self) -> bool:
        if self.proc is not None:
            return self.proc.poll() is None
        return self.thread is not None and self.thread.is_alive()

    def mid_message(self) -> bool:
        try:
            lines = Path(self.log).read_text().splitlines()
        except FileNotFoundError:
            return False
        return bool(lines) and json.loads(lines[-1])[0] == "start"

    def kill(self) -> None:
        if self.proc is not None:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        else:  # a thread abandons the message in hand (or its next one) and ends
            self.abandon.set()
            assert self.thread is not None
            self.thread.join(60)

    def killed_mid_message(self) -> bool:
        """After kill(): whether it left a message in flight (a process whose log ends in
        "start"; a thread that logged "abandon" rather than stopping between messages)."""
        if self.proc is not None:
            return self.mid_message()
        lines = Path(self.log).read_text().splitlines()
        return bool(lines) and json.loads(lines[-1])[0] == "abandon"

    def join(self, timeout: float) -> None:
        if self.proc is not None:
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        elif self.thread is not None:
            self.thread.join(timeout)


def read_events(tmp: Path) -> list[tuple[str, list[Any]]]:
    events = []
    for path in sorted(tmp.glob("worker-*.log")):
        for line in path.read_text().splitlines():
            if line.strip():
                events.append((path.name, json.loads(line)))
    return events


@pytest.mark.slow
@pytest.mark.parametrize("concurrency", [3, None], ids=["cap3", "nocap"])
def test_many_consumers_kill_9_order_cap_nothing_lost(
    qclient: turnstile.Client, backend: BackendUnderTest, tmp_path: Path, concurrency: int | None
) -> None:
    rnd = random.Random(5)
    name = f"stress-{concurrency}"
    q = qclient.queue(name, visibility_timeout=VT, max_attempts=20, concurrency=concurrency)
    shared_client = None if backend.cross_process else qclient
    stop = tmp_path / "stop"
    gate = tmp_path / "gate"
    gate.mkdir()
    consumers: list[Consumer] = []
    kills: list[tuple[str, float]] = []  # (log name, time)
    late_kills: list[str] = []  # killed after it had finished its message's work

    def spawn() -> None:
        i = len(consumers)
        opts = {
            "url": backend.url, "name": name, "log": str(tmp_path / f"worker-{i}.log"),
            "stop": str(stop), "vt": VT, "concurrency": concurrency, "seed": i,
            "work_ms": (5, 25), "max_seconds": 90,
            # The first six start together and at least three hold a message at once.
            "gate": {"dir": str(gate), "ready": 6, "overlap": 3, "hold": VT / 4},
        }
        consumers.append(Consumer(opts, shared_client))

    put_order: dict[str, list[str]] = defaultdict(list)  # key -> ids in put order
    ids: list[str] = []
    counters = dict.fromkeys(KEYS, 0)

    def put_burst(count: int) -> None:
        for _ in range(count):
            key = rnd.choice([*KEYS, None])
            n = counters[key] if key is not None else -1
            if key is not None:
                counters[key] += 1
            mid = q.put({"n": n, "pad": "x" * rnd.randint(0, 200)}, key=key)
            ids.append(mid)
            if key is not None:
                put_order[key].append(mid)

    put_burst(40)
    for _ in range(6):
        spawn()
    total, max_kills = 160, 3
    deadline = time.monotonic() + 90
    try:
        while time.monotonic() < deadline:
            if len(ids) < total:
                put_burst(min(20, total - len(ids)))  # bursty arrivals while consumers run
            elif len(kills) < max_kills:
                # Fast consumers (threads on memory://) may drain the queue before every kill
                # has found a consumer mid-message: keep giving them work until it has.
                if q.stats().pending < 20:
                    put_burst(20)
            elif q.stats().pending == 0:
                break
            if len(kills) < max_kills and len(ids) > 60:
                victims = [c for c in consumers if c.alive() and c.mid_message()]
                if victims:
                    victim = rnd.choice(victims)
                    victim.kill()
                    # The victim may have moved on between our look at its log and the kill.
                    # Its log is final now: the kill counts as mid-message only if it left
                    # a message in flight.
                    if victim.killed_mid_message():
                        kills.append((Path(victim.log).name, time.time()))
                    else:
                        late_kills.append(Path(victim.log).name)
                    spawn()
            time.sleep(0.15)
        else:
            pytest.fail(f"queue not drained in time: {q.stats()}")
    finally:
        stop.touch()
        for c in consumers:
            c.join(10)

    assert len(kills) == max_kills, "the test did not manage to kill consumers mid-message"
    events = read_events(tmp_path)
    # -- intervals ------------------------------------------------------------------------
    open_start: dict[str, tuple[str, str, str | None, int, int, float]] = {}
    intervals: list[tuple[float, float, str, str | None]] = []  # start, end, id, key
    deliveries: dict[str, list[tuple[int, float]]] = defaultdict(list)  # id -> (attempt, start)
    acked: dict[str, int] = defaultdict(int)
    success_end: dict[str, float] = {}
    kill_time = dict(kills)
    killed: list[tuple[str, int]] = []  # (id, attempt) of each delivery a kill abandoned
    for log, ev in events:
        kind = ev[0]
        if kind == "start":
            _, mid, key, n, attempt, t = ev
            open_start[log] = (log, mid, key, n, attempt, t)
            deliveries[mid].append((attempt, t))
        elif kind in ("end", "abandon"):
            _, mid, t = ev
            _, smid, key, _, sattempt, start = open_start.pop(log)
            assert smid == mid
            intervals.append((start, t, mid, key))
            if kind == "end":
                success_end.setdefault(mid, t)
            else:
                killed.append((mid, sattempt))
        elif kind == "ack":
            _, mid, ok, _ = ev
            if ok:
                acked[mid] += 1
    for log, (_, mid, key, _, attempt, start) in open_start.items():  # killed mid-message
        assert log in kill_time, f"{log} stopped mid-message without being killed"
        killed.append((mid, attempt))
        intervals.append((start, kill_time[log], mid, key))

    # nothing lost, nothing acked twice
    dead = {d.id for d in q.dead_letters(limit=1000)}
    assert not dead, "max_attempts=20 should never be reached here"
    # A consumer killed right after its "end" line may have had its ack reach the store before
    # it could log it: that message's work is done, it is not lost.
    last_event: dict[str, list[Any]] = {}
    for log, ev in events:
        last_event[log] = ev
    acked_unlogged = {
        last_event[log][1] for log in late_kills if last_event.get(log, [""])[0] == "end"
    }
    missing = set(ids) - set(acked) - acked_unlogged
    assert not missing, f"missing: {missing}"
    assert set(acked) <= set(ids)
    assert all(count == 1 for count in acked.values())
    # redelivery of the killed consumers' messages: each abandoned delivery is followed by a
    # later one of its message (a redelivered message may itself be the next kill's victim,
    # so the kills may abandon fewer distinct messages than there were kills)
    assert len(killed) == max_kills, killed
    for mid, attempt in killed:
        assert any(a > attempt for a, _ in deliveries[mid]), f"{mid} not delivered again"
    redelivered = [mid for mid, ds in deliveries.items() if len(ds) > 1]
    for mid in redelivered:
        ds = sorted(deliveries[mid], key=lambda d: d[1])
        assert [a for a, _ in ds] == sorted({a for a, _ in ds}), f"attempts of {mid}: {ds}"
        for (_, t0), (_, t1) in itertools.pairwise(ds):
            assert t1 - t0 > VT * 0.5, f"{mid} redelivered after {t1 - t0:.3f} s < VT"
    # per-key order and one in flight per key
    first_start = {mid: min(t for _, t in ds) for mid, ds in deliveries.items()}
    for key, order in put_order.items():
        for a, b in itertools.pairwise(order):
            assert first_start[b] > success_end[a], f"{key}: {b} started before {a} was done"
        spans = sorted((s, e) for s, e, _, k in intervals if k == key)
        for (_, e0), (s1, _) in itertools.pairwise(spans):
            assert s1 >= e0, f"{key}: two messages in flight at once"
    # the global cap
    edges = sorted([(s, 1) for s, _, _, _ in intervals] + [(e, -1) for _, e, _, _ in intervals],
                   key=lambda x: (x[0], x[1]))
    level = peak = 0
    for _, step in edges:
        level += step
        peak = max(peak, level)
    if concurrency is not None:
        assert peak <= concurrency, f"{peak} in flight with concurrency={concurrency}"
        assert peak == concurrency, f"cap {concurrency} never reached (peak {peak})"
    else:
        assert peak >= 3, f"consumers did not run in parallel (peak {peak})"
