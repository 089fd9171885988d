"""Queue semantics on every backend (issue 5): order, keys, cap, receipts, redelivery,
delay, dedup, dead letters, stats, bad input. Short visibility timeouts keep it quick."""

from __future__ import annotations

import threading
import time

import pytest

import turnstile
import turnstile.aio
from tests.contract import queue_harness

aqclient = queue_harness.aqclient  # the fixture, for this module
qclient = queue_harness.qclient  # the fixture, for this module

Client = turnstile.Client


def drain(q: turnstile.Queue) -> list[turnstile.Message]:
    out = []
    for _ in range(1000):
        m = q.get(timeout=0)
        if m is None:
            return out
        out.append(m)
    raise AssertionError("queue did not drain")


def test_put_get_ack_payload_kinds(qclient: Client) -> None:
    q = qclient.queue("basic")
    payloads = [{"a": [1, 2.5, None, True]}, "text ü 🎉", 7, None, b"\x00\xffbytes", [1, "x"]]
    ids = [q.put(p) for p in payloads]
    assert len(set(ids)) == len(ids)
    got = drain(q)
    assert [m.id for m in got] == ids  # keyless: plain FIFO
    assert [m.payload for m in got] == payloads
    assert all(m.attempt == 1 and m.key is None and m.receipt for m in got)
    assert all(m.enqueued_at <= m.deadline for m in got)
    assert [m.ack() for m in got] == [True] * len(got)
    assert got[0].ack() is False  # twice: harmless, refused
    s = q.stats()
    assert (s.ready, s.delayed, s.in_flight, s.dead, s.oldest_age) == (0, 0, 0, 0, None)


def test_one_per_key_in_flight_in_put_order(qclient: Client) -> None:
    q = qclient.queue("keys")
    for k, n in [("A", 0), ("A", 1), ("B", 0), ("A", 2), ("B", 1), ("C", 0)]:
        q.put({"k": k, "n": n}, key=k)
    first = drain(q)
    assert [(m.key, m.payload["n"]) for m in first] == [("A", 0), ("B", 0), ("C", 0)]
    first[1].ack()  # B0 done: B1 next, A still blocked by A0
    assert [(m.key, m.payload["n"]) for m in drain(q)] == [("B", 1)]
    first[0].ack()
    nxt = drain(q)
    assert [(m.key, m.payload["n"]) for m in nxt] == [("A", 1)]
    stats = q.stats()
    assert stats.in_flight == 3 and stats.ready == 1  # B1, C0, A1 in flight; A2 ready
    assert stats.deepest_keys[0] == turnstile.KeyDepth("A", 2)


def test_global_concurrency_cap(qclient: Client) -> None:
    q = qclient.queue("cap", concurrency=2)
    for i in range(5):
        q.put(i)
    got = drain(q)
    assert [m.payload for m in got] == [0, 1]
    got[0].ack()
    assert [m.payload for m in drain(q)] == [2]
    # a consumer with another cap on the same queue applies its own
    assert [m.payload for m in drain(qclient.queue("cap", concurrency=3))] == [3]


def test_redelivery_after_visibility_timeout_and_stale_receipts(qclient: Client) -> None:
    vt = 2.0  # the next lines run well within it, however loaded the machine
    q = qclient.queue("redeliver", visibility_timeout=vt)
    q.put("a1", key="A")
    q.put("a2", key="A")
    t0 = time.monotonic()
    m1 = q.get(timeout=0)
    assert m1 is not None and m1.payload == "a1"
    assert q.get(timeout=0) is None  # A blocked while a1 is in flight
    again = q.get(timeout=60)  # woken when a1's visibility timeout passes
    waited = time.monotonic() - t0
    assert again is not None and (again.id, again.attempt, again.payload) == (m1.id, 2, "a1")
    assert waited > vt - 0.05  # not before its visibility timeout (store clock)
    assert again.receipt != m1.receipt
    assert m1.ack() is False and m1.nack() is False and m1.extend(5) is False  # stale receipt
    assert q.ack(again.id, again.receipt) is True  # from "anywhere": id + receipt
    m2 = q.get(timeout=0)
    assert m2 is not None and m2.payload == "a2"
    m2.ack()


def test_a_claim_repeated_after_a_lost_reply_loses_nothing(qclient: Client) -> None:
    """A claim is not deduplicated by its receipt (docs/queue.md, "A lost reply"): repeated
    with the same receipt, as a client repeats a claim whose reply it lost, it hands out the
    next message; the first delivery stays in flight until its visibility timeout and is then
    delivered again. Both settle by their own id and receipt; nothing is lost."""
    vt = 2.0  # the next lines run well within it, however loaded the machine
    q = qclient.queue("lost-reply", visibility_timeout=vt)
    q.put("a1", key="A")
    q.put("b1", key="B")
    first = q.claim("the-same-receipt").delivery  # its reply "lost"
    repeat = q.claim("the-same-receipt").delivery
    assert first is not None and repeat is not None
    assert (first.key, repeat.key) == ("A", "B") and first.receipt == repeat.receipt
    assert q.stats().in_flight == 2
    assert q.ack(repeat.id, repeat.receipt) is True
    again = q.get(timeout=60)  # A's message, once its visibility timeout passed
    assert again is not None and (again.id, again.attempt) == (first.id, 2)
    assert again.ack() is True
    assert q.stats().pending == 0


def test_ack_from_another_client(qclient: Client, backend) -> None:  # type: ignore[no-untyped-def]
    if not backend.cross_process:
        pytest.skip("memory:// is one process: no second client sees its data")
    q = qclient.queue("elsewhere")
    q.put({"job": 1})
    m = q.get(timeout=0)
    assert m is not None
    with turnstile.connect(backend.url) as other:
        oq = other.queue("elsewhere")
        assert oq.extend(m.id, m.receipt, 10) is not None
        assert oq.ack(m.id, m.receipt) is True
        assert oq.ack(m.id, m.receipt) is False
    assert q.stats().pending == 0


def test_nack_delay_and_order_within_key(qclient: Client) -> None:
    q = qclient.queue("nack")
    q.put("a1", key="A")
    q.put("a2", key="A")
    q.put("n1")
    m = q.get(timeout=0)
    assert m is not None and m.payload == "a1"
    assert m.nack(delay=3.0, error="try later")  # the next lines run well within the delay
    got = drain(q)
    assert [x.payload for x in got] == ["n1"]  # a2 must not pass the nacked a1
    s = q.stats()
    assert (s.delayed, s.ready) == (1, 1)
    again = q.get(timeout=60)
    assert again is not None and (again.payload, again.attempt) == ("a1", 2)
    assert again.ack()
    m2 = q.get(timeout=0)
    assert m2 is not None and m2.payload == "a2"


def test_extend_keeps_message_invisible(qclient: Client) -> None:
    vt = 2.0  # the extend comes well within it
    q = qclient.queue("extend", visibility_timeout=vt)
    q.put("x")
    m = q.get(timeout=0)
    assert m is not None
    old = m.deadline
    assert m.extend(60) is True and m.deadline > old
    time.sleep(vt + 0.5)  # past the visibility timeout it had before the extend
    assert q.get(timeout=0) is None
    assert m.ack() is True


def test_max_attempts_dead_letters_key_moves_on_requeue_purge(qclient: Client) -> None:
    # Each get and its nack run well within vt; the test waits for it once.
    q = qclient.queue("dead", max_attempts=2, visibility_timeout=2.0)
    q.put({"bad": 1}, key="K")
    q.put({"ok": 2}, key="K")
    m = q.get(timeout=0)
    assert m is not None and m.nack(error="ValueError: nope")
    m = q.get(timeout=0)
    assert m is not None and m.attempt == 2
    # the second attempt times out instead: dead, and the key moves on
    nxt = q.get(timeout=60)
    assert nxt is not None and nxt.payload == {"ok": 2}
    dead = q.dead_letters()
    assert len(dead) == 1 and dead[0].payload == {"bad": 1} and dead[0].attempts == 2
    assert dead[0].key == "K" and dead[0].error and "visibility" in dead[0].error
    assert q.stats().dead == 1
    nxt.ack()
    assert q.requeue([dead[0].id]) == 1
    back = q.get(timeout=0)
    assert back is not None and back.id == dead[0].id and back.attempt == 1
    back.nack(error="again")  # attempt 1 of 2
    back = q.get(timeout=0)
    assert back is not None
    back.nack(error="RuntimeError: last")
    dead = q.dead_letters()
    assert [d.error for d in dead] == ["RuntimeError: last"]
    assert q.purge_dead(["no-such-id"]) == 0
    assert q.purge_dead() == 1
    assert q.dead_letters() == [] and q.stats().pending == 0


def test_requeue_all_goes_to_the_back(qclient: Client) -> None:
    q = qclient.queue("requeue-all", max_attempts=1)
    for i in range(3):
        q.put(i, key="K")
    for _ in range(3):
        m = q.get(timeout=0)
        assert m is not None
        m.nack()
    assert [d.payload for d in q.dead_letters()] == [0, 1, 2]
    q.put(3, key="K")
    assert q.requeue() == 3
    order = []
    for _ in range(4):
        m = q.get(timeout=0)
        assert m is not None
        order.append(m.payload)
        m.ack()
    assert order == [3, 0, 1, 2]


def test_delay(qclient: Client) -> None:
    q = qclient.queue("delay")
    delay = 3.0  # the next lines run well within it
    t0 = time.monotonic()
    q.put("later", delay=delay)
    q.put("now")
    m = q.get(timeout=0)
    assert m is not None and m.payload == "now"
    assert q.get(timeout=0) is None
    s = q.stats()
    assert (s.delayed, s.in_flight) == (1, 1)
    m2 = q.get(timeout=60)
    assert m2 is not None and m2.payload == "later"
    assert time.monotonic() - t0 > delay - 0.05  # not before its delay (store clock)


def test_delayed_message_holds_back_its_key(qclient: Client) -> None:
    q = qclient.queue("delay-key")
    q.put("first", key="K", delay=3.0)  # the next two lines run well within the delay
    q.put("second", key="K")
    assert q.get(timeout=0) is None
    m = q.get(timeout=60)
    assert m is not None and m.payload == "first"


def test_dedup_window(qclient: Client) -> None:
    window = 3.0  # the lines up to the sleep run well within it
    q = qclient.queue("dedup", dedup_window=window)
    t0 = time.monotonic()
    a = q.put({"v": 1}, dedup_id="evt-1")
    b = q.put({"v": 2}, dedup_id="evt-1")
    assert a == b
    m = q.get(timeout=0)
    assert m is not None and m.payload == {"v": 1}
    m.ack()
    assert q.put({"v": 3}, dedup_id="evt-1") == a  # still within the window, even acked
    assert q.get(timeout=0) is None
    time.sleep(max(0.0, t0 + window + 0.2 - time.monotonic()))  # until the window has passed
    c = q.put({"v": 4}, dedup_id="evt-1")
    assert c != a
    m = q.get(timeout=0)
    assert m is not None and m.payload == {"v": 4}


def test_blocking_get_is_woken_by_put(qclient: Client) -> None:
    q = qclient.queue("wake")
    got: list[tuple[object, float]] = []

    def consumer() -> None:
        m = q.get(timeout=10)
        got.append((m.payload if m else None, time.monotonic()))

    thread = threading.Thread(target=consumer)
    thread.start()
    time.sleep(0.3)  # the consumer is blocked by now
    sent = time.monotonic()
    q.put("ping")
    thread.join(10)
    assert got and got[0][0] == "ping"
    # woken by the store, before a heartbeat re-check (every 2 s) would have found it
    assert got[0][1] - sent < 1.5


def test_get_timeout(qclient: Client) -> None:
    q = qclient.queue("timeout")
    t0 = time.monotonic()
    assert q.get(timeout=0.3) is None
    assert 0.25 < time.monotonic() - t0 < 30  # waited, and did not block forever
    assert q.get(timeout=0) is None


def test_odd_names_and_keys_stay_separate(qclient: Client) -> None:
    odd = ["{}", "a b", "q'\"", "🎉", "x'; DROP TABLE turnstile_queue_messages; --", "a:b{c}"]
    for i, name in enumerate(odd):
        q = qclient.queue(name)
        q.put(i, key=name)
        q.put(i + 100, key=odd[-1 - i])
    for i, name in enumerate(odd):
        q = qclient.queue(name)
        got = drain(q)
        assert sorted(m.payload for m in got) == [i, i + 100]
        assert {m.key for m in got} == {name, odd[-1 - i]}


def test_queue_names_lists_queues_that_hold_messages(qclient: Client, backend) -> None:  # type: ignore[no-untyped-def]
    assert qclient.queue_names() == []
    names = ["q:a", "q:b {x}", "q*", "r 😀", "[q]"]
    for name in names:
        qclient.queue(name).put({"for": name})
    qclient.lock("q:lock", ttl=5).acquire_nowait(holder="h")  # a lock is not a queue
    assert qclient.queue_names() == sorted(names)  # code-point order
    assert qclient.queue_names("q") == ["q*", "q:a", "q:b {x}"]
    assert qclient.queue_names("q:", 1) == ["q:a"]
    assert qclient.queue_names("q*") == ["q*"]  # the prefix is literal, not a pattern
    assert qclient.queue_names("[") == ["[q]"]
    assert qclient.queue_names("nothing") == []
    # No name can start with these: an empty answer, without asking the store.
    assert qclient.queue_names("q" * 4097) == qclient.queue_names("q\x00") == []
    assert "q:a" not in qclient.names()  # and a queue is not a lock
    if backend.cross_process:
        with turnstile.connect(backend.url) as other:  # another client sees the same list
            assert other.queue_names() == sorted(names)
    # Listed while any message is left: in flight, delayed or dead; not once all are acked.
    done = qclient.queue("q:a")
    m = done.get(timeout=0)
    assert m is not None and m.ack()
    dead = qclient.queue("q*", max_attempts=1)
    m = dead.get(timeout=0)
    assert m is not None and m.nack(error="no")
    assert dead.stats().dead == 1
    flying = qclient.queue("[q]")
    assert flying.get(timeout=0) is not None
    qclient.queue("later").put(1, delay=60)
    assert qclient.queue_names() == ["[q]", "later", "q*", "q:b {x}", "r 😀"]
    assert dead.purge_dead() == 1
    assert "q*" not in qclient.queue_names()


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        ({"prefix": 3}, "prefix must be a string"),
        ({"prefix": "\ud800"}, "prefix must be valid Unicode"),
        ({"max_count": 0}, "max_count must be an integer from 1"),
        ({"max_count": True}, "max_count"),
        ({"max_count": 1.5}, "max_count"),
    ],
)
def test_queue_names_arguments(qclient: Client, kwargs, needle: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(turnstile.InvalidArgument, match=needle):
        qclient.queue_names(**kwargs)


def test_stats(qclient: Client) -> None:
    q = qclient.queue("stats", max_attempts=1)
    for k in ["A", "A", "A", "B", "B", None]:
        q.put(k, key=k)
    q.put("late", delay=60)
    time.sleep(0.05)
    m = q.get(timeout=0)
    assert m is not None and m.key == "A"
    d = q.get(timeout=0)
    assert d is not None and d.key == "B"
    d.nack()  # max_attempts=1: dead
    s = q.stats(top_keys=1)
    assert (s.ready, s.delayed, s.in_flight, s.dead) == (4, 1, 1, 1)
    assert s.pending == 6
    assert s.oldest_age is not None and 0.04 < s.oldest_age < 30
    assert s.deepest_keys == (turnstile.KeyDepth("A", 3),)
    assert s.to_dict()["deepest_keys"] == [{"key": "A", "pending": 3}]


@pytest.mark.parametrize(
    ("call", "needle"),
    [
        (lambda q: q.put(b"x" * (256 * 1024 + 1)), "payload"),
        (lambda q: q.put("x" * (256 * 1024)), "payload"),  # JSON adds the quotes
        (lambda q: q.put({"s": {1, 2}}), "JSON-serializable"),
        (lambda q: q.put(float("nan")), "JSON-serializable"),
        (lambda q: q.put(1, key=5), "key must be a string"),
        (lambda q: q.put(1, key=""), "key must be 1 to 1024"),
        (lambda q: q.put(1, key="k" * 1025), "key must be 1 to 1024"),
        (lambda q: q.put(1, key="a\x00b"), "key must not contain NUL"),
        (lambda q: q.put(1, delay=-1), "delay must be between 0"),
        (lambda q: q.put(1, delay=float("inf")), "delay"),
        (lambda q: q.put(1, delay="1"), "delay must be a number"),
        (lambda q: q.put(1, dedup_id=""), "dedup_id"),
        (lambda q: q.get(timeout=-1), "timeout"),
        (lambda q: q.ack("", "r"), "id"),
        (lambda q: q.ack("id", 3), "receipt"),
        (lambda q: q.nack("id", "r", delay=-2), "delay"),
        (lambda q: q.extend("id", "r", 0), "seconds"),
        (lambda q: q.dead_letters(limit=0), "limit"),
        (lambda q: q.stats(top_keys=-1), "top_keys"),
        (lambda q: q.requeue("one-id"), "ids"),
        (lambda q: q.purge_dead([1]), "ids"),
    ],
)
def test_bad_input_is_refused(qclient: Client, call, needle: str) -> None:  # type: ignore[no-untyped-def]
    q = qclient.queue("bad")
    with pytest.raises(turnstile.InvalidArgument, match=needle):
        call(q)
    assert q.stats().pending == 0  # nothing stored


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        ({"name": ""}, "name"),
        ({"name": "n" * 5000}, "name"),
        ({"name": 3}, "name"),
        ({"name": "q", "visibility_timeout": 0}, "visibility_timeout"),
        ({"name": "q", "visibility_timeout": 13 * 3600}, "visibility_timeout"),
        ({"name": "q", "max_attempts": 0}, "max_attempts"),
        ({"name": "q", "max_attempts": 1.5}, "max_attempts"),
        ({"name": "q", "concurrency": 0}, "concurrency"),
        ({"name": "q", "dedup_window": 0}, "dedup_window"),
    ],
)
def test_bad_queue_settings_are_refused(qclient: Client, kwargs, needle: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(turnstile.InvalidArgument, match=needle):
        qclient.queue(**kwargs)


async def test_async_api(aqclient: turnstile.aio.Client) -> None:
    import asyncio

    q = aqclient.queue("async", visibility_timeout=60)
    waiter = asyncio.create_task(q.get(timeout=60))
    await asyncio.sleep(0.2)
    mid = await q.put({"x": 1}, key="K")
    await q.put({"x": 2}, key="K")
    m = await waiter
    assert m is not None and m.id == mid and m.payload == {"x": 1}
    assert await q.get(timeout=0) is None
    assert await m.extend(3)
    assert await m.ack()
    m2 = await q.get(timeout=0)
    assert m2 is not None and m2.payload == {"x": 2}
    assert await m2.nack()
    assert (await q.stats()).ready == 1
    assert await q.dead_letters() == []
    assert await aqclient.queue_names("asy") == ["async"]
