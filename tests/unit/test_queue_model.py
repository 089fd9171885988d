"""The queue's reference state machine, and the SQLite queue held to it step by step.

The differential test drives the model (``_core/queue_machine.py``) and the SQLite store with
the same random operations on the same fake clock and requires identical answers and
identical wake-ups: the SQL is an implementation of the model, not a second opinion.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from turnstile._core import queue_machine as qmod
from turnstile._core.records import KIND_JSON, NewMessage
from turnstile.stores.sqlite.lock_store import SQLiteStore
from turnstile.stores.sqlite.queue_store import SQLiteQueueStore


def msg(i: str, key: str | None = None, delay: float = 0.0, dedup: str | None = None,
        attempts: int = 3) -> NewMessage:
    return NewMessage(i, key, i.encode(), KIND_JSON, delay, dedup, attempts)


def claim(state: qmod.QueueState, now: float, receipt: str = "r", vt: float = 10.0,
          concurrency: int | None = None, waiter: str | None = None, max_attempts: int = 3):
    result, _ = qmod.claim(state, receipt=receipt, visibility_timeout=vt, concurrency=concurrency,
                           max_attempts=max_attempts, waiter=waiter, now=now)
    return result


def test_per_key_order_and_parallel_keys() -> None:
    s = qmod.QueueState()
    for i, k in [("a1", "A"), ("a2", "A"), ("b1", "B"), ("n1", None), ("n2", None)]:
        qmod.put(s, msg(i, k), dedup_window=60, now=1.0)
    got = [claim(s, 2.0, f"r{i}").delivery for i in range(6)]
    assert [d.id if d else None for d in got] == ["a1", "b1", "n1", "n2", None, None]
    ok, _ = qmod.ack(s, id="a1", receipt="r0", now=3.0)
    assert ok
    d = claim(s, 3.0, "r9").delivery
    assert d is not None and d.id == "a2"


def test_redelivery_goes_before_later_messages_of_its_key() -> None:
    s = qmod.QueueState()
    qmod.put(s, msg("a1", "A"), dedup_window=60, now=0.0)
    qmod.put(s, msg("a2", "A"), dedup_window=60, now=0.0)
    assert claim(s, 1.0, "r1", vt=5).delivery.id == "a1"  # type: ignore[union-attr]
    assert claim(s, 5.9, "r2").delivery is None  # a1 still in flight: A is blocked
    d = claim(s, 6.0, "r3").delivery  # a1 timed out at 6.0: delivered again, not a2
    assert d is not None and (d.id, d.attempt) == ("a1", 2)
    assert qmod.ack(s, id="a1", receipt="r1", now=6.1)[0] is False  # stale receipt
    assert qmod.nack(s, id="a1", receipt="r3", delay=2, error="boom", now=6.1)[0]
    assert claim(s, 7.0, "r4").delivery is None  # nacked with a delay: A waits for a1
    assert claim(s, 8.1, "r5").delivery.id == "a1"  # type: ignore[union-attr]


def test_dead_letter_moves_the_key_on_and_requeue() -> None:
    s = qmod.QueueState()
    qmod.put(s, msg("a1", "A", attempts=1), dedup_window=60, now=0.0)
    qmod.put(s, msg("a2", "A"), dedup_window=60, now=0.0)
    d = claim(s, 1.0, "r1", max_attempts=1).delivery  # the consumer's max_attempts rules
    assert d is not None and d.id == "a1"
    qmod.nack(s, id="a1", receipt="r1", delay=0, error="bad", now=1.0)
    dead, _ = qmod.dead_letters(s, limit=10, now=1.0)
    assert [(x.id, x.attempts, x.error) for x in dead] == [("a1", 1, "bad")]
    assert claim(s, 1.0, "r2").delivery.id == "a2"  # type: ignore[union-attr]
    assert qmod.requeue(s, ids=None, now=2.0)[0] == 1
    assert claim(s, 2.0, "r3").delivery is None  # a2 in flight; a1 now behind it
    qmod.ack(s, id="a2", receipt="r2", now=2.0)
    d = claim(s, 2.0, "r4").delivery
    assert d is not None and (d.id, d.attempt) == ("a1", 1)


def test_concurrency_cap_dedup_delay_and_wakeups() -> None:
    s = qmod.QueueState()
    assert claim(s, 0.0, waiter="w1").delivery is None
    assert claim(s, 0.0, waiter="w2").delivery is None
    r, woken = qmod.put(s, msg("x", None, dedup="d"), dedup_window=10, now=0.0)
    assert r.created and woken == ["w1"]  # one message, one wake-up, oldest waiter first
    r, woken = qmod.put(s, msg("y", None, dedup="d"), dedup_window=10, now=9.9)
    assert (r.id, r.created, woken) == ("x", False, [])
    r, _ = qmod.put(s, msg("z", None, dedup="d", delay=5), dedup_window=10, now=10.0)
    assert (r.id, r.created) == ("z", True)  # the window passed
    assert claim(s, 10.0, "r1", concurrency=1).delivery.id == "x"  # type: ignore[union-attr]
    res = claim(s, 15.0, "r2", concurrency=1)
    assert res.delivery is None and res.retry_after == pytest.approx(5.0)  # cap, x expires at 20
    assert claim(s, 15.0, "r3", concurrency=2).delivery.id == "z"  # type: ignore[union-attr]


# -- differential: SQLite == model ------------------------------------------------------------
class Clock:
    def __init__(self) -> None:
        self.now = 1_700_000_000.0

    def __call__(self) -> float:
        return self.now


@pytest.mark.parametrize("seed", range(12))
def test_sqlite_matches_model(tmp_path: Path, seed: int) -> None:
    rnd = random.Random(seed)
    clock = Clock()
    store = SQLiteStore(str(tmp_path / "q.db"), clock=clock)
    sq = SQLiteQueueStore(store)
    sq_woken: list[str] = []
    sq.wake.signal = lambda name, waiter: sq_woken.append(waiter)  # type: ignore[method-assign]
    state = qmod.QueueState()
    deliveries: list[tuple[str, str]] = []
    ids: list[str] = []
    keys = ["A", "B", "C", None]
    try:
        for step in range(400):
            clock.now += rnd.choice([0.0, 0.0, 0.1, 0.7, 3.0])
            now = clock.now
            op = rnd.choices(
                ["put", "claim", "ack", "nack", "extend", "stats", "dead", "requeue", "purge"],
                [30, 30, 12, 8, 4, 4, 3, 3, 1],
            )[0]
            sq_woken.clear()
            if op == "put":
                i = f"m{step}"
                ids.append(i)
                m = NewMessage(
                    i, rnd.choice(keys), bytes([step % 256]), KIND_JSON,
                    rnd.choice([0.0, 0.0, 0.0, 1.5]),
                    rnd.choice([None, None, "d1", "d2"]), rnd.choice([1, 2, 3]),
                )
                want, woken = qmod.put(state, m, dedup_window=5.0, now=now)
                got = sq.put("q", m, 5.0)
            elif op == "claim":
                kw = dict(
                    receipt=f"r{step}", visibility_timeout=rnd.choice([1.0, 4.0]),
                    concurrency=rnd.choice([None, 1, 2, 3]), max_attempts=rnd.choice([2, 3]),
                    waiter=rnd.choice([None, "w1", "w2", "w3"]),
                )
                want, woken = qmod.claim(state, now=now, **kw)  # type: ignore[arg-type]
                got = sq.claim("q", kw["receipt"], kw["visibility_timeout"],  # type: ignore[arg-type]
                               kw["concurrency"], kw["max_attempts"], kw["waiter"])  # type: ignore[arg-type]
                if want.delivery is not None:
                    deliveries.append((want.delivery.id, want.delivery.receipt))
            elif op in ("ack", "nack", "extend") and deliveries:
                i, r = rnd.choice(deliveries[-6:])
                if op == "ack":
                    want, woken = qmod.ack(state, id=i, receipt=r, now=now)
                    got = sq.ack("q", i, r)
                elif op == "nack":
                    d, e = rnd.choice([0.0, 1.0]), rnd.choice([None, "err"])
                    want, woken = qmod.nack(state, id=i, receipt=r, delay=d, error=e, now=now)
                    got = sq.nack("q", i, r, d, e)
                else:
                    want, woken = qmod.extend(state, id=i, receipt=r, seconds=2.0, now=now)
                    got = sq.extend("q", i, r, 2.0)
            elif op == "stats":
                want, woken = qmod.stats(state, name="q", top_keys=2, now=now)
                got = sq.stats("q", 2)
            elif op == "dead":
                want, woken = qmod.dead_letters(state, limit=5, now=now)
                got = sq.dead_letters("q", 5)
            elif op in ("requeue", "purge") and ids:
                chosen = None if rnd.random() < 0.5 else rnd.sample(ids, min(3, len(ids)))
                fn = qmod.requeue if op == "requeue" else qmod.purge_dead
                want, woken = fn(state, ids=chosen, now=now)
                got = (sq.requeue if op == "requeue" else sq.purge_dead)("q", chosen)
            else:
                continue
            assert got == want, f"step {step} {op}"
            assert sq_woken == woken, f"step {step} {op} wake-ups"
    finally:
        store.close()
