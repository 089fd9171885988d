"""Showing a run, for both variants (per-order locks and the keyed queue): the opening
lines, progress as it happens (plain lines, or a board redrawn in place on a terminal), the
per-order timeline and the summary. Text only; what is judged is :mod:`turnstile.demo.judge`.
"""

from __future__ import annotations

import abc
import shutil
import time
from collections.abc import Sequence
from typing import TextIO

from .arrivals import EventRecord, Update, Webhook, orders_of
from .judge import Summary

SHOWN_IDS = 12  # webhook ids named in the opening line


def intro(
    schedule: Sequence[Webhook],
    *,
    workers: int,
    gap: float,
    work: float,
    store: str,
    lock_prefix: str = "",
    queue_name: str | None = None,
) -> list[str]:
    """What is about to run: the webhooks, how they are handled (under per-order locks
    named ``{lock_prefix}order:<order>``, or through queue ``queue_name``), the store."""
    ids = " ".join(w.id for w in schedule[:SHOWN_IDS])
    if len(schedule) > SHOWN_IDS:
        ids += " …"
    webhooks = f"{len(schedule)} webhooks for {len(orders_of(schedule))} orders ({ids})"
    if queue_name is None:
        lines = [
            f"turnstile demo: {webhooks} arrive {gap * 1000:g} ms apart;",
            f"{workers} worker processes handle them under per-order locks "
            f"(lock name {lock_prefix}order:<order>), {work * 1000:g} ms of work each.",
        ]
    else:
        lines = [
            f"turnstile demo --queue: {webhooks} arrive {gap * 1000:g} ms apart",
            f"and are put into queue '{queue_name}' keyed by order; {workers} worker processes"
            " take the next deliverable one",
            f"(one per order in flight, in arrival order), {work * 1000:g} ms of work each.",
        ]
    return [*lines, f"store: {store}"]


# -- progress -----------------------------------------------------------------------------


class Display(abc.ABC):
    @abc.abstractmethod
    def update(self, update: Update) -> None: ...

    def finish(self) -> None:
        return None


class ProgressLines(Display):
    """Plain lines, one per event: for logs and CI, where there is no terminal."""

    def __init__(self, out: TextIO) -> None:
        self.out = out
        self.running: dict[str, str] = {}  # order -> webhook id running
        self.last_end: dict[str, tuple[str, float]] = {}  # order -> last event ended, when
        self.arrived: dict[str, float] = {}

    def update(self, u: Update) -> None:
        order, hook = u.webhook.order, u.webhook.id
        if u.kind == "arrived":
            self.arrived[hook] = u.at
            busy = self.running.get(order)
            text = f"{hook} arrived" + (f"; order {order} busy with {busy}, waits" if busy else "")
        elif u.kind == "started":
            self.running[order] = hook
            waited = u.at - self.arrived.get(hook, u.at)
            text = f"{hook} started on worker {u.worker}"
            if u.token is not None:  # a queue's turn has no fencing token
                text += f", token {u.token}"
            if order in self.last_end and waited > 0.002:
                previous, ended = self.last_end[order]
                handover = (u.at - ended) * 1000
                text += f" (waited {waited:.3f} s; {handover:.1f} ms after {previous} ended)"
        elif u.kind == "ended":
            self.running.pop(order, None)
            self.last_end[order] = (hook, u.at)
            text = f"{hook} done"
        else:
            self.running.pop(order, None)
            text = f"{hook} FAILED: {u.message}"
        print(f"  {f'+{u.at:.3f}s':>8}  {text}", file=self.out, flush=True)


class LiveBoard(Display):
    """A block of lines, one per order, redrawn in place on a terminal."""

    MAX_ROWS = 12
    STATES = {"arrived": "waiting", "started": "RUNNING", "ended": "done", "failed": "FAILED"}

    def __init__(self, out: TextIO, schedule: Sequence[Webhook]) -> None:
        self.out = out
        self.orders = orders_of(schedule)
        self.hooks = {o: [w.id for w in schedule if w.order == o] for o in self.orders}
        self.state: dict[str, str] = {w.id: "-" for w in schedule}
        self.started = time.monotonic()
        self.at = 0.0
        self.drawn = 0
        self.columns = shutil.get_terminal_size((100, 24)).columns

    def update(self, u: Update) -> None:
        self.at = u.at
        self.state[u.webhook.id] = self.STATES[u.kind]
        self.draw()

    def lines(self) -> list[str]:
        done = sum(1 for s in self.state.values() if s == "done")
        rows = [f"  +{self.at:.3f}s  {done}/{len(self.state)} done"]
        shown = self.orders
        if len(shown) > self.MAX_ROWS:
            shown = shown[: self.MAX_ROWS - 1]
        for order in shown:
            cells = "  ".join(f"{h} {self.state[h]:<7}" for h in self.hooks[order])
            rows.append(f"  order {order:<3} {cells}"[: self.columns - 1])
        if len(shown) < len(self.orders):
            rest = self.orders[len(shown) :]
            running = sum(1 for o in rest for h in self.hooks[o] if self.state[h] == "RUNNING")
            rows.append(f"  … and {len(rest)} more orders ({running} events running)")
        return rows

    def draw(self) -> None:
        rows = self.lines()
        text: list[str] = []
        if self.drawn:
            text.append(f"\x1b[{self.drawn}F")  # back to the first line of the block
        text += [f"\x1b[2K{row}\n" for row in rows]
        self.out.write("".join(text))
        self.out.flush()
        self.drawn = len(rows)

    def finish(self) -> None:
        # Every update drew its frame already: drawing the last one again would show it
        # twice wherever the output is kept (a log, `script`, a terminal's scrollback).
        if not self.drawn:
            self.draw()


# -- afterwards ---------------------------------------------------------------------------


def render_report(
    records: Sequence[EventRecord],
    schedule: Sequence[Webhook],
    summary: Summary,
    *,
    width: int,
    waiting: str,
    tokens: bool = True,
    worker_wait: float | None = None,
) -> list[str]:
    """The timeline (``waiting`` says what its dots mean) and the summary, as printed after
    a run."""
    lines = ["", f"timeline  (RA1===: event running, ...: {waiting})"]
    lines += ["  " + line for line in render_timeline(records, schedule, width=width)]
    lines.append("")
    return lines + render_summary(summary, tokens=tokens, worker_wait=worker_wait)


def render_summary(
    summary: Summary, *, tokens: bool = True, worker_wait: float | None = None
) -> list[str]:
    """``tokens``: whether fencing tokens were there to check (a queue's turns have none);
    ``worker_wait``: seconds workers held a webhook they could not start yet, if measured."""
    s = summary
    lines = ["summary"]
    checked = "start times and fencing tokens" if tokens else "start times"
    if s.violations:
        lines.append(f"  order kept within each order:  NO, {len(s.violations)} violations")
        lines += [f"      {v}" for v in s.violations[:10]]
    else:
        lines.append(
            f"  order kept within each order:  yes, 0 violations ({checked} of {s.completed}"
            " events checked)"
        )
    if s.failures:
        lines.append(f"  failed webhooks:               {len(s.failures)}")
        lines += [f"      {f.webhook.id}: {f.message}" for f in s.failures[:10]]
    if s.orders < 2:
        lines.append("  orders in parallel:            (only one order)")
    elif s.max_parallel_orders >= 2:
        lines.append(
            f"  orders in parallel:            yes, up to {s.max_parallel_orders} orders at "
            f"once, for {s.parallel_seconds:.2f} s"
        )
    else:
        lines.append("  orders in parallel:            NO, different orders never overlapped")
    lines.append(
        f"  makespan:                      {s.makespan:.3f} s; ideal {s.ideal.seconds:.3f} s "
        f"(efficiency {s.efficiency:.0%})"
    )
    lines.append(f"      ideal = lower bound: {s.ideal.reason}")
    if s.handovers:
        p50, worst = s.handover_p50, s.handover_max
        assert p50 is not None and worst is not None
        lines.append(
            f"  handover latency:              p50 {p50 * 1000:.1f} ms, max {worst * 1000:.1f} ms"
            f" over {len(s.handovers)} handovers (an event's end to the next one's start)"
        )
    else:
        lines.append("  handover latency:              no handovers (no event had to wait)")
    if worker_wait is not None:
        lines.append(
            f"  workers waiting on a turn:     {worker_wait:.3f} s in all (a worker is only"
            " handed a webhook it can run now)"
        )
    return lines


def render_timeline(
    records: Sequence[EventRecord], schedule: Sequence[Webhook], *, width: int = 60
) -> list[str]:
    """One row per order: ``RA1=====`` while an event runs, ``.`` while an event of the
    order waits for its turn and none runs, blank while the order has nothing to do.

    Each column shows what filled most of its time slice, so a handover far shorter than a
    column does not show as a gap."""
    width = max(10, width)
    span = max([r.ended for r in records] + [w.arrival for w in schedule] + [1e-3])
    step = span / width
    samples = 8  # per column

    labels = orders_of(schedule)
    label_width = max(len(f"order {o}") for o in labels) + 2 if labels else 8
    lines = []
    ticks = 4 if width >= 40 else 2
    ruler = [" "] * (width + 12)
    marks = ["-"] * width
    for i in range(ticks + 1):
        position = min(width - 1, round(i * width / ticks))
        marks[position] = "|"
        text = f"{position * step:.2f}s" if i < ticks else f"{span:.2f}s"
        start = min(max(0, position - len(text) // 2), len(ruler) - len(text))
        if i == 0:
            start = 0
        ruler[start : start + len(text)] = text
    lines.append(" " * label_width + "".join(ruler).rstrip())
    lines.append(" " * label_width + "".join(marks))
    by_order: dict[str, list[EventRecord]] = {}
    for r in records:
        by_order.setdefault(r.webhook.order, []).append(r)
    for order in labels:
        events = sorted(by_order.get(order, []), key=lambda r: r.started)
        owner: list[EventRecord | str | None] = []  # per column: an event, "." or None
        for c in range(width):
            votes: dict[int, int] = {}
            waiting = 0
            for k in range(samples):
                t = (c + (k + 0.5) / samples) * step
                running = next((i for i, r in enumerate(events) if r.started <= t < r.ended), None)
                if running is not None:
                    votes[running] = votes.get(running, 0) + 1
                elif any(r.arrived <= t < r.started for r in events):
                    waiting += 1
            best = max(votes, key=lambda i: votes[i], default=None)
            running_total = sum(votes.values())
            if best is not None and running_total >= max(
                waiting, samples - running_total - waiting
            ):
                owner.append(events[best])
            elif waiting * 2 >= samples:
                owner.append(".")
            else:
                owner.append(None)
        for r in events:  # an event shorter than half a column still gets one
            if r not in owner:
                c = min(width - 1, int((r.started + r.ended) / 2 / step))
                if not isinstance(owner[c], EventRecord):
                    owner[c] = r
        row = []
        for c, who in enumerate(owner):
            if isinstance(who, EventRecord):
                offset = 0
                while c - offset - 1 >= 0 and owner[c - offset - 1] is who:
                    offset += 1
                label = who.webhook.id
                row.append(label[offset] if offset < len(label) else "=")
            else:
                row.append(" " if who is None else who)
        lines.append(f"order {order}".ljust(label_width) + "".join(row).rstrip())
    return lines
