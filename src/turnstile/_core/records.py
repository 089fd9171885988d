"""Plain records exchanged between primitives and backends: locks, then queues.

All times are seconds since the Unix epoch *on the store's clock* (Redis ``TIME``,
PostgreSQL ``now()``, the SQLite host's clock). Compare them with ``Status.now``, never with
the local clock of a client on another host.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True, slots=True)
class Grant:
    """A lease as the store recorded it."""

    name: str
    holder: str
    token: int
    acquired_at: float
    expires_at: float


@dataclass(frozen=True, slots=True)
class AcquireResult:
    """What one atomic acquire step answered.

    ``grant`` is set when the caller holds the name. Otherwise ``position`` is its place in
    line (0 = next), or ``None`` when it did not join the line (``acquire_nowait``).
    ``retry_after`` is how long until the earliest current lease expires (store clock), so a
    waiter can re-check exactly when a crashed holder's lease runs out.
    ``wait_id`` names the caller's waiting entry on stores whose wake-ups carry the grant
    (see ``AsyncWaiter.handed``); it is an identity, not part of the answer's value.
    """

    grant: Grant | None
    position: int | None
    now: float
    retry_after: float | None = None
    wait_id: int | None = field(default=None, compare=False)


@dataclass(frozen=True, slots=True)
class HolderInfo:
    holder: str
    token: int
    acquired_at: float
    expires_at: float
    # A callback grant: its callback's kind ("sfn" or "http"; never the task token or URL)
    # and its delivery ("pending" or "delivered").
    callback: str | None = None
    delivery: str | None = None
    key: str | None = None  # a semaphore group's: the key it holds


@dataclass(frozen=True, slots=True)
class WaiterInfo:
    holder: str
    position: int
    joined_at: float
    expires_at: float
    callback: str | None = None  # a callback waiter: its callback's kind
    key: str | None = None  # a semaphore group's: the key it waits for


@dataclass(frozen=True, slots=True)
class CallbackDelivery:
    """A grant whose callback a deliverer has claimed to deliver (``lock_machine``'s
    ``take_deliveries``). ``callback`` is the stored callback text (a secret: it holds the
    task token); ``attempts`` counts the takes, this one included. Identified by
    ``(name, token)``."""

    name: str
    holder: str
    token: int
    acquired_at: float
    expires_at: float
    limit: int
    callback: str
    attempts: int

    def __repr__(self) -> str:  # never the task token
        return (
            f"CallbackDelivery(name={self.name!r}, holder={self.holder!r}, token={self.token},"
            f" attempts={self.attempts})"
        )


@dataclass(frozen=True, slots=True)
class Status:
    """A snapshot of one name: who holds it and who waits, in order. ``limit`` (and
    ``per_key``) are the name's while it has an unexpired holder or waiter; ``None`` when it
    is idle, including when its only leases or entries have expired and nothing has purged
    them yet (every store answers the same)."""

    name: str
    limit: int | None
    holders: tuple[HolderInfo, ...] = field(default_factory=tuple)
    waiters: tuple[WaiterInfo, ...] = field(default_factory=tuple)
    now: float = 0.0
    # A semaphore group (``limit`` is its total): at most this many holders per key.
    per_key: int | None = None

    @property
    def free(self) -> int | None:
        return None if self.limit is None else max(0, self.limit - len(self.holders))

    def to_dict(self) -> dict[str, object]:
        return {
            "name": self.name,
            "limit": self.limit,
            **({"per_key": self.per_key} if self.per_key is not None else {}),
            "now": self.now,
            "holders": [
                {
                    "holder": h.holder,
                    "token": h.token,
                    "acquired_at": h.acquired_at,
                    "expires_at": h.expires_at,
                    "age": round(self.now - h.acquired_at, 6),
                    "expires_in": round(h.expires_at - self.now, 6),
                    **({"callback": h.callback, "delivery": h.delivery} if h.callback else {}),
                    **({"key": h.key} if h.key is not None else {}),
                }
                for h in self.holders
            ],
            "waiters": [
                {
                    "holder": w.holder,
                    "position": w.position,
                    "joined_at": w.joined_at,
                    "expires_at": w.expires_at,
                    "waiting": round(self.now - w.joined_at, 6),
                    **({"callback": w.callback} if w.callback else {}),
                    **({"key": w.key} if w.key is not None else {}),
                }
                for w in self.waiters
            ],
        }


@dataclass(frozen=True, slots=True)
class RateResult:
    """What one rate-limit step answered (``rate_machine.acquire``): ``admitted``, or the
    caller's ``position`` in line (``None``: it did not join) and ``retry_after``, the seconds
    until its slot on the store's clock (when to ask again). ``tat`` is the name's
    theoretical arrival time after the step."""

    admitted: bool
    position: int | None
    now: float
    retry_after: float
    tat: float = 0.0


@dataclass(frozen=True, slots=True)
class RateWaiterInfo:
    holder: str
    position: int
    joined_at: float
    slot: float  # when it is due, on the store's clock


@dataclass(frozen=True, slots=True)
class RateStatus:
    """A snapshot of one rate limit: its rate (``None`` while idle), the line with each
    waiter's slot, and the times of recent admissions (the last ``per`` seconds)."""

    name: str
    rate: int | None
    per: float | None
    burst: int | None
    waiters: tuple[RateWaiterInfo, ...] = ()
    admitted: tuple[float, ...] = ()
    next_slot: float = 0.0
    now: float = 0.0

    def to_dict(self) -> dict[str, object]:
        return {
            "name": self.name,
            "rate": self.rate,
            "per": self.per,
            "burst": self.burst,
            "now": self.now,
            "next_slot": self.next_slot,
            "admitted": list(self.admitted),
            "waiters": [
                {
                    "holder": w.holder,
                    "position": w.position,
                    "joined_at": w.joined_at,
                    "slot": w.slot,
                    "due_in": round(max(0.0, w.slot - self.now), 6),
                }
                for w in self.waiters
            ],
        }


@dataclass(frozen=True, slots=True)
class Characteristics:
    """What a backend can do, so callers and tests can tell before they try."""

    scheme: str
    cross_process: bool
    cross_host: bool
    durable: bool
    woken_by_store: bool
    description: str
    # The fields below are what a primitive reads to choose its path; each backend module
    # declares them once (its ``CHARACTERISTICS``), and ``_async/backends/protocol.py`` says
    # which protocol method each one governs.
    #
    # open_waiter costs no round trip to the store (e.g. one shared LISTEN connection per
    # client): a blocking acquire arms its waiter before its first step instead of after it,
    # which saves the step that looks again after arming.
    cheap_waiters: bool = False
    # A lock waiter keeps a wake-up sent before it was opened (a Redis list), so the acquire
    # step that preceded ``open_waiter`` needs no repeating once the waiter is armed.
    keeps_early_wakeups: bool = False
    # ``backend.queues()`` returns the store's queue operations (else NotSupported).
    queues: bool = False
    # A blocking queue get is one long poll that the store side answers
    # (``queue_backend.long_poll``, the HTTP service), not a local waiter.
    long_poll_gets: bool = False
    # Callback grants are delivered from this side: ``take_deliveries`` and
    # ``settle_delivery`` work here (every store). False where the far side delivers them
    # itself (the HTTP service runs its own deliverer); those two then raise NotSupported.
    local_deliveries: bool = False


# -- queues -------------------------------------------------------------------------------
# How a message body is stored: JSON text (UTF-8) or raw bytes.
KIND_JSON = 0
KIND_BYTES = 1


@dataclass(frozen=True, slots=True)
class NewMessage:
    """What a ``put`` sends to the store. ``id`` is chosen by the client."""

    id: str
    key: str | None
    body: bytes
    kind: int  # KIND_JSON or KIND_BYTES
    delay: float
    dedup_id: str | None
    max_attempts: int


@dataclass(frozen=True, slots=True)
class PutResult:
    """``id`` of the stored message; ``created`` is False when ``dedup_id`` matched a message
    put within the dedup window (the earlier message's id is returned, nothing is stored)."""

    id: str
    created: bool
    now: float


@dataclass(frozen=True, slots=True)
class Delivery:
    """A message as the store handed it out: in flight until ``deadline`` unless acked,
    nacked or extended with ``receipt``."""

    id: str
    key: str | None
    body: bytes
    kind: int
    attempt: int  # 1 on first delivery
    enqueued_at: float
    receipt: str
    deadline: float


@dataclass(frozen=True, slots=True)
class ClaimResult:
    """What one atomic claim step answered. Without a message, ``retry_after`` is how long
    until something may become deliverable without anyone saying so (a delayed message comes
    due, an in-flight message's visibility timeout passes); ``None`` if nothing is scheduled."""

    delivery: Delivery | None
    now: float
    retry_after: float | None = None


@dataclass(frozen=True, slots=True)
class BatchClaim:
    """What one batch claim step answered (``ack_claim_many``): the messages it claimed, in
    claim order (each heads its key; none if nothing was deliverable), the store's ``now``,
    and without a message ``retry_after`` as in :class:`ClaimResult`."""

    deliveries: list[Delivery]
    now: float
    retry_after: float | None = None


@dataclass(frozen=True, slots=True)
class KeyDepth:
    key: str
    pending: int  # messages of this key not yet acked (ready, delayed or in flight)


@dataclass(frozen=True, slots=True)
class QueueStats:
    """A snapshot of one queue.

    ``ready``: due now (some may wait behind an earlier message of their key);
    ``delayed``: not yet due (put with ``delay`` or nacked with one); ``in_flight``: handed
    out and neither acked nor timed out; ``dead``: dead letters; ``oldest_age``: seconds since
    the oldest pending (ready, delayed or in flight) message was put, ``None`` if none;
    ``deepest_keys``: the keys with the most pending messages, deepest first."""

    name: str
    ready: int
    delayed: int
    in_flight: int
    dead: int
    oldest_age: float | None
    deepest_keys: tuple[KeyDepth, ...] = field(default_factory=tuple)
    now: float = 0.0

    @property
    def pending(self) -> int:
        return self.ready + self.delayed + self.in_flight

    def to_dict(self) -> dict[str, object]:
        return {
            "name": self.name,
            "ready": self.ready,
            "delayed": self.delayed,
            "in_flight": self.in_flight,
            "dead": self.dead,
            "oldest_age": None if self.oldest_age is None else round(self.oldest_age, 6),
            "deepest_keys": [{"key": k.key, "pending": k.pending} for k in self.deepest_keys],
            "now": self.now,
        }


@dataclass(frozen=True, slots=True)
class DeadLetterRow:
    """A dead letter as stored (payload still encoded)."""

    id: str
    key: str | None
    body: bytes
    kind: int
    attempts: int
    enqueued_at: float
    died_at: float
    error: str | None


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """A message that used up its ``max_attempts``. ``error`` is the last failure recorded
    (the handler's exception, or that its visibility timeout passed)."""

    id: str
    key: str | None
    payload: Any
    attempts: int
    enqueued_at: float
    died_at: float
    error: str | None

    def to_dict(self) -> dict[str, object]:
        payload = self.payload
        if isinstance(payload, bytes):
            payload = {"bytes": payload.hex()}
        return {
            "id": self.id,
            "key": self.key,
            "payload": payload,
            "attempts": self.attempts,
            "enqueued_at": self.enqueued_at,
            "died_at": self.died_at,
            "error": self.error,
        }


@dataclass(slots=True)
class WorkResult:
    """What :meth:`Queue.work` did: messages handled successfully and acked, handlers that
    raised (the message was nacked with a backoff, or dead-lettered after ``max_attempts``),
    and settlements the store refused because the message's visibility timeout had passed
    (it will be delivered again)."""

    acked: int = 0
    failed: int = 0
    lost: int = 0
    stopped_by: str | None = None  # "signal", "stop()", "idle_timeout", "max_messages"

    @property
    def handled(self) -> int:
        return self.acked + self.failed + self.lost
