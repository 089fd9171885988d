"""Reporting: Markdown tables (with a ratio column against a named baseline of the same run),
the machine header (the exact command, date, nproc, load, Python and library versions), JSON,
and writing a results file."""

from __future__ import annotations

import dataclasses
import datetime
import json
import math
import os
import platform
import sys
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from .scenarios import REPEAT_BELOW_MS, HandoverResult, UncontendedResult, WebhookResult


def fmt(value: Any, digits: int = 2) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        if math.isnan(value):
            return "-"
        if abs(value) >= 1000:
            return f"{value:,.0f}"
        return f"{value:.{digits}f}"
    return str(value)


def fmt_trials(values: list[float]) -> str:
    """Every trial's figure, in run order: ``0.31 / 0.29 / 0.33``."""
    return " / ".join(fmt(v) for v in values)


def fmt_against(value: float, *others: float) -> int:
    """Digits that tell ``value`` apart from each of ``others`` (2, or up to 4 when two
    decimals would show a miss as a tie: "0.95 ... missed" reads as a contradiction)."""
    for digits in (2, 3, 4):
        if all(fmt(value, digits) != fmt(o, digits) or value == o for o in others):
            return digits
    return 4


def markdown_table(headers: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    lines = [
        "| " + " | ".join(headers) + " |",
        "|" + "|".join("---" if i == 0 else "---:" for i in range(len(headers))) + "|",
    ]
    for row in rows:
        lines.append("| " + " | ".join(fmt(v) for v in row) + " |")
    return "\n".join(lines)


def ratio(value: float, base: float) -> float:
    if base == 0 or math.isnan(base) or math.isnan(value):
        return math.nan
    return value / base


def _baseline(results: Sequence[Any], baseline: str | None) -> Any:
    return next((r for r in results if r.label == baseline), None)


def uncontended_table(results: Sequence[UncontendedResult], baseline: str | None = None) -> str:
    base = _baseline(results, baseline)
    server = any(not math.isnan(r.server_us) for r in results)
    headers = [
        "lock",
        "acquire+release /s",
        "p50 ms",
        "p99 ms",
        "client CPU µs / op",
        "waiting µs / op",
        *(["server CPU µs / op"] if server else []),
        "trials (ops/s)",
    ]
    if base is not None:
        headers.insert(2, f"vs {baseline}")
    rows = []
    for r in results:
        row: list[Any] = [
            r.label,
            r.ops_per_s,
            r.p50_ms,
            r.p99_ms,
            r.cpu_us,
            r.wait_us,
            *([r.server_us] if server else []),
            " / ".join(f"{t:,.0f}" for t in r.trials),
        ]
        if base is not None:
            row.insert(2, ratio(r.ops_per_s, base.ops_per_s))
        rows.append(row)
    return markdown_table(headers, rows)


def uncontended_section(
    results: Sequence[UncontendedResult], baseline: str | None = None
) -> list[str]:
    """The lock benchmarks' "Uncontended" section: heading, how to read it, the table."""
    server = any(not math.isnan(r.server_us) for r in results)
    return [
        "",
        "## Uncontended acquire + release (one process)",
        "",
        "Median of the interleaved trials; latency percentiles of the median trial. *Client "
        "CPU*: the worker process's CPU time (user and system, all its threads) per acquire + "
        "release, median of the trials; *waiting*: the rest of a cycle (1 / rate minus that), "
        "spent on the network, the server, the disk and the scheduler"
        + (
            "; *server CPU*: the store's processes' CPU time (user and system) over the same "
            "cycles, per acquire + release, median of the trials: the part of the waiting the "
            "server spent computing (the rest is the network, the disk and the scheduler; "
            "a server's background work, such as PostgreSQL's WAL writer, counts too)."
            if server
            else "."
        ),
        "",
        uncontended_table(results, baseline),
        "",
    ]


def by_waiters(results: Sequence[HandoverResult]) -> dict[int, dict[str, HandoverResult]]:
    """Handover runs by waiters (processes - 1), each by contender label, in run order."""
    out: dict[int, dict[str, HandoverResult]] = {}
    for r in results:
        out.setdefault(r.processes - 1, {})[r.label] = r
    return out


def handover_table(
    results: Sequence[HandoverResult], baseline: str | None = None, counters: bool = False
) -> str:
    base = _baseline(results, baseline)
    headers = [
        "lock",
        "procs",
        "gap to other p50 ms",
        "p99 ms",
        "max ms",
        "to another process",
        "longest streak",
        "FIFO violations (call time ±1 ms)",
        "certain FIFO violations",
        "overlaps",
    ]
    if base is not None:
        headers.insert(3, f"p50 vs {baseline}")
    keys = sorted({k for r in results for k in r.per_grant}) if counters else []
    headers += [f"{k} / grant" for k in keys]
    trials = any(len(r.trials) > 1 for r in results)
    if trials:
        headers.append("p50 per trial")
    rows = []
    for r in results:
        row: list[Any] = [
            r.label,
            r.processes,
            r.gap_p50_ms,
            r.gap_p99_ms,
            r.gap_max_ms,
            f"{r.to_other} of {r.handovers}",
            r.longest_streak,
            f"{r.fifo_violations} of {r.grants}",
            _certain(r.certain_fifo_violations, r.grants),
            r.overlaps,
        ]
        if base is not None:
            row.insert(3, ratio(r.gap_p50_ms, base.gap_p50_ms))
        row += [r.per_grant.get(k, math.nan) for k in keys]
        if trials:
            row.append(fmt_trials(r.trials))
        rows.append(row)
    return markdown_table(headers, rows)


def handover_trials_note(results: Sequence[HandoverResult]) -> str:
    """The sentence that says how a handover table's rows were chosen ("" for one trial)."""
    most = max((len(r.trials) for r in results), default=0)
    if most <= 1:
        return ""
    return (
        f" Each row is the lock's trial of median p50 out of {most}, run interleaved over the"
        " locks (each trial runs every lock in turn, so the machine's drift affects them"
        " alike); the last column lists every trial's p50. A lock slower than"
        f" {fmt(REPEAT_BELOW_MS, 0)} ms p50 in its first trial runs that one only."
    )


def _certain(count: int | None, of: int | None) -> str:
    """A certain FIFO count; "-" for a lock that never confirms a place in line."""
    if count is None:
        return "-"
    return f"{count} of {of}" if of is not None else str(count)


def webhook_table(
    results: Sequence[WebhookResult], baseline: str | None = None, counters: bool = False
) -> str:
    base = _baseline(results, baseline)
    headers = [
        "lock",
        "makespan s",
        "efficiency",
        "perfect FIFO lock",
        "vs perfect",
        "out of order",
        "lock FIFO violations (call time ±1 ms)",
        "certain lock FIFO violations",
        "overlaps",
        "in-order handover p50 ms",
        "p99 ms",
        "failed",
        "efficiency per trial",
    ]
    if base is not None:
        headers.insert(3, f"vs {baseline}")
    keys = sorted({k for r in results for k in r.per_grant}) if counters else []
    headers += [f"{k} / grant" for k in keys]
    rows = []
    for r in results:
        row: list[Any] = [
            r.label,
            r.makespan_s,
            r.efficiency,
            r.bound_efficiency,
            r.vs_bound,
            f"{r.order_violations} of {r.events}",
            r.lock_fifo_violations,
            _certain(r.certain_lock_fifo_violations, None),
            r.overlaps,
            r.order_gap_p50_ms,
            r.order_gap_p99_ms,
            r.failed,
            fmt_trials(r.trials),
        ]
        if base is not None:
            row.insert(3, ratio(r.efficiency, base.efficiency))
        row += [r.per_grant.get(k, math.nan) for k in keys]
        rows.append(row)
    return markdown_table(headers, rows)


def machine_info(packages: Sequence[str] = ()) -> dict[str, Any]:
    """Where and when: for the header of a results file."""
    from importlib import metadata

    versions = {}
    for package in packages:
        try:
            versions[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            versions[package] = "not installed"
    return {
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "nproc": os.cpu_count(),
        "loadavg": [round(x, 2) for x in os.getloadavg()],
        "python": platform.python_version(),
        "platform": platform.platform(),
        "versions": versions,
    }


def machine_lines(info: Mapping[str, Any], command: str) -> list[str]:
    versions = ", ".join(f"{k} {v}" for k, v in info["versions"].items())
    return [
        f"- command: `{command}`",
        f"- date: {info['date']}",
        f"- machine: {info['nproc']} CPUs (nproc), load average at start "
        f"{' / '.join(str(x) for x in info['loadavg'])}, {info['platform']}",
        f"- python {info['python']}" + (f"; {versions}" if versions else ""),
        *(
            [
                "- **shared machine**: other jobs were running (load average above half the "
                "cores at the start), so absolute figures are low and tails are long; compare "
                "rows of this run only: the ratios are what count"
            ]
            if info["loadavg"] and info["nproc"] and info["loadavg"][0] > info["nproc"] / 2
            else []
        ),
    ]


def to_json(obj: Any) -> str:
    """Results (dataclasses, lists, dicts) as JSON; NaN becomes null."""

    def clean(value: Any) -> Any:
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            return clean(dataclasses.asdict(value))
        if isinstance(value, Mapping):
            return {str(k): clean(v) for k, v in value.items()}
        if isinstance(value, list | tuple):
            return [clean(v) for v in value]
        if isinstance(value, float) and (math.isnan(value) or math.isinf(value)):
            return None
        return value

    return json.dumps(clean(obj), indent=2)


def command_line(script: str, argv: Sequence[str] | None = None, env: Sequence[str] = ()) -> str:
    """The exact command that produced a results file (``env``: ``VAR=value`` words that
    went into it, already redacted)."""
    args = sys.argv[1:] if argv is None else list(argv)
    return " ".join([*env, f"python benchmarks/{script}", *args])


def write(output: Path | None, text: str) -> None:
    """The Markdown into ``output`` (nothing when ``None``)."""
    if output is None:
        return
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(text, encoding="utf-8")
    print(f"wrote {output}", file=sys.stderr)
