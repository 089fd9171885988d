"""Decoding the Lua scripts' replies into Turnstile's records (no I/O; both flavours). Times
arrive as integer microseconds of the server's clock."""

from __future__ import annotations

from typing import Any

from ..._core import lock_machine
from ..._core.records import (
    AcquireResult,
    ClaimResult,
    DeadLetterRow,
    Delivery,
    Grant,
    HolderInfo,
    KeyDepth,
    PutResult,
    QueueStats,
    Status,
    WaiterInfo,
)


def _text(value: Any) -> str:
    return value.decode("utf-8") if isinstance(value, bytes) else str(value)


def _seconds(us: Any) -> float:
    return int(us) / 1_000_000


def acquire_result(name: str, holder: str, limit: int, reply: list[Any]) -> AcquireResult:
    """The answer of acquire.lua to a step that asked with ``limit``; raises
    ``lock_machine.limit_conflict`` when the script refused it (``granted`` 2)."""
    granted, token, acquired, expires, now, position, retry = reply
    if int(granted) == 2:
        raise lock_machine.limit_conflict(name, int(position), limit)
    if int(granted) == 1:
        grant = Grant(name, holder, int(token), _seconds(acquired), _seconds(expires))
        return AcquireResult(grant, None, _seconds(now), None)
    return AcquireResult(
        None,
        None if int(position) < 0 else int(position),
        _seconds(now),
        None if int(retry) < 0 else _seconds(retry),
    )


def renew_result(name: str, holder: str, reply: list[Any]) -> Grant | None:
    if int(reply[0]) != 1:
        return None
    _, token, acquired, expires, _now = reply
    return Grant(name, holder, int(token), _seconds(acquired), _seconds(expires))


def status_result(name: str, reply: list[Any]) -> Status:
    now_us, limit, flat_holders, flat_waiters = reply
    holders = sorted(
        (
            HolderInfo(
                _text(flat_holders[i]),
                int(flat_holders[i + 1]),
                _seconds(flat_holders[i + 2]),
                _seconds(flat_holders[i + 3]),
            )
            for i in range(0, len(flat_holders), 4)
        ),
        key=lambda h: h.token,
    )
    waiters = tuple(
        WaiterInfo(
            _text(flat_waiters[i]),
            i // 3,
            _seconds(flat_waiters[i + 1]),
            _seconds(flat_waiters[i + 2]),
        )
        for i in range(0, len(flat_waiters), 3)
    )
    limit_text = _text(limit)
    return Status(
        name=name,
        limit=int(limit_text) if limit_text else None,
        holders=tuple(holders),
        waiters=waiters,
        now=_seconds(now_us),
    )


# -- queues
def _bytes(value: Any) -> bytes:
    return value if isinstance(value, bytes) else str(value).encode("utf-8")


def put_result(reply: list[Any]) -> PutResult:
    return PutResult(_text(reply[0]), int(reply[1]) == 1, _seconds(reply[2]))


def claim_result(reply: list[Any], receipt: str) -> ClaimResult:
    if int(reply[0]) == 0:
        retry = int(reply[2])
        return ClaimResult(None, _seconds(reply[1]), None if retry < 0 else _seconds(retry))
    _, mid, has_key, key, body, kind, attempt, enq, deadline, now = reply
    delivery = Delivery(
        _text(mid),
        _text(key) if int(has_key) else None,
        _bytes(body),
        int(kind),
        int(attempt),
        _seconds(enq),
        receipt,
        _seconds(deadline),
    )
    return ClaimResult(delivery, _seconds(now), None)


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
