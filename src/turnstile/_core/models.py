"""Plain, frozen records exchanged between primitives and backends.

All times are seconds since the Unix epoch *on the store's clock* (Redis ``TIME``,
PostgreSQL ``now()``, the SQLite host's clock). Compare them with ``Status.now``, never with
the local clock of a client on another host.
"""

from __future__ import annotations

from dataclasses import dataclass, field


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


@dataclass(frozen=True, slots=True)
class WaiterInfo:
    holder: str
    position: int
    joined_at: float
    expires_at: float


@dataclass(frozen=True, slots=True)
class Status:
    """A snapshot of one name: who holds it and who waits, in order."""

    name: str
    limit: int | None
    holders: tuple[HolderInfo, ...] = field(default_factory=tuple)
    waiters: tuple[WaiterInfo, ...] = field(default_factory=tuple)
    now: float = 0.0

    @property
    def free(self) -> int | None:
        return None if self.limit is None else max(0, self.limit - len(self.holders))

    def to_dict(self) -> dict[str, object]:
        return {
            "name": self.name,
            "limit": self.limit,
            "now": self.now,
            "holders": [
                {
                    "holder": h.holder,
                    "token": h.token,
                    "acquired_at": h.acquired_at,
                    "expires_at": h.expires_at,
                    "age": round(self.now - h.acquired_at, 6),
                    "expires_in": round(h.expires_at - self.now, 6),
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
    # open_waiter costs no round trip to the store (e.g. one shared LISTEN connection per
    # client): a blocking acquire arms its waiter before its first step instead of after it,
    # which saves the step that looks again after arming.
    cheap_waiters: bool = False
