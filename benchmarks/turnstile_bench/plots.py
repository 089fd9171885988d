"""PNG plots of a run, drawn by the same command that measured it (matplotlib, from the
``bench`` extra; the Agg backend, so no display is needed).

:func:`draw` looks at what a run returned and draws what it finds: hand-over latency by
waiters per lock (:class:`HandoverResult`), uncontended ops/s (:class:`UncontendedResult`),
webhook efficiency against the perfect-FIFO bound (:class:`WebhookResult`) and queue
throughput (:class:`ThroughputRow`), plus any extra figures a script passes as
:class:`Figure`. Files are named ``<stem>-<what>.png`` beside the results file, and
:func:`markdown_links` gives the section that links them.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .scenarios import HandoverResult, ThroughputRow, UncontendedResult, WebhookResult


@dataclass
class Figure:
    """A generic figure: one bar group or line per series.

    ``kind`` "bar": ``x`` are category labels and each series has one value per label;
    "line": ``x`` are numbers. ``logy`` draws a logarithmic y axis."""

    slug: str  # file name part
    title: str
    xlabel: str
    ylabel: str
    x: Sequence[Any]
    series: dict[str, Sequence[float]] = field(default_factory=dict)
    kind: str = "bar"
    logy: bool = False


def _plt() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _finite(values: Sequence[float]) -> list[float]:
    return [v if v is not None and not math.isnan(v) else math.nan for v in values]


def _save(fig: Any, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    _plt().close(fig)
    return path


def _draw_figure(f: Figure, path: Path) -> Path:
    plt = _plt()
    width = max(6.0, min(14.0, 1.2 + 0.9 * len(f.x) * max(1, len(f.series)) ** 0.5))
    fig, ax = plt.subplots(figsize=(width, 4.2))
    if f.kind == "line":
        for label, values in f.series.items():
            ax.plot(list(f.x), _finite(values), marker="o", label=label)
        ax.set_xticks(list(f.x))
    else:
        n = max(1, len(f.series))
        step = 0.8 / n
        for i, (label, values) in enumerate(f.series.items()):
            xs = [j - 0.4 + step * (i + 0.5) for j in range(len(f.x))]
            ax.bar(xs, _finite(values), width=step, label=label)
        ax.set_xticks(range(len(f.x)))
        ax.set_xticklabels([str(x) for x in f.x], rotation=25 if len(f.x) > 3 else 0,
                           ha="right" if len(f.x) > 3 else "center", fontsize=8)
    if f.logy:
        ax.set_yscale("log")
    ax.set_title(f.title, fontsize=10)
    ax.set_xlabel(f.xlabel)
    ax.set_ylabel(f.ylabel)
    ax.grid(axis="y", alpha=0.3)
    if len(f.series) > 1 or f.kind == "line":
        ax.legend(fontsize=7)
    return _save(fig, path)


def handover_figure(results: Sequence[HandoverResult]) -> Figure | None:
    if not results:
        return None
    waiters = sorted({r.processes - 1 for r in results})
    labels = list(dict.fromkeys(r.label for r in results))
    by = {(r.label, r.processes - 1): r.gap_p50_ms for r in results}
    series = {label: [by.get((label, w), math.nan) for w in waiters] for label in labels}
    return Figure(
        "handover",
        "Hand-over to another process, p50 (ms, log scale; lower is better)",
        "waiters per lock",
        "gap p50 ms",
        waiters,
        series,
        kind="line" if len(waiters) > 1 else "bar",
        logy=True,
    )


def uncontended_figure(results: Sequence[UncontendedResult]) -> Figure | None:
    if not results:
        return None
    return Figure(
        "uncontended",
        "Uncontended acquire + release per second (higher is better)",
        "",
        "ops/s",
        [r.label for r in results],
        {"ops/s": [r.ops_per_s for r in results]},
    )


def webhook_figure(groups: Sequence[Sequence[WebhookResult]]) -> Figure | None:
    groups = [g for g in groups if g]
    if not groups:
        return None
    labels = list(dict.fromkeys(r.label for g in groups for r in g))
    series = {}
    for g in groups:
        by = {r.label: r.vs_bound for r in g}
        name = g[0].scenario if len(g[0].scenario) < 40 else g[0].scenario[:37] + "..."
        series[name] = [by.get(label, math.nan) for label in labels]
    return Figure(
        "webhooks",
        "Webhooks: efficiency / perfect-FIFO bound (1 = a zero-overhead FIFO lock)",
        "",
        "vs perfect FIFO",
        labels,
        series,
    )


def throughput_figures(rows: Sequence[ThroughputRow]) -> list[Figure]:
    if not rows:
        return []
    labels = [f"{r.store}: {r.queue}" + (f" ({r.keys} keys)" if r.keys else "") for r in rows]
    return [
        Figure("throughput", "Queue drain, messages per second (higher is better)", "",
               "messages/s", labels, {"messages/s": [r.per_second for r in rows]}),
        Figure("latency", "Queue put -> start latency (ms, log scale)", "", "ms", labels,
               {"p50": [r.latency_p50_ms for r in rows], "p99": [r.latency_p99_ms for r in rows]},
               logy=True),
    ]


def figures(results: dict[str, Any]) -> list[Figure]:
    """The standard figures of whatever ``results`` holds, then its ``figures`` entry."""
    out: list[Figure] = []
    for found in (
        handover_figure(results.get("handover") or []),
        uncontended_figure(results.get("uncontended") or []),
        webhook_figure(results.get("webhooks") or [])
        if results.get("webhooks") and isinstance(results["webhooks"][0], list)
        else None,
    ):
        if found is not None:
            out.append(found)
    throughput = results.get("throughput") or []
    if throughput and isinstance(throughput[0], ThroughputRow):
        out += throughput_figures(throughput)
    out += list(results.get("figures") or [])
    return out


def draw(results: dict[str, Any], output: Path) -> list[tuple[str, Path]]:
    """Draw the run's figures beside ``output`` (``<stem>-<slug>.png``); (title, path) each."""
    drawn = []
    for f in figures(results):
        path = output.parent / f"{output.stem}-{f.slug}.png"
        drawn.append((f.title, _draw_figure(f, path)))
    return drawn


def markdown_links(drawn: Sequence[tuple[str, Path]]) -> str:
    if not drawn:
        return ""
    lines = ["", "", "## Plots", ""]
    for title, path in drawn:
        lines += [f"![{title}]({path.name})", ""]
    return "\n".join(lines)
