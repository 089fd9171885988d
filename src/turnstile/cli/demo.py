"""``turnstile demo``: the per-order webhook problem from the SPEC, live, with real worker
processes. The scenario itself (schedule, workers, checks) is :mod:`turnstile.demo`; this
module parses the options and shows progress, the timeline and the summary."""

from __future__ import annotations

import abc
import argparse
import json
import os
import secrets
import shutil
import sys
import tempfile
import time
from typing import Any, TextIO

from .. import demo as scenario
from .._core.urls import redact
from ..errors import InvalidArgument
from . import _common

MAX_ORDERS = 200
MAX_EVENTS_PER_ORDER = 100
MAX_EVENTS = 1000
MAX_WORKERS = 64
DEFAULT_MAX_WORKERS = 8
DEFAULT_EVENTS_PER_ORDER = 3

EPILOG = """\
examples:
  turnstile demo                                 # RA1 RA2 RB1 RB2 RB3, a few seconds
  turnstile demo --orders 2 --events 2,3         # the same, spelled out
  turnstile demo --orders 6 --events-per-order 4 --workers 8 --arrival shuffled
  turnstile demo --json | jq .summary            # machine-readable

Runs on its own temporary SQLite file unless --url is given ($TURNSTILE_URL is not used,
so the demo never touches a shared store by surprise); with --url, lock names get a
unique demo-…: prefix. Exit code 0 if every webhook ran, in order, 1 otherwise.
"""


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = _common.command_parser(
        subparsers,
        "demo",
        help="watch per-order locks keep webhooks in order while orders run in parallel",
        description=(
            "Webhooks for several orders arrive in quick succession and are handled by\n"
            "separate worker processes under per-order Turnstile locks. Shows progress, a\n"
            "per-order timeline, and a summary: order kept within each order, orders in\n"
            "parallel, makespan against the ideal, handover latency."
        ),
        epilog=EPILOG,
    )
    size = parser.add_argument_group("scenario")
    size.add_argument(
        "--orders",
        metavar="N",
        type=_common.int_type("--orders", 1, MAX_ORDERS),
        help=f"number of orders A, B, C, … (1 to {MAX_ORDERS}; default 2)",
    )
    events = size.add_mutually_exclusive_group()
    events.add_argument(
        "--events",
        metavar="K1,K2,…",
        type=_events_type,
        help="events per order, one count per order (default 2,3: RA1 RA2, RB1 RB2 RB3)",
    )
    events.add_argument(
        "--events-per-order",
        metavar="K",
        type=_common.int_type("--events-per-order", 1, MAX_EVENTS_PER_ORDER),
        help=f"the same number of events for every order (default {DEFAULT_EVENTS_PER_ORDER} "
        "with --orders)",
    )
    size.add_argument(
        "--workers",
        metavar="W",
        type=_common.int_type("--workers", 1, MAX_WORKERS),
        help=f"worker processes (1 to {MAX_WORKERS}; default: one per event, at most "
        f"{DEFAULT_MAX_WORKERS})",
    )
    size.add_argument(
        "--work-ms",
        metavar="MS",
        type=_common.milliseconds_type("--work-ms", 60_000),
        default=scenario.DEFAULT_WORK,
        help=f"work per webhook in ms (0 to 60000; default {scenario.DEFAULT_WORK * 1000:g})",
    )
    size.add_argument(
        "--gap-ms",
        metavar="MS",
        type=_common.milliseconds_type("--gap-ms", 60_000),
        default=scenario.DEFAULT_GAP,
        help=f"time between arrivals in ms (0 to 60000; default {scenario.DEFAULT_GAP * 1000:g})",
    )
    size.add_argument(
        "--arrival",
        choices=scenario.ARRIVALS,
        default="grouped",
        help="arrival order: grouped (RA1 RA2 RB1 …), interleaved (RA1 RB1 RA2 …) or "
        "shuffled (random, each order's events still in sequence; see --seed)",
    )
    size.add_argument("--seed", metavar="S", type=int, default=None, help="seed for shuffled")
    size.add_argument(
        "--ttl",
        metavar="S",
        type=_common.ttl_type("--ttl"),
        default=10.0,
        help="lease ttl of the per-order locks (default 10)",
    )
    size.add_argument(
        "--queue",
        action="store_true",
        help="solve it by arrival order instead: put each webhook into a queue keyed by its "
        "order; workers take the next deliverable one (no worker waits on a lock)",
    )
    out = parser.add_argument_group("output")
    out.add_argument(
        "--json", action="store_true", help="print only a JSON report (scenario, events, summary)"
    )
    out.add_argument("--no-progress", action="store_true", help="no progress while it runs")
    out.add_argument(
        "--width",
        metavar="COLS",
        type=_common.int_type("--width", 20, 400),
        help="timeline width in columns (default: fit the terminal)",
    )
    parser.set_defaults(handler=demo_command, demo_parser=parser)


def _events_type(text: str) -> list[int]:
    counts = []
    for part in text.split(","):
        part = part.strip()
        if not part.isdigit() or not 1 <= int(part) <= MAX_EVENTS_PER_ORDER:
            raise argparse.ArgumentTypeError(
                f"must be comma-separated counts, each 1 to {MAX_EVENTS_PER_ORDER} "
                f"(e.g. 2,3), got {text!r}"
            )
        counts.append(int(part))
    if len(counts) > MAX_ORDERS:
        raise argparse.ArgumentTypeError(f"at most {MAX_ORDERS} orders, got {len(counts)}")
    return counts


def events_per_order(args: argparse.Namespace) -> list[int]:
    if args.events is not None:
        if args.orders is not None and args.orders != len(args.events):
            raise InvalidArgument(
                f"--orders {args.orders} does not match --events {','.join(map(str, args.events))}"
                f" ({len(args.events)} counts); give one count per order"
            )
        counts: list[int] = args.events
    elif args.orders is None and args.events_per_order is None:
        counts = list(scenario.DEFAULT_EVENTS)
    else:
        counts = [args.events_per_order or DEFAULT_EVENTS_PER_ORDER] * (args.orders or 2)
    if sum(counts) > MAX_EVENTS:
        raise InvalidArgument(f"at most {MAX_EVENTS} events in all, got {sum(counts)}")
    return counts


def demo_command(args: argparse.Namespace) -> int:
    counts = events_per_order(args)
    run = _demo
    if args.queue:  # the same webhooks, solved by arrival order (cli/demo_queue.py)
        from . import demo_queue

        run = demo_queue.run
    schedule = scenario.arrival_schedule(
        counts, gap=args.gap_ms, work=args.work_ms, arrival=args.arrival, seed=args.seed
    )
    workers: int = args.workers or min(len(schedule), DEFAULT_MAX_WORKERS)
    url: str | None = _common.given_url(args)
    if url is None:
        with tempfile.TemporaryDirectory(prefix="turnstile-demo-") as folder:
            db = os.path.join(folder, "demo.db")
            return run(args, schedule, workers, f"sqlite:///{db}", prefix="")
    _check_shared(url)
    return run(args, schedule, workers, url, prefix=f"demo-{secrets.token_hex(4)}:")


def _check_shared(url: str) -> None:
    from .. import connect

    with connect(url) as client:
        client.ping()
        if not client.characteristics.cross_process:
            raise InvalidArgument(
                f"--url {redact(url)} is private to one process, but the demo's workers are "
                "separate processes; use sqlite:///FILE, redis://… or postgresql://…"
            )


def _demo(
    args: argparse.Namespace,
    schedule: list[scenario.Webhook],
    workers: int,
    url: str,
    prefix: str,
) -> int:
    out = sys.stdout
    show_progress = not args.json and not args.no_progress
    live = show_progress and out.isatty() and os.environ.get("TERM", "") != "dumb"
    orders = sorted({w.order for w in schedule}, key=lambda o: (len(o), o))
    if not args.json:
        ids = " ".join(w.id for w in schedule[:12]) + (" …" if len(schedule) > 12 else "")
        print(
            f"turnstile demo: {len(schedule)} webhooks for {len(orders)} orders ({ids}) arrive "
            f"{args.gap_ms * 1000:g} ms apart;\n"
            f"{workers} worker processes handle them under per-order locks "
            f"(lock name {prefix}order:<order>), {args.work_ms * 1000:g} ms of work each.\n"
            f"store: {redact(url)}",
            file=out,
        )
        print(f"starting {workers} worker processes …", file=out, flush=True)
    display: _Display | None = None
    if show_progress:
        display = _LiveBoard(out, schedule, orders) if live else _ProgressLines(out)

    def ready(seconds: float) -> None:
        if not args.json:
            print(f"workers ready in {seconds:.2f} s; webhooks arriving\n", file=out, flush=True)

    try:
        with _common.stop_on_signals():  # SIGTERM: stop the workers, then exit 143
            result = scenario.run_scenario(
                url,
                schedule,
                workers=workers,
                options={"ttl": args.ttl, "timeout": 60.0, "prefix": prefix},
                on_update=display.update if display is not None else None,
                on_ready=ready,
            )
    except scenario.DemoError as exc:
        _common.error(f"the demo could not run: {exc}", _common.secrets_of(url))
        return _common.EXIT_FAILURE
    if display is not None:
        display.finish()
    summary = scenario.summarize(result)
    if args.json:
        report = {
            "url": redact(url),
            "scenario": {
                "orders": len(orders),
                "events_per_order": [sum(1 for w in schedule if w.order == o) for o in orders],
                "arrival": args.arrival,
                "seed": args.seed,
                "gap_ms": round(args.gap_ms * 1000, 3),
                "work_ms": round(args.work_ms * 1000, 3),
                "workers": workers,
                "ttl": args.ttl,
                "startup_seconds": round(result.startup, 3),
            },
            "events": [r.to_dict() for r in result.records],
            "summary": summary.to_dict(),
        }
        json.dump(report, out, indent=2)
        out.write("\n")
    else:
        width = args.width or max(20, min(100, shutil.get_terminal_size((100, 24)).columns - 14))
        print("\ntimeline  (RA1===: event running, ...: an event waiting for its turn)", file=out)
        for line in scenario.render_timeline(result.records, schedule, width=width):
            print("  " + line, file=out)
        print(file=out)
        for line in render_summary(summary):
            print(line, file=out)
    return _common.EXIT_OK if summary.ok else _common.EXIT_FAILURE


def render_summary(summary: scenario.Summary) -> list[str]:
    s = summary
    lines = ["summary"]
    checked = f"start times and fencing tokens of {s.completed} events checked"
    if s.violations:
        lines.append(f"  order kept within each order:  NO, {len(s.violations)} violations")
        lines += [f"      {v}" for v in s.violations[:10]]
    else:
        lines.append(f"  order kept within each order:  yes, 0 violations ({checked})")
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
    return lines


class _Display(abc.ABC):
    @abc.abstractmethod
    def update(self, update: scenario.Update) -> None: ...

    def finish(self) -> None:
        return None


class _ProgressLines(_Display):
    """Plain lines, one per event: for logs and CI, where there is no terminal."""

    def __init__(self, out: TextIO) -> None:
        self.out = out
        self.running: dict[str, str] = {}  # order -> webhook id running
        self.last_end: dict[str, tuple[str, float]] = {}  # order -> last event ended, when
        self.arrived: dict[str, float] = {}

    def update(self, u: scenario.Update) -> None:
        order, hook = u.webhook.order, u.webhook.id
        if u.kind == "arrived":
            self.arrived[hook] = u.at
            busy = self.running.get(order)
            text = f"{hook} arrived" + (f"; order {order} busy with {busy}, waits" if busy else "")
        elif u.kind == "started":
            self.running[order] = hook
            waited = u.at - self.arrived.get(hook, u.at)
            text = f"{hook} started on worker {u.worker}, token {u.token}"
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


class _LiveBoard(_Display):
    """A block of lines, one per order, redrawn in place on a terminal."""

    MAX_ROWS = 12

    def __init__(self, out: TextIO, schedule: list[scenario.Webhook], orders: list[str]) -> None:
        self.out = out
        self.orders = orders
        self.hooks = {o: [w.id for w in schedule if w.order == o] for o in orders}
        self.state: dict[str, str] = {w.id: "-" for w in schedule}
        self.started = time.monotonic()
        self.at = 0.0
        self.drawn = 0
        self.columns = shutil.get_terminal_size((100, 24)).columns

    def update(self, u: scenario.Update) -> None:
        self.at = u.at
        self.state[u.webhook.id] = {
            "arrived": "waiting",
            "started": "RUNNING",
            "ended": "done",
            "failed": "FAILED",
        }[u.kind]
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
        text: list[Any] = []
        if self.drawn:
            text.append(f"\x1b[{self.drawn}F")  # back to the first line of the block
        text += [f"\x1b[2K{row}\n" for row in rows]
        self.out.write("".join(text))
        self.out.flush()
        self.drawn = len(rows)

    def finish(self) -> None:
        self.draw()
