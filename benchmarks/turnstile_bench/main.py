"""The one ``main`` every ``benchmarks/bench_*.py`` runs: common options, the servers the
script declares, the run, the results file, JSON, the exit status.

A script subclasses :class:`Bench` (a queue benchmark) or :class:`LockBench` (the lock
scenarios on its contenders) and ends with ``sys.exit(main(TheBench()))``.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import math
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import plots
from .adapters import Contender
from .report import command_line, machine_info, to_json, write
from .scenarios import (
    HandoverResult,
    WebhookResult,
    WebhookScenario,
    demo_notation,
    run_handover,
    run_uncontended,
    run_webhooks,
)
from .servers import Unavailable, exit_on_signals
from .workers import progress

SKIP_EXIT = 77  # "my server is not configured here": tests/test_benchmarks.py then skips
RESULTS = Path(__file__).resolve().parents[1] / "results"


class Bench:
    """What a benchmark script declares. ``name`` gives the script (``bench_<name>.py``) and
    the results file of a full run (``results/<name>.md``)."""

    name = ""
    description = ""
    packages: Sequence[str] = ()  # versions named in the header
    requires: Sequence[tuple[str, str]] = ()  # (module, what to install): exit 77 without it
    tmpdir_help = "where to create the benchmark's files"
    json_writes_results = True  # a full run with --json also writes results/<name>.md

    @property
    def script(self) -> str:
        return f"bench_{self.name}.py"

    def options(self, parser: argparse.ArgumentParser) -> None:
        """The script's own options."""

    def target(self, args: argparse.Namespace, info: dict[str, Any]) -> Any:
        """A context manager yielding what :meth:`run` runs on (servers, URLs, folders); it
        may add to ``info`` and raise :class:`servers.Unavailable`."""
        return contextlib.nullcontext()

    def run(self, args: argparse.Namespace, target: Any) -> dict[str, Any]:
        raise NotImplementedError

    def markdown(
        self, results: dict[str, Any], args: argparse.Namespace, info: dict[str, Any]
    ) -> str:
        raise NotImplementedError

    def finish(self, info: dict[str, Any]) -> None:
        """Adds to ``info`` once the run is over."""

    def footer(self, info: dict[str, Any]) -> str:
        return f"\nThe whole run took {info['seconds']:.0f} s.\n"

    def as_json(self, results: dict[str, Any], info: dict[str, Any]) -> str:
        return to_json({"machine": info, **results})

    def sane(self, results: dict[str, Any]) -> bool:
        """Correctness, not speed: the exit status is 1 when this is false."""
        return True


def main(bench: Bench, argv: Sequence[str] | None = None) -> int:
    exit_on_signals()
    parser = argparse.ArgumentParser(
        description=bench.description, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="tiny sizes (< 60 s), no file")
    parser.add_argument("--json", action="store_true", help="print results as JSON")
    parser.add_argument(
        "--output",
        type=Path,
        help=f"write the Markdown here (default for a full run: results/{bench.name}.md)",
    )
    parser.add_argument("--tmpdir", help=bench.tmpdir_help)
    bench.options(parser)
    args = parser.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)
    for module, install in bench.requires:
        if importlib.util.find_spec(module) is None:
            print(f"{module} is not installed: {install}", file=sys.stderr)
            return SKIP_EXIT
    info = machine_info(bench.packages)  # before the run: the load at its start
    started = time.monotonic()
    try:
        with bench.target(args, info) as target:
            results = bench.run(args, target)
    except Unavailable as exc:
        print(exc, file=sys.stderr)
        return SKIP_EXIT
    info["seconds"] = round(time.monotonic() - started, 1)
    bench.finish(info)
    output = args.output
    if output is None and not args.quick and (bench.json_writes_results or not args.json):
        output = RESULTS / f"{bench.name}.md"
    text = bench.markdown(results, args, info)
    if output is not None:  # the plots go beside the results file, which links them
        output.parent.mkdir(parents=True, exist_ok=True)
        text += plots.markdown_links(plots.draw(results, output))
    text += bench.footer(info)
    write(output, text)
    print(bench.as_json(results, info) if args.json else text)
    return 0 if bench.sane(results) else 1


# -- the lock benchmarks -----------------------------------------------------------------------
@dataclass(frozen=True)
class Sizes:
    """How much of each lock scenario a run does."""

    iterations: int  # uncontended: acquire + release pairs per trial ...
    seconds: float  # ... or at most this long
    trials: int  # uncontended trials
    waiters: Sequence[int]  # one handover run per entry (processes = waiters + 1)
    rounds: Callable[[int], int]  # processes -> rounds of each
    handover_seconds: float  # no process starts a round after this
    webhook_trials: Sequence[int]  # the demo's webhooks, then (if given) the random ones
    handover_trials: int = 1  # runs of each handover size, interleaved over the contenders


class LockBench(Bench):
    """The three lock scenarios on the contenders a script declares."""

    trials_option = True  # --trials (runs of each webhook scenario)

    def options(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--demo", default=demo_notation(), help="the demo's webhooks")
        parser.add_argument("--demo-workers", type=int, default=3)
        parser.add_argument("--orders", type=int, default=20)
        parser.add_argument("--per-order", type=int, default=10)
        parser.add_argument("--workers", type=int, default=8)
        parser.add_argument("--seed", type=int, default=1)
        parser.add_argument("--work", type=float, default=0.02, help="seconds per webhook")
        if self.trials_option:
            parser.add_argument(
                "--trials", type=int, default=3, help="runs of each webhook scenario"
            )

    def run_locks(
        self,
        args: argparse.Namespace,
        contenders: Sequence[Contender],
        sizes: Sizes,
        uncontended: Sequence[Contender] | None = None,
        webhooks: Sequence[Contender] | None = None,
    ) -> dict[str, Any]:
        """Uncontended (on ``uncontended``, default all), handover, and webhooks (on
        ``webhooks``, default all)."""
        progress("uncontended acquire + release")
        unc = run_uncontended(
            contenders if uncontended is None else uncontended,
            iterations=sizes.iterations,
            max_seconds=sizes.seconds,
            trials=sizes.trials,
        )
        handover: list[HandoverResult] = []
        for waiters in sizes.waiters:
            progress(f"handover, {waiters} waiters")
            processes = waiters + 1
            handover += run_handover(
                contenders,
                processes=processes,
                rounds=sizes.rounds(processes),
                hold=0.002,
                max_seconds=sizes.handover_seconds,
                trials=sizes.handover_trials,
            )
        scenarios = [
            (WebhookScenario.parse(args.demo, work=args.work), args.demo_workers),
            (
                WebhookScenario.random(args.orders, args.per_order, seed=args.seed, work=args.work),
                args.workers,
            ),
        ]
        hooks: list[list[WebhookResult]] = []
        for (scenario, workers), trials in zip(scenarios, sizes.webhook_trials, strict=False):
            progress(f"webhooks: {scenario.name}")
            hooks.append(
                run_webhooks(
                    contenders if webhooks is None else webhooks,
                    scenario,
                    workers=workers,
                    trials=trials,
                )
            )
        return {"uncontended": unc, "handover": handover, "webhooks": hooks}


def no_overlaps(results: dict[str, Any], only: str = "", rates: bool = True) -> bool:
    """No lock (whose label starts with ``only``) let two critical sections overlap, and
    (``rates``) every uncontended run measured a rate."""
    runs = [*results["handover"], *(r for group in results["webhooks"] for r in group)]
    bad = [r for r in runs if r.overlaps and r.label.startswith(only)]
    if bad:
        print("OVERLAPPING CRITICAL SECTIONS: a lock is broken", file=sys.stderr)
    nan = rates and any(math.isnan(r.ops_per_s) for r in results["uncontended"])
    return not bad and not nan


__all__ = ["SKIP_EXIT", "Bench", "LockBench", "Sizes", "command_line", "main", "no_overlaps"]
