#!/usr/bin/env python3
"""Turnstile on Redis beside the Redis lock libraries people use, and pg_advisory_lock.

    python benchmarks/bench_redis.py            # full run, writes benchmarks/results/redis.md
    python benchmarks/bench_redis.py --quick    # tiny sizes, < 60 s, writes nothing (CI)
    python benchmarks/bench_redis.py --json     # results as JSON on stdout

Contenders: Turnstile (``redis://``), redis-py ``Lock``, python-redis-lock, pottery
``Redlock``, sherlock ``RedisLock``, portalocker ``RedisLock`` and PostgreSQL
``pg_advisory_lock`` (the fast-and-fair reference). The peer libraries come with the
``bench`` dependency group of pyproject.toml (``scripts/dev.py`` installs it); one that is
not installed is left out and named in the results.

By default the script starts its own ``redis-server`` (found on PATH) on a free port in a
temporary folder, so ``INFO commandstats`` counts this benchmark's commands only, and stops it
afterwards. ``--redis-url`` uses another server instead (keys under a fresh ``bench-…``
prefix, deleted afterwards; counters then include other clients' traffic). PostgreSQL comes
from ``--postgres-url``, else ``$TURNSTILE_TEST_POSTGRES_URL``, else
``postgresql://postgres@127.0.0.1:5432/postgres``; advisory locks write no data. Without a
reachable PostgreSQL that row is left out. Exit status 77 when there is no redis-server.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import importlib.util
import math
import os
import secrets
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from turnstile_bench import (
    Contender,
    HandoverResult,
    LockAdapter,
    LockBench,
    Sizes,
    TurnstileLock,
    UncontendedResult,
    by_waiters,
    command_line,
    fmt,
    fmt_against,
    fmt_trials,
    handover_table,
    handover_trials_note,
    machine_lines,
    main,
    markdown_table,
    no_overlaps,
    uncontended_section,
    webhook_table,
)
from turnstile_bench.adapters import (
    CommandCounter,
    PgAdvisoryLock,
    PortalockerRedisLock,
    PotteryRedlock,
    PythonRedisLock,
    RedisPyLock,
    SherlockLock,
)
from turnstile_bench.servers import delete_redis_keys, own_redis, scratch_folder
from turnstile_bench.workers import progress

TURNSTILE = "turnstile redis"
BARE = "turnstile redis, no renewer"
REDIS_PY = "redis-py Lock"
PRL = "python-redis-lock"
PG = "pg_advisory_lock"
WAITERS_FULL = (2, 8, 32)
WAITERS_QUICK = (2,)


# -- servers and contenders ----------------------------------------------------------------------
def postgres_url(args: argparse.Namespace) -> str | None:
    url = (
        args.postgres_url
        or os.environ.get("TURNSTILE_TEST_POSTGRES_URL")
        or "postgresql://postgres@127.0.0.1:5432/postgres"
    )
    try:
        import psycopg

        with psycopg.connect(url, connect_timeout=3) as conn:
            conn.execute("SELECT 1")
        return url
    except Exception as exc:  # any failure just leaves the row out
        print(f"pg_advisory_lock left out: {exc}", file=sys.stderr)
        return None


PEERS: list[tuple[str, type[LockAdapter], str, str]] = [
    (REDIS_PY, RedisPyLock, "redis", "`redis.lock(name, timeout=30)`, default 0.1 s sleep-poll"),
    (PRL, PythonRedisLock, "redis_lock", "`redis_lock.Lock(r, name, expire=30)`: BLPOP signal"),
    (
        "pottery Redlock",
        PotteryRedlock,
        "pottery",
        "`Redlock(key=name, masters={r}, auto_release_time=30)` on one master",
    ),
    ("sherlock", SherlockLock, "sherlock", "`sherlock.RedisLock(name, client=r, expire=30)`"),
    (
        "portalocker RedisLock",
        PortalockerRedisLock,
        "portalocker",
        "`portalocker.RedisLock(name, connection=r)`: pub/sub subscription",
    ),
]


def contenders(
    redis_url: str, prefix: str, pg_url: str | None, counted: bool
) -> tuple[list[Contender], list[str]]:
    probe = CommandCounter(redis_url) if counted else None
    turnstile_url = f"{redis_url}?prefix={prefix}"
    found = [
        Contender(
            TURNSTILE,
            functools.partial(TurnstileLock, turnstile_url),
            "`with lock.acquire():` — lease renewed in the background while held",
            probe,
        ),
        Contender(
            BARE,
            functools.partial(TurnstileLock, turnstile_url, renew=False),
            "bare `acquire()` / `release()`, no background renewal",
            probe,
        ),
    ]
    missing = []
    for label, cls, module, note in PEERS:
        if importlib.util.find_spec(module) is None:
            missing.append(f"{label} (module `{module}` not installed)")
            continue
        found.append(Contender(label, functools.partial(cls, redis_url, prefix), note, probe))
    if pg_url is not None:
        found.append(
            Contender(
                PG,
                functools.partial(PgAdvisoryLock, pg_url),
                "`SELECT pg_advisory_lock(key)` / `pg_advisory_unlock` on a session "
                "(PostgreSQL's own wait queue; no lease, no fencing)",
            )
        )
    else:
        missing.append(f"{PG} (no PostgreSQL reachable)")
    return found, missing


# -- reporting --------------------------------------------------------------------------------
def commands_table(results: list[HandoverResult]) -> str:
    """Redis commands per grant by number of waiters, for every Redis contender."""
    groups = by_waiters(results)
    labels = [r.label for r in results if r.per_grant and r.processes == results[0].processes]
    headers = ["lock"]
    for waiters in groups:
        headers += [f"{waiters} waiters: commands / grant", "EVALSHA + FCALL", "BLPOP"]
    rows = []
    for label in labels:
        row: list[Any] = [label]
        for group in groups.values():
            r = group.get(label)
            pg = r.per_grant if r is not None else {}
            row += [
                pg.get("Redis commands", math.nan),
                pg.get("scripts", math.nan),
                pg.get("BLPOP", math.nan),
            ]
        rows.append(row)
    return markdown_table(headers, rows)


def interpretation(results: dict[str, Any]) -> list[str]:
    """Generated from the numbers of this run."""
    lines: list[str] = []
    unc: dict[str, UncontendedResult] = {r.label: r for r in results["uncontended"]}
    groups = by_waiters(results["handover"])
    # Handover speed and fairness, beside the fastest Redis peer and the server queue.
    for waiters, by in groups.items():
        tw = by[TURNSTILE]
        ts = by.get(BARE, tw)
        parts = [
            f"**{waiters} waiters.** Turnstile hands over in {fmt(tw.gap_p50_ms)} ms p50 "
            f"(p99 {fmt(tw.gap_p99_ms)}; bare acquire/release {fmt(ts.gap_p50_ms)} / "
            f"{fmt(ts.gap_p99_ms)}), {tw.to_other} of {tw.handovers} handovers to another "
            f"process, longest streak {tw.longest_streak}, {tw.fifo_violations} FIFO violations"
        ]
        for label in (PRL, PG, REDIS_PY):
            if label in by:
                r = by[label]
                parts.append(
                    f"{label}: {fmt(r.gap_p50_ms)} ms p50, {r.to_other} of {r.handovers} to "
                    f"another process, streak {r.longest_streak}, {r.fifo_violations} FIFO "
                    "violations"
                )
        lines.append("- " + "; ".join(parts) + ".")
    lines += ["", "Targets:", ""]
    for waiters, by in groups.items():
        if PRL not in by:
            continue
        tw, prl = by[TURNSTILE], by[PRL]
        ts = by.get(BARE, tw)
        met_with = tw.gap_p50_ms <= prl.gap_p50_ms
        met_bare = ts.gap_p50_ms <= prl.gap_p50_ms
        verdict = "met" if met_with else ("met by bare acquire/release" if met_bare else "missed")
        d = fmt_against(prl.gap_p50_ms, tw.gap_p50_ms, ts.gap_p50_ms)
        text = (
            f"- Handover p50 no worse than python-redis-lock's, {waiters} waiters: "
            f"**{verdict}** ({fmt(tw.gap_p50_ms, d)} ms in a `with` block, "
            f"{fmt(ts.gap_p50_ms, d)} ms bare, vs {fmt(prl.gap_p50_ms, d)} ms; "
            f"python-redis-lock handed {prl.handovers - prl.to_other} of {prl.handovers} "
            "successions back to the releaser, which are not in its figure"
            + (
                f"; trial by trial {fmt_trials(tw.trials)} ms against {fmt_trials(prl.trials)}"
                if len(tw.trials) > 1 and len(tw.trials) == len(prl.trials)
                else ""
            )
            + ")."
        )
        if not met_with and met_bare:
            text += (
                " The `with` row adds registering the new lease with the client's one "
                "renewer (a timer heap) before its block begins, and the measurement noise "
                "of 2 shared cores."
            )
        elif not met_bare:
            if met_with:
                text += " Bare acquire/release missed it in this run."
            text += (
                " Both hand over in one round trip after the release: Turnstile's waiter "
                "holds the grant its wake-up carries, python-redis-lock's then sends a SET "
                "NX. Turnstile's release keeps a line, leases and a fencing counter (5 "
                "commands inside its function, against 3 in python-redis-lock's script)"
            )
            steps = results.get("costs", {}).get("steps", {})
            release = steps.get("release, hands over to the waiter")
            scripted = steps.get("release, hands over to the waiter" + _AS_SCRIPT)
            if release and scripted:
                text += (
                    f": it ran {fmt(release['p50_us'], 0)} µs on the server (p50, *Server "
                    "time per step* below) as a function of Turnstile's Redis 7 library, "
                    f"{fmt(scripted['p50_us'], 0)} µs as a script, which makes the library's "
                    "helper functions at every call. Against "
                    f"{'the bare row' if met_with else 'a'} gap of "
                    f"{fmt(ts.gap_p50_ms if met_with else tw.gap_p50_ms)} ms that is not the "
                    "difference: the rest is the "
                    f"wake-up and scheduling of {tw.processes} processes on 2 shared cores, "
                    "where the releaser's next acquire (a script joining the line, against "
                    "python-redis-lock's SET NX) competes with the woken waiter."
                )
            else:
                text += "."
        lines.append(text)
    certain = {
        w: (by[TURNSTILE].certain_fifo_violations or 0)
        + (by.get(BARE, by[TURNSTILE]).certain_fifo_violations or 0)
        for w, by in groups.items()
    }
    fifo = {
        w: by[TURNSTILE].fifo_violations + by.get(BARE, by[TURNSTILE]).fifo_violations
        for w, by in groups.items()
    }
    text = (
        f"- 0 FIFO violations: **{'met' if not any(certain.values()) else 'missed'}** ("
        + ", ".join(f"{w} waiters: {n}" for w, n in certain.items())
        + ", both Turnstile rows, counting *certain* violations: a grant that overtook a "
        "request Redis had already confirmed in line before the overtaker called acquire; "
        "see benchmarks/README.md)."
    )
    pg_fifo = {w: by[PG].fifo_violations for w, by in groups.items() if PG in by}
    if any(fifo.values()):
        text += (
            " The call-time heuristic (each process's clock reading before it calls acquire, "
            "with 1 ms of tolerance) shows "
            + ", ".join(f"{n} at {w} waiters" for w, n in fifo.items())
            + ": a process descheduled longer than that before its request reaches the "
            "server arrives later than it asked (load average at the start of this run: see "
            "above)."
        )
        if any(pg_fifo.values()):
            text += (
                " pg_advisory_lock, strictly FIFO by construction, shows "
                + ", ".join(f"{n} at {w} waiters" for w, n in pg_fifo.items())
                + " by that heuristic in the same run."
            )
    text += (
        " Turnstile grants in the order its acquire steps reach Redis; "
        "tests/contract/test_fifo.py checks that order exactly."
    )
    lines.append(text)
    for group in results["webhooks"]:
        by_w = {r.label: r for r in group}
        t = by_w[TURNSTILE]
        b = by_w.get(BARE, t)
        met_with, met_bare = t.vs_bound >= 0.95, b.vs_bound >= 0.95
        verdict = "met" if met_with else ("met by bare acquire/release" if met_bare else "missed")
        d = fmt_against(0.95, t.vs_bound, b.vs_bound)
        text = (
            f"- Webhook efficiency ≥ 95% of the perfect-FIFO bound, {t.scenario}: "
            f"**{verdict}** ({fmt(t.efficiency)} = {fmt(t.vs_bound, d)} of the bound "
            f"{fmt(t.bound_efficiency)} in a `with` block; bare acquire/release "
            f"{fmt(b.vs_bound, d)} of it)."
        )
        peers = [f"{label} {fmt(by_w[label].vs_bound)}" for label in (PRL, PG) if label in by_w]
        if peers:
            text += " Same run: " + ", ".join(peers) + " of the bound."
        if not met_with:
            text += (
                " The gap is per-webhook overhead on 20 ms of work: two script round trips "
                "per webhook (most acquires find their order free: 3 commands inside each "
                "way), and 8 worker processes sharing 2 cores with Redis "
                "and the rest of the machine; python-redis-lock and pg_advisory_lock stop "
                "at the same place in the same run."
            )
        lines.append(text)
    if TURNSTILE in unc and REDIS_PY in unc:
        t, base = unc[TURNSTILE], unc[REDIS_PY]
        bare = unc.get(BARE, t)
        met_with = t.ops_per_s >= 0.9 * base.ops_per_s
        met_bare = bare.ops_per_s >= 0.9 * base.ops_per_s
        verdict = "met" if met_with else ("met by bare acquire/release" if met_bare else "missed")
        text = (
            f"- Uncontended ≥ 0.9 x redis-py `Lock`: **{verdict}** ({fmt(t.ops_per_s)}/s "
            f"in a `with` block = {fmt(t.ops_per_s / base.ops_per_s)}x; bare "
            f"acquire/release {fmt(bare.ops_per_s)}/s = {fmt(bare.ops_per_s / base.ops_per_s)}"
            f"x; redis-py {fmt(base.ops_per_s)}/s)."
        )
        if not met_with:
            text += " The `with` row also registers each lease with the client's renewer. "
        if not met_bare:
            text += (
                "Bare, both make two round trips per acquire+release; Turnstile's are "
                "functions (3 commands inside each on an idle name: its record, the server "
                "clock, the record written back with the holder and the token), redis-py's a "
                "SET NX and a 2-command script, and Turnstile's Python side builds a lease "
                "(holder id, validation, fencing token, local deadline). "
            )
        if not met_with:
            text += (
                "Run alone on this machine, the two made about the same rate: which leads "
                "moves with the load."
            )
        lines.append(text)
    cmd_groups = {w: by[TURNSTILE].per_grant.get("Redis commands") for w, by in groups.items()}
    values = [v for v in cmd_groups.values() if v is not None]
    if values and len(values) == len(cmd_groups):
        spread = (max(values) - min(values)) / min(values) if min(values) else math.nan
        lines.append(
            "- Redis commands per handover constant from 2 to 32 waiters: "
            f"**{'met' if spread <= 0.1 else 'missed'}** ("
            + ", ".join(f"{w} waiters: {fmt(v, 1)}" for w, v in cmd_groups.items() if v)
            + " commands per grant, counting those inside scripts; scripts (EVALSHA or "
            + "FCALL) per grant "
            + ", ".join(
                fmt(by[TURNSTILE].per_grant.get("scripts", math.nan)) for by in groups.values()
            )
            + ")."
        )
        worst = max(values)
        text = (
            f"- Redis commands per handover ≤ 12: **{'met' if worst <= 12 else 'missed'}** "
            f"(at most {fmt(worst, 1)} per grant)."
        )
        text += (
            " A grant after waiting is the waiter's join (its function and 4 commands inside "
            "behind another waiter: the name's record, the server clock, the line, the "
            "record written back; its position is the line's count) and the holder's "
            "release (its function and 5 inside: the record, the clock, the front of the "
            "line popped with ZPOPMIN, the PUBLISH of the grant on the waiting client's "
            "channel, the record written back with the new holder) with a PING sent ahead "
            "of it in the same write, so that the server writes the woken waiter's message "
            "before the releaser's reply (docs/redis.md); the waiter sends nothing more. The "
            "holders live in the name's record and each waiting entry in its member of the "
            "line, so no index is kept; entries that lapsed are swept by one read of the line "
            "once a lower bound on their expiries has passed (about once per wait_ttl). A "
            "waiting entry that may be asked for by holder alone (a ticket's, a named "
            "holder's) is indexed in the record too: one HDEL more when it is granted. "
            "python-redis-lock (about 10) keeps neither a line nor an expiry for waiters."
        )
        lines.append(text)
    if results["missing"]:
        lines += ["", "Left out of this run: " + "; ".join(results["missing"]) + "."]
    return lines


# -- server time per script -------------------------------------------------------------------
_STEPS = (
    "acquire, idle name",
    "acquire, joins the line",
    "release, hands over to the waiter",
    "release after the hand-over",
)


_SCRIPT_CALLS = ("cmdstat_evalsha", "cmdstat_fcall")


def _script_stats(r: Any) -> tuple[int, float, int]:
    """Script and function calls (EVALSHA, FCALL) and their server time (µs) so far, and the
    calls of every other command but BLPOP and INFO (those a script ran, in this
    measurement)."""
    stats = r.info("commandstats")
    runs = [stats.get(k, {"calls": 0, "usec": 0}) for k in _SCRIPT_CALLS]
    others = sum(
        v["calls"]
        for k, v in stats.items()
        if k not in (*_SCRIPT_CALLS, "cmdstat_blpop", "cmdstat_info")
    )
    return sum(int(v["calls"]) for v in runs), sum(float(v["usec"]) for v in runs), others


def script_costs(redis_url: str, prefix: str, cycles: int) -> dict[str, Any]:
    """Server time of Turnstile's lock steps, as functions (FCALL, the default on Redis 7) and
    as scripts (EVALSHA, ``functions=off``): see :func:`_step_costs`, run for each, plus the
    reference rows."""
    import redis

    r = redis.Redis.from_url(redis_url)
    try:
        costs = _step_costs(redis_url, prefix, cycles, r, functions=True)
        as_scripts = _step_costs(redis_url, prefix + "s:", cycles, r, functions=False)
    finally:
        r.close()
    for step, row in as_scripts["steps"].items():
        if step in _STEPS:
            costs["steps"][step + _AS_SCRIPT] = row
    return costs


_AS_SCRIPT = ", as a script (functions=off)"
_REFERENCES = (
    "EVALSHA of `return 1`",
    "FCALL of a function that returns 1",
    "EVALSHA that makes the library's helpers and returns",
)


def _step_costs(
    redis_url: str, prefix: str, cycles: int, r: Any, *, functions: bool
) -> dict[str, Any]:
    """Server time of Turnstile's lock steps, step by step, from `INFO commandstats` read
    before and after each step (a step's time includes the commands it ran). Run in one
    process while nothing else uses the server.

    Each cycle: holder A takes an idle name; B asks from a thread and joins the line (the
    thread's DEBUG log says when); A releases, which hands over to B; B releases. Two
    reference scripts measure what every EVALSHA pays before doing anything: ``return 1``,
    and the lock library's helpers made (``_head.lua`` + ``_lib.lua``, which every script
    runs first) and nothing done."""
    import logging
    import statistics
    import threading
    from importlib import resources

    import turnstile
    from turnstile.stores.redis import keys

    folder = resources.files("turnstile.stores.redis").joinpath("lua", "lock")
    library = "\n".join(folder.joinpath(f).read_text("utf-8") for f in ("_head.lua", "_lib.lua"))
    mode = "" if functions else "&functions=off"
    client_a = turnstile.connect(f"{redis_url}?prefix={prefix}cost:{mode}")
    client_b = turnstile.connect(f"{redis_url}?prefix={prefix}cost:{mode}")
    base, name_keys = keys.KeyCache(f"{prefix}cost:").get("reference")
    queued = threading.Event()

    class Queued(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if getattr(record, "turnstile_position", None) is not None:
                queued.set()

    log = logging.getLogger("turnstile.lock.acquire")
    handler, level = Queued(logging.DEBUG), log.level
    log.addHandler(handler)
    log.setLevel(logging.DEBUG)
    times: dict[str, list[float]] = {step: [] for step in _STEPS}
    inside: dict[str, list[int]] = {step: [] for step in _STEPS}
    reference: dict[str, float] = {}

    def timed(step: str, action: Callable[[], Any]) -> Any:
        """Run ``action`` and count the script it sent as ``step``."""
        calls, usec, others = _script_stats(r)
        out = action()
        calls2, usec2, others2 = _script_stats(r)
        if calls2 - calls == 1:  # exactly this step's script (else: not counted)
            times[step].append(usec2 - usec)
            inside[step].append(others2 - others)
        return out

    def joined() -> None:
        """B asks from a thread; done when its DEBUG log says it is in line."""
        waiter.start()
        queued.wait(10)

    try:
        for _ in range(3):  # warm up: scripts loaded, connections open
            client_a.lock("warm").acquire().release()
        trivial, helpers = r.script_load("return 1"), r.script_load(library + "\nreturn 1")
        r.function_load(
            "#!lua name=turnstile_bench_reference\n"
            "redis.register_function('turnstile_bench_one', function() return 1 end)",
            replace=True,
        )
        references: tuple[tuple[str, Callable[[], Any]], ...] = (
            (_REFERENCES[0], lambda: r.evalsha(trivial, 0)),
            (_REFERENCES[1], lambda: r.fcall("turnstile_bench_one", 0)),
            (_REFERENCES[2], lambda: r.evalsha(helpers, len(name_keys), *name_keys, base)),
        )
        for label, call in references if functions else ():
            calls, usec, _ = _script_stats(r)
            for _ in range(cycles):
                call()
            calls2, usec2, _ = _script_stats(r)
            reference[label] = (usec2 - usec) / max(1, calls2 - calls)
        for _ in range(cycles):
            lease = timed(_STEPS[0], lambda: client_a.lock("n").acquire(holder="cost-a"))
            got: list[Any] = []
            queued.clear()
            waiter = threading.Thread(
                target=lambda got=got: got.append(client_b.lock("n").acquire(holder="cost-b"))
            )
            timed(_STEPS[1], joined)
            timed(_STEPS[2], lease.release)
            waiter.join()
            timed(_STEPS[3], got[0].release)
    finally:
        log.removeHandler(handler)
        log.setLevel(level)
        client_a.close()
        client_b.close()
        if functions:
            r.function_delete("turnstile_bench_reference")
    rows = {label: {"calls": cycles, "mean_us": v, "commands": 0} for label, v in reference.items()}
    for step in _STEPS:
        if times[step]:
            rows[step] = {
                "calls": len(times[step]),
                "mean_us": statistics.fmean(times[step]),
                "p50_us": statistics.median(times[step]),
                "commands": statistics.median(inside[step]),
            }
    return {"cycles": cycles, "steps": rows}


def costs_table(costs: dict[str, Any]) -> str:
    order = [*_REFERENCES, *(s for step in _STEPS for s in (step, step + _AS_SCRIPT))]
    rows = []
    for step in order:
        row = costs["steps"].get(step)
        if row is not None:
            rows.append(
                [step, row["calls"], row.get("p50_us", math.nan), row["mean_us"], row["commands"]]
            )
    return markdown_table(["step", "calls", "server µs p50", "mean", "commands inside (p50)"], rows)


def markdown(results: dict[str, Any], args: argparse.Namespace, info: dict[str, Any]) -> str:
    command = command_line("bench_redis.py", args.argv)
    out = ["# Turnstile on Redis vs Redis lock libraries vs pg_advisory_lock", ""]
    out += machine_lines(info, command)
    out += [
        f"- Redis: {info.get('redis_server', '?')}"
        + (" (a server of the benchmark's own, no persistence)" if not args.redis_url else ""),
        f"- PostgreSQL: {info.get('postgres_server', 'not used')}",
        "",
        "Contenders (all Redis ones on the same server, one name per run under a fresh prefix):",
        "",
    ]
    out += [f"- **{c['label']}** — {c['note']}" for c in results["contenders"]]
    out += ["", "## Interpretation", ""]
    out += interpretation(results)
    out += uncontended_section(results["uncontended"], REDIS_PY)
    for waiters, by in by_waiters(results["handover"]).items():
        group = list(by.values())
        h = group[0]
        out += [
            f"## Handover: {waiters} waiters ({h.processes} processes), one name, "
            f"{fmt(h.hold_ms, 0)} ms critical sections",
            "",
            "Gap = end of one critical section to the start of the next one in *another* "
            "process (release call and wake-up included). FIFO violation = a grant to a "
            f"process that started waiting more than {fmt(h.fifo_tolerance_ms, 0)} ms after "
            "another process still waiting. Slow locks stop starting rounds after the time "
            "budget, hence fewer grants. Counters: `INFO commandstats` of the Redis server, "
            "per grant (commands run inside scripts included)." + handover_trials_note(group),
            "",
            handover_table(group, PRL if PRL in by else None, counters=not args.redis_url),
            "",
        ]
    if not args.redis_url:
        out += [
            "## Redis commands per grant, by number of waiters",
            "",
            "`INFO commandstats` differences over each handover run divided by its grants: "
            "every command the server ran, those inside Lua scripts included, and the script "
            "(EVALSHA, FCALL) and BLPOP calls clients sent. For Turnstile a grant after "
            "waiting costs two steps (functions, FCALL, on this Redis 7 server) — the "
            "waiter's first acquire step (joins the line) and the holder's release (hands "
            "over and publishes the wake-up, which carries the grant, on the waiting "
            "client's channel), with a PING ahead of the release — and nothing more: the "
            "waiter's client hears the wake-up on its one subscriber connection.",
            "",
            commands_table(results["handover"]),
            "",
        ]
    if results.get("costs"):
        costs = results["costs"]
        out += [
            "## Server time per step",
            "",
            f"Redis' `INFO commandstats`, read before and after each step, over "
            f"{costs['cycles']} cycles in one "
            "process, on this run's server after the runs above: each cycle one holder takes "
            "an idle name, a second asks from a thread and joins the line, the first releases "
            "(handing over) and the second releases. Durations are the server's own, in "
            "microseconds, for the whole step (the commands inside included); *commands "
            "inside* counts what the step called. Each step is measured as Turnstile runs it "
            "on Redis 7, a function of its library (FCALL), and as a script (EVALSHA, the URL "
            "option `functions=off`, and what a server before Redis 7 runs). The reference "
            "rows are what a call costs before it does anything: a script and a function "
            "that return at once, and a script that only makes the lock library's helper "
            "functions, which every script makes first and a function library makes once, "
            "when it is loaded.",
            "",
            costs_table(costs),
            "",
        ]
    for group in results["webhooks"]:
        r = group[0]
        out += [
            f"## Webhooks: {r.scenario}, {r.workers} workers, {fmt(r.work_ms, 0)} ms of work",
            "",
            f"Ideal makespan {fmt(r.ideal_s, 3)} s. Efficiency = ideal / makespan; *perfect "
            "FIFO lock* = the efficiency of a zero-overhead strictly-FIFO lock on the same "
            "arrivals (workers that wait behind a busy order sit idle, so it stays below 1); "
            "*vs perfect* = efficiency / that bound. Out of order = webhooks that ran before "
            "an earlier-arrived webhook of the same order. Each row is the contender's trial "
            "of median efficiency; the last column lists every trial.",
            "",
            webhook_table(group, REDIS_PY),
            "",
        ]
    return "\n".join(out)


def _server_versions(redis_url: str, pg_url: str | None) -> dict[str, str]:
    import redis

    out = {}
    with contextlib.closing(redis.Redis.from_url(redis_url)) as r:
        out["redis_server"] = "Redis " + str(r.info("server").get("redis_version"))
    if pg_url is not None:
        import psycopg

        with psycopg.connect(pg_url) as conn:
            row = conn.execute("SHOW server_version").fetchone()
            out["postgres_server"] = f"PostgreSQL {row[0] if row else '?'}"
    return out


class RedisBench(LockBench):
    name = "redis"
    description = (__doc__ or "").split("\n")[0]
    packages = (
        "turnstile",
        "redis",
        "hiredis",
        "python-redis-lock",
        "pottery",
        "sherlock",
        "portalocker",
        "psycopg",
    )
    requires = (("redis", "pip install -e '.[redis]' and the bench group (scripts/dev.py)"),)
    tmpdir_help = "where the benchmark's own redis-server keeps its files"

    def options(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--redis-url", help="use this Redis instead of starting one")
        parser.add_argument("--postgres-url", help="PostgreSQL for the pg_advisory_lock row")
        super().options(parser)

    @contextlib.contextmanager
    def target(self, args: argparse.Namespace, info: dict[str, Any]) -> Iterator[tuple[str, str]]:
        prefix = f"bench-{secrets.token_hex(4)}:"
        with contextlib.ExitStack() as stack:
            if args.redis_url:
                redis_url = args.redis_url
                stack.callback(
                    delete_redis_keys,
                    redis_url,
                    f"{prefix}*",
                    f"redlock:{prefix}*",
                    f"lock:{prefix}*",
                )
            else:
                folder = stack.enter_context(
                    scratch_folder(args.tmpdir, prefix="turnstile-bench-redis-")
                )
                redis_url = stack.enter_context(own_redis(folder))
            info.update(_server_versions(redis_url, postgres_url(args)))
            yield redis_url, prefix

    def run(self, args: argparse.Namespace, target: tuple[str, str]) -> dict[str, Any]:
        redis_url, prefix = target
        quick = args.quick
        main, missing = contenders(redis_url, prefix, postgres_url(args), not args.redis_url)
        sizes = Sizes(
            iterations=100 if quick else 2000,
            seconds=0.5 if quick else 3.0,
            trials=1 if quick else 5,
            waiters=WAITERS_QUICK if quick else WAITERS_FULL,
            rounds=lambda processes: 3 if quick else max(8, 240 // processes),
            handover_seconds=2.0 if quick else 20.0,
            # The demo's five webhooks take 60 ms: one trial is mostly noise, so the median
            # of at least 7 (as bench_postgres.py takes), interleaved over the contenders.
            webhook_trials=(1,) if quick else (max(7, args.trials), args.trials),
            handover_trials=1 if quick else 3,
        )
        results = {
            "contenders": [{"label": c.label, "note": c.note} for c in main],
            "missing": missing,
            **self.run_locks(args, main, sizes),
        }
        if not args.redis_url:  # loads functions and scripts: only on a server of our own
            progress("server time per step (INFO commandstats)")
            results["costs"] = script_costs(redis_url, prefix, 20 if quick else 500)
        return results

    def markdown(
        self, results: dict[str, Any], args: argparse.Namespace, info: dict[str, Any]
    ) -> str:
        return markdown(results, args, info)

    def finish(self, info: dict[str, Any]) -> None:
        info["load_at_end"] = [round(x, 2) for x in os.getloadavg()]

    def footer(self, info: dict[str, Any]) -> str:
        return (
            f"\nThe whole run took {info['seconds']:.0f} s; load average at the end "
            + " / ".join(str(x) for x in info["load_at_end"])
            + " (the machine is shared: other work ran meanwhile).\n"
        )

    def sane(self, results: dict[str, Any]) -> bool:
        """No Turnstile run may let two critical sections overlap (a peer's overlaps are
        reported, not fatal: some have no queue or lease to keep them out)."""
        return no_overlaps(results, only="turnstile", rates=False)


if __name__ == "__main__":
    sys.exit(main(RedisBench()))
