"""What a stateless instance can honestly know about events: what it did, and what it saw.

The store keeps current state only (holders, waiters, queue depths), not a history, and the
service keeps nothing that matters for correctness. So the recent events an instance shows
come from two sources, and each event says which:

* ``"via": "this instance"`` — grants, releases, lost leases (a renewal refused), acquire
  timeouts, forced releases and queue operations that went through this instance;
* ``"via": "observed"`` — changes this instance *saw* between two looks at a name (the
  dashboard's refresh and the background observer, every ``observe_interval`` seconds):
  a lease that vanished after its expiry time is an ``expired`` event, one that vanished
  before it was ``released`` elsewhere, a new holder not granted here was ``granted``
  elsewhere.

Limits: a lease granted and gone between two looks is never seen; with several instances,
each shows only its own operations plus what it observed; events live in memory, at most
``EventLog.capacity`` per instance, and are lost on restart.
"""

from __future__ import annotations

import itertools
import json
import logging
import time
from collections import OrderedDict, deque
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from .._core.records import Grant, Status
from .auth import Principal
from .metrics import Metrics

# -- `turnstile serve --log-format json` ----------------------------------------------------

# Attributes every LogRecord has; anything else a logger was given (``extra=``) is kept.
_RECORD_FIELDS = frozenset(vars(logging.LogRecord("", 0, "", 0, "", (), None))) | {
    "message",
    "asctime",
    "color_message",  # uvicorn's coloured copy of the message
}


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ``time`` (ISO 8601, UTC), ``level``, ``logger``,
    ``message``, the fields given with ``extra=``, ``exc_info`` as text, and for uvicorn's
    access log ``client``, ``method``, ``path``, ``http_version`` and ``status``."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
        }
        args = record.args
        if record.name == "uvicorn.access" and isinstance(args, tuple) and len(args) == 5:
            client, method, path, http_version, status = args
            entry.update(
                message=f"{method} {path} {status}",
                client=client,
                method=method,
                path=path,
                http_version=http_version,
                status=status,
            )
        else:
            entry["message"] = record.getMessage()
        for key, value in vars(record).items():
            if key not in _RECORD_FIELDS and key not in entry:
                entry[key] = value
        if record.exc_info:
            entry["exc_info"] = self.formatException(record.exc_info)
        return json.dumps(entry, ensure_ascii=False, default=str)


def json_log_config(level: str) -> dict[str, Any]:
    """uvicorn's logging configuration with :class:`JsonFormatter` for its error and access
    logs (``uvicorn.Config(log_config=…)``)."""
    handler = {
        "formatter": "json",
        "class": "logging.StreamHandler",
        "stream": "ext://sys.stderr",
    }
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {"json": {"()": f"{__name__}.JsonFormatter"}},
        "handlers": {"default": handler, "access": dict(handler)},
        "loggers": {
            "uvicorn": {"handlers": ["default"], "level": level.upper(), "propagate": False},
            "uvicorn.error": {"level": level.upper()},
            "uvicorn.access": {"handlers": ["access"], "level": "INFO", "propagate": False},
        },
    }


K = TypeVar("K")
V = TypeVar("V")


class Bounded(Generic[K, V]):
    """A dict that forgets its oldest entries beyond ``capacity``."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._data: OrderedDict[K, V] = OrderedDict()

    def __contains__(self, key: object) -> bool:
        return key in self._data

    def __len__(self) -> int:
        return len(self._data)

    def get(self, key: K) -> V | None:
        return self._data.get(key)

    def put(self, key: K, value: V) -> None:
        self._data[key] = value
        self._data.move_to_end(key)
        while len(self._data) > self.capacity:
            self._data.popitem(last=False)

    def pop(self, key: K) -> V | None:
        return self._data.pop(key, None)

    def ordered(self) -> list[K]:
        return list(self._data)


@dataclass(frozen=True, slots=True)
class Event:
    seq: int
    at: float  # seconds since the epoch: the store's clock when known, else this host's
    kind: str  # granted, released, expired, lost, timeout, force_released, queue_*
    name: str
    holder: str | None
    token: int | None
    via: str  # "this instance" or "observed"
    detail: str = ""

    def to_dict(self) -> dict[str, object]:
        return {
            "seq": self.seq,
            "at": self.at,
            "kind": self.kind,
            "name": self.name,
            "holder": self.holder,
            "token": self.token,
            "via": self.via,
            "detail": self.detail,
        }


class EventLog:
    def __init__(self, capacity: int = 1000) -> None:
        self.capacity = capacity
        self._events: deque[Event] = deque(maxlen=capacity)
        self._seq = itertools.count(1)

    def add(
        self,
        kind: str,
        name: str,
        *,
        holder: str | None = None,
        token: int | None = None,
        via: str = "this instance",
        at: float | None = None,
        detail: str = "",
    ) -> Event:
        event = Event(
            next(self._seq), time.time() if at is None else at, kind, name, holder, token, via,
            detail,
        )
        self._events.append(event)
        return event

    def since(self, seq: int, principal: Principal, max_count: int = 200) -> list[Event]:
        """Events after ``seq`` on names the principal may read, oldest first."""
        found = [e for e in self._events if e.seq > seq and principal.can_read(e.name)]
        return found[-max_count:]

    @property
    def last_seq(self) -> int:
        return self._events[-1].seq if self._events else 0


QUEUE_COUNTERS = {
    "put": "queue_puts",
    "delivered": "queue_deliveries",
    "acked": "queue_acks",
    "nacked": "queue_nacks",
}


@dataclass(frozen=True, slots=True)
class _Seen:
    now: float
    holders: dict[tuple[str, int], float]  # (holder, token) -> expires_at


class Tracker:
    """Turns operations and observations into events and metrics."""

    def __init__(self, events: EventLog, metrics: Metrics, capacity: int = 10_000) -> None:
        self.events = events
        self.metrics = metrics
        self._seen: Bounded[str, _Seen] = Bounded(capacity)
        self._released: Bounded[tuple[str, str, int], None] = Bounded(capacity)
        self._granted: Bounded[tuple[str, int], None] = Bounded(capacity)
        self._asking: Bounded[tuple[str, str], float] = Bounded(capacity)

    # -- operations through this instance -------------------------------------------------
    def asked(self, name: str, holder: str) -> None:
        """A step left ``holder`` waiting: remember when it first asked (for wait times)."""
        key = (name, holder)
        if key not in self._asking:
            self._asking.put(key, time.monotonic())

    def granted(self, grant: Grant, claimed_at: float, waited: float | None = None) -> None:
        """A grant answered through this instance (``claimed_at``: store time of the answer).
        Each lease is counted once, however often an idempotent step returns it."""
        key = (grant.name, grant.token)
        first_asked = self._asking.pop((grant.name, grant.holder))
        if key in self._granted:
            return
        self._granted.put(key, None)
        self.metrics.inc("grants")
        if waited is None:
            waited = 0.0 if first_asked is None else time.monotonic() - first_asked
        self.metrics.wait.observe(waited)
        handed_over = claimed_at - grant.acquired_at
        if handed_over > 1e-6:
            self.metrics.handover.observe(handed_over)
        self.events.add(
            "granted", grant.name, holder=grant.holder, token=grant.token, at=claimed_at,
            detail=f"waited {waited:.3f} s" if waited >= 0.01 else "",
        )

    def released(
        self, name: str, holder: str, token: int | None, released: bool, kind: str = "released"
    ) -> None:
        self._asking.pop((name, holder))
        if not released:
            return
        self.metrics.inc("releases")
        seen = self._seen.get(name)
        if seen is not None:
            for held, tok in seen.holders:
                if held == holder and (token is None or tok == token):
                    self._released.put((name, holder, tok), None)
        if token is not None:
            self._released.put((name, holder, token), None)
        self.events.add(kind, name, holder=holder, token=token)

    def lost(self, name: str, holder: str, token: int) -> None:
        self.metrics.inc("lost_leases")
        self._released.put((name, holder, token), None)
        self.events.add("lost", name, holder=holder, token=token, detail="renewal refused")

    def timed_out(self, name: str, holder: str, wait: float) -> None:
        self._asking.pop((name, holder))
        self.metrics.inc("acquire_timeouts")
        self.events.add("timeout", name, holder=holder, detail=f"not granted within {wait:g} s")

    def queue_event(
        self,
        kind: str,
        queue: str,
        message_id: str | None,
        key: str | None,
        attempt: int | None = None,
        detail: str = "",
    ) -> None:
        counter = QUEUE_COUNTERS.get(kind)
        if counter is not None:
            self.metrics.inc(counter)
        parts = [detail] if detail else []
        if message_id is not None:
            parts.append(f"message {message_id}")
        if key is not None:
            parts.append(f"key {key}")
        if attempt is not None:
            parts.append(f"attempt {attempt}")
        self.events.add(f"queue_{kind}", queue, detail=" · ".join(parts))

    # -- observations ---------------------------------------------------------------------
    def observe(self, status: Status) -> None:
        """Compare a fresh status with the last look at the same name."""
        current = {(h.holder, h.token): h.expires_at for h in status.holders}
        previous = self._seen.get(status.name)
        if current:
            self._seen.put(status.name, _Seen(status.now, current))
        else:
            self._seen.pop(status.name)
        if previous is None:
            return
        for (holder, token), expires_at in previous.holders.items():
            if (holder, token) in current:
                continue
            if (status.name, holder, token) in self._released:
                continue
            if expires_at <= status.now:
                self.metrics.inc("expiries_observed")
                self.events.add(
                    "expired", status.name, holder=holder, token=token, via="observed",
                    at=expires_at, detail="lease ran out without a release",
                )
            else:
                self.events.add(
                    "released", status.name, holder=holder, token=token, via="observed",
                    at=status.now, detail="released elsewhere",
                )
        for holder, token in current:
            if (holder, token) in previous.holders or (status.name, token) in self._granted:
                continue
            acquired = next(h.acquired_at for h in status.holders if h.token == token)
            self.events.add(
                "granted", status.name, holder=holder, token=token, via="observed",
                at=acquired, detail="granted elsewhere",
            )

    def known_names(self, principal: Principal) -> Iterable[str]:
        """Names seen holding leases last time, which a new look must revisit even if the
        listing no longer shows them (to notice their expiry)."""
        return [n for n in self._seen.ordered() if principal.can_read(n)]
