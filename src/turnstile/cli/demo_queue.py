"""``turnstile demo --queue``: the same webhooks, solved by arrival order instead of locks.
Each webhook is put into a queue keyed by its order as it arrives; worker processes take the
next deliverable one (:mod:`turnstile.queue_demo`). Shares options, progress display and
summary with :mod:`turnstile.cli.demo`."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys

from .. import demo as scenario
from .. import queue_demo
from .._core.urls import redact
from . import _common
from . import demo as lock_demo


def run(
    args: argparse.Namespace, schedule: list[scenario.Webhook], workers: int, url: str,
    prefix: str,
) -> int:
    out = sys.stdout
    show_progress = not args.json and not args.no_progress
    live = show_progress and out.isatty() and os.environ.get("TERM", "") != "dumb"
    orders = sorted({w.order for w in schedule}, key=lambda o: (len(o), o))
    name = f"{prefix}webhooks"
    if not args.json:
        ids = " ".join(w.id for w in schedule[:12]) + (" …" if len(schedule) > 12 else "")
        print(
            f"turnstile demo --queue: {len(schedule)} webhooks for {len(orders)} orders ({ids})"
            f" arrive {args.gap_ms * 1000:g} ms apart\nand are put into queue {name!r} keyed by"
            f" order; {workers} worker processes take the next deliverable one\n(one per order"
            f" in flight, in arrival order), {args.work_ms * 1000:g} ms of work each.\n"
            f"store: {redact(url)}",
            file=out,
        )
        print(f"starting {workers} worker processes …", file=out, flush=True)
    display: lock_demo._Display | None = None
    if show_progress:
        display = (lock_demo._LiveBoard(out, schedule, orders) if live
                   else lock_demo._ProgressLines(out))

    def ready(seconds: float) -> None:
        if not args.json:
            print(f"workers ready in {seconds:.2f} s; webhooks arriving\n", file=out, flush=True)

    try:
        result = queue_demo.run_queue_scenario(
            url, schedule, workers=workers, name=name,
            visibility_timeout=max(10.0, 3 * args.work_ms),
            on_update=display.update if display is not None else None, on_ready=ready,
        )
    except scenario.DemoError as exc:
        _common.error(f"the demo could not run: {exc}", _common.secrets_of(url))
        return _common.EXIT_FAILURE
    if display is not None:
        display.finish()
    summary = scenario.summarize(result)
    waited = queue_demo.worker_wait(result)
    if args.json:
        report = {
            "url": redact(url),
            "mode": "queue",
            "scenario": {
                "orders": len(orders),
                "events_per_order": [sum(1 for w in schedule if w.order == o) for o in orders],
                "arrival": args.arrival, "seed": args.seed,
                "gap_ms": round(args.gap_ms * 1000, 3), "work_ms": round(args.work_ms * 1000, 3),
                "workers": workers, "startup_seconds": round(result.startup, 3),
            },
            "events": [r.to_dict() for r in result.records],
            "summary": {**summary.to_dict(), "worker_wait_seconds": round(waited, 6)},
        }
        json.dump(report, out, indent=2)
        out.write("\n")
    else:
        width = args.width or max(20, min(100, shutil.get_terminal_size((100, 24)).columns - 14))
        print("\ntimeline  (RA1===: event running, ...: an event queued behind its order)",
              file=out)
        for line in scenario.render_timeline(result.records, schedule, width=width):
            print("  " + line, file=out)
        print(file=out)
        lines = lock_demo.render_summary(summary)
        lines[1] = lines[1].replace("start times and fencing tokens", "start times")
        for line in lines:
            print(line, file=out)
        print(
            f"  workers waiting on a turn:     {waited:.3f} s in all (a worker is only handed a"
            " webhook it can run now)",
            file=out,
        )
    return _common.EXIT_OK if summary.ok else _common.EXIT_FAILURE
