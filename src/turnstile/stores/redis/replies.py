"""Decoding the Lua scripts' replies into Turnstile's records (no I/O; both flavours). Times
arrive as integer microseconds of the server's clock."""

from __future__ import annotations

from typing import Any

from ..._core import callbacks, lock_machine, rate_machine
from ..._core.records import (
    AcquireResult,
    BatchClaim,
    CallbackDelivery,
    ClaimResult,
    DeadLetterRow,
    Delivery,
    Grant,
    HolderInfo,
    KeyDepth,
    PutResult,
    QueueStats,
    RateResult,
    RateStatus,
    RateWaiterInfo,
    Status,
    WaiterInfo,
)


def text(value: Any) -> str:
    return value.decode("utf-8") if isinstance(value, bytes) else str(value)


_text = text


def _seconds(us: Any) -> float:
    return int(us) / 1_000_000


def notify_score(reply: Any) -> str | None:
    """The notification an acquire, release or set_limit reply carries (``NOTIFY`` in
    ``_lib.lua``): the score under which the name goes into the callback index, or None."""
    if not isinstance(reply, list):
        return None
    if len(reply) == 2:  # release, set_limit: {result, notify}
        return _text(reply[1])
    if len(reply) >= 10 and reply[8] not in (b"", ""):  # acquire
        return _text(reply[8])
    return None


def acquire_entry(reply: list[Any]) -> str | None:
    """The caller's waiting entry an acquire reply names (its member in line, which the
    caller gives back in its next steps when the entry is not indexed), or None."""
    entry = reply[9] if len(reply) >= 10 else b""
    return None if entry in (b"", "") else _text(entry)


def acquire_result(
    name: str, holder: str, limit: int, reply: list[Any], per_key: int | None = None
) -> AcquireResult:
    """The answer of acquire.lua to a step that asked with ``limit`` (and ``per_key``);
    raises ``lock_machine.limit_conflict`` (``group_conflict`` when the per_key differs)
    when the script refused it (``granted`` 2, with the name's limit and per_key, -1 for
    none, in place of position and retry)."""
    granted, token, acquired, expires, now, position, retry, wait_id = reply[:8]
    if int(granted) == 2:
        current = (int(position), None if int(retry) < 0 else int(retry))
        if current[1] != per_key:
            raise lock_machine.group_conflict(name, current, (limit, per_key))
        raise lock_machine.limit_conflict(name, current[0], limit)
    if int(granted) == 1:
        grant = Grant(name, holder, int(token), _seconds(acquired), _seconds(expires))
        return AcquireResult(grant, None, _seconds(now), None)
    return AcquireResult(
        None,
        None if int(position) < 0 else int(position),
        _seconds(now),
        None if int(retry) < 0 else _seconds(retry),
        int(wait_id) if wait_id not in (b"", "") else None,
    )


def handed_grant(name: str, holder: str, popped: Any) -> tuple[int, Grant] | None:
    """The grant a wake-up carried (``wake()`` in ``lua/lock/_lib.lua``:
    ``g <token> <acquired_us> <expires_us> <joined_us>``) and the waiting entry it was made
    for, or None for a bare wake-up (one pushed by a client of an earlier release)."""
    parts = _text(popped).split(" ")
    if len(parts) != 5 or parts[0] != "g":
        return None
    try:
        token, acquired, expires, joined = (int(p) for p in parts[1:])
    except ValueError:
        return None
    return joined, Grant(name, holder, token, _seconds(acquired), _seconds(expires))


def _micros(value: Any) -> float:
    """A time the rate scripts send as text, possibly fractional (``%.17g``), in seconds."""
    return float(_text(value)) / 1_000_000


def rate_result(name: str, asked: tuple[int, float, int], reply: list[Any]) -> RateResult:
    """The answer of rate/acquire.lua; raises ``rate_machine.rate_conflict`` when the script
    refused a busy name's other rate (code 2, with the name's own)."""
    code = int(reply[0])
    if code == 2:
        current = (int(reply[1]), float(_text(reply[2])), int(reply[3]))
        raise rate_machine.rate_conflict(name, current, asked)
    _, position, now, retry, tat = reply
    return RateResult(
        code == 1,
        None if int(position) < 0 else int(position),
        _seconds(now),
        _micros(retry),
        _micros(tat),
    )


def rate_status_result(name: str, reply: list[Any]) -> RateStatus:
    """rate/status.lua's answer: rate, per and burst are "" while the name is idle."""
    now, rate, per, burst, next_slot, flat, admitted = reply
    in_use = _text(rate) != ""
    return RateStatus(
        name=name,
        rate=int(rate) if in_use else None,
        per=float(_text(per)) if in_use else None,
        burst=int(burst) if in_use else None,
        waiters=tuple(
            RateWaiterInfo(_text(flat[i]), i // 3, _micros(flat[i + 1]), _micros(flat[i + 2]))
            for i in range(0, len(flat), 3)
        ),
        admitted=tuple(_micros(a) for a in admitted),
        next_slot=_micros(next_slot),
        now=_seconds(now),
    )


def renew_result(name: str, holder: str, reply: list[Any]) -> Grant | None:
    if int(reply[0]) != 1:
        return None
    _, token, acquired, expires, _now = reply
    return Grant(name, holder, int(token), _seconds(acquired), _seconds(expires))


def _kind(value: Any) -> str | None:
    return _text(value) or None


_DELIVERY = {"1": callbacks.PENDING, "0": callbacks.DELIVERED}


def _key(has_key: Any, key: Any) -> str | None:
    return _text(key) if int(has_key) else None


def status_result(name: str, reply: list[Any]) -> Status:
    """status.lua's answer: callbacks come as their kind only (the script never sends the
    stored text, which may hold a task token)."""
    now_us, limit, flat_holders, flat_waiters, per_key = reply
    holders = sorted(
        (
            HolderInfo(
                _text(flat_holders[i]),
                int(flat_holders[i + 1]),
                _seconds(flat_holders[i + 2]),
                _seconds(flat_holders[i + 3]),
                _kind(flat_holders[i + 4]),
                _DELIVERY.get(_text(flat_holders[i + 5])),
                _key(flat_holders[i + 6], flat_holders[i + 7]),
            )
            for i in range(0, len(flat_holders), 8)
        ),
        key=lambda h: h.token,
    )
    waiters = tuple(
        WaiterInfo(
            _text(flat_waiters[i]),
            i // 6,
            _seconds(flat_waiters[i + 1]),
            _seconds(flat_waiters[i + 2]),
            _kind(flat_waiters[i + 3]),
            _key(flat_waiters[i + 4], flat_waiters[i + 5]),
        )
        for i in range(0, len(flat_waiters), 6)
    )
    limit_text, per_key_text = _text(limit), _text(per_key)
    return Status(
        name=name,
        limit=int(limit_text) if limit_text else None,
        per_key=int(per_key_text) if per_key_text else None,
        holders=tuple(holders),
        waiters=waiters,
        now=_seconds(now_us),
    )


def take_result(reply: list[Any]) -> tuple[int, int, list[CallbackDelivery]]:
    """take.lua's answer: (now_us, next_us or -1, the deliveries claimed)."""
    now_us, next_us, name_raw, limit, flat = reply
    name = _text(name_raw)
    taken = [
        CallbackDelivery(
            name,
            _text(flat[i]),
            int(flat[i + 1]),
            _seconds(flat[i + 2]),
            _seconds(flat[i + 3]),
            int(limit),
            _text(flat[i + 4]),
            int(flat[i + 5]),
        )
        for i in range(0, len(flat), 6)
    ]
    return int(now_us), int(next_us), taken


# -- queues
def _bytes(value: Any) -> bytes:
    return value if isinstance(value, bytes) else str(value).encode("utf-8")


def put_result(reply: list[Any]) -> PutResult:
    return PutResult(_text(reply[0]), int(reply[1]) == 1, _seconds(reply[2]))


def _delivery(fields: list[Any], receipt: str) -> Delivery:
    """A claimed message as the queue scripts send it: id, has_key, key, body, kind,
    attempt, enqueued_us, deadline_us."""
    mid, has_key, key, body, kind, attempt, enq, deadline = fields
    return Delivery(
        _text(mid),
        _text(key) if int(has_key) else None,
        _bytes(body),
        int(kind),
        int(attempt),
        _seconds(enq),
        receipt,
        _seconds(deadline),
    )


def claim_result(reply: list[Any], receipt: str) -> ClaimResult:
    if int(reply[0]) == 0:
        retry = int(reply[2])
        return ClaimResult(None, _seconds(reply[1]), None if retry < 0 else _seconds(retry))
    return ClaimResult(_delivery(reply[1:9], receipt), _seconds(reply[9]), None)


def batch_result(reply: list[Any], receipts: list[str]) -> tuple[list[bool], BatchClaim]:
    """``ack_claim_many.lua``'s answer: the acks' outcomes and the claimed messages (the
    i-th claimed with ``receipts[i]``)."""
    acked, claimed, now, retry = reply
    deliveries = [_delivery(fields, receipts[i]) for i, fields in enumerate(claimed)]
    retry = int(retry)
    return [int(a) == 1 for a in acked], BatchClaim(
        deliveries, _seconds(now), None if deliveries or retry < 0 else _seconds(retry)
    )


def stats_result(name: str, reply: list[Any]) -> QueueStats:
    ready, delayed, flying, dead, oldest, now, flat = reply
    deepest = tuple(KeyDepth(_text(flat[i]), int(flat[i + 1])) for i in range(0, len(flat), 2))
    return QueueStats(
        name=name,
        ready=int(ready),
        delayed=int(delayed),
        in_flight=int(flying),
        dead=int(dead),
        oldest_age=None if int(oldest) < 0 else max(0.0, _seconds(now) - _seconds(oldest)),
        deepest_keys=deepest,
        now=_seconds(now),
    )


def dead_result(reply: list[Any]) -> list[DeadLetterRow]:
    flat = reply[1]
    rows = []
    for i in range(0, len(flat), 10):
        mid, has_key, key, body, kind, attempts, enq, died, has_err, err = flat[i : i + 10]
        rows.append(
            DeadLetterRow(
                _text(mid),
                _text(key) if int(has_key) else None,
                _bytes(body),
                int(kind),
                int(attempts),
                _seconds(enq),
                _seconds(died),
                _text(err) if int(has_err) else None,
            )
        )
    return rows
