"""``q.work``: ack on success, nack with backoff on exception (dead letter after
max_attempts), automatic extension of long handlers, graceful stop (SIGTERM in another
process; ``stop()`` in this one), on every backend."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

import turnstile
import turnstile.aio
from tests.conftest import BackendUnderTest
from tests.contract import queue_harness

aqclient = queue_harness.aqclient  # the fixture, for this module
qclient = queue_harness.qclient  # the fixture, for this module

ROOT = Path(__file__).resolve().parents[2]


def test_work_acks_and_nacks_with_backoff_until_dead(qclient: turnstile.Client) -> None:
    q = qclient.queue("work", max_attempts=3, visibility_timeout=5)
    for i in range(6):
        q.put({"i": i}, key=f"k{i % 2}")
    q.put({"i": "bad"}, key="bad")
    seen: list[tuple[object, int, float]] = []
    lock = threading.Lock()

    def handler(m: turnstile.Message) -> None:
        with lock:
            seen.append((m.payload["i"], m.attempt, time.monotonic()))
        if m.payload["i"] == "bad":
            raise ValueError("cannot handle")

    result = q.work(handler, workers=3, idle_timeout=1.5, backoff=0.1, max_backoff=0.15)
    assert (result.acked, result.failed, result.lost) == (6, 3, 0)
    assert result.stopped_by == "idle_timeout"
    for k in (0, 1):  # per-key order under 3 workers
        assert [i for i, _, _ in seen if isinstance(i, int) and i % 2 == k] == [k, k + 2, k + 4]
    bad = [(a, t) for i, a, t in seen if i == "bad"]
    assert [a for a, _ in bad] == [1, 2, 3]
    assert bad[1][1] - bad[0][1] >= 0.09 and bad[2][1] - bad[1][1] >= 0.14  # backoff 0.1, 0.15
    dead = q.dead_letters()
    assert [d.payload for d in dead] == [{"i": "bad"}]
    assert dead[0].error is not None and dead[0].error.startswith("ValueError: cannot handle")
    assert q.stats().pending == 0


def test_work_extends_long_handlers(qclient: turnstile.Client) -> None:
    vt = 3.0  # extended every second: an extension may be two seconds late before it lapses
    q = qclient.queue("long", visibility_timeout=vt)
    q.put("slow")
    attempts: list[int] = []

    def handler(m: turnstile.Message) -> None:
        attempts.append(m.attempt)
        time.sleep(1.5 * vt)  # outlives its visibility timeout

    result = q.work(handler, workers=2, idle_timeout=0.8)
    assert attempts == [1]  # never delivered again while it ran
    assert (result.acked, result.lost) == (1, 0)


def test_work_max_messages_and_stop(qclient: turnstile.Client) -> None:
    q = qclient.queue("stop")
    for i in range(5):
        q.put(i)
    assert q.work(lambda m: None, max_messages=2).acked == 2
    assert q.stats().ready == 3
    started = threading.Event()
    stopped = threading.Event()

    def handler(m: turnstile.Message) -> None:
        started.set()
        assert stopped.wait(60)  # still at work when stop() is called, however late that is

    def stop_once_started() -> None:
        started.wait(60)
        q.stop()
        stopped.set()

    timer = threading.Thread(target=stop_once_started)
    timer.start()
    result = q.work(handler, workers=1, handle_signals=False)
    timer.join()
    assert result.stopped_by == "stop()" and result.acked == 1  # finished the one it had
    assert q.stats().ready == 2


def test_work_max_messages_with_several_workers_handles_exactly_that_many(
    qclient: turnstile.Client,
) -> None:
    """A worker that finds every slot taken leaves; it must not stop the worker that holds
    the last slot and still waits for its message (here: a delayed one)."""
    q = qclient.queue("max-many")
    q.put("now")
    q.put("later", delay=0.5)
    seen: list[object] = []

    def handler(m: turnstile.Message) -> None:
        seen.append(m.payload)

    result = q.work(handler, workers=2, max_messages=2, handle_signals=False)
    assert seen == ["now", "later"]
    assert result.acked == 2 and result.stopped_by == "max_messages"
    assert q.stats().pending == 0


def test_work_refuses_wrong_handler_and_bad_settings(qclient: turnstile.Client) -> None:
    q = qclient.queue("bad-work")

    async def coro(m: object) -> None: ...

    with pytest.raises(turnstile.InvalidArgument, match="handler"):
        q.work(coro)  # type: ignore[arg-type]
    with pytest.raises(turnstile.InvalidArgument, match="workers"):
        q.work(lambda m: None, workers=0)
    with pytest.raises(turnstile.InvalidArgument, match="backoff"):
        q.work(lambda m: None, backoff=-1)


def test_sigterm_finishes_current_messages_and_takes_no_new_one(
    qclient: turnstile.Client, backend: BackendUnderTest, tmp_path: Path
) -> None:
    if not backend.cross_process:
        pytest.skip("memory:// is one process: see test_work_max_messages_and_stop")
    q = qclient.queue("graceful", visibility_timeout=30)
    for i in range(6):
        q.put(i)
    log = tmp_path / "work.log"
    # Both handlers run work_s after the later of them started: the signal, sent once both
    # started, has that long to be handled.
    opts = {"url": backend.url, "name": "graceful", "vt": 30, "log": str(log), "work_s": 2.0,
            "workers": 2}
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.contract.queue_work_worker", json.dumps(opts)],
        cwd=ROOT, stdout=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 60  # a fresh process may be slow to start
        while time.monotonic() < deadline:  # until both workers are mid-message
            if log.exists() and log.read_text().count("start") >= 2:
                break
            time.sleep(0.05)
        else:
            pytest.fail("workers did not start")
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0
    acked, failed, lost, why = json.loads(out.decode().strip().splitlines()[-1])
    events = [json.loads(line) for line in log.read_text().splitlines()]
    starts = [e for e in events if e[0] == "start"]
    ends = [e for e in events if e[0] == "end"]
    assert len(starts) == 2 and len(ends) == 2  # finished both, took no third
    assert (acked, failed, lost, why) == (2, 0, 0, "signal")
    s = q.stats()
    assert (s.ready, s.in_flight) == (4, 0)


def test_a_signal_the_kernel_hands_to_a_worker_thread_still_stops_work(
    qclient: turnstile.Client,
) -> None:
    """A signal sent to a process goes to any of its threads that does not block it, and
    Python runs the handler in the main thread, which q.work keeps waiting for its workers:
    the handler must run anyway (a worker waiting for the next message waits for the very
    stop the handler brings)."""
    if threading.current_thread() is not threading.main_thread():
        pytest.skip("signal handlers are installed from the main thread only")
    q = qclient.queue("signalled-thread", visibility_timeout=30)
    q.put("only")
    seen: list[str] = []

    def handler(message: turnstile.Message) -> None:
        seen.append(message.payload)
        signal.pthread_kill(threading.get_ident(), signal.SIGTERM)  # to this worker thread

    # Without the handler the only way out is the idle timeout ("idle_timeout").
    result = q.work(handler, idle_timeout=60)
    assert seen == ["only"]
    assert (result.acked, result.stopped_by) == (1, "signal")


async def test_async_work(aqclient: turnstile.aio.Client) -> None:
    vt = 3.0  # extended every second: an extension may be two seconds late before it lapses
    q = aqclient.queue("async-work", visibility_timeout=vt, max_attempts=2)
    for i in range(4):
        await q.put(i, key="K")
    await q.put("boom")
    order: list[object] = []

    async def handler(m: turnstile.aio.Message) -> None:
        order.append(m.payload)
        if m.payload == "boom":
            raise RuntimeError("x")
        await asyncio.sleep(1.2 * vt if m.payload == 0 else 0.01)  # 0 outlives its timeout

    result = await q.work(handler, workers=3, idle_timeout=0.8, backoff=0.05)
    assert [p for p in order if p != "boom"] == [0, 1, 2, 3]
    assert order.count("boom") == 2
    assert (result.acked, result.failed) == (4, 2)
    assert [d.payload for d in await q.dead_letters()] == ["boom"]
