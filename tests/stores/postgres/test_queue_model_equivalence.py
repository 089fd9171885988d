"""The PostgreSQL queue functions (migration 0002, 0011) held to ``_core/queue_machine.py``: the
same random operations on the same virtual clock (``p_now``) must give identical answers and
wake the same waiters (checked through the NOTIFYs the functions send). ``queue_ack_claim``
(the worker loop's step) must answer and wake as an ack then a claim by a new waiter, and
``queue_ack_claim_many`` (its step between batches, migration 0015) as its acks then its
claims until one finds nothing (only the first naming the new waiter)."""

from __future__ import annotations

import random

import psycopg
import pytest

import turnstile
from turnstile._core import queue_machine as qmod
from turnstile._core.records import KIND_JSON, BatchClaim, NewMessage
from turnstile.stores.postgres.sql import wake_key


@pytest.mark.parametrize("seed", range(4))
def test_sql_queue_functions_follow_the_model(pg_url: str, seed: int) -> None:
    rnd = random.Random(seed)
    clock = [1_700_000_000.0]
    client = turnstile.connect(pg_url)
    backend = client.backend
    backend.clock_override = lambda: clock[0]  # type: ignore[attr-defined]
    qb = backend.queues()  # type: ignore[attr-defined]
    cfg = backend.config  # type: ignore[attr-defined]
    listen = psycopg.connect(cfg.conninfo, autocommit=True)
    listen.execute(f'LISTEN "{cfg.channel}"')
    keys_of = {wake_key("q", w, queue=True): w for w in ("w1", "w2", "w3")}
    state = qmod.QueueState()
    deliveries: list[tuple[str, str]] = []
    ids: list[str] = []

    def _drain(expected: int = 0) -> list[str]:
        """The wake-ups sent: wait for the ``expected`` ones (a busy machine may deliver a
        NOTIFY late), then a moment for any unexpected extra."""
        got = []
        if expected:
            for n in listen.notifies(timeout=10.0, stop_after=expected):
                if n.payload in keys_of:
                    got.append(keys_of[n.payload])
        for n in listen.notifies(timeout=0.02):
            if n.payload in keys_of:
                got.append(keys_of[n.payload])
        return got

    try:
        for step in range(150):
            clock[0] += rnd.choice([0.0, 0.0, 0.25, 0.75, 3.0])
            now = clock[0]
            op = rnd.choices(["put", "claim", "ack", "nack", "extend", "stats", "dead",
                              "requeue", "purge", "ack_claim", "ack_claim_many"],
                             [30, 30, 12, 8, 4, 4, 3, 3, 1, 8, 8])[0]
            if op == "put":
                i = f"m{step}"
                ids.append(i)
                m = NewMessage(i, rnd.choice(["A", "B", "C", None]), b"x", KIND_JSON,
                               rnd.choice([0.0, 0.0, 1.5]), rnd.choice([None, "d1"]),
                               rnd.choice([1, 2, 3]))
                want, woken = qmod.put(state, m, dedup_window=5.0, now=now)
                got = qb.put("q", m, dedup_window=5.0)
            elif op == "claim":
                kw = dict(receipt=f"r{step}", visibility_timeout=rnd.choice([1.0, 4.0]),
                          concurrency=rnd.choice([None, 1, 2]), max_attempts=rnd.choice([2, 3]),
                          waiter=rnd.choice([None, "w1", "w2", "w3"]))
                want, woken = qmod.claim(state, now=now, **kw)  # type: ignore[arg-type]
                got = qb.claim("q", **kw)
                if want.delivery is not None:
                    deliveries.append((want.delivery.id, want.delivery.receipt))
            elif op == "ack_claim" and deliveries:
                i, r = rnd.choice(deliveries[-6:])
                fresh = f"n{step}"  # a new waiter, as ack_claim requires
                keys_of[wake_key("q", fresh, queue=True)] = fresh
                kw = dict(receipt=f"r{step}", visibility_timeout=rnd.choice([1.0, 4.0]),
                          concurrency=rnd.choice([None, 1, 2]), max_attempts=rnd.choice([2, 3]),
                          waiter=rnd.choice([None, fresh]))
                acked, woken = qmod.ack(state, id=i, receipt=r, now=now)
                claimed, woken_too = qmod.claim(state, now=now, **kw)  # type: ignore[arg-type]
                woken += woken_too
                want = (acked, claimed)
                got = qb.ack_claim("q", i, r, **kw)
                if claimed.delivery is not None:
                    deliveries.append((claimed.delivery.id, claimed.delivery.receipt))
            elif op == "ack_claim_many":
                acks = rnd.sample(deliveries[-6:], min(len(deliveries[-6:]), rnd.choice([0, 1, 3])))
                fresh = f"n{step}"
                keys_of[wake_key("q", fresh, queue=True)] = fresh
                waiter = rnd.choice([None, fresh])
                receipts = [f"r{step}-{j}" for j in range(rnd.choice([1, 2, 4]))]
                kw = dict(visibility_timeout=rnd.choice([1.0, 4.0]),
                          concurrency=rnd.choice([None, 1, 2, 3]),
                          max_attempts=rnd.choice([2, 3]))
                woken = []
                acked_all = []
                for i, r in acks:
                    acked, woken_by = qmod.ack(state, id=i, receipt=r, now=now)
                    acked_all.append(acked)
                    woken += woken_by
                claimed = []
                for receipt in receipts:
                    result, woken_by = qmod.claim(
                        state, now=now, receipt=receipt, waiter=None if claimed else waiter,
                        **kw)  # type: ignore[arg-type]
                    woken += woken_by
                    if result.delivery is None:
                        break
                    claimed.append(result.delivery)
                    deliveries.append((result.delivery.id, receipt))
                want = (acked_all, BatchClaim(claimed, now,
                                              None if claimed else result.retry_after))
                got = qb.ack_claim_many("q", acks, receipts=receipts, waiter=waiter, **kw)
            elif op in ("ack", "nack", "extend") and deliveries:
                i, r = rnd.choice(deliveries[-6:])
                if op == "ack":
                    want, woken = qmod.ack(state, id=i, receipt=r, now=now)
                    got = qb.ack("q", i, r)
                elif op == "nack":
                    want, woken = qmod.nack(state, id=i, receipt=r, delay=1.0, error=None,
                                            now=now)
                    got = qb.nack("q", i, r, delay=1.0, error=None)
                else:
                    want, woken = qmod.extend(state, id=i, receipt=r, seconds=2.0, now=now)
                    got = qb.extend("q", i, r, 2.0)
            elif op == "stats":
                want, woken = qmod.stats(state, name="q", top_keys=2, now=now)
                got = qb.stats("q", top_keys=2)
            elif op == "dead":
                want, woken = qmod.dead_letters(state, limit=5, now=now)
                got = qb.dead_letters("q", limit=5)
            elif op in ("requeue", "purge") and ids:
                chosen = None if rnd.random() < 0.5 else rnd.sample(ids, min(3, len(ids)))
                fn = qmod.requeue if op == "requeue" else qmod.purge_dead
                want, woken = fn(state, ids=chosen, now=now)
                got = (qb.requeue if op == "requeue" else qb.purge_dead)("q", chosen)
            else:
                continue
            assert got == want, f"step {step} {op}"
            assert sorted(_drain(len(woken))) == sorted(woken), f"step {step} {op} wake-ups"
    finally:
        listen.close()
        client.close()
