"""The reference state machine of one keyed FIFO queue, with no I/O.

The memory backend runs it directly; the SQLite, Redis and PostgreSQL backends implement the
same steps in SQL or Lua, and the contract suite (``tests/contract/test_queue_*.py``) plus a
differential test against this module (``tests/unit/test_queue_model.py``) hold them to it.

A message is **ready** (waiting to be delivered, due at ``available_at``), **in flight**
(handed out with a ``receipt`` until ``deadline``) or **dead** (a dead letter). Acked
messages are deleted. ``seq`` is the arrival order.

Rules, at store time ``now``:

* Every step first *purges*: an in-flight message whose ``deadline`` passed is ready again
  (due at its deadline) or, if it has used ``max_attempts`` deliveries, dead (died at its
  deadline). Purging depends only on ``now``, so it does not matter which step runs it.
* **Per-key order.** Among the pending (ready or in-flight) messages of one key, only the one
  with the smallest ``seq`` (the key's *head*) can be delivered, and only when it is ready and
  due. So a key has at most one message in flight; a redelivered message (timed out or
  nacked) keeps its ``seq`` and goes before later messages of its key; a delayed message
  holds back later messages of its key; a dead letter no longer counts, so its key moves on.
  Keyless messages are each their own head: plain FIFO.
* **claim** hands out the deliverable message with the smallest ``seq``, unless
  ``concurrency`` messages are already in flight.
* **ack / nack / extend** act only on an in-flight message whose receipt matches and whose
  deadline has not passed: a stale receipt (the message timed out, perhaps was redelivered
  with a new receipt) is refused, so the same delivery is never settled twice.
* **Dedup.** A put whose ``dedup_id`` was put within the last ``dedup_window`` seconds stores
  nothing and answers the earlier message's id (also if that one is already acked).
* **Wake-ups.** A waiting consumer registers in ``waiters`` (inside the claim step that
  found nothing, so no wake-up can slip between its look and its sleep); every step that may
  have made one more message deliverable wakes the oldest registered waiter per such
  message. A waiter whose claim succeeds is unregistered by that claim.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .records import (
    ClaimResult,
    DeadLetterRow,
    Delivery,
    KeyDepth,
    NewMessage,
    PutResult,
    QueueStats,
)

READY = 0
IN_FLIGHT = 1
DEAD = 2

EXPIRED_ERROR = "visibility timeout passed before ack"
NACKED_ERROR = "nacked"
# A registered waiter that does not claim again within this long is forgotten. Blocked
# consumers re-check at least every WAITER_TTL / 3 (a bound, not polling: see docs/queue.md).
WAITER_TTL = 6.0
WAITER_HEARTBEAT = WAITER_TTL / 3


@dataclass(slots=True)
class MessageRow:
    id: str
    seq: int
    key: str | None
    body: bytes
    kind: int
    enqueued_at: float
    available_at: float
    attempts: int
    max_attempts: int
    state: int = READY
    receipt: str | None = None
    deadline: float = 0.0
    error: str | None = None
    died_at: float = 0.0


@dataclass(slots=True)
class QueueState:
    # Every message not yet acked, in seq order (dict insertion order; requeue re-inserts).
    messages: dict[str, MessageRow] = field(default_factory=dict)
    last_seq: int = 0
    dedup: dict[str, tuple[str, float]] = field(default_factory=dict)  # dedup_id -> (id, exp)
    waiters: dict[str, float] = field(default_factory=dict)  # waiter -> expires_at, in order

    @property
    def empty(self) -> bool:
        return not self.messages and not self.dedup and not self.waiters


def purge(state: QueueState, now: float) -> int:
    """Time out in-flight messages past their deadline; drop expired dedup entries and
    waiters. Returns how many messages left flight (each may unblock one delivery)."""
    freed = 0
    for m in state.messages.values():
        if m.state == IN_FLIGHT and m.deadline <= now:
            freed += 1
            m.receipt = None
            m.error = EXPIRED_ERROR
            if m.attempts >= m.max_attempts:
                m.state, m.died_at = DEAD, m.deadline
            else:
                m.state, m.available_at = READY, m.deadline
    for dedup_id in [d for d, (_, exp) in state.dedup.items() if exp <= now]:
        del state.dedup[dedup_id]
    for waiter in [w for w, exp in state.waiters.items() if exp <= now]:
        del state.waiters[waiter]
    return freed


def take_waiters(state: QueueState, count: int) -> list[str]:
    """Unregister and return the ``count`` oldest waiters (call after :func:`purge`)."""
    woken = list(state.waiters)[: max(0, count)]
    for waiter in woken:
        del state.waiters[waiter]
    return woken


def next_deliverable(state: QueueState, now: float) -> MessageRow | None:
    """The ready, due message with the smallest seq that heads its key (or has none)."""
    seen: set[str] = set()
    for m in state.messages.values():
        if m.state == DEAD:
            continue
        if m.key is not None:
            if m.key in seen:
                continue
            seen.add(m.key)
        if m.state == READY and m.available_at <= now:
            return m
    return None


def retry_after(state: QueueState, now: float) -> float | None:
    times = [
        m.available_at if m.state == READY else m.deadline
        for m in state.messages.values()
        if (m.state == READY and m.available_at > now) or m.state == IN_FLIGHT
    ]
    return max(0.0, min(times) - now) if times else None


def in_flight(state: QueueState) -> int:
    return sum(1 for m in state.messages.values() if m.state == IN_FLIGHT)


def put(
    state: QueueState, message: NewMessage, *, dedup_window: float, now: float
) -> tuple[PutResult, list[str]]:
    freed = purge(state, now)
    if message.dedup_id is not None and message.dedup_id in state.dedup:
        return PutResult(state.dedup[message.dedup_id][0], False, now), take_waiters(state, freed)
    if message.id in state.messages:  # a client retrying the very same put
        return PutResult(message.id, False, now), take_waiters(state, freed)
    state.last_seq += 1
    state.messages[message.id] = MessageRow(
        id=message.id,
        seq=state.last_seq,
        key=message.key,
        body=message.body,
        kind=message.kind,
        enqueued_at=now,
        available_at=now + message.delay,
        attempts=0,
        max_attempts=message.max_attempts,
    )
    if message.dedup_id is not None:
        state.dedup[message.dedup_id] = (message.id, now + dedup_window)
    return PutResult(message.id, True, now), take_waiters(state, freed + 1)


def claim(
    state: QueueState,
    *,
    receipt: str,
    visibility_timeout: float,
    concurrency: int | None,
    max_attempts: int,
    waiter: str | None,
    now: float,
) -> tuple[ClaimResult, list[str]]:
    """Hand out the next deliverable message (per-key head, smallest seq) unless
    ``concurrency`` messages are in flight. Without one, register ``waiter`` (if given)."""
    freed = purge(state, now)
    m = None
    if concurrency is None or in_flight(state) < concurrency:
        m = next_deliverable(state, now)
    if m is None:
        if waiter is not None:
            state.waiters[waiter] = now + WAITER_TTL  # keeps its place if already registered
        return ClaimResult(None, now, retry_after(state, now)), take_waiters(state, freed)
    if waiter is not None:
        state.waiters.pop(waiter, None)
    m.state = IN_FLIGHT
    m.attempts += 1
    m.max_attempts = max_attempts
    m.receipt = receipt
    m.deadline = now + visibility_timeout
    delivery = Delivery(
        m.id, m.key, m.body, m.kind, m.attempts, m.enqueued_at, receipt, m.deadline
    )
    return ClaimResult(delivery, now, None), take_waiters(state, freed - 1)


def _holding(state: QueueState, message_id: str, receipt: str) -> MessageRow | None:
    m = state.messages.get(message_id)
    if m is None or m.state != IN_FLIGHT or m.receipt != receipt:
        return None
    return m


def ack(state: QueueState, *, id: str, receipt: str, now: float) -> tuple[bool, list[str]]:
    freed = purge(state, now)
    m = _holding(state, id, receipt)
    if m is None:
        return False, take_waiters(state, freed)
    del state.messages[id]
    return True, take_waiters(state, freed + 1)


def nack(
    state: QueueState, *, id: str, receipt: str, delay: float, error: str | None, now: float
) -> tuple[bool, list[str]]:
    """Give the message back: due again after ``delay``, before later messages of its key;
    dead if it has used its ``max_attempts``."""
    freed = purge(state, now)
    m = _holding(state, id, receipt)
    if m is None:
        return False, take_waiters(state, freed)
    m.receipt = None
    m.error = error if error is not None else NACKED_ERROR
    if m.attempts >= m.max_attempts:
        m.state, m.died_at = DEAD, now
    else:
        m.state, m.available_at = READY, now + delay
    return True, take_waiters(state, freed + 1)


def extend(
    state: QueueState, *, id: str, receipt: str, seconds: float, now: float
) -> tuple[float | None, list[str]]:
    """Keep an in-flight message invisible until ``now + seconds``; ``None`` if its receipt
    is stale (it timed out, was settled, or was redelivered)."""
    freed = purge(state, now)
    m = _holding(state, id, receipt)
    if m is None:
        return None, take_waiters(state, freed)
    m.deadline = now + seconds
    return m.deadline, take_waiters(state, freed)


def unregister(state: QueueState, *, waiter: str) -> None:
    state.waiters.pop(waiter, None)


def stats(
    state: QueueState, *, name: str, top_keys: int, now: float
) -> tuple[QueueStats, list[str]]:
    freed = purge(state, now)
    ready = delayed = flying = dead = 0
    oldest: float | None = None
    depth: dict[str, int] = {}
    for m in state.messages.values():
        if m.state == DEAD:
            dead += 1
            continue
        if m.state == IN_FLIGHT:
            flying += 1
        elif m.available_at <= now:
            ready += 1
        else:
            delayed += 1
        oldest = m.enqueued_at if oldest is None else min(oldest, m.enqueued_at)
        if m.key is not None:
            depth[m.key] = depth.get(m.key, 0) + 1
    deepest = sorted(depth.items(), key=lambda kv: (-kv[1], kv[0]))[:top_keys]
    result = QueueStats(
        name=name,
        ready=ready,
        delayed=delayed,
        in_flight=flying,
        dead=dead,
        oldest_age=None if oldest is None else max(0.0, now - oldest),
        deepest_keys=tuple(KeyDepth(k, n) for k, n in deepest),
        now=now,
    )
    return result, take_waiters(state, freed)


def dead_letters(
    state: QueueState, *, limit: int, now: float
) -> tuple[list[DeadLetterRow], list[str]]:
    """Dead letters in put order, at most ``limit``."""
    freed = purge(state, now)
    rows = [
        DeadLetterRow(m.id, m.key, m.body, m.kind, m.attempts, m.enqueued_at, m.died_at, m.error)
        for m in state.messages.values()
        if m.state == DEAD
    ][:limit]
    return rows, take_waiters(state, freed)


def requeue(
    state: QueueState, *, ids: list[str] | None, now: float
) -> tuple[int, list[str]]:
    """Put dead letters (all, or those in ``ids``) back at the end of the queue, due now, with
    their attempts reset; ``enqueued_at`` is kept. Returns how many."""
    freed = purge(state, now)
    wanted = None if ids is None else set(ids)
    chosen = [
        m
        for m in state.messages.values()
        if m.state == DEAD and (wanted is None or m.id in wanted)
    ]
    for m in chosen:
        del state.messages[m.id]
        state.last_seq += 1
        m.seq = state.last_seq
        m.state, m.attempts, m.available_at = READY, 0, now
        m.error, m.died_at = None, 0.0
        state.messages[m.id] = m
    return len(chosen), take_waiters(state, freed + len(chosen))


def purge_dead(
    state: QueueState, *, ids: list[str] | None, now: float
) -> tuple[int, list[str]]:
    """Delete dead letters (all, or those in ``ids``). Returns how many."""
    freed = purge(state, now)
    wanted = None if ids is None else set(ids)
    chosen = [
        m.id
        for m in state.messages.values()
        if m.state == DEAD and (wanted is None or m.id in wanted)
    ]
    for message_id in chosen:
        del state.messages[message_id]
    return len(chosen), take_waiters(state, freed)
