"""The benchmarks' package: Turnstile beside the locks and queues people use instead, on real
processes, every contender in one run.

* :mod:`.adapters` — every lock and queue under test (each peer library once), store counters;
* :mod:`.workers` — spawned worker processes behind a start line;
* :mod:`.scenarios` — uncontended, handover, webhooks (the demo's schedule and ideal
  makespan, :mod:`turnstile.demo`), webhooks by queue, queue throughput;
* :mod:`.metrics` — percentiles, overlaps, streaks, FIFO violations;
* :mod:`.report` — Markdown tables, the machine header, JSON;
* :mod:`.servers` — throwaway servers and a namespace of the run's own;
* :mod:`.main` — the one ``main`` of every ``bench_*.py``, which only declares its contenders
  and targets.

The names below are the ones a script or a test needs.
"""

from __future__ import annotations

from .adapters import Contender, LockAdapter, Probe, QueueAdapter, TurnstileLock
from .main import SKIP_EXIT, Bench, LockBench, Sizes, main, no_overlaps
from .metrics import (
    DEFAULT_FIFO_TOLERANCE,
    Grant,
    Handled,
    certain_fifo_violations,
    count_overlaps,
    fifo_violations,
    handover_metrics,
    longest_streak,
    percentile,
    webhook_metrics,
)
from .report import (
    by_waiters,
    command_line,
    fmt,
    fmt_against,
    fmt_trials,
    handover_table,
    handover_trials_note,
    machine_info,
    machine_lines,
    markdown_table,
    ratio,
    to_json,
    uncontended_section,
    uncontended_table,
    webhook_table,
)
from .scenarios import (
    HandoverResult,
    UncontendedResult,
    WebhookResult,
    WebhookScenario,
    fifo_bound,
    ideal_makespan,
    run_handover,
    run_uncontended,
    run_webhooks,
)
from .workers import BenchmarkError, run_workers

__all__ = [
    "DEFAULT_FIFO_TOLERANCE",
    "SKIP_EXIT",
    "Bench",
    "BenchmarkError",
    "Contender",
    "Grant",
    "Handled",
    "HandoverResult",
    "LockAdapter",
    "LockBench",
    "Probe",
    "QueueAdapter",
    "Sizes",
    "TurnstileLock",
    "UncontendedResult",
    "WebhookResult",
    "WebhookScenario",
    "by_waiters",
    "certain_fifo_violations",
    "command_line",
    "count_overlaps",
    "fifo_bound",
    "fifo_violations",
    "fmt",
    "fmt_against",
    "fmt_trials",
    "handover_metrics",
    "handover_table",
    "handover_trials_note",
    "ideal_makespan",
    "longest_streak",
    "machine_info",
    "machine_lines",
    "main",
    "markdown_table",
    "no_overlaps",
    "percentile",
    "ratio",
    "run_handover",
    "run_uncontended",
    "run_webhooks",
    "run_workers",
    "to_json",
    "uncontended_section",
    "uncontended_table",
    "webhook_metrics",
    "webhook_table",
]
