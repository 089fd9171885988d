"""Optional OpenTelemetry spans and metrics (``pip install 'turnstile-locks[otel]'``).

The client code of both flavours calls the functions below at a handful of points: an
acquire (how long it waited, its position when it joined the line, its outcome), a hand-over
(a waiter granted after joining the line), a lost lease, and a queue's put, delivery and
settlement. They report through the OpenTelemetry API, so whatever SDK and exporters the
application configured receive them; with the API installed but no SDK configured they go to
its no-op implementation.

Without ``opentelemetry-api`` installed the import below fails once, :data:`ENABLED` is
False and every function returns at its first line (the acquire tracker is one shared
object whose methods do nothing): no allocation, no clock read. With the API installed but
no provider set (and :func:`configure` not called), an acquire is not tracked either: its
span and data points would go to the API's no-op implementation anyway.

Every span and data point carries the lock's or queue's name as ``turnstile.name``. Names
are data chosen by the application: if it uses unbounded names (one per order, say) the
metrics have one series per name; aggregate them in the SDK's views if that is too many.
"""

from __future__ import annotations

import math
import os
import time
from typing import Any

# What the API answers while the application has set no tracer or meter provider (proxies,
# forwarding to one set later): an acquire made while both are such proxies, and configure()
# was not called, has nobody listening and is not tracked at all (see acquire()). None: track
# every acquire (an API that does not have them where we look).
_PROXIES: Any = None
# The API's modules holding the global providers (see _listened), where they are found.
_GLOBALS: Any = None

try:
    from opentelemetry import metrics as _metrics
    from opentelemetry import trace as _trace
except ImportError:  # the optional extra is not installed: every call below is a no-op
    ENABLED = False
else:
    ENABLED = True
    try:
        from opentelemetry.metrics import _internal as _metrics_internal
        from opentelemetry.metrics._internal import _ProxyMeterProvider

        _PROXIES = (_trace.ProxyTracerProvider, _ProxyMeterProvider)
    except ImportError:
        pass
    else:
        if hasattr(_trace, "_TRACER_PROVIDER") and hasattr(
            _metrics_internal, "_METER_PROVIDER"
        ):
            # Where the API keeps the global providers it was given (None until then):
            # reading them costs nothing, where asking for them reads the environment.
            _GLOBALS = (_trace, _metrics_internal)

SCOPE = "turnstile"

# Span and instrument names (documented in docs/observability.md).
SPAN_ACQUIRE = "turnstile.acquire"
SPAN_LEASE_LOST = "turnstile.lease.lost"
SPAN_QUEUE_PUT = "turnstile.queue.put"
SPAN_QUEUE_DELIVER = "turnstile.queue.deliver"
SPAN_QUEUE_SETTLE = "turnstile.queue.settle"
SPAN_QUEUE_PROCESS = "turnstile.queue.process"
EVENT_HANDOVER = "turnstile.handover"

METRIC_ACQUIRE_WAIT = "turnstile.acquire.wait"
METRIC_ACQUIRE_POSITION = "turnstile.acquire.position"
METRIC_HANDOVERS = "turnstile.handovers"
METRIC_LEASES_LOST = "turnstile.leases.lost"
METRIC_QUEUE_PUT = "turnstile.queue.put"
METRIC_QUEUE_DELIVERED = "turnstile.queue.delivered"
METRIC_QUEUE_SETTLED = "turnstile.queue.settled"

ATTR_NAME = "turnstile.name"


class _Instruments:
    """The tracer and instruments, made on first use from the global providers (the API's
    proxies forward to whatever provider the application sets later), or from the ones
    given to :func:`configure`."""

    def __init__(self, tracer_provider: Any = None, meter_provider: Any = None) -> None:
        from .. import __version__

        if tracer_provider is None:
            self.tracer = _trace.get_tracer(SCOPE, __version__)
        else:
            self.tracer = tracer_provider.get_tracer(SCOPE, __version__)
        if meter_provider is None:
            meter = _metrics.get_meter(SCOPE, __version__)
        else:
            meter = meter_provider.get_meter(SCOPE, __version__)
        self.acquire_wait = meter.create_histogram(
            METRIC_ACQUIRE_WAIT,
            unit="s",
            description="Time from asking for a lease to the outcome, by outcome",
        )
        self.acquire_position = meter.create_histogram(
            METRIC_ACQUIRE_POSITION,
            unit="{position}",
            description="Place in line (0 = next) when an acquire joined the line",
        )
        self.handovers = meter.create_counter(
            METRIC_HANDOVERS,
            unit="{lease}",
            description="Leases granted to a waiter after it joined the line",
        )
        self.leases_lost = meter.create_counter(
            METRIC_LEASES_LOST,
            unit="{lease}",
            description="Leases lost while held (expired or taken over before a renewal)",
        )
        self.queue_put = meter.create_counter(
            METRIC_QUEUE_PUT, unit="{message}", description="Messages put (created or deduplicated)"
        )
        self.queue_delivered = meter.create_counter(
            METRIC_QUEUE_DELIVERED, unit="{message}", description="Deliveries of messages"
        )
        self.queue_settled = meter.create_counter(
            METRIC_QUEUE_SETTLED,
            unit="{message}",
            description="Settlements (ack, nack), and whether the store accepted them",
        )


_instruments: _Instruments | None = None
# Whether configure() was given providers (then every acquire reports to them).
_given = False


def configure(tracer_provider: Any = None, meter_provider: Any = None) -> None:
    """Report to these providers instead of the global ones (both ``None``: the global ones
    again). For applications that keep their providers out of the global API, and for tests,
    which must not leave an SDK installed for the rest of the process."""
    global _instruments, _given
    if not ENABLED:
        return
    if tracer_provider is None and meter_provider is None:
        _instruments = None
        _given = False
    else:
        _instruments = _Instruments(tracer_provider, meter_provider)
        _given = True


def _get() -> _Instruments:
    global _instruments
    if _instruments is None:
        _instruments = _Instruments()
    return _instruments


class AcquireTracker:
    """One blocking acquire: a span from the first step to the outcome, and its metrics."""

    __slots__ = ("_done", "_name", "_position", "_span", "_started")

    def __init__(self, name: str, limit: int) -> None:
        self._name = name
        self._started = time.monotonic()
        self._position: int | None = None
        self._done = False
        self._span: Any = _get().tracer.start_span(
            SPAN_ACQUIRE, attributes={ATTR_NAME: name, "turnstile.limit": limit}
        )

    def joined(self, position: int | None) -> None:
        """The store confirmed a place in line."""
        if self._position is not None or position is None:
            return
        self._position = position
        self._span.set_attribute("turnstile.position", position)
        _get().acquire_position.record(position, {ATTR_NAME: self._name})

    def granted(self, token: int, *, woken_with_grant: bool = False) -> None:
        handed = self._position is not None
        if handed:
            self._span.add_event(
                EVENT_HANDOVER,
                {"turnstile.token": token, "turnstile.woken_with_grant": woken_with_grant},
            )
            _get().handovers.add(1, {ATTR_NAME: self._name})
        self._span.set_attribute("turnstile.token", token)
        self._end("granted")

    def failed(self, exc: BaseException) -> None:
        if isinstance(exc, Exception):
            self._span.record_exception(exc)
            outcome = "error"
        else:
            outcome = "cancelled"  # CancelledError, KeyboardInterrupt, …
        self._end(outcome)

    def timed_out(self) -> None:
        self._end("timeout")

    def _end(self, outcome: str) -> None:
        if self._done:
            return
        self._done = True
        waited = time.monotonic() - self._started
        span = self._span
        span.set_attribute("turnstile.outcome", outcome)
        span.set_attribute("turnstile.wait_seconds", waited)
        if outcome == "error":
            span.set_status(_trace.Status(_trace.StatusCode.ERROR))
        span.end()
        _get().acquire_wait.record(
            waited,
            {
                ATTR_NAME: self._name,
                "turnstile.outcome": outcome,
                "turnstile.queued": self._position is not None,
            },
        )


class _NoTracker:
    """What :func:`acquire` returns without OpenTelemetry: nothing happens."""

    __slots__ = ()

    def joined(self, position: int | None) -> None:
        return None

    def granted(self, token: int, *, woken_with_grant: bool = False) -> None:
        return None

    def failed(self, exc: BaseException) -> None:
        return None

    def timed_out(self) -> None:
        return None


_NO_TRACKER = _NoTracker()


def _listened() -> bool:
    """Whether anything receives what an acquire or a queue operation reports: providers
    given to :func:`configure`, or a global tracer or meter provider the application set (in
    code or by the API's environment variables). With neither, the spans and data points
    would go to the API's no-op implementation: the operation then skips them, and costs
    what it costs without OpenTelemetry installed.

    Asked at every acquire, so it answers the common case without asking the API: no global
    provider set yet (read from where the API keeps them) and neither of the API's variables
    naming one in the environment (read at most once a second)."""
    if _given or _PROXIES is None:
        return True
    found = _GLOBALS
    if (
        found is not None
        and found[0]._TRACER_PROVIDER is None
        and found[1]._METER_PROVIDER is None
        and not _named_in_environment()
    ):
        return False
    return not isinstance(_trace.get_tracer_provider(), _PROXIES[0]) or not isinstance(
        _metrics.get_meter_provider(), _PROXIES[1]
    )


# The API's variables that name a provider to load (read by its get_*_provider()).
_PROVIDER_VARIABLES = ("OTEL_PYTHON_TRACER_PROVIDER", "OTEL_PYTHON_METER_PROVIDER")
_environment: tuple[float, bool] = (-math.inf, False)  # (read at, whether one is set)


def _named_in_environment() -> bool:
    global _environment
    now = time.monotonic()
    read_at, named = _environment
    if now - read_at >= 1.0:
        named = any(v in os.environ for v in _PROVIDER_VARIABLES)
        _environment = (now, named)
    return named


def acquire(name: str, limit: int) -> AcquireTracker | _NoTracker:
    """Start tracking one blocking acquire of ``name``."""
    if not ENABLED or not _listened():
        return _NO_TRACKER
    return AcquireTracker(name, limit)


def lease_lost(name: str, token: int, why: str) -> None:
    if not ENABLED:
        return
    inst = _get()
    inst.leases_lost.add(1, {ATTR_NAME: name})
    span = inst.tracer.start_span(
        SPAN_LEASE_LOST,
        attributes={ATTR_NAME: name, "turnstile.token": token, "turnstile.reason": why},
    )
    span.set_status(_trace.Status(_trace.StatusCode.ERROR, why))
    span.end()


def queue_put(name: str, message_id: str, created: bool) -> None:
    if not ENABLED or not _listened():
        return
    inst = _get()
    inst.queue_put.add(1, {ATTR_NAME: name, "turnstile.created": created})
    inst.tracer.start_span(
        SPAN_QUEUE_PUT,
        attributes={
            ATTR_NAME: name,
            "turnstile.message_id": message_id,
            "turnstile.created": created,
        },
    ).end()


def queue_delivered(name: str, message_id: str, attempt: int) -> None:
    if not ENABLED or not _listened():
        return
    inst = _get()
    inst.queue_delivered.add(1, {ATTR_NAME: name, "turnstile.redelivery": attempt > 1})
    inst.tracer.start_span(
        SPAN_QUEUE_DELIVER,
        attributes={
            ATTR_NAME: name,
            "turnstile.message_id": message_id,
            "turnstile.attempt": attempt,
        },
    ).end()


def queue_settled(name: str, message_id: str, settlement: str, accepted: bool) -> None:
    """``settlement``: "ack" or "nack"; ``accepted``: False when the receipt was stale."""
    if not ENABLED or not _listened():
        return
    inst = _get()
    inst.queue_settled.add(
        1, {ATTR_NAME: name, "turnstile.settlement": settlement, "turnstile.accepted": accepted}
    )
    inst.tracer.start_span(
        SPAN_QUEUE_SETTLE,
        attributes={
            ATTR_NAME: name,
            "turnstile.message_id": message_id,
            "turnstile.settlement": settlement,
            "turnstile.accepted": accepted,
        },
    ).end()


class _NoSpan:
    __slots__ = ()

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


_NO_SPAN = _NoSpan()


def processing(name: str, message_id: str, attempt: int) -> Any:
    """A context manager around ``Queue.work``'s handler call: the span is current while the
    handler runs, so the handler's own spans are its children."""
    if not ENABLED or not _listened():
        return _NO_SPAN
    return _get().tracer.start_as_current_span(
        SPAN_QUEUE_PROCESS,
        attributes={
            ATTR_NAME: name,
            "turnstile.message_id": message_id,
            "turnstile.attempt": attempt,
        },
    )
