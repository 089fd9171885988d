#!/usr/bin/env python3
"""Every benchmark, one after the other: regenerates ``benchmarks/results/*.md`` and their
PNG plots (each results file records the exact command of its own script).

    python benchmarks/run_all.py                  # full runs, writes benchmarks/results/
    python benchmarks/run_all.py --quick          # tiny sizes, into a temporary folder
    python benchmarks/run_all.py --only redis,http --results /tmp/r

Servers: the lock benchmarks start their own (``bench_redis.py``, ``bench_postgres.py``,
``bench_scale.py``); ``bench_queue.py`` and ``bench_http.py`` use
``$TURNSTILE_TEST_REDIS_URL`` / ``$TURNSTILE_TEST_POSTGRES_URL`` when set. A script whose
server cannot be had exits with status 77 and is reported as skipped. The exit status is
the worst of the scripts' (77 counts as success).
"""

from __future__ import annotations

import argparse
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from turnstile_bench.servers import exit_on_signals

HERE = Path(__file__).resolve().parent
SKIP_EXIT = 77
# Cheap first: a failure in a quick one shows before the long ones run.
ORDER = ("sqlite", "queue", "http", "postgres", "redis", "scale")


def scripts(only: str | None) -> list[Path]:
    found = {p.stem.removeprefix("bench_"): p for p in HERE.glob("bench_*.py")}
    names = [n for n in ORDER if n in found] + sorted(set(found) - set(ORDER))
    if only:
        wanted = [n.strip() for n in only.split(",") if n.strip()]
        unknown = [n for n in wanted if n not in found]
        if unknown:
            raise SystemExit(f"--only: no benchmark named {', '.join(unknown)} "
                             f"(known: {', '.join(names)})")
        names = [n for n in names if n in wanted]
    return [found[n] for n in names]


def _run(cmd: list[str]) -> int:
    """Run one script; if this run is stopped meanwhile (Ctrl-C, SIGTERM), stop the script
    the same way and let it clean up (its servers, scratch folders and data), which a
    SIGKILL would not."""
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL)
    try:
        return proc.wait()
    except BaseException:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        raise


def main(argv: list[str] | None = None) -> int:
    exit_on_signals()
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true",
                        help="tiny sizes; results go to a temporary folder unless --results")
    parser.add_argument("--results", type=Path, default=None,
                        help="folder for the results files and plots (default: "
                        "benchmarks/results for a full run)")
    parser.add_argument("--only", help="comma-separated names (sqlite,queue,http,...)")
    parser.add_argument("--tmpdir", help="passed on to every script")
    args = parser.parse_args(argv)
    chosen = scripts(args.only)
    with tempfile.TemporaryDirectory(prefix="turnstile-bench-all-") as scratch:
        folder = args.results or (Path(scratch) if args.quick else HERE / "results")
        folder.mkdir(parents=True, exist_ok=True)
        worst = 0
        summary = []
        for script in chosen:
            name = script.stem.removeprefix("bench_")
            cmd = [sys.executable, str(script)]
            if folder != HERE / "results":  # else the default, and the recorded command is short
                cmd += ["--output", str(folder / f"{name}.md")]
            if args.quick:
                cmd.append("--quick")
            if args.tmpdir:
                cmd += ["--tmpdir", args.tmpdir]
            print(f"== {name}: {' '.join(cmd[1:])}", file=sys.stderr, flush=True)
            started = time.monotonic()
            code = _run(cmd)
            took = time.monotonic() - started
            state = {0: "ok", SKIP_EXIT: "skipped (server not available)"}.get(
                code, f"FAILED (exit {code})")
            summary.append(f"{name:10} {state:32} {took:6.0f} s")
            if code not in (0, SKIP_EXIT):
                worst = max(worst, code)
        print("\n".join(["", *summary]), file=sys.stderr)
        pngs = sorted(p.name for p in folder.glob("*.png"))
        print(f"{folder}: {len(pngs)} plots", file=sys.stderr)
    return worst


if __name__ == "__main__":
    sys.exit(main())
