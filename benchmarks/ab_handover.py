#!/usr/bin/env python3
"""Hand-over latency of two or more source trees of Turnstile on one Redis, in alternating
runs: an A/B tool for a change to the wake-up path, not one of the benchmarks that
``run_all.py`` regenerates.

    git worktree add /tmp/before <commit>
    python benchmarks/ab_handover.py /tmp/before/src src src:nolead --processes 3,9

Each run starts ``P`` processes that take turns on one lock (acquire, 2 ms of work,
release) ``--cycles`` times each; the figure is the time from the moment a holder calls
``release()`` to the moment another process's ``acquire()`` returns (p50 and p90, ms), as
the benchmarks' hand-over gap. The trees run one after the other, ``--rounds`` times over,
so that a machine whose speed drifts affects them alike. ``TREE:nolead`` runs ``TREE`` with
the PING the release sends ahead of its script switched off (see
``RedisConnection._call``), to measure what that PING buys.

The server is ``--url`` (default ``redis://127.0.0.1:6379/0``); keys go under the prefix
``tt-ab-<random>:`` and are deleted at the end. With a PostgreSQL URL
(``postgresql://...``) the runs use a schema of their own, ``tt_ab_<random>``, dropped at
the end (``:nolead`` is Redis only).
"""

from __future__ import annotations

import argparse
import itertools
import multiprocessing as mp
import os
import queue
import secrets
import statistics
import sys
import time
from typing import Any


def _worker(src: str, nolead: bool, url: str, name: str, cycles: int, q: Any, go: Any) -> None:
    sys.path.insert(0, src)
    import turnstile

    client = turnstile.connect(url)
    if nolead:
        backend: Any = client.backend
        run = backend._run

        def no_lead(op: str, name: str, args: list[Any], *, lead: bool = False, **kw: Any) -> Any:
            return run(op, name, args, **kw)

        backend._run = no_lead
    lock = client.lock(name, ttl=30)
    lock.acquire(timeout=30).release()  # scripts loaded, the subscriber connection opened
    go.wait()
    out = []
    for _ in range(cycles):
        lease = lock.acquire(timeout=30)
        started = time.monotonic()
        time.sleep(0.002)
        ended = time.monotonic()
        lease.release()
        out.append((started, ended, os.getpid()))
    q.put(out)
    client.close()


def run_once(tree: str, url: str, processes: int, cycles: int) -> list[float]:
    src, _, variant = tree.partition(":")
    name = f"ab-{secrets.token_hex(4)}"
    ctx = mp.get_context("spawn")
    q, go = ctx.Queue(), ctx.Event()
    procs = [
        ctx.Process(
            target=_worker,
            args=(os.path.abspath(src), variant == "nolead", url, name, cycles, q, go),
        )
        for _ in range(processes)
    ]
    for p in procs:
        p.start()
    time.sleep(2.0)  # every process connected and warmed up
    go.set()
    events = []
    deadline = time.monotonic() + 300
    while len(events) < processes * cycles:
        try:
            events += q.get(timeout=1.0)
        except queue.Empty:
            failed = [p.exitcode for p in procs if p.exitcode not in (None, 0)]
            if failed or time.monotonic() > deadline:
                for p in procs:
                    p.kill()
                raise SystemExit(
                    f"{tree}: a worker failed (exit codes {failed})"
                    if failed
                    else f"{tree}: no result within 300 s"
                ) from None
    for p in procs:
        p.join(30)
    events.sort()
    return sorted(b[0] - a[1] for a, b in itertools.pairwise(events) if a[2] != b[2])


def _clean_up(url: str, postgres: bool, prefix: str, schema: str) -> None:
    """Delete what the runs made: the keys under ``prefix``, or the schema ``schema``."""
    if postgres:
        import psycopg

        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
        return
    import redis

    r = redis.Redis.from_url(url)
    for key in r.scan_iter(match=f"{prefix}*", count=1000):
        r.delete(key)
    r.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("trees", nargs="+", help="src folders; TREE:nolead for no lead PING")
    parser.add_argument("--url", default="redis://127.0.0.1:6379/0")
    parser.add_argument("--processes", default="3,9")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--cycles", type=int, default=200)
    args = parser.parse_args()
    postgres = args.url.startswith(("postgresql:", "postgres:"))
    if postgres and any(tree.endswith(":nolead") for tree in args.trees):
        parser.error(":nolead measures the Redis release's lead PING: not on PostgreSQL")
    prefix = f"tt-ab-{secrets.token_hex(3)}:"
    schema = f"tt_ab_{secrets.token_hex(3)}"
    sep = "&" if "?" in args.url else "?"
    url = f"{args.url}{sep}schema={schema}" if postgres else f"{args.url}{sep}prefix={prefix}"
    rows = []
    try:
        for processes in [int(p) for p in args.processes.split(",")]:
            for rnd in range(args.rounds):
                for tree in args.trees:
                    gaps = run_once(tree, url, processes, args.cycles)
                    p50 = statistics.median(gaps) * 1000
                    p90 = gaps[int(len(gaps) * 0.9)] * 1000
                    rows.append((processes, rnd + 1, tree, p50, p90, len(gaps)))
                    print(
                        f"{processes} procs  round {rnd + 1}  {tree}: p50 {p50:.3f} ms",
                        file=sys.stderr,
                    )
    finally:
        _clean_up(args.url, postgres, prefix, schema)
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"- command: `python benchmarks/ab_handover.py {' '.join(sys.argv[1:])}`")
    print(f"- load average at the end: {load}")
    print()
    print(
        "| processes | round | tree | release called → next holder starts, p50 ms | p90 ms |"
        " hand-overs |"
    )
    print("|---:|---:|---|---:|---:|---:|")
    for processes, rnd, tree, p50, p90, n in rows:
        print(f"| {processes} | {rnd} | {tree} | {p50:.3f} | {p90:.3f} | {n} |")


if __name__ == "__main__":
    main()
