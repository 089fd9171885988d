"""The store's batch step (``ack_claim_many``: one Lua script on Redis, one transaction on
PostgreSQL) answers as its steps one after another would (``StepwiseBatches``): the same
random puts, nacks and batch steps on two queues of one store, one through each, give the
same acks and the same messages (ids, keys, bodies, attempts, receipts) in the same order.
Without expiries or delays, so nothing depends on the clock; ``ack_claim`` (one script on
Redis too) is the batch of one."""

from __future__ import annotations

import random

import pytest

import turnstile
from tests.contract import queue_harness
from turnstile._core.records import KIND_JSON, NewMessage
from turnstile._sync.backends.protocol import StepwiseBatches

qclient = queue_harness.qclient  # the fixture, for this module


@pytest.mark.parametrize("seed", range(3))
def test_the_batch_step_answers_as_its_steps_one_after_another(
    qclient: turnstile.Client, seed: int
) -> None:
    rnd = random.Random(seed)
    store = qclient._queues()
    native, stepwise = f"native-{seed}", f"stepwise-{seed}"
    held: list[tuple[str, str]] = []  # (id, receipt) handed out and maybe not settled yet
    common = {"visibility_timeout": 600.0, "max_attempts": 3}
    for step in range(120):
        op = rnd.choices(["put", "batch", "one", "nack"], [40, 35, 15, 10])[0]
        if op == "put":
            m = NewMessage(f"m{step}", rnd.choice(["A", "B", "C", "D", None]), b"%d" % step,
                           KIND_JSON, 0.0, None, 3)
            for name in (native, stepwise):
                store.put(name, m, dedup_window=60.0)
        elif op == "batch":
            acks = rnd.sample(held[-8:], min(len(held[-8:]), rnd.choice([0, 1, 3])))
            receipts = [f"r{step}-{j}" for j in range(rnd.choice([1, 2, 4]))]
            cap = rnd.choice([None, 1, 2, 3])
            got = store.ack_claim_many(native, acks, receipts=receipts, concurrency=cap,
                                       waiter=None, **common)
            want = StepwiseBatches.ack_claim_many(
                store, stepwise, acks, receipts=receipts, concurrency=cap, waiter=None, **common
            )
            assert got[0] == want[0], f"step {step}: acks"
            assert _shown(got[1].deliveries) == _shown(want[1].deliveries), f"step {step}"
            assert (got[1].retry_after is None) == (want[1].retry_after is None), f"step {step}"
            held += [(d.id, d.receipt) for d in got[1].deliveries]
        elif op == "one" and held:
            i, r = rnd.choice(held[-8:])
            cap = rnd.choice([None, 1, 2])
            got1 = store.ack_claim(native, i, r, receipt=f"r{step}", concurrency=cap,
                                   waiter=None, **common)
            want1 = (store.ack(stepwise, i, r),
                     store.claim(stepwise, receipt=f"r{step}", concurrency=cap, waiter=None,
                                 **common))
            assert got1[0] == want1[0], f"step {step}: ack"
            assert _shown([got1[1].delivery]) == _shown([want1[1].delivery]), f"step {step}"
            if got1[1].delivery is not None:
                held.append((got1[1].delivery.id, f"r{step}"))
        elif op == "nack" and held:
            i, r = rnd.choice(held[-8:])
            a = store.nack(native, i, r, delay=0.0, error="e")
            b = store.nack(stepwise, i, r, delay=0.0, error="e")
            assert a == b, f"step {step}: nack"


def _shown(deliveries: list[object]) -> list[tuple[object, ...] | None]:
    return [
        None if d is None else (d.id, d.key, d.body, d.attempt, d.receipt)  # type: ignore[attr-defined]
        for d in deliveries
    ]


def test_a_batch_step_without_a_receipt_is_refused_and_changes_nothing(
    qclient: turnstile.Client,
) -> None:
    store = qclient._queues()
    for i in ("m1", "m2"):
        store.put("no-receipt", NewMessage(i, None, b"1", KIND_JSON, 0.0, None, 3),
                  dedup_window=60.0)
    held = store.claim("no-receipt", receipt="r1", visibility_timeout=60.0, concurrency=None,
                       max_attempts=3, waiter=None).delivery
    assert held is not None
    with pytest.raises(ValueError, match="at least one receipt"):
        store.ack_claim_many("no-receipt", [(held.id, "r1")], receipts=[],
                             visibility_timeout=60.0, concurrency=None, max_attempts=3,
                             waiter=None)
    stats = store.stats("no-receipt", top_keys=1)
    assert (stats.ready, stats.in_flight) == (1, 1)  # not even the ack was made
