"""Counters and histograms of one service instance, in the Prometheus text format (0.0.4).

Written by hand (no client library): a few counters, three histograms (wait, hand-over, and
request latency per route), ``turnstile_build_info`` and gauges computed at scrape time.
Everything here counts what *this instance* did or saw; with several instances behind a load
balancer, sum counters over instances (``sum without(instance)``), except
``turnstile_expiries_observed_total``, which every instance that watches a name counts.
"""

from __future__ import annotations

import bisect
import math
import platform
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from .. import __version__

# Seconds. Hand-overs are milliseconds; waits are anything up to minutes.
HANDOVER_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
WAIT_BUCKETS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 300.0, 1800.0)
# Request latency: most answers take milliseconds; long polls last up to --max-wait.
LATENCY_BUCKETS = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
)  # fmt: skip


@dataclass(slots=True)
class Histogram:
    buckets: tuple[float, ...]
    counts: list[int] = field(default_factory=list)
    total: float = 0.0
    count: int = 0

    def __post_init__(self) -> None:
        self.counts = [0] * (len(self.buckets) + 1)

    def observe(self, value: float) -> None:
        if math.isnan(value):
            return
        value = max(0.0, value)
        self.counts[bisect.bisect_left(self.buckets, value)] += 1
        self.total += value
        self.count += 1


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _labels(labels: Sequence[tuple[str, str]]) -> str:
    if not labels:
        return ""
    return "{" + ",".join(f'{k}="{_escape(v)}"' for k, v in labels) + "}"


def _number(value: float) -> str:
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if float(value).is_integer() and abs(value) < 2**53:
        return str(int(value))
    return repr(float(value))


class Metrics:
    """The counters of one instance. Not thread-safe: touched only from the event loop."""

    COUNTERS = {
        "grants": "Grants made through this instance (each lease counted once).",
        "releases": "Releases through this instance that released a lease or left a line.",
        "expiries_observed": "Leases this instance saw expire without a release.",
        "lost_leases": "Renewals through this instance refused because the lease was lost.",
        "acquire_timeouts": "Acquire requests whose wait ended without a grant.",
        "queue_puts": "Messages put through this instance.",
        "queue_deliveries": "Messages handed out through this instance.",
        "queue_acks": "Messages acknowledged through this instance.",
        "queue_nacks": "Messages returned through this instance.",
    }

    def __init__(self, build_info: Sequence[tuple[str, str]] | None = None) -> None:
        self.counters: dict[str, int] = dict.fromkeys(self.COUNTERS, 0)
        self.requests: dict[tuple[str, str, int], int] = {}
        # (method, route) -> latency; routes come from the endpoint table, so this is bounded.
        self.latency: dict[tuple[str, str], Histogram] = {}
        self.wait = Histogram(WAIT_BUCKETS)
        self.handover = Histogram(HANDOVER_BUCKETS)
        if build_info is None:
            build_info = (
                ("version", __version__),
                ("python", platform.python_version()),
                ("implementation", platform.python_implementation()),
            )
        self.build_info = tuple(build_info)

    def inc(self, counter: str, amount: int = 1) -> None:
        self.counters[counter] += amount

    def request(self, method: str, route: str, status: int, seconds: float | None = None) -> None:
        key = (method, route, status)
        self.requests[key] = self.requests.get(key, 0) + 1
        if seconds is not None:
            hist = self.latency.get((method, route))
            if hist is None:
                hist = self.latency[(method, route)] = Histogram(LATENCY_BUCKETS)
            hist.observe(seconds)

    def render(self, gauges: Iterable[Gauge] = ()) -> str:
        out: list[str] = []
        if self.build_info:
            out.append("# HELP turnstile_build_info Version of this instance (value is 1).")
            out.append("# TYPE turnstile_build_info gauge")
            out.append(f"turnstile_build_info{_labels(self.build_info)} 1")
        for counter, help_text in self.COUNTERS.items():
            metric = f"turnstile_{counter}_total"
            out.append(f"# HELP {metric} {help_text}")
            out.append(f"# TYPE {metric} counter")
            out.append(f"{metric} {self.counters[counter]}")
        out.append(
            "# HELP turnstile_http_requests_total HTTP requests served, by route and status."
        )
        out.append("# TYPE turnstile_http_requests_total counter")
        for (method, route, status), count in sorted(self.requests.items()):
            labels = _labels([("method", method), ("route", route), ("status", str(status))])
            out.append(f"turnstile_http_requests_total{labels} {count}")
        for metric, hist, help_text in (
            (
                "turnstile_wait_seconds",
                self.wait,
                "Time from first asking to the grant, for grants through this instance.",
            ),
            (
                "turnstile_handover_seconds",
                self.handover,
                "Store time from a hand-over (release or expiry that granted the slot) "
                "to the waiter claiming it, for claims through this instance.",
            ),
        ):
            out.append(f"# HELP {metric} {help_text}")
            out.append(f"# TYPE {metric} histogram")
            histogram_lines(out, metric, (), hist)
        metric = "turnstile_http_request_duration_seconds"
        out.append(
            f"# HELP {metric} Time to answer an HTTP request (long polls included), by route."
        )
        out.append(f"# TYPE {metric} histogram")
        for (method, route), hist in sorted(self.latency.items()):
            histogram_lines(out, metric, (("method", method), ("route", route)), hist)
        by_metric: dict[str, list[Gauge]] = {}
        for gauge in gauges:
            by_metric.setdefault(gauge.metric, []).append(gauge)
        for metric, rows in by_metric.items():
            out.append(f"# HELP {metric} {rows[0].help}")
            out.append(f"# TYPE {metric} gauge")
            for row in rows:
                out.append(f"{metric}{_labels(row.labels)} {_number(row.value)}")
        return "\n".join(out) + "\n"


def histogram_lines(
    out: list[str], metric: str, labels: tuple[tuple[str, str], ...], hist: Histogram
) -> None:
    cumulative = 0
    for bound, count in zip(hist.buckets, hist.counts, strict=False):
        cumulative += count
        out.append(f"{metric}_bucket{_labels([*labels, ('le', _number(bound))])} {cumulative}")
    out.append(f"{metric}_bucket{_labels([*labels, ('le', '+Inf')])} {hist.count}")
    out.append(f"{metric}_sum{_labels(labels)} {_number(hist.total)}")
    out.append(f"{metric}_count{_labels(labels)} {hist.count}")


@dataclass(frozen=True, slots=True)
class Gauge:
    metric: str
    help: str
    labels: tuple[tuple[str, str], ...]
    value: float
