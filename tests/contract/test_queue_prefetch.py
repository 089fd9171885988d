"""``q.work(prefetch=n)``: each worker claims up to n messages in one store step (on
PostgreSQL one transaction, ``queue_ack_claim_many``) and acks them with its next step. The
queue's promises hold as without it, on every backend: per-key order with one message of a
key in flight, the ``concurrency`` cap, at-least-once delivery with no redelivery while a
prefetched message waits its turn, ``max_messages``, and a stop that finishes the batch."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import pytest

import turnstile
import turnstile.aio
from tests.conftest import BackendUnderTest
from tests.contract import queue_harness

aqclient = queue_harness.aqclient  # the fixture, for this module
qclient = queue_harness.qclient  # the fixture, for this module

ROOT = Path(__file__).resolve().parents[2]


def test_prefetch_keeps_per_key_order_and_one_in_flight_per_key(
    qclient: turnstile.Client,
) -> None:
    q = qclient.queue("pf-keys", visibility_timeout=30)
    keys = ["a", "b", "c", None]
    for i in range(24):
        q.put({"i": i}, key=keys[i % 4])
    lock = threading.Lock()
    seen: list[tuple[str | None, int]] = []
    busy: Counter[str] = Counter()
    overlaps: list[str] = []

    def handler(m: turnstile.Message) -> None:
        with lock:
            seen.append((m.key, m.payload["i"]))
            if m.key is not None:
                busy[m.key] += 1
                if busy[m.key] > 1:
                    overlaps.append(m.key)
        time.sleep(0.002)
        with lock:
            if m.key is not None:
                busy[m.key] -= 1

    result = q.work(handler, workers=2, prefetch=5, idle_timeout=1.0, handle_signals=False)
    assert (result.acked, result.failed, result.lost) == (24, 0, 0)
    assert sorted(i for _, i in seen) == list(range(24))  # each once
    for k in ("a", "b", "c"):
        assert [i for key, i in seen if key == k] == [i for i in range(24) if keys[i % 4] == k]
    assert overlaps == []
    assert q.stats().pending == 0


def test_prefetch_counts_against_the_concurrency_cap(qclient: turnstile.Client) -> None:
    q = qclient.queue("pf-cap", visibility_timeout=30, concurrency=3)
    for i in range(12):
        q.put(i)
    in_flight: list[int] = []

    def handler(m: turnstile.Message) -> None:
        in_flight.append(q.stats().in_flight)

    result = q.work(handler, workers=2, prefetch=4, idle_timeout=1.0, handle_signals=False)
    assert result.acked == 12
    assert max(in_flight) <= 3  # prefetched messages are in flight from their claim
    assert q.stats().pending == 0


def test_prefetch_takes_no_more_than_max_messages(qclient: turnstile.Client) -> None:
    q = qclient.queue("pf-max", visibility_timeout=30)
    for i in range(10):
        q.put(i)
    seen: list[int] = []
    result = q.work(lambda m: seen.append(m.payload), prefetch=4, max_messages=6,
                    handle_signals=False)
    assert result.acked == 6 and result.stopped_by == "max_messages"
    assert seen == [0, 1, 2, 3, 4, 5]
    stats = q.stats()
    assert (stats.ready, stats.in_flight) == (4, 0)  # nothing claimed beyond the six


def test_a_stop_lets_the_worker_finish_its_batch_and_take_no_more(
    qclient: turnstile.Client,
) -> None:
    q = qclient.queue("pf-stop", visibility_timeout=30)
    for i in range(7):
        q.put(i)
    seen: list[int] = []

    def handler(m: turnstile.Message) -> None:
        seen.append(m.payload)
        if m.payload == 0:
            q.stop()  # while the batch's two other messages wait their turn

    result = q.work(handler, prefetch=3, handle_signals=False)
    assert result.stopped_by == "stop()"
    assert seen == [0, 1, 2] and result.acked == 3
    stats = q.stats()
    assert (stats.ready, stats.in_flight) == (4, 0)


def test_a_prefetched_message_is_extended_while_it_waits_its_turn(
    qclient: turnstile.Client,
) -> None:
    """The first message of a batch outlives the visibility timeout; the second, claimed in
    the same step, is kept invisible meanwhile (extended like a running message), so nobody
    gets it again and its ack is accepted."""
    vt = 3.0  # extended every second: an extension may be two seconds late before it lapses
    q = qclient.queue("pf-extend", visibility_timeout=vt)
    q.put("slow")
    q.put("next")
    seen: list[tuple[str, int]] = []
    stolen: list[object] = []

    def handler(m: turnstile.Message) -> None:
        seen.append((m.payload, m.attempt))
        if m.payload == "slow":
            deadline = time.monotonic() + 1.5 * vt
            while time.monotonic() < deadline:  # another consumer looks meanwhile
                other = q.get(timeout=0)
                if other is not None:
                    stolen.append(other.payload)
                time.sleep(0.2)

    result = q.work(handler, prefetch=2, idle_timeout=0.8, handle_signals=False)
    assert stolen == []
    assert seen == [("slow", 1), ("next", 1)]
    assert (result.acked, result.lost) == (2, 0)
    assert q.stats().pending == 0


def test_a_failed_handler_in_a_batch_is_nacked_and_the_rest_go_on(
    qclient: turnstile.Client,
) -> None:
    q = qclient.queue("pf-fail", visibility_timeout=30, max_attempts=2)
    for i in range(4):
        q.put(i)
    seen: list[tuple[int, int]] = []

    def handler(m: turnstile.Message) -> None:
        seen.append((m.payload, m.attempt))
        if m.payload == 1:
            raise ValueError("no")

    result = q.work(handler, prefetch=4, idle_timeout=1.0, backoff=0.05,
                    handle_signals=False)
    assert (result.acked, result.failed, result.lost) == (3, 2, 0)
    assert [p for p, a in seen if a == 1] == [0, 1, 2, 3]
    assert (1, 2) in seen
    assert [d.payload for d in q.dead_letters()] == [1]


def test_a_worker_killed_holding_a_batch_loses_none_of_it(
    qclient: turnstile.Client, backend: BackendUnderTest, tmp_path: Path
) -> None:
    """``kill -9`` of a worker that holds a batch of four (one running, three waiting their
    turn): once the visibility timeout has passed every one of the four is delivered again,
    keys in order, and nothing else was touched."""
    if not backend.cross_process:
        pytest.skip("memory:// lives in one process, so kill -9 cannot be done to it")
    vt = 3.0  # extended every second: an extension may be two seconds late before it lapses
    q = qclient.queue("pf-kill", visibility_timeout=vt)
    for i in range(8):
        q.put(i, key=f"k{i % 4}")
    log = tmp_path / "worker.log"
    opts = {"url": backend.url, "name": "pf-kill", "vt": vt, "log": str(log), "prefetch": 4}
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.contract.queue_prefetch_worker", json.dumps(opts)],
        cwd=ROOT,
    )
    try:
        deadline = time.monotonic() + 60  # a fresh process may be slow to start
        while not (log.exists() and log.read_text().strip()):
            if time.monotonic() > deadline or proc.poll() is not None:
                pytest.fail("the worker did not start a message")
            time.sleep(0.05)
        assert q.stats().in_flight == 4  # the whole batch is claimed
        time.sleep(1.5 * vt)  # its extender keeps all four invisible meanwhile
        assert q.get(timeout=0) is None
    finally:
        proc.kill()
        proc.wait()
    started = [json.loads(line) for line in log.read_text().splitlines()]
    assert started == [[0, 1]]  # the first of the batch, then the kill
    seen: list[tuple[int, int]] = []
    result = q.work(lambda m: seen.append((m.payload, m.attempt)), prefetch=4,
                    max_messages=8, idle_timeout=60, handle_signals=False)
    assert (result.acked, result.lost, result.stopped_by) == (8, 0, "max_messages")
    assert sorted(p for p, _ in seen) == list(range(8))
    assert {p: a for p, a in seen} == {0: 2, 1: 2, 2: 2, 3: 2, 4: 1, 5: 1, 6: 1, 7: 1}
    for k in range(4):  # each key in put order: the redelivered head first
        assert [p for p, _ in seen if p % 4 == k] == [k, k + 4]
    assert q.stats().pending == 0


@pytest.mark.parametrize("bad", [0, -1, 1001, 2.5, "4", True, None])
def test_prefetch_must_be_a_count(qclient: turnstile.Client, bad: object) -> None:
    q = qclient.queue("pf-bad")
    with pytest.raises(turnstile.InvalidArgument, match=r"prefetch must be"):
        q.work(lambda m: None, prefetch=bad)  # type: ignore[arg-type]


async def test_async_work_with_prefetch(aqclient: turnstile.aio.Client) -> None:
    q = aqclient.queue("pf-async", visibility_timeout=30)
    for i in range(9):
        await q.put(i, key=f"k{i % 3}")
    seen: list[int] = []

    async def handler(m: turnstile.aio.Message) -> None:
        seen.append(m.payload)

    result = await q.work(handler, workers=2, prefetch=3, idle_timeout=1.0,
                          handle_signals=False)
    assert result.acked == 9 and sorted(seen) == list(range(9))
    for k in range(3):
        assert [i for i in seen if i % 3 == k] == [k, k + 3, k + 6]
