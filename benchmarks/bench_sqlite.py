#!/usr/bin/env python3
"""Turnstile's embedded SQLite backend beside `filelock` and the SPEC's naive polling lock row.

    python benchmarks/bench_sqlite.py            # full run, writes benchmarks/results/sqlite.md
    python benchmarks/bench_sqlite.py --quick    # tiny sizes, < 60 s, writes nothing (CI)
    python benchmarks/bench_sqlite.py --json     # results as JSON on stdout

All contenders run in one run on the same machine, each scenario on real processes (see
turnstile_bench/). Every lock's files live in a fresh temporary directory, removed afterwards.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import sqlite3
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from turnstile_bench import (
    Contender,
    HandoverResult,
    LockBench,
    Sizes,
    TurnstileLock,
    UncontendedResult,
    command_line,
    fmt,
    handover_table,
    machine_lines,
    main,
    no_overlaps,
    uncontended_section,
    webhook_table,
)
from turnstile_bench.adapters import FileLockAdapter, NaiveRowLock
from turnstile_bench.servers import scratch_folder

BASELINE = "filelock"
TURNSTILE = "turnstile sqlite"
BARE = "turnstile sqlite, no renewer"
PAGES_4K = "turnstile sqlite, 4 KiB pages"
TARGET_HANDOVER_P50_MS = 2.0


def contenders(folder: Path) -> list[Contender]:
    locks = folder / "filelocks"
    locks.mkdir()
    naive = str(folder / "naive.db")
    NaiveRowLock.create_table(naive)
    url = f"sqlite:///{folder / 'turnstile.db'}"
    return [
        Contender(
            TURNSTILE,
            functools.partial(TurnstileLock, url),
            "`with lock.acquire():` — lease renewed in the background while held",
        ),
        Contender(
            BARE,
            functools.partial(TurnstileLock, url, renew=False),
            "bare `acquire()` / `release()`, no background renewal",
        ),
        Contender(BASELINE, functools.partial(FileLockAdapter, str(locks)), "`FileLock`"),
        Contender(
            "naive row (1 s poll)",
            functools.partial(NaiveRowLock, naive),
            "row per lock, checked in a transaction, polled once a second",
        ),
    ]


def default_pages(folder: Path) -> Contender:
    """Turnstile on a file made with SQLite's default 4 KiB pages (as files made before
    Turnstile chose 1 KiB pages are): what the page size is worth, in the same run."""
    path = folder / "turnstile-4k.db"
    with contextlib.closing(sqlite3.connect(path)) as conn:
        conn.execute("PRAGMA page_size = 4096")
        conn.execute("PRAGMA journal_mode = WAL")
    return Contender(
        PAGES_4K,
        functools.partial(TurnstileLock, f"sqlite:///{path}"),
        "as the first, on a file with SQLite's default 4 KiB pages (Turnstile makes new "
        "files with 1 KiB pages)",
    )


class SqliteBench(LockBench):
    name = "sqlite"
    description = (__doc__ or "").split("\n")[0]
    packages = ("turnstile", "filelock")
    tmpdir_help = "where to create the database and lock files"

    def target(self, args: argparse.Namespace, info: dict[str, Any]) -> Any:
        info["sqlite"] = sqlite3.sqlite_version
        info["versions"]["SQLite"] = sqlite3.sqlite_version
        return scratch_folder(args.tmpdir)

    def run(self, args: argparse.Namespace, folder: Path) -> dict[str, Any]:
        main = contenders(folder)
        everyone = [*main[:2], default_pages(folder), *main[2:]]
        quick = args.quick
        sizes = Sizes(
            iterations=200 if quick else 2000,
            seconds=0.5 if quick else 3.0,
            trials=1 if quick else 5,
            waiters=(3,),
            rounds=lambda _processes: 4 if quick else 50,
            handover_seconds=2.5 if quick else 20.0,
            webhook_trials=(1,) if quick else (args.trials, args.trials),
        )
        return {
            "contenders": [{"label": c.label, "note": c.note} for c in everyone],
            **self.run_locks(args, main, sizes, uncontended=everyone),
        }

    def markdown(
        self, results: dict[str, Any], args: argparse.Namespace, info: dict[str, Any]
    ) -> str:
        return markdown(results, args, info)

    def sane(self, results: dict[str, Any]) -> bool:
        return no_overlaps(results)


def interpretation(results: dict[str, Any]) -> list[str]:
    """Generated from the numbers of this run."""
    unc: dict[str, UncontendedResult] = {r.label: r for r in results["uncontended"]}
    hand: dict[str, HandoverResult] = {r.label: r for r in results["handover"]}
    ts, fl = hand[TURNSTILE], hand[BASELINE]
    naive = next(r for label, r in hand.items() if label.startswith("naive"))
    lines = []
    met = ts.gap_p50_ms <= TARGET_HANDOVER_P50_MS
    lines.append(
        f"- **Handover p50 ≤ {TARGET_HANDOVER_P50_MS:g} ms: {'met' if met else 'missed'}.** "
        f"Turnstile hands the lock to another process in {fmt(ts.gap_p50_ms)} ms (p50; "
        f"p99 {fmt(ts.gap_p99_ms)} ms): the release's transaction grants the next waiter in "
        f"line and sends it one datagram. filelock: {fmt(fl.gap_p50_ms)} ms — a blocked "
        f"`FileLock` retries `flock` every 50 ms; the naive row: {fmt(naive.gap_p50_ms)} ms "
        "(a waiter looks again once a second)."
    )
    if BARE in hand:
        nb = hand[BARE]
        lines[-1] += (
            f" Bare `acquire()`/`release()`, not handed to the client's renewer as a `with` "
            f"block does: p50 {fmt(nb.gap_p50_ms)} ms, p99 {fmt(nb.gap_p99_ms)} ms."
        )
    lines.append(
        f"- **Fairness.** Turnstile: {ts.to_other} of {ts.handovers} handovers to another "
        f"process, longest streak {ts.longest_streak}, {ts.fifo_violations} FIFO violations. "
        f"filelock: {fl.to_other} of {fl.handovers}, streak {fl.longest_streak}, "
        f"{fl.fifo_violations} violations — whoever polls first wins, and the releaser, "
        "asking again at once, often takes its lock straight back. "
        f"Overlaps (must be 0): {ts.overlaps} / {fl.overlaps} / {naive.overlaps}."
    )
    t, b = unc[TURNSTILE], unc[BASELINE]
    bare = unc.get(BARE)
    ok = t.ops_per_s >= b.ops_per_s
    text = (
        f"- **Uncontended ≥ filelock: {'met' if ok else 'missed'}.** Turnstile "
        f"{fmt(t.ops_per_s)} acquire+release/s vs filelock {fmt(b.ops_per_s)}/s "
        f"({fmt(t.ops_per_s / b.ops_per_s)}x)."
    )
    if bare is not None:
        text += (
            f" Without the background renewer (bare `acquire()`/`release()`) Turnstile does "
            f"{fmt(bare.ops_per_s)}/s: "
        )
        if bare.ops_per_s > 1.3 * t.ops_per_s:
            text += (
                "handing the lease to the client's renewer in each `with` block costs more "
                "than the two SQLite transactions themselves."
            )
        else:
            text += (
                "the renewer is not what limits it (a `with` block only puts the lease in the "
                "heap of the client's one long-lived renewer thread)."
            )
    text += (
        " Each Turnstile acquire and release is a `BEGIN IMMEDIATE` transaction that "
        "reads the name's rows, runs the state machine and writes the changed rows (6 "
        "statements each on an idle name); the `COMMIT`s append every changed page to the "
        "WAL (3 pages for an acquire: fencing counter, holder, name; 2 for a release), so "
        "Turnstile makes new files with 1 KiB pages, a quarter of SQLite's default. "
        "`filelock` is one `open` + `flock` + `close`, and keeps no lease, line or token."
    )
    pages = unc.get(PAGES_4K)
    if pages is not None:
        text += (
            f" The same `with` block on a file with 4 KiB pages: {fmt(pages.ops_per_s)}/s "
            f"(with 1 KiB pages Turnstile does {fmt(t.ops_per_s / pages.ops_per_s)}x that)."
        )
    if ok and t.ops_per_s < 1.1 * b.ops_per_s:
        text += (
            " The margin is within the spread of the trials on a shared machine: read it as "
            "on a par."
        )
    if not ok:
        fixes = []
        if bare is not None and bare.ops_per_s > 1.3 * t.ops_per_s:
            fixes.append(
                "find what makes the `with` figure trail the bare one (with one long-lived "
                "renewer per client it should only cost a heap push and a lock)"
            )
        if bare is None or bare.ops_per_s < b.ops_per_s:
            fixes.append(
                "fewer pages written per transaction (a schema that keeps a name's limit and "
                "last token on its holder rows would write one page per acquire and release "
                "instead of three and two), and fewer Python-level statements (the whole "
                "acquire as one SQL statement for the common idle-name case)"
            )
        if fixes:
            text += " What would close the gap: " + "; and ".join(fixes) + "."
    lines.append(text)
    for group in results["webhooks"]:
        by = {r.label: r for r in group}
        t, f = by[TURNSTILE], by[BASELINE]
        n = next(r for label, r in by.items() if label.startswith("naive"))
        lines.append(
            f"- **Webhooks, {t.scenario}, {t.workers} workers, {fmt(t.work_ms, 0)} ms each.** "
            f"A perfect zero-overhead FIFO lock would reach efficiency "
            f"{fmt(t.bound_efficiency)}. Turnstile {fmt(t.efficiency)} "
            f"({fmt(t.vs_bound)} of that bound, {t.order_violations} of {t.events} out of "
            f"order), filelock {fmt(f.efficiency)} ({f.order_violations} out of order), "
            f"naive row {fmt(n.efficiency)} ({n.order_violations} out of order"
            + (f", {n.failed} timed out" if n.failed else "")
            + ")."
        )
        if BARE in by:
            lines[-1] += (
                f" Turnstile without the renewer: {fmt(by[BARE].efficiency)} "
                f"({fmt(by[BARE].vs_bound)} of the bound)."
            )
        if t.order_violations and not t.lock_fifo_violations:
            lines[-1] += (
                f" Turnstile's {t.order_violations} out-of-order webhook(s) came from workers "
                "that called acquire within the 1 ms tolerance of each other (0 lock FIFO "
                "violations): two workers took consecutive webhooks of one order at nearly the "
                "same instant and the later one reached the lock first."
            )
    return lines



def markdown(results: dict[str, Any], args: argparse.Namespace, info: dict[str, Any]) -> str:
    command = command_line("bench_sqlite.py", args.argv)
    out = ["# Turnstile SQLite backend vs filelock vs a naive polling lock row", ""]
    out += machine_lines(info, command)
    out += [
        f"- database files in a fresh directory under `{args.tmpdir or tempfile.gettempdir()}`"
        " (removed afterwards)",
        "",
        "Contenders:",
        "",
    ]
    out += [f"- **{c['label']}** — {c['note']}" for c in results["contenders"]]
    out += ["", "## Interpretation", ""]
    out += interpretation(results)
    out += uncontended_section(results["uncontended"], BASELINE)
    h = results["handover"][0]
    out += [
        f"## Handover: {h.processes} processes, one name, {fmt(h.hold_ms, 0)} ms critical sections",
        "",
        "Gap = end of one critical section to the start of the next one in *another* process "
        "(includes the release call and the wake-up). FIFO violation = a grant to a process "
        "that started waiting more than "
        f"{fmt(h.fifo_tolerance_ms, 0)} ms after another process still waiting. Slow locks "
        "stop starting rounds after the time budget, hence fewer grants.",
        "",
        handover_table(results["handover"], BASELINE),
        "",
    ]
    for group in results["webhooks"]:
        r = group[0]
        out += [
            f"## Webhooks: {r.scenario}, {r.workers} workers, {fmt(r.work_ms, 0)} ms of work",
            "",
            f"Ideal makespan {fmt(r.ideal_s, 3)} s (total work / workers, at least the longest "
            "order). Efficiency = ideal / makespan; *perfect FIFO lock* = the efficiency of a "
            "zero-overhead strictly-FIFO lock on the same arrivals (workers that wait behind a "
            "busy order sit idle, so it stays below 1). Out of order = webhooks that ran "
            "before an earlier-arrived webhook of the same order. Each row is the contender's "
            "trial of median efficiency; the last column lists every trial.",
            "",
            webhook_table(group, BASELINE),
            "",
        ]
    return "\n".join(out)


if __name__ == "__main__":
    sys.exit(main(SqliteBench()))
