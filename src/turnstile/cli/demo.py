"""``turnstile demo [--queue]``: the per-order webhook problem from the SPEC, live, with real
worker processes. The scenario, the workers, the judge and the text all live in
:mod:`turnstile.demo`; this module parses the options and puts them together."""

from __future__ import annotations

import argparse
import os
import secrets
import shutil
import sys
import tempfile

from .. import connect
from .. import demo as scenario
from .._core.urls import redact
from ..demo import render
from ..demo.arrivals import orders_of
from ..errors import InvalidArgument
from . import _support

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
    parser = _support.command_parser(
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
        type=_support.int_type("--orders", 1, MAX_ORDERS),
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
        type=_support.int_type("--events-per-order", 1, MAX_EVENTS_PER_ORDER),
        help=f"the same number of events for every order (default {DEFAULT_EVENTS_PER_ORDER} "
        "with --orders)",
    )
    size.add_argument(
        "--workers",
        metavar="W",
        type=_support.int_type("--workers", 1, MAX_WORKERS),
        help=f"worker processes (1 to {MAX_WORKERS}; default: one per event, at most "
        f"{DEFAULT_MAX_WORKERS})",
    )
    size.add_argument(
        "--work-ms",
        metavar="MS",
        type=_support.milliseconds_type("--work-ms", 60_000),
        default=scenario.DEFAULT_WORK,
        help=f"work per webhook in ms (0 to 60000; default {scenario.DEFAULT_WORK * 1000:g})",
    )
    size.add_argument(
        "--gap-ms",
        metavar="MS",
        type=_support.milliseconds_type("--gap-ms", 60_000),
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
        type=_support.ttl_type("--ttl"),
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
        type=_support.int_type("--width", 20, 400),
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
    schedule = scenario.arrival_schedule(
        counts, gap=args.gap_ms, work=args.work_ms, arrival=args.arrival, seed=args.seed
    )
    workers: int = args.workers or min(len(schedule), DEFAULT_MAX_WORKERS)
    url: str | None = _support.given_url(args)
    if url is None:
        with tempfile.TemporaryDirectory(prefix="turnstile-demo-") as folder:
            db = os.path.join(folder, "demo.db")
            return _demo(args, schedule, workers, f"sqlite:///{db}", prefix="")
    _check_shared(url)
    return _demo(args, schedule, workers, url, prefix=f"demo-{secrets.token_hex(4)}:")


def _check_shared(url: str) -> None:
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
    """Both variants: the same webhooks under per-order locks, or (``--queue``) through a
    queue keyed by order."""
    out = sys.stdout
    queue_name = f"{prefix}webhooks" if args.queue else None
    show_progress = not args.json and not args.no_progress
    live = show_progress and out.isatty() and os.environ.get("TERM", "") != "dumb"
    if not args.json:
        for line in render.intro(
            schedule,
            workers=workers,
            gap=args.gap_ms,
            work=args.work_ms,
            store=redact(url),
            lock_prefix=prefix,
            queue_name=queue_name,
        ):
            print(line, file=out)
        print(f"starting {workers} worker processes …", file=out, flush=True)
    display: render.Display | None = None
    if show_progress:
        display = render.LiveBoard(out, schedule) if live else render.ProgressLines(out)

    def ready(seconds: float) -> None:
        if not args.json:
            print(f"workers ready in {seconds:.2f} s; webhooks arriving\n", file=out, flush=True)

    on_update = display.update if display is not None else None
    waited: float | None = None
    try:
        with _support.stop_on_signals():  # SIGTERM: stop the workers, then exit 143
            if queue_name is None:
                result = scenario.run_scenario(
                    url,
                    schedule,
                    workers=workers,
                    options={"ttl": args.ttl, "timeout": 60.0, "prefix": prefix},
                    on_update=on_update,
                    on_ready=ready,
                )
            else:
                queued = scenario.run_queue_scenario(
                    url,
                    schedule,
                    workers=workers,
                    name=queue_name,
                    visibility_timeout=max(10.0, 3 * args.work_ms),
                    on_update=on_update,
                    on_ready=ready,
                )
                result, waited = queued, scenario.worker_wait(queued)
    except scenario.DemoError as exc:
        _support.error(f"the demo could not run: {exc}", _support.secrets_of(url))
        return _support.EXIT_FAILURE
    if display is not None:
        display.finish()
    summary = scenario.summarize(result)
    if args.json:
        _support.print_json(_report(args, url, result, summary, waited))
    else:
        width = args.width or max(20, min(100, shutil.get_terminal_size((100, 24)).columns - 14))
        waiting = "an event waiting for its turn"
        if args.queue:
            waiting = "an event queued behind its order"
        lines = render.render_report(
            result.records,
            schedule,
            summary,
            width=width,
            waiting=waiting,
            tokens=not args.queue,  # a queue's turns carry no fencing token
            worker_wait=waited,
        )
        for line in lines:
            print(line, file=out)
    return _support.EXIT_OK if summary.ok else _support.EXIT_FAILURE


def _report(
    args: argparse.Namespace,
    url: str,
    result: scenario.ScenarioResult,
    summary: scenario.Summary,
    worker_wait: float | None,
) -> dict[str, object]:
    """The ``--json`` report; the queue variant says so (``mode``), has no ttl, and adds the
    time workers waited on a turn."""
    schedule = result.schedule
    orders = orders_of(schedule)
    setup: dict[str, object] = {
        "orders": len(orders),
        "events_per_order": [sum(1 for w in schedule if w.order == o) for o in orders],
        "arrival": args.arrival,
        "seed": args.seed,
        "gap_ms": round(args.gap_ms * 1000, 3),
        "work_ms": round(args.work_ms * 1000, 3),
        "workers": result.workers,
    }
    if not args.queue:
        setup["ttl"] = args.ttl
    setup["startup_seconds"] = round(result.startup, 3)
    totals = summary.to_dict()
    report: dict[str, object] = {"url": redact(url)}
    if worker_wait is not None:
        report["mode"] = "queue"
        totals["worker_wait_seconds"] = round(worker_wait, 6)
    report.update(scenario=setup, events=[r.to_dict() for r in result.records], summary=totals)
    return report
