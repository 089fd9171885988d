"""The SPEC's first problem, live: webhooks for several orders arrive in quick succession and
land on different worker processes; work for one order must run one at a time, in arrival
order, while different orders run in parallel.

* :mod:`~turnstile.demo.arrivals`: the arrivals (:func:`arrival_schedule`) and what is
  recorded about each webhook (:class:`EventRecord`); no I/O.
* :mod:`~turnstile.demo.workers`: running them with real worker processes against a store,
  under per-order locks (:func:`run_scenario`, any :class:`OrderLock` named by
  ``"package.module:Factory"``) or through a keyed queue (:func:`run_queue_scenario`).
* :mod:`~turnstile.demo.judge`: order kept, orders in parallel, makespan against the ideal,
  handover latency (:func:`summarize`).
* :mod:`~turnstile.demo.render`: the progress display, timeline and summary text.

``turnstile demo [--queue]`` (:mod:`turnstile.cli.demo`) parses the options and puts these
together.
"""

from __future__ import annotations

from .arrivals import (
    ARRIVALS,
    DEFAULT_EVENTS,
    DEFAULT_GAP,
    DEFAULT_WORK,
    DemoError,
    EventRecord,
    Failure,
    ScenarioResult,
    Update,
    Webhook,
    arrival_schedule,
    order_labels,
)
from .judge import (
    Ideal,
    Summary,
    Violation,
    handover_latencies,
    ideal_makespan,
    makespan,
    order_violations,
    parallelism,
    summarize,
)
from .render import render_timeline
from .workers import (
    DEFAULT_STRATEGY,
    OrderLock,
    QueueScenarioResult,
    TurnstileOrderLock,
    load_strategy,
    run_queue_scenario,
    run_scenario,
    worker_wait,
)

__all__ = [
    "ARRIVALS",
    "DEFAULT_EVENTS",
    "DEFAULT_GAP",
    "DEFAULT_STRATEGY",
    "DEFAULT_WORK",
    "DemoError",
    "EventRecord",
    "Failure",
    "Ideal",
    "OrderLock",
    "QueueScenarioResult",
    "ScenarioResult",
    "Summary",
    "TurnstileOrderLock",
    "Update",
    "Violation",
    "Webhook",
    "arrival_schedule",
    "handover_latencies",
    "ideal_makespan",
    "load_strategy",
    "makespan",
    "order_labels",
    "order_violations",
    "parallelism",
    "render_timeline",
    "run_queue_scenario",
    "run_scenario",
    "summarize",
    "worker_wait",
]
