"""Queues on Redis, the parts shared by both flavours (no I/O): key layout, scripts, replies.

See ``lua/queue/_lib.lua`` for the keys and ``_core/queue_machine.py`` for the
semantics. A queue's keys live under ``<prefix>{T}:q:`` where ``T`` is the hash tag of the
name (as for locks), so every key of one queue is in one Cluster slot.
"""

from __future__ import annotations

from importlib import resources
from typing import Any

from ..._core.records import ClaimResult, DeadLetterRow, Delivery, KeyDepth, PutResult, QueueStats
from .locks import glob_escape, key_base

OPERATIONS = (
    "put",
    "claim",
    "ack",
    "nack",
    "extend",
    "stats",
    "dead",
    "requeue",
    "purge",
    "unregister",
    "names",
)
KEY_SUFFIXES = (
    "meta",
    "rec",
    "body",
    "key",
    "rcpt",
    "err",
    "cand",
    "due",
    "fly",
    "dead",
    "enq",
    "depth",
    "dd",
    "ddx",
    "w",
    "wx",
)


def script_text(operation: str) -> str:
    folder = resources.files("turnstile.stores.redis").joinpath("lua/queue")
    lib = folder.joinpath("_lib.lua").read_text("utf-8")
    return lib + "\n" + folder.joinpath(f"{operation}.lua").read_text("utf-8")


def queue_base(prefix: str, name: str) -> str:
    return key_base(prefix, name) + "q:"


def queue_keys(base: str) -> list[str]:
    return [base + suffix for suffix in KEY_SUFFIXES]


def meta_pattern(prefix: str) -> str:
    """SCAN pattern matching the ``meta`` key of every queue under ``prefix``."""
    return glob_escape(prefix) + "{*}:q:meta"


def signal_key(base: str, waiter: str) -> str:
    return f"{base}s:{waiter}"


def micros(seconds: float) -> int:
    return max(0, round(seconds * 1_000_000))


def _text(value: Any) -> str:
    return value.decode("utf-8") if isinstance(value, bytes) else str(value)


def _bytes(value: Any) -> bytes:
    return value if isinstance(value, bytes) else str(value).encode("utf-8")


def _s(us: Any) -> float:
    return int(us) / 1_000_000


def put_result(reply: list[Any]) -> PutResult:
    return PutResult(_text(reply[0]), int(reply[1]) == 1, _s(reply[2]))


def claim_result(reply: list[Any], receipt: str) -> ClaimResult:
    if int(reply[0]) == 0:
        retry = int(reply[2])
        return ClaimResult(None, _s(reply[1]), None if retry < 0 else _s(retry))
    _, mid, has_key, key, body, kind, attempt, enq, deadline, now = reply
    delivery = Delivery(
        _text(mid),
        _text(key) if int(has_key) else None,
        _bytes(body),
        int(kind),
        int(attempt),
        _s(enq),
        receipt,
        _s(deadline),
    )
    return ClaimResult(delivery, _s(now), None)


def stats_result(name: str, reply: list[Any]) -> QueueStats:
    ready, delayed, flying, dead, oldest, now, flat = reply
    deepest = tuple(KeyDepth(_text(flat[i]), int(flat[i + 1])) for i in range(0, len(flat), 2))
    return QueueStats(
        name=name,
        ready=int(ready),
        delayed=int(delayed),
        in_flight=int(flying),
        dead=int(dead),
        oldest_age=None if int(oldest) < 0 else max(0.0, _s(now) - _s(oldest)),
        deepest_keys=deepest,
        now=_s(now),
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
                _s(enq),
                _s(died),
                _text(err) if int(has_err) else None,
            )
        )
    return rows
